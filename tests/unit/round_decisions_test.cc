// Unit tests of the round engine's pure decisions (round_decisions.h): each
// branch with the reason it gives. No engine, no clock object: time is a
// value passed in.
#include "services/coordinator/core/round_decisions.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

std::string Hash(char c) { return std::string(64, c); }

// ---------------------------------------------------------------- Admission

TEST(NextOpenRoundTest, CurrentRoundWhileWaitingOrTrainingWithNobodyReady) {
  EXPECT_EQ(NextOpenRound(v1::WAITING_FOR_MEMBERS, 4, false), 4u);
  EXPECT_EQ(NextOpenRound(v1::WAITING_FOR_MEMBERS, 4, true), 4u);
  EXPECT_EQ(NextOpenRound(v1::TRAINING, 4, false), 4u);
  EXPECT_EQ(NextOpenRound(v1::TRAINING, 4, true), 5u);
  EXPECT_EQ(NextOpenRound(v1::SHARING, 4, true), 5u);
}

AdmissionInput Admission(v1::Phase phase, uint64_t requested) {
  AdmissionInput in;
  in.phase = phase;
  in.round = 4;
  in.requested = requested;
  return in;
}

TEST(DecideAdmissionTest, FinishedRunRejects) {
  const AdmissionDecision d = DecideAdmission(Admission(v1::FINISHED, 4));
  EXPECT_EQ(d.action, AdmissionDecision::Action::kReject);
  EXPECT_EQ(d.reason, "run is finished");
}

TEST(DecideAdmissionTest, StaleRoundRejects) {
  const AdmissionDecision d = DecideAdmission(Admission(v1::TRAINING, 3));
  EXPECT_EQ(d.action, AdmissionDecision::Action::kReject);
  EXPECT_EQ(d.reason, "round 3 is stale: the run is at round 4");
}

TEST(DecideAdmissionTest, RoundBeyondTheNextRejects) {
  const AdmissionDecision d = DecideAdmission(Admission(v1::TRAINING, 6));
  EXPECT_EQ(d.action, AdmissionDecision::Action::kReject);
  EXPECT_EQ(d.reason, "round 6 is in the future: the run is at round 4");
}

TEST(DecideAdmissionTest, ParticipantIsAlreadyIn) {
  AdmissionInput in = Admission(v1::SHARING, 4);
  in.participant = true;
  const AdmissionDecision d = DecideAdmission(in);
  EXPECT_EQ(d.action, AdmissionDecision::Action::kAlreadyIn);
  EXPECT_EQ(d.round, 4u);
  EXPECT_EQ(d.reason, "already a participant of round 4");
}

TEST(DecideAdmissionTest, QueuedIsAlreadyInForTheRoundItWaitsFor) {
  AdmissionInput in = Admission(v1::WAITING_FOR_MEMBERS, 0);
  in.queued = true;
  AdmissionDecision d = DecideAdmission(in);
  EXPECT_EQ(d.action, AdmissionDecision::Action::kAlreadyIn);
  EXPECT_EQ(d.round, 4u);
  EXPECT_EQ(d.reason, "already queued for round 4");

  in.phase = v1::SHARING;
  d = DecideAdmission(in);
  EXPECT_EQ(d.action, AdmissionDecision::Action::kAlreadyIn);
  EXPECT_EQ(d.round, 5u);
  EXPECT_EQ(d.reason, "already queued for round 5");
}

TEST(DecideAdmissionTest, WaitingRunQueuesForThisRound) {
  // 0 is the earliest open round; the next one is fine too while waiting.
  for (uint64_t requested : {0, 4, 5}) {
    const AdmissionDecision d = DecideAdmission(Admission(v1::WAITING_FOR_MEMBERS, requested));
    EXPECT_EQ(d.action, AdmissionDecision::Action::kQueueForThisRound) << requested;
    EXPECT_EQ(d.round, 4u);
    EXPECT_EQ(d.reason, "round 4 has not started: queued for it");
  }
}

TEST(DecideAdmissionTest, TrainingWithNobodyReadyJoinsTheRunningRound) {
  for (uint64_t requested : {0, 4}) {
    const AdmissionDecision d = DecideAdmission(Admission(v1::TRAINING, requested));
    EXPECT_EQ(d.action, AdmissionDecision::Action::kJoinRunningRound) << requested;
    EXPECT_EQ(d.round, 4u);
    EXPECT_EQ(d.reason, "round 4 is training and nobody is ready yet: joins it");
  }
}

TEST(DecideAdmissionTest, ClosedJoinWindowQueuesForTheNextRound) {
  AdmissionInput in = Admission(v1::TRAINING, 4);
  in.any_ready = true;
  AdmissionDecision d = DecideAdmission(in);
  EXPECT_EQ(d.action, AdmissionDecision::Action::kQueueForNextRound);
  EXPECT_EQ(d.round, 5u);
  EXPECT_EQ(d.reason, "a participant of round 4 is already ready: queued for round 5");

  d = DecideAdmission(Admission(v1::SHARING, 0));
  EXPECT_EQ(d.action, AdmissionDecision::Action::kQueueForNextRound);
  EXPECT_EQ(d.round, 5u);
  EXPECT_EQ(d.reason, "round 4 is SHARING: queued for round 5");
}

