// The audit draw, the choice of auditors, the verdicts with their second
// opinion, the score rule and bans (services/coordinator/core/round_trust.h).
#include "services/coordinator/core/round_trust.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace shoal::coordinator {
namespace {

using Kind = RoundTrust::Verdict::Kind;

const std::string kHashA(64, 'a');
const std::string kHashB(64, 'b');
const std::string kHashC(64, 'c');

shoal::v1::TrustConfig Config(double rate, double ban_below = 0.5) {
  shoal::v1::TrustConfig c;
  c.set_audit_rate(rate);
  c.set_audit_threads(1);
  c.set_ban_below(ban_below);
  c.set_ban_seconds(60);
  return c;
}

shoal::v1::JoinRequest Join(const std::string& name, const std::string& fingerprint = "fp") {
  shoal::v1::JoinRequest j;
  j.set_name(name);
  j.set_replay_fingerprint(fingerprint);
  return j;
}

shoal::v1::ReportReadyRequest Ready(const std::string& hash) {
  shoal::v1::ReportReadyRequest r;
  r.set_contribution_hash(hash);
  return r;
}

shoal::v1::ReportAuditRequest Report(uint64_t round, uint64_t id, const std::string& hash) {
  shoal::v1::ReportAuditRequest r;
  r.set_round(round);
  r.set_audit_id(id);
  r.set_replay_hash(hash);
  return r;
}

std::vector<shoal::v1::SampleRange> Samples() {
  shoal::v1::SampleRange s;
  s.set_epoch(0);
  s.set_begin(64);
  s.set_count(64);
  return {s};
}

// Three members of one fingerprint, all ready with hashes A, B, C; round 1.
RoundTrust ThreeReady(double rate) {
  RoundTrust t(Config(rate), "secret");
  t.OnJoined("w1", Join("one"));
  t.OnJoined("w2", Join("two"));
  t.OnJoined("w3", Join("three"));
  t.StartRound(1);
  t.OnReady("w1", Ready(kHashA), Samples());
  t.OnReady("w2", Ready(kHashB), Samples());
  t.OnReady("w3", Ready(kHashC), Samples());
  return t;
}

TEST(AuditDrawTest, RateBoundsAndFrequency) {
  int drawn = 0;
  for (uint64_t round = 1; round <= 2000; ++round) {
    for (const char* id : {"w1", "w2", "w3", "w4", "w5"}) {
      EXPECT_FALSE(AuditDrawn("s", round, id, 0));
      EXPECT_TRUE(AuditDrawn("s", round, id, 1));
      drawn += AuditDrawn("s", round, id, 0.2);
    }
  }
  // 10,000 draws at 0.2: 2,000 expected, sd 40.
  EXPECT_GT(drawn, 1800);
  EXPECT_LT(drawn, 2200);
}

TEST(AuditDrawTest, TheSecretDecides) {
  int same = 0;
  for (uint64_t round = 1; round <= 1000; ++round) {
    EXPECT_EQ(AuditDrawn("one", round, "w1", 0.5), AuditDrawn("one", round, "w1", 0.5));
    same += AuditDrawn("one", round, "w1", 0.5) == AuditDrawn("two", round, "w1", 0.5);
  }
  // Independent draws agree about half the time, not always.
  EXPECT_GT(same, 400);
  EXPECT_LT(same, 600);
}

TEST(RoundTrustTest, EveryParticipantAuditedByAnotherAtRateOne) {
  RoundTrust t = ThreeReady(1);
  const auto a = t.Assign(0, kHashA, {"w1", "w2", "w3"});
  ASSERT_EQ(a.size(), 3u);
  std::vector<std::string> auditors;
  for (const auto& x : a) {
    EXPECT_NE(x.auditor, x.request.participant());
    EXPECT_EQ(x.request.round(), 1u);
    EXPECT_EQ(x.request.base_model_hash(), kHashA);
    ASSERT_EQ(x.request.samples_size(), 1);
    EXPECT_EQ(x.request.samples(0).begin(), 64u);
    auditors.push_back(x.auditor);
  }
  // The least busy first: each member audits one.
  std::sort(auditors.begin(), auditors.end());
  EXPECT_EQ(auditors, (std::vector<std::string>{"w1", "w2", "w3"}));
  EXPECT_TRUE(t.Pending());
  // Once per round.
  EXPECT_TRUE(t.Assign(0, kHashA, {"w1", "w2", "w3"}).empty());
}

TEST(RoundTrustTest, NoAuditorOfTheSameFingerprintDropsThePair) {
  RoundTrust t(Config(1), "secret");
  t.OnJoined("w1", Join("one", "build 1"));
  t.OnJoined("w2", Join("two", "build 2"));
  t.StartRound(1);
  t.OnReady("w1", Ready(kHashA), Samples());
  t.OnReady("w2", Ready(kHashB), Samples());
  EXPECT_TRUE(t.Assign(0, kHashA, {"w1", "w2"}).empty());
  EXPECT_FALSE(t.Pending());
  EXPECT_EQ(t.audits_dropped(), 2u);
}

TEST(RoundTrustTest, AMatchingReplayPasses) {
  RoundTrust t = ThreeReady(1);
  for (const auto& a : t.Assign(0, kHashA, {"w1", "w2", "w3"})) {
    const std::string want = a.request.participant() == "w1"   ? kHashA
                             : a.request.participant() == "w2" ? kHashB
                                                               : kHashC;
    absl::StatusOr<RoundTrust::Verdict> v =
        t.OnReport(a.auditor, Report(1, a.request.audit_id(), want));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->kind, Kind::kPassed);
  }
  EXPECT_FALSE(t.Pending());
  EXPECT_EQ(t.audits_performed(), 3u);
  EXPECT_EQ(t.audits_failed(), 0u);
}

