// The worker's round protocol (services/worker/core/worker_protocol.h),
// driven through every pending / commit / void path with a fake clock and a
// fake CoordinatorClient. The harness carries out actions the way
// services/worker/worker.cc does, minus the memory and the network: it
// records each action, sends reports to the fake coordinator, and feeds the
// results the test chose back into the protocol.
#include "services/worker/core/worker_protocol.h"

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fake_coordinator_client.h"

namespace shoal::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kSelf[] = "w1";
constexpr char kSelfAddress[] = "10.0.0.1:7000";

shoal::v1::RunConfig Config() {
  shoal::v1::RunConfig c;
  c.mutable_model()->set_name("mlp");
  c.mutable_training()->set_local_steps(10);
  c.mutable_sync()->set_rounds(100);
  c.mutable_training()->set_eval_every(5);
  return c;
}

shoal::v1::RoundPlan Plan(uint64_t round, uint32_t attempt, int participants) {
  shoal::v1::RoundPlan p;
  p.set_round(round);
  p.set_attempt(attempt);
  p.set_total_elements(300);
  p.set_participants_version(1000 + attempt);
  for (int k = 0; k < participants; ++k) {
    auto* s = p.add_slices();
    s->set_worker_id(absl::StrCat("w", k + 1));
    s->set_peer_address(absl::StrCat("10.0.0.", k + 1, ":7000"));
    s->set_begin(300 * k / participants);
    s->set_end(300 * (k + 1) / participants);
  }
  return p;
}

shoal::v1::CoordinatorMessage Start(uint64_t round, uint64_t base_round, std::string base_hash,
                                    std::vector<std::string> holders = {}) {
  shoal::v1::CoordinatorMessage m;
  auto* s = m.mutable_round_start();
  s->set_round(round);
  s->set_base_model_round(base_round);
  s->set_base_model_hash(std::move(base_hash));
  for (auto& h : holders) s->add_holders(h);
  return m;
}

shoal::v1::CoordinatorMessage PlanMsg(uint64_t round, uint32_t attempt, int participants = 3) {
  shoal::v1::CoordinatorMessage m;
  *m.mutable_round_plan() = Plan(round, attempt, participants);
  return m;
}

shoal::v1::CoordinatorMessage Sharing(uint64_t round, uint32_t attempt) {
  shoal::v1::CoordinatorMessage m;
  m.mutable_start_sharing()->set_round(round);
  m.mutable_start_sharing()->set_attempt(attempt);
  return m;
}

shoal::v1::CoordinatorMessage Complete(uint64_t round, std::string hash) {
  shoal::v1::CoordinatorMessage m;
  m.mutable_round_complete()->set_round(round);
  m.mutable_round_complete()->set_model_hash(std::move(hash));
  return m;
}

shoal::v1::CoordinatorMessage Aborted(uint64_t round) {
  shoal::v1::CoordinatorMessage m;
  m.mutable_round_aborted()->set_round(round);
  m.mutable_round_aborted()->set_reason("a participant vanished");
  return m;
}

shoal::v1::CoordinatorMessage Missed(uint64_t round) {
  shoal::v1::CoordinatorMessage m;
  m.mutable_round_missed()->set_round(round);
  m.mutable_round_missed()->set_reason("not ready by the deadline");
  return m;
}

shoal::v1::CoordinatorMessage Checkpoint(uint64_t round, std::string hash) {
  shoal::v1::CoordinatorMessage m;
  m.mutable_checkpoint_request()->set_round(round);
  m.mutable_checkpoint_request()->set_model_hash(std::move(hash));
  m.mutable_checkpoint_request()->set_run_id("run-1");
  return m;
}

// Carries out the protocol's actions as the worker does, against fakes.
class Harness {
 public:
  // `config` defaults to Config(), which drops late work as before
  // (fold_late_work false).
  explicit Harness(const shoal::v1::RunConfig& config = Config()) : protocol_(MakeOptions(&clock)) {
    coordinator.join_response.set_worker_id(kSelf);
    coordinator.join_response.set_run_id("run-1");
    *coordinator.join_response.mutable_config() = config;
    coordinator.join_response.set_data_rank(0);
    protocol_.SetInitialModel("h0");
    Run(protocol_.Start());
  }

  // What the test makes the worker's own work return.
  std::string next_exchange_hash = "h1";
  std::string contribution_hash;
  absl::Status exchange_result;
  absl::Status catch_up_result;
  absl::Duration train_time = absl::Seconds(2);
  absl::Duration exchange_time = absl::Milliseconds(500);

  FakeClock clock;
  FakeCoordinatorClient coordinator;
  // Every action carried out, "name:round", oldest first.
  std::vector<std::string> log;
  // The samples of each kTrain.
  std::vector<std::vector<shoal::v1::SampleRange>> trained_samples;
  absl::Status exit;
  bool exited = false;

  WorkerProtocol& protocol() { return protocol_; }

  // Feeds one directive; returns the actions it led to (and theirs).
  std::vector<std::string> Directive(const shoal::v1::CoordinatorMessage& m) {
    return Run(protocol_.OnDirective(m));
  }
  std::vector<std::string> SessionClosed() {
    return Run(protocol_.OnSessionClosed(absl::UnavailableError("stream broken")));
  }

  // One whole round up to the pending state, from the agreed model.
  void RoundUntilPending(uint64_t round, const std::string& base_hash, int participants = 3) {
    Directive(Start(round, round - 1, base_hash));
    Directive(PlanMsg(round, 1, participants));
    Directive(Sharing(round, 1));
  }