TEST(DecideAdmissionTest, CarriedWorkOfTheRunningRoundJoinsItAfterTheWindowClosed) {
  // A worker that trained round 4 before its coordinator failed over
  // reports ready at once: it joins even though others are ready.
  AdmissionInput in = Admission(v1::TRAINING, 0);
  in.any_ready = true;
  in.carried = 4;
  AdmissionDecision d = DecideAdmission(in);
  EXPECT_EQ(d.action, AdmissionDecision::Action::kJoinRunningRound);
  EXPECT_EQ(d.round, 4u);
  // Work of another round, or a round already sharing, does not.
  in.carried = 3;
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kQueueForNextRound);
  in.carried = 4;
  in.phase = v1::SHARING;
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kQueueForNextRound);
  // While the round waits for members it is queued as anyone.
  in.phase = v1::WAITING_FOR_MEMBERS;
  EXPECT_EQ(DecideAdmission(in).action, AdmissionDecision::Action::kQueueForThisRound);
}

TEST(DecideAdmissionTest, AskingForTheNextRoundWhileTrainingQueuesForIt) {
  const AdmissionDecision d = DecideAdmission(Admission(v1::TRAINING, 5));
  EXPECT_EQ(d.action, AdmissionDecision::Action::kQueueForNextRound);
  EXPECT_EQ(d.round, 5u);
  EXPECT_EQ(d.reason, "asked for round 5: queued for round 5");
}

TEST(DecideRoundStartTest, StartsOnceMinParticipantsAreQueued) {
  RoundStartDecision d = DecideRoundStart(v1::WAITING_FOR_MEMBERS, 3, 1, 2);
  EXPECT_FALSE(d.start);
  EXPECT_EQ(d.reason, "1 of 2 participants needed for round 3");
  d = DecideRoundStart(v1::WAITING_FOR_MEMBERS, 3, 3, 2);
  EXPECT_TRUE(d.start);
  EXPECT_EQ(d.reason, "3 participants queued for round 3 (2 needed)");
}

TEST(DecideRoundStartTest, MinParticipantsZeroMeansOne) {
  RoundStartDecision d = DecideRoundStart(v1::WAITING_FOR_MEMBERS, 1, 0, 0);
  EXPECT_FALSE(d.start);
  EXPECT_EQ(d.reason, "0 of 1 participants needed for round 1");
  d = DecideRoundStart(v1::WAITING_FOR_MEMBERS, 1, 1, 0);
  EXPECT_TRUE(d.start);
  EXPECT_EQ(d.reason, "1 participants queued for round 1 (1 needed)");
}

TEST(DecideRoundStartTest, OnlyWhileWaitingForMembers) {
  const RoundStartDecision d = DecideRoundStart(v1::TRAINING, 3, 5, 2);
  EXPECT_FALSE(d.start);
  EXPECT_EQ(d.reason, "round 3 is TRAINING");
}

// ------------------------------------------------------- Connection barrier

ConnectionBarrierInput Barrier(size_t reported, size_t unreachable, uint32_t retries) {
  ConnectionBarrierInput in;
  in.round = 7;
  in.participants = 3;
  in.reported = reported;
  in.reported_unreachable = unreachable;
  in.retries = retries;
  return in;
}

TEST(DecideConnectionBarrierTest, AllConnectedStartsSharing) {
  for (ConnectionEvent event : {ConnectionEvent::kReport, ConnectionEvent::kDeadline}) {
    const ConnectionBarrierDecision d = DecideConnectionBarrier(Barrier(3, 0, 0), event, 2);
    EXPECT_EQ(d.action, ConnectionBarrierDecision::Action::kStartSharing);
    EXPECT_EQ(d.reason, "all 3 participants reached their peers");
  }
}

TEST(DecideConnectionBarrierTest, MissingReportsWaitUntilTheDeadline) {
  const ConnectionBarrierDecision d =
      DecideConnectionBarrier(Barrier(2, 1, 0), ConnectionEvent::kReport, 2);
  EXPECT_EQ(d.action, ConnectionBarrierDecision::Action::kWait);
  EXPECT_EQ(d.reason, "2/3 participants reported");
}

TEST(DecideConnectionBarrierTest, DeadlineWithMissingReportsRetries) {
  const ConnectionBarrierDecision d =
      DecideConnectionBarrier(Barrier(2, 0, 1), ConnectionEvent::kDeadline, 2);
  EXPECT_EQ(d.action, ConnectionBarrierDecision::Action::kRetry);
  EXPECT_EQ(d.reason, "connection deadline passed with 2/3 participants reported: retry 2/2");
}

