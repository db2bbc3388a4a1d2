// Unit tests of shoalctl's run status rendering.
#include "tools/shoalctl/status_format.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::ctl {
namespace {

using ::shoal::v1::RoundSummary;
using ::shoal::v1::RunStatus;
using ::shoal::v1::WorkerStatus;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kHash[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr char kOtherHash[] = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

WorkerStatus* AddWorker(RunStatus* s, const std::string& id, const std::string& state,
                        uint64_t model_round, const std::string& hash) {
  WorkerStatus* w = s->add_workers();
  w->set_id(id);
  w->set_address("127.0.0.1:500" + id.substr(1));
  w->set_state(state);
  w->set_model_round(model_round);
  w->set_model_hash(hash);
  return w;
}

RoundSummary* AddRound(RunStatus* s, uint64_t round, bool evaluated, double accuracy, double loss) {
  RoundSummary* r = s->add_recent_rounds();
  r->set_round(round);
  r->set_participants(3);
  r->set_seconds(1.5);
  r->set_train_loss(0.5);
  r->set_evaluated(evaluated);
  r->set_test_accuracy(accuracy);
  r->set_test_loss(loss);
  r->set_model_hash(kHash);
  r->set_exchange_seconds(0.125);
  return r;
}

// A finished 5-round run of three workers; round 4 was the last evaluated.
RunStatus FinishedRun() {
  RunStatus s;
  s.set_run_id("run-42");
  s.set_phase(shoal::v1::FINISHED);
  s.set_round(5);
  s.set_last_completed_round(5);
  s.set_min_participants(2);
  s.set_members(3);
  s.add_participants("w1");
  s.add_participants("w2");
  s.set_model_hash(kHash);
  s.set_detail("done");
  s.set_started_unix_ms(1700000000000);
  s.mutable_config()->mutable_model()->set_name("mlp");
  s.mutable_config()->mutable_training()->set_learning_rate(0.05);
  s.mutable_config()->mutable_sync()->set_rounds(5);
  s.mutable_config()->mutable_training()->set_seed(7);
  AddRound(&s, 3, true, 0.8512, 0.41);
  AddRound(&s, 4, true, 0.88456, 0.3377);
  AddRound(&s, 5, false, 0.0, 0.0);
  WorkerStatus* w1 = AddWorker(&s, "w1", "left", 5, kHash);
  w1->set_metrics_round(4);
  w1->set_test_accuracy(0.88456);
  w1->set_test_loss(0.3377);
  w1->set_last_seen_ms_ago(12);
  w1->set_reason("run finished");
  AddWorker(&s, "w2", "syncing", 5, kHash)->set_last_seen_ms_ago(34);
  AddWorker(&s, "w3", "evicted", 2, "")->set_reason("missed heartbeats");
  return s;
}

// ---------------------------------------------------------------- summary line

TEST(FormatSummaryLineTest, UsesTheNewestEvaluatedRound) {
  const std::string line = FormatSummaryLine(FinishedRun(), 12.34);
  EXPECT_THAT(line, HasSubstr("test_accuracy=0.8846"));
  EXPECT_THAT(line, HasSubstr("test_loss=0.3377"));
  EXPECT_THAT(line, Not(HasSubstr("test_accuracy=0.8512")));
  EXPECT_THAT(line, Not(HasSubstr("test_accuracy=0.0000")));
  EXPECT_THAT(line, HasSubstr("run_id=run-42"));
  EXPECT_THAT(line, HasSubstr("phase=FINISHED"));
  EXPECT_THAT(line, HasSubstr("rounds=5"));
  EXPECT_THAT(line, HasSubstr("workers=2"));
  EXPECT_THAT(line, HasSubstr("hashes_agree=true"));
  EXPECT_THAT(line, HasSubstr("model_hash=0123456789abcdef "));
  EXPECT_THAT(line, HasSubstr("elapsed=12.3s"));
}

TEST(FormatSummaryLineTest, NoEvaluatedRoundGivesZero) {
  RunStatus s;
  s.set_run_id("r");
  AddRound(&s, 1, false, 0.5, 0.5);
  const std::string line = FormatSummaryLine(s, 0);
  EXPECT_THAT(line, HasSubstr("test_accuracy=0.0000"));
  EXPECT_THAT(line, HasSubstr("hashes_agree=false"));
}

// ---------------------------------------------------------------- hashes

TEST(HashesAgreeTest, AllReportersAgree) { EXPECT_TRUE(HashesAgree(FinishedRun())); }

TEST(HashesAgreeTest, LeftWorkerWithADifferentHashDisagrees) {
  RunStatus s = FinishedRun();
  s.mutable_workers(0)->set_model_hash(kOtherHash);  // w1, "left"
  EXPECT_FALSE(HashesAgree(s));
}

TEST(HashesAgreeTest, ActiveWorkerWithADifferentHashDisagrees) {
  RunStatus s = FinishedRun();
  s.mutable_workers(1)->set_model_hash(kOtherHash);
  EXPECT_FALSE(HashesAgree(s));
}

TEST(HashesAgreeTest, EvictedWorkersDoNotCount) {
  RunStatus s = FinishedRun();
  // Evicted after reporting the last round, with another hash: ignored.
  WorkerStatus* w3 = s.mutable_workers(2);
  w3->set_model_round(5);
  w3->set_model_hash(kOtherHash);
  EXPECT_TRUE(HashesAgree(s));
}

TEST(HashesAgreeTest, WorkersBehindTheLastRoundDoNotCount) {
  RunStatus s = FinishedRun();
  AddWorker(&s, "w4", "waiting", 3, kOtherHash);
  AddWorker(&s, "w5", "training", 0, "");
  EXPECT_TRUE(HashesAgree(s));
}

TEST(HashesAgreeTest, NoReportersIsFalse) {
  RunStatus s = FinishedRun();
  for (auto& w : *s.mutable_workers()) w.set_state("evicted");
  EXPECT_FALSE(HashesAgree(s));

  RunStatus empty;
  EXPECT_FALSE(HashesAgree(empty));

  // No completed round yet: workers at model round 0 are not reporters.
  RunStatus fresh;
  AddWorker(&fresh, "w1", "training", 0, "");
  EXPECT_FALSE(HashesAgree(fresh));
}

TEST(HashesAgreeTest, OnlyLeftWorkersReported) {
  RunStatus s = FinishedRun();
  s.mutable_workers(1)->set_state("evicted");
  EXPECT_TRUE(HashesAgree(s));  // w1 left after reporting round 5
}

// ---------------------------------------------------------------- table

TEST(FormatStatusTableTest, ShowsRunWorkersStatesAndPhase) {
  RunStatus s = FinishedRun();
  const std::string table = FormatStatusTable(s, /*wide=*/true);
  EXPECT_THAT(table, HasSubstr("run-42"));
  EXPECT_THAT(table, HasSubstr("FINISHED"));
  EXPECT_THAT(table, Not(HasSubstr("PHASE_")));
  EXPECT_THAT(table, HasSubstr("last_completed_round 5"));
  for (const char* id : {"w1", "w2", "w3"}) EXPECT_THAT(table, HasSubstr(id));
  for (const char* state : {"left", "syncing", "evicted"}) EXPECT_THAT(table, HasSubstr(state));
  EXPECT_THAT(table, HasSubstr("127.0.0.1:5001"));
  EXPECT_THAT(table, HasSubstr("0.8846"));             // w1's accuracy
  EXPECT_THAT(table, HasSubstr("0123456789ab"));       // a shortened hash
  EXPECT_THAT(table, HasSubstr("missed heartbeats"));  // w3's reason
  EXPECT_THAT(table, HasSubstr("done"));               // the detail line

  // No deadline known: no deadline line; no times measured: dashes.
  EXPECT_THAT(table, Not(HasSubstr("ready_deadline")));
  EXPECT_THAT(table, HasSubstr("TRAIN"));
  EXPECT_THAT(table, HasSubstr("READY"));
  EXPECT_THAT(table, HasSubstr("LATE"));

  s.set_phase(shoal::v1::SHARING);
  EXPECT_THAT(FormatStatusTable(s), HasSubstr("SHARING"));
  s.set_phase(shoal::v1::WAITING_FOR_MEMBERS);
  EXPECT_THAT(FormatStatusTable(s), HasSubstr("WAITING_FOR_MEMBERS"));
}

// -o table: the workers that left, were lost or evicted fold into one line
// with their reasons; those that finished stay rows. -o wide lists them all.
TEST(FormatStatusTableTest, FoldsDepartedWorkersUnlessWide) {
  RunStatus s = FinishedRun();
  s.mutable_workers(1)->set_state("finished");
  const std::string table = FormatStatusTable(s);
  EXPECT_THAT(table, HasSubstr("workers:\n"));
  EXPECT_THAT(table, HasSubstr("departed (2; -o wide lists them): w1 left (run finished), "
                               "w3 evicted (missed heartbeats)\n"));
  EXPECT_THAT(table, Not(HasSubstr("127.0.0.1:5001")));  // w1's row
  EXPECT_THAT(table, HasSubstr("127.0.0.1:5002"));       // w2 finished: a row
  const std::string wide = FormatStatusTable(s, /*wide=*/true);
  EXPECT_THAT(wide, HasSubstr("127.0.0.1:5001"));
  EXPECT_THAT(wide, HasSubstr("127.0.0.1:5003"));
  EXPECT_THAT(wide, Not(HasSubstr("departed (")));
}

// Bandwidth-proportional slices (issue 49): each member's measured rate and
// slice share, in a run that sizes by bandwidth, or with -o wide once a
// rate is measured.
TEST(FormatStatusTableTest, ShowsRatesAndSliceSharesOfBandwidthSizedRuns) {
  RunStatus s = FinishedRun();
  EXPECT_THAT(FormatStatusTable(s, /*wide=*/true), Not(HasSubstr("SLICE_SHARE")));
  s.mutable_workers(1)->set_exchange_rate_bytes_per_second(1.25e6);
  s.mutable_workers(1)->set_slice_share(0.03125);
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("SLICE_SHARE")));
  EXPECT_THAT(FormatStatusTable(s, /*wide=*/true), HasSubstr("slices (--slice_sizing=equal"));
  s.mutable_config()->mutable_exchange()->set_slice_sizing("bandwidth");
  const std::string table = FormatStatusTable(s);
  EXPECT_THAT(table, HasSubstr("slices (--slice_sizing=bandwidth"));
  EXPECT_THAT(table, HasSubstr("1.25 MB/s"));
  EXPECT_THAT(table, HasSubstr("3.1%"));
}

