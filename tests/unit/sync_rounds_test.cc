// SyncRounds on its own (services/coordinator/core/sync_rounds.h): the
// synchronous rounds driven through the RunMode interface, with real
// Membership, Topology and CheckpointPlanner parts and a test EngineHost in
// place of RoundEngine (no lock, no facade). Time from a FakeClock.
#include "services/coordinator/core/sync_rounds.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

// The parts of an engine around one SyncRounds, and the host it calls back:
// departures go through every part as RoundEngine::DepartMember does.
class Harness : public EngineHost {
 public:
  explicit Harness(EngineOptions options)
      : options_(std::move(options)),
        members_(options_, &clock_, &versions_, clock_.Now()),
        topology_(options_, &clock_, &versions_, &members_),
        checkpoints_(options_, &clock_, &versions_, &members_),
        rounds_(options_, &clock_, &versions_, &members_, &topology_, &checkpoints_, this,
                clock_.Now()) {}

  bool DepartMember(std::string worker_id, MemberState why, const std::string& reason,
                    Directives* out) override {
    if (!members_.Contains(worker_id)) return false;
    departed_.push_back(worker_id);
    const bool was_participant = rounds_.Forget(worker_id);
    v1::WorkerStatus gone;
    gone.set_id(worker_id);
    gone.set_state(MemberStateName(why));
    members_.Remove(worker_id, why, reason, gone, rounds_.round(), out);
    topology_.Forget(worker_id, rounds_.round());
    return was_participant;
  }
  void FailRun(const std::string& error, Directives* out) override {
    failed_ = error;
    FinishRun(error, out);
  }
  void FinishRun(const std::string& reason, Directives* out) override {
    finished_ = reason;
    rounds_.OnFinish();
    versions_.MarkRecordChanged();
    CoordinatorMessage msg;
    msg.mutable_run_finished()->set_reason(reason);
    members_.EndRun(Share(std::move(msg)), out);
  }
  v1::RunRecord CurrentRecord() const override {
    v1::RunRecord r;
    rounds_.FillRecord(&r);
    checkpoints_.FillRecord(&r);
    return r;
  }

  // Join and Connect as the facade does them.
  std::string Add(int port, uint64_t model_round = 0, const std::string& model_hash = "") {
    v1::JoinRequest request;
    request.set_peer_address(absl::StrCat("127.0.0.1:", port));
    request.set_model_round(model_round);
    request.set_model_hash(model_hash);
    request.set_replay_fingerprint("fp");
    absl::StatusOr<Member*> added = members_.Add(request, rounds_.round());
    EXPECT_TRUE(added.ok()) << added.status();
    members_.Refresh(**added, request, "");
    rounds_.OnJoined(**added, request);
    members_.Connect(**added);
    rounds_.OnConnected(**added);
    return (*added)->id;
  }