TEST(DecideConnectionBarrierTest, CompleteBarrierWithUnreachablePeersRetriesAtOnce) {
  const ConnectionBarrierDecision d =
      DecideConnectionBarrier(Barrier(3, 1, 0), ConnectionEvent::kReport, 2);
  EXPECT_EQ(d.action, ConnectionBarrierDecision::Action::kRetry);
  EXPECT_EQ(d.reason, "all 3 participants reported, 1 with unreachable peers: retry 1/2");
}

TEST(DecideConnectionBarrierTest, OutOfRetriesEvictsTheFailingPeers) {
  for (ConnectionEvent event : {ConnectionEvent::kReport, ConnectionEvent::kDeadline}) {
    const ConnectionBarrierDecision d = DecideConnectionBarrier(Barrier(3, 2, 2), event, 2);
    EXPECT_EQ(d.action, ConnectionBarrierDecision::Action::kEvictFailing);
    EXPECT_EQ(d.reason, "could not connect with the peers of round 7 after 2 retries");
  }
  // No retries at all: the first failure evicts.
  const ConnectionBarrierDecision d =
      DecideConnectionBarrier(Barrier(1, 0, 0), ConnectionEvent::kDeadline, 0);
  EXPECT_EQ(d.action, ConnectionBarrierDecision::Action::kEvictFailing);
  EXPECT_EQ(d.reason, "could not connect with the peers of round 7 after 0 retries");
}

// Unreachable lists must outlive the PeerReports that view them.
struct Reports {
  std::vector<std::vector<std::string>> unreachable;
  std::vector<PeerReport> reports;
  Reports& Add(const char* id, bool reported, std::vector<std::string> names = {}) {
    unreachable.reserve(16);  // keeps earlier spans valid
    unreachable.push_back(std::move(names));
    reports.push_back({id, reported, unreachable.back()});
    return *this;
  }
};

TEST(FindFailingPeersTest, NobodyFailsWhenEveryoneConnected) {
  Reports r;
  r.Add("w1", true).Add("w2", true);
  const FailingPeers f = FindFailingPeers(r.reports);
  EXPECT_THAT(f.failing, IsEmpty());
  EXPECT_EQ(f.reason, "every participant reported and nobody is unreachable");
}

TEST(FindFailingPeersTest, SilentParticipantsFail) {
  Reports r;
  r.Add("w1", true).Add("w2", false).Add("w3", true).Add("w4", false);
  const FailingPeers f = FindFailingPeers(r.reports);
  EXPECT_THAT(f.failing, ElementsAre("w2", "w4"));
  EXPECT_EQ(f.reason, "did not report: w2,w4");
}

TEST(FindFailingPeersTest, PeerNamedByAMajorityOfTheReportersFails) {
  Reports r;
  r.Add("w1", true, {"w3"}).Add("w2", true, {"w3"}).Add("w3", true).Add("w4", false);
  const FailingPeers f = FindFailingPeers(r.reports);
  // w3 is named by 2 of the 2 other reporters; w4 did not report.
  EXPECT_THAT(f.failing, ElementsAre("w3", "w4"));
  EXPECT_EQ(f.reason, "did not report: w4; unreachable for a majority of the reporting peers: w3");
}

TEST(FindFailingPeersTest, OneWorkerThatReachesNobodyIsBlamedItself) {
  // w1 names both others; each is named by 1 of 2 other reporters (no strict
  // majority), so rule 2 applies: w1 cannot reach most of the others.
  Reports r;
  r.Add("w1", true, {"w2", "w3"}).Add("w2", true).Add("w3", true);
  const FailingPeers f = FindFailingPeers(r.reports);
  EXPECT_THAT(f.failing, ElementsAre("w1"));
  EXPECT_EQ(f.reason, "cannot reach most of the other participants: w1");
}

TEST(FindFailingPeersTest, TwoWorkersThatCannotReachEachOtherAreBothBlamed) {
  // Each names the other, the only other reporter: 2 * 1 > 1 is a strict
  // majority, so rule 1 already blames both.
  Reports two;
  two.Add("w2", true, {"w1"}).Add("w1", true, {"w2"});
  FailingPeers f = FindFailingPeers(two.reports);
  EXPECT_THAT(f.failing, ElementsAre("w2", "w1"));
  EXPECT_EQ(f.reason, "unreachable for a majority of the reporting peers: w2,w1");

  // Among four, w1 and w2 cannot reach each other: nobody is named by a
  // majority, nobody misses most peers; rule 3 blames both, by id.
  Reports four;
  four.Add("w4", true).Add("w2", true, {"w1"}).Add("w1", true, {"w2"}).Add("w3", true);
  f = FindFailingPeers(four.reports);
  EXPECT_THAT(f.failing, ElementsAre("w1", "w2"));
  EXPECT_EQ(f.reason, "no majority names anyone; named unreachable at least once: w1,w2");
}

