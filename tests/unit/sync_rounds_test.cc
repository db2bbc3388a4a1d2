// The synchronous round as a value (services/coordinator/core/sync_round.h):
// every test drives SyncRound::Step with events and the time of a FakeClock
// that only the test moves; no thread, no sleep. The world the round reads
// is a real Membership and CheckpointPlanner with a fixed election; the
// harness carries out the round's intents as SyncRounds and RoundEngine do
// and records them, so that the tests see what the round asked for. RoundStats
// (round_stats.h), fed from the same intents, is tested at the end.
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/checkpoint_planner.h"
#include "services/coordinator/core/round_stats.h"
#include "services/coordinator/core/sync_round.h"

namespace shoal::coordinator {
namespace {

using ::shoal::v1::CoordinatorMessage;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr uint64_t kTotal = 1000;

std::vector<std::string> To(const Directives& ds, CoordinatorMessage::KindCase kind) {
  std::vector<std::string> ids;
  for (const Directive& d : ds) {
    if (d.message->kind_case() == kind) ids.push_back(d.worker_id);
  }
  return ids;
}

// A round and the world around it: real members and checkpoints, a fixed
// election, the round-start gate of EngineOptions::before_round_start.
class Harness : public RoundWorld {
 public:
  explicit Harness(EngineOptions options)
      : options_(std::move(options)),
        members_(options_, &clock_, &versions_, clock_.Now()),
        checkpoints_(options_, &clock_, &versions_, &members_),
        round_(SyncRound::OptionsOf(options_), clock_.Now()) {}

  // RoundWorld.
  const std::map<std::string, Member>& members() const override { return members_.members(); }
  const Member* Find(const std::string& id) const override { return members_.Find(id); }
  std::vector<std::string> AtAddress(const std::string& address,
                                     const Member* except) const override {
    return members_.AtAddress(address, except);
  }
  bool Alive(const Member& m, absl::Time now) const override { return members_.Alive(m, now); }
  ZoneHeads Heads(uint64_t) const override { return heads_; }
  const std::string& checkpoint_id() const override { return checkpoints_.checkpoint_id(); }
  uint64_t checkpoint_round() const override { return checkpoints_.checkpoint_round(); }
  const std::vector<v1::CheckpointRef>& known_checkpoints() const override {
    return checkpoints_.known();
  }
  bool CheckpointDue(uint64_t round, bool last) const override {
    return checkpoints_.Due(round, last);
  }
  bool MayStartRound(bool record_changed) const override {
    if (record_changed) versions_.MarkRecordChanged();
    if (!options_.before_round_start) return true;
    versions_.CommitRecord();
    return options_.before_round_start(Record(), versions_.record_version());
  }

  // One step at the clock's time; its intents carried out in place and its
  // follow-up steps taken. The directives of it all.
  Directives Step(const RoundEvent& event, absl::Status* status = nullptr,
                  RoundOutput* first = nullptr) {
    RoundOutput out = round_.Step(event, clock_.Now(), *this);
    if (status != nullptr) *status = out.status;
    if (first != nullptr) {
      first->admitted_round = out.admitted_round;
      first->was_participant = out.was_participant;
      first->accepted = out.accepted;
      first->touched = out.touched;
    }
    Directives all;
    for (;;) {
      if (out.status_changed) versions_.MarkStatusChanged();
      if (out.record_changed) versions_.MarkRecordChanged();
      size_t next = 0;
      for (PlacedIntent& p : out.intents) {
        for (; next < p.at; ++next) all.push_back(out.directives[next]);
        Apply(p.intent, &all);
      }
      for (; next < out.directives.size(); ++next) all.push_back(out.directives[next]);
      if (!out.then.has_value()) break;
      const RoundEvent then = *out.then;
      out = round_.Step(then, clock_.Now(), *this);
    }
    return all;
  }

  void Apply(RoundIntent& intent, Directives* out) {
    namespace i = round_intent;
    if (auto* d = std::get_if<i::Depart>(&intent)) {
      departed_.push_back(d->worker_id);
      members_.Remove(d->worker_id, d->why, d->reason, d->shown, round_.round(), out);
    } else if (auto* f = std::get_if<i::Finish>(&intent)) {
      (f->failed ? failed_ : finished_) = f->reason;
      CoordinatorMessage msg;
      msg.mutable_run_finished()->set_reason(f->reason);
      members_.EndRun(Share(std::move(msg)), out);
    } else if (auto* c = std::get_if<i::Checkpoint>(&intent)) {
      if (c->first) {
        checkpoints_.StartUpload(c->round, c->agreed_hash, c->candidates, out, c->ledger);
      } else {
        checkpoints_.AssignUpload(c->round, c->agreed_hash, c->candidates, out);
      }
    } else if (auto* g = std::get_if<i::GoBack>(&intent)) {
      checkpoints_.GoBack(g->to, g->damaged_id);
    } else if (auto* m = std::get_if<i::Measure>(&intent)) {
      measured_[m->worker_id] = m->step_seconds;
    } else if (auto* r = std::get_if<i::Reelect>(&intent)) {
      reelected_.push_back(r->round);
    } else if (auto* missed = std::get_if<i::Missed>(&intent)) {
      missed_.push_back(*missed);
    } else if (auto* done = std::get_if<i::Completed>(&intent)) {
      completed_.push_back(*done);
    }
  }