  absl::StatusOr<uint64_t> JoinRound(const std::string& id, uint64_t round, Directives* out) {
    return rounds_.JoinRound(members_.At(id), round, /*carried=*/0, out);
  }
  absl::Status Ready(const std::string& id, uint64_t round, Directives* out,
                     uint64_t total = kTotal, const std::string& contribution_hash = "") {
    v1::ReportReadyRequest request;
    request.set_contribution_hash(contribution_hash);
    request.set_worker_id(id);
    request.set_round(round);
    request.set_total_elements(total);
    request.set_train_loss(0.5);
    return rounds_.ReportReady(members_.At(id), request, out);
  }
  absl::Status Connected(const std::string& id, uint64_t round, Directives* out) {
    v1::RunStatus s;
    rounds_.FillStatus(&s);
    v1::ConnectionsReadyRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_attempt(s.attempt());
    return rounds_.ConnectionsReady(members_.At(id), request, out);
  }
  absl::Status Done(const std::string& id, uint64_t round, const std::string& hash, Directives* out,
                    double step_seconds = 0) {
    v1::ReportRoundDoneRequest request;
    request.set_worker_id(id);
    request.set_round(round);
    request.set_model_hash(hash);
    request.set_step_seconds(step_seconds);
    return rounds_.ReportRoundDone(members_.At(id), request, out);
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

  FakeClock clock_;
  const EngineOptions options_;
  EngineVersions versions_;
  Membership members_;
  Topology topology_;
  CheckpointPlanner checkpoints_;
  SyncRounds rounds_;
  std::vector<std::string> departed_;
  std::string finished_;
  std::string failed_;
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
  EXPECT_EQ(h.rounds_.phase(), v1::WAITING_FOR_MEMBERS);
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), ElementsAre(w1, w2));
  EXPECT_EQ(h.rounds_.phase(), v1::TRAINING);
  EXPECT_EQ(h.members_.At(w1).state, MemberState::kTraining);
  v1::RunStatus s;
  h.rounds_.FillStatus(&s);
  EXPECT_THAT(s.participants(), ElementsAre(w1, w2));
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
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
  EXPECT_EQ(h.rounds_.phase(), v1::SHARING);
  out.clear();
  ASSERT_TRUE(h.Connected(w1, 1, &out).ok());
  ASSERT_TRUE(h.Connected(w2, 1, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kStartSharing), UnorderedElementsAre(w1, w2));
  h.versions_.Commit();
  const uint64_t record = h.versions_.record_version();
  out.clear();
  ASSERT_TRUE(h.Done(w1, 1, kHashA, &out, /*step_seconds=*/0.2).ok());
  EXPECT_EQ(h.rounds_.last_completed_round(), 0u);
  ASSERT_TRUE(h.Done(w2, 1, kHashA, &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundComplete), UnorderedElementsAre(w1, w2));
  EXPECT_EQ(h.rounds_.last_completed_round(), 1u);
  // Participation is sticky: round 2 starts with the same two at once.
  EXPECT_EQ(h.rounds_.round(), 2u);
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), UnorderedElementsAre(w1, w2));
  h.versions_.Commit();
  EXPECT_EQ(h.versions_.record_version(), record + 1);
  const v1::RunRecord r = h.CurrentRecord();
  EXPECT_EQ(r.last_completed_round(), 1u);
  EXPECT_EQ(r.model_hash(), kHashA);
  // The round's measurements went to the topology.
  v1::WorkerStatus w;
  h.topology_.FillWorker(w1, true, &w);
  EXPECT_DOUBLE_EQ(w.step_seconds(), 0.2);
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
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
  EXPECT_THAT(h.departed_, ElementsAre(ids[1]));
  EXPECT_FALSE(h.members_.Contains(ids[1]));
  EXPECT_EQ(h.rounds_.last_completed_round(), 1u);
  EXPECT_EQ(h.CurrentRecord().model_hash(), kHashA);
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
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

TEST(SyncRoundsTest, HeldRoundsDoNotStartUntilReleased) {
  Harness h(Options(1));
  const std::string w1 = h.Add(9001);
  Directives out;
  h.rounds_.HoldRounds(true, &out);
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  EXPECT_THAT(out, IsEmpty());
  EXPECT_EQ(h.rounds_.phase(), v1::WAITING_FOR_MEMBERS);
  h.rounds_.HoldRounds(false, &out);
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), ElementsAre(w1));
  EXPECT_EQ(h.rounds_.phase(), v1::TRAINING);
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
  EXPECT_EQ(h.rounds_.phase(), v1::WAITING_FOR_MEMBERS);
  // Nothing else changed the record: committing the call moves it no further.
  h.versions_.Commit();
  EXPECT_EQ(h.versions_.record_version(), before + 1);
  allow = true;
  out.clear();
  h.rounds_.HoldRounds(false, &out);
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundStart), ElementsAre(w1));
  EXPECT_EQ(h.rounds_.round(), 2u);
}

