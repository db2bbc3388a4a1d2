// The ExternalTrainer's turns (docs/PYTHON.md): the runner's thread opens
// them, a thread standing for the Python loop takes and ends them; what the
// loop is told to pull and push, by default (every turn) and on request
// (local training: only where the buffer is used).
#include "services/worker/core/external_trainer.h"

#include <cmath>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/core/sample_order.h"

namespace shoal::worker {
namespace {

using Turn = ExternalTrainer::Turn;

ExternalTrainerOptions Options(std::vector<float>* params) {
  ExternalTrainerOptions o;
  o.parameters = params->data();
  o.elements = params->size();
  o.layers = {LayerInfo{"w", {static_cast<int64_t>(params->size())}, 0, params->size()}};
  return o;
}

// The loop's side: takes `n` turns, records them, and for each training
// turn adds its steps to params[0] (the module trains during its turn).
std::vector<Turn> TakeTurns(ExternalTrainer* trainer, std::vector<float>* params, int n) {
  std::vector<Turn> seen;
  for (int i = 0; i < n; ++i) {
    std::optional<Turn> t = trainer->AwaitTurn(absl::Seconds(30));
    if (!t.has_value()) {
      ADD_FAILURE() << "no turn within 30 s";
      break;
    }
    seen.push_back(*t);
    if (t->kind == Turn::kClosed) break;
    if (t->kind == Turn::kTrain) (*params)[0] += static_cast<float>(t->steps);
    trainer->EndTurn(0.25 * static_cast<double>(seen.size()));
  }
  return seen;
}

TEST(ExternalTrainerTest, TurnsGoBetweenTheRunnerAndTheLoop) {
  std::vector<float> params(4, 0.0f);
  ExternalTrainer trainer(Options(&params));
  EXPECT_EQ(trainer.AwaitTurn(absl::ZeroDuration()), std::nullopt) << "no turn open yet";
  std::vector<Turn> seen;
  std::thread loop([&] { seen = TakeTurns(&trainer, &params, 3); });
  trainer.SetRound(3);
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(5), 0.25);
  EXPECT_EQ(params[0], 5.0f);
  trainer.SetRound(4);
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(5), 0.5);
  EXPECT_EQ(params[0], 10.0f);
  EXPECT_EQ(trainer.turns(), 2u);
  trainer.Close();
  loop.join();
  ASSERT_EQ(seen.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(seen[i].kind, Turn::kTrain);
    EXPECT_EQ(seen[i].steps, 5u);
    EXPECT_EQ(seen[i].round, 3u + i);
    // The exchange reads and writes the buffer between any two turns: the
    // module takes it before its steps and gives it back after them.
    EXPECT_TRUE(seen[i].pull);
    EXPECT_TRUE(seen[i].push);
    EXPECT_FALSE(seen[i].local);
  }
  EXPECT_EQ(seen[2].kind, Turn::kClosed);
  EXPECT_TRUE(seen[2].pull) << "the last average, written after the last turn";
  EXPECT_FALSE(trainer.AwaitTurn(absl::ZeroDuration())->pull) << "once";
  EXPECT_TRUE(std::isnan(trainer.TrainSteps(5))) << "after Close, at once";
  EXPECT_FALSE(trainer.Evaluate().evaluated());
  shoal::v1::Metrics m;
  m.set_test_accuracy(0.9);
  trainer.ReportMetrics(m);
  EXPECT_TRUE(trainer.Evaluate().evaluated());
  EXPECT_FALSE(trainer.Evaluate().evaluated()) << "reported figures go once";
  EXPECT_EQ(trainer.EvaluateParams(params.data()).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(ExternalTrainerTest, CloseEndsAWaitingTrainSteps) {
  std::vector<float> params(1);
  ExternalTrainer trainer(Options(&params));
  std::thread runner([&] { EXPECT_TRUE(std::isnan(trainer.TrainSteps(3))); });
  std::optional<Turn> t = trainer.AwaitTurn(absl::Seconds(30));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->steps, 3u);
  trainer.Close();  // the loop stops in the middle of its turn
  runner.join();
  // Nothing was written since the turn's pull: the module keeps its
  // progress, as a view of the buffer would.
  EXPECT_FALSE(trainer.AwaitTurn(absl::ZeroDuration())->pull);
}

TEST(ExternalTrainerTest, OnRequestTheModuleSyncsOnlyWhereTheBufferIsUsed) {
  std::vector<float> params(2, 0.0f);
  ExternalTrainer trainer(Options(&params));
  trainer.SyncOnRequest();
  std::vector<Turn> seen;
  std::thread loop([&] { seen = TakeTurns(&trainer, &params, 6); });
  // Local training: a step a turn, then a sync before it reads the buffer.
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(1), 0.25);
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(1), 0.5);
  trainer.SyncParameters();  // the module trained: it pushes
  trainer.SyncParameters();  // nothing trained since: no turn
  trainer.SetRound(7);
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(2), 1.0);
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(1), 1.25);
  trainer.SyncParameters();
  EXPECT_EQ(trainer.turns(), 4u) << "training turns only";
  trainer.Close();
  loop.join();
  ASSERT_EQ(seen.size(), 6u);
  const std::vector<Turn::Kind> kinds = {Turn::kTrain, Turn::kTrain, Turn::kSync,
                                         Turn::kTrain, Turn::kTrain, Turn::kSync};
  for (size_t i = 0; i < kinds.size(); ++i) {
    EXPECT_EQ(seen[i].kind, kinds[i]) << i;
    EXPECT_TRUE(seen[i].local) << i;
    // Training turns never push; syncs only push.
    EXPECT_EQ(seen[i].push, kinds[i] == Turn::kSync) << i;
  }
  // The first turn pulls (the buffer may have been written before it, a
  // late joiner's model); then only the turn after a sync, where the
  // caller may have written the buffer.
  EXPECT_TRUE(seen[0].pull);
  EXPECT_FALSE(seen[1].pull);
  EXPECT_TRUE(seen[3].pull);
  EXPECT_EQ(seen[3].round, 7u);
  EXPECT_EQ(seen[3].steps, 2u);
  EXPECT_FALSE(seen[4].pull);
  // Closed after a sync: the module takes what local training left.
  std::optional<Turn> closed = trainer.AwaitTurn(absl::ZeroDuration());
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->kind, Turn::kClosed);
  EXPECT_TRUE(closed->pull);
}