  v1::RunRecord Record() const {
    v1::RunRecord r;
    round_.FillRecord(&r, clock_.Now());
    checkpoints_.FillRecord(&r);
    return r;
  }
  v1::RunStatus Status() const {
    v1::RunStatus s;
    round_.FillStatus(&s, clock_.Now(), *this);
    return s;
  }
  v1::WorkerStatus Worker(const std::string& id) const {
    v1::WorkerStatus w;
    round_.FillWorker(id, &w);
    return w;
  }
  bool Consistent() const { return round_.ConsistentForTesting(*this); }

  // Join and Connect as the engine does them.
  std::string Add(int port, uint64_t model_round = 0, const std::string& model_hash = "") {
    v1::JoinRequest request;
    request.set_peer_address(absl::StrCat("127.0.0.1:", port));
    request.set_model_round(model_round);
    request.set_model_hash(model_hash);
    request.set_replay_fingerprint("fp");
    absl::StatusOr<Member*> added = members_.Add(request, round_.round());
    EXPECT_TRUE(added.ok()) << added.status();
    members_.Refresh(**added, request, "");
    Step(round_event::Joined{(*added)->id, &request});
    members_.Connect(**added);
    Step(round_event::Connected{(*added)->id});
    return (*added)->id;
  }
  // As the engine removes a member: the round forgets it, the members
  // drop it, then the round draws the consequence.
  Directives Remove(const std::string& id, MemberState why, const std::string& reason) {
    RoundOutput forgot;
    Directives out = Step(round_event::Forget{id}, nullptr, &forgot);
    departed_.push_back(id);
    members_.Remove(id, why, reason, v1::WorkerStatus(), round_.round(), &out);
    const Directives more = Step(round_event::Departed{id, reason, forgot.was_participant});
    out.insert(out.end(), more.begin(), more.end());
    return out;
  }

  absl::StatusOr<uint64_t> JoinRound(const std::string& id, uint64_t round, Directives* out) {
    absl::Status status;
    RoundOutput first;
    const Directives d = Step(round_event::JoinRound{id, round, 0}, &status, &first);
    out->insert(out->end(), d.begin(), d.end());
    if (!status.ok()) return status;
    return first.admitted_round;
  }
  absl::Status Call(const RoundEvent& event, Directives* out) {
    absl::Status status;
    const Directives d = Step(event, &status);
    out->insert(out->end(), d.begin(), d.end());
    return status;
  }
  absl::Status Ready(const std::string& id, uint64_t round, Directives* out,
                     uint64_t total = kTotal, const std::string& contribution_hash = "") {
    v1::ReportReadyRequest request;
    request.set_contribution_hash(contribution_hash);
    request.set_worker_id(id);
    request.set_round(round);
    request.set_total_elements(total);
    request.set_train_loss(0.5);
    return Call(round_event::Ready{&request}, out);
  }
  absl::Status Connected(const std::string& id, uint64_t round, Directives* out) {
    v1::ConnectionsReadyRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_attempt(Status().attempt());
    return Call(round_event::ConnectionsReady{&request}, out);
  }
  absl::Status Done(const std::string& id, uint64_t round, const std::string& hash, Directives* out,
                    double step_seconds = 0) {
    v1::ReportRoundDoneRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_model_hash(hash);
    request.set_step_seconds(step_seconds);
    return Call(round_event::RoundDone{&request}, out);
  }
  // Every id ready, connected and done with `hash`: the directives of it all.
  Directives Complete(const std::vector<std::string>& ids, uint64_t round,
                      const std::string& hash) {
    Directives out;
    for (const std::string& id : ids) EXPECT_TRUE(Ready(id, round, &out).ok());
    for (const std::string& id : ids) EXPECT_TRUE(Connected(id, round, &out).ok());
    for (const std::string& id : ids) EXPECT_TRUE(Done(id, round, hash, &out).ok());
    return out;
  }
  Directives Tick(uint64_t stalled_upload = 0) { return Step(round_event::Tick{stalled_upload}); }

