// Member credentials (issue 14, docs/SECURITY.md "Member credentials"): a
// coordinator and two workers as real processes with --token_file train
// while the test itself joins the run as a third member over real gRPC. As
// a member it reads a worker's snapshot; after it leaves, the same
// credential gets PERMISSION_DENIED, and so does the credential of a member
// evicted when its lease ran out; a stranger holding the run token but no
// credential gets PERMISSION_DENIED throughout; the run goes on with every
// hash in agreement, and a worker joining late catches up without a denial.
#include <openssl/sha.h>

#include <fstream>

#include "common/auth.h"
#include "common/member_credentials.h"
#include "shoal/v1/peer.grpc.pb.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

constexpr char kRunToken[] = "run-token-0123456789abcdef";

class MemberCredentialsTest : public ClusterTest {
 protected:
  void SetUp() override {
    ClusterTest::SetUp();
    if (IsSkipped()) return;
    std::ofstream(dir_.path() + "/run.token") << kRunToken << "\n";
    // Every channel this test makes carries the run token: the stranger
    // below is a stranger to the run's members only.
    SetProcessToken(kRunToken);
  }
  void TearDown() override { SetProcessToken(""); }
  std::string TokenFlag() { return "--token_file=" + dir_.path() + "/run.token"; }

  // Reads the first elements of the snapshot `peer` holds, with `member`
  // ("<worker_id>:<credential>", empty = none) as x-shoal-member.
  static grpc::Status ReadSnapshot(const std::string& peer, const std::string& member) {
    auto stub = v1::Peer::NewStub(MakeChannel(peer));
    v1::PeerInfo info;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(absl::Seconds(5)));
      grpc::Status s = stub->GetPeerInfo(&ctx, v1::GetPeerInfoRequest(), &info);
      if (!s.ok()) return s;
    }
    v1::ReadSliceRequest request;
    request.set_kind(v1::SNAPSHOT);
    request.set_round(info.model_round());
    request.set_begin(0);
    request.set_end(std::min<uint64_t>(info.total_elements(), 4096));
    request.set_reader_id("member-e2e");
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    if (!member.empty()) ctx.AddMetadata(kMemberMetadataKey, member);
    std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader = stub->ReadSlice(&ctx, request);
    v1::TensorChunk chunk;
    uint64_t bytes = 0;
    while (reader->Read(&chunk)) bytes += chunk.data().size();
    grpc::Status s = reader->Finish();
    if (s.ok() && bytes != (request.end() - request.begin()) * sizeof(float)) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "short read");
    }
    return s;
  }

  static grpc::Status GetManifest(const std::string& peer, const std::string& member) {
    auto stub = v1::Peer::NewStub(MakeChannel(peer));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(5)));
    if (!member.empty()) ctx.AddMetadata(kMemberMetadataKey, member);
    v1::GetModelManifestRequest request;
    v1::ModelManifest manifest;
    return stub->GetManifest(&ctx, request, &manifest);
  }

  // Repeats ReadSnapshot until it answers `code` (rounds move the snapshot
  // on, and the worker hears of changes a moment after the coordinator
  // made them); returns the last status.
  static grpc::Status ReadUntil(const std::string& peer, const std::string& member,
                                grpc::StatusCode code) {
    grpc::Status last;
    WaitUntil(
        [&] {
          last = ReadSnapshot(peer, member);
          return last.error_code() == code;
        },
        absl::Seconds(30));
    return last;
  }
};