// Members first, then the departed, each by the number in its id; a
// worker's --name beside its id.
TEST(FormatStatusTableTest, ListsMembersThenTheDepartedByIdWithTheirNames) {
  RunStatus s;
  s.set_run_id("run-7");
  s.set_phase(shoal::v1::TRAINING);
  AddWorker(&s, "w10", "training", 3, kHash);
  AddWorker(&s, "w3", "lost", 2, "")->set_reason("session stream closed");
  AddWorker(&s, "w2", "training", 3, kHash)->set_name("alice");
  AddWorker(&s, "w1", "finished", 3, kHash);
  const std::string table = FormatStatusTable(s, /*wide=*/true);
  const size_t w2 = table.find("w2 (alice)");
  const size_t w10 = table.find("w10 ");
  const size_t w1 = table.find("w1 ");
  const size_t w3 = table.find("w3 ");
  ASSERT_NE(w2, std::string::npos) << table;
  ASSERT_NE(w10, std::string::npos) << table;
  ASSERT_NE(w1, std::string::npos) << table;
  ASSERT_NE(w3, std::string::npos) << table;
  EXPECT_LT(w2, w10) << table;
  EXPECT_LT(w10, w1) << table;
  EXPECT_LT(w1, w3) << table;
  EXPECT_THAT(table, HasSubstr("lost"));
  EXPECT_THAT(table, HasSubstr("finished"));
}