  FakeClock clock_;
  const EngineOptions options_;
  mutable EngineVersions versions_;
  Membership members_;
  CheckpointPlanner checkpoints_;
  SyncRound round_;
  ZoneHeads heads_;
  // What the round asked for.
  std::vector<std::string> departed_;
  std::string finished_;
  std::string failed_;
  std::map<std::string, double> measured_;
  std::vector<uint64_t> reelected_;
  std::vector<round_intent::Missed> missed_;
  std::vector<round_intent::Completed> completed_;
};

EngineOptions Options(uint32_t min_participants, uint64_t rounds = 0) {
  EngineOptions o;
  o.run_id = "run-s";
  o.config.mutable_sync()->set_min_participants(min_participants);
  o.config.mutable_sync()->set_rounds(rounds);
  o.round_timeout = absl::Seconds(60);
  o.heartbeat_lease = absl::Seconds(1000);
  o.session_grace = absl::Seconds(1000);
  return o;
}

const std::string kHashA(64, 'a');
const std::string kHashB(64, 'b');

TEST(SyncRoundsTest, QueuesUntilMinParticipantsThenStartsRoundOneForAll) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  absl::StatusOr<uint64_t> admitted = h.JoinRound(w1, 1, &out);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(*admitted, 1u);
  EXPECT_THAT(out, IsEmpty());
  EXPECT_EQ(h.round_.phase(), v1::WAITING_FOR_MEMBERS);
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), ElementsAre(w1, w2));
  EXPECT_EQ(h.round_.phase(), v1::TRAINING);
  EXPECT_EQ(h.Worker(w1).state(), "training");
  EXPECT_THAT(h.Status().participants(), ElementsAre(w1, w2));
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, AFullRoundPlansSharesVotesAndCompletesIntoTheRecord) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  out.clear();
  ASSERT_TRUE(h.Ready(w1, 1, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), IsEmpty());  // w2 not ready yet
  ASSERT_TRUE(h.Ready(w2, 1, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), UnorderedElementsAre(w1, w2));
  EXPECT_EQ(h.round_.phase(), v1::SHARING);
  out.clear();
  ASSERT_TRUE(h.Connected(w1, 1, &out).ok());
  ASSERT_TRUE(h.Connected(w2, 1, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kStartSharing), UnorderedElementsAre(w1, w2));
  h.versions_.Commit();
  const uint64_t record = h.versions_.record_version();
  out.clear();
  ASSERT_TRUE(h.Done(w1, 1, kHashA, &out, /*step_seconds=*/0.2).ok());
  EXPECT_EQ(h.round_.last_completed_round(), 0u);
  ASSERT_TRUE(h.Done(w2, 1, kHashA, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundComplete), UnorderedElementsAre(w1, w2));
  EXPECT_EQ(h.round_.last_completed_round(), 1u);
  // Participation is sticky: round 2 starts with the same two at once.
  EXPECT_EQ(h.round_.round(), 2u);
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), UnorderedElementsAre(w1, w2));
  h.versions_.Commit();
  EXPECT_EQ(h.versions_.record_version(), record + 1);
  const v1::RunRecord r = h.Record();
  EXPECT_EQ(r.last_completed_round(), 1u);
  EXPECT_EQ(r.model_hash(), kHashA);
  // The round asked the topology to take the measurements and re-elect.
  EXPECT_DOUBLE_EQ(h.measured_[w1], 0.2);
  EXPECT_THAT(h.reelected_, ElementsAre(1u));
  ASSERT_EQ(h.completed_.size(), 1u);
  EXPECT_THAT(h.completed_[0].participants, ElementsAre(w1, w2));
  EXPECT_EQ(h.completed_[0].model_hash, kHashA);
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, AMinorityHashIsEvictedAndTheMajorityCompletes) {
  Harness h(Options(3));
  std::vector<std::string> ids = {h.Add(9001), h.Add(9002), h.Add(9003)};
  Directives out;
  for (const std::string& id : ids) ASSERT_TRUE(h.JoinRound(id, 1, &out).ok());
  for (const std::string& id : ids) ASSERT_TRUE(h.Ready(id, 1, &out).ok());
  for (const std::string& id : ids) ASSERT_TRUE(h.Connected(id, 1, &out).ok());
  out.clear();
  ASSERT_TRUE(h.Done(ids[0], 1, kHashA, &out).ok());
  ASSERT_TRUE(h.Done(ids[1], 1, kHashB, &out).ok());
  ASSERT_TRUE(h.Done(ids[2], 1, kHashA, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kLeaveRequested), ElementsAre(ids[1]));
  // An intent: the round no longer holds it, the harness removed it.
  EXPECT_THAT(h.departed_, ElementsAre(ids[1]));
  EXPECT_FALSE(h.members_.Contains(ids[1]));
  EXPECT_EQ(h.round_.last_completed_round(), 1u);
  EXPECT_EQ(h.Record().model_hash(), kHashA);
  ASSERT_EQ(h.completed_.size(), 1u);
  EXPECT_THAT(h.completed_[0].participants, ElementsAre(ids[0], ids[2]));
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, ReportsOutsideTheRoundAreRefused) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  const std::string w3 = h.Add(9003);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  // Not a participant; a wrong round; a different model size.
  EXPECT_EQ(h.Ready(w3, 1, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.Ready(w1, 2, &out).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(h.Ready(w1, 1, &out).ok());
  const absl::Status other = h.Ready(w2, 1, &out, kTotal + 1);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.message(), HasSubstr("different --model"));
  // Done before sharing.
  EXPECT_EQ(h.Done(w1, 1, kHashA, &out).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SyncRoundsTest, ATakenReportRefreshesTheLeaseAndARetriedOneIsNotTakenTwice) {
  Harness h(Options(1));
  const std::string w1 = h.Add(9001);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  v1::ReportReadyRequest ready;
  ready.set_worker_id(w1);
  ready.set_round(1);
  ready.set_total_elements(kTotal);
  RoundOutput first;
  h.Step(round_event::Ready{&ready}, nullptr, &first);
  EXPECT_TRUE(first.accepted);
  EXPECT_TRUE(first.touched);
  // The plan went (one participant): a retried ready is answered OK and
  // taken no further.
  ASSERT_EQ(h.round_.phase(), v1::SHARING);
  absl::Status status;
  RoundOutput again;
  EXPECT_THAT(h.Step(round_event::Ready{&ready}, &status, &again), IsEmpty());
  EXPECT_TRUE(status.ok());
  EXPECT_FALSE(again.accepted);
}

TEST(SyncRoundsTest, HeldRoundsDoNotStartUntilReleased) {
  Harness h(Options(1));
  const std::string w1 = h.Add(9001);
  Directives out = h.Step(round_event::Hold{true});
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  EXPECT_THAT(out, IsEmpty());
  EXPECT_EQ(h.round_.phase(), v1::WAITING_FOR_MEMBERS);
  out = h.Step(round_event::Hold{false});
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), ElementsAre(w1));
  EXPECT_EQ(h.round_.phase(), v1::TRAINING);
}

