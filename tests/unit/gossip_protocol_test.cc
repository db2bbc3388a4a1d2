// Gossip mode's protocol (services/worker/core/gossip_protocol.h), driven
// through its paths with a fake clock and a fake CoordinatorClient: late
// join (from a peer, from the run's checkpoint), a peer that stops
// answering and leaves, the checkpointer's hand-over, the consensus
// evaluation, the final average and its bounded waits, a lost session, a
// stop. The harness carries out actions the way the gossip runner does,
// minus the model and the network: it records each action, makes the calls
// to the fake coordinator, and feeds back the results the test chose.
#include "services/worker/core/gossip_protocol.h"

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fake_coordinator_client.h"

namespace shoal::worker {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kSelf[] = "w1";
constexpr uint64_t kElements = 1000;

shoal::v1::RunConfig Config() {
  shoal::v1::RunConfig c;
  c.mutable_gossip();
  c.mutable_model()->set_name("mlp");
  c.mutable_training()->set_seed(7);
  c.mutable_training()->set_batch_size(32);
  c.mutable_gossip()->set_every(5);
  c.mutable_training()->set_eval_every(2);
  c.mutable_gossip()->set_fetch_probability(1);
  c.mutable_gossip()->set_timeout_ms(3000);
  c.mutable_gossip()->set_interpolation("clock");
  c.mutable_timeouts()->set_heartbeat_interval_ms(500);
  c.mutable_timeouts()->set_round_timeout_ms(20000);
  return c;
}

shoal::v1::CoordinatorMessage Peers(const std::vector<std::string>& ids,
                                    const std::string& evaluator = "", uint64_t version = 1) {
  shoal::v1::CoordinatorMessage m;
  auto* u = m.mutable_peer_update();
  u->set_version(version);
  for (const std::string& id : ids) {
    auto* p = u->add_peers();
    p->set_worker_id(id);
    p->set_peer_address(absl::StrCat(id, ":7000"));
  }
  u->set_consensus_evaluator(evaluator);
  return m;
}

shoal::v1::CoordinatorMessage CheckpointRequest(uint64_t sequence) {
  shoal::v1::CoordinatorMessage m;
  m.mutable_checkpoint_request()->set_gossip(true);
  m.mutable_checkpoint_request()->set_round(sequence);
  m.mutable_checkpoint_request()->set_run_id("run-1");
  return m;
}

shoal::v1::CoordinatorMessage Final(const std::vector<std::string>& ids) {
  shoal::v1::CoordinatorMessage m;
  for (const std::string& id : ids) {
    auto* p = m.mutable_gossip_final()->add_sources();
    p->set_worker_id(id);
    p->set_peer_address(absl::StrCat(id, ":7000"));
  }
  return m;
}

shoal::v1::CoordinatorMessage Finished() {
  shoal::v1::CoordinatorMessage m;
  m.mutable_run_finished()->set_reason("done");
  return m;
}

GossipFetchOutcome Fetched(const std::string& peer, double clock, double loss = 0.4) {
  GossipFetchOutcome f;
  f.peer_id = peer;
  f.peer_clock = clock;
  f.peer_loss = loss;
  return f;
}

GossipFetchOutcome Failed(const std::string& peer, absl::Status status) {
  GossipFetchOutcome f;
  f.peer_id = peer;
  f.not_answering = absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status);
  f.status = std::move(status);
  return f;
}

// Carries out the protocol's actions as the gossip runner does, against
// fakes.
class Harness {
 public:
  explicit Harness(const shoal::v1::RunConfig& config = Config(), bool has_store = false,
                   const std::string& checkpoint_id = "")
      : protocol_(MakeOptions(&clock, has_store)) {
    coordinator.join_response.set_worker_id(kSelf);
    coordinator.join_response.set_run_id("run-1");
    *coordinator.join_response.mutable_config() = config;
    coordinator.join_response.set_checkpoint_id(checkpoint_id);
    Join();
  }

  // What the test makes the worker's own work return.
  std::deque<GossipFetchOutcome> fetch_now;          // kFetchNow, in order
  std::optional<GossipFetchOutcome> background;      // the next kCollect's fetch
  std::optional<GossipPushOutcome> push;             // the next kCollect's push
  std::optional<GossipUploadOutcome> upload_result;  // the next kCollect's upload
  GossipUploadOutcome upload_now_result;             // kUploadNow
  absl::Status checkpoint_load;
  double checkpoint_clock = 640;
  bool publish_ok = true;
  absl::Status final_result;
  uint32_t final_models = 3;
  double step_loss = 0.5;

  FakeClock clock;
  FakeCoordinatorClient coordinator;
  // Every action carried out, oldest first.
  std::vector<GossipAction> log;
  std::vector<shoal::v1::Heartbeat> reports;
  absl::Status exit;
  bool exited = false;