TEST(SyncRoundsTest, AParticipantNotReadyByTheDeadlineSitsTheRoundOut) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  ASSERT_TRUE(h.Ready(w1, 1, &out).ok());
  out.clear();
  h.clock_.Advance(absl::Seconds(59));
  h.rounds_.Tick(h.clock_.Now(), &out);
  EXPECT_THAT(out, IsEmpty());
  h.clock_.Advance(absl::Seconds(2));
  h.rounds_.Tick(h.clock_.Now(), &out);
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundMissed), ElementsAre(w2));
  // w1 goes on alone; w2 stays a member, queued for the next round.
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), ElementsAre(w1));
  EXPECT_TRUE(h.members_.Contains(w2));
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
}

TEST(SyncRoundsTest, LosingTheLastUnreadyParticipantSendsThePlanToTheRest) {
  Harness h(Options(2));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  ASSERT_TRUE(h.Ready(w1, 1, &out).ok());
  out.clear();
  h.rounds_.RemoveMember(w2, MemberState::kLeft, "session broke", &out);
  EXPECT_THAT(h.departed_, ElementsAre(w2));
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), ElementsAre(w1));
  EXPECT_EQ(h.rounds_.phase(), v1::SHARING);
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
}

TEST(SyncRoundsTest, TheLastRoundFinishesTheRunThroughTheHost) {
  Harness h(Options(1, /*rounds=*/1));
  const std::string w1 = h.Add(9001);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  out = h.Complete({w1}, 1, kHashA);
  EXPECT_EQ(h.finished_, "completed 1 rounds");
  EXPECT_EQ(h.rounds_.phase(), v1::FINISHED);
  EXPECT_THAT(To(out, CoordinatorMessage::kRunFinished), ElementsAre(w1));
}

TEST(SyncRoundsTest, AJoinerHoldingANewerRoundAfterARestartIsAdopted) {
  Harness h(Options(1));
  h.Add(9001, /*model_round=*/4, kHashB);
  EXPECT_EQ(h.rounds_.last_completed_round(), 4u);
  EXPECT_EQ(h.rounds_.round(), 5u);
  EXPECT_EQ(h.CurrentRecord().model_hash(), kHashB);
  v1::JoinResponse r;
  h.rounds_.FillJoinResponse(h.members_.At("w1"), &r);
  EXPECT_EQ(r.next_round(), 5u);
}