TEST(ExternalTrainerTest, CloseEndsAWaitingSync) {
  std::vector<float> params(1);
  ExternalTrainer trainer(Options(&params));
  trainer.SyncOnRequest();
  std::thread loop([&] { TakeTurns(&trainer, &params, 1); });
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(1), 0.25);
  loop.join();
  // The loop never comes back for the sync (it stopped): Close ends it.
  std::thread closer([&] {
    std::optional<Turn> t = trainer.AwaitTurn(absl::Seconds(30));
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->kind, Turn::kSync);
    trainer.Close();
  });
  trainer.SyncParameters();
  closer.join();
  EXPECT_TRUE(trainer.AwaitTurn(absl::ZeroDuration())->pull);
}

// The sample ledger (docs/DATA.md, docs/PYTHON.md): the coordinator's
// positions become indices of the loop's training set through the run's
// permutation (as the built-in trainer's), a batch of them per step, and
// the turns run out with the samples.
TEST(ExternalTrainerTest, LedgerTurnsCarryTheRoundsSamplesABatchAStep) {
  std::vector<float> params(1);
  ExternalTrainerOptions o = Options(&params);
  o.train_samples = 10;
  ExternalTrainer trainer(o);
  EXPECT_EQ(trainer.train_samples(), 10u) << "declared at join";
  shoal::v1::SampleRange range;
  range.set_epoch(1);
  range.set_begin(2);
  range.set_count(7);
  shoal::v1::RunConfig config;
  config.mutable_training()->set_batch_size(4);
  config.mutable_training()->set_seed(5);
  trainer.Configure(config);
  EXPECT_EQ(trainer.SetSamples({range}).code(), absl::StatusCode::kFailedPrecondition)
      << "the run keeps no ledger";
  config.mutable_training()->set_sample_ledger(true);
  trainer.Configure(config);
  ASSERT_TRUE(trainer.SetSamples({range}).ok());
  std::vector<Turn> seen;
  std::thread loop([&] { seen = TakeTurns(&trainer, &params, 3); });
  // 7 samples at 4 a step: 2 steps of the 5 asked, then 0, then none left.
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(5), 0.25);
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(5), 0) << "no samples left: no turn";
  shoal::v1::SampleRange next;
  next.set_epoch(2);
  next.set_begin(0);
  next.set_count(3);
  ASSERT_TRUE(trainer.SetSamples({next}).ok());
  EXPECT_DOUBLE_EQ(trainer.TrainSteps(1), 0.5) << "one step: a batch of the 3";
  trainer.Close();
  loop.join();
  ASSERT_EQ(seen.size(), 3u);
  const std::vector<int64_t> epoch1 = EpochPermutation(5, 1, 10);
  EXPECT_TRUE(seen[0].ledger);
  EXPECT_EQ(seen[0].steps, 2u);
  EXPECT_EQ(seen[0].batch, 4u);
  EXPECT_EQ(seen[0].samples, std::vector<int64_t>(epoch1.begin() + 2, epoch1.begin() + 9));
  const std::vector<int64_t> epoch2 = EpochPermutation(5, 2, 10);
  EXPECT_EQ(seen[1].steps, 1u);
  EXPECT_EQ(seen[1].samples, std::vector<int64_t>(epoch2.begin(), epoch2.begin() + 3));
  EXPECT_EQ(seen[2].kind, Turn::kClosed);
  next.set_begin(8);
  EXPECT_EQ(trainer.SetSamples({next}).code(), absl::StatusCode::kInvalidArgument)
      << "past the training set";
}