  GossipProtocol& protocol() { return protocol_; }

  void Join() {
    absl::StatusOr<shoal::v1::JoinResponse> r = coordinator.Join(protocol_.JoinRequest());
    ASSERT_TRUE(r.ok());
    Run(protocol_.OnJoined(*r));
  }
  std::vector<std::string> Start() { return Run(protocol_.Start(kElements)); }
  std::vector<std::string> Directive(const shoal::v1::CoordinatorMessage& m) {
    return Run(protocol_.OnDirective(m));
  }
  std::vector<std::string> Tick() { return Run(protocol_.OnTick()); }

  // Ticks (each tick trains one step) until `steps` local steps are done or
  // training ends.
  void TrainTo(uint64_t steps) {
    while (!exited && protocol_.steps() < steps &&
           protocol_.phase() == GossipProtocol::Phase::kTraining) {
      Tick();
    }
  }

  // Names of the actions since `from` (an index into log).
  std::vector<std::string> Since(size_t from) const {
    std::vector<std::string> names;
    for (size_t i = from; i < log.size(); ++i) names.push_back(GossipActionName(log[i].kind));
    return names;
  }
  std::vector<GossipAction> Of(GossipAction::Kind kind, size_t from = 0) const {
    std::vector<GossipAction> out;
    for (size_t i = from; i < log.size(); ++i) {
      if (log[i].kind == kind) out.push_back(log[i]);
    }
    return out;
  }

  std::vector<std::string> Run(GossipActions actions) {
    std::vector<std::string> done;
    std::deque<GossipAction> queue(actions.begin(), actions.end());
    while (!queue.empty()) {
      GossipAction a = queue.front();
      queue.pop_front();
      log.push_back(a);
      done.push_back(GossipActionName(a.kind));
      GossipActions next;
      switch (a.kind) {
        case GossipAction::kOpenSession:
          EXPECT_TRUE(
              coordinator.OpenSession(kSelf, absl::Seconds(1), nullptr, nullptr, nullptr).ok());
          EXPECT_TRUE(coordinator.JoinRound(kSelf, 0, 0).ok());
          break;
        case GossipAction::kRejoin: {
          coordinator.CloseSession();
          absl::StatusOr<shoal::v1::JoinResponse> r = coordinator.Join(protocol_.JoinRequest());
          if (r.ok()) next = protocol_.OnJoined(*r);
          break;
        }
        case GossipAction::kFetchNow: {
          GossipFetchOutcome f = fetch_now.empty()
                                     ? Failed(a.peer_id, absl::UnavailableError("no answer"))
                                     : fetch_now.front();
          if (!fetch_now.empty()) fetch_now.pop_front();
          f.peer_id = a.peer_id;
          next = protocol_.OnFetched(f);
          break;
        }
        case GossipAction::kLoadCheckpoint:
          next = protocol_.OnCheckpointLoaded(checkpoint_load, checkpoint_clock);
          break;
        case GossipAction::kTrainStep:
          next = protocol_.OnStepTrained(step_loss);
          break;
        case GossipAction::kCollect: {
          auto feed = [&](GossipActions more) {
            next.insert(next.end(), more.begin(), more.end());
          };
          if (background.has_value()) {
            feed(protocol_.OnFetched(*background));
            background.reset();
          }
          if (push.has_value()) {
            feed(protocol_.OnPushReceived(*push));
            push.reset();
          }
          if (upload_result.has_value()) {
            feed(protocol_.OnUploaded(*upload_result));
            upload_result.reset();
          }
          feed(protocol_.OnCollected());
          break;
        }
        case GossipAction::kEvaluate: {
          shoal::v1::Metrics m;
          m.set_evaluated(true);
          m.set_test_accuracy(0.8);
          m.set_test_loss(0.5);
          next = protocol_.OnEvaluated(m);
          break;
        }
        case GossipAction::kEvaluateConsensus: {
          shoal::v1::Metrics m;
          m.set_test_accuracy(0.85);
          next = protocol_.OnConsensusEvaluated(m, 1 + a.peers.size(), 100, absl::Seconds(1));
          break;
        }
        case GossipAction::kPublish:
          next = protocol_.OnPublished(
              publish_ok, a.project ? std::vector<float>(32, 0.5f) : std::vector<float>());
          break;
        case GossipAction::kDrainUpload:
          next = protocol_.OnUploadDrained(std::nullopt);
          break;
        case GossipAction::kUploadNow: {
          GossipUploadOutcome u = upload_now_result;
          u.sequence = a.upload.sequence;
          next = protocol_.OnUploaded(u);
          break;
        }
        case GossipAction::kRefuseCheckpoint: {
          shoal::v1::ReportCheckpointRequest refused;
          refused.set_worker_id(kSelf);
          refused.set_round(a.sequence);
          refused.set_error(a.reason);
          EXPECT_TRUE(coordinator.ReportCheckpoint(refused).ok());
          break;
        }
        case GossipAction::kFinalAverage:
          next = protocol_.OnFinalAveraged(final_result, final_models, "hash-of-the-average",
                                           absl::Seconds(2));
          break;
        case GossipAction::kReport:
          reports.push_back(a.report);
          break;
        case GossipAction::kFlushReport:
          reports.push_back(a.report);
          coordinator.SendHeartbeatNow(a.timeout);
          break;
        case GossipAction::kLeave:
          EXPECT_TRUE(coordinator.Leave(kSelf, a.reason).ok());
          coordinator.CloseSession();
          break;
        case GossipAction::kExit:
          coordinator.CloseSession();
          exit = a.status;
          exited = true;
          break;
        default:
          break;  // model actions: the log is what the tests check
      }
      queue.insert(queue.begin(), next.begin(), next.end());
    }
    return done;
  }