  std::vector<std::string> Run(Actions actions) {
    std::vector<std::string> done;
    std::deque<Action> queue(actions.begin(), actions.end());
    while (!queue.empty()) {
      Action a = queue.front();
      queue.pop_front();
      const std::string entry = absl::StrCat(ActionName(a.kind), ":", a.round);
      log.push_back(entry);
      done.push_back(entry);
      Actions next;
      switch (a.kind) {
        case Action::kJoin: {
          joins.push_back(a.join);
          absl::StatusOr<shoal::v1::JoinResponse> r = coordinator.Join(a.join);
          if (r.ok()) next = protocol_.OnJoined(*r);
          break;
        }
        case Action::kOpenSession:
          EXPECT_TRUE(
              coordinator.OpenSession(kSelf, absl::Seconds(1), nullptr, nullptr, nullptr).ok());
          break;
        case Action::kJoinRound:
          EXPECT_TRUE(coordinator.JoinRound(kSelf, 0, protocol_.carried_round()).ok());
          break;
        case Action::kCatchUp:
          catch_ups.push_back(a);
          next = protocol_.OnCaughtUp(a.round, a.hash, catch_up_result);
          break;
        case Action::kTrain:
          trained_samples.push_back(a.samples);
          clock.Advance(train_time);
          next = protocol_.OnTrained(a.round, 0.25, 300, contribution_hash);
          break;
        case Action::kReportReady:
          next = protocol_.OnReadyReported(a.round, coordinator.ReportReady(a.ready));
          break;
        case Action::kProbe: {
          shoal::v1::ConnectionsReadyRequest req;
          req.set_worker_id(kSelf);
          req.set_round(a.round);
          req.set_attempt(a.attempt);
          EXPECT_TRUE(coordinator.ConnectionsReady(req).ok());
          break;
        }
        case Action::kExchange:
          exchanges.push_back(a);
          clock.Advance(exchange_time);
          next = protocol_.OnExchanged(a.round, a.attempt, exchange_result, next_exchange_hash);
          break;
        case Action::kReportDone:
          EXPECT_TRUE(coordinator.ReportRoundDone(a.done).ok());
          evaluated.push_back(a.evaluate);
          break;
        case Action::kUpload:
          uploads.push_back(a);
          break;
        case Action::kAudit:
          audits.push_back(a.audit);
          break;
        case Action::kExit:
          exit = a.status;
          exited = true;
          break;
        default:
          break;  // memory actions: the log is what the tests check
      }
      queue.insert(queue.begin(), next.begin(), next.end());
    }
    return done;
  }

  std::vector<shoal::v1::JoinRequest> joins;
  std::vector<Action> catch_ups;
  std::vector<Action> exchanges;
  std::vector<Action> uploads;
  std::vector<shoal::v1::AuditRequest> audits;
  std::vector<bool> evaluated;

 private:
  static WorkerProtocol::Options MakeOptions(FakeClock* clock) {
    WorkerProtocol::Options o;
    o.advertise = kSelfAddress;
    o.name = "test";
    o.clock = clock;
    return o;
  }
  WorkerProtocol protocol_;
};

TEST(WorkerProtocolTest, JoinOpensTheSessionAndAsksForTheEarliestRound) {
  Harness h;
  EXPECT_THAT(h.log, ElementsAre("join:0", "open-session:0", "join-round:0"));
  ASSERT_EQ(h.joins.size(), 1u);
  EXPECT_EQ(h.joins[0].peer_address(), kSelfAddress);
  EXPECT_EQ(h.joins[0].previous_worker_id(), "");
  EXPECT_EQ(h.joins[0].model_round(), 0u);
  EXPECT_EQ(h.coordinator.join_rounds, std::vector<uint64_t>{0});
  EXPECT_EQ(h.protocol().worker_id(), kSelf);
}

TEST(WorkerProtocolTest, AWholeRoundTrainsReportsExchangesAndCommits) {
  Harness h;
  EXPECT_THAT(h.Directive(Start(1, 0, "h0")), ElementsAre("train:1", "report-ready:1"));
  ASSERT_EQ(h.coordinator.ready.size(), 1u);
  EXPECT_EQ(h.coordinator.ready[0].round(), 1u);
  EXPECT_DOUBLE_EQ(h.coordinator.ready[0].train_loss(), 0.25);

  EXPECT_THAT(h.Directive(PlanMsg(1, 1)), ElementsAre("serve-plan:1", "probe:1"));
  ASSERT_EQ(h.coordinator.connections_ready.size(), 1u);
  EXPECT_EQ(h.coordinator.connections_ready[0].attempt(), 1u);

  EXPECT_THAT(h.Directive(Sharing(1, 1)),
              ElementsAre("exchange:1", "hold-pending:1", "report-done:1"));
  ASSERT_EQ(h.coordinator.done.size(), 1u);
  const auto& done = h.coordinator.done[0];
  EXPECT_EQ(done.round(), 1u);
  EXPECT_EQ(done.attempt(), 1u);
  EXPECT_EQ(done.model_hash(), "h1");
  // Durations come from the injected clock.
  EXPECT_DOUBLE_EQ(done.train_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(done.exchange_seconds(), 0.5);
  EXPECT_TRUE(h.protocol().pending());
  EXPECT_EQ(h.protocol().model_round(), 1u);
  EXPECT_EQ(h.protocol().agreed_round(), 0u);

  EXPECT_THAT(h.Directive(Complete(1, "h1")), ElementsAre("commit:1"));
  EXPECT_FALSE(h.protocol().pending());
  EXPECT_EQ(h.protocol().model_hash(), "h1");
}

// Audits (docs/SECURITY.md "Audits, scores and bans"): the ready report
// carries the contribution's hash, and an AuditRequest becomes one kAudit
// that changes nothing of the worker's own round.
TEST(WorkerProtocolTest, AuditedRoundsReportTheContributionHashAndReplayOnRequest) {
  Harness h;
  h.contribution_hash = "c1";
  h.Directive(Start(1, 0, "h0"));
  ASSERT_EQ(h.coordinator.ready.size(), 1u);
  EXPECT_EQ(h.coordinator.ready[0].contribution_hash(), "c1");
  shoal::v1::CoordinatorMessage m;
  m.mutable_audit_request()->set_audit_id(7);
  m.mutable_audit_request()->set_round(1);
  m.mutable_audit_request()->set_participant("w9");
  EXPECT_THAT(h.Directive(m), ElementsAre("audit:1"));
  ASSERT_EQ(h.audits.size(), 1u);
  EXPECT_EQ(h.audits[0].participant(), "w9");
  EXPECT_FALSE(WorkerProtocol::Interrupts(m));
  // The round goes on as if nothing happened.
  EXPECT_THAT(h.Directive(PlanMsg(1, 1)), ElementsAre("serve-plan:1", "probe:1"));
}

TEST(WorkerProtocolTest, EvaluatesEveryEvalEveryRoundsAndTheLast) {
  Harness h;
  std::string hash = "h0";
  for (uint64_t r = 1; r <= 5; ++r) {
    h.next_exchange_hash = absl::StrCat("h", r);
    h.RoundUntilPending(r, hash);
    hash = h.next_exchange_hash;
    h.Directive(Complete(r, hash));
  }
  EXPECT_THAT(h.evaluated, ElementsAre(false, false, false, false, true));
}

TEST(WorkerProtocolTest, ReplanAfterThisWorkerFinishedVoidsAndExchangesAgain) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  ASSERT_TRUE(h.protocol().pending());
  // A peer was lost while its exchange was still running: attempt 2 among
  // the survivors.
  EXPECT_THAT(h.Directive(PlanMsg(1, 2, 2)),
              ElementsAre("void:0", "contribute-again:1", "serve-plan:1", "probe:1"));
  EXPECT_FALSE(h.protocol().pending());
  EXPECT_EQ(h.protocol().model_round(), 0u);
  EXPECT_EQ(h.protocol().model_hash(), "h0");
  h.next_exchange_hash = "h1b";
  EXPECT_THAT(h.Directive(Sharing(1, 2)),
              ElementsAre("exchange:1", "hold-pending:1", "report-done:1"));
  ASSERT_EQ(h.coordinator.done.size(), 2u);
  EXPECT_EQ(h.coordinator.done[1].attempt(), 2u);
  EXPECT_EQ(h.coordinator.done[1].model_hash(), "h1b");
  EXPECT_THAT(h.Directive(Complete(1, "h1b")), ElementsAre("commit:1"));
}