// ---------------------------------------------------------------- Hash vote

TEST(DecideHashVoteTest, UnanimousHashIsAgreed) {
  const std::string a = Hash('a');
  const std::vector<HashReport> reports = {{"w1", a}, {"w2", a}, {"w3", a}};
  const HashVote v = DecideHashVote(reports);
  EXPECT_EQ(v.outcome, HashVote::Outcome::kAgreed);
  EXPECT_EQ(v.hash, a);
  EXPECT_THAT(v.minority, IsEmpty());
  EXPECT_EQ(v.reason, "3 of 3 participants agree on hash aaaaaaaaaaaa");
}

TEST(DecideHashVoteTest, SingleParticipantIsAgreed) {
  const std::string b = Hash('b');
  const std::vector<HashReport> reports = {{"w1", b}};
  const HashVote v = DecideHashVote(reports);
  EXPECT_EQ(v.outcome, HashVote::Outcome::kAgreed);
  EXPECT_EQ(v.hash, b);
  EXPECT_EQ(v.reason, "1 of 1 participants agree on hash bbbbbbbbbbbb");
}

TEST(DecideHashVoteTest, StrictMajorityWinsAndTheMinorityIsOut) {
  const std::string a = Hash('a'), b = Hash('b'), c = Hash('c');
  const std::vector<HashReport> reports = {{"w1", b}, {"w2", a}, {"w3", b}, {"w4", c}, {"w5", b}};
  const HashVote v = DecideHashVote(reports);
  EXPECT_EQ(v.outcome, HashVote::Outcome::kAgreed);
  EXPECT_EQ(v.hash, b);
  EXPECT_THAT(v.minority, ElementsAre("w2", "w4"));
  EXPECT_EQ(v.reason, "3 of 5 participants agree on hash bbbbbbbbbbbb; out of sync: w2,w4");
}

TEST(DecideHashVoteTest, TieAborts) {
  const std::string a = Hash('a'), b = Hash('b');
  const std::vector<HashReport> reports = {{"w1", a}, {"w2", b}, {"w3", a}, {"w4", b}};
  const HashVote v = DecideHashVote(reports);
  EXPECT_EQ(v.outcome, HashVote::Outcome::kNoMajority);
  EXPECT_THAT(v.minority, IsEmpty());
  EXPECT_EQ(v.reason, "participants reported different model hashes with no majority");
}

TEST(DecideHashVoteTest, PluralityWithoutStrictMajorityAborts) {
  const std::string a = Hash('a'), b = Hash('b'), c = Hash('c');
  const std::vector<HashReport> reports = {{"w1", a}, {"w2", a}, {"w3", b}, {"w4", c}};
  const HashVote v = DecideHashVote(reports);
  EXPECT_EQ(v.outcome, HashVote::Outcome::kNoMajority);
  EXPECT_EQ(v.reason, "participants reported different model hashes with no majority");
}

TEST(DecideHashVoteTest, NoReportsIsNoMajority) {
  const HashVote v = DecideHashVote({});
  EXPECT_EQ(v.outcome, HashVote::Outcome::kNoMajority);
  EXPECT_EQ(v.reason, "no participant reported a hash");
}

// ---------------------------------------------------------- Round deadlines

TEST(StageOfTest, MapsPhaseAndSharingStarted) {
  EXPECT_EQ(StageOf(v1::WAITING_FOR_MEMBERS, false), RoundStage::kWaitingForMembers);
  EXPECT_EQ(StageOf(v1::TRAINING, false), RoundStage::kTraining);
  EXPECT_EQ(StageOf(v1::SHARING, false), RoundStage::kConnecting);
  EXPECT_EQ(StageOf(v1::SHARING, true), RoundStage::kSharing);
  EXPECT_EQ(StageOf(v1::FINISHED, false), RoundStage::kFinished);
}

RoundDeadlineInput Deadline(RoundStage stage, std::vector<std::string> late) {
  RoundDeadlineInput in;
  in.stage = stage;
  in.deadline = kNow;
  in.participants = 3;
  in.late = std::move(late);
  return in;
}

TEST(DecideRoundDeadlineTest, NoDeadlineWhileWaitingOrFinished) {
  for (RoundStage stage : {RoundStage::kWaitingForMembers, RoundStage::kFinished}) {
    const RoundDeadlineDecision d =
        DecideRoundDeadline(Deadline(stage, {}), absl::Seconds(60), kNow + absl::Hours(1));
    EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kNone);
    EXPECT_EQ(d.reason, "no deadline in this phase");
  }
}

TEST(DecideRoundDeadlineTest, NothingBeforeTheDeadline) {
  const RoundDeadlineDecision d = DecideRoundDeadline(Deadline(RoundStage::kTraining, {"w1"}),
                                                      absl::Seconds(60), kNow - absl::Seconds(5));
  EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kNone);
  EXPECT_EQ(d.reason, "deadline in 5s");
}

