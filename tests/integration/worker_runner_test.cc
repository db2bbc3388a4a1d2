// The worker host with its runners, driven through a fake coordinator: the
// real Worker (Peer service on 127.0.0.1:0, Fashion-MNIST, the Torch
// trainer, ModelMemory) gets its CoordinatorClient from the test
// (WorkerOptions::coordinator_client), which plays the coordinator's part:
// it answers the join, delivers directives on the session as its reader
// thread would, and reads the heartbeats. Covers the gossip runner's end of
// a run (with and without the final average, the consensus evaluation) and
// a synchronous round through the same host. Every wait is for a state,
// with a deadline.
#include <grpc/grpc.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/worker.h"
#include "tests/support/test_support.h"

namespace shoal::worker {
namespace {

using ::shoal::testing::WaitUntil;

[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

constexpr char kSelf[] = "w1";

// Plays the coordinator for one worker. Thread-safe: the worker's thread
// calls it, the test's thread delivers directives and reads what it got.
class ScriptedCoordinator : public CoordinatorClient {
 public:
  explicit ScriptedCoordinator(shoal::v1::JoinResponse joined) : joined_(std::move(joined)) {}

  absl::StatusOr<shoal::v1::JoinResponse> Join(const shoal::v1::JoinRequest&) override {
    absl::MutexLock lock(&mu_);
    ++joins_;
    return joined_;
  }
  absl::StatusOr<uint64_t> JoinRound(const std::string&, uint64_t round, uint64_t) override {
    absl::MutexLock lock(&mu_);
    ++join_rounds_;
    return round;
  }
  absl::Status ReportReady(const shoal::v1::ReportReadyRequest& r) override {
    absl::MutexLock lock(&mu_);
    ready_.push_back(r);
    return absl::OkStatus();
  }
  absl::Status ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& r) override {
    absl::MutexLock lock(&mu_);
    connections_ready_.push_back(r);
    return absl::OkStatus();
  }
  absl::Status ReportAudit(const shoal::v1::ReportAuditRequest&) override {
    return absl::OkStatus();
  }
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& r) override {
    absl::MutexLock lock(&mu_);
    checkpoints_.push_back(r);
    return absl::OkStatus();
  }
  absl::Status ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& r) override {
    absl::MutexLock lock(&mu_);
    done_.push_back(r);
    return absl::OkStatus();
  }
  absl::Status Leave(const std::string&, const std::string& reason) override {
    absl::MutexLock lock(&mu_);
    leaves_.push_back(reason);
    return absl::OkStatus();
  }
  absl::Status OpenSession(const std::string&, absl::Duration, MessageHandler on_message,
                           ClosedHandler on_closed, HeartbeatFiller fill) override {
    absl::MutexLock lock(&mu_);
    on_message_ = std::move(on_message);
    on_closed_ = std::move(on_closed);
    fill_ = std::move(fill);
    open_ = true;
    ++sessions_;
    return absl::OkStatus();
  }
  // As the gRPC client: closing a live session ends its stream, and its
  // reader reports the end (CANCELLED) before CloseSession returns.
  void CloseSession() override {
    ClosedHandler report;
    {
      absl::MutexLock lock(&mu_);
      if (open_) report = on_closed_;
      open_ = false;
    }
    if (report) report(absl::CancelledError("CANCELLED"));
  }
  // A session of this worker ends while another stays open (the relay's
  // router: the coordinator superseded the direct session with the relayed
  // one).
  void EndOneOfTwo(const absl::Status& why) {
    ClosedHandler report;
    {
      absl::MutexLock lock(&mu_);
      report = on_closed_;
    }
    ASSERT_TRUE(report != nullptr);
    report(why);
  }
  int joins() {
    absl::MutexLock lock(&mu_);
    return joins_;
  }
  bool SendHeartbeatNow(absl::Duration) override {
    shoal::v1::Heartbeat hb = Heartbeat();
    absl::MutexLock lock(&mu_);
    flushed_.push_back(hb);
    return true;
  }