TEST(WorkerProtocolTest, ReplanBeforeTheExchangeEndedRestoresTheTrainedModel) {
  Harness h;
  h.Directive(Start(1, 0, "h0"));
  h.Directive(PlanMsg(1, 1));
  h.exchange_result = absl::AbortedError("round aborted");
  EXPECT_THAT(h.Directive(Sharing(1, 1)), ElementsAre("exchange:1"));  // nothing reported
  EXPECT_TRUE(h.coordinator.done.empty());
  h.exchange_result = absl::OkStatus();
  EXPECT_THAT(h.Directive(PlanMsg(1, 2, 2)),
              ElementsAre("contribute-again:1", "serve-plan:1", "probe:1"));
}

TEST(WorkerProtocolTest, RoundAbortedWhilePendingVoidsAndDropsTheWork) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  EXPECT_THAT(h.Directive(Aborted(1)), ElementsAre("void:0", "drop-work:1"));
  EXPECT_FALSE(h.protocol().pending());
  EXPECT_EQ(h.protocol().model_round(), 0u);
  EXPECT_EQ(h.protocol().model_hash(), "h0");
}

TEST(WorkerProtocolTest, RoundAbortedBeforeTheExchangeDropsTheWorkOnly) {
  Harness h;
  h.Directive(Start(1, 0, "h0"));
  EXPECT_THAT(h.Directive(Aborted(1)), ElementsAre("drop-work:1"));
  EXPECT_THAT(h.Directive(Aborted(7)), IsEmpty());  // another round
}

TEST(WorkerProtocolTest, RoundMissedVoidsThePendingRound) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  EXPECT_THAT(h.Directive(Missed(1)), ElementsAre("void:0", "drop-work:1"));
  EXPECT_EQ(h.protocol().model_round(), 0u);
  EXPECT_THAT(h.Directive(Missed(3)), IsEmpty());
}

TEST(WorkerProtocolTest, AgreedHashThatDiffersVoidsAndDrops) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  // The others agreed on an attempt this worker missed.
  EXPECT_THAT(h.Directive(Complete(1, "other")), ElementsAre("void:0", "drop-work:1"));
  EXPECT_EQ(h.protocol().model_round(), 0u);
  // The next round starts from the agreed model: catch up to it first.
  EXPECT_THAT(h.Directive(Start(2, 1, "other", {"10.0.0.2:7000", kSelfAddress})),
              ElementsAre("catch-up:1", "train:2", "report-ready:2"));
  ASSERT_EQ(h.catch_ups.size(), 1u);
  EXPECT_EQ(h.catch_ups[0].hash, "other");
  // Its own address is never a source.
  EXPECT_THAT(h.catch_ups[0].holders, ElementsAre("10.0.0.2:7000"));
  EXPECT_EQ(h.protocol().model_hash(), "other");
}

TEST(WorkerProtocolTest, JoinResponseNamingThePendingRoundCommitsIt) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  h.coordinator.join_response.set_model_round(1);
  h.coordinator.join_response.set_model_hash("h1");
  EXPECT_THAT(h.SessionClosed(),
              ElementsAre("rejoin:0", "join:0", "commit:1", "open-session:0", "join-round:0"));
  ASSERT_EQ(h.joins.size(), 2u);
  // The pending round is not claimed.
  EXPECT_EQ(h.joins[1].previous_worker_id(), kSelf);
  EXPECT_EQ(h.joins[1].model_round(), 0u);
  EXPECT_EQ(h.joins[1].model_hash(), "");  // the initial model is named by round 0 alone
  EXPECT_FALSE(h.protocol().pending());
  EXPECT_EQ(h.protocol().model_round(), 1u);
}

TEST(WorkerProtocolTest, JoinResponseNamingTheOlderRoundVoidsThePendingOneKeepingTheTraining) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  h.coordinator.join_response.set_model_round(0);
  h.coordinator.join_response.set_model_hash("h0");
  // The average is void; the trained model (in the contribution buffer)
  // is carried for the round the new coordinator reopens.
  EXPECT_THAT(h.SessionClosed(),
              ElementsAre("rejoin:0", "join:0", "void:0", "open-session:0", "join-round:0"));
  EXPECT_EQ(h.protocol().model_round(), 0u);
  EXPECT_EQ(h.protocol().carried_round(), 1u);
  EXPECT_THAT(h.coordinator.carried_rounds, ElementsAre(0u, 1u));
  EXPECT_TRUE(h.catch_ups.empty());
  // Reopened from the same base: the trained model comes back, no training.
  EXPECT_THAT(h.Directive(Start(1, 0, "h0")), ElementsAre("contribute-again:1", "report-ready:1"));
  EXPECT_EQ(h.protocol().carried_round(), 0u);
  EXPECT_EQ(h.protocol().resumed_rounds(), 1u);
  // The round then runs as any other.
  h.Directive(PlanMsg(1, 1));
  h.Directive(Sharing(1, 1));
  EXPECT_TRUE(h.protocol().pending());
  EXPECT_EQ(h.coordinator.ready.size(), 2u);
}

