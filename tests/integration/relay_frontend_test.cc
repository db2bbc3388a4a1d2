// Integration tests of the supernode's relay frontend (services/worker/
// relay_frontend.h, docs/SUPERNODES.md "Relay"): a real coordinator and a
// real frontend on 127.0.0.1:0; members use the worker's real
// GrpcCoordinatorClient pointed at the frontend. Every RPC has a deadline;
// waiting is polling with a deadline.
#include "services/worker/relay_frontend.h"

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "services/coordinator/coordinator_server.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/routed_coordinator_client.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tests/support/coordinator_fixture.h"
#include "tests/support/tcp_proxy.h"
#include "tests/support/test_support.h"

namespace shoal {
namespace {

using ::shoal::coordinator::CoordinatorOptions;
using ::shoal::coordinator::CoordinatorServer;
using ::shoal::testing::WaitUntil;
using ::shoal::v1::CoordinatorMessage;
using ::shoal::worker::CoordinatorClientOptions;
using ::shoal::worker::GrpcCoordinatorClient;
using ::shoal::worker::RelayFrontend;
using ::shoal::worker::RelayFrontendOptions;
using ::shoal::worker::RoutedCoordinatorClient;

[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

constexpr absl::Duration kRpcTimeout = absl::Seconds(5);
constexpr absl::Duration kWait = absl::Seconds(10);
constexpr absl::Duration kHeartbeat = absl::Milliseconds(20);
constexpr uint64_t kTotal = 1000;

// A worker's view: the real client, what came down its session, how the
// session ended.
struct Member {
  mutable absl::Mutex mu;
  std::vector<CoordinatorMessage> log ABSL_GUARDED_BY(mu);
  std::optional<absl::Status> closed ABSL_GUARDED_BY(mu);
  std::string id;
  std::unique_ptr<worker::CoordinatorClient> client;

  bool Has(CoordinatorMessage::KindCase kind, uint64_t round) const {
    return Count(kind, round) > 0;
  }
  // How many directives of `kind` for `round` came down.
  int Count(CoordinatorMessage::KindCase kind, uint64_t round) const {
    absl::MutexLock lock(&mu);
    int n = 0;
    for (const CoordinatorMessage& m : log) {
      if (m.kind_case() == kind && testing::DirectiveRound(m) == round) ++n;
    }
    return n;
  }
  uint32_t Attempt(uint64_t round) const {
    absl::MutexLock lock(&mu);
    for (const CoordinatorMessage& m : log) {
      if (m.has_round_plan() && m.round_plan().round() == round) return m.round_plan().attempt();
    }
    return 0;
  }
  std::optional<absl::Status> Closed() const {
    absl::MutexLock lock(&mu);
    return closed;
  }
  // (Re)opens the session through `client`'s address.
  absl::Status Open(const std::string& address) {
    if (client != nullptr) client->CloseSession();
    {
      absl::MutexLock lock(&mu);
      closed.reset();
    }
    CoordinatorClientOptions options;
    options.address = address;
    options.rpc_timeout = kRpcTimeout;
    options.retry_window = kRpcTimeout;
    client = std::make_unique<GrpcCoordinatorClient>(options);
    return OpenOn(client.get());
  }
  // Opens the session with `c` (kept as this member's client).
  absl::Status OpenOn(worker::CoordinatorClient* c) {
    return c->OpenSession(
        id, kHeartbeat,
        [this](const CoordinatorMessage& m) {
          absl::MutexLock lock(&mu);
          log.push_back(m);
        },
        [this](const absl::Status& s) {
          absl::MutexLock lock(&mu);
          if (!closed.has_value()) closed = s;
        });
  }
  ~Member() {
    if (client != nullptr) client->CloseSession();
  }
};

class RelayFrontendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options = testing::TestCoordinatorOptions("run-relay-frontend");
    options.engine.config.mutable_timeouts()->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(kHeartbeat));
    options.engine.config.mutable_sync()->set_min_participants(3);
    options.engine.config.mutable_sync()->set_rounds(2);
    options.engine.heartbeat_lease = absl::Seconds(5);
    options.engine.session_grace = absl::Seconds(60);
    options.tick_interval = absl::Milliseconds(50);
    auto server = testing::StartTestCoordinator(options);
    ASSERT_TRUE(server.ok()) << server.status();
    coordinator_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    members_.clear();
    StopFrontend();
    if (coordinator_ != nullptr) coordinator_->Shutdown(absl::Seconds(1));
  }

