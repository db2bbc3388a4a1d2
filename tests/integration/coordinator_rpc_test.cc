// Integration tests of the coordinator over real gRPC: a CoordinatorServer on
// 127.0.0.1:0 with the real clock, driven by GrpcCoordinatorClient and raw
// stubs. Every RPC has a deadline; waiting is polling with a deadline.
#include <grpc/grpc.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "common/status_util.h"
#include "common/worker_state.h"
#include "gmock/gmock.h"
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
using ::shoal::v1::RunStatus;
using ::shoal::v1::WorkerStatus;
using ::shoal::worker::CoordinatorClientOptions;
using ::shoal::worker::GrpcCoordinatorClient;
using ::testing::HasSubstr;

// Keeps gRPC initialised for the whole test binary. Otherwise gRPC 1.51 tears
// the library down whenever a test's last server or channel goes away, and
// that teardown sometimes blocks ~10 s joining an executor thread that sits
// in a 10 s poll. Never shut down: process exit cleans up.
[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

constexpr absl::Duration kRpcTimeout = absl::Seconds(5);
constexpr absl::Duration kWait = absl::Seconds(10);
constexpr absl::Duration kLease = absl::Seconds(2);
constexpr absl::Duration kHeartbeat = absl::Milliseconds(20);
constexpr uint64_t kTotal = 1000;

// A well-formed SHA-256 hex digest made of one repeated digit.
std::string Hash(char c) { return std::string(64, c); }

// Peer addresses are only recorded by the coordinator, never dialled; the
// ports below are labels, nothing listens on them.
std::string PeerAddress(int n) { return absl::StrCat("127.0.0.1:", 40000 + n); }

std::optional<WorkerStatus> FindWorker(const RunStatus& status, const std::string& id) {
  for (const WorkerStatus& w : status.workers()) {
    if (w.id() == id) return w;
  }
  return std::nullopt;
}

// Session messages and the close status of one worker, recorded from the
// client's reader thread.
class SessionLog {
 public:
  void Add(const CoordinatorMessage& msg) {
    absl::MutexLock lock(&mu_);
    messages_.push_back(msg);
  }
  void Closed(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    closed_ = status;
  }
  // The first message of `kind` for `round` (every kind carries a round).
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
  int Count(CoordinatorMessage::KindCase kind) const {
    absl::MutexLock lock(&mu_);
    return std::count_if(messages_.begin(), messages_.end(),
                         [kind](const CoordinatorMessage& m) { return m.kind_case() == kind; });
  }
  std::optional<absl::Status> closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<CoordinatorMessage> messages_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
};

// One simulated worker: the real client, its id and its session log.
// Declared after the server in each test, so it is destroyed (its session
// closed) before the server stops. The log is declared before the client:
// the client's destructor joins the reader thread that writes the log.
struct TestWorker {
  SessionLog log;
  std::unique_ptr<GrpcCoordinatorClient> client;
  std::string id;
};

class CoordinatorRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options = testing::TestCoordinatorOptions("run-integration");
    options.engine.config.mutable_timeouts()->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(kHeartbeat));
    options.engine.heartbeat_lease = kLease;
    // Long: several tests use workers that never open a session.
    options.engine.session_grace = absl::Seconds(60);
    options.tick_interval = absl::Milliseconds(50);
    auto server = testing::StartTestCoordinator(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(MakeChannel(server_->address()));
  }

  void TearDown() override {
    // Workers first (their sessions), then the server.
    workers_.clear();
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(DeadlineIn(kRpcTimeout));
    return ctx;
  }

  // Joins a worker with the real client.
  TestWorker* AddWorker(int n) {
    auto w = std::make_unique<TestWorker>();
    CoordinatorClientOptions options;
    options.address = server_->address();
    options.rpc_timeout = kRpcTimeout;
    options.retry_window = kRpcTimeout;
    w->client = std::make_unique<GrpcCoordinatorClient>(options);
    v1::JoinRequest request;
    request.set_peer_address(PeerAddress(n));
    request.set_name(absl::StrCat("worker-", n));
    auto joined = w->client->Join(request);
    EXPECT_TRUE(joined.ok()) << joined.status();
    if (joined.ok()) w->id = joined->worker_id();
    workers_.push_back(std::move(w));
    return workers_.back().get();
  }

  // Opens the worker's session and waits until the coordinator has it
  // registered (see WaitForHeartbeat).
  void OpenSession(TestWorker* w) {
    SessionLog* log = &w->log;
    absl::Status s = w->client->OpenSession(
        w->id, kHeartbeat, [log](const CoordinatorMessage& m) { log->Add(m); },
        [log](const absl::Status& st) { log->Closed(st); });
    ASSERT_TRUE(s.ok()) << s;
    WaitForHeartbeat(w->id);
  }

  // The coordinator registers a session when it reads its Hello, and reads
  // heartbeats only after that; directives to an unregistered session are
  // dropped. So: wait until last_seen moved twice after now (Connect, then a
  // heartbeat). Bounds account for last_seen_ms_ago's ms truncation.
  void WaitForHeartbeat(const std::string& id) {
    // Lower and upper bounds of the worker's last_seen from one status.
    auto bounds = [&](absl::Time* lower, absl::Time* upper) {
      const absl::Time before = absl::Now();
      const RunStatus status = server_->engine().Status();
      const absl::Time after = absl::Now();
      auto w = FindWorker(status, id);
      if (!w.has_value()) return false;
      const absl::Duration ago = absl::Milliseconds(w->last_seen_ms_ago());
      *lower = before - ago - absl::Milliseconds(1);
      *upper = after - ago;
      return true;
    };
    const absl::Time start = absl::Now();
    absl::Time first_upper;
    ASSERT_TRUE(WaitUntil(
        [&] {
          absl::Time lower, upper;
          if (!bounds(&lower, &upper) || lower <= start) return false;
          first_upper = upper;
          return true;
        },
        kWait))
        << "no session message from " << id;
    ASSERT_TRUE(WaitUntil(
        [&] {
          absl::Time lower, upper;
          return bounds(&lower, &upper) && lower > first_upper;
        },
        kWait))
        << "no heartbeat from " << id;
  }

  absl::StatusOr<RunStatus> GetRunStatus() {
    auto ctx = Context();
    v1::GetRunStatusRequest request;
    RunStatus status;
    grpc::Status s = stub_->GetRunStatus(ctx.get(), request, &status);
    if (!s.ok()) return FromGrpcStatus(s);
    return status;
  }

  // The server still answers after a bad request.
  void ExpectServing() {
    auto status = GetRunStatus();
    EXPECT_TRUE(status.ok()) << status.status();
  }

  grpc::StatusCode JoinRoundCode(const std::string& id, uint64_t round) {
    auto ctx = Context();
    v1::JoinRoundRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    v1::JoinRoundResponse response;
    return stub_->JoinRound(ctx.get(), request, &response).error_code();
  }

  grpc::StatusCode ReportReadyCode(const std::string& id, uint64_t round) {
    auto ctx = Context();
    v1::ReportReadyRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_total_elements(kTotal);
    v1::ReportReadyResponse response;
    return stub_->ReportReady(ctx.get(), request, &response).error_code();
  }

  grpc::StatusCode ReportDoneCode(const std::string& id, uint64_t round, const std::string& hash) {
    auto ctx = Context();
    v1::ReportRoundDoneRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_model_hash(hash);
    v1::ReportRoundDoneResponse response;
    return stub_->ReportRoundDone(ctx.get(), request, &response).error_code();
  }

  grpc::StatusCode ConnectionsReadyCode(const std::string& id, uint64_t round, uint32_t attempt,
                                        const std::vector<std::string>& unreachable = {}) {
    auto ctx = Context();
    v1::ConnectionsReadyRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_attempt(attempt);
    for (const std::string& u : unreachable) request.add_unreachable(u);
    v1::ConnectionsReadyResponse response;
    return stub_->ConnectionsReady(ctx.get(), request, &response).error_code();
  }

  grpc::StatusCode LeaveCode(const std::string& id) {
    auto ctx = Context();
    v1::LeaveRequest request;
    request.set_worker_id(id);
    v1::LeaveResponse response;
    return stub_->Leave(ctx.get(), request, &response).error_code();
  }

  grpc::StatusCode JoinCode(const std::string& peer_address, const std::string& name = "") {
    auto ctx = Context();
    v1::JoinRequest request;
    request.set_peer_address(peer_address);
    request.set_name(name);
    v1::JoinResponse response;
    return stub_->Join(ctx.get(), request, &response).error_code();
  }

  void ReportReady(TestWorker* w, uint64_t round) {
    v1::ReportReadyRequest request;
    request.set_worker_id(w->id);
    request.set_round(round);
    request.set_train_loss(0.5);
    request.set_total_elements(kTotal);
    absl::Status s = w->client->ReportReady(request);
    ASSERT_TRUE(s.ok()) << s;
  }

  void ConnectionsReady(TestWorker* w, uint64_t round, uint32_t attempt) {
    v1::ConnectionsReadyRequest request;
    request.set_worker_id(w->id);
    request.set_round(round);
    request.set_attempt(attempt);
    absl::Status s = w->client->ConnectionsReady(request);
    ASSERT_TRUE(s.ok()) << s;
  }

  void ReportDone(TestWorker* w, uint64_t round, const std::string& hash) {
    v1::ReportRoundDoneRequest request;
    request.set_worker_id(w->id);
    request.set_round(round);
    request.set_model_hash(hash);
    request.set_exchange_seconds(0.01);
    absl::Status s = w->client->ReportRoundDone(request);
    ASSERT_TRUE(s.ok()) << s;
  }

  // A raw session stream; the test decides what it sends.
  struct RawSession {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, CoordinatorMessage>> stream;
    ~RawSession() {
      if (stream != nullptr) {
        ctx.TryCancel();
        CoordinatorMessage ignored;
        while (stream->Read(&ignored)) {
        }
        (void)stream->Finish();
      }
    }
    // Reads until the server ends the stream; returns its status.
    grpc::Status Drain() {
      CoordinatorMessage ignored;
      while (stream->Read(&ignored)) {
      }
      grpc::Status s = stream->Finish();
      stream.reset();
      return s;
    }
  };

  std::unique_ptr<RawSession> OpenRawSession(absl::Duration deadline) {
    auto session = std::make_unique<RawSession>();
    session->ctx.set_deadline(DeadlineIn(deadline));
    session->stream = stub_->Session(&session->ctx);
    return session;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::vector<std::unique_ptr<TestWorker>> workers_;
};