TEST(WorkerProtocolTest, SessionLostAfterTrainingCarriesTheWorkIntoTheReopenedRound) {
  Harness h;
  h.Directive(Start(1, 0, "h0"));
  h.Directive(Complete(0, "h0"));  // nothing pending: no effect
  h.Directive(PlanMsg(1, 1));      // no sharing yet
  h.coordinator.join_response.set_model_hash("h0");
  // The old leader dies: nothing is dropped, JoinRound names the work.
  EXPECT_THAT(h.SessionClosed(),
              ElementsAre("rejoin:0", "join:0", "open-session:0", "join-round:0"));
  EXPECT_THAT(h.coordinator.carried_rounds, ElementsAre(0u, 1u));
  EXPECT_THAT(h.Directive(Start(1, 0, "h0")), ElementsAre("contribute-again:1", "report-ready:1"));
  ASSERT_EQ(h.coordinator.ready.size(), 2u);
  EXPECT_EQ(h.coordinator.ready[1].round(), 1u);
  EXPECT_EQ(h.coordinator.ready[1].total_elements(), 300u);
}

TEST(WorkerProtocolTest, UndeliveredReadyKeepsTheWorkForTheRejoin) {
  Harness h;
  // A new leader that does not know this worker yet, then the session's end.
  h.coordinator.ready_status = absl::NotFoundError("unknown worker id 'w1'");
  EXPECT_THAT(h.Directive(Start(1, 0, "h0")), ElementsAre("train:1", "report-ready:1"));
  h.coordinator.ready_status = absl::OkStatus();
  h.coordinator.join_response.set_model_hash("h0");
  EXPECT_THAT(h.SessionClosed(),
              ElementsAre("rejoin:0", "join:0", "open-session:0", "join-round:0"));
  // The trained model sits in the parameters: no restore needed.
  EXPECT_THAT(h.Directive(Start(1, 0, "h0")), ElementsAre("report-ready:1"));
  EXPECT_EQ(h.protocol().resumed_rounds(), 1u);
}

TEST(WorkerProtocolTest, CarriedWorkOfARoundTheRunDidNotReopenIsDropped) {
  {
    // The new leader completed the round: its model is caught up instead.
    Harness h;
    h.Directive(Start(1, 0, "h0"));
    h.coordinator.join_response.set_model_round(1);
    h.coordinator.join_response.set_model_hash("h1");
    h.coordinator.join_response.add_holders("10.0.0.2:7000");
    EXPECT_THAT(h.SessionClosed(), ElementsAre("rejoin:0", "join:0", "drop-work:1",
                                               "open-session:0", "catch-up:1", "join-round:0"));
    EXPECT_EQ(h.protocol().carried_round(), 0u);
    EXPECT_THAT(h.Directive(Start(2, 1, "h1")), ElementsAre("train:2", "report-ready:2"));
  }
  {
    // Admitted to a later round (the reopened one went on without it).
    Harness h;
    h.Directive(Start(1, 0, "h0"));
    h.coordinator.join_response.set_model_hash("h0");
    h.SessionClosed();
    EXPECT_EQ(h.protocol().carried_round(), 1u);
    EXPECT_THAT(h.Directive(Start(2, 1, "h1")),
                ElementsAre("drop-work:1", "catch-up:1", "train:2", "report-ready:2"));
  }
  {
    // The same round from another base (a run that went back).
    Harness h;
    h.Directive(Start(1, 0, "h0"));
    h.coordinator.join_response.set_model_hash("h0");
    h.SessionClosed();
    EXPECT_THAT(h.Directive(Start(1, 0, "other")),
                ElementsAre("drop-work:1", "catch-up:0", "train:1", "report-ready:1"));
  }
}

TEST(WorkerProtocolTest, SessionLostBeforeTrainingHasNothingToCarry) {
  Harness h;
  h.coordinator.join_response.set_model_round(1);
  h.coordinator.join_response.set_model_hash("h1");
  h.coordinator.join_response.add_holders("10.0.0.2:7000");
  h.catch_up_result = absl::UnavailableError("no holder answers");
  h.SessionClosed();
  h.coordinator.join_response.set_model_round(0);
  h.coordinator.join_response.set_model_hash("h0");
  EXPECT_EQ(h.protocol().carried_round(), 0u);
  EXPECT_THAT(h.coordinator.carried_rounds, ElementsAre(0u, 0u));
}

TEST(WorkerProtocolTest, DuplicateStartWeightSharingIsIgnored) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  EXPECT_THAT(h.Directive(Sharing(1, 1)), IsEmpty());
  EXPECT_EQ(h.exchanges.size(), 1u);
  EXPECT_TRUE(h.protocol().pending());
}

TEST(WorkerProtocolTest, StalePlanAttemptsAreIgnored) {
  Harness h;
  h.Directive(Start(2, 1, "h0"));  // catch-up to round 1 first
  h.Directive(PlanMsg(2, 3));
  // Sharing or a retry of an older attempt, and a plan of another round.
  EXPECT_THAT(h.Directive(Sharing(2, 2)), IsEmpty());
  shoal::v1::CoordinatorMessage retry;
  retry.mutable_retry_connections()->set_round(2);
  retry.mutable_retry_connections()->set_attempt(2);
  EXPECT_THAT(h.Directive(retry), IsEmpty());
  retry.mutable_retry_connections()->set_attempt(3);
  retry.mutable_retry_connections()->set_retry(1);
  EXPECT_THAT(h.Directive(retry), ElementsAre("probe:2"));
  EXPECT_THAT(h.Directive(PlanMsg(5, 1)), IsEmpty());
  EXPECT_TRUE(h.exchanges.empty());
}