TEST(FormatStatusTableTest, ShowsTheCheckpointLine) {
  RunStatus s = FinishedRun();
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("checkpoint")));
  s.mutable_config()->mutable_checkpoints()->set_store("127.0.0.1:50052");
  s.mutable_config()->mutable_checkpoints()->set_every(5);
  s.set_checkpoint_id("run-42-r5");
  s.set_checkpoint_round(5);
  s.set_checkpoint_pending("round 10 by w2");
  EXPECT_THAT(FormatStatusTable(s),
              HasSubstr("checkpoint run-42-r5 (round 5)  store 127.0.0.1:50052 every 5 rounds  "
                        "uploading round 10 by w2"));
}

TEST(FormatStatusTableTest, ShowsTheLedgerTheRunGoingBackAndAStop) {
  RunStatus s = FinishedRun();
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("ledger")));
  shoal::v1::SampleLedger* l = s.mutable_ledger();
  l->set_dataset_samples(60000);
  l->set_epoch(1);
  l->set_offset(1280);
  l->set_epochs_done(1);
  l->set_samples_trained(61280);
  l->set_samples_lost(2560);
  l->set_samples_redone(1280);
  auto* pool = l->add_pool();
  pool->set_count(1280);
  s.set_base_fallback("round 9: checkpoint run-42-r8 is damaged");
  s.set_error("nothing to go back to");
  const std::string out = FormatStatusTable(s);
  EXPECT_THAT(out, HasSubstr("ledger epoch 1 at 1280/60000  epochs_done 1  trained 61280  lost "
                             "2560  redone 1280  waiting 1280  in_flight 0"));
  EXPECT_THAT(out, HasSubstr("went back: round 9: checkpoint run-42-r8 is damaged"));
  EXPECT_THAT(out, HasSubstr("STOPPED: nothing to go back to"));
}