TEST(SyncRoundsTest, BeforeRoundStartSeesTheCompletedRoundUnderItsOwnVersion) {
  EngineOptions o = Options(1);
  std::vector<std::pair<uint64_t, uint64_t>> asked;  // (last completed round, version)
  bool allow = true;
  o.before_round_start = [&](const v1::RunRecord& r, uint64_t version) {
    asked.emplace_back(r.last_completed_round(), version);
    return allow;
  };
  Harness h(std::move(o));
  const std::string w1 = h.Add(9001);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_EQ(asked.size(), 1u);
  h.versions_.Commit();
  const uint64_t before = h.versions_.record_version();
  allow = false;  // the record of round 1 cannot be written: round 2 waits
  out = h.Complete({w1}, 1, kHashA);
  ASSERT_EQ(asked.size(), 2u);
  // The completed round was committed before it was handed out.
  EXPECT_EQ(asked[1].first, 1u);
  EXPECT_EQ(asked[1].second, before + 1);
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), IsEmpty());
  EXPECT_EQ(h.round_.phase(), v1::WAITING_FOR_MEMBERS);
  // Nothing else changed the record: committing the call moves it no further.
  h.versions_.Commit();
  EXPECT_EQ(h.versions_.record_version(), before + 1);
  allow = true;
  out = h.Step(round_event::Hold{false});
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), ElementsAre(w1));
  EXPECT_EQ(h.round_.round(), 2u);
}

TEST(SyncRoundsTest, AParticipantNotReadyByTheDeadlineSitsTheRoundOut) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  ASSERT_TRUE(h.Ready(w1, 1, &out).ok());
  h.clock_.Advance(absl::Seconds(59));
  EXPECT_THAT(h.Tick(), IsEmpty());
  h.clock_.Advance(absl::Seconds(2));
  out = h.Tick();
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundMissed), ElementsAre(w2));
  // w1 goes on alone; w2 stays a member, queued for the next round.
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), ElementsAre(w1));
  EXPECT_TRUE(h.members_.Contains(w2));
  ASSERT_EQ(h.missed_.size(), 1u);
  EXPECT_EQ(h.missed_[0].worker_id, w2);
  EXPECT_DOUBLE_EQ(h.missed_[0].deadline_seconds, 60);
  EXPECT_TRUE(h.Consistent());
}

// The time is the caller's: a step at a later `now` than the clock's sees
// the deadline passed; the round itself reads no clock.
TEST(SyncRoundsTest, TheDeadlineIsTheCallersTime) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  ASSERT_TRUE(h.Ready(w1, 1, &out).ok());
  SyncRound copy = h.round_;  // a value: the copy goes its own way
  const RoundOutput late = copy.Step(round_event::Tick{}, h.clock_.Now() + absl::Seconds(61), h);
  EXPECT_THAT(To(late.directives, CoordinatorMessage::kRoundMissed), ElementsAre(w2));
  EXPECT_THAT(To(late.directives, CoordinatorMessage::kRoundPlan), ElementsAre(w1));
  EXPECT_EQ(copy.phase(), v1::SHARING);
  // The original did not move.
  EXPECT_EQ(h.round_.phase(), v1::TRAINING);
  EXPECT_THAT(h.Tick(), IsEmpty());
}