TEST(DecideRoundDeadlineTest, TrainingLateParticipantsSitOut) {
  // The deadline itself counts as passed.
  const RoundDeadlineDecision d =
      DecideRoundDeadline(Deadline(RoundStage::kTraining, {"w2"}), absl::Seconds(60), kNow);
  EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kSitOut);
  EXPECT_THAT(d.sit_out, ElementsAre("w2"));
  EXPECT_EQ(d.reason, "not ready within --round_timeout=1m");
}

TEST(DecideRoundDeadlineTest, TrainingWithNobodyReadyKeepsWaiting) {
  const RoundDeadlineDecision d = DecideRoundDeadline(
      Deadline(RoundStage::kTraining, {"w1", "w2", "w3"}), absl::Seconds(60), kNow);
  EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kKeepWaiting);
  EXPECT_THAT(d.sit_out, IsEmpty());
  EXPECT_EQ(d.reason, "no participant ready after 1m; still waiting");
}

TEST(DecideRoundDeadlineTest, ConnectingHandsOverToTheBarrier) {
  const RoundDeadlineDecision d =
      DecideRoundDeadline(Deadline(RoundStage::kConnecting, {}), absl::Seconds(60), kNow);
  EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kConnectionBarrier);
  EXPECT_EQ(d.reason, "connection deadline passed");
}

TEST(DecideRoundDeadlineTest, SharingLateParticipantsSitOut) {
  const RoundDeadlineDecision d = DecideRoundDeadline(Deadline(RoundStage::kSharing, {"w1", "w3"}),
                                                      absl::Seconds(60), kNow + absl::Seconds(1));
  EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kSitOut);
  EXPECT_THAT(d.sit_out, ElementsAre("w1", "w3"));
  EXPECT_EQ(d.reason, "did not finish sharing within --round_timeout");
}

TEST(DecideRoundDeadlineTest, SharingWithNobodyDoneAborts) {
  const RoundDeadlineDecision d = DecideRoundDeadline(
      Deadline(RoundStage::kSharing, {"w1", "w2", "w3"}), absl::Seconds(60), kNow);
  EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kAbort);
  EXPECT_EQ(d.reason, "no participant finished sharing within --round_timeout");
}

MissedRoundInput Missed(uint32_t before, bool adaptive = false, bool alive = true) {
  MissedRoundInput in;
  in.missed_before = before;
  in.adaptive = adaptive;
  in.alive = alive;
  return in;
}

TEST(DecideMissedRoundTest, SitsOutBelowTheLimit) {
  const MissedRoundDecision d = DecideMissedRound(Missed(1), 3, "not ready");
  EXPECT_FALSE(d.evict);
  EXPECT_TRUE(d.counts);
  EXPECT_EQ(d.missed_in_row, 2u);
  EXPECT_EQ(d.reason, "not ready");
}

TEST(DecideMissedRoundTest, EvictsAtTheLimit) {
  const MissedRoundDecision d = DecideMissedRound(Missed(2), 3, "not ready");
  EXPECT_TRUE(d.evict);
  EXPECT_EQ(d.missed_in_row, 3u);
  EXPECT_EQ(d.reason, "missed 3 rounds in a row (last: not ready)");
}

TEST(DecideMissedRoundTest, ZeroLimitNeverEvicts) {
  const MissedRoundDecision d = DecideMissedRound(Missed(99), 0, "late");
  EXPECT_FALSE(d.evict);
  EXPECT_EQ(d.reason, "late");
}

TEST(DecideMissedRoundTest, SlowButAliveIsNeverEvictedAndDoesNotCount) {
  // However many adaptive deadlines it missed, a live worker stays.
  const MissedRoundDecision d = DecideMissedRound(Missed(2, /*adaptive=*/true), 3, "slow");
  EXPECT_FALSE(d.evict);
  EXPECT_FALSE(d.counts);
  EXPECT_EQ(d.missed_in_row, 2u);
  EXPECT_EQ(d.reason, "slow");
}

TEST(DecideMissedRoundTest, AdaptiveMissOfADeadMemberCounts) {
  const MissedRoundDecision d =
      DecideMissedRound(Missed(2, /*adaptive=*/true, /*alive=*/false), 3, "slow");
  EXPECT_TRUE(d.evict);
  EXPECT_TRUE(d.counts);
  EXPECT_EQ(d.missed_in_row, 3u);
}

// ------------------------------------------------------ Adaptive deadline

AdaptiveDeadlineOptions Adaptive() {
  AdaptiveDeadlineOptions o;
  o.enabled = true;
  o.after_rounds = 3;
  o.factor = 2.0;
  o.floor = absl::Seconds(2);
  o.round_timeout = absl::Seconds(120);
  return o;
}