TEST(FormatStatusTableTest, ShowsAuditsScoresAndBans) {
  RunStatus s = FinishedRun();
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("trust")));
  s.mutable_config()->mutable_trust()->set_audit_rate(0.2);
  s.mutable_config()->mutable_trust()->set_ban_below(0.5);
  s.set_audits_performed(12);
  s.set_audits_failed(1);
  s.set_audits_dropped(2);
  WorkerStatus* w2 = s.mutable_workers(1);
  w2->set_score(0.98);
  w2->set_audits_passed(3);
  w2->add_score_reasons("round 7: missed the ready deadline -0.02");
  shoal::v1::Ban* ban = s.add_bans();
  ban->set_worker_id("w9");
  ban->set_name("cheater");
  ban->set_reason("score 0.00 below 0.50 after round 4: failed audit by w2");
  ban->set_until_unix_seconds(1800000000);
  const std::string out = FormatStatusTable(s);
  EXPECT_THAT(out, HasSubstr("trust (--audit_rate=0.2, --ban_below=0.5): audits performed 12  "
                             "failed 1  dropped 2"));
  EXPECT_THAT(out, HasSubstr("score 0.98  audited 3 (failed 0)  replayed 0  last: round 7: "
                             "missed the ready deadline -0.02"));
  EXPECT_THAT(out, HasSubstr("BANNED w9 (cheater) until 2027-01-15 08:00:00 UTC: score 0.00 below "
                             "0.50 after round 4: failed audit by w2"));
}

TEST(FormatStatusTableTest, ShowsWhereEachWorkersTimeGoes) {
  RunStatus s = FinishedRun();
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("time (share")));
  WorkerStatus* w2 = s.mutable_workers(1);
  w2->set_train_share(0.62);
  w2->set_exchange_share(0.30);
  w2->set_idle_share(0.08);
  w2->set_rounds_in_flight(1);
  const std::string out = FormatStatusTable(s);
  EXPECT_THAT(out, HasSubstr("time (share of each worker's recent rounds):"));
  EXPECT_THAT(out, HasSubstr("w2    62%    30%       8%     1"));
}

// Robust aggregation (issue 14): a line when the rule is not the mean.
TEST(FormatStatusTableTest, ShowsARobustAggregationOnly) {
  RunStatus s = FinishedRun();
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("aggregation")));
  s.mutable_config()->mutable_exchange()->set_aggregation("mean");
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("aggregation")));
  s.mutable_config()->mutable_exchange()->set_aggregation("trimmed_mean:2");
  EXPECT_THAT(FormatStatusTable(s), HasSubstr("aggregation trimmed_mean:2 at slice owners"));
}

TEST(FormatStatusTableTest, ShowsLateWorkFoldedPerWorker) {
  RunStatus s = FinishedRun();
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("late work")));
  s.mutable_config()->mutable_sync()->set_fold_late_work(true);
  s.mutable_config()->mutable_sync()->set_max_staleness(4);
  auto* fast = s.mutable_workers(1);
  fast->set_ready_seconds_median(1.02);
  fast->set_deadline_seconds(2.05);
  // Deadlines that everyone met: no block.
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("late work")));
  auto* slow = s.mutable_workers(0);
  slow->set_state("training");
  slow->set_deadline_seconds(2.05);
  slow->set_rounds_late(6);
  slow->set_folded_updates(5);
  slow->set_last_fold_round(14);
  slow->set_last_fold_staleness(1);
  slow->set_last_fold_weight(0.5);
  slow->set_last_fold_train_seconds(4.31);
  const std::string table = FormatStatusTable(s);
  EXPECT_THAT(table, HasSubstr("late work (--fold_late_work=true, --max_staleness=4):"));
  std::string fast_row, slow_row;
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    if (absl::StartsWith(line, absl::StrCat("  ", fast->id(), " "))) fast_row = std::string(line);
    if (absl::StartsWith(line, absl::StrCat("  ", slow->id(), " "))) slow_row = std::string(line);
  }
  EXPECT_THAT(fast_row, ::testing::ContainsRegex("round_time 1\\.02s +deadline 2\\.05s +late 0 +"
                                                 "folded 0 +last_fold -"));
  EXPECT_THAT(slow_row, ::testing::ContainsRegex(
                            "late 6 +folded 5 +last_fold into round 14, staleness 1, weight "
                            "0\\.500, trained in 4\\.31s"));
}