 private:
  static GossipProtocol::Options MakeOptions(const Clock* clock, bool has_store) {
    GossipProtocol::Options o;
    o.identity.advertise = "10.0.0.1:7000";
    o.identity.name = "test";
    o.has_store = has_store;
    o.clock = clock;
    return o;
  }
  GossipProtocol protocol_;
};

TEST(GossipProtocol, JoinsThenOpensTheSession) {
  Harness h;
  EXPECT_EQ(h.coordinator.sessions_opened, 1);
  EXPECT_EQ(h.protocol().worker_id(), kSelf);
  // A re-join names this worker and its data rank.
  const shoal::v1::JoinRequest again = h.protocol().JoinRequest();
  EXPECT_EQ(again.previous_worker_id(), kSelf);
  EXPECT_EQ(again.peer_address(), "10.0.0.1:7000");
}

TEST(GossipProtocol, LateJoinStartsFromATrainedPeersModel) {
  Harness h;
  EXPECT_THAT(h.Start(), IsEmpty());  // waits for the peer list
  h.fetch_now.push_back(Fetched("?", 12800, 0.3));
  const size_t before = h.log.size();
  h.Directive(Peers({kSelf, "w2", "w3"}));
  EXPECT_THAT(h.Since(before), ElementsAre("fetch-now", "adopt-fetched", "publish", "report"));
  EXPECT_DOUBLE_EQ(h.protocol().clock(), 12800);
  EXPECT_DOUBLE_EQ(h.protocol().last_loss(), 0.3);
  EXPECT_EQ(h.protocol().phase(), GossipProtocol::Phase::kTraining);
  EXPECT_EQ(h.protocol().peer_count(), 2u);  // itself excluded
  // The first publication carries the peer's clock.
  EXPECT_DOUBLE_EQ(h.Of(GossipAction::kPublish).back().clock, 12800);
}

TEST(GossipProtocol, LateJoinTriesThreePeersAndLowersTheScoreOfOneThatDoesNotAnswer) {
  Harness h;
  h.Start();
  // No answer from anyone: three attempts, then the initial model.
  const size_t before = h.log.size();
  h.Directive(Peers({"w2"}));
  EXPECT_THAT(h.Since(before),
              ElementsAre("fetch-now", "fetch-now", "fetch-now", "publish", "report"));
  EXPECT_LT(h.protocol().peer_score("w2"), 1.0);
  EXPECT_DOUBLE_EQ(h.protocol().clock(), 0);
}

TEST(GossipProtocol, LateJoinFromAnUntrainedPeerKeepsTheInitialModel) {
  Harness h;
  h.Start();
  h.fetch_now.push_back(Fetched("?", 0));
  const size_t before = h.log.size();
  h.Directive(Peers({"w2"}));
  EXPECT_THAT(h.Since(before), ElementsAre("fetch-now", "publish", "report"));
}

TEST(GossipProtocol, ResumedRunStartsFromTheCheckpointWhenNoPeerTrained) {
  Harness h(Config(), /*has_store=*/true, "run-1-r4");
  h.Start();
  h.fetch_now.push_back(Fetched("?", 0));  // the only peer has not trained yet
  const size_t before = h.log.size();
  h.Directive(Peers({"w2"}));
  EXPECT_THAT(h.Since(before), ElementsAre("fetch-now", "load-checkpoint", "publish", "report"));
  EXPECT_EQ(h.Of(GossipAction::kLoadCheckpoint).back().checkpoint_id, "run-1-r4");
  EXPECT_DOUBLE_EQ(h.protocol().clock(), 640);  // the checkpoint's
}