TEST(RoundTrustTest, AMismatchAsksASecondOpinionThatConfirmsIt) {
  RoundTrust t = ThreeReady(1);
  const auto a = t.Assign(0, kHashA, {"w1", "w2", "w3"});
  const auto* on_w2 = &a[0];
  for (const auto& x : a) {
    if (x.request.participant() == "w2") on_w2 = &x;
  }
  absl::StatusOr<RoundTrust::Verdict> v =
      t.OnReport(on_w2->auditor, Report(1, on_w2->request.audit_id(), kHashC));
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->kind, Kind::kSecondOpinion);
  EXPECT_NE(v->second.auditor, "w2");
  EXPECT_NE(v->second.auditor, on_w2->auditor);
  EXPECT_EQ(v->second.request.participant(), "w2");
  EXPECT_EQ(t.audits_failed(), 0u);  // nobody is blamed yet
  // The second replay agrees with the first: w2 failed.
  v = t.OnReport(v->second.auditor, Report(1, v->second.request.audit_id(), kHashC));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->kind, Kind::kFailed);
  EXPECT_EQ(v->participant, "w2");
  EXPECT_NE(v->reason.find("failed audit"), std::string::npos) << v->reason;
  EXPECT_EQ(t.audits_failed(), 1u);
  EXPECT_EQ(t.audits_performed(), 1u);
}

TEST(RoundTrustTest, ASecondOpinionForTheParticipantBlamesTheFirstAuditor) {
  RoundTrust t = ThreeReady(1);
  const auto a = t.Assign(0, kHashA, {"w1", "w2", "w3"});
  const auto& first = a[0];
  const std::string participant = first.request.participant();
  const std::string want = participant == "w1" ? kHashA : participant == "w2" ? kHashB : kHashC;
  absl::StatusOr<RoundTrust::Verdict> v =
      t.OnReport(first.auditor, Report(1, first.request.audit_id(), std::string(64, 'f')));
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->kind, Kind::kSecondOpinion);
  v = t.OnReport(v->second.auditor, Report(1, v->second.request.audit_id(), want));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->kind, Kind::kAuditorWrong);
  EXPECT_EQ(v->auditor, first.auditor);
  EXPECT_EQ(v->participant, participant);
  // Counted as a failed audit of the auditor, not of the participant.
  EXPECT_EQ(t.audits_failed(), 1u);
  shoal::v1::WorkerStatus p, auditor;
  t.FillWorker(participant, &p);
  t.FillWorker(first.auditor, &auditor);
  EXPECT_EQ(p.audits_failed(), 0u);
  EXPECT_EQ(p.audits_passed(), 1u);
  EXPECT_EQ(auditor.audits_failed(), 1u);
}

TEST(RoundTrustTest, ThreeDifferentHashesDropTheAudit) {
  RoundTrust t = ThreeReady(1);
  const auto a = t.Assign(0, kHashA, {"w1", "w2", "w3"});
  absl::StatusOr<RoundTrust::Verdict> v =
      t.OnReport(a[0].auditor, Report(1, a[0].request.audit_id(), std::string(64, 'e')));
  ASSERT_EQ(v->kind, Kind::kSecondOpinion);
  v = t.OnReport(v->second.auditor, Report(1, v->second.request.audit_id(), std::string(64, 'f')));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->kind, Kind::kDropped);
  EXPECT_EQ(t.audits_failed(), 0u);
}