  // The supernode's frontend on its own server at 127.0.0.1:0.
  void StartFrontend(const std::string& relay_id) {
    RelayFrontendOptions options;
    options.coordinator =
        grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials());
    options.call_timeout = kRpcTimeout;
    frontend_ = std::make_unique<RelayFrontend>(options);
    if (!relay_id.empty()) frontend_->SetRelayId(relay_id);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(frontend_.get());
    frontend_server_ = builder.BuildAndStart();
    ASSERT_NE(frontend_server_, nullptr);
    ASSERT_GT(port, 0);
    frontend_address_ = absl::StrCat("127.0.0.1:", port);
    frontend_port_ = port;
  }

  // The supernode dies: its server and its Relay stream go.
  void StopFrontend() {
    if (frontend_ != nullptr) frontend_->Shutdown();
    if (frontend_server_ != nullptr) {
      frontend_server_->Shutdown(DeadlineIn(absl::Seconds(1)));
      frontend_server_.reset();
    }
    frontend_.reset();
  }

  // Joins (always direct) and returns a member without a session yet.
  Member* Join(int n) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(kRpcTimeout));
    v1::JoinRequest request;
    request.set_peer_address(absl::StrCat("127.0.0.1:", 42000 + n));
    v1::JoinResponse response;
    grpc::Status s = stub_->Join(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    members_.push_back(std::make_unique<Member>());
    members_.back()->id = response.worker_id();
    return members_.back().get();
  }

  // Gives `m` the worker's routed client (direct until a UseRelay) and
  // opens its session; null when the open failed.
  RoutedCoordinatorClient* OpenRouted(Member* m) {
    CoordinatorClientOptions options;
    options.address = coordinator_->address();
    options.rpc_timeout = kRpcTimeout;
    options.retry_window = kRpcTimeout;
    auto routed = std::make_unique<RoutedCoordinatorClient>(options, /*credential=*/nullptr);
    RoutedCoordinatorClient* client = routed.get();
    m->client = std::move(routed);
    absl::Status s = m->OpenOn(client);
    EXPECT_TRUE(s.ok()) << s;
    return s.ok() ? client : nullptr;
  }

  bool AllHave(CoordinatorMessage::KindCase kind, uint64_t round) {
    return WaitUntil(
        [&] {
          for (const auto& m : members_) {
            if (!m->Has(kind, round)) return false;
          }
          return true;
        },
        kWait);
  }

  // One round from RoundStart to RoundComplete, every member through its
  // current client.
  void PlayRound(uint64_t round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    ASSERT_TRUE(AllHave(CoordinatorMessage::kRoundStart, round));
    for (const auto& m : members_) {
      v1::ReportReadyRequest q;
      q.set_worker_id(m->id);
      q.set_round(round);
      q.set_total_elements(kTotal);
      ASSERT_TRUE(m->client->ReportReady(q).ok()) << m->id;
    }
    ASSERT_TRUE(AllHave(CoordinatorMessage::kRoundPlan, round));
    for (const auto& m : members_) {
      v1::ConnectionsReadyRequest q;
      q.set_worker_id(m->id);
      q.set_round(round);
      q.set_attempt(m->Attempt(round));
      ASSERT_TRUE(m->client->ConnectionsReady(q).ok()) << m->id;
    }
    ASSERT_TRUE(AllHave(CoordinatorMessage::kStartSharing, round));
    for (const auto& m : members_) {
      v1::ReportRoundDoneRequest q;
      q.set_worker_id(m->id);
      q.set_round(round);
      q.set_model_hash(std::string(64, 'a'));
      q.set_exchange_seconds(0.01);
      ASSERT_TRUE(m->client->ReportRoundDone(q).ok()) << m->id;
    }
    ASSERT_TRUE(AllHave(CoordinatorMessage::kRoundComplete, round));
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<RelayFrontend> frontend_;
  std::unique_ptr<grpc::Server> frontend_server_;
  std::string frontend_address_;
  int frontend_port_ = 0;
  std::vector<std::unique_ptr<Member>> members_;
};