TEST(GossipProtocol, ResumedRunPrefersATrainedPeerToTheCheckpoint) {
  Harness h(Config(), /*has_store=*/true, "run-1-r4");
  h.Start();
  h.fetch_now.push_back(Fetched("?", 9000));
  h.Directive(Peers({"w2"}));
  EXPECT_THAT(h.Of(GossipAction::kLoadCheckpoint), IsEmpty());
  EXPECT_DOUBLE_EQ(h.protocol().clock(), 9000);
}

TEST(GossipProtocol, ACheckpointThatCannotBeLoadedMakesTheWorkerLeave) {
  Harness h(Config(), /*has_store=*/true, "run-1-r4");
  h.checkpoint_load = absl::DataLossError("the model hashes to abc");
  h.Start();
  h.clock.Advance(GossipProtocol::kPeerListWait);
  EXPECT_THAT(h.Tick(), ElementsAre("load-checkpoint", "leave", "exit"));
  EXPECT_EQ(h.exit.code(), absl::StatusCode::kDataLoss);
  ASSERT_EQ(h.coordinator.leaves.size(), 1u);
  EXPECT_THAT(h.coordinator.leaves[0], HasSubstr("cannot load checkpoint run-1-r4"));
}

TEST(GossipProtocol, WaitsForThePeerListAtMostTwoSeconds) {
  Harness h;
  h.Start();
  EXPECT_EQ(h.protocol().wake_at(), h.clock.Now() + GossipProtocol::kPeerListWait);
  h.clock.Advance(absl::Seconds(1));
  EXPECT_THAT(h.Tick(), IsEmpty());
  h.clock.Advance(absl::Seconds(1));
  EXPECT_THAT(h.Tick(), ElementsAre("publish", "report"));
  EXPECT_EQ(h.protocol().phase(), GossipProtocol::Phase::kTraining);
  // Training: the runner ticks at once.
  EXPECT_EQ(h.protocol().wake_at(), absl::InfinitePast());
}

TEST(GossipProtocol, PublishesEvaluatesAndFetchesOnItsSchedule) {
  Harness h;
  h.Start();
  h.Directive(Peers({"w2", "w3"}));  // nobody answers: the initial model
  size_t before = h.log.size();
  h.TrainTo(5);
  // gossip_every=5: the fifth step publishes and starts a fetch
  // (probability 1); eval_every=2: no evaluation at publication 1.
  EXPECT_THAT(h.Since(before),
              ElementsAre("train-step", "collect", "train-step", "collect", "train-step", "collect",
                          "train-step", "collect", "train-step", "collect", "publish", "report",
                          "start-fetch"));
  EXPECT_TRUE(h.protocol().fetch_in_flight());
  EXPECT_DOUBLE_EQ(h.protocol().clock(), 5 * 32);
  EXPECT_DOUBLE_EQ(h.protocol().last_loss(), 0.5);
  const GossipAction fetch = h.Of(GossipAction::kStartFetch).back();
  EXPECT_THAT(fetch.peer_id, ::testing::AnyOf("w2", "w3"));
  EXPECT_EQ(fetch.address, fetch.peer_id + ":7000");
  EXPECT_EQ(fetch.timeout, absl::Seconds(3));

  // Its result comes back after a later step: interpolated from its base.
  GossipFetchOutcome r = Fetched(fetch.peer_id, 480, 0.2);
  r.has_base = true;
  r.base_clock = 160;
  r.base_loss = 0.5;
  h.background = r;
  before = h.log.size();
  h.TrainTo(6);
  EXPECT_THAT(h.Since(before), ElementsAre("train-step", "collect", "interpolate"));
  // clock: a = 480 / (160 + 480) = 0.75; 192 + 0.75 * (480 - 160).
  EXPECT_DOUBLE_EQ(h.Of(GossipAction::kInterpolate).back().factor, 0.75);
  EXPECT_DOUBLE_EQ(h.protocol().clock(), 192 + 0.75 * 320);
  EXPECT_FALSE(h.protocol().fetch_in_flight());
  EXPECT_EQ(h.protocol().report().fetches_done(), 1u);
  EXPECT_EQ(h.protocol().report().last_partner(), fetch.peer_id);

  // The second publication evaluates (eval_every=2) and fetches again.
  before = h.log.size();
  h.TrainTo(10);
  EXPECT_THAT(h.Since(before), Contains("evaluate"));
  EXPECT_EQ(h.Of(GossipAction::kStartFetch).size(), 2u);
}

TEST(GossipProtocol, FetchProbabilityZeroNeverFetches) {
  shoal::v1::RunConfig c = Config();
  c.mutable_gossip()->set_fetch_probability(0);
  Harness h(c);
  h.Start();
  h.Directive(Peers({"w2"}));
  h.TrainTo(50);
  EXPECT_THAT(h.Of(GossipAction::kStartFetch), IsEmpty());
}