TEST(WorkerProtocolTest, ANewerRoundStartCommitsThePendingRoundThenCatchesUp) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  // The run moved on without telling this worker round 1's outcome.
  EXPECT_THAT(h.Directive(Start(3, 2, "h2", {"10.0.0.2:7000"})),
              ElementsAre("commit:1", "catch-up:2", "train:3", "report-ready:3"));
  EXPECT_EQ(h.protocol().model_round(), 2u);
}

TEST(WorkerProtocolTest, FailedCatchUpKeepsTheModel) {
  Harness h;
  h.catch_up_result = absl::UnavailableError("no holder");
  h.Directive(Start(4, 3, "h3", {"10.0.0.2:7000"}));
  EXPECT_EQ(h.protocol().model_round(), 0u);
  EXPECT_EQ(h.protocol().model_hash(), "h0");
}

// The encoded exchange applies the averaged change to the round's base: a
// worker that could not pull the base sits the round out (no ready report)
// instead of ending it with a model nobody else has; with raw fp32 averaging
// it contributes its own model as before.
TEST(WorkerProtocolTest, FailedCatchUpSitsOutAndSaysWhyInEveryMode) {
  shoal::v1::RunConfig encoded = Config();
  encoded.mutable_exchange()->set_codec("int8");
  encoded.mutable_exchange()->mutable_outer_optimizer()->set_kind("nesterov");
  for (const shoal::v1::RunConfig& config : {encoded, Config()}) {
    Harness h(config);
    h.catch_up_result = absl::UnavailableError("the snapshot was replaced during the read");
    // No training: the ready report says why instead.
    EXPECT_THAT(h.Directive(Start(4, 3, "h3", {"10.0.0.2:7000"})),
                ElementsAre("catch-up:3", "report-ready:4"));
    EXPECT_EQ(h.protocol().rounds_sat_out_for_base(), 1u);
    ASSERT_EQ(h.coordinator.ready.size(), 1u);
    EXPECT_EQ(h.coordinator.ready[0].base_unavailable(),
              "the snapshot was replaced during the read");
    EXPECT_FALSE(h.coordinator.ready[0].base_checkpoint_damaged());
    // The next round start catches up again, and then the worker trains.
    h.catch_up_result = absl::OkStatus();
    EXPECT_THAT(h.Directive(Start(5, 4, "h4", {"10.0.0.2:7000"})),
                ElementsAre("catch-up:4", "train:5", "report-ready:5"));
    EXPECT_EQ(h.protocol().model_round(), 4u);
    EXPECT_EQ(h.coordinator.ready[1].base_unavailable(), "");
  }
}

TEST(WorkerProtocolTest, DamagedCheckpointIsNamedAndARunGoingBackIsFollowed) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  h.Directive(Complete(1, "h1"));
  // Round 8 starts from checkpoint r-r7 that nobody else holds; the store
  // finds it damaged.
  shoal::v1::CoordinatorMessage start = Start(8, 7, "h7");
  start.mutable_round_start()->set_checkpoint_id("r-r7");
  start.mutable_round_start()->set_checkpoint_round(7);
  h.catch_up_result = absl::DataLossError("blob ab12 is corrupted");
  EXPECT_THAT(h.Directive(start), ElementsAre("catch-up:7", "report-ready:8"));
  ASSERT_EQ(h.coordinator.ready.size(), 2u);
  EXPECT_TRUE(h.coordinator.ready[1].base_checkpoint_damaged());
  // The run goes back to checkpoint r-r4. This worker holds round 1 and
  // loads it.
  shoal::v1::CoordinatorMessage back = Start(5, 4, "h4");
  back.mutable_round_start()->set_checkpoint_id("r-r4");
  back.mutable_round_start()->set_checkpoint_round(4);
  h.catch_up_result = absl::OkStatus();
  EXPECT_THAT(h.Directive(back), ElementsAre("catch-up:4", "train:5", "report-ready:5"));
  EXPECT_EQ(h.protocol().model_round(), 4u);
  EXPECT_EQ(h.protocol().model_hash(), "h4");
}

TEST(WorkerProtocolTest, ARunThatWentBackToACheckpointIsFollowedFromANewerModel) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  h.Directive(Complete(1, "h1"));
  h.next_exchange_hash = "h2";
  h.RoundUntilPending(2, "h1");
  h.Directive(Complete(2, "h2"));
  ASSERT_EQ(h.protocol().model_round(), 2u);
  // Without a checkpoint of the older round the worker keeps its model...
  EXPECT_THAT(h.Directive(Start(2, 1, "h1")), ElementsAre("train:2", "report-ready:2"));
  // ...with one it loads the run's model.
  shoal::v1::CoordinatorMessage back = Start(2, 1, "h1");
  back.mutable_round_start()->set_checkpoint_id("r-r1");
  back.mutable_round_start()->set_checkpoint_round(1);
  EXPECT_THAT(h.Directive(back), ElementsAre("catch-up:1", "train:2", "report-ready:2"));
  EXPECT_EQ(h.protocol().model_round(), 1u);
}

TEST(WorkerProtocolTest, TheLedgersSamplesOfTheRoundGoToTraining) {
  shoal::v1::RunConfig config = Config();
  config.mutable_training()->set_sample_ledger(true);
  Harness h(config);
  shoal::v1::CoordinatorMessage start = Start(1, 0, "h0");
  shoal::v1::SampleRange* r = start.mutable_round_start()->add_samples();
  r->set_epoch(0);
  r->set_begin(640);
  r->set_count(640);
  h.Directive(start);
  ASSERT_EQ(h.trained_samples.size(), 1u);
  ASSERT_EQ(h.trained_samples[0].size(), 1u);
  EXPECT_EQ(h.trained_samples[0][0].begin(), 640u);
  // The next round's start names its own samples (none here).
  h.Directive(PlanMsg(1, 1));
  h.Directive(Sharing(1, 1));
  h.Directive(Complete(1, "h1"));
  h.Directive(Start(2, 1, "h1"));
  ASSERT_EQ(h.trained_samples.size(), 2u);
  EXPECT_TRUE(h.trained_samples[1].empty());
}

