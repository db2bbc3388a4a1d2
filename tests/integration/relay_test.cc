// Integration tests of the coordinator's Relay RPC (docs/SUPERNODES.md
// "Relay") over real gRPC on 127.0.0.1:0: a light relay client (one Relay
// stream for several members, the test decides what it sends) next to
// direct workers using the real client. Every RPC has a deadline; waiting is
// polling with a deadline.
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/status_util.h"
#include "gtest/gtest.h"
#include "services/coordinator/coordinator_server.h"
#include "services/worker/coordinator_client.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tests/support/coordinator_fixture.h"
#include "tests/support/test_support.h"

namespace shoal {
namespace {

using ::shoal::coordinator::CoordinatorOptions;
using ::shoal::coordinator::CoordinatorServer;
using ::shoal::testing::WaitUntil;
using ::shoal::v1::CoordinatorMessage;
using ::shoal::v1::RelayedCall;
using ::shoal::v1::RelayedCallResult;
using ::shoal::worker::CoordinatorClientOptions;
using ::shoal::worker::GrpcCoordinatorClient;

// See coordinator_rpc_test.cc: gRPC stays initialised for the whole binary.
[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

constexpr absl::Duration kRpcTimeout = absl::Seconds(5);
constexpr absl::Duration kWait = absl::Seconds(10);
constexpr absl::Duration kLease = absl::Seconds(2);
constexpr absl::Duration kHeartbeat = absl::Milliseconds(20);
constexpr uint64_t kTotal = 1000;

std::string Hash(char c) { return std::string(64, c); }
// Recorded by the coordinator, never dialled.
std::string PeerAddress(int n) { return absl::StrCat("127.0.0.1:", 41000 + n); }

// Directives of one session, recorded from a reader thread.
class Log {
 public:
  void Add(const CoordinatorMessage& m) {
    absl::MutexLock lock(&mu_);
    messages_.push_back(m);
  }
  std::optional<CoordinatorMessage> Find(CoordinatorMessage::KindCase kind, uint64_t round) const {
    absl::MutexLock lock(&mu_);
    for (const CoordinatorMessage& m : messages_) {
      if (m.kind_case() == kind && testing::DirectiveRound(m) == round) return m;
    }
    return std::nullopt;
  }
  bool Has(CoordinatorMessage::KindCase kind, uint64_t round) const {
    return Find(kind, round).has_value();
  }
  int Count(CoordinatorMessage::KindCase kind, uint64_t round) const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count_if(messages_.begin(), messages_.end(), [&](const auto& m) {
      return m.kind_case() == kind && testing::DirectiveRound(m) == round;
    }));
  }
  // How many directives came before the first of `kind` for `round` (all
  // of them when none did).
  uint64_t Before(CoordinatorMessage::KindCase kind, uint64_t round) const {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const CoordinatorMessage& m : messages_) {
      if (m.kind_case() == kind && testing::DirectiveRound(m) == round) break;
      ++n;
    }
    return n;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<CoordinatorMessage> messages_ ABSL_GUARDED_BY(mu_);
};

// A light supernode: one Relay stream, the members' Hellos, a heartbeat for
// every open member every kHeartbeat, calls with ids, and everything that
// comes down recorded per member.
class TestRelay {
 public:
  // `token`: sent as the run token (empty = none).
  TestRelay(v1::Coordinator::Stub* stub, const std::string& relay_id,
            const std::string& token = "") {
    ctx_.set_deadline(DeadlineIn(absl::Seconds(120)));
    if (!token.empty()) ctx_.AddMetadata(kAuthMetadataKey, absl::StrCat(kBearerPrefix, token));
    stream_ = stub->Relay(&ctx_);
    v1::RelayUp hello;
    hello.mutable_hello()->set_worker_id(relay_id);
    Send(hello);
    reader_ = std::thread([this] { ReadAll(); });
    heartbeats_ = std::thread([this] {
      while (!stop_) {
        v1::RelayUp up;
        {
          absl::MutexLock lock(&mu_);
          for (const std::string& id : open_) {
            auto* s = up.add_sessions();
            s->set_worker_id(id);
            s->mutable_message()->mutable_heartbeat()->set_sent_unix_ms(1);
          }
        }
        if (up.sessions_size() > 0) Send(up);
        absl::SleepFor(kHeartbeat);
      }
    });
  }
  ~TestRelay() { Break(); }

  // Cancels the stream (the supernode died) and waits for the threads.
  void Break() {
    stop_ = true;
    ctx_.TryCancel();
    if (heartbeats_.joinable()) heartbeats_.join();
    if (reader_.joinable()) reader_.join();
  }

  bool Send(const v1::RelayUp& up) {
    absl::MutexLock lock(&write_mu_);
    if (finished_) return false;
    return stream_->Write(up);
  }