TEST(GossipProtocol, LostPeerCostsOneFetchAndIsNeverChosenAfterTheUpdate) {
  Harness h;
  h.Start();
  h.Directive(Peers({"w2", "w3"}));
  h.TrainTo(5);
  const std::string partner = h.Of(GossipAction::kStartFetch).back().peer_id;
  // The partner was killed: its fetch times out, and its score drops.
  h.background = Failed(partner, absl::DeadlineExceededError("deadline"));
  h.TrainTo(6);
  EXPECT_EQ(h.protocol().report().fetches_timed_out(), 1u);
  EXPECT_LT(h.protocol().peer_score(partner), 1.0);
  EXPECT_THAT(h.Of(GossipAction::kInterpolate), IsEmpty());  // dropped whole
  // A corrupt transfer counts as failed, the peer keeps its score.
  h.TrainTo(10);
  const std::string second = h.Of(GossipAction::kStartFetch).back().peer_id;
  const double score = h.protocol().peer_score(second);
  h.background = Failed(second, absl::DataLossError("crc"));
  h.TrainTo(11);
  EXPECT_EQ(h.protocol().report().fetches_failed(), 1u);
  EXPECT_DOUBLE_EQ(h.protocol().peer_score(second), score);
  // The coordinator removes the partner: it is never chosen again.
  const std::string survivor = partner == "w2" ? "w3" : "w2";
  h.Directive(Peers({kSelf, survivor}, "", 2));
  EXPECT_EQ(h.protocol().peer_count(), 1u);
  const size_t before = h.log.size();
  h.TrainTo(100);
  for (const GossipAction& f : h.Of(GossipAction::kStartFetch, before)) {
    EXPECT_EQ(f.peer_id, survivor);
  }
}

TEST(GossipProtocol, APushedModelOfTheRightSizeIsMergedAgainstTheParameters) {
  Harness h;
  h.Start();
  h.Directive(Peers({"w2"}));
  h.TrainTo(3);
  GossipPushOutcome p;
  p.pusher = "w9";
  p.clock = 96;
  p.bytes = kElements * sizeof(float);
  h.push = p;
  h.TrainTo(4);
  ASSERT_EQ(h.Of(GossipAction::kInterpolatePush).size(), 1u);
  // clock interpolation: a = 96 / (128 + 96).
  EXPECT_DOUBLE_EQ(h.Of(GossipAction::kInterpolatePush).back().factor, 96.0 / (128 + 96));
  EXPECT_EQ(h.protocol().report().pushes_merged(), 1u);
  // Another size is dropped.
  p.bytes = 12;
  h.push = p;
  h.TrainTo(5);
  EXPECT_EQ(h.Of(GossipAction::kInterpolatePush).size(), 1u);
}

TEST(GossipProtocol, CheckpointerUploadsWhenDueAndStopsWhenItsReportIsRefused) {
  shoal::v1::RunConfig c = Config();
  c.mutable_gossip()->set_checkpoint_every(10);
  c.mutable_gossip()->set_fetch_probability(0);
  Harness h(c, /*has_store=*/true);
  h.Start();
  h.Directive(Peers({"w2"}));
  EXPECT_EQ(h.protocol().checkpoint_sequence(), 0u);
  h.Directive(CheckpointRequest(5));  // the coordinator hands the role over
  EXPECT_EQ(h.protocol().checkpoint_sequence(), 5u);
  EXPECT_EQ(h.protocol().checkpoint_due(), 10u);
  h.TrainTo(5);
  EXPECT_THAT(h.Of(GossipAction::kStartUpload), IsEmpty());  // not due yet
  h.TrainTo(10);
  ASSERT_EQ(h.Of(GossipAction::kStartUpload).size(), 1u);
  const GossipAction upload = h.Of(GossipAction::kStartUpload).back();
  EXPECT_EQ(upload.upload.sequence, 5u);
  EXPECT_EQ(upload.upload.steps, 10u);
  EXPECT_EQ(upload.upload.run_id, "run-1");
  EXPECT_TRUE(h.protocol().upload_in_flight());
  // It finishes and is accepted: the next sequence.
  GossipUploadOutcome done;
  done.sequence = 5;
  h.upload_result = done;
  h.TrainTo(11);
  EXPECT_EQ(h.protocol().checkpoint_sequence(), 6u);
  EXPECT_FALSE(h.protocol().upload_in_flight());
  h.TrainTo(20);
  ASSERT_EQ(h.Of(GossipAction::kStartUpload).size(), 2u);
  // Another worker is the checkpointer now: the report is refused.
  GossipUploadOutcome refused;
  refused.sequence = 6;
  refused.report = absl::FailedPreconditionError("w2 is the checkpointer");
  h.upload_result = refused;
  h.TrainTo(21);
  EXPECT_EQ(h.protocol().checkpoint_sequence(), 0u);
  h.TrainTo(60);
  EXPECT_EQ(h.Of(GossipAction::kStartUpload).size(), 2u);
}