ReadyDeadlineInput Ready(std::vector<absl::Duration> measured, size_t participants = 3) {
  ReadyDeadlineInput in;
  in.round_started = kNow;
  in.hard_deadline = kNow + absl::Seconds(120);
  in.measured = std::move(measured);
  in.participants = participants;
  return in;
}

TEST(MedianDurationTest, OddEvenAndEmpty) {
  EXPECT_EQ(MedianDuration({}), absl::ZeroDuration());
  EXPECT_EQ(MedianDuration({absl::Seconds(9), absl::Seconds(1), absl::Seconds(3)}),
            absl::Seconds(3));
  EXPECT_EQ(
      MedianDuration({absl::Seconds(4), absl::Seconds(1), absl::Seconds(2), absl::Seconds(100)}),
      absl::Seconds(3));
}

TEST(DecideReadyDeadlineTest, OffKeepsRoundTimeout) {
  AdaptiveDeadlineOptions o = Adaptive();
  o.enabled = false;
  const ReadyDeadlineDecision d = DecideReadyDeadline(Ready({absl::Seconds(1)}), o, kNow);
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(120));
  EXPECT_FALSE(d.adaptive);
  EXPECT_EQ(d.reason, "--round_timeout=2m (adaptive deadline off)");
}

TEST(DecideReadyDeadlineTest, NobodyMeasuredYetKeepsRoundTimeout) {
  const ReadyDeadlineDecision d = DecideReadyDeadline(Ready({}), Adaptive(), kNow);
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(120));
  EXPECT_FALSE(d.adaptive);
  EXPECT_EQ(d.reason, "--round_timeout=2m: no participant measured in 3 rounds yet");
}

TEST(DecideReadyDeadlineTest, FactorTimesTheMedianOfTheMeasured) {
  // The slow participant (40 s) does not move the median.
  const ReadyDeadlineDecision d = DecideReadyDeadline(
      Ready({absl::Seconds(3), absl::Seconds(40), absl::Seconds(4)}), Adaptive(), kNow);
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(8));
  EXPECT_TRUE(d.adaptive);
  EXPECT_EQ(d.reason, "adaptive 8s = 2 x median ready time 4s of 3/3 measured participants");
}

TEST(DecideReadyDeadlineTest, FloorForFastRounds) {
  const ReadyDeadlineDecision d = DecideReadyDeadline(
      Ready({absl::Milliseconds(200), absl::Milliseconds(300)}, 4), Adaptive(), kNow);
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(2));
  EXPECT_TRUE(d.adaptive);
  EXPECT_EQ(d.reason,
            "adaptive 2s = 2 x median ready time 250ms of 2/4 measured participants, floor 2s");
}

TEST(DecideReadyDeadlineTest, NeverLaterThanRoundTimeout) {
  const ReadyDeadlineDecision d = DecideReadyDeadline(Ready({absl::Seconds(70)}), Adaptive(), kNow);
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(120));
  EXPECT_FALSE(d.adaptive);
  EXPECT_EQ(d.reason,
            "--round_timeout=2m: 2 x median ready time 1m10s of 1/3 measured participants is not "
            "shorter");
}

TEST(DecideReadyDeadlineTest, FactorBelowOneCountsAsOne) {
  AdaptiveDeadlineOptions o = Adaptive();
  o.factor = 0.5;
  const ReadyDeadlineDecision d = DecideReadyDeadline(Ready({absl::Seconds(10)}), o, kNow);
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(10));
}

TEST(DecideReadyDeadlineTest, SlowFirstReadyReportStretchesIt) {
  // Everyone is slower this round: the first report came after 6 s while
  // the history says 2 s; the others get 2 x 6 s, not 4 s.
  ReadyDeadlineInput in = Ready({absl::Seconds(2), absl::Seconds(2)});
  in.first_ready = absl::Seconds(6);
  const ReadyDeadlineDecision d = DecideReadyDeadline(in, Adaptive(), kNow + absl::Seconds(6));
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(12));
  EXPECT_TRUE(d.adaptive);
  EXPECT_EQ(d.reason, "adaptive 12s = 2 x first ready report of this round after 6s (median 2s)");
}

TEST(DecideReadyDeadlineTest, FastFirstReadyReportChangesNothing) {
  ReadyDeadlineInput in = Ready({absl::Seconds(5)});
  in.first_ready = absl::Seconds(1);
  const ReadyDeadlineDecision d = DecideReadyDeadline(in, Adaptive(), kNow + absl::Seconds(1));
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(10));
  EXPECT_TRUE(d.adaptive);
}

TEST(DecideReadyDeadlineTest, NobodyReadyByTheAdaptiveDeadlineWaitsForRoundTimeout) {
  // A fake clock past the adaptive deadline with no ready report.
  const ReadyDeadlineInput in = Ready({absl::Seconds(3)});
  EXPECT_TRUE(DecideReadyDeadline(in, Adaptive(), kNow + absl::Seconds(5)).adaptive);
  const ReadyDeadlineDecision d = DecideReadyDeadline(in, Adaptive(), kNow + absl::Seconds(6));
  EXPECT_EQ(d.deadline, kNow + absl::Seconds(120));
  EXPECT_FALSE(d.adaptive);
  EXPECT_EQ(d.reason,
            "--round_timeout=2m: nobody ready by the adaptive deadline 6s; waiting for the first "
            "ready report");
}