// A plan that carries its participant list: two contiguous slices covering
// the model, owned by the two workers at their addresses.
void ExpectFullPlan(const v1::RoundPlan& plan, const std::string& id1, const std::string& id2) {
  ASSERT_EQ(plan.slices_size(), 2);
  EXPECT_EQ(plan.slices(0).begin(), 0u);
  EXPECT_EQ(plan.slices(0).end(), plan.slices(1).begin());
  EXPECT_EQ(plan.slices(1).end(), kTotal);
  EXPECT_LT(plan.slices(0).begin(), plan.slices(0).end());
  EXPECT_LT(plan.slices(1).begin(), plan.slices(1).end());
  std::set<std::string> owners, addresses;
  for (const auto& s : plan.slices()) {
    owners.insert(s.worker_id());
    addresses.insert(s.peer_address());
  }
  EXPECT_EQ(owners, (std::set<std::string>{id1, id2}));
  EXPECT_EQ(addresses, (std::set<std::string>{PeerAddress(1), PeerAddress(2)}));
}

TEST_F(CoordinatorRpcTest, TwoWorkersRunTwoRoundsToTheEnd) {
  TestWorker* w1 = AddWorker(1);
  TestWorker* w2 = AddWorker(2);
  ASSERT_FALSE(w1->id.empty());
  ASSERT_FALSE(w2->id.empty());
  EXPECT_NE(w1->id, w2->id);

  // Join returns the run's identity and configuration.
  {
    v1::JoinRequest request;
    request.set_peer_address(PeerAddress(1));
    request.set_previous_worker_id(w1->id);
    auto again = w1->client->Join(request);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->worker_id(), w1->id) << "re-join keeps the id";
    EXPECT_EQ(again->run_id(), "run-integration");
    EXPECT_EQ(again->next_round(), 1u);
    EXPECT_EQ(again->model_round(), 0u);
    EXPECT_EQ(again->config().model().name(), "mlp");
    EXPECT_EQ(again->config().sync().min_participants(), 2u);
    EXPECT_EQ(again->config().sync().rounds(), 2u);
    EXPECT_EQ(again->config().training().seed(), 42u);
    EXPECT_EQ(again->config().timeouts().heartbeat_interval_ms(), 20u);
  }

  OpenSession(w1);
  OpenSession(w2);

  auto r1 = w1->client->JoinRound(w1->id, 1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(*r1, 1u);
  {
    auto status = GetRunStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->phase(), v1::WAITING_FOR_MEMBERS) << "1 of 2 participants";
  }
  auto r2 = w2->client->JoinRound(w2->id, 1);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(*r2, 1u);

  uint64_t list_version = 0;
  for (uint64_t round = 1; round <= 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    ASSERT_TRUE(WaitUntil(
        [&] {
          return w1->log.Has(CoordinatorMessage::kRoundStart, round) &&
                 w2->log.Has(CoordinatorMessage::kRoundStart, round);
        },
        kWait))
        << "RoundStart not pushed to both sessions";
    EXPECT_EQ(
        w1->log.Find(CoordinatorMessage::kRoundStart, round)->round_start().base_model_round(),
        round - 1);

    ReportReady(w1, round);
    ReportReady(w2, round);
    ASSERT_TRUE(WaitUntil(
        [&] {
          return w1->log.Has(CoordinatorMessage::kRoundPlan, round) &&
                 w2->log.Has(CoordinatorMessage::kRoundPlan, round);
        },
        kWait))
        << "RoundPlan not pushed to both sessions";
    const v1::RoundPlan plan = w1->log.Find(CoordinatorMessage::kRoundPlan, round)->round_plan();
    EXPECT_EQ(plan.SerializeAsString(),
              w2->log.Find(CoordinatorMessage::kRoundPlan, round)->round_plan().SerializeAsString())
        << "both participants get the same plan";
    EXPECT_EQ(plan.total_elements(), kTotal);
    EXPECT_EQ(plan.attempt(), 1u);
    EXPECT_NE(plan.participants_version(), 0u);
    if (round > 1) {
      // The same participants: the list is not sent again, only its version.
      EXPECT_EQ(plan.slices_size(), 0);
      EXPECT_EQ(plan.participants_version(), list_version);
    } else {
      list_version = plan.participants_version();
      ExpectFullPlan(plan, w1->id, w2->id);
    }

    // Both reached their peers: sharing starts.
    ConnectionsReady(w1, round, plan.attempt());
    ConnectionsReady(w2, round, plan.attempt());
    ASSERT_TRUE(WaitUntil(
        [&] {
          return w1->log.Has(CoordinatorMessage::kStartSharing, round) &&
                 w2->log.Has(CoordinatorMessage::kStartSharing, round);
        },
        kWait))
        << "StartWeightSharing not pushed to both sessions";
    EXPECT_EQ(w1->log.Find(CoordinatorMessage::kStartSharing, round)->start_sharing().attempt(),
              plan.attempt());

    const std::string hash = Hash(round == 1 ? 'a' : 'b');
    ReportDone(w1, round, hash);
    ReportDone(w2, round, hash);
    ASSERT_TRUE(WaitUntil(
        [&] {
          return w1->log.Has(CoordinatorMessage::kRoundComplete, round) &&
                 w2->log.Has(CoordinatorMessage::kRoundComplete, round);
        },
        kWait))
        << "RoundComplete not pushed to both sessions";
    EXPECT_EQ(
        w2->log.Find(CoordinatorMessage::kRoundComplete, round)->round_complete().model_hash(),
        hash);
  }

  ASSERT_TRUE(WaitUntil(
      [&] {
        return w1->log.Has(CoordinatorMessage::kRunFinished, 2) &&
               w2->log.Has(CoordinatorMessage::kRunFinished, 2);
      },
      kWait))
      << "RunFinished not pushed to both sessions";
  EXPECT_EQ(w1->log.Count(CoordinatorMessage::kRoundAborted), 0);
  EXPECT_EQ(w1->log.Count(CoordinatorMessage::kRoundStart), 2);
  EXPECT_EQ(w2->log.Count(CoordinatorMessage::kRoundStart), 2);

  auto status = GetRunStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->phase(), v1::FINISHED);
  EXPECT_EQ(status->last_completed_round(), 2u);
  EXPECT_EQ(status->model_hash(), Hash('b'));
  EXPECT_EQ(status->recent_rounds_size(), 2);
  for (const TestWorker* w : {w1, w2}) {
    auto ws = FindWorker(*status, w->id);
    ASSERT_TRUE(ws.has_value()) << w->id;
    EXPECT_EQ(ws->model_hash(), Hash('b')) << w->id;
    EXPECT_EQ(ws->model_round(), 2u) << w->id;
    EXPECT_EQ(ws->rounds_completed(), 2u) << w->id;
  }

  // A finished run takes no new members.
  EXPECT_EQ(JoinCode(PeerAddress(9)), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorRpcTest, UnknownWorkerIdIsNotFound) {
  EXPECT_EQ(JoinRoundCode("w999", 1), grpc::StatusCode::NOT_FOUND);
  ExpectServing();
  EXPECT_EQ(ReportReadyCode("w999", 1), grpc::StatusCode::NOT_FOUND);
  ExpectServing();
  EXPECT_EQ(ReportDoneCode("w999", 1, Hash('a')), grpc::StatusCode::NOT_FOUND);
  ExpectServing();
  EXPECT_EQ(LeaveCode("w999"), grpc::StatusCode::NOT_FOUND);
  ExpectServing();
  EXPECT_EQ(ConnectionsReadyCode("w999", 1, 1), grpc::StatusCode::NOT_FOUND);
  ExpectServing();
}

