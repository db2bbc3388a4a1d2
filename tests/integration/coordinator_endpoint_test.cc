// Integration tests of the coordinator's one registered service
// (services/coordinator/coordinator_endpoint.h) over real gRPC on
// 127.0.0.1:0: the method table covers the proto, the run token is checked
// first on every method, then the leader check of a replica (a standby
// refuses with the leader's address and answers GetRunStatus from its own
// view), the join rate per host, and Joins whose reachability probe waits on
// a silent address while every other call is served (the probe runs on the
// TcpProber, not on a gRPC thread). Every RPC has a deadline; waiting is
// polling with a deadline; nothing asserts a duration.
#include "services/coordinator/coordinator_endpoint.h"

#include <grpc/grpc.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/coordinator_methods.h"
#include "common/grpc_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/coordinator_server.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/run_record.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tests/support/coordinator_fixture.h"
#include "tests/support/silent_listener.h"
#include "tests/support/test_support.h"

namespace shoal {
namespace {

using ::google::protobuf::MethodDescriptor;
using ::shoal::coordinator::Admission;
using ::shoal::coordinator::CoordinatorEndpoint;
using ::shoal::coordinator::CoordinatorOptions;
using ::shoal::coordinator::CoordinatorServer;
using ::shoal::coordinator::CoordinatorService;
using ::shoal::coordinator::RoundEngine;
using ::shoal::testing::RefusingPort;
using ::shoal::testing::SilentListener;
using ::shoal::testing::WaitUntil;
using ::testing::HasSubstr;

// See coordinator_rpc_test.cc: gRPC stays initialised for the whole binary.
[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

constexpr absl::Duration kRpcTimeout = absl::Seconds(5);
constexpr absl::Duration kWait = absl::Seconds(10);
constexpr char kToken[] = "endpoint-test-token-0123456789";
constexpr char kLeader[] = "10.0.0.7:50051";

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// How a call of any method ended: its status, the trailing metadata's
// leader hint and the response's bytes (unary).
struct Outcome {
  grpc::Status status;
  std::string leader;
  std::string response;
};

// A bidirectional stream that sends nothing and reads until the end.
class DrainingStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override { done_.set_value(s); }
  grpc::ByteBuffer* in() { return &in_; }
  std::future<grpc::Status> done() { return done_.get_future(); }

 private:
  grpc::ByteBuffer in_;
  std::promise<grpc::Status> done_;
};

// Calls `method` of the Coordinator at `address` with an empty request (a
// stream: no message, then the end of writes), by its path only.
Outcome CallAny(const std::string& address, const MethodDescriptor& method,
                const std::string& token = "") {
  grpc::GenericStub stub(MakeChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kRpcTimeout));
  if (!token.empty()) ctx.AddMetadata(kAuthMetadataKey, absl::StrCat(kBearerPrefix, token));
  const std::string path = absl::StrCat("/", method.service()->full_name(), "/", method.name());
  Outcome out;
  if (!method.client_streaming() && !method.server_streaming()) {
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, path, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status s) { done.set_value(std::move(s)); });
    out.status = done.get_future().get();
    out.response = Bytes(response);
  } else {
    DrainingStream stream;
    std::future<grpc::Status> done = stream.done();
    stub.PrepareBidiStreamingCall(&ctx, path, grpc::StubOptions(), &stream);
    stream.StartRead(stream.in());
    stream.StartWritesDone();
    stream.StartCall();
    out.status = done.get();
  }
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find(coordinator::kLeaderMetadataKey); it != trailers.end()) {
    out.leader.assign(it->second.data(), it->second.size());
  }
  return out;
}

// A Join of `peer_address` with the typed stub (token attached).
absl::StatusOr<v1::JoinResponse> Join(v1::Coordinator::Stub* stub, const std::string& peer_address,
                                      bool outbound_only = false) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kRpcTimeout));
  ctx.AddMetadata(kAuthMetadataKey, absl::StrCat(kBearerPrefix, kToken));
  v1::JoinRequest request;
  request.set_peer_address(peer_address);
  request.set_outbound_only(outbound_only);
  v1::JoinResponse response;
  grpc::Status s = stub->Join(&ctx, request, &response);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return response;
}

absl::StatusOr<v1::RunStatus> Status(v1::Coordinator::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kRpcTimeout));
  ctx.AddMetadata(kAuthMetadataKey, absl::StrCat(kBearerPrefix, kToken));
  v1::RunStatus status;
  grpc::Status s = stub->GetRunStatus(&ctx, v1::GetRunStatusRequest(), &status);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return status;
}