TEST(DecideReadyDeadlineTest, FirstReadyAfterRoundTimeoutKeepsTheExtendedWait) {
  // Nobody was ready within 2 min, the wait was extended to 4 min; the
  // first report at 3 min cannot set an adaptive deadline in the past.
  ReadyDeadlineInput in = Ready({absl::Seconds(3)});
  in.hard_deadline = kNow + absl::Minutes(4);
  in.first_ready = absl::Minutes(3);
  const ReadyDeadlineDecision d = DecideReadyDeadline(in, Adaptive(), kNow + absl::Minutes(3));
  EXPECT_EQ(d.deadline, kNow + absl::Minutes(4));
  EXPECT_FALSE(d.adaptive);
}

TEST(DecideRoundDeadlineTest, AdaptiveSitOutSaysWhy) {
  RoundDeadlineInput in = Deadline(RoundStage::kTraining, {"w3"});
  in.adaptive = true;
  in.adaptive_reason = "adaptive 8s = 2 x median ready time 4s of 3/3 measured participants";
  const RoundDeadlineDecision d = DecideRoundDeadline(in, absl::Seconds(60), kNow);
  EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kSitOut);
  EXPECT_TRUE(d.adaptive);
  EXPECT_THAT(d.sit_out, ElementsAre("w3"));
  EXPECT_EQ(d.reason,
            "not ready within the adaptive deadline (adaptive 8s = 2 x median ready time 4s of "
            "3/3 measured participants; --round_timeout=1m is its upper bound)");
}

TEST(DecideRoundDeadlineTest, AdaptiveWithNobodyReadyKeepsWaiting) {
  RoundDeadlineInput in = Deadline(RoundStage::kTraining, {"w1", "w2", "w3"});
  in.adaptive = true;
  const RoundDeadlineDecision d = DecideRoundDeadline(in, absl::Seconds(60), kNow);
  EXPECT_EQ(d.action, RoundDeadlineDecision::Action::kKeepWaiting);
  EXPECT_TRUE(d.adaptive);
}

// ------------------------------------------------------------------- Leases

TEST(DecideLeaseTest, OpenSessionHoldsUntilTheLeasePasses) {
  const absl::Duration lease = absl::Seconds(10), grace = absl::Seconds(20);
  LeaseDecision d = DecideLease(true, kNow, lease, grace, kNow + absl::Seconds(10));
  EXPECT_FALSE(d.expired);
  EXPECT_EQ(d.reason, "lease holds");
  d = DecideLease(true, kNow, lease, grace, kNow + absl::Seconds(11));
  EXPECT_TRUE(d.expired);
  EXPECT_EQ(d.reason, "no heartbeat for 11s");
}

TEST(DecideLeaseTest, NoSessionHoldsForTheGrace) {
  const absl::Duration lease = absl::Seconds(10), grace = absl::Seconds(20);
  LeaseDecision d = DecideLease(false, kNow, lease, grace, kNow + absl::Seconds(15));
  EXPECT_FALSE(d.expired);
  EXPECT_EQ(d.reason, "lease holds");
  d = DecideLease(false, kNow, lease, grace, kNow + absl::Seconds(21));
  EXPECT_TRUE(d.expired);
  EXPECT_EQ(d.reason, "no session opened within 20s");
}

// -------------------------------------------------------------- Checkpoints

CheckpointWatch Watch(bool active) {
  CheckpointWatch w;
  w.pending_round = 6;
  w.worker_id = "w2";
  w.worker_active = active;
  w.since = kNow;
  return w;
}

TEST(DecideCheckpointWatchTest, NothingPending) {
  const CheckpointWatchDecision d =
      DecideCheckpointWatch(CheckpointWatch(), absl::Seconds(120), kNow);
  EXPECT_FALSE(d.reassign);
  EXPECT_EQ(d.reason, "no upload in progress");
}

TEST(DecideCheckpointWatchTest, InProgressWithinTheTimeout) {
  const CheckpointWatchDecision d =
      DecideCheckpointWatch(Watch(true), absl::Seconds(120), kNow + absl::Seconds(120));
  EXPECT_FALSE(d.reassign);
  EXPECT_EQ(d.reason, "upload of round 6 by w2 in progress");
}

TEST(DecideCheckpointWatchTest, TimedOutUploadMoves) {
  const CheckpointWatchDecision d =
      DecideCheckpointWatch(Watch(true), absl::Seconds(120), kNow + absl::Seconds(121));
  EXPECT_TRUE(d.reassign);
  EXPECT_EQ(d.reason, "upload of round 6 by w2 not reported within 2m");
}