  // Opens `id`'s session through this relay (and heartbeats it from then
  // on); `hello`'s session number and resume counts go with it.
  void Open(const std::string& id, v1::Hello hello = {}) {
    v1::RelayUp up;
    auto* s = up.add_sessions();
    s->set_worker_id(id);
    hello.set_worker_id(id);
    *s->mutable_message()->mutable_hello() = std::move(hello);
    Send(up);
    absl::MutexLock lock(&mu_);
    open_.insert(id);
  }

  // Sends `call` (its call_id set here) and waits for its result.
  std::optional<RelayedCallResult> Call(RelayedCall call) {
    const uint64_t id = next_call_++;
    call.set_call_id(id);
    v1::RelayUp up;
    *up.add_calls() = std::move(call);
    if (!Send(up)) return std::nullopt;
    std::optional<RelayedCallResult> result;
    WaitUntil(
        [&] {
          absl::MutexLock lock(&mu_);
          auto it = results_.find(id);
          if (it == results_.end()) return false;
          result = it->second;
          return true;
        },
        kWait);
    return result;
  }
  // A call of `method` by `id` carrying `request`'s bytes.
  static RelayedCall Of(const std::string& id, const std::string& method,
                        const google::protobuf::Message& request) {
    RelayedCall call;
    call.set_worker_id(id);
    call.set_method(method);
    call.set_request(request.SerializeAsString());
    return call;
  }
  RelayedCallResult JoinRound(const std::string& id, uint64_t round) {
    v1::JoinRoundRequest r;
    r.set_worker_id(id);
    r.set_round(round);
    return Call(Of(id, "JoinRound", r)).value_or(RelayedCallResult());
  }
  RelayedCallResult ReportReady(const std::string& id, uint64_t round) {
    v1::ReportReadyRequest r;
    r.set_worker_id(id);
    r.set_round(round);
    r.set_train_loss(0.5);
    r.set_total_elements(kTotal);
    return Call(Of(id, "ReportReady", r)).value_or(RelayedCallResult());
  }
  RelayedCallResult ConnectionsReady(const std::string& id, uint64_t round, uint32_t attempt) {
    v1::ConnectionsReadyRequest r;
    r.set_worker_id(id);
    r.set_round(round);
    r.set_attempt(attempt);
    return Call(Of(id, "ConnectionsReady", r)).value_or(RelayedCallResult());
  }
  RelayedCallResult ReportDone(const std::string& id, uint64_t round) {
    v1::ReportRoundDoneRequest r;
    r.set_worker_id(id);
    r.set_round(round);
    r.set_model_hash(Hash('a'));
    r.set_exchange_seconds(0.01);
    return Call(Of(id, "ReportRoundDone", r)).value_or(RelayedCallResult());
  }
  // The round a JoinRound result admitted to (0: none).
  static uint64_t Admitted(const RelayedCallResult& result) {
    v1::JoinRoundResponse response;
    if (!response.ParseFromString(result.response())) return 0;
    return response.admitted_round();
  }

  // True once `id`'s Hello was handled and its session is here: the
  // coordinator handles a stream's messages in order, and a call that names
  // no method is INVALID_ARGUMENT for a member routed here
  // (PERMISSION_DENIED for any other).
  bool Opened(const std::string& id) {
    RelayedCall call;
    call.set_worker_id(id);
    auto result = Call(call);
    return result.has_value() && result->code() == grpc::StatusCode::INVALID_ARGUMENT;
  }