TEST(FormatStatusTableTest, ShowsTheReadyDeadlineAndMeasuredTimes) {
  RunStatus s = FinishedRun();
  s.set_ready_deadline_seconds(6.3);
  s.set_ready_deadline_adaptive(true);
  s.set_ready_deadline_reason("adaptive 6.25s = 2 x median ready time 3.125s");
  auto* w = s.mutable_workers(0);
  w->set_train_seconds_median(1.5);
  w->set_ready_seconds_median(3.13);
  w->set_rounds_late(7);
  const std::string table = FormatStatusTable(s, /*wide=*/true);
  EXPECT_THAT(table, HasSubstr("ready_deadline 6.3s after the round start (adaptive 6.25s = 2 x "
                               "median ready time 3.125s)"));
  EXPECT_THAT(table, HasSubstr("1.50s"));
  EXPECT_THAT(table, HasSubstr("3.13s"));
  std::string row;
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    if (absl::StartsWith(line, w->id())) row = std::string(line);
  }
  EXPECT_THAT(row, ::testing::ContainsRegex("1\\.50s +3\\.13s +[0-9-]+m?s? +7 "));
}

TEST(FormatStatusTableTest, GossipShowsTheCheckpointerAndTheLatestCheckpoint) {
  RunStatus s;
  s.set_run_id("g-1");
  s.mutable_config()->mutable_gossip();
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("checkpointer")));  // no store
  s.mutable_config()->mutable_checkpoints()->set_store("127.0.0.1:50052");
  s.mutable_config()->mutable_gossip()->set_checkpoint_every(500);
  EXPECT_THAT(FormatStatusTable(s), HasSubstr("checkpointer - (every 500 local steps)  latest -"));
  s.set_checkpointer("w2");
  s.set_checkpoint_id("g-1-r4");
  s.set_checkpoint_round(4);
  s.set_checkpoint_worker("w2");
  s.set_checkpoint_steps(2000);
  s.set_checkpoint_clock(64000);
  EXPECT_THAT(FormatStatusTable(s),
              HasSubstr("checkpointer w2 (every 500 local steps)  latest g-1-r4 by w2 at 2000 "
                        "steps, clock 64000"));
}

TEST(FormatStatusTableTest, GossipFinalAverageInTheTableAndTheSummary) {
  RunStatus s;
  s.set_run_id("g-2");
  s.set_phase(shoal::v1::FINISHED);
  s.mutable_config()->mutable_gossip()->set_final_average(true);
  for (const char* id : {"w1", "w2"}) {
    auto* w = s.add_workers();
    w->set_id(id);
    w->set_state("waiting");
    w->set_gossip(true);
    w->set_eval_clock(64000);
    w->set_test_accuracy(0.86);
    w->set_model_hash(std::string(64, 'f'));
    w->set_final_models(2);
  }
  // Before any worker is done: no line, the usual summary.
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("final average")));
  EXPECT_THAT(FormatSummaryLine(s, 1), HasSubstr("(mean of the workers' last evaluations)"));
  s.set_final_average("2 final models averaged by 2 workers; hashes agree (ffffffffffff)");
  EXPECT_THAT(FormatStatusTable(s), HasSubstr("  final average: 2 final models averaged by 2 "
                                              "workers; hashes agree (ffffffffffff)\n"));
  EXPECT_THAT(FormatSummaryLine(s, 1),
              HasSubstr("test_accuracy=0.8600 test_loss=0.0000 (the final average) "
                        "hashes_agree=true model_hash=ffffffffffffffff"));
  s.mutable_workers(1)->set_model_hash(std::string(64, 'e'));
  EXPECT_THAT(FormatSummaryLine(s, 1), HasSubstr("hashes_agree=false"));
}