TEST(GossipProtocol, WithoutAStoreTheCheckpointerRoleIsRefused) {
  Harness h;
  h.Start();
  EXPECT_THAT(h.Directive(CheckpointRequest(3)), ElementsAre("refuse-checkpoint"));
  ASSERT_EQ(h.coordinator.checkpoints.size(), 1u);
  EXPECT_EQ(h.coordinator.checkpoints[0].round(), 3u);
  EXPECT_THAT(h.coordinator.checkpoints[0].error(), HasSubstr("no checkpoint store"));
  EXPECT_EQ(h.protocol().checkpoint_sequence(), 0u);
}

TEST(GossipProtocol, ALostSessionRejoinsAndDropsTheCheckpointerRole) {
  Harness h(Config(), /*has_store=*/true);
  h.Start();
  h.Directive(Peers({"w2"}));
  h.Directive(CheckpointRequest(2));
  EXPECT_THAT(h.Run(h.protocol().OnSessionClosed(absl::UnavailableError("broken"))),
              ElementsAre("rejoin", "open-session"));
  EXPECT_EQ(h.protocol().checkpoint_sequence(), 0u);
  EXPECT_EQ(h.coordinator.joins.size(), 2u);
  EXPECT_EQ(h.coordinator.joins[1].previous_worker_id(), kSelf);
  EXPECT_EQ(h.protocol().phase(), GossipProtocol::Phase::kTraining);
}