  const Log& log(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return logs_[id];
  }
  // How a member's relayed session ended first, if it did.
  std::optional<v1::RelayedSessionEnd> ended(const std::string& id) const {
    absl::MutexLock lock(&mu_);
    auto it = ended_.find(id);
    if (it == ended_.end()) return std::nullopt;
    return it->second;
  }
  // The largest number of members one entry of `kind` was addressed to.
  int WidestEntry(CoordinatorMessage::KindCase kind) const {
    absl::MutexLock lock(&mu_);
    auto it = widest_.find(kind);
    return it == widest_.end() ? 0 : it->second;
  }
  std::optional<grpc::Status> closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  void ReadAll() {
    v1::RelayDown down;
    while (stream_->Read(&down)) {
      absl::MutexLock lock(&mu_);
      for (const auto& d : down.directives()) {
        int& widest = widest_[d.message().kind_case()];
        widest = std::max(widest, d.worker_ids_size());
        for (const std::string& id : d.worker_ids()) logs_[id].Add(d.message());
      }
      for (const auto& r : down.results()) results_[r.call_id()] = r;
      for (const auto& e : down.ended()) {
        // The first end counts (a heartbeat already on its way ends again).
        ended_.try_emplace(e.worker_id(), e);
        open_.erase(e.worker_id());
      }
    }
    stop_ = true;
    grpc::Status s;
    {
      absl::MutexLock lock(&write_mu_);
      finished_ = true;
      s = stream_->Finish();
    }
    absl::MutexLock lock(&mu_);
    closed_ = s;
  }

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RelayUp, v1::RelayDown>> stream_;
  absl::Mutex write_mu_;
  bool finished_ ABSL_GUARDED_BY(write_mu_) = false;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_call_{1};
  mutable absl::Mutex mu_;
  std::set<std::string> open_ ABSL_GUARDED_BY(mu_);
  // A node map: log() hands out references.
  std::map<std::string, Log> logs_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, RelayedCallResult> results_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::RelayedSessionEnd> ended_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> widest_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> closed_ ABSL_GUARDED_BY(mu_);
  std::thread reader_, heartbeats_;
};

// A direct worker: the real client and its session log (declared first:
// the client's reader thread writes to it until the session is closed).
struct DirectWorker {
  Log log;
  std::string id;
  std::unique_ptr<GrpcCoordinatorClient> client;
  ~DirectWorker() {
    if (client != nullptr) client->CloseSession();
  }
};

class RelayTest : public ::testing::Test {
 protected:
  void Start(uint32_t min_participants, uint64_t rounds, const std::string& token = "") {
    CoordinatorOptions options = testing::TestCoordinatorOptions("run-relay");
    options.engine.config.mutable_timeouts()->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(kHeartbeat));
    options.engine.config.mutable_sync()->set_min_participants(min_participants);
    options.engine.config.mutable_sync()->set_rounds(rounds);
    options.engine.heartbeat_lease = kLease;
    options.engine.session_grace = absl::Seconds(60);
    options.tick_interval = absl::Milliseconds(50);
    options.relay.max_members = 3;
    options.relay.max_batch = 64;
    if (!token.empty()) {
      // As --token_file does: the run token, and member credentials.
      options.gate = TokenGate(token, "");
      options.engine.member_credentials = true;
    }
    auto server = testing::StartTestCoordinator(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    // A plain channel: the test decides which calls carry the token.
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    token_ = token;
  }

  void TearDown() override {
    relays_.clear();
    direct_.clear();
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }

  // Joins a worker (Join is always direct) and returns its id.
  std::string Join(int n) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(kRpcTimeout));
    v1::JoinRequest request;
    request.set_peer_address(PeerAddress(n));
    v1::JoinResponse response;
    if (!token_.empty()) ctx.AddMetadata(kAuthMetadataKey, absl::StrCat(kBearerPrefix, token_));
    grpc::Status s = stub_->Join(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.worker_id();
  }

  TestRelay* AddRelay(const std::string& relay_id) {
    relays_.push_back(std::make_unique<TestRelay>(stub_.get(), relay_id));
    return relays_.back().get();
  }

  // A worker with its own direct session (`id` empty: it joins first);
  // `hello`'s session number and resume counts go with its Hello.
  DirectWorker* AddDirect(int n, const std::string& id = "", v1::Hello hello = {}) {
    auto w = std::make_unique<DirectWorker>();
    CoordinatorClientOptions options;
    options.address = server_->address();
    options.rpc_timeout = kRpcTimeout;
    options.retry_window = kRpcTimeout;
    w->client = std::make_unique<GrpcCoordinatorClient>(options);
    w->id = id.empty() ? Join(n) : id;
    Log* log = &w->log;
    hello.set_worker_id(w->id);
    absl::Status s = w->client->OpenSessionWith(
        hello, kHeartbeat, [log](const CoordinatorMessage& m) { log->Add(m); },
        [](const absl::Status&) {});
    EXPECT_TRUE(s.ok()) << s;
    direct_.push_back(std::move(w));
    return direct_.back().get();
  }

  bool Active(const std::string& id) { return server_->engine().IsActive(id); }

  // `w` reports `round` trained, on its direct client.
  void ReadyDirect(DirectWorker* w, uint64_t round) {
    v1::ReportReadyRequest ready;
    ready.set_worker_id(w->id);
    ready.set_round(round);
    ready.set_total_elements(kTotal);
    ASSERT_TRUE(w->client->ReportReady(ready).ok()) << w->id;
  }

  // `w` reached its peers for `round`'s plan `attempt`, on its direct client.
  void ConnectedDirect(DirectWorker* w, uint64_t round, uint32_t attempt) {
    v1::ConnectionsReadyRequest q;
    q.set_worker_id(w->id);
    q.set_round(round);
    q.set_attempt(attempt);
    ASSERT_TRUE(w->client->ConnectionsReady(q).ok()) << w->id;
  }