TEST(SyncRoundsTest, StatusSaysWhereEachWorkersRoundTimeGoes) {
  Harness h(Options(1));
  const std::string w1 = h.Add(9001);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  v1::WorkerStatus before;
  h.rounds_.FillWorker(w1, &before);
  EXPECT_EQ(before.train_share(), 0);
  EXPECT_EQ(before.rounds_in_flight(), 1u);
  ASSERT_TRUE(h.Ready(w1, 1, &out).ok());
  ASSERT_TRUE(h.Connected(w1, 1, &out).ok());
  h.clock_.Advance(absl::Seconds(10));
  v1::ReportRoundDoneRequest done;
  done.set_worker_id(w1);
  done.set_round(1);
  done.set_model_hash(kHashA);
  done.set_train_seconds(6);
  done.set_exchange_seconds(2);
  ASSERT_TRUE(h.rounds_.ReportRoundDone(h.members_.At(w1), done, &out).ok());
  ASSERT_EQ(h.rounds_.last_completed_round(), 1u);
  v1::WorkerStatus w;
  h.rounds_.FillWorker(w1, &w);
  EXPECT_DOUBLE_EQ(w.train_share(), 0.6);
  EXPECT_DOUBLE_EQ(w.exchange_share(), 0.2);
  EXPECT_NEAR(w.idle_share(), 0.2, 1e-12);
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

TEST(SyncRoundsTest, DamagedCheckpointNobodyHoldsTakesTheRunBackToTheNewestIntactOne) {
  Harness h(Options(2));
  h.rounds_.Resume(Resumed(/*six=*/true));
  h.checkpoints_.Resume(Resumed(/*six=*/true));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 9, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 9, &out).ok());
  ASSERT_EQ(h.rounds_.round(), 9u);
  out.clear();
  ASSERT_TRUE(h.rounds_.ReportReady(h.members_.At(w1), Unavailable(w1, 9, true), &out).ok());
  // Round 9 is aborted and round 7 starts from checkpoint run-s-r6.
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
  EXPECT_EQ(h.rounds_.last_completed_round(), 6u);
  v1::RunStatus s;
  h.rounds_.FillStatus(&s);
  EXPECT_THAT(s.base_fallback(), HasSubstr("checkpoint run-s-r8 is damaged"));
  EXPECT_THAT(s.base_fallback(), HasSubstr("went back to checkpoint run-s-r6 of round 6"));
  // The record goes back too, and forgets the damaged checkpoint.
  const v1::RunRecord record = h.CurrentRecord();
  EXPECT_EQ(record.last_completed_round(), 6u);
  EXPECT_EQ(record.checkpoint_id(), "run-s-r6");
  ASSERT_EQ(record.checkpoints_size(), 2);
  EXPECT_EQ(record.checkpoints(0).id(), "run-s-r6");
  EXPECT_EQ(record.checkpoints(1).id(), "run-s-r4");
  // The report of the other worker for the aborted round is refused.
  EXPECT_FALSE(h.rounds_.ReportReady(h.members_.At(w2), Unavailable(w2, 9, true), &out).ok());
  // Should run-s-r6 be damaged as well, the run goes back to run-s-r4.
  out.clear();
  ASSERT_TRUE(h.rounds_.ReportReady(h.members_.At(w2), Unavailable(w2, 7, true), &out).ok());
  EXPECT_EQ(h.rounds_.last_completed_round(), 4u);
  EXPECT_EQ(h.rounds_.round(), 5u);
  EXPECT_TRUE(h.failed_.empty());
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
}