TEST(CoordinatorEndpointTest, EveryMethodOfTheProtoIsServed) {
  ASSERT_TRUE(CoordinatorService::CheckMethods().ok()) << CoordinatorService::CheckMethods();
  auto server = testing::StartTestCoordinator(testing::TestCoordinatorOptions("run-endpoint"));
  ASSERT_TRUE(server.ok()) << server.status();
  const google::protobuf::ServiceDescriptor& service = CoordinatorDescriptor();
  ASSERT_GT(service.method_count(), 0);
  for (int i = 0; i < service.method_count(); ++i) {
    const MethodDescriptor& method = *service.method(i);
    // An empty request is refused by the method's own checks (or answered),
    // never UNIMPLEMENTED.
    Outcome out = CallAny((*server)->address(), method);
    EXPECT_NE(out.status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
        << method.name() << ": " << out.status.error_message();
    EXPECT_NE(out.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << method.name();
  }
  (*server)->Shutdown(absl::Seconds(1));
}

// The endpoint alone, as a replica registers it: a standby (no active
// service) with a token, then leading, then a standby again.
class StandbyEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = testing::TestCoordinatorOptions("run-standby");
    engine_ = std::make_unique<RoundEngine>(options_.engine, RealClock::Get());
    service_ = std::make_unique<CoordinatorService>(engine_.get(), RealClock::Get());
    CoordinatorEndpoint::Standby standby;
    standby.status = [] {
      v1::RunStatus view;
      view.set_replica_role("standby");
      view.set_leader(kLeader);
      return view;
    };
    standby.leader = [] { return std::string(kLeader); };
    endpoint_ = std::make_unique<CoordinatorEndpoint>(Admission(TokenGate(kToken, ""), nullptr),
                                                      std::move(standby));
    auto server = GrpcServer::Start("127.0.0.1:0", {endpoint_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(MakeChannel(server_->address()));
  }
  void TearDown() override {
    service_->CloseAllSessions();
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }

  CoordinatorOptions options_;
  std::unique_ptr<RoundEngine> engine_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<CoordinatorEndpoint> endpoint_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(StandbyEndpointTest, TheTokenComesFirstThenTheLeaderCheckOnEveryMethod) {
  const google::protobuf::ServiceDescriptor& service = CoordinatorDescriptor();
  for (int i = 0; i < service.method_count(); ++i) {
    const MethodDescriptor& method = *service.method(i);
    SCOPED_TRACE(method.name());
    // No token: refused before anything else, even on a standby.
    Outcome stranger = CallAny(server_->address(), method);
    EXPECT_EQ(stranger.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << stranger.status.error_message();
    EXPECT_EQ(stranger.leader, "");
    Outcome wrong = CallAny(server_->address(), method, "not-the-run-token-0123456789");
    EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    // With it: the standby refuses and names the leader, except the status.
    Outcome member = CallAny(server_->address(), method, kToken);
    if (CoordinatorService::StandbyAnswers(method)) {
      ASSERT_TRUE(member.status.ok()) << member.status.error_message();
      v1::RunStatus view;
      ASSERT_TRUE(view.ParseFromString(member.response));
      EXPECT_EQ(view.replica_role(), "standby");
      EXPECT_EQ(view.leader(), kLeader);
    } else {
      EXPECT_EQ(member.status.error_code(), grpc::StatusCode::UNAVAILABLE);
      EXPECT_THAT(member.status.error_message(), HasSubstr(kLeader));
      EXPECT_EQ(member.leader, kLeader);
    }
  }
}

TEST_F(StandbyEndpointTest, CallsGoToTheActiveServiceWhileThereIsOne) {
  EXPECT_TRUE(absl::IsUnavailable(Join(stub_.get(), "127.0.0.1:40001").status()));
  endpoint_->SetActive(service_.get());
  auto joined = Join(stub_.get(), "127.0.0.1:40001");
  ASSERT_TRUE(joined.ok()) << joined.status();
  auto status = Status(stub_.get());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->members(), 1u);
  EXPECT_NE(status->replica_role(), "standby");
  // Deposed: refused again, and the standby's view answers.
  endpoint_->SetActive(nullptr);
  EXPECT_TRUE(absl::IsUnavailable(Join(stub_.get(), "127.0.0.1:40002").status()));
  status = Status(stub_.get());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->replica_role(), "standby");
}

TEST(CoordinatorEndpointTest, JoinsPastAHostsRateAreResourceExhausted) {
  CoordinatorOptions options = testing::TestCoordinatorOptions("run-join-rate");
  options.gate = TokenGate(kToken, "");
  options.max_joins_per_minute = 2;
  auto server = testing::StartTestCoordinator(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Coordinator::NewStub(MakeChannel((*server)->address()));
  // Refused joins without the token are not counted.
  const MethodDescriptor& join = *CoordinatorDescriptor().FindMethodByName("Join");
  EXPECT_EQ(CallAny((*server)->address(), join).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(Join(stub.get(), "127.0.0.1:40001").ok());
  ASSERT_TRUE(Join(stub.get(), "127.0.0.1:40002").ok());
  absl::Status third = Join(stub.get(), "127.0.0.1:40003").status();
  EXPECT_TRUE(absl::IsResourceExhausted(third)) << third;
  // Other calls are not limited.
  auto status = Status(stub.get());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->members(), 2u);
  (*server)->Shutdown(absl::Seconds(1));
}

// Joins whose probe waits on a silent address (its SYNs are dropped) hold
// no gRPC thread: while all of them are still probing, the status, other
// Joins (no probe, a reachable and a refusing address) are answered. A
// shutdown finishes the waiting ones with UNAVAILABLE.
TEST(CoordinatorEndpointTest, JoinsProbingASilentAddressDoNotBlockOtherCalls) {
  SilentListener silent;
  RefusingPort refusing;
  ASSERT_GT(silent.port(), 0);
  ASSERT_GT(refusing.port(), 0);
  CoordinatorOptions options = testing::TestCoordinatorOptions("run-probes");
  options.gate = TokenGate(kToken, "");
  // Longer than the test: the silent probes end only with the shutdown.
  options.engine.join_probe_timeout = absl::Seconds(120);
  auto started = testing::StartTestCoordinator(options);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<CoordinatorServer> server = std::move(*started);
  auto stub = v1::Coordinator::NewStub(MakeChannel(server->address()));

  // Many more than gRPC's callback threads.
  constexpr int kSilent = 64;
  struct Pending {
    grpc::ClientContext ctx;
    v1::JoinRequest request;
    v1::JoinResponse response;
    std::promise<grpc::Status> done;
  };
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < kSilent; ++i) {
    auto p = std::make_unique<Pending>();
    p->ctx.set_deadline(DeadlineIn(absl::Seconds(60)));
    p->ctx.AddMetadata(kAuthMetadataKey, absl::StrCat(kBearerPrefix, kToken));
    p->request.set_peer_address(silent.address());
    Pending* raw = p.get();
    stub->async()->Join(&raw->ctx, &raw->request, &raw->response,
                        [raw](grpc::Status s) { raw->done.set_value(std::move(s)); });
    pending.push_back(std::move(p));
  }
  std::vector<std::future<grpc::Status>> finished;
  for (auto& p : pending) finished.push_back(p->done.get_future());
  auto still_waiting = [&] {
    int n = 0;
    for (auto& f : finished) {
      if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) ++n;
    }
    return n;
  };
  ASSERT_TRUE(WaitUntil([&] { return server->probes_in_flight() == kSilent; }, kWait))
      << server->probes_in_flight() << " probes in flight";

  // While all of them wait: the status...
  auto status = Status(stub.get());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->members(), 0u);
  // ...a Join that needs no probe...
  auto outbound = Join(stub.get(), "127.0.0.1:40001", /*outbound_only=*/true);
  ASSERT_TRUE(outbound.ok()) << outbound.status();
  // ...one whose address answers (the coordinator's own port)...
  auto reachable = Join(stub.get(), server->address());
  ASSERT_TRUE(reachable.ok()) << reachable.status();
  EXPECT_FALSE(reachable->outbound_only()) << reachable->outbound_reason();
  // ...and one refused at once, taken as outbound-only.
  auto refused = Join(stub.get(), refusing.address());
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_TRUE(refused->outbound_only());
  EXPECT_THAT(refused->outbound_reason(), HasSubstr("refused"));
  status = Status(stub.get());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->members(), 3u);
  EXPECT_EQ(still_waiting(), kSilent);
  // (The answered probes leave the count just after their callbacks.)
  EXPECT_TRUE(WaitUntil([&] { return server->probes_in_flight() == kSilent; }, kWait));

  // The shutdown ends them (the server waits for every call to finish).
  server->Shutdown(absl::Seconds(1));
  for (auto& f : finished) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    grpc::Status s = f.get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
}