TEST(WorkerProtocolTest, TheLedgerRecordsARoundOnlyWithTheModelThisWorkerAveraged) {
  shoal::v1::RunConfig config = Config();
  config.mutable_training()->set_sample_ledger(true);
  {
    Harness h(config);
    h.next_exchange_hash = "h1";
    h.RoundUntilPending(1, "h0");
    EXPECT_EQ(h.protocol().ledger_recorded_round(), 0u);
    h.Directive(Complete(1, "h1"));
    EXPECT_EQ(h.protocol().ledger_recorded_round(), 1u);
  }
  {
    // Round 1 trained, the session broke before its ready reached the run,
    // and the run completed round 1 without it: the worker catches up to the
    // run's round 1, whose model holds none of its samples (the ledger gave
    // them to another worker), so they are not recorded as trained.
    Harness h(config);
    h.Directive(Start(1, 0, "h0"));
    h.coordinator.join_response.set_model_round(1);
    h.coordinator.join_response.set_model_hash("h1");
    h.coordinator.join_response.add_holders("10.0.0.2:7000");
    EXPECT_THAT(h.SessionClosed(), ElementsAre("rejoin:0", "join:0", "drop-work:1",
                                               "open-session:0", "catch-up:1", "join-round:0"));
    EXPECT_EQ(h.protocol().model_round(), 1u);
    h.Directive(Complete(1, "h1"));
    h.Directive(Start(2, 1, "h1"));
    EXPECT_EQ(h.protocol().ledger_recorded_round(), 0u);
  }
}

TEST(WorkerProtocolTest, FailedRunExitsWithItsError) {
  Harness h;
  shoal::v1::CoordinatorMessage m;
  m.mutable_run_finished()->set_last_round(7);
  m.mutable_run_finished()->set_reason("checkpoint r-r7 is damaged");
  m.mutable_run_finished()->set_failed(true);
  h.Directive(m);
  EXPECT_TRUE(h.exited);
  EXPECT_TRUE(absl::IsFailedPrecondition(h.exit)) << h.exit;
  EXPECT_THAT(std::string(h.exit.message()), HasSubstr("checkpoint r-r7 is damaged"));
}

TEST(WorkerProtocolTest, CheckpointRequestOfThePendingRoundCommitsAndUploads) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  EXPECT_THAT(h.Directive(Checkpoint(1, "h1")), ElementsAre("commit:1", "upload:1"));
  ASSERT_EQ(h.uploads.size(), 1u);
  EXPECT_EQ(h.uploads[0].reason, "");
  // A round this worker does not hold: the upload reports why.
  EXPECT_THAT(h.Directive(Checkpoint(4, "h4")), ElementsAre("upload:4"));
  EXPECT_EQ(h.uploads[1].reason, "holds round 1, not 4");
}

TEST(WorkerProtocolTest, RefusedReadyDropsTheWork) {
  Harness h;
  h.coordinator.ready_status = absl::FailedPreconditionError("round 1 is over");
  EXPECT_THAT(h.Directive(Start(1, 0, "h0")),
              ElementsAre("train:1", "report-ready:1", "drop-work:1"));
}

TEST(WorkerProtocolTest, PlanNamingAnUnknownParticipantListRejoins) {
  Harness h;
  h.Directive(Start(1, 0, "h0"));
  shoal::v1::CoordinatorMessage m;
  m.mutable_round_plan()->set_round(1);
  m.mutable_round_plan()->set_attempt(1);
  m.mutable_round_plan()->set_total_elements(300);
  m.mutable_round_plan()->set_participants_version(77);  // never received
  h.coordinator.join_response.set_model_hash("h0");
  // The trained model is kept for the round the fresh session names.
  EXPECT_THAT(h.Directive(m), ElementsAre("rejoin:0", "join:0", "open-session:0", "join-round:0"));
  EXPECT_EQ(h.protocol().carried_round(), 1u);
}

TEST(WorkerProtocolTest, PlanByVersionExpandsFromTheKeptList) {
  Harness h;
  h.RoundUntilPending(1, "h0");
  h.Directive(Complete(1, "h1"));
  h.Directive(Start(2, 1, "h1"));
  shoal::v1::CoordinatorMessage m;
  m.mutable_round_plan()->set_round(2);
  m.mutable_round_plan()->set_attempt(1);
  m.mutable_round_plan()->set_total_elements(300);
  m.mutable_round_plan()->set_participants_version(1001);  // round 1's list
  EXPECT_THAT(h.Directive(m), ElementsAre("serve-plan:2", "probe:2"));
  EXPECT_EQ(h.protocol().plan().slices_size(), 3);
}

TEST(WorkerProtocolTest, EndsOfTheRun) {
  {
    Harness h;
    shoal::v1::CoordinatorMessage m;
    m.mutable_connection_fail()->set_reason("unreachable");
    h.Directive(m);
    EXPECT_TRUE(h.exited);
    EXPECT_TRUE(absl::IsFailedPrecondition(h.exit));
  }
  {
    Harness h;
    shoal::v1::CoordinatorMessage m;
    m.mutable_leave_requested()->set_reason("too many missed rounds");
    h.Directive(m);
    EXPECT_TRUE(absl::IsFailedPrecondition(h.exit));
    EXPECT_NE(h.exit.message().find("too many missed rounds"), absl::string_view::npos);
  }
  {
    Harness h;
    shoal::v1::CoordinatorMessage m;
    m.mutable_run_finished()->set_last_round(9);
    h.Directive(m);
    EXPECT_TRUE(h.exited);
    EXPECT_TRUE(h.exit.ok());
  }
  {
    Harness h;
    EXPECT_THAT(h.Run(h.protocol().OnStopRequested()), ElementsAre("leave:0", "exit:0"));
    EXPECT_TRUE(h.exit.ok());
    // Nothing after leaving.
    EXPECT_THAT(h.Directive(Start(1, 0, "h0")), IsEmpty());
    EXPECT_THAT(h.SessionClosed(), IsEmpty());
  }
}

TEST(WorkerProtocolTest, RejoinWithAnotherConfigurationExits) {
  Harness h;
  h.coordinator.join_response.mutable_config()->mutable_training()->set_local_steps(99);
  h.SessionClosed();
  EXPECT_TRUE(h.exited);
  EXPECT_TRUE(absl::IsFailedPrecondition(h.exit));
}