  // Round 1 starts for `direct` and for `m`, whose session (numbered
  // `session`) goes through `relay`.
  void StartRoundWithRelayedMember(DirectWorker* direct, TestRelay* relay, const std::string& m,
                                   uint64_t session) {
    v1::Hello hello;
    hello.set_session(session);
    relay->Open(m, hello);
    ASSERT_TRUE(relay->Opened(m));
    ASSERT_TRUE(direct->client->JoinRound(direct->id, 1).ok());
    ASSERT_EQ(relay->JoinRound(m, 1).code(), 0);
    ASSERT_TRUE(
        WaitUntil([&] { return relay->log(m).Has(CoordinatorMessage::kRoundStart, 1); }, kWait));
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::string token_;
  std::vector<std::unique_ptr<TestRelay>> relays_;
  std::vector<std::unique_ptr<DirectWorker>> direct_;
};

TEST_F(RelayTest, RelayedAndDirectWorkersCompleteRoundsTogether) {
  Start(/*min_participants=*/3, /*rounds=*/2);
  DirectWorker* direct = AddDirect(1);
  const std::string r = Join(2);
  const std::string m = Join(3);
  TestRelay* relay = AddRelay(r);
  relay->Open(r);  // the supernode is a member like the others
  relay->Open(m);
  // (Directives for a direct worker whose session is still registering
  // are kept for it: no wait needed there.)
  ASSERT_TRUE(relay->Opened(r));
  ASSERT_TRUE(relay->Opened(m));

  auto joined = direct->client->JoinRound(direct->id, 1);
  ASSERT_TRUE(joined.ok()) << joined.status();
  for (const std::string& id : {r, m}) {
    RelayedCallResult result = relay->JoinRound(id, 1);
    ASSERT_EQ(result.code(), 0) << result.message();
    EXPECT_EQ(TestRelay::Admitted(result), 1u);
  }
  for (uint64_t round = 1; round <= 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto all_have = [&](CoordinatorMessage::KindCase kind) {
      return WaitUntil(
          [&] {
            return direct->log.Has(kind, round) && relay->log(r).Has(kind, round) &&
                   relay->log(m).Has(kind, round);
          },
          kWait);
    };
    ASSERT_TRUE(all_have(CoordinatorMessage::kRoundStart));
    if (round == 1) {
      // Bad input is answered in the call's result, as the direct call
      // would be, and the round goes on.
      v1::ReportReadyRequest empty_model;
      empty_model.set_worker_id(m);
      empty_model.set_round(1);
      EXPECT_EQ(relay->Call(TestRelay::Of(m, "ReportReady", empty_model))->code(),
                grpc::StatusCode::INVALID_ARGUMENT);
    }
    ASSERT_TRUE(direct->client
                    ->ReportReady([&] {
                      v1::ReportReadyRequest q;
                      q.set_worker_id(direct->id);
                      q.set_round(round);
                      q.set_total_elements(kTotal);
                      return q;
                    }())
                    .ok());
    for (const std::string& id : {r, m}) EXPECT_EQ(relay->ReportReady(id, round).code(), 0);
    ASSERT_TRUE(all_have(CoordinatorMessage::kRoundPlan));
    const v1::RoundPlan plan =
        relay->log(m).Find(CoordinatorMessage::kRoundPlan, round)->round_plan();
    EXPECT_EQ(
        plan.SerializeAsString(),
        direct->log.Find(CoordinatorMessage::kRoundPlan, round)->round_plan().SerializeAsString())
        << "relayed and direct participants get the same plan";
    v1::ConnectionsReadyRequest ready;
    ready.set_worker_id(direct->id);
    ready.set_round(round);
    ready.set_attempt(plan.attempt());
    ASSERT_TRUE(direct->client->ConnectionsReady(ready).ok());
    for (const std::string& id : {r, m}) {
      EXPECT_EQ(relay->ConnectionsReady(id, round, plan.attempt()).code(), 0);
    }
    ASSERT_TRUE(all_have(CoordinatorMessage::kStartSharing));
    v1::ReportRoundDoneRequest done;
    done.set_worker_id(direct->id);
    done.set_round(round);
    done.set_model_hash(Hash('a'));
    ASSERT_TRUE(direct->client->ReportRoundDone(done).ok());
    for (const std::string& id : {r, m}) EXPECT_EQ(relay->ReportDone(id, round).code(), 0);
    ASSERT_TRUE(all_have(CoordinatorMessage::kRoundComplete));
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        return direct->log.Has(CoordinatorMessage::kRunFinished, 2) &&
               relay->log(r).Has(CoordinatorMessage::kRunFinished, 2) &&
               relay->log(m).Has(CoordinatorMessage::kRunFinished, 2);
      },
      kWait));
  // A broadcast reached the relay's two members as one entry with both ids.
  EXPECT_EQ(relay->WidestEntry(CoordinatorMessage::kRoundPlan), 2);
  EXPECT_EQ(relay->WidestEntry(CoordinatorMessage::kRoundComplete), 2);
  EXPECT_EQ(server_->engine().last_completed_round(), 2u);
}