TEST_F(MemberCredentialsTest, AFormerMemberAndAStrangerCannotReadTheModel) {
  const std::string addr =
      StartCoordinator({"--min_participants=2", "--local_steps=20", "--rounds=0",
                        "--heartbeat_lease=8s", "--run_id=member-run", TokenFlag()});
  ASSERT_FALSE(addr.empty());
  StartWorker(addr, {TokenFlag()});
  StartWorker(addr, {TokenFlag()});
  v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.last_completed_round() >= 2; }, absl::Minutes(2));
  ASSERT_GE(status.last_completed_round(), 2u) << Logs();
  ASSERT_EQ(status.workers_size(), 2);
  const std::string peer = status.workers(0).address();

  // A stranger with the run token but no credential, or a made-up one.
  grpc::Status s = ReadSnapshot(peer, "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(GetManifest(peer, "").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  s = ReadSnapshot(peer, "w1:1.1." + std::string(64, 'a'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  // The test joins as a member and opens its session: the full list of
  // current credentials comes first, as digests.
  auto coordinator = v1::Coordinator::NewStub(MakeChannel(addr));
  v1::JoinRequest join;
  join.set_peer_address("127.0.0.1:9");
  join.set_name("member-e2e");
  v1::JoinResponse joined;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    ASSERT_TRUE(coordinator->Join(&ctx, join, &joined).ok());
  }
  const std::string credential = joined.member_credential();
  ASSERT_TRUE(ParseCredential(credential).ok()) << credential;
  grpc::ClientContext session_ctx;
  session_ctx.set_deadline(DeadlineIn(absl::Minutes(2)));
  auto session = coordinator->Session(&session_ctx);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(joined.worker_id());
  ASSERT_TRUE(session->Write(hello));
  v1::CoordinatorMessage first;
  ASSERT_TRUE(session->Read(&first));
  ASSERT_TRUE(first.has_member_update()) << first.DebugString();
  EXPECT_TRUE(first.member_update().full());
  EXPECT_EQ(first.member_update().entries_size(), 3) << first.DebugString();
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(credential.data()), credential.size(), digest);
  bool listed = false;
  for (const auto& e : first.member_update().entries()) {
    listed |= e.worker_id() == joined.worker_id() &&
              e.credential_sha256() == std::string(reinterpret_cast<char*>(digest), sizeof(digest));
  }
  EXPECT_TRUE(listed) << first.DebugString();

  // As a member it reads the worker's snapshot.
  const std::string member = joined.worker_id() + ":" + credential;
  s = ReadUntil(peer, member, grpc::StatusCode::OK);
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message() << Logs();

  // It leaves: its credential stops working on the members' Peer services.
  {
    v1::WorkerMessage heartbeat;  // the lease is 8 s: not evicted before it leaves
    heartbeat.mutable_heartbeat()->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
    ASSERT_TRUE(session->Write(heartbeat));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    v1::LeaveRequest leave;
    leave.set_worker_id(joined.worker_id());
    leave.set_reason("member e2e test");
    v1::LeaveResponse left;
    ASSERT_TRUE(coordinator->Leave(&ctx, leave, &left).ok());
  }
  for (const auto& w : status.workers()) {
    s = ReadUntil(w.address(), member, grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << w.id() << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("removed"), std::string::npos) << s.error_message();
    EXPECT_EQ(s.error_message().find(credential), std::string::npos) << "never echoed";
    EXPECT_EQ(GetManifest(w.address(), member).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  session_ctx.TryCancel();
  (void)session->Finish();

  // A member that stops answering is lost (it opens no session: its lease
  // runs out after --heartbeat_lease), and its credential dies with it.
  join.set_peer_address("127.0.0.1:10");
  join.set_name("evicted-e2e");
  v1::JoinResponse evicted;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    ASSERT_TRUE(coordinator->Join(&ctx, join, &evicted).ok());
  }
  const std::string evicted_member = evicted.worker_id() + ":" + evicted.member_credential();
  s = ReadUntil(peer, evicted_member, grpc::StatusCode::OK);
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  WaitForStatus(
      [&](const v1::RunStatus& st) {
        for (const auto& w : st.workers()) {
          if (w.id() == evicted.worker_id()) return w.state() == "lost";
        }
        return false;
      },
      absl::Seconds(60));
  for (const auto& w : status.workers()) {
    s = ReadUntil(w.address(), evicted_member, grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << w.id() << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("removed"), std::string::npos) << s.error_message();
  }

  // The members were never refused: the run goes on, every hash agrees.
  status = ExpectRoundsGoOn(status.last_completed_round(), 2, 2);

  // A worker joining late pulls the model from the members right after its
  // Join, possibly before they heard of its credential: it is retried, never
  // refused, and takes part with the same model.
  Process* late = StartWorker(addr, {TokenFlag()});
  ExpectRoundsGoOn(status.last_completed_round(), 2, 3, absl::Minutes(2));
  EXPECT_EQ(late->Log().find("PERMISSION_DENIED"), std::string::npos) << late->Log();
  for (const auto& w : workers_) {
    EXPECT_EQ(w->Log().find("PERMISSION_DENIED"), std::string::npos) << w->Log();
  }
}

}  // namespace
}  // namespace shoal