TEST(ExternalTrainerTest, ALoopThatDeclaredNoTrainingSetCannotFollowALedger) {
  std::vector<float> params(1);
  ExternalTrainer trainer(Options(&params));
  shoal::v1::RunConfig config;
  config.mutable_training()->set_sample_ledger(true);
  trainer.Configure(config);
  const absl::Status s = trainer.SetSamples({});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("train_samples=len(dataset)"), std::string::npos) << s;
}

// An audited run's config, with the ledger a replay reads its samples from.
shoal::v1::RunConfig AuditedConfig() {
  shoal::v1::RunConfig config;
  config.mutable_sync();
  config.mutable_training()->set_sample_ledger(true);
  config.mutable_training()->set_batch_size(4);
  config.mutable_training()->set_local_steps(3);
  config.mutable_training()->set_seed(5);
  config.mutable_trust()->set_audit_rate(1);
  return config;
}

TEST(ExternalTrainerTest, AReplayIsATurnOfTheLoopOnACopyOfTheBase) {
  std::vector<float> params(3, 7.0f);
  ExternalTrainerOptions o = Options(&params);
  o.train_samples = 20;
  o.replayable = true;
  ExternalTrainer trainer(o);
  trainer.Configure(AuditedConfig());
  const std::vector<float> base = {1.0f, 2.0f, 3.0f};
  shoal::v1::SampleRange range;
  range.set_epoch(0);
  range.set_begin(4);
  range.set_count(10);
  absl::StatusOr<std::string> hash;
  std::thread runner([&] { hash = trainer.Replay(base.data(), {range}, 6); });
  std::optional<Turn> t = trainer.AwaitTurn(absl::Seconds(30));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->kind, Turn::kReplay);
  EXPECT_EQ(t->round, 6u);
  EXPECT_EQ(t->batch, 4u);
  EXPECT_EQ(t->steps, 3u) << "10 samples at 4 a step, at most the round's 3 steps";
  const std::vector<int64_t> epoch0 = EpochPermutation(5, 0, 20);
  EXPECT_EQ(t->samples, std::vector<int64_t>(epoch0.begin() + 4, epoch0.begin() + 14));
  EXPECT_FALSE(t->pull) << "the module is not the replay's";
  EXPECT_FALSE(t->push);
  std::vector<float> copy(3);
  EXPECT_EQ(trainer.CopyReplayBase(copy.data(), 2).code(), absl::StatusCode::kFailedPrecondition)
      << "another size";
  ASSERT_TRUE(trainer.CopyReplayBase(copy.data(), 3).ok());
  EXPECT_EQ(copy, base);
  trainer.EndTurn(0.5);  // not how a replay ends: nothing happens
  trainer.EndReplay("abc", "");
  runner.join();
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, "abc");
  EXPECT_EQ(params, std::vector<float>(3, 7.0f)) << "the module's buffer is not touched";
  EXPECT_EQ(trainer.turns(), 0u) << "a replay is no training turn";
  EXPECT_EQ(trainer.CopyReplayBase(copy.data(), 3).code(), absl::StatusCode::kFailedPrecondition)
      << "no replay open any more";

  // The loop's replay failed: the runner hears why.
  std::thread failing([&] { hash = trainer.Replay(base.data(), {range}, 7); });
  ASSERT_TRUE(trainer.AwaitTurn(absl::Seconds(30)).has_value());
  trainer.EndReplay("", "RuntimeError: no dataset");
  failing.join();
  EXPECT_EQ(hash.status().code(), absl::StatusCode::kUnknown);
  EXPECT_NE(hash.status().message().find("no dataset"), std::string::npos) << hash.status();

  // Closed while the loop replays: the runner returns.
  std::thread closing([&] { hash = trainer.Replay(base.data(), {range}, 8); });
  ASSERT_TRUE(trainer.AwaitTurn(absl::Seconds(30)).has_value());
  trainer.Close();
  closing.join();
  EXPECT_EQ(hash.status().code(), absl::StatusCode::kCancelled);
}

TEST(ExternalTrainerTest, ReplaysNeedAnAuditedRunAndALoopThatHandedItsStep) {
  std::vector<float> params(1);
  const float base = 0;
  ExternalTrainerOptions o = Options(&params);
  o.train_samples = 20;
  ExternalTrainer no_step(o);
  no_step.Configure(AuditedConfig());
  EXPECT_EQ(no_step.Replay(&base, {}, 1).status().code(), absl::StatusCode::kUnimplemented);
  o.replayable = true;
  ExternalTrainer not_audited(o);
  shoal::v1::RunConfig config = AuditedConfig();
  config.mutable_trust()->set_audit_rate(0);
  not_audited.Configure(config);
  EXPECT_EQ(not_audited.Replay(&base, {}, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExternalTrainer audited(o);
  audited.Configure(AuditedConfig());
  shoal::v1::SampleRange past;
  past.set_begin(18);
  past.set_count(5);
  EXPECT_EQ(audited.Replay(&base, {past}, 1).status().code(), absl::StatusCode::kInvalidArgument)
      << "past the training set";
}

}  // namespace
}  // namespace shoal::worker