TEST(GossipProtocol, ARejoinThatFindsAnotherConfigurationExits) {
  Harness h;
  h.Start();
  h.coordinator.join_response.mutable_config()->mutable_training()->set_learning_rate(0.5);
  h.Run(h.protocol().OnSessionClosed(absl::UnavailableError("broken")));
  EXPECT_TRUE(h.exited);
  EXPECT_EQ(h.exit.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GossipProtocol, OnlyTheNamedEvaluatorEvaluatesTheConsensus) {
  shoal::v1::RunConfig c = Config();
  c.mutable_gossip()->set_consensus_eval_every(1);
  c.mutable_gossip()->set_fetch_probability(0);
  Harness other(c);
  other.Start();
  other.Directive(Peers({kSelf, "w2", "w3"}, /*evaluator=*/"w2"));
  other.TrainTo(20);
  EXPECT_THAT(other.Of(GossipAction::kEvaluateConsensus), IsEmpty());

  Harness named(c);
  named.Start();
  named.Directive(Peers({kSelf, "w2", "w3"}, /*evaluator=*/kSelf));
  named.TrainTo(10);
  const std::vector<GossipAction> runs = named.Of(GossipAction::kEvaluateConsensus);
  ASSERT_EQ(runs.size(), 2u);  // every publication
  ASSERT_EQ(runs[0].peers.size(), 2u);
  EXPECT_EQ(runs[0].peers[0].worker_id(), "w2");
  EXPECT_EQ(runs[0].peers[1].worker_id(), "w3");
  EXPECT_EQ(named.protocol().report().consensus_models(), 3u);
  EXPECT_DOUBLE_EQ(named.protocol().report().consensus_clock(),
                   10 * 32 + 100);  // at step 10: own clock + the peers'
  // The role moves to another member: no more consensus evaluations here.
  named.Directive(Peers({kSelf, "w2", "w3"}, /*evaluator=*/"w3", 2));
  named.TrainTo(30);
  EXPECT_EQ(named.Of(GossipAction::kEvaluateConsensus).size(), 2u);
}

shoal::v1::RunConfig Steps(uint64_t steps, bool final_average) {
  shoal::v1::RunConfig c = Config();
  c.mutable_gossip()->set_steps(steps);
  c.mutable_gossip()->set_final_average(final_average);
  return c;
}

TEST(GossipProtocol, FinalAverageWaitsForTheListAveragesReportsAndWaitsForTheEnd) {
  Harness h(Steps(10, true));
  h.Start();
  h.Directive(Peers({"w2", "w3"}));
  h.TrainTo(10);
  ASSERT_TRUE(h.protocol().fetch_in_flight());  // started at step 10
  size_t before = h.log.size();
  h.Tick();
  // The fetch in flight is dropped; the final model is published and
  // served; the heartbeats say gossip_done.
  EXPECT_THAT(h.Since(before),
              ElementsAre("drop-fetch", "evaluate", "publish", "report", "report"));
  EXPECT_EQ(h.protocol().phase(), GossipProtocol::Phase::kAwaitingFinalList);
  EXPECT_TRUE(h.reports.back().gossip_done());
  EXPECT_EQ(h.protocol().wake_at(), h.clock.Now() + absl::Seconds(20));
  // The final publication computes the projection (whatever the period).
  EXPECT_TRUE(h.Of(GossipAction::kPublish).back().project);
  // A late background result is dropped.
  GossipFetchOutcome late = Fetched("w2", 1000);
  late.has_base = true;
  EXPECT_THAT(h.Run(h.protocol().OnFetched(late)), IsEmpty());
  EXPECT_THAT(h.Tick(), IsEmpty());  // still waiting

  before = h.log.size();
  h.Directive(Final({kSelf, "w2", "w3"}));
  EXPECT_THAT(h.Since(before), ElementsAre("final-average", "evaluate", "report"));
  const GossipAction average = h.Of(GossipAction::kFinalAverage).back();
  ASSERT_EQ(average.peers.size(), 3u);
  EXPECT_EQ(average.peers[0].worker_id(), kSelf);  // the list's order
  EXPECT_EQ(average.attempts, GossipProtocol::kFinalFetchAttempts);
  EXPECT_EQ(h.reports.back().final_hash(), "hash-of-the-average");
  EXPECT_EQ(h.reports.back().final_models(), 3u);
  EXPECT_EQ(h.protocol().phase(), GossipProtocol::Phase::kAwaitingEnd);

  EXPECT_THAT(h.Directive(Finished()), ElementsAre("exit"));
  EXPECT_TRUE(h.exited);
  EXPECT_TRUE(h.exit.ok());
  EXPECT_THAT(h.coordinator.leaves, IsEmpty());  // the run ended: no Leave
}

TEST(GossipProtocol, FinalAverageThatArrivedEarlyStartsAtOnce) {
  Harness h(Steps(5, true));
  h.Start();
  h.Directive(Peers({"w2"}));
  h.Directive(Final({"w2", kSelf}));
  h.TrainTo(5);
  h.Tick();
  EXPECT_EQ(h.Of(GossipAction::kFinalAverage).size(), 1u);
}

TEST(GossipProtocol, FinalAverageLeavesWhenTheListDoesNotCome) {
  Harness h(Steps(5, true));
  h.Start();
  h.Directive(Peers({"w2"}));
  h.TrainTo(5);
  h.Tick();
  h.clock.Advance(absl::Seconds(19));
  EXPECT_THAT(h.Tick(), IsEmpty());
  h.clock.Advance(absl::Seconds(1));
  EXPECT_THAT(h.Tick(), ElementsAre("leave", "exit"));
  EXPECT_TRUE(h.exit.ok());
  ASSERT_EQ(h.coordinator.leaves.size(), 1u);
  EXPECT_EQ(h.coordinator.leaves[0],
            "finished 5 gossip steps (the final average's list did not come)");
}

TEST(GossipProtocol, FinalAverageLeavesWhenTheRunsEndDoesNotCome) {
  Harness h(Steps(5, true));
  h.Start();
  h.Directive(Peers({"w2"}));
  h.TrainTo(5);
  h.Tick();
  h.clock.Advance(absl::Seconds(5));
  h.Directive(Final({kSelf, "w2"}));
  // The end's wait starts when the average is done.
  h.clock.Advance(absl::Seconds(19));
  EXPECT_THAT(h.Tick(), IsEmpty());
  h.clock.Advance(absl::Seconds(1));
  EXPECT_THAT(h.Tick(), ElementsAre("leave", "exit"));
  EXPECT_EQ(h.coordinator.leaves.back(), "finished 5 gossip steps (the run's end did not come)");
}

TEST(GossipProtocol, AFailedFinalAverageIsReportedAndTheOwnModelKept) {
  Harness h(Steps(5, true), /*has_store=*/true);
  h.final_result = absl::DeadlineExceededError("w2 did not answer");
  h.Start();
  h.Directive(Peers({"w2"}));
  h.Directive(CheckpointRequest(3));
  h.TrainTo(5);
  h.Tick();
  const size_t before = h.log.size();
  h.Directive(Final({kSelf, "w2"}));
  // No evaluation of an average; the checkpointer uploads its own model.
  EXPECT_THAT(h.Since(before),
              ElementsAre("final-average", "report", "drain-upload", "upload-now"));
  EXPECT_EQ(h.reports.back().final_error(), "w2 did not answer");
  EXPECT_EQ(h.Of(GossipAction::kUploadNow).back().upload.copy, GossipAction::Copy::kLatest);
  EXPECT_EQ(h.protocol().phase(), GossipProtocol::Phase::kAwaitingEnd);
}

TEST(GossipProtocol, TheCheckpointerUploadsTheFinalAverage) {
  Harness h(Steps(5, true), /*has_store=*/true);
  h.Start();
  h.Directive(Peers({"w2"}));
  h.Directive(CheckpointRequest(3));
  h.TrainTo(5);
  h.Tick();
  h.Directive(Final({kSelf, "w2"}));
  const GossipAction upload = h.Of(GossipAction::kUploadNow).back();
  EXPECT_EQ(upload.upload.copy, GossipAction::Copy::kFinalAverage);
  EXPECT_EQ(upload.upload.sequence, 3u);
  EXPECT_EQ(h.protocol().checkpoint_sequence(), 4u);
}

TEST(GossipProtocol, WithoutTheFinalAverageOneHeartbeatCarriesTheFiguresThenItLeaves) {
  Harness h(Steps(5, false));
  h.Start();
  h.Directive(Peers({"w2"}));
  h.TrainTo(5);
  EXPECT_THAT(h.Tick(),
              ElementsAre("evaluate", "publish", "report", "flush-report", "leave", "exit"));
  EXPECT_EQ(h.coordinator.heartbeats_sent_now, 1);
  // At most 1.5 heartbeat periods (and 2 s).
  EXPECT_EQ(h.Of(GossipAction::kFlushReport).back().timeout, absl::Milliseconds(750));
  EXPECT_EQ(h.reports.back().gossip_steps(), 5u);
  EXPECT_EQ(h.coordinator.leaves.back(), "finished 5 gossip steps");
  EXPECT_TRUE(h.exit.ok());
}

TEST(GossipProtocol, StopLeavesFromAnyPhase) {
  Harness waiting;
  waiting.Start();
  EXPECT_THAT(waiting.Run(waiting.protocol().OnStopRequested()), ElementsAre("leave", "exit"));
  EXPECT_EQ(waiting.coordinator.leaves.back(), "worker shut down");

  Harness training;
  training.Start();
  training.Directive(Peers({"w2"}));
  training.TrainTo(3);
  EXPECT_THAT(training.Run(training.protocol().OnStopRequested()), ElementsAre("leave", "exit"));
  // Once done, nothing more happens.
  EXPECT_THAT(training.Run(training.protocol().OnStopRequested()), IsEmpty());
  EXPECT_THAT(training.Directive(Peers({"w2"})), IsEmpty());
}

TEST(GossipProtocol, AskedToLeaveLeavesWithFailedPrecondition) {
  Harness h;
  h.Start();
  shoal::v1::CoordinatorMessage m;
  m.mutable_leave_requested()->set_reason("evicted by the operator");
  EXPECT_THAT(h.Directive(m), ElementsAre("leave", "exit"));
  EXPECT_EQ(h.exit.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(h.exit.message()), HasSubstr("evicted by the operator"));
}

TEST(GossipProtocol, ABadConfigurationMakesTheWorkerLeave) {
  shoal::v1::RunConfig c = Config();
  c.mutable_gossip()->set_fetch_probability(2);
  Harness h(c);
  EXPECT_THAT(h.Start(), ElementsAre("leave", "exit"));
  EXPECT_EQ(h.exit.code(), absl::StatusCode::kInvalidArgument);
}

TEST(GossipProtocol, TheProjectionIsComputedAtMostOncePerHeartbeatPeriod) {
  shoal::v1::RunConfig c = Config();
  c.mutable_gossip()->set_fetch_probability(0);
  c.mutable_gossip()->set_every(1);
  Harness h(c);
  h.Start();
  h.Directive(Peers({"w2"}));
  h.TrainTo(10);  // the clock does not move: one projection (the first)
  int projected = 0;
  for (const GossipAction& p : h.Of(GossipAction::kPublish)) projected += p.project;
  EXPECT_EQ(projected, 1);
  h.clock.Advance(absl::Milliseconds(500));
  h.TrainTo(11);
  EXPECT_TRUE(h.Of(GossipAction::kPublish).back().project);
  EXPECT_EQ(h.reports.back().projection_size(), 32);
}

TEST(GossipProtocol, TheSameSeedChoosesTheSamePartners) {
  auto partners = [] {
    shoal::v1::RunConfig c = Config();
    c.mutable_gossip()->set_fetch_probability(0.5);
    Harness h(c);
    h.Start();
    h.Directive(Peers({"w2", "w3", "w4"}));
    std::vector<std::string> chosen;
    for (int i = 0; i < 20; ++i) {
      h.TrainTo((i + 1) * 5);
      if (h.protocol().fetch_in_flight()) {
        chosen.push_back(h.Of(GossipAction::kStartFetch).back().peer_id);
        GossipFetchOutcome r = Fetched(chosen.back(), 10);
        r.has_base = true;
        h.background = r;
      }
    }
    return chosen;
  };
  const std::vector<std::string> first = partners();
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(partners(), first);
}

}  // namespace
}  // namespace shoal::worker