TEST(SyncRoundsTest, LosingTheLastUnreadyParticipantSendsThePlanToTheRest) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  ASSERT_TRUE(h.Ready(w1, 1, &out).ok());
  out = h.Remove(w2, MemberState::kLeft, "session broke");
  EXPECT_THAT(h.departed_, ElementsAre(w2));
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), ElementsAre(w1));
  EXPECT_EQ(h.round_.phase(), v1::SHARING);
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, LosingAParticipantAfterThePlanReplansTheSurvivors) {
  Harness h(Options(3));
  std::vector<std::string> ids = {h.Add(9001), h.Add(9002), h.Add(9003)};
  Directives out;
  for (const std::string& id : ids) ASSERT_TRUE(h.JoinRound(id, 1, &out).ok());
  for (const std::string& id : ids) ASSERT_TRUE(h.Ready(id, 1, &out).ok());
  ASSERT_EQ(h.Status().attempt(), 1u);
  out = h.Remove(ids[2], MemberState::kLost, "session broke");
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_EQ(h.Status().attempt(), 2u);
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, PeersThatCannotConnectAreEvictedAfterTheRetries) {
  EngineOptions o = Options(3);
  o.max_connection_retry = 1;
  o.connection_timeout = absl::Seconds(10);
  Harness h(std::move(o));
  std::vector<std::string> ids = {h.Add(9001), h.Add(9002), h.Add(9003)};
  Directives out;
  for (const std::string& id : ids) ASSERT_TRUE(h.JoinRound(id, 1, &out).ok());
  for (const std::string& id : ids) ASSERT_TRUE(h.Ready(id, 1, &out).ok());
  // Two report; the third never does.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(h.Connected(ids[i], 1, &out).ok());
  h.clock_.Advance(absl::Seconds(11));
  out = h.Tick();
  EXPECT_THAT(To(out, CoordinatorMessage::kRetryConnections),
              UnorderedElementsAre(ids[0], ids[1], ids[2]));
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(h.Connected(ids[i], 1, &out).ok());
  h.clock_.Advance(absl::Seconds(11));
  out = h.Tick();
  EXPECT_THAT(To(out, CoordinatorMessage::kConnectionFail), ElementsAre(ids[2]));
  EXPECT_THAT(h.departed_, ElementsAre(ids[2]));
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), ElementsAre(ids[0], ids[1]));
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, TheLastRoundFinishesTheRunThroughAnIntent) {
  Harness h(Options(1, /*rounds=*/1));
  const std::string w1 = h.Add(9001);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  out = h.Complete({w1}, 1, kHashA);
  EXPECT_EQ(h.finished_, "completed 1 rounds");
  EXPECT_EQ(h.round_.phase(), v1::FINISHED);
  EXPECT_THAT(To(out, CoordinatorMessage::kRunFinished), ElementsAre(w1));
}

TEST(SyncRoundsTest, ACompletedRoundAsksAHolderForTheCheckpointBeforeTheNextRound) {
  EngineOptions o = Options(1);
  o.config.mutable_checkpoints()->set_store("127.0.0.1:7000");
  o.config.mutable_checkpoints()->set_every(1);
  Harness h(std::move(o));
  const std::string w1 = h.Add(9001);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  out = h.Complete({w1}, 1, kHashA);
  std::vector<CoordinatorMessage::KindCase> kinds;
  for (const Directive& d : out) kinds.push_back(d.message->kind_case());
  // In the order the round made them: the request comes before round 2.
  const auto request =
      std::find(kinds.begin(), kinds.end(), CoordinatorMessage::kCheckpointRequest);
  const auto start = std::find(kinds.begin(), kinds.end(), CoordinatorMessage::kRoundStart);
  ASSERT_NE(request, kinds.end());
  ASSERT_NE(start, kinds.end());
  EXPECT_LT(request, start);
}

TEST(SyncRoundsTest, AJoinerHoldingANewerRoundAfterARestartIsAdopted) {
  Harness h(Options(1));
  h.Add(9001, /*model_round=*/4, kHashB);
  EXPECT_EQ(h.round_.last_completed_round(), 4u);
  EXPECT_EQ(h.round_.round(), 5u);
  EXPECT_EQ(h.Record().model_hash(), kHashB);
  v1::JoinResponse r;
  h.round_.FillJoinResponse(h.members_.At("w1"), h, &r);
  EXPECT_EQ(r.next_round(), 5u);
}