TEST(FormatStatusTableTest, GossipConsensusAccuracyWhenEvaluated) {
  RunStatus s;
  s.mutable_config()->mutable_gossip();
  s.set_consensus_distance(0.25);
  s.set_consensus_workers(3);
  EXPECT_EQ(FormatConsensus(s), "consensus_distance 0.25000 (3 workers)");
  s.set_consensus_models(3);
  s.set_consensus_test_accuracy(0.8512);
  s.set_consensus_worker("w1");
  EXPECT_EQ(FormatConsensus(s),
            "consensus_distance 0.25000 (3 workers)  consensus_accuracy 0.8512 (3 models, by w1)");
  EXPECT_THAT(FormatStatusTable(s), HasSubstr("consensus_accuracy 0.8512 (3 models, by w1)"));
}

TEST(FormatZoneTreeTest, FlatRunShowsNoTree) {
  RunStatus s = FinishedRun();
  auto* root = s.add_zones();
  root->set_workers(3);
  root->set_direct_members(3);
  root->set_reason("no child zones: a flat run has no supernode");
  EXPECT_EQ(FormatZoneTree(s), "");
  EXPECT_THAT(FormatStatusTable(s), Not(HasSubstr("zones")));
  // Measurements of workers that left are not listed either (a finished run).
  s.mutable_workers(2)->set_step_seconds(0.01);
  EXPECT_EQ(FormatZoneTree(s), "");
  // An active flat worker's measurements are.
  s.mutable_workers(0)->set_role("member");
  s.mutable_workers(0)->set_step_seconds(0.02);
  EXPECT_THAT(FormatZoneTree(s),
              HasSubstr("w1    (root)                   member    20.00ms    -"));
  EXPECT_THAT(FormatZoneTree(s), Not(HasSubstr("zones")));
}

TEST(FormatZoneTreeTest, PrintsTheTreeIndentedWithRolesAndMeasurements) {
  RunStatus s = FinishedRun();  // w1, w2 active, w3 left
  s.mutable_workers(0)->set_zone("eu/paris");
  s.mutable_workers(0)->set_role("supernode");
  s.mutable_workers(0)->set_step_seconds(0.0125);
  s.mutable_workers(0)->set_bandwidth_bytes_per_second(210e6);
  s.mutable_workers(1)->set_zone("eu/paris");
  s.mutable_workers(1)->set_role("standby");
  auto add = [&](const std::string& path, const std::string& head, const std::string& standby,
                 uint32_t workers) {
    auto* z = s.add_zones();
    z->set_path(path);
    z->set_supernode(head);
    z->set_standby(standby);
    z->set_workers(workers);
    z->set_direct_members(path == "eu/paris" ? workers : 0);
    if (!head.empty()) {
      z->set_reason(head + ": 2.1x the zone's median bandwidth, 0.9x its median step time");
      z->set_cause("first election");
      z->set_elected_unix_ms(1'700'000'000'000);
    } else {
      z->set_reason("no direct members: the child zones' supernodes meet as peers");
    }
    return z;
  };
  add("", "", "", 2);
  add("eu", "w1", "w2", 2)->set_challenger("w2");
  s.mutable_zones(1)->set_challenger_rounds(2);
  add("eu/paris", "w1", "w2", 2);
  const std::string tree = FormatZoneTree(s);
  const std::vector<std::string> lines = absl::StrSplit(tree, '\n');
  ASSERT_GE(lines.size(), 9u) << tree;
  EXPECT_EQ(lines[1],
            "  (root)  2 workers (0 direct)  no supernode: no direct members: the child zones' "
            "supernodes meet as peers");
  EXPECT_EQ(lines[2],
            "    eu  2 workers (0 direct)  supernode w1  standby w2  since 22:13:20 UTC (first "
            "election)");
  EXPECT_EQ(lines[3],
            "        why w1: 2.1x the zone's median bandwidth, 0.9x its median step time");
  EXPECT_EQ(lines[4], "        challenger w2 ahead for 2 round(s)");
  EXPECT_THAT(lines[5], ::testing::StartsWith("      paris  2 workers (2 direct)  supernode w1"));
  EXPECT_THAT(tree, HasSubstr("w1    eu/paris                 supernode 12.50ms    210.0 MB/s"));
  EXPECT_THAT(tree, HasSubstr("w2    eu/paris                 standby   -          -"));
  EXPECT_THAT(tree, Not(HasSubstr("w3 ")));  // left: no role
  EXPECT_THAT(FormatStatusTable(s), HasSubstr(tree));
}