  // A directive on the session, as its reader thread delivers it.
  void Deliver(const shoal::v1::CoordinatorMessage& m) {
    MessageHandler handler;
    {
      absl::MutexLock lock(&mu_);
      handler = on_message_;
    }
    ASSERT_TRUE(handler != nullptr);
    handler(m);
  }
  // What a heartbeat written now would carry.
  shoal::v1::Heartbeat Heartbeat() {
    HeartbeatFiller fill;
    {
      absl::MutexLock lock(&mu_);
      fill = fill_;
    }
    shoal::v1::Heartbeat hb;
    if (fill) fill(&hb);
    return hb;
  }
  bool session_open() {
    absl::MutexLock lock(&mu_);
    return open_;
  }
  std::vector<std::string> leaves() {
    absl::MutexLock lock(&mu_);
    return leaves_;
  }
  std::vector<shoal::v1::Heartbeat> flushed() {
    absl::MutexLock lock(&mu_);
    return flushed_;
  }
  std::vector<shoal::v1::ReportReadyRequest> ready() {
    absl::MutexLock lock(&mu_);
    return ready_;
  }
  std::vector<shoal::v1::ConnectionsReadyRequest> connections_ready() {
    absl::MutexLock lock(&mu_);
    return connections_ready_;
  }
  std::vector<shoal::v1::ReportRoundDoneRequest> done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  int sessions() {
    absl::MutexLock lock(&mu_);
    return sessions_;
  }

 private:
  absl::Mutex mu_;
  const shoal::v1::JoinResponse joined_;
  int joins_ ABSL_GUARDED_BY(mu_) = 0;
  int join_rounds_ ABSL_GUARDED_BY(mu_) = 0;
  int sessions_ ABSL_GUARDED_BY(mu_) = 0;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  MessageHandler on_message_ ABSL_GUARDED_BY(mu_);
  ClosedHandler on_closed_ ABSL_GUARDED_BY(mu_);
  HeartbeatFiller fill_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> leaves_ ABSL_GUARDED_BY(mu_);
  std::vector<shoal::v1::Heartbeat> flushed_ ABSL_GUARDED_BY(mu_);
  std::vector<shoal::v1::ReportReadyRequest> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<shoal::v1::ConnectionsReadyRequest> connections_ready_ ABSL_GUARDED_BY(mu_);
  std::vector<shoal::v1::ReportRoundDoneRequest> done_ ABSL_GUARDED_BY(mu_);
  std::vector<shoal::v1::ReportCheckpointRequest> checkpoints_ ABSL_GUARDED_BY(mu_);
};

shoal::v1::RunConfig BaseConfig() {
  shoal::v1::RunConfig c;
  c.mutable_model()->set_name("mlp");
  c.mutable_training()->set_seed(3);
  c.mutable_training()->set_batch_size(32);
  c.mutable_training()->set_learning_rate(0.05);
  c.mutable_training()->set_momentum(0.9);
  c.mutable_training()->set_data_shards(4);
  c.mutable_timeouts()->set_heartbeat_interval_ms(200);
  return c;
}

shoal::v1::RunConfig GossipConfig(uint64_t steps, bool final_average) {
  shoal::v1::RunConfig c = BaseConfig();
  c.mutable_gossip();
  c.mutable_gossip()->set_every(5);
  c.mutable_training()->set_eval_every(1);
  c.mutable_gossip()->set_fetch_probability(1);
  c.mutable_gossip()->set_steps(steps);
  c.mutable_gossip()->set_final_average(final_average);
  c.mutable_timeouts()->set_round_timeout_ms(120000);
  return c;
}

shoal::v1::CoordinatorMessage PeersOfOne(const std::string& evaluator = "") {
  shoal::v1::CoordinatorMessage m;
  m.mutable_peer_update()->set_version(1);
  auto* p = m.mutable_peer_update()->add_peers();
  p->set_worker_id(kSelf);
  m.mutable_peer_update()->set_consensus_evaluator(evaluator);
  return m;
}

// One worker with the scripted coordinator, running on a thread of its own.
class WorkerRunnerTest : public ::testing::Test {
 protected:
  void StartWorker(const shoal::v1::RunConfig& config) {
    shoal::v1::JoinResponse joined;
    joined.set_worker_id(kSelf);
    joined.set_run_id("run-1");
    *joined.mutable_config() = config;
    coordinator_ = std::make_shared<ScriptedCoordinator>(joined);
    WorkerOptions o;
    o.listen = "127.0.0.1:0";
    o.eval_limit = 200;
    o.coordinator_client = coordinator_;
    o.stop = &stop_;
    absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Start(o);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = std::move(*w);
    thread_ = std::thread([this] {
      absl::Status s = worker_->Run();
      absl::MutexLock lock(&mu_);
      result_ = s;
      finished_ = true;
    });
    ASSERT_TRUE(WaitUntil([&] { return coordinator_->sessions() == 1; }, absl::Seconds(120)));
  }
  void TearDown() override {
    stop_.Cancel();
    if (thread_.joinable()) thread_.join();
  }
  bool Finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  absl::Status Result() {
    absl::MutexLock lock(&mu_);
    return result_;
  }
  // Waits until the worker's heartbeats satisfy `ready`.
  shoal::v1::Heartbeat WaitForHeartbeat(
      const std::function<bool(const shoal::v1::Heartbeat&)>& ready) {
    shoal::v1::Heartbeat hb;
    EXPECT_TRUE(WaitUntil(
        [&] {
          hb = coordinator_->Heartbeat();
          return ready(hb);
        },
        absl::Seconds(120)))
        << hb.DebugString();
    return hb;
  }