TEST(WorkerProtocolTest, InterruptingDirectives) {
  EXPECT_TRUE(WorkerProtocol::Interrupts(PlanMsg(1, 2)));
  EXPECT_TRUE(WorkerProtocol::Interrupts(Aborted(1)));
  EXPECT_TRUE(WorkerProtocol::Interrupts(Missed(1)));
  EXPECT_FALSE(WorkerProtocol::Interrupts(Sharing(1, 1)));
  EXPECT_FALSE(WorkerProtocol::Interrupts(Complete(1, "h")));
  EXPECT_FALSE(WorkerProtocol::Interrupts(Checkpoint(1, "h")));
}

// ------------------------------------------------------------ Late work

shoal::v1::RunConfig FoldConfig(uint32_t max_staleness = 3) {
  shoal::v1::RunConfig c = Config();
  c.mutable_sync()->set_fold_late_work(true);
  c.mutable_sync()->set_max_staleness(max_staleness);
  return c;
}

const absl::Status kTooLate = absl::FailedPreconditionError("round 1 is no longer accepting");

TEST(StalenessWeightTest, OneOverOnePlusStalenessUpToTheCap) {
  EXPECT_DOUBLE_EQ(StalenessWeight(0, 4), 1.0);
  EXPECT_DOUBLE_EQ(StalenessWeight(1, 4), 0.5);
  EXPECT_DOUBLE_EQ(StalenessWeight(3, 4), 0.25);
  EXPECT_DOUBLE_EQ(StalenessWeight(4, 4), 0.2);
  EXPECT_EQ(StalenessWeight(5, 4), 0.0);
  EXPECT_EQ(StalenessWeight(1, 0), 0.0);
  EXPECT_DOUBLE_EQ(StalenessWeight(0, 0), 1.0);
  // Falls with staleness.
  for (uint64_t s = 0; s < 10; ++s) EXPECT_GT(StalenessWeight(s, 10), StalenessWeight(s + 1, 10));
}

TEST(WorkerProtocolTest, LateWorkIsKeptThenFoldedIntoTheNextRoundInsteadOfTraining) {
  Harness h(FoldConfig());
  h.coordinator.ready_status = kTooLate;
  EXPECT_THAT(h.Directive(Start(1, 0, "h0")),
              ElementsAre("train:1", "report-ready:1", "keep-late-work:1"));
  EXPECT_TRUE(h.protocol().late_work().held);
  EXPECT_EQ(h.protocol().late_work().base_round, 0u);
  EXPECT_DOUBLE_EQ(h.protocol().late_work().train_seconds, 2.0);
  // The parameters are back at the base already: nothing more to drop.
  EXPECT_THAT(h.Directive(Missed(1)), IsEmpty());

  // The next round: pull the newest model, fold (no training), ready at once.
  h.coordinator.ready_status = absl::OkStatus();
  const absl::Time before = h.clock.Now();
  EXPECT_THAT(h.Directive(Start(2, 1, "h1", {"10.0.0.2:7000"})),
              ElementsAre("catch-up:1", "fold-late-work:2", "report-ready:2"));
  EXPECT_EQ(h.clock.Now(), before);  // no training time
  ASSERT_EQ(h.coordinator.ready.size(), 2u);
  const auto& ready = h.coordinator.ready[1];
  EXPECT_EQ(ready.round(), 2u);
  EXPECT_TRUE(ready.folded());
  EXPECT_EQ(ready.folded_base_round(), 0u);
  EXPECT_EQ(ready.folded_trained_round(), 1u);
  EXPECT_DOUBLE_EQ(ready.folded_weight(), 0.5);  // staleness 1
  EXPECT_DOUBLE_EQ(ready.folded_train_seconds(), 2.0);
  EXPECT_EQ(ready.total_elements(), 300u);
  EXPECT_FALSE(h.coordinator.ready[0].folded());
  // fold-late-work carries the weight.
  EXPECT_THAT(h.Directive(PlanMsg(2, 1)), ElementsAre("serve-plan:2", "probe:2"));
  h.next_exchange_hash = "h2";
  EXPECT_THAT(h.Directive(Sharing(2, 1)),
              ElementsAre("exchange:2", "hold-pending:2", "report-done:2"));
  EXPECT_TRUE(h.protocol().late_work().held);  // until the round is agreed
  EXPECT_THAT(h.Directive(Complete(2, "h2")), ElementsAre("commit:2", "drop-late-work:1"));
  EXPECT_FALSE(h.protocol().late_work().held);
  EXPECT_EQ(h.protocol().late_kept(), 1u);
  EXPECT_EQ(h.protocol().late_folded(), 1u);
  EXPECT_EQ(h.protocol().late_dropped(), 0u);
  // Then it trains again.
  EXPECT_THAT(h.Directive(Start(3, 2, "h2")), ElementsAre("train:3", "report-ready:3"));
  EXPECT_FALSE(h.coordinator.ready.back().folded());
}

TEST(WorkerProtocolTest, TheFoldCarriesTheWeightToTheMemory) {
  Harness h(FoldConfig());
  h.coordinator.ready_status = kTooLate;
  h.Directive(Start(1, 0, "h0"));
  h.coordinator.ready_status = absl::OkStatus();
  Actions actions = h.protocol().OnDirective(Start(3, 2, "h2"));
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, Action::kCatchUp);
  // The fold follows the catch-up's end.
  actions = h.protocol().OnCaughtUp(2, "h2", absl::OkStatus());
  ASSERT_GE(actions.size(), 1u);
  EXPECT_EQ(actions[0].kind, Action::kFoldLateWork);
  EXPECT_DOUBLE_EQ(actions[0].weight, 1.0 / 3);  // staleness 2
}