namespace base_recovery {

// A run resumed at round 8 from checkpoint run-s-r8 that nobody holds; the
// run also knows run-s-r4 (and run-s-r6 with `six`).
v1::RunRecord Resumed(bool six, bool four = true) {
  v1::RunRecord r;
  r.set_run_id("run-s");
  r.set_last_completed_round(8);
  r.set_model_hash(kHashA);
  r.set_checkpoint_id("run-s-r8");
  r.set_checkpoint_round(8);
  auto add = [&](uint64_t round, const std::string& hash) {
    v1::CheckpointRef* ref = r.add_checkpoints();
    ref->set_id(absl::StrCat("run-s-r", round));
    ref->set_round(round);
    ref->set_model_hash(hash);
  };
  add(8, kHashA);
  if (six) add(6, std::string(64, '6'));
  if (four) add(4, kHashB);
  return r;
}

v1::ReportReadyRequest Unavailable(const std::string& id, uint64_t round, bool damaged) {
  v1::ReportReadyRequest request;
  request.set_worker_id(id);
  request.set_round(round);
  request.set_base_unavailable(damaged ? "blob 12ab is corrupted" : "store unreachable");
  request.set_base_checkpoint_damaged(damaged);
  return request;
}

void Resume(Harness& h, const v1::RunRecord& record) {
  h.Step(round_event::Resume{&record});
  h.checkpoints_.Resume(record);
}

TEST(SyncRoundsTest, DamagedCheckpointNobodyHoldsTakesTheRunBackToTheNewestIntactOne) {
  Harness h(Options(2));
  Resume(h, Resumed(/*six=*/true));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 9, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 9, &out).ok());
  ASSERT_EQ(h.round_.round(), 9u);
  out.clear();
  v1::ReportReadyRequest bad = Unavailable(w1, 9, true);
  ASSERT_TRUE(h.Call(round_event::Ready{&bad}, &out).ok());
  // Round 9 is aborted and round 7 starts from checkpoint run-s-r6: the
  // round asked the planner to go back, and started once it had.
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundAborted), UnorderedElementsAre(w1, w2));
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), UnorderedElementsAre(w1, w2));
  for (const Directive& d : out) {
    if (d.message->kind_case() != CoordinatorMessage::kRoundStart) continue;
    EXPECT_EQ(d.message->round_start().round(), 7u);
    EXPECT_EQ(d.message->round_start().base_model_round(), 6u);
    EXPECT_EQ(d.message->round_start().base_model_hash(), std::string(64, '6'));
    EXPECT_EQ(d.message->round_start().checkpoint_id(), "run-s-r6");
    EXPECT_EQ(d.message->round_start().checkpoint_round(), 6u);
  }
  EXPECT_EQ(h.round_.last_completed_round(), 6u);
  const v1::RunStatus s = h.Status();
  EXPECT_THAT(s.base_fallback(), HasSubstr("checkpoint run-s-r8 is damaged"));
  EXPECT_THAT(s.base_fallback(), HasSubstr("went back to checkpoint run-s-r6 of round 6"));
  // The record goes back too, and forgets the damaged checkpoint.
  const v1::RunRecord record = h.Record();
  EXPECT_EQ(record.last_completed_round(), 6u);
  EXPECT_EQ(record.checkpoint_id(), "run-s-r6");
  ASSERT_EQ(record.checkpoints_size(), 2);
  EXPECT_EQ(record.checkpoints(0).id(), "run-s-r6");
  EXPECT_EQ(record.checkpoints(1).id(), "run-s-r4");
  // The report of the other worker for the aborted round is refused.
  v1::ReportReadyRequest stale = Unavailable(w2, 9, true);
  EXPECT_FALSE(h.Call(round_event::Ready{&stale}, &out).ok());
  // Should run-s-r6 be damaged as well, the run goes back to run-s-r4.
  out.clear();
  v1::ReportReadyRequest again = Unavailable(w2, 7, true);
  ASSERT_TRUE(h.Call(round_event::Ready{&again}, &out).ok());
  EXPECT_EQ(h.round_.last_completed_round(), 4u);
  EXPECT_EQ(h.round_.round(), 5u);
  EXPECT_TRUE(h.failed_.empty());
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, DamagedCheckpointWithNoOlderOneStopsTheRunNamingIt) {
  Harness h(Options(1));
  Resume(h, Resumed(/*six=*/false, /*four=*/false));
  const std::string w1 = h.Add(9001);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 9, &out).ok());
  out.clear();
  v1::ReportReadyRequest bad = Unavailable(w1, 9, true);
  ASSERT_TRUE(h.Call(round_event::Ready{&bad}, &out).ok());
  EXPECT_THAT(h.failed_, HasSubstr("checkpoint run-s-r8 is damaged"));
  EXPECT_THAT(h.failed_, HasSubstr("Restore checkpoint run-s-r8"));
  EXPECT_EQ(h.round_.phase(), v1::FINISHED);
  EXPECT_EQ(h.round_.last_completed_round(), 8u);  // no round completed on another model
  EXPECT_THAT(To(out, CoordinatorMessage::kRunFinished), ElementsAre(w1));
}

TEST(SyncRoundsTest, BaseUnavailableWhileAnotherMemberHoldsItOnlySitsOut) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  h.Complete({w1, w2}, 1, kHashA);
  // w3 joins once round 2 has a ready participant: it is queued for round 3.
  ASSERT_TRUE(h.Ready(w1, 2, &out).ok());
  const std::string w3 = h.Add(9003);
  ASSERT_TRUE(h.JoinRound(w3, 3, &out).ok());
  ASSERT_TRUE(h.Ready(w2, 2, &out).ok());
  for (const std::string& id : {w1, w2}) ASSERT_TRUE(h.Connected(id, 2, &out).ok());
  for (const std::string& id : {w1, w2}) ASSERT_TRUE(h.Done(id, 2, kHashB, &out).ok());
  ASSERT_EQ(h.round_.round(), 3u);
  ASSERT_EQ(h.round_.phase(), v1::TRAINING);
  out.clear();
  v1::ReportReadyRequest bad = Unavailable(w3, 3, false);
  ASSERT_TRUE(h.Call(round_event::Ready{&bad}, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundMissed), ElementsAre(w3));
  EXPECT_EQ(h.round_.last_completed_round(), 2u);
  EXPECT_TRUE(h.failed_.empty());
  // The others complete the round without it.
  out.clear();
  h.Complete({w1, w2}, 3, kHashA);
  EXPECT_EQ(h.round_.last_completed_round(), 3u);
}

}  // namespace base_recovery