TEST(RoundTrustTest, ReportsFromTheWrongMemberOrForNoAuditAreRefused) {
  RoundTrust t = ThreeReady(1);
  const auto a = t.Assign(0, kHashA, {"w1", "w2", "w3"});
  const std::string other = a[0].auditor == "w1" ? "w2" : "w1";
  EXPECT_EQ(t.OnReport(other, Report(1, a[0].request.audit_id(), kHashA)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(t.OnReport(a[0].auditor, Report(1, 999, kHashA)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(t.OnReport(a[0].auditor, Report(2, a[0].request.audit_id(), kHashA)).status().code(),
            absl::StatusCode::kNotFound);
  // An auditor that could not replay: dropped, nobody blamed.
  shoal::v1::ReportAuditRequest error = Report(1, a[0].request.audit_id(), "");
  error.set_error("this worker holds another model");
  absl::StatusOr<RoundTrust::Verdict> v = t.OnReport(a[0].auditor, error);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->kind, Kind::kDropped);
}

TEST(RoundTrustTest, LeavingTheRoundDropsItsAudits) {
  RoundTrust t = ThreeReady(1);
  t.Assign(0, kHashA, {"w1", "w2", "w3"});
  t.LeaveRound("w1");  // a participant and an auditor
  EXPECT_EQ(t.audits_dropped(), 2u);
  EXPECT_EQ(t.DropPending("deadline").size(), 1u);
  EXPECT_FALSE(t.Pending());
}

TEST(RoundTrustTest, WorkWithoutAHashIsNotAudited) {
  RoundTrust t(Config(1), "secret");
  t.OnJoined("w1", Join("one"));
  t.OnJoined("w2", Join("two"));
  t.StartRound(1);
  t.OnReady("w1", Ready(""), Samples());  // carried across a re-join
  t.OnReady("w2", Ready(kHashB), Samples());
  const auto a = t.Assign(0, kHashA, {"w1", "w2"});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].request.participant(), "w2");
}

TEST(ScoreTest, AFailedAuditBansAndSlowRoundsAreEarnedBack) {
  RoundTrust t(Config(1), "secret");
  t.OnJoined("w1", Join("one"));
  t.StartRound(3);
  // Missed deadlines cost a little; completed rounds earn it back.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(t.Record("w1", TrustEvent::kMissedDeadline, ""), "");
    t.Record("w1", TrustEvent::kRoundCompleted, "");
  }
  shoal::v1::WorkerStatus w;
  t.FillWorker("w1", &w);
  EXPECT_NEAR(w.score(), 0.95, 1e-9);
  EXPECT_EQ(w.score_reasons_size(), 5);
  EXPECT_NE(w.score_reasons(0).find("round 3: missed the ready deadline -0.02"), std::string::npos)
      << w.score_reasons(0);
  for (int i = 0; i < 20; ++i) t.Record("w1", TrustEvent::kRoundCompleted, "");
  w.Clear();
  t.FillWorker("w1", &w);
  EXPECT_DOUBLE_EQ(w.score(), 1.0);  // never above 1
  const std::string ban = t.Record("w1", TrustEvent::kAuditFailed, "by w2");
  EXPECT_NE(ban.find("below 0.50"), std::string::npos) << ban;
  EXPECT_NE(ban.find("failed audit by w2"), std::string::npos) << ban;
  // Only the crossing bans.
  EXPECT_EQ(t.Record("w1", TrustEvent::kAuditFailed, "by w3"), "");
}

// Found by the soak (issue 30): a site's supernode stopped for 15 s, its
// four honest members missed the ready deadline 25 rounds in a row, lost
// 0.02 a round and were banned ("score 0.50 below 0.50": 25 x 0.02 from 1
// added up to 0.4999999999999999). A run of missed deadlines now costs
// once; a member slow round after round, completing some, still falls.
TEST(ScoreTest, ARunOfMissedDeadlinesCostsOnceAndAChronicStragglerStillFalls) {
  RoundTrust t(Config(1), "secret");
  t.StartRound(10);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(t.Record("cut-off", TrustEvent::kMissedDeadline, ""), "");
  shoal::v1::WorkerStatus w;
  t.FillWorker("cut-off", &w);
  EXPECT_NEAR(w.score(), 0.98, 1e-9);
  EXPECT_EQ(w.score_reasons_size(), 1);
  // Back, it earns it back; the next absence costs once again.
  t.Record("cut-off", TrustEvent::kRoundCompleted, "");
  t.Record("cut-off", TrustEvent::kRoundCompleted, "");
  EXPECT_EQ(t.Record("cut-off", TrustEvent::kMissedDeadline, ""), "");
  w.Clear();
  t.FillWorker("cut-off", &w);
  EXPECT_NEAR(w.score(), 0.98, 1e-9);
  // Missing one round in two: -0.02 + 0.01 a pair. The 49th miss leaves
  // exactly 0.50 (not below), the 50th 0.49: banned then, not before.
  std::string ban;
  int pairs = 0;
  while (ban.empty() && pairs < 1000) {
    ban = t.Record("slow", TrustEvent::kMissedDeadline, "");
    if (ban.empty()) t.Record("slow", TrustEvent::kRoundCompleted, "");
    ++pairs;
  }
  EXPECT_EQ(pairs, 50);
  EXPECT_NE(ban.find("score 0.49 below 0.50"), std::string::npos) << ban;
}