TEST(PhaseNameTest, NamesWithoutPrefix) {
  EXPECT_EQ(PhaseName(shoal::v1::TRAINING), "TRAINING");
  EXPECT_EQ(PhaseName(shoal::v1::CHECKPOINTING), "CHECKPOINTING");
}

// ---------------------------------------------------------------- round line

TEST(FormatRoundLineTest, ShowsMetricsWhenEvaluated) {
  RunStatus s = FinishedRun();
  const std::string evaluated = FormatRoundLine(s.recent_rounds(1), 5);
  EXPECT_THAT(evaluated, HasSubstr("round 4/5"));
  EXPECT_THAT(evaluated, HasSubstr("test_accuracy=0.8846"));
  const std::string not_evaluated = FormatRoundLine(s.recent_rounds(2), 0);
  EXPECT_THAT(not_evaluated, HasSubstr("round 5 "));
  EXPECT_THAT(not_evaluated, HasSubstr("test_accuracy=-"));
}

// watch -o json: one object per line, each parsing back.
TEST(FormatRoundLineTest, JsonLinesParseBack) {
  RunStatus s = FinishedRun();
  const std::string line = FormatRoundJsonLine(s.recent_rounds(1), 5);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_THAT(line, HasSubstr("{\"event\":\"round\",\"total_rounds\":5,\"round\":\"4\""));
  v1::RoundSummary parsed;
  google::protobuf::util::JsonParseOptions ignore;
  ignore.ignore_unknown_fields = true;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &parsed, ignore).ok()) << line;
  EXPECT_EQ(parsed.round(), 4u);
  EXPECT_DOUBLE_EQ(parsed.test_accuracy(), 0.88456);
  const std::string finished = FormatFinishedJsonLine(s, 12.5);
  EXPECT_THAT(finished, HasSubstr("\"event\":\"finished\",\"run_id\":\"run-42\""));
  EXPECT_THAT(finished, HasSubstr("\"test_accuracy\":0.884560"));
  EXPECT_THAT(finished, HasSubstr("\"hashes_agree\":true"));
  EXPECT_THAT(finished, HasSubstr("\"elapsed_seconds\":12.500}"));
  google::protobuf::Struct any;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(finished, &any).ok()) << finished;
  EXPECT_EQ(JsonQuote("a\"b\n"), "\"a\\\"b\\n\"");
}

// ---------------------------------------------------------------- JSON

TEST(FormatStatusJsonTest, ParsesBackToAnEqualMessage) {
  const RunStatus s = FinishedRun();
  const std::string json = FormatStatusJson(s);
  EXPECT_THAT(json, HasSubstr("\"last_completed_round\""));
  EXPECT_THAT(json, HasSubstr("\"run_id\": \"run-42\""));
  RunStatus parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &parsed);
  ASSERT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, s))
      << parsed.DebugString() << "\nvs\n"
      << s.DebugString();
}

TEST(FormatStatusJsonTest, PrintsDefaultFields) {
  RunStatus empty;
  const std::string json = FormatStatusJson(empty);
  EXPECT_THAT(json, HasSubstr("\"last_completed_round\""));
  EXPECT_THAT(json, HasSubstr("\"phase\""));
  RunStatus parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, empty));
}

TEST(FormatStatusTableTest, MarksWorkersBehindNatAndTheirMergedPushes) {
  v1::RunStatus s;
  auto* nat = s.add_workers();
  nat->set_id("w3");
  nat->set_state("training");
  nat->set_outbound_only(true);
  nat->set_outbound_reason("declared (--outbound_only)");
  auto* other = s.add_workers();
  other->set_id("w1");
  other->set_state("training");
  other->set_pushes_merged(4);
  const std::string table = FormatStatusTable(s);
  EXPECT_THAT(table, HasSubstr("behind NAT: w3 (declared (--outbound_only))"));
  EXPECT_THAT(table, HasSubstr("w1 merged 4 models pushed from behind NAT"));
  EXPECT_THAT(FormatStatusTable(v1::RunStatus()), Not(HasSubstr("behind NAT")));
}

}  // namespace
}  // namespace shoal::ctl