// The sample ledger (docs/DATA.md): a worker admitted to the round in
// progress trains samples of its own, like those that started it.
TEST(SyncRoundsTest, AJoinerOfTheRunningRoundGetsItsOwnSamples) {
  EngineOptions o = Options(2);
  o.config.mutable_training()->set_sample_ledger(true);
  o.config.mutable_training()->set_local_steps(2);
  o.config.mutable_training()->set_batch_size(8);
  Harness h(o);
  v1::JoinRequest declared;
  declared.set_train_samples(1000);
  absl::Status checked;
  h.Step(round_event::CheckJoin{&declared}, &checked);
  ASSERT_TRUE(checked.ok()) << checked;
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  ASSERT_EQ(h.round_.phase(), v1::TRAINING);
  const std::string w3 = h.Add(9003);
  out.clear();
  ASSERT_TRUE(h.JoinRound(w3, 1, &out).ok());
  ASSERT_THAT(To(out, CoordinatorMessage::kRoundStart), ElementsAre(w3));
  const v1::RoundStart& start = out[0].message->round_start();
  ASSERT_EQ(start.samples_size(), 1);
  EXPECT_EQ(start.samples(0).count(), 16u);
  EXPECT_EQ(start.samples(0).begin(), 32u);  // after w1's and w2's
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, BadChunksReportedByTwoMembersLowerTheSendersScore) {
  EngineOptions o = Options(3);
  o.config.mutable_trust()->set_ban_below(0.8);
  o.config.mutable_trust()->set_ban_seconds(600);
  Harness h(o);
  const std::vector<std::string> ids = {h.Add(9001), h.Add(9002), h.Add(9003)};
  Directives out;
  for (const std::string& id : ids) ASSERT_TRUE(h.JoinRound(id, 1, &out).ok());
  v1::Heartbeat hb;
  hb.add_bad_chunks_from("127.0.0.1:9003");
  h.Step(round_event::Heartbeat{ids[0], &hb});
  EXPECT_DOUBLE_EQ(h.Worker(ids[2]).score(), 1.0);  // one reporter alone moves nothing
  h.Step(round_event::Heartbeat{ids[1], &hb});
  const v1::WorkerStatus w = h.Worker(ids[2]);
  EXPECT_DOUBLE_EQ(w.score(), 0.75);
  ASSERT_EQ(w.score_reasons_size(), 1);
  EXPECT_THAT(w.score_reasons(0), HasSubstr("bad chunks to w1, w2"));
  // Below 0.8: banned, and removed at the next tick.
  out = h.Tick();
  EXPECT_THAT(To(out, CoordinatorMessage::kLeaveRequested), ElementsAre(ids[2]));
  EXPECT_FALSE(h.members_.Contains(ids[2]));
  EXPECT_TRUE(h.Consistent());
}

namespace audits {

// Audits by replay (core/round_trust.h): the plan waits for the round's
// replays; a contribution two replays disagree with leaves the round, its
// member is banned and refused at its next join; the others go on.
TEST(SyncRoundsTest, TheRoundWaitsForItsAuditsAndAFailedContributionLeavesIt) {
  EngineOptions o = Options(3);
  o.config.mutable_trust()->set_audit_rate(1);
  o.config.mutable_trust()->set_ban_below(0.5);
  o.config.mutable_trust()->set_ban_seconds(600);
  o.audit_secret = "unit";
  Harness h(o);
  const std::vector<std::string> ids = {h.Add(9001), h.Add(9002), h.Add(9003)};
  const std::string cheater = ids[1];
  std::map<std::string, std::string> hash = {{ids[0], std::string(64, '1')},
                                             {ids[1], std::string(64, '2')},
                                             {ids[2], std::string(64, '3')}};
  Directives out;
  for (const std::string& id : ids) ASSERT_TRUE(h.JoinRound(id, 1, &out).ok());
  out.clear();
  for (const std::string& id : ids) ASSERT_TRUE(h.Ready(id, 1, &out, kTotal, hash[id]).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), IsEmpty());
  EXPECT_EQ(To(out, CoordinatorMessage::kAuditRequest).size(), 3u);
  EXPECT_THAT(h.Status().detail(), HasSubstr("audits"));
  // Answer every request (and the second opinions they lead to): the
  // cheater's work replays to something else; the cheater's own replays
  // are wrong too.
  Directives pending = out;
  for (int guard = 0; guard < 10 && !pending.empty(); ++guard) {
    Directives next;
    for (const Directive& d : pending) {
      if (d.message->kind_case() != CoordinatorMessage::kAuditRequest) continue;
      const v1::AuditRequest& a = d.message->audit_request();
      if (!h.members_.Contains(d.worker_id)) continue;
      v1::ReportAuditRequest r;
      r.set_worker_id(d.worker_id);
      r.set_round(1);
      r.set_audit_id(a.audit_id());
      r.set_replay_hash(a.participant() == cheater || d.worker_id == cheater
                            ? std::string(64, 'f')
                            : hash[a.participant()]);
      const absl::Status st = h.Call(round_event::Audit{&r}, &next);
      // Audits by a member banned meanwhile are gone.
      EXPECT_TRUE(st.ok() || absl::IsNotFound(st)) << st;
    }
    out.insert(out.end(), next.begin(), next.end());
    pending = std::move(next);
  }
  EXPECT_THAT(To(out, CoordinatorMessage::kLeaveRequested), ElementsAre(cheater));
  EXPECT_FALSE(h.members_.Contains(cheater));
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), UnorderedElementsAre(ids[0], ids[2]));
  const v1::RunStatus s = h.Status();
  ASSERT_EQ(s.bans_size(), 1);
  EXPECT_EQ(s.bans(0).worker_id(), cheater);
  EXPECT_THAT(s.bans(0).reason(), HasSubstr("failed audit"));
  const v1::WorkerStatus honest = h.Worker(ids[0]);
  EXPECT_EQ(honest.audits_failed(), 0u);
  EXPECT_DOUBLE_EQ(honest.score(), 1.0);
  // Its re-join is refused with the reason.
  v1::JoinRequest again;
  again.set_previous_worker_id(cheater);
  absl::Status refused;
  h.Step(round_event::CheckJoin{&again}, &refused);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("banned"));
  // The record keeps the ban.
  EXPECT_EQ(h.Record().bans_size(), 1);
  EXPECT_TRUE(h.Consistent());
}