TEST(ScoreTest, BadChunksCountOnlyWhenTwoMembersReportThemInARound) {
  RoundTrust t(Config(0, /*ban_below=*/0.5), "secret");
  t.StartRound(4);
  std::string reporters;
  EXPECT_FALSE(t.OnBadChunks("w1", "w3", &reporters));
  EXPECT_FALSE(t.OnBadChunks("w1", "w3", &reporters));  // the same reporter again
  EXPECT_FALSE(t.OnBadChunks("w3", "w3", &reporters));  // itself
  EXPECT_TRUE(t.OnBadChunks("w2", "w3", &reporters));
  EXPECT_EQ(reporters, "w1, w2");
  EXPECT_FALSE(t.OnBadChunks("w4", "w3", &reporters));  // counted once a round
  // A new round starts counting again.
  t.StartRound(5);
  EXPECT_FALSE(t.OnBadChunks("w2", "w3", &reporters));
  EXPECT_TRUE(t.OnBadChunks("w1", "w3", &reporters));
  EXPECT_EQ(t.Record("w3", TrustEvent::kBadChunks, "to " + reporters), "");
  const std::string ban = t.Record("w3", TrustEvent::kBadChunks, "to " + reporters);
  EXPECT_EQ(ban, "");  // 0.5 is not below 0.5
  EXPECT_NE(t.Record("w3", TrustEvent::kBadChunks, "to " + reporters), "");
}

TEST(ScoreTest, NoBanLineNoBan) {
  RoundTrust t(Config(0, /*ban_below=*/0), "secret");
  EXPECT_EQ(t.Record("w1", TrustEvent::kAuditFailed, ""), "");
  EXPECT_EQ(t.Record("w1", TrustEvent::kHashMinority, ""), "");
}

TEST(BanTest, ByIdOrNameUntilItExpires) {
  RoundTrust t(Config(1), "secret");
  const absl::Time now = absl::FromUnixSeconds(1000000);
  t.Ban("w7", "cheater", "score 0.00 below 0.50 after round 2: failed audit", now);
  shoal::v1::JoinRequest by_name = Join("cheater");
  absl::Status s = t.CheckJoin(by_name, now + absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("banned from this run"), std::string::npos) << s;
  EXPECT_NE(s.message().find("failed audit"), std::string::npos) << s;
  shoal::v1::JoinRequest by_id = Join("new name");
  by_id.set_previous_worker_id("w7");
  EXPECT_EQ(t.CheckJoin(by_id, now).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(t.CheckJoin(Join("honest"), now).ok());
  // The record keeps it for a restarted coordinator.
  shoal::v1::RunRecord record;
  t.FillRecord(&record, now);
  ASSERT_EQ(record.bans_size(), 1);
  RoundTrust restarted(Config(1), "other secret");
  restarted.Resume(record, now);
  EXPECT_EQ(restarted.CheckJoin(by_name, now).code(), absl::StatusCode::kPermissionDenied);
  // ban_seconds later it is over.
  EXPECT_TRUE(restarted.CheckJoin(by_name, now + absl::Seconds(61)).ok());
  shoal::v1::RunStatus status;
  restarted.FillStatus(&status, now + absl::Seconds(61));
  EXPECT_EQ(status.bans_size(), 0);
}

TEST(RoundTrustTest, AnAuditedRunRefusesAMemberNobodyCouldReplay) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  RoundTrust audited(Config(0.5), "secret");
  const absl::Status s = audited.CheckJoin(Join("python-loop", ""), now);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("step="), std::string::npos) << s;
  EXPECT_TRUE(audited.CheckJoin(Join("cpp"), now).ok());
  RoundTrust off(Config(0), "secret");
  EXPECT_TRUE(off.CheckJoin(Join("python-loop", ""), now).ok()) << "no audits: nothing to replay";
}

}  // namespace
}  // namespace shoal::coordinator