TEST_F(RelayFrontendTest, MembersCompleteRoundsThroughOneRelayStream) {
  Member* supernode = Join(1);
  Member* a = Join(2);
  Member* b = Join(3);
  ASSERT_TRUE(supernode->Open(coordinator_->address()).ok());  // its own session: direct
  StartFrontend(supernode->id);
  ASSERT_TRUE(a->Open(frontend_address_).ok());
  ASSERT_TRUE(b->Open(frontend_address_).ok());
  ASSERT_TRUE(WaitUntil([&] { return frontend_->members() == 2; }, kWait));
  for (const auto& m : members_) {
    auto admitted = m->client->JoinRound(m->id, 1);
    ASSERT_TRUE(admitted.ok()) << m->id << ": " << admitted.status();
    EXPECT_EQ(*admitted, 1u);
  }
  PlayRound(1);
  PlayRound(2);
  EXPECT_EQ(coordinator_->engine().last_completed_round(), 2u);
  // Both members, all their calls: one stream.
  EXPECT_EQ(frontend_->streams_opened(), 1u);
}

TEST_F(RelayFrontendTest, WhenTheSupernodeDiesItsMembersGoDirectAndTheRoundCompletes) {
  Member* supernode = Join(1);
  Member* a = Join(2);
  Member* b = Join(3);
  ASSERT_TRUE(supernode->Open(coordinator_->address()).ok());
  StartFrontend(supernode->id);
  ASSERT_TRUE(a->Open(frontend_address_).ok());
  ASSERT_TRUE(b->Open(frontend_address_).ok());
  ASSERT_TRUE(WaitUntil([&] { return frontend_->members() == 2; }, kWait));
  for (const auto& m : members_) ASSERT_TRUE(m->client->JoinRound(m->id, 1).ok());
  PlayRound(1);
  ASSERT_TRUE(AllHave(CoordinatorMessage::kRoundStart, 2));

  // The relay goes: the relayed sessions end with UNAVAILABLE...
  StopFrontend();
  for (Member* m : {a, b}) {
    ASSERT_TRUE(WaitUntil([&] { return m->Closed().has_value(); }, kWait)) << m->id;
    EXPECT_TRUE(absl::IsUnavailable(*m->Closed())) << *m->Closed();
  }
  // ...and the members, still in the run, open direct sessions (what the
  // worker does) and finish the round with the others.
  EXPECT_TRUE(coordinator_->engine().IsActive(a->id));
  ASSERT_TRUE(a->Open(coordinator_->address()).ok());
  ASSERT_TRUE(b->Open(coordinator_->address()).ok());
  PlayRound(2);
  EXPECT_EQ(coordinator_->engine().last_completed_round(), 2u);
}