TEST_F(CoordinatorRpcTest, StaleAndFutureRoundsAreFailedPrecondition) {
  TestWorker* w1 = AddWorker(1);
  ASSERT_FALSE(w1->id.empty());
  // The run is at round 1: 3 is beyond the next one. (JoinRound 0 means
  // "the earliest open round"; stale JoinRounds are covered by the unit
  // tests, where the run can be moved past round 1.)
  EXPECT_EQ(JoinRoundCode(w1->id, 0), grpc::StatusCode::OK);
  ExpectServing();
  EXPECT_EQ(JoinRoundCode(w1->id, 3), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectServing();
  EXPECT_EQ(ReportReadyCode(w1->id, 0), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectServing();
  EXPECT_EQ(ReportReadyCode(w1->id, 2), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectServing();
  EXPECT_EQ(ReportDoneCode(w1->id, 5, Hash('a')), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectServing();
}

TEST_F(CoordinatorRpcTest, BadPeerAddressIsInvalidArgument) {
  for (const std::string& address :
       {std::string(""), std::string("localhost"), std::string("127.0.0.1:0"),
        std::string("127.0.0.1:65536"), std::string("127.0.0.1:http"), std::string(":5000"),
        std::string(300, 'h') + ":5000"}) {
    EXPECT_EQ(JoinCode(address), grpc::StatusCode::INVALID_ARGUMENT) << "'" << address << "'";
    ExpectServing();
  }
  auto status = GetRunStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->members(), 0u);
}

TEST_F(CoordinatorRpcTest, MalformedHashIsInvalidArgument) {
  // Two workers without sessions get to SHARING, where the barrier's and the
  // hashes' arguments are checked.
  TestWorker* w1 = AddWorker(1);
  TestWorker* w2 = AddWorker(2);
  ASSERT_FALSE(w1->id.empty());
  ASSERT_FALSE(w2->id.empty());
  ASSERT_EQ(JoinRoundCode(w1->id, 1), grpc::StatusCode::OK);
  ASSERT_EQ(JoinRoundCode(w2->id, 1), grpc::StatusCode::OK);
  ASSERT_EQ(ReportReadyCode(w1->id, 1), grpc::StatusCode::OK);
  ASSERT_EQ(ReportReadyCode(w2->id, 1), grpc::StatusCode::OK);
  {
    auto status = GetRunStatus();
    ASSERT_TRUE(status.ok());
    ASSERT_EQ(status->phase(), v1::SHARING);
    ASSERT_EQ(status->attempt(), 1u);
  }
  EXPECT_EQ(ReportDoneCode(w1->id, 1, Hash('c')), grpc::StatusCode::FAILED_PRECONDITION)
      << "sharing has not started";
  ExpectServing();
  EXPECT_EQ(ConnectionsReadyCode(w1->id, 1, 2), grpc::StatusCode::FAILED_PRECONDITION)
      << "attempt 2 does not exist";
  ExpectServing();
  EXPECT_EQ(ConnectionsReadyCode(w1->id, 2, 1), grpc::StatusCode::FAILED_PRECONDITION)
      << "future round";
  ExpectServing();
  EXPECT_EQ(ConnectionsReadyCode(w1->id, 1, 1, {"w999"}), grpc::StatusCode::INVALID_ARGUMENT)
      << "unreachable names a non-participant";
  ExpectServing();
  ASSERT_EQ(ConnectionsReadyCode(w1->id, 1, 1), grpc::StatusCode::OK);
  ASSERT_EQ(ConnectionsReadyCode(w2->id, 1, 1), grpc::StatusCode::OK);

  std::string upper = Hash('a');
  upper[10] = 'A';
  std::string not_hex = Hash('a');
  not_hex[63] = 'g';
  for (const std::string& hash : {std::string(""), std::string(63, 'a'), std::string(65, 'a'),
                                  upper, not_hex, std::string("sha256:") + Hash('a')}) {
    EXPECT_EQ(ReportDoneCode(w1->id, 1, hash), grpc::StatusCode::INVALID_ARGUMENT)
        << "'" << hash << "'";
    ExpectServing();
  }
  // A good hash is still accepted afterwards.
  EXPECT_EQ(ReportDoneCode(w1->id, 1, Hash('c')), grpc::StatusCode::OK);
  EXPECT_EQ(ReportDoneCode(w2->id, 1, Hash('c')), grpc::StatusCode::OK);
  auto status = GetRunStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->last_completed_round(), 1u);
}

TEST_F(CoordinatorRpcTest, OversizedRequestIsResourceExhausted) {
  // A channel without Shoal's send limit, so that the server's limit is the
  // one that trips.
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
  auto ctx = Context();
  v1::JoinRequest request;
  request.set_peer_address(PeerAddress(1));
  request.set_name(std::string(9 << 20, 'x'));
  v1::JoinResponse response;
  grpc::Status s = stub->Join(ctx.get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  ExpectServing();
  auto status = GetRunStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->members(), 0u);

  // Shoal's own channels refuse to send it in the first place.
  auto ctx2 = Context();
  s = stub_->Join(ctx2.get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  ExpectServing();
}

TEST_F(CoordinatorRpcTest, SessionMustStartWithHelloOfAKnownWorker) {
  {
    auto session = OpenRawSession(kRpcTimeout);
    v1::WorkerMessage heartbeat;
    heartbeat.mutable_heartbeat()->set_sent_unix_ms(1);
    ASSERT_TRUE(session->stream->Write(heartbeat));
    grpc::Status s = session->Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  ExpectServing();
  {
    auto session = OpenRawSession(kRpcTimeout);
    v1::WorkerMessage hello;
    hello.mutable_hello();  // no worker id
    ASSERT_TRUE(session->stream->Write(hello));
    grpc::Status s = session->Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  ExpectServing();
  {
    auto session = OpenRawSession(kRpcTimeout);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id("w999");
    ASSERT_TRUE(session->stream->Write(hello));
    grpc::Status s = session->Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  ExpectServing();
}

// Found by the two-hour soak (issue 30): a worker re-joining while its
// relay router fell back opened two sessions on one client at once; the
// second replaced the first without ending it, and the dropped session's
// running threads ended the process ("terminate called without an active
// exception"). Now the last one opened stays and the other is ended.
TEST_F(CoordinatorRpcTest, SessionsOpenedFromTwoThreadsAtOnceLeaveOneOpen) {
  TestWorker* w = AddWorker(1);
  SessionLog* log = &w->log;
  auto open_many = [&] {
    for (int i = 0; i < 40; ++i) {
      absl::Status s = w->client->OpenSession(
          w->id, kHeartbeat, [log](const CoordinatorMessage& m) { log->Add(m); },
          [log](const absl::Status& st) { log->Closed(st); });
      EXPECT_TRUE(s.ok()) << s;
    }
  };
  std::thread other(open_many);
  open_many();
  other.join();
  // (The coordinator drops a member whose session is cancelled, so the later
  // sessions end NOT_FOUND: what counts is that the process is still here.)
  w->client->CloseSession();
  EXPECT_FALSE(w->client->SendHeartbeatNow(absl::Seconds(1)));
  ExpectServing();
}

TEST_F(CoordinatorRpcTest, CancelledSessionDuringTrainingRemovesTheWorker) {
  TestWorker* w1 = AddWorker(1);
  TestWorker* w2 = AddWorker(2);
  ASSERT_FALSE(w1->id.empty());
  ASSERT_FALSE(w2->id.empty());
  OpenSession(w1);
  OpenSession(w2);
  ASSERT_TRUE(w1->client->JoinRound(w1->id, 1).ok());
  ASSERT_TRUE(w2->client->JoinRound(w2->id, 1).ok());
  ASSERT_TRUE(WaitUntil([&] { return w2->log.Has(CoordinatorMessage::kRoundStart, 1); }, kWait));
  {
    auto status = GetRunStatus();
    ASSERT_TRUE(status.ok());
    ASSERT_EQ(status->phase(), v1::TRAINING);
  }

  // w2's process "crashes": its stream is cancelled.
  w2->client->CloseSession();
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto status = GetRunStatus();
        if (!status.ok()) return false;
        auto w = FindWorker(*status, w2->id);
        return w.has_value() && w->state() == "lost";  // a crash, not a Leave
      },
      kWait))
      << "the cancelled session did not remove " << w2->id;
  auto status = GetRunStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->phase(), v1::TRAINING) << "the round goes on without it";
  EXPECT_THAT(status->participants(), ::testing::ElementsAre(w1->id));
  EXPECT_EQ(status->members(), 1u);
  EXPECT_EQ(ReportReadyCode(w2->id, 1), grpc::StatusCode::NOT_FOUND);

  // The round continues with w1 alone.
  ReportReady(w1, 1);
  ASSERT_TRUE(WaitUntil([&] { return w1->log.Has(CoordinatorMessage::kRoundPlan, 1); }, kWait));
  const v1::RoundPlan plan = w1->log.Find(CoordinatorMessage::kRoundPlan, 1)->round_plan();
  ASSERT_EQ(plan.slices_size(), 1);
  EXPECT_EQ(plan.slices(0).worker_id(), w1->id);
  EXPECT_EQ(plan.slices(0).begin(), 0u);
  EXPECT_EQ(plan.slices(0).end(), kTotal);
  ConnectionsReady(w1, 1, plan.attempt());
  ASSERT_TRUE(WaitUntil([&] { return w1->log.Has(CoordinatorMessage::kStartSharing, 1); }, kWait));
  ReportDone(w1, 1, Hash('d'));
  ASSERT_TRUE(WaitUntil([&] { return w1->log.Has(CoordinatorMessage::kRoundComplete, 1); }, kWait));
  status = GetRunStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->last_completed_round(), 1u);
  EXPECT_EQ(status->phase(), v1::WAITING_FOR_MEMBERS) << "round 2 needs 2 participants";
  EXPECT_EQ(w1->log.Count(CoordinatorMessage::kRoundAborted), 0);
}

TEST_F(CoordinatorRpcTest, SilentSessionIsLostAfterTheLease) {
  // Taken before the Join: the lease runs from a moment after it, so
  // "not evicted before the lease" holds however slowly this thread runs
  // (a lower bound that load cannot break; no upper bound on time).
  const absl::Time start = absl::Now();
  auto ctx = Context();
  v1::JoinRequest request;
  request.set_peer_address(PeerAddress(1));
  v1::JoinResponse joined;
  ASSERT_TRUE(stub_->Join(ctx.get(), request, &joined).ok());
  const std::string id = joined.worker_id();

  // Hello, then nothing: a hung worker.
  auto session = OpenRawSession(kLease + kWait);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(id);
  ASSERT_TRUE(session->stream->Write(hello));

  std::optional<WorkerStatus> evicted;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto status = GetRunStatus();
        if (!status.ok()) return false;
        auto w = FindWorker(*status, id);
        // No heartbeat within the lease: lost (a hung or crashed worker).
        if (!w.has_value() || w->state() != "lost") return false;
        evicted = w;
        return true;
      },
      kLease + kWait))
      << id << " was not evicted";
  EXPECT_GE(absl::Now() - start, kLease - absl::Milliseconds(100)) << "evicted before the lease";
  EXPECT_THAT(evicted->reason(), HasSubstr("heartbeat"));

  // The coordinator closes the evicted worker's stream.
  grpc::Status s = session->Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(JoinRoundCode(id, 1), grpc::StatusCode::NOT_FOUND);
  ExpectServing();
}