  CancellationToken stop_;
  std::shared_ptr<ScriptedCoordinator> coordinator_;
  std::unique_ptr<Worker> worker_;
  std::thread thread_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status result_ ABSL_GUARDED_BY(mu_);
};

TEST_F(WorkerRunnerTest, GossipWithoutTheFinalAverageFlushesItsFiguresAndLeaves) {
  StartWorker(GossipConfig(20, /*final_average=*/false));
  coordinator_->Deliver(PeersOfOne());
  ASSERT_TRUE(WaitUntil([&] { return Finished(); }, absl::Seconds(120)));
  EXPECT_TRUE(Result().ok()) << Result();
  EXPECT_EQ(coordinator_->leaves(), std::vector<std::string>{"finished 20 gossip steps"});
  // The last heartbeat was written (not slept for) before leaving.
  const std::vector<shoal::v1::Heartbeat> flushed = coordinator_->flushed();
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_TRUE(flushed[0].gossip());
  EXPECT_EQ(flushed[0].gossip_steps(), 20u);
  EXPECT_DOUBLE_EQ(flushed[0].gossip_clock(), 20 * 32);
  EXPECT_GT(flushed[0].test_accuracy(), 0.0);
  EXPECT_EQ(flushed[0].projection_size(), 32);
  EXPECT_FALSE(coordinator_->session_open());
}

TEST_F(WorkerRunnerTest, GossipFinalAverageWaitsForTheListReportsAndEndsWithTheRun) {
  shoal::v1::RunConfig config = GossipConfig(10, /*final_average=*/true);
  config.mutable_gossip()->set_consensus_eval_every(1);
  StartWorker(config);
  // This worker evaluates the consensus (of itself: no other peer).
  coordinator_->Deliver(PeersOfOne(/*evaluator=*/kSelf));
  const shoal::v1::Heartbeat done =
      WaitForHeartbeat([](const shoal::v1::Heartbeat& hb) { return hb.gossip_done(); });
  EXPECT_EQ(done.gossip_steps(), 10u);
  EXPECT_EQ(done.consensus_models(), 1u);
  // The consensus of one model is that model: the same figures as its own
  // evaluation at that publication.
  EXPECT_GT(done.consensus_accuracy(), 0.0);
  EXPECT_FALSE(Finished());  // it waits for the list

  shoal::v1::CoordinatorMessage final_list;
  auto* source = final_list.mutable_gossip_final()->add_sources();
  source->set_worker_id(kSelf);
  source->set_peer_address(worker_->address());
  coordinator_->Deliver(final_list);
  const shoal::v1::Heartbeat averaged =
      WaitForHeartbeat([](const shoal::v1::Heartbeat& hb) { return !hb.final_hash().empty(); });
  EXPECT_EQ(averaged.final_models(), 1u);
  EXPECT_TRUE(averaged.final_error().empty()) << averaged.final_error();
  EXPECT_EQ(averaged.final_hash().size(), 64u);
  EXPECT_FALSE(Finished());  // it serves its final model until the run ends

  shoal::v1::CoordinatorMessage finished;
  finished.mutable_run_finished()->set_reason("hashes agree");
  coordinator_->Deliver(finished);
  ASSERT_TRUE(WaitUntil([&] { return Finished(); }, absl::Seconds(60)));
  EXPECT_TRUE(Result().ok()) << Result();
  EXPECT_TRUE(coordinator_->leaves().empty());
}

TEST_F(WorkerRunnerTest, GossipStopLeaves) {
  StartWorker(GossipConfig(0, false));  // trains until stopped
  coordinator_->Deliver(PeersOfOne());
  WaitForHeartbeat([](const shoal::v1::Heartbeat& hb) { return hb.gossip_steps() >= 10; });
  stop_.Cancel();
  ASSERT_TRUE(WaitUntil([&] { return Finished(); }, absl::Seconds(60)));
  EXPECT_TRUE(Result().ok()) << Result();
  EXPECT_EQ(coordinator_->leaves(), std::vector<std::string>{"worker shut down"});
}