TEST_F(RelayFrontendTest, CallsAreRefusedUntilTheRelayHasJoinedAndBadInputIsAnswered) {
  Member* a = Join(2);
  StartFrontend(/*relay_id=*/"");
  CoordinatorClientOptions options;
  options.address = frontend_address_;
  options.rpc_timeout = absl::Seconds(1);
  options.retry_window = absl::Milliseconds(300);
  GrpcCoordinatorClient client(options);
  // No relay id yet: UNAVAILABLE (retryable; the member may go direct).
  EXPECT_TRUE(absl::IsUnavailable(client.JoinRound(a->id, 1).status()));
  // Join is not relayed.
  v1::JoinRequest join;
  EXPECT_EQ(client.Join(join).status().code(), absl::StatusCode::kUnimplemented);
  frontend_->SetRelayId(Join(1)->id);
  // A call for nobody.
  v1::ReportReadyRequest nobody;
  EXPECT_EQ(client.ReportReady(nobody).code(), absl::StatusCode::kInvalidArgument);
  // A member whose session is not here: the coordinator's answer, passed on.
  v1::ReportReadyRequest elsewhere;
  elsewhere.set_worker_id(a->id);
  elsewhere.set_round(1);
  elsewhere.set_total_elements(kTotal);
  EXPECT_EQ(client.ReportReady(elsewhere).code(), absl::StatusCode::kPermissionDenied);
  // A session whose first message is not a Hello ends with INVALID_ARGUMENT.
  auto channel = grpc::CreateChannel(frontend_address_, grpc::InsecureChannelCredentials());
  auto stub = v1::Coordinator::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kRpcTimeout));
  auto stream = stub->Session(&ctx);
  v1::WorkerMessage heartbeat;
  heartbeat.mutable_heartbeat()->set_sent_unix_ms(1);
  stream->Write(heartbeat);
  stream->WritesDone();
  CoordinatorMessage ignored;
  while (stream->Read(&ignored)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The member's side: the worker's RoutedCoordinatorClient moves its session
// to the relay on UseRelay, makes its calls there, and goes back to a direct
// session by itself when the relay dies; the round completes.
TEST_F(RelayFrontendTest, RoutedClientMovesToTheRelayAndBackWhenItDies) {
  Member* supernode = Join(1);
  Member* a = Join(2);
  Member* b = Join(3);
  for (Member* m : {supernode, b}) ASSERT_TRUE(m->Open(coordinator_->address()).ok());
  StartFrontend(supernode->id);
  RoutedCoordinatorClient* client = OpenRouted(a);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->relay(), "");

  client->UseRelay(supernode->id, frontend_address_);
  ASSERT_TRUE(WaitUntil([&] { return frontend_->members() == 1; }, kWait));
  EXPECT_EQ(client->relay(), supernode->id);
  // The coordinator ended the superseded direct session; the worker did
  // not hear of it (no session end reported).
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(a->Closed().has_value()) << *a->Closed();
  v1::RunStatus status;
  ASSERT_TRUE(WaitUntil(
      [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(DeadlineIn(kRpcTimeout));
        if (!stub_->GetRunStatus(&ctx, v1::GetRunStatusRequest(), &status).ok()) return false;
        for (const auto& w : status.workers()) {
          if (w.id() == a->id) return w.relayed_by() == supernode->id;
        }
        return false;
      },
      kWait))
      << status.DebugString();
  for (const auto& m : members_) ASSERT_TRUE(m->client->JoinRound(m->id, 1).ok()) << m->id;
  PlayRound(1);
  ASSERT_TRUE(AllHave(CoordinatorMessage::kRoundStart, 2));

  // The supernode dies: the member goes direct by itself, and the round
  // completes.
  StopFrontend();
  ASSERT_TRUE(WaitUntil([&] { return client->relay().empty(); }, kWait));
  PlayRound(2);
  EXPECT_EQ(coordinator_->engine().last_completed_round(), 2u);
  EXPECT_FALSE(a->Closed().has_value()) << *a->Closed();
  // A relay that just failed is not tried again at once.
  client->UseRelay(supernode->id, frontend_address_);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(client->relay(), "");
}

// A relayed session that fails before the coordinator heard its Hello (here
// the supernode's frontend has not joined as a relay yet and refuses it)
// leaves the member on its direct session, which was never superseded:
// re-opening it would cancel it first, and the coordinator takes a
// cancelled session for a departure.
TEST_F(RelayFrontendTest, RoutedClientKeepsItsDirectSessionWhenTheRelayRefusesTheHello) {
  Member* supernode = Join(1);
  Member* a = Join(2);
  Member* b = Join(3);
  for (Member* m : {supernode, b}) ASSERT_TRUE(m->Open(coordinator_->address()).ok());
  StartFrontend(/*relay_id=*/"");
  RoutedCoordinatorClient* client = OpenRouted(a);
  ASSERT_NE(client, nullptr);

  client->UseRelay(supernode->id, frontend_address_);
  ASSERT_TRUE(WaitUntil([&] { return client->fall_backs() == 1; }, kWait));
  EXPECT_EQ(client->relay(), "");
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(a->Closed().has_value()) << *a->Closed();
  EXPECT_TRUE(coordinator_->engine().IsActive(a->id));
  // The kept session still carries the member's directives: a round
  // completes with it.
  for (const auto& m : members_) ASSERT_TRUE(m->client->JoinRound(m->id, 1).ok()) << m->id;
  PlayRound(1);
  EXPECT_EQ(coordinator_->engine().last_completed_round(), 1u);
  EXPECT_FALSE(a->Closed().has_value()) << *a->Closed();
}