// A silent address with a short probe: the joiner takes part outbound-only
// and the status says why.
TEST(CoordinatorEndpointTest, AJoinerNobodyCanReachIsOutboundOnly) {
  SilentListener silent;
  ASSERT_GT(silent.port(), 0);
  CoordinatorOptions options = testing::TestCoordinatorOptions("run-probe-timeout");
  options.engine.join_probe_timeout = absl::Milliseconds(200);
  auto server = testing::StartTestCoordinator(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Coordinator::NewStub(MakeChannel((*server)->address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kRpcTimeout));
  v1::JoinRequest request;
  request.set_peer_address(silent.address());
  v1::JoinResponse response;
  grpc::Status s = stub->Join(&ctx, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(response.outbound_only());
  EXPECT_THAT(response.outbound_reason(), HasSubstr(silent.address()));
  EXPECT_TRUE(WaitUntil([&] { return (*server)->probes_in_flight() == 0; }, kWait));
  (*server)->Shutdown(absl::Seconds(1));
}

// The run record read back at a restart holds the limits of what clients
// send (core/request_limits.h): a record whose ban carries a control
// sequence (written by hand, or by a build without the limits) stops the
// start with INVALID_ARGUMENT naming the field; the same record without it
// resumes.
TEST(CoordinatorEndpointTest, ARunRecordOverTheLimitsIsRefusedAtStart) {
  testing::TempDir dir;
  coordinator::RunRecordStore store(dir.path());
  ASSERT_TRUE(store.Open().ok());
  v1::RunRecord record;
  record.set_run_id("run-limits");
  record.set_next_worker_number(3);
  v1::Ban* ban = record.add_bans();
  ban->set_worker_id("w2");
  ban->set_name("mallory\x1b]0;owned\x07");
  ban->set_until_unix_seconds(1);
  ASSERT_TRUE(store.Save(record).ok());
  CoordinatorOptions options = testing::TestCoordinatorOptions("run-limits");
  options.state_dir = dir.path();
  auto refused = testing::StartTestCoordinator(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("RunRecord.bans[0].name holds U+001B"));
  ban->set_name("mallory");
  ASSERT_TRUE(store.Save(record).ok());
  auto resumed = testing::StartTestCoordinator(options);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  (*resumed)->Shutdown(absl::Seconds(1));
}

// The run record is written on the record's writer thread: a Join is
// answered only once the record holding its member is on disk (an id is
// never given twice, even across a restart), and while a write is held no
// call waits on a gRPC thread (they queue behind it, in order).
TEST(CoordinatorEndpointTest, CallsThatChangeTheRecordAreAnsweredAfterItsWrite) {
  testing::TempDir dir;
  absl::Mutex mu;
  bool hold = false;
  int writes_held = 0;
  std::set<std::thread::id> writer_threads;
  CoordinatorOptions options = testing::TestCoordinatorOptions("run-record-writer");
  options.state_dir = dir.path();
  options.before_record_write = [&] {
    absl::MutexLock lock(&mu);
    writer_threads.insert(std::this_thread::get_id());
    if (!hold) return;
    ++writes_held;
    auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !hold; };
    mu.AwaitWithTimeout(absl::Condition(&released), kWait);
  };
  auto started = testing::StartTestCoordinator(options);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<CoordinatorServer> server = std::move(*started);
  auto stub = v1::Coordinator::NewStub(MakeChannel(server->address()));
  auto recorded_next_worker = [&] {
    coordinator::RunRecordStore store(dir.path());
    auto record = store.Load();
    return record.ok() && record->has_value() ? (*record)->next_worker_number() : 0;
  };
  const uint64_t before = recorded_next_worker();

  {
    absl::MutexLock lock(&mu);
    hold = true;
  }
  constexpr int kJoins = 8;
  struct Pending {
    grpc::ClientContext ctx;
    v1::JoinRequest request;
    v1::JoinResponse response;
    std::promise<grpc::Status> done;
  };
  std::vector<std::unique_ptr<Pending>> pending;
  std::vector<std::future<grpc::Status>> finished;
  for (int i = 0; i < kJoins; ++i) {
    auto p = std::make_unique<Pending>();
    p->ctx.set_deadline(DeadlineIn(absl::Seconds(30)));
    p->request.set_peer_address(absl::StrCat("127.0.0.1:", 41000 + i));
    Pending* raw = p.get();
    finished.push_back(raw->done.get_future());
    stub->async()->Join(&raw->ctx, &raw->request, &raw->response,
                        [raw](grpc::Status s) { raw->done.set_value(std::move(s)); });
    pending.push_back(std::move(p));
  }
  // Every Join's engine step is done (the status lists them) while the
  // first write is held: their answers wait for it, and so does nothing
  // else (the status is answered).
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto status = Status(stub.get());
        return status.ok() && status->members() == kJoins;
      },
      kWait));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(writes_held, 1);
  }
  for (auto& f : finished) {
    EXPECT_NE(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  }
  EXPECT_EQ(recorded_next_worker(), before);

  {
    absl::MutexLock lock(&mu);
    hold = false;
  }
  for (auto& f : finished) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    grpc::Status s = f.get();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(recorded_next_worker(), before + kJoins);
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(writer_threads.size(), 1u) << "every write on the writer's thread";
  }
  server->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace shoal