TEST_F(WorkerRunnerTest, ASynchronousRoundThroughTheSameHost) {
  shoal::v1::RunConfig config = BaseConfig();
  config.mutable_training()->set_local_steps(3);
  config.mutable_sync()->set_rounds(1);
  config.mutable_training()->set_eval_every(1);
  StartWorker(config);
  shoal::v1::CoordinatorMessage start;
  start.mutable_round_start()->set_round(1);
  coordinator_->Deliver(start);
  ASSERT_TRUE(WaitUntil([&] { return coordinator_->ready().size() == 1; }, absl::Seconds(60)));
  const uint64_t n = coordinator_->ready()[0].total_elements();
  ASSERT_GT(n, 0u);
  // A plan of one participant: nobody to probe, its own slice to average.
  shoal::v1::CoordinatorMessage plan;
  plan.mutable_round_plan()->set_round(1);
  plan.mutable_round_plan()->set_attempt(1);
  plan.mutable_round_plan()->set_total_elements(n);
  plan.mutable_round_plan()->set_participants_version(1);
  auto* slice = plan.mutable_round_plan()->add_slices();
  slice->set_worker_id(kSelf);
  slice->set_peer_address(worker_->address());
  slice->set_begin(0);
  slice->set_end(n);
  coordinator_->Deliver(plan);
  ASSERT_TRUE(
      WaitUntil([&] { return coordinator_->connections_ready().size() == 1; }, absl::Seconds(60)));
  EXPECT_EQ(coordinator_->connections_ready()[0].unreachable_size(), 0);
  shoal::v1::CoordinatorMessage sharing;
  sharing.mutable_start_sharing()->set_round(1);
  sharing.mutable_start_sharing()->set_attempt(1);
  coordinator_->Deliver(sharing);
  ASSERT_TRUE(WaitUntil([&] { return coordinator_->done().size() == 1; }, absl::Seconds(60)));
  const shoal::v1::ReportRoundDoneRequest done = coordinator_->done()[0];
  EXPECT_EQ(done.round(), 1u);
  EXPECT_EQ(done.model_hash().size(), 64u);
  EXPECT_TRUE(done.metrics().evaluated());
  shoal::v1::CoordinatorMessage finished;
  finished.mutable_run_finished()->set_last_round(1);
  coordinator_->Deliver(finished);
  ASSERT_TRUE(WaitUntil([&] { return Finished(); }, absl::Seconds(60)));
  EXPECT_TRUE(Result().ok()) << Result();
}

// Found by the soak (issue 30): one session of a worker ended while another
// was still open (the relay's router), and the worker re-joined. Closing the
// live session for the re-join reported its end too; that report, handled
// after the re-join, started another re-join, which closed the next live
// session: a re-join every few ms, with a new worker id each time, for the
// whole run (100,000 joins in 55 minutes, the run record rewritten with
// each). The end of a session the worker closed itself is not a lost
// session: one re-join, then the worker trains.
TEST_F(WorkerRunnerTest, ASessionLostBesideALiveOneIsOneRejoinNotALoop) {
  shoal::v1::RunConfig config = BaseConfig();
  config.mutable_training()->set_local_steps(3);
  config.mutable_sync()->set_rounds(2);
  StartWorker(config);
  const int joins = coordinator_->joins();  // the first join and the model's declaration
  coordinator_->EndOneOfTwo(absl::AbortedError("superseded by a session through relay w1"));
  ASSERT_TRUE(WaitUntil([&] { return coordinator_->sessions() >= 2; }, absl::Seconds(60)));
  // The worker is back: it trains the round it is given and reports ready.
  shoal::v1::CoordinatorMessage start;
  start.mutable_round_start()->set_round(1);
  coordinator_->Deliver(start);
  ASSERT_TRUE(WaitUntil([&] { return coordinator_->ready().size() == 1; }, absl::Seconds(60)))
      << coordinator_->sessions() << " sessions";
  EXPECT_EQ(coordinator_->sessions(), 2);
  EXPECT_EQ(coordinator_->joins(), joins + 1);
  EXPECT_TRUE(coordinator_->session_open());
}

}  // namespace
}  // namespace shoal::worker