// The supernode dies with a directive in flight: the coordinator sent the
// member's RoundPlan down the relay, and the link to the member had stalled
// (a proxy holds it back). The member's direct Hello says how many
// directives it took through the relay; the coordinator sends the plan
// again, once, and the round completes with the member.
TEST_F(RelayFrontendTest, ADirectiveLostWithTheSupernodeComesAgainOnTheDirectSession) {
  Member* supernode = Join(1);
  Member* a = Join(2);
  Member* b = Join(3);
  for (Member* m : {supernode, b}) ASSERT_TRUE(m->Open(coordinator_->address()).ok());
  StartFrontend(supernode->id);
  testing::TcpProxy link(frontend_port_);
  ASSERT_GT(link.port(), 0);
  RoutedCoordinatorClient* client = OpenRouted(a);
  ASSERT_NE(client, nullptr);
  client->UseRelay(supernode->id, link.address());
  ASSERT_TRUE(WaitUntil([&] { return frontend_->members() == 1; }, kWait));
  for (const auto& m : members_) ASSERT_TRUE(m->client->JoinRound(m->id, 1).ok()) << m->id;
  ASSERT_TRUE(AllHave(CoordinatorMessage::kRoundStart, 1));

  link.Freeze();
  // Directly (the member's relayed calls would stall with the link).
  for (const auto& m : members_) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(kRpcTimeout));
    v1::ReportReadyRequest q;
    q.set_worker_id(m->id);
    q.set_round(1);
    q.set_total_elements(kTotal);
    v1::ReportReadyResponse r;
    ASSERT_TRUE(stub_->ReportReady(&ctx, q, &r).ok()) << m->id;
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        return supernode->Has(CoordinatorMessage::kRoundPlan, 1) &&
               b->Has(CoordinatorMessage::kRoundPlan, 1);
      },
      kWait));
  absl::SleepFor(absl::Milliseconds(300));  // the relay forwards it into the stalled link
  EXPECT_FALSE(a->Has(CoordinatorMessage::kRoundPlan, 1));
  StopFrontend();
  link.Stop();
  ASSERT_TRUE(WaitUntil([&] { return client->relay().empty(); }, kWait));
  ASSERT_TRUE(AllHave(CoordinatorMessage::kRoundPlan, 1)) << "the plan the supernode lost";
  for (const auto& m : members_) {
    v1::ConnectionsReadyRequest q;
    q.set_worker_id(m->id);
    q.set_round(1);
    q.set_attempt(m->Attempt(1));
    ASSERT_TRUE(m->client->ConnectionsReady(q).ok()) << m->id;
  }
  ASSERT_TRUE(AllHave(CoordinatorMessage::kStartSharing, 1));
  for (const auto& m : members_) {
    v1::ReportRoundDoneRequest q;
    q.set_worker_id(m->id);
    q.set_round(1);
    q.set_model_hash(std::string(64, 'a'));
    q.set_exchange_seconds(0.01);
    ASSERT_TRUE(m->client->ReportRoundDone(q).ok()) << m->id;
  }
  ASSERT_TRUE(AllHave(CoordinatorMessage::kRoundComplete, 1));
  EXPECT_EQ(coordinator_->engine().last_completed_round(), 1u);
  EXPECT_EQ(a->Count(CoordinatorMessage::kRoundStart, 1), 1) << "nothing it took comes again";
  EXPECT_EQ(a->Count(CoordinatorMessage::kRoundPlan, 1), 1);
  EXPECT_FALSE(a->Closed().has_value()) << *a->Closed();
}

}  // namespace
}  // namespace shoal