TEST_F(CoordinatorRpcTest, HeartbeatingWorkerOutlivesTheLease) {
  TestWorker* w1 = AddWorker(1);
  ASSERT_FALSE(w1->id.empty());
  OpenSession(w1);
  // Watch it for longer than the lease: it must stay active throughout. The
  // poll ends early only if it was removed.
  const absl::Time until = absl::Now() + kLease + absl::Milliseconds(500);
  bool removed = false;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto status = GetRunStatus();
        auto w = status.ok() ? FindWorker(*status, w1->id) : std::nullopt;
        removed = !w.has_value() || DepartedState(w->state());
        return removed || absl::Now() >= until;
      },
      kWait));
  EXPECT_FALSE(removed) << w1->id << " was removed while heartbeating";
  auto status = GetRunStatus();
  ASSERT_TRUE(status.ok());
  auto w = FindWorker(*status, w1->id);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->state(), "waiting");
  EXPECT_FALSE(w1->log.closed().has_value());
}

TEST_F(CoordinatorRpcTest, HealthCheckReportsServing) {
  // No generated health client here: call the method generically. An empty
  // HealthCheckRequest asks about the whole server (service "").
  grpc::GenericStub stub(MakeChannel(server_->address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kRpcTimeout));
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status s = done.get_future().get();
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& slice : slices)
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  // HealthCheckResponse{status: SERVING}: field 1, varint, value 1.
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

}  // namespace
// A worker may call JoinRound before the coordinator has processed its
// session's Hello: the RoundStart must still reach it (it is held until the
// session registers), not be dropped.
TEST_F(CoordinatorRpcTest, RoundStartReachesAWorkerWhoseSessionIsStillRegistering) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    workers_.clear();
    TestWorker* a = AddWorker(100 + 2 * attempt);
    TestWorker* b = AddWorker(101 + 2 * attempt);
    for (TestWorker* w : {a, b}) {
      SessionLog* log = &w->log;
      ASSERT_TRUE(w->client
                      ->OpenSession(
                          w->id, kHeartbeat, [log](const CoordinatorMessage& m) { log->Add(m); },
                          [log](const absl::Status& st) { log->Closed(st); })
                      .ok());
      // No wait for a heartbeat here: JoinRound races the Hello.
      ASSERT_TRUE(w->client->JoinRound(w->id, 0).ok());
    }
    const uint64_t round = server_->engine().Status().round();
    for (TestWorker* w : {a, b}) {
      EXPECT_TRUE(WaitUntil([&] { return w->log.Has(CoordinatorMessage::kRoundStart, round); },
                            absl::Seconds(5)))
          << "attempt " << attempt << ": " << w->id << " never got RoundStart(" << round << ")";
    }
    if (HasFailure()) return;
    for (TestWorker* w : {a, b}) w->client->CloseSession();
    ASSERT_TRUE(
        WaitUntil([&] { return server_->engine().Status().members() == 0; }, absl::Seconds(5)));
  }
}

}  // namespace shoal