TEST_F(RelayTest, BadRelayedCallsAreAnsweredAndTheStreamKeepsServing) {
  Start(/*min_participants=*/2, /*rounds=*/2);
  const std::string r = Join(1);
  DirectWorker* direct = AddDirect(2);
  TestRelay* relay = AddRelay(r);
  relay->Open(r);
  ASSERT_TRUE(relay->Opened(r));

  // A stranger: no such member.
  RelayedCallResult stranger = relay->JoinRound("w999", 1);
  EXPECT_EQ(stranger.code(), grpc::StatusCode::PERMISSION_DENIED) << stranger.message();
  EXPECT_TRUE(stranger.response().empty());
  // A real member whose session is not carried by this relay.
  RelayedCallResult elsewhere = relay->JoinRound(direct->id, 1);
  EXPECT_EQ(elsewhere.code(), grpc::StatusCode::PERMISSION_DENIED) << elsewhere.message();
  // The request of another member than the call's.
  v1::JoinRoundRequest other;
  other.set_worker_id(direct->id);
  EXPECT_EQ(relay->Call(TestRelay::Of(r, "JoinRound", other))->code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // No method at all.
  RelayedCall empty;
  empty.set_worker_id(r);
  EXPECT_EQ(relay->Call(empty)->code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Bytes that are not the method's request.
  RelayedCall garbage = TestRelay::Of(r, "JoinRound", other);
  garbage.set_request("\xff\xff\xff");
  EXPECT_EQ(relay->Call(garbage)->code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Methods that are not relayed, and one that does not exist.
  v1::JoinRequest join;
  EXPECT_EQ(relay->Call(TestRelay::Of(r, "Join", join))->code(), grpc::StatusCode::UNIMPLEMENTED);
  v1::GetRunStatusRequest status;
  EXPECT_EQ(relay->Call(TestRelay::Of(r, "GetRunStatus", status))->code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(relay->Call(TestRelay::Of(r, "NoSuchMethod", status))->code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // The engine's own checks come back as they would directly.
  EXPECT_EQ(relay->ReportReady(r, 7).code(), grpc::StatusCode::FAILED_PRECONDITION);

  // A heartbeat for a member without a session here ends that one only.
  v1::RelayUp up;
  auto* hb = up.add_sessions();
  hb->set_worker_id(direct->id);
  hb->mutable_message()->mutable_heartbeat();
  ASSERT_TRUE(relay->Send(up));
  ASSERT_TRUE(WaitUntil([&] { return relay->ended(direct->id).has_value(); }, kWait));
  EXPECT_EQ(relay->ended(direct->id)->code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Active(direct->id)) << "the direct session is untouched";

  // Still serving: a good call succeeds.
  RelayedCallResult good = relay->JoinRound(r, 1);
  EXPECT_EQ(good.code(), 0) << good.message();
  EXPECT_EQ(TestRelay::Admitted(good), 1u);
  EXPECT_FALSE(relay->closed().has_value());
}

TEST_F(RelayTest, RelayLimitsAndHelloChecks) {
  Start(/*min_participants=*/2, /*rounds=*/2);
  std::vector<std::string> ids;
  for (int n = 1; n <= 4; ++n) ids.push_back(Join(n));
  TestRelay* relay = AddRelay(ids[0]);
  for (const std::string& id : ids) relay->Open(id);  // max_members = 3
  ASSERT_TRUE(WaitUntil([&] { return relay->ended(ids[3]).has_value(); }, kWait));
  EXPECT_EQ(relay->ended(ids[3])->code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(relay->ended(ids[3])->message().find("--relay_max_members=3"), std::string::npos)
      << relay->ended(ids[3])->message();
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(relay->ended(ids[i]).has_value());

  // A relay that is not a member is refused.
  TestRelay* stranger = AddRelay("w999");
  ASSERT_TRUE(WaitUntil([&] { return stranger->closed().has_value(); }, kWait));
  EXPECT_EQ(stranger->closed()->error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // A batch past max_batch (64) ends the stream.
  TestRelay* big = AddRelay(ids[1]);
  v1::RelayUp up;
  for (int i = 0; i < 65; ++i) {
    auto* s = up.add_sessions();
    s->set_worker_id(ids[1]);
    s->mutable_message()->mutable_heartbeat();
  }
  big->Send(up);
  ASSERT_TRUE(WaitUntil([&] { return big->closed().has_value(); }, kWait));
  EXPECT_EQ(big->closed()->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(big->closed()->error_message().find("--relay_max_batch"), std::string::npos)
      << big->closed()->error_message();
  // The first relay was not affected.
  EXPECT_EQ(relay->JoinRound(ids[0], 1).code(), 0);
}

TEST_F(RelayTest, MemberReopensDirectlyAfterItsRelayBrokeAndTheRoundCompletes) {
  Start(/*min_participants=*/2, /*rounds=*/1);
  DirectWorker* direct = AddDirect(1);
  const std::string m = Join(2);
  TestRelay* relay = AddRelay(m);
  relay->Open(m);
  ASSERT_TRUE(relay->Opened(m));
  ASSERT_TRUE(direct->client->JoinRound(direct->id, 1).ok());
  ASSERT_EQ(relay->JoinRound(m, 1).code(), 0);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return direct->log.Has(CoordinatorMessage::kRoundStart, 1) &&
               relay->log(m).Has(CoordinatorMessage::kRoundStart, 1);
      },
      kWait));
  ASSERT_EQ(relay->ReportReady(m, 1).code(), 0);

  // The supernode dies; the member is not removed.
  relay->Break();
  EXPECT_TRUE(Active(m));
  // The plan goes out while the member has no session: kept for it.
  ASSERT_NO_FATAL_FAILURE(ReadyDirect(direct, 1));
  ASSERT_TRUE(WaitUntil([&] { return direct->log.Has(CoordinatorMessage::kRoundPlan, 1); }, kWait));

  // Within the lease, the member re-opens its session directly.
  DirectWorker* back = AddDirect(2, m);
  ASSERT_TRUE(WaitUntil([&] { return back->log.Has(CoordinatorMessage::kRoundPlan, 1); }, kWait))
      << "the plan kept while the member had no session";
  const uint32_t attempt =
      back->log.Find(CoordinatorMessage::kRoundPlan, 1)->round_plan().attempt();
  for (DirectWorker* w : {direct, back}) ASSERT_NO_FATAL_FAILURE(ConnectedDirect(w, 1, attempt));
  ASSERT_TRUE(WaitUntil(
      [&] {
        return direct->log.Has(CoordinatorMessage::kStartSharing, 1) &&
               back->log.Has(CoordinatorMessage::kStartSharing, 1);
      },
      kWait));
  for (DirectWorker* w : {direct, back}) {
    v1::ReportRoundDoneRequest q;
    q.set_worker_id(w->id);
    q.set_round(1);
    q.set_model_hash(Hash('b'));
    ASSERT_TRUE(w->client->ReportRoundDone(q).ok());
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        return direct->log.Has(CoordinatorMessage::kRoundComplete, 1) &&
               back->log.Has(CoordinatorMessage::kRoundComplete, 1);
      },
      kWait));
  EXPECT_EQ(server_->engine().last_completed_round(), 1u);
}

// A Hello that numbers the session and says how many directives the
// member took from its earlier one.
v1::Hello Resuming(uint64_t session, uint64_t earlier, uint64_t received) {
  v1::Hello hello;
  hello.set_session(session);
  auto* resume = hello.add_resume();
  resume->set_session(earlier);
  resume->set_received(received);
  return hello;
}

// The bug of issue 12 item 5: a supernode that dies with a directive in
// flight (the coordinator had sent it the member's RoundPlan, the member
// never got it) while the coordinator still counts the relay as alive.
TEST_F(RelayTest, DirectivesTheRelayDidNotDeliverGoOutAgainOnTheMembersNextSession) {
  Start(/*min_participants=*/2, /*rounds=*/1);
  DirectWorker* direct = AddDirect(1);
  const std::string m = Join(2);
  TestRelay* relay = AddRelay(m);
  ASSERT_NO_FATAL_FAILURE(StartRoundWithRelayedMember(direct, relay, m, /*session=*/7));
  ASSERT_EQ(relay->ReportReady(m, 1).code(), 0);
  ASSERT_NO_FATAL_FAILURE(ReadyDirect(direct, 1));
  // The plan went down the relay's stream; the member took only what came
  // before it.
  ASSERT_TRUE(
      WaitUntil([&] { return relay->log(m).Has(CoordinatorMessage::kRoundPlan, 1); }, kWait));
  const uint64_t taken = relay->log(m).Before(CoordinatorMessage::kRoundPlan, 1);
  ASSERT_GE(taken, 1u);  // at least the RoundStart

  // The member re-opens directly, before the coordinator saw the relay die.
  DirectWorker* back = AddDirect(2, m, Resuming(8, 7, taken));
  ASSERT_TRUE(WaitUntil([&] { return back->log.Has(CoordinatorMessage::kRoundPlan, 1); }, kWait))
      << "the plan the relay did not deliver";
  const uint32_t attempt =
      back->log.Find(CoordinatorMessage::kRoundPlan, 1)->round_plan().attempt();
  for (DirectWorker* w : {direct, back}) ASSERT_NO_FATAL_FAILURE(ConnectedDirect(w, 1, attempt));
  ASSERT_TRUE(
      WaitUntil([&] { return back->log.Has(CoordinatorMessage::kStartSharing, 1); }, kWait));
  // What the member took is not sent again.
  EXPECT_EQ(back->log.Count(CoordinatorMessage::kRoundStart, 1), 0);
  EXPECT_EQ(back->log.Count(CoordinatorMessage::kRoundPlan, 1), 1);
  relay->Break();
}

TEST_F(RelayTest, ADeadRelaysDirectivesGoOutAgainOnlyPastTheMembersCount) {
  Start(/*min_participants=*/2, /*rounds=*/1);
  DirectWorker* direct = AddDirect(1);
  const std::string r = Join(2);
  const std::string m = Join(3);
  TestRelay* relay = AddRelay(r);
  ASSERT_NO_FATAL_FAILURE(StartRoundWithRelayedMember(direct, relay, m, /*session=*/21));
  // The member took everything; its relay dies.
  const uint64_t taken = relay->log(m).Before(CoordinatorMessage::kRoundPlan, 1);
  relay->Break();
  TestRelay* other = AddRelay(direct->id);
  other->Open(m, Resuming(22, 21, taken));
  ASSERT_TRUE(other->Opened(m));
  ASSERT_EQ(other->ReportReady(m, 1).code(), 0);
  ASSERT_NO_FATAL_FAILURE(ReadyDirect(direct, 1));
  ASSERT_TRUE(
      WaitUntil([&] { return other->log(m).Has(CoordinatorMessage::kRoundPlan, 1); }, kWait));
  EXPECT_EQ(other->log(m).Count(CoordinatorMessage::kRoundStart, 1), 0)
      << "the member took it from the dead relay";
  // The new relayed session keeps its own count: a next session that did
  // not take the plan from it gets the plan again.
  DirectWorker* again =
      AddDirect(3, m, Resuming(23, 22, other->log(m).Before(CoordinatorMessage::kRoundPlan, 1)));
  ASSERT_TRUE(WaitUntil([&] { return again->log.Has(CoordinatorMessage::kRoundPlan, 1); }, kWait));
  EXPECT_EQ(again->log.Count(CoordinatorMessage::kRoundStart, 1), 0);
}

TEST_F(RelayTest, MemberThatDoesNotComeBackIsEvictedAfterTheLease) {
  Start(/*min_participants=*/2, /*rounds=*/2);
  const std::string r = Join(1);
  const std::string m = Join(2);
  TestRelay* relay = AddRelay(r);
  relay->Open(m);
  ASSERT_TRUE(relay->Opened(m));
  relay->Break();
  EXPECT_TRUE(Active(m)) << "not removed at once";
  ASSERT_TRUE(WaitUntil([&] { return !Active(m); }, kLease + kWait))
      << "removed once its lease ran out, like a silent session";
}

TEST_F(RelayTest, RelayNeedsTheRunTokenAndCarriesMemberCredentials) {
  const std::string token = "relay-test-token-0123456789";
  Start(/*min_participants=*/2, /*rounds=*/2, token);
  const std::string r = Join(1);
  const std::string m = Join(2);
  // Without the token: refused before the service sees it.
  relays_.push_back(std::make_unique<TestRelay>(stub_.get(), r));
  TestRelay* refused = relays_.back().get();
  ASSERT_TRUE(WaitUntil([&] { return refused->closed().has_value(); }, kWait));
  EXPECT_EQ(refused->closed()->error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // With it: the member's relayed session starts with the full list of
  // current member credentials, as a direct session does.
  relays_.push_back(std::make_unique<TestRelay>(stub_.get(), r, token));
  TestRelay* relay = relays_.back().get();
  relay->Open(m);
  ASSERT_TRUE(relay->Opened(m));
  ASSERT_TRUE(
      WaitUntil([&] { return relay->log(m).Has(CoordinatorMessage::kMemberUpdate, 0); }, kWait));
  const v1::MemberUpdate list =
      relay->log(m).Find(CoordinatorMessage::kMemberUpdate, 0)->member_update();
  EXPECT_TRUE(list.full());
  EXPECT_EQ(list.entries_size(), 2);
}

TEST_F(RelayTest, SessionMovesBetweenRelaysAndToADirectStream) {
  Start(/*min_participants=*/2, /*rounds=*/2);
  const std::string a = Join(1);
  const std::string b = Join(2);
  const std::string m = Join(3);
  TestRelay* relay_a = AddRelay(a);
  TestRelay* relay_b = AddRelay(b);
  relay_a->Open(m);
  ASSERT_TRUE(relay_a->Opened(m));
  // Through another relay: the first one hears that it lost the member.
  relay_b->Open(m);
  ASSERT_TRUE(relay_b->Opened(m));
  ASSERT_TRUE(WaitUntil([&] { return relay_a->ended(m).has_value(); }, kWait));
  EXPECT_EQ(relay_a->ended(m)->code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(relay_a->JoinRound(m, 1).code(), grpc::StatusCode::PERMISSION_DENIED)
      << "a relay speaks only for the members whose session it carries";
  // Directly: the relay hears it too; the member stays in the run.
  AddDirect(3, m);
  ASSERT_TRUE(WaitUntil([&] { return relay_b->ended(m).has_value(); }, kWait));
  EXPECT_EQ(relay_b->ended(m)->code(), grpc::StatusCode::ABORTED);
  EXPECT_TRUE(Active(m));
  // A Hello that names another member than the entry's.
  v1::RelayUp up;
  auto* s = up.add_sessions();
  s->set_worker_id(a);
  s->mutable_message()->mutable_hello()->set_worker_id(b);
  ASSERT_TRUE(relay_b->Send(up));
  ASSERT_TRUE(WaitUntil([&] { return relay_b->ended(a).has_value(); }, kWait));
  EXPECT_EQ(relay_b->ended(a)->code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RelayTest, RelayedLeaveAndARelayWhoseWorkerLeft) {
  Start(/*min_participants=*/2, /*rounds=*/2);
  const std::string r = Join(1);
  const std::string m = Join(2);
  const std::string k = Join(3);
  TestRelay* relay = AddRelay(r);
  relay->Open(m);
  relay->Open(k);
  ASSERT_TRUE(relay->Opened(m));
  ASSERT_TRUE(relay->Opened(k));
  v1::LeaveRequest leave;
  leave.set_worker_id(m);
  leave.set_reason("done");
  EXPECT_EQ(relay->Call(TestRelay::Of(m, "Leave", leave))->code(), 0);
  EXPECT_FALSE(Active(m));
  // The relay's own worker leaves (directly): its stream ends; the member it
  // carried stays in the run, on its lease.
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kRpcTimeout));
  v1::LeaveRequest request;
  request.set_worker_id(r);
  v1::LeaveResponse response;
  ASSERT_TRUE(stub_->Leave(&ctx, request, &response).ok());
  ASSERT_TRUE(WaitUntil([&] { return relay->closed().has_value(); }, kWait));
  EXPECT_EQ(relay->closed()->error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Active(k));
}

TEST_F(RelayTest, MemberGoneIsRemovedAtOnce) {
  Start(/*min_participants=*/2, /*rounds=*/2);
  const std::string r = Join(1);
  const std::string m = Join(2);
  TestRelay* relay = AddRelay(r);
  relay->Open(m);
  ASSERT_TRUE(relay->Opened(m));
  v1::RelayUp up;
  auto* gone = up.add_gone();
  gone->set_worker_id(m);
  gone->set_reason("link to the supernode broke");
  ASSERT_TRUE(relay->Send(up));
  ASSERT_TRUE(WaitUntil([&] { return !Active(m); }, kWait));
  EXPECT_TRUE(Active(r));
}

// The limits of what a client sends hold on the relay path as on the
// direct one (core/request_limits.h): a relayed call's request, a relayed
// session message and a gone notice over them are refused naming the
// field, and the relay stream goes on serving its other members.
TEST_F(RelayTest, TextLimitsHoldOnTheRelayPath) {
  Start(/*min_participants=*/2, /*rounds=*/2);
  const std::string r = Join(1);
  const std::string m = Join(2);
  const std::string k = Join(3);
  TestRelay* relay = AddRelay(r);
  relay->Open(m);
  relay->Open(k);
  ASSERT_TRUE(relay->Opened(m));
  ASSERT_TRUE(relay->Opened(k));
  // A relayed call whose request carries a control sequence.
  v1::LeaveRequest leave;
  leave.set_worker_id(m);
  leave.set_reason("bye\x1b]0;owned\x07");
  RelayedCallResult refused = *relay->Call(TestRelay::Of(m, "Leave", leave));
  EXPECT_EQ(refused.code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.message();
  EXPECT_NE(refused.message().find("LeaveRequest.reason holds U+001B"), std::string::npos)
      << refused.message();
  EXPECT_TRUE(Active(m));
  // The call's own fields.
  RelayedCall long_method = TestRelay::Of(m, std::string(100, 'M'), leave);
  RelayedCallResult bad_method = *relay->Call(long_method);
  EXPECT_EQ(bad_method.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad_method.message().find("RelayedCall.method is 100 bytes; at most 64"),
            std::string::npos)
      << bad_method.message();
  // A relayed heartbeat over the limits ends that member's relayed session.
  v1::RelayUp up;
  auto* hb = up.add_sessions();
  hb->set_worker_id(k);
  hb->mutable_message()->mutable_heartbeat()->set_final_error(std::string(5000, 'e'));
  ASSERT_TRUE(relay->Send(up));
  ASSERT_TRUE(WaitUntil([&] { return relay->ended(k).has_value(); }, kWait));
  EXPECT_EQ(relay->ended(k)->code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(relay->ended(k)->message().find("RelayedSessionMessage.message.heartbeat.final_error"),
            std::string::npos)
      << relay->ended(k)->message();
  // A gone notice with a reason over the limits is dropped: m stays.
  v1::RelayUp gone;
  auto* g = gone.add_gone();
  g->set_worker_id(m);
  g->set_reason(std::string(600, 'g'));
  ASSERT_TRUE(relay->Send(gone));
  // Still serving, and m is still a member with its session here.
  ASSERT_TRUE(relay->Opened(m));
  EXPECT_TRUE(Active(m));
  EXPECT_FALSE(relay->closed().has_value());
  leave.set_reason("done");
  EXPECT_EQ(relay->Call(TestRelay::Of(m, "Leave", leave))->code(), 0);
}

}  // namespace
}  // namespace shoal