TEST(SyncRoundsTest, DamagedCheckpointWithNoOlderOneStopsTheRunNamingIt) {
  Harness h(Options(1));
  h.rounds_.Resume(Resumed(/*six=*/false, /*four=*/false));
  h.checkpoints_.Resume(Resumed(/*six=*/false, /*four=*/false));
  const std::string w1 = h.Add(9001);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 9, &out).ok());
  out.clear();
  ASSERT_TRUE(h.rounds_.ReportReady(h.members_.At(w1), Unavailable(w1, 9, true), &out).ok());
  EXPECT_THAT(h.failed_, HasSubstr("checkpoint run-s-r8 is damaged"));
  EXPECT_THAT(h.failed_, HasSubstr("Restore checkpoint run-s-r8"));
  EXPECT_EQ(h.rounds_.phase(), v1::FINISHED);
  EXPECT_EQ(h.rounds_.last_completed_round(), 8u);  // no round completed on another model
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
  ASSERT_EQ(h.rounds_.round(), 3u);
  ASSERT_EQ(h.rounds_.phase(), v1::TRAINING);
  out.clear();
  ASSERT_TRUE(h.rounds_.ReportReady(h.members_.At(w3), Unavailable(w3, 3, false), &out).ok());
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundMissed), ElementsAre(w3));
  EXPECT_EQ(h.rounds_.last_completed_round(), 2u);
  EXPECT_TRUE(h.failed_.empty());
  // The others complete the round without it.
  out.clear();
  h.Complete({w1, w2}, 3, kHashA);
  EXPECT_EQ(h.rounds_.last_completed_round(), 3u);
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
  ASSERT_TRUE(h.rounds_.CheckJoin(declared).ok());
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out;
  ASSERT_TRUE(h.JoinRound(w1, 1, &out).ok());
  ASSERT_TRUE(h.JoinRound(w2, 1, &out).ok());
  ASSERT_EQ(h.rounds_.phase(), v1::TRAINING);
  const std::string w3 = h.Add(9003);
  out.clear();
  ASSERT_TRUE(h.JoinRound(w3, 1, &out).ok());
  ASSERT_THAT(To(out, CoordinatorMessage::kRoundStart), ElementsAre(w3));
  const v1::RoundStart& start = out[0].message->round_start();
  ASSERT_EQ(start.samples_size(), 1);
  EXPECT_EQ(start.samples(0).count(), 16u);
  EXPECT_EQ(start.samples(0).begin(), 32u);  // after w1's and w2's
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
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
  h.rounds_.OnHeartbeat(h.members_.At(ids[0]), hb);
  v1::WorkerStatus w;
  h.rounds_.FillWorker(ids[2], &w);
  EXPECT_DOUBLE_EQ(w.score(), 1.0);  // one reporter alone moves nothing
  h.rounds_.OnHeartbeat(h.members_.At(ids[1]), hb);
  w.Clear();
  h.rounds_.FillWorker(ids[2], &w);
  EXPECT_DOUBLE_EQ(w.score(), 0.75);
  ASSERT_EQ(w.score_reasons_size(), 1);
  EXPECT_THAT(w.score_reasons(0), HasSubstr("bad chunks to w1, w2"));
  // Below 0.8: banned, and evicted at the next tick.
  out.clear();
  h.rounds_.Tick(h.clock_.Now(), &out);
  EXPECT_THAT(To(out, CoordinatorMessage::kLeaveRequested), ElementsAre(ids[2]));
  EXPECT_FALSE(h.members_.Contains(ids[2]));
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
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
  v1::RunStatus s;
  h.rounds_.FillStatus(&s);
  EXPECT_THAT(s.detail(), HasSubstr("audits"));
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
      absl::Status st = h.rounds_.ReportAudit(h.members_.At(d.worker_id), r, &next);
      // Audits by a member banned meanwhile are gone.
      EXPECT_TRUE(st.ok() || absl::IsNotFound(st)) << st;
    }
    out.insert(out.end(), next.begin(), next.end());
    pending = std::move(next);
  }
  EXPECT_THAT(To(out, CoordinatorMessage::kLeaveRequested), ElementsAre(cheater));
  EXPECT_FALSE(h.members_.Contains(cheater));
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), UnorderedElementsAre(ids[0], ids[2]));
  h.rounds_.FillStatus(&s);
  ASSERT_EQ(s.bans_size(), 1);
  EXPECT_EQ(s.bans(0).worker_id(), cheater);
  EXPECT_THAT(s.bans(0).reason(), HasSubstr("failed audit"));
  v1::WorkerStatus honest;
  h.rounds_.FillWorker(ids[0], &honest);
  EXPECT_EQ(honest.audits_failed(), 0u);
  EXPECT_DOUBLE_EQ(honest.score(), 1.0);
  // Its re-join is refused with the reason.
  v1::JoinRequest again;
  again.set_previous_worker_id(cheater);
  absl::Status refused = h.rounds_.CheckJoin(again);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("banned"));
  // The record keeps the ban.
  EXPECT_EQ(h.CurrentRecord().bans_size(), 1);
  EXPECT_TRUE(h.rounds_.ConsistentForTesting());
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
  out.clear();
  h.clock_.Advance(absl::Seconds(61));
  h.rounds_.Tick(h.clock_.Now(), &out);
  EXPECT_THAT(To(out, CoordinatorMessage::kRoundPlan), UnorderedElementsAre(ids[0], ids[1]));
  v1::RunStatus s;
  h.rounds_.FillStatus(&s);
  EXPECT_EQ(s.audits_dropped(), 2u);
  EXPECT_EQ(s.audits_failed(), 0u);
}

}  // namespace audits

}  // namespace
}  // namespace shoal::coordinator