TEST(DecideCheckpointWatchTest, GoneUploaderMovesAtOnce) {
  const CheckpointWatchDecision d = DecideCheckpointWatch(Watch(false), absl::Seconds(120), kNow);
  EXPECT_TRUE(d.reassign);
  EXPECT_EQ(d.reason, "uploader w2 of round 6 is no member any more");
}

TEST(DecideCheckpointUploaderTest, FirstUntriedHolderInOrder) {
  const std::vector<CheckpointCandidate> members = {
      {"w1", true}, {"w2", false}, {"w3", true}, {"w4", true}};
  CheckpointUploaderDecision d = DecideCheckpointUploader(members, {}, 1);
  EXPECT_EQ(d.action, CheckpointUploaderDecision::Action::kAssign);
  EXPECT_EQ(d.worker_id, "w1");
  EXPECT_EQ(d.reason, "w1 holds the model and was not tried yet");

  d = DecideCheckpointUploader(members, {"w1"}, 1);
  EXPECT_EQ(d.action, CheckpointUploaderDecision::Action::kAssign);
  EXPECT_EQ(d.worker_id, "w3");
}

TEST(DecideCheckpointUploaderTest, NoUntriedHolderLeft) {
  const std::vector<CheckpointCandidate> members = {{"w1", true}, {"w2", false}};
  const CheckpointUploaderDecision d = DecideCheckpointUploader(members, {"w1"}, 1);
  EXPECT_EQ(d.action, CheckpointUploaderDecision::Action::kNoneLeft);
  EXPECT_EQ(d.worker_id, "");
  EXPECT_EQ(d.reason, "no untried worker holds the model");
}

TEST(DecideCheckpointUploaderTest, GivesUpAfterCheckpointersPlusTwoAttempts) {
  const std::vector<CheckpointCandidate> members = {{"w9", true}};
  const std::set<std::string> three = {"w1", "w2", "w3"};
  // checkpointers 0 counts as 1: 3 attempts.
  CheckpointUploaderDecision d = DecideCheckpointUploader(members, three, 0);
  EXPECT_EQ(d.action, CheckpointUploaderDecision::Action::kGiveUp);
  EXPECT_EQ(d.reason, "failed 3 times (at most 3 attempts)");
  // With 2 checkpointers a fourth attempt is allowed.
  d = DecideCheckpointUploader(members, three, 2);
  EXPECT_EQ(d.action, CheckpointUploaderDecision::Action::kAssign);
  EXPECT_EQ(d.worker_id, "w9");
}

// ------------------------------------------------------------ Late work

FoldedReadyInput Fold(uint64_t folded_base_round, double weight) {
  FoldedReadyInput in;
  in.fold_late_work = true;
  in.max_staleness = 3;
  in.round = 6;
  in.base_round = 5;
  in.folded_base_round = folded_base_round;
  in.folded_trained_round = folded_base_round + 1;
  in.folded_weight = weight;
  return in;
}

TEST(CheckFoldedReadyTest, StalenessIsTheBaseDistanceAndTheWeightTheRule) {
  absl::StatusOr<FoldedReady> f = CheckFoldedReady(Fold(4, 0.5));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->staleness, 1u);
  EXPECT_DOUBLE_EQ(f->weight, 0.5);
  f = CheckFoldedReady(Fold(2, 0.25));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->staleness, 3u);
  // A missed round run again on the same base: staleness 0, full weight.
  FoldedReadyInput same = Fold(5, 1.0);
  same.folded_trained_round = 6;
  f = CheckFoldedReady(same);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->staleness, 0u);
}

TEST(CheckFoldedReadyTest, RefusesWhatTheRuleDoesNotAllow) {
  FoldedReadyInput off = Fold(4, 0.5);
  off.fold_late_work = false;
  EXPECT_EQ(CheckFoldedReady(off).status().code(), absl::StatusCode::kFailedPrecondition);
  // Over the cap (staleness 4 > 3).
  EXPECT_EQ(CheckFoldedReady(Fold(1, 0.2)).status().code(), absl::StatusCode::kInvalidArgument);
  // Another weight.
  EXPECT_EQ(CheckFoldedReady(Fold(4, 1.0)).status().code(), absl::StatusCode::kInvalidArgument);
  // A base newer than the round's.
  EXPECT_EQ(CheckFoldedReady(Fold(6, 1.0)).status().code(), absl::StatusCode::kInvalidArgument);
  // Trained for a round not after its base, or after this one.
  FoldedReadyInput bad = Fold(4, 0.5);
  bad.folded_trained_round = 4;
  EXPECT_EQ(CheckFoldedReady(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.folded_trained_round = 7;
  EXPECT_EQ(CheckFoldedReady(bad).status().code(), absl::StatusCode::kInvalidArgument);
  // Not a number.
  EXPECT_EQ(CheckFoldedReady(Fold(4, std::nan(""))).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::coordinator