TEST(WorkerProtocolTest, FoldingOffOrAnotherRefusalDropsTheWork) {
  {
    Harness h;  // fold_late_work false: today's behaviour
    h.coordinator.ready_status = kTooLate;
    EXPECT_THAT(h.Directive(Start(1, 0, "h0")),
                ElementsAre("train:1", "report-ready:1", "drop-work:1"));
    EXPECT_FALSE(h.protocol().late_work().held);
    EXPECT_EQ(h.protocol().late_dropped(), 1u);
  }
  {
    Harness h(FoldConfig());
    // Not "too late": the coordinator does not know this worker (a new
    // leader): the trained model waits for the re-join, not as late work.
    h.coordinator.ready_status = absl::NotFoundError("unknown worker");
    EXPECT_THAT(h.Directive(Start(1, 0, "h0")), ElementsAre("train:1", "report-ready:1"));
    EXPECT_FALSE(h.protocol().late_work().held);
    h.coordinator.join_response.set_model_hash("h0");
    h.SessionClosed();
    EXPECT_EQ(h.protocol().carried_round(), 1u);
  }
}

TEST(WorkerProtocolTest, LateAgainTheUpdateStaysAndItsStalenessGrows) {
  Harness h(FoldConfig());
  h.coordinator.ready_status = kTooLate;
  h.Directive(Start(1, 0, "h0"));
  h.Directive(Missed(1));
  // Too late for the fold round as well: the parameters go back to the
  // base, the update stays.
  EXPECT_THAT(h.Directive(Start(2, 1, "h1")),
              ElementsAre("catch-up:1", "fold-late-work:2", "report-ready:2", "drop-work:2"));
  EXPECT_TRUE(h.protocol().late_work().held);
  EXPECT_EQ(h.protocol().late_work().folded_into, 0u);
  h.Directive(Missed(2));
  h.coordinator.ready_status = absl::OkStatus();
  EXPECT_THAT(h.Directive(Start(3, 2, "h2")),
              ElementsAre("catch-up:2", "fold-late-work:3", "report-ready:3"));
  EXPECT_EQ(h.coordinator.ready.back().folded_base_round(), 0u);
  EXPECT_DOUBLE_EQ(h.coordinator.ready.back().folded_weight(), 1.0 / 3);
  EXPECT_EQ(h.protocol().late_kept(), 1u);
}

TEST(WorkerProtocolTest, LateWorkStalerThanTheCapIsDroppedAndTheWorkerTrains) {
  Harness h(FoldConfig(/*max_staleness=*/2));
  h.coordinator.ready_status = kTooLate;
  h.Directive(Start(1, 0, "h0"));
  h.coordinator.ready_status = absl::OkStatus();
  EXPECT_THAT(h.Directive(Start(4, 3, "h3")),
              ElementsAre("catch-up:3", "drop-late-work:1", "train:4", "report-ready:4"));
  EXPECT_FALSE(h.protocol().late_work().held);
  EXPECT_EQ(h.protocol().late_dropped(), 1u);
  EXPECT_FALSE(h.coordinator.ready.back().folded());
}

TEST(WorkerProtocolTest, AFoldRoundAbortedOrVoidedFoldsAgainIntoTheNext) {
  Harness h(FoldConfig());
  h.coordinator.ready_status = kTooLate;
  h.Directive(Start(1, 0, "h0"));
  h.coordinator.ready_status = absl::OkStatus();
  h.Directive(Start(2, 1, "h1"));
  // Aborted before the exchange: back to the base, the update stays.
  EXPECT_THAT(h.Directive(Aborted(2)), ElementsAre("drop-work:2"));
  EXPECT_TRUE(h.protocol().late_work().held);
  // The round runs again on the same base: the same fold.
  EXPECT_THAT(h.Directive(Start(2, 1, "h1")), ElementsAre("fold-late-work:2", "report-ready:2"));
  h.Directive(PlanMsg(2, 1));
  h.next_exchange_hash = "h2";
  h.Directive(Sharing(2, 1));
  ASSERT_TRUE(h.protocol().pending());
  // Aborted while pending: void, and still held.
  EXPECT_THAT(h.Directive(Aborted(2)), ElementsAre("void:1", "drop-work:2"));
  EXPECT_TRUE(h.protocol().late_work().held);
  EXPECT_THAT(h.Directive(Start(2, 1, "h1")), ElementsAre("fold-late-work:2", "report-ready:2"));
  EXPECT_EQ(h.protocol().late_folded(), 0u);
}

TEST(WorkerProtocolTest, AMissedRoundRunAgainOnTheSameBaseFoldsWithFullWeight) {
  Harness h(FoldConfig());
  h.coordinator.ready_status = kTooLate;
  h.Directive(Start(1, 0, "h0"));
  EXPECT_THAT(h.Directive(Aborted(1)), IsEmpty());
  h.coordinator.ready_status = absl::OkStatus();
  EXPECT_THAT(h.Directive(Start(1, 0, "h0")), ElementsAre("fold-late-work:1", "report-ready:1"));
  EXPECT_DOUBLE_EQ(h.coordinator.ready.back().folded_weight(), 1.0);
}

TEST(WorkerProtocolTest, SessionLostKeepsTheLateWork) {
  Harness h(FoldConfig());
  h.coordinator.ready_status = kTooLate;
  h.Directive(Start(1, 0, "h0"));
  const std::vector<std::string> rejoin = h.SessionClosed();
  EXPECT_THAT(rejoin, ::testing::Not(::testing::Contains("drop-work:1")));
  EXPECT_TRUE(h.protocol().late_work().held);
  h.coordinator.ready_status = absl::OkStatus();
  EXPECT_THAT(h.Directive(Start(2, 1, "h1")),
              ElementsAre("catch-up:1", "fold-late-work:2", "report-ready:2"));
}

TEST(WorkerProtocolTest, ARunThatWentBackDropsTheLateWork) {
  Harness h(FoldConfig());
  h.Directive(Start(5, 4, "h4"));  // catches up to round 4, trains 5
  h.coordinator.ready_status = kTooLate;
  h.Directive(Start(6, 4, "h4"));
  ASSERT_TRUE(h.protocol().late_work().held);
  EXPECT_EQ(h.protocol().late_work().base_round, 4u);
  h.coordinator.ready_status = absl::OkStatus();
  // A coordinator that restarted without its record: round numbers went
  // back; the update belongs to another history.
  std::vector<std::string> next = h.Directive(Start(2, 1, "x1"));
  EXPECT_THAT(next, ::testing::Contains("drop-late-work:6"));
  EXPECT_THAT(next, ::testing::Contains("train:2"));
  EXPECT_FALSE(h.protocol().late_work().held);
}

}  // namespace
}  // namespace shoal::worker