TEST(SyncRoundsTest, AuditsNobodyAnswersAreDroppedAtTheDeadline) {
  EngineOptions o = Options(2);
  o.config.mutable_trust()->set_audit_rate(1);
  o.audit_secret = "unit";
  Harness h(o);
  const std::vector<std::string> ids = {h.Add(9001), h.Add(9002)};
  Directives out;
  for (const std::string& id : ids) ASSERT_TRUE(h.JoinRound(id, 1, &out).ok());
  out.clear();
  for (const std::string& id : ids) {
    ASSERT_TRUE(h.Ready(id, 1, &out, kTotal, std::string(64, 'c')).ok());
  }
  EXPECT_EQ(To(out, CoordinatorMessage::kAuditRequest).size(), 2u);
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), IsEmpty());
  h.clock_.Advance(absl::Seconds(61));
  out = h.Tick();
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), UnorderedElementsAre(ids[0], ids[1]));
  const v1::RunStatus s = h.Status();
  EXPECT_EQ(s.audits_dropped(), 2u);
  EXPECT_EQ(s.audits_failed(), 0u);
}

}  // namespace audits

// ------------------------------------------------------------- RoundStats

TEST(RoundStatsTest, StatusSaysWhereEachWorkersRoundTimeGoes) {
  RoundStats stats(/*window=*/5);
  v1::ReportReadyRequest ready;
  ready.set_worker_id("w1");
  ready.set_train_loss(0.5);
  stats.OnReady(ready);
  v1::WorkerStatus before;
  stats.FillWorker("w1", &before);
  EXPECT_EQ(before.train_share(), 0);
  v1::ReportRoundDoneRequest done;
  done.set_worker_id("w1");
  done.set_round(1);
  done.set_train_seconds(6);
  done.set_exchange_seconds(2);
  done.mutable_metrics()->set_evaluated(true);
  done.mutable_metrics()->set_test_accuracy(0.8);
  stats.OnRoundDone(done);
  round_intent::Completed completed;
  completed.round = 1;
  completed.participants = {"w1"};
  completed.seconds = 10;
  completed.deadline_seconds = 60;
  stats.OnCompleted(completed);
  v1::WorkerStatus w;
  stats.FillWorker("w1", &w);
  EXPECT_DOUBLE_EQ(w.train_share(), 0.6);
  EXPECT_DOUBLE_EQ(w.exchange_share(), 0.2);
  EXPECT_NEAR(w.idle_share(), 0.2, 1e-12);
  EXPECT_EQ(w.rounds_completed(), 1u);
  EXPECT_DOUBLE_EQ(w.deadline_seconds(), 60);
  v1::RunStatus s;
  stats.FillStatus(&s);
  ASSERT_EQ(s.recent_rounds_size(), 1);
  EXPECT_DOUBLE_EQ(s.recent_rounds(0).train_loss(), 0.5);
  EXPECT_DOUBLE_EQ(s.recent_rounds(0).exchange_seconds(), 2);
  EXPECT_TRUE(s.recent_rounds(0).evaluated());
  EXPECT_DOUBLE_EQ(s.recent_rounds(0).test_accuracy(), 0.8);
}

TEST(RoundStatsTest, AFoldAndALateMissAreCounted) {
  RoundStats stats(/*window=*/5);
  stats.OnMissed({"w1", /*late=*/true, 12});
  round_intent::Completed completed;
  completed.round = 3;
  completed.participants = {"w1"};
  completed.seconds = 4;
  completed.folds.push_back({"w1", /*staleness=*/1, /*weight=*/0.5, /*train_seconds=*/3});
  stats.OnCompleted(completed);
  v1::WorkerStatus w;
  stats.FillWorker("w1", &w);
  EXPECT_EQ(w.rounds_late(), 1u);
  EXPECT_EQ(w.folded_updates(), 1u);
  EXPECT_EQ(w.last_fold_round(), 3u);
  EXPECT_DOUBLE_EQ(w.last_fold_weight(), 0.5);
  stats.Forget("w1");
  v1::WorkerStatus gone;
  stats.FillWorker("w1", &gone);
  EXPECT_EQ(gone.rounds_late(), 0u);
}

}  // namespace
}  // namespace shoal::coordinator
