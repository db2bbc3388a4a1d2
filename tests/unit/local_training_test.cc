// Overlapped rounds (RunConfig.exchange.overlap, docs/OVERLAP.md): which
// round's local progress applies to which model (core/overlap_rule.h), and
// the carry that LocalTraining does with it, on a fake trainer whose
// steps add a known amount to every parameter.
#include "services/worker/local_training.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/overlap_rule.h"

namespace shoal::worker {
namespace {

TEST(OverlapRuleTest, NothingTrainedAheadMeansTrainingFromTheBase) {
  EXPECT_EQ(DecideAhead(AheadWork{}, 1, 0), AheadUse::kRestart);
  EXPECT_EQ(DecideAhead(AheadWork{}, 7, 6), AheadUse::kRestart);
}

TEST(OverlapRuleTest, WorkAheadCarriesOntoTheAgreedModelOfTheRoundBefore) {
  // Started from the contribution to round 4, for round 5.
  const AheadWork work{true, 5};
  EXPECT_EQ(DecideAhead(work, 5, 4), AheadUse::kCarry);
}

TEST(OverlapRuleTest, ARoundThatStartsAgainLetsTheWorkAheadGo) {
  // Round 4 was aborted and starts again: the steps were for round 5.
  const AheadWork work{true, 5};
  EXPECT_EQ(DecideAhead(work, 4, 3), AheadUse::kRestart);
}

TEST(OverlapRuleTest, AWorkerThatCaughtUpPastTheRoundLetsItGo) {
  // It fell behind and the run moved on: round 9 from the model of round 8.
  const AheadWork work{true, 5};
  EXPECT_EQ(DecideAhead(work, 9, 8), AheadUse::kRestart);
}

TEST(OverlapRuleTest, WorkAheadNeverCarriesOntoAnotherBase) {
  // The right round, but the model held is not the round before's (a
  // catch-up failed and the worker holds an older one).
  const AheadWork work{true, 5};
  EXPECT_EQ(DecideAhead(work, 5, 3), AheadUse::kRestart);
  EXPECT_EQ(DecideAhead(work, 5, 5), AheadUse::kRestart);
}

// Each step adds `step` to every parameter of its own buffer; counts the
// steps and keeps the buffer's values at the start of every TrainSteps
// call (the runner's thread trains a round at once, the work ahead a step
// per call).
class AddingTrainer : public Trainer {
 public:
  AddingTrainer(uint64_t n, float step) : params_(n, 0.0f), step_(step) {}
  double TrainSteps(uint32_t steps) override {
    {
      absl::MutexLock lock(&seen_mu_);
      seen_.push_back(params_);
    }
    for (uint32_t s = 0; s < steps; ++s) {
      Step();
      ++steps_;
    }
    return 0.5;
  }
  virtual void Step() {
    for (float& p : params_) p += step_;
  }
  shoal::v1::Metrics Evaluate() override { return {}; }
  absl::StatusOr<shoal::v1::Metrics> EvaluateParams(const float*) override {
    return shoal::v1::Metrics();
  }
  std::vector<Prediction> Predict(int64_t) override { return {}; }
  float* parameters() override { return params_.data(); }
  uint64_t num_elements() const override { return params_.size(); }
  const std::vector<LayerInfo>& layers() const override { return layers_; }
  size_t shard_size() const override { return 0; }
  const std::vector<uint64_t>& shard_label_counts() const override { return counts_; }

  // Waits (bounded: a hang guard) until `n` steps ran.
  void AwaitSteps(uint64_t n) {
    for (int i = 0; i < 10000 && steps_.load() < n; ++i) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_GE(steps_.load(), n);
  }
  // The buffer at the start of the `k`-th TrainSteps call.
  std::vector<float> Seen(size_t k) {
    absl::MutexLock lock(&seen_mu_);
    return k < seen_.size() ? seen_[k] : std::vector<float>();
  }

  std::vector<float> params_;
  float step_;
  std::atomic<uint64_t> steps_{0};
  absl::Mutex seen_mu_;
  std::vector<std::vector<float>> seen_ ABSL_GUARDED_BY(seen_mu_);
  std::vector<LayerInfo> layers_;
  std::vector<uint64_t> counts_;
};

class LocalTrainingTest : public ::testing::Test {
 protected:
  // The trainer outlives the overlap (its Stop writes the trainer's model).
  AddingTrainer trainer_{4, 1.0f};
  CancellationToken parent_;
  LocalTraining overlap_{&parent_};
};

TEST_F(LocalTrainingTest, TheFirstRoundTrainsNowAndTheNextOneAhead) {
  float* params = overlap_.Bind(&trainer_);
  ASSERT_NE(params, trainer_.parameters());  // two buffers
  const LocalTraining::Round r = overlap_.TrainRound(1, 0, 3, params);
  EXPECT_EQ(r.use, AheadUse::kRestart);
  // The contribution: the base (0) plus 3 steps.
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(params[i], 3.0f);
  EXPECT_TRUE(overlap_.ahead().started);
  EXPECT_EQ(overlap_.ahead().for_round, 2u);
  // Round 2's steps run ahead once round 1's plan came, from the
  // contribution to round 1.
  overlap_.Release();
  trainer_.AwaitSteps(6);
  EXPECT_EQ(trainer_.Seen(1), std::vector<float>(4, 3.0f));
  overlap_.Stop();
}

TEST_F(LocalTrainingTest, ProgressAheadIsCarriedOntoTheAgreedModel) {
  float* params = overlap_.Bind(&trainer_);
  overlap_.TrainRound(1, 0, 2, params);  // contribution 2
  overlap_.Release();
  trainer_.AwaitSteps(4);  // 2 steps ahead: local 4
  // Round 1 is averaged with the others': the agreed model is 10.
  for (int i = 0; i < 4; ++i) params[i] = 10.0f;
  const LocalTraining::Round r = overlap_.TrainRound(2, 1, 2, params);
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_DOUBLE_EQ(r.loss, 0.5);
  // C_2 = G_1 + (L - C_1) = 10 + (4 - 2): one round of progress, no more.
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(params[i], 12.0f);
  // The local model continues from the contribution (the round's first
  // TrainSteps, then two steps ahead per round).
  overlap_.Release();
  trainer_.AwaitSteps(6);
  EXPECT_EQ(trainer_.Seen(3), std::vector<float>(4, 12.0f));
  overlap_.Stop();
  EXPECT_EQ(overlap_.carried(), 1u);
  EXPECT_EQ(overlap_.restarted(), 1u);
}

TEST_F(LocalTrainingTest, ARoundStartedAgainTrainsFromItsBase) {
  float* params = overlap_.Bind(&trainer_);
  overlap_.TrainRound(1, 0, 2, params);  // ahead: round 2
  // Round 1 was aborted; it starts again from the model of round 0 (5).
  for (int i = 0; i < 4; ++i) params[i] = 5.0f;
  const LocalTraining::Round r = overlap_.TrainRound(1, 0, 2, params);
  EXPECT_EQ(r.use, AheadUse::kRestart);
  // Nothing of the steps ahead: the base plus this round's steps.
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(params[i], 7.0f);
  overlap_.Stop();
}

TEST_F(LocalTrainingTest, StopEndsTheStepsAheadAndNothingStartsAfterIt) {
  float* params = overlap_.Bind(&trainer_);
  overlap_.TrainRound(1, 0, 1000000, params);
  overlap_.Release();
  overlap_.Stop();
  overlap_.Stop();  // idempotent
  EXPECT_TRUE(overlap_.stop()->cancelled());
  // The steps ahead ended long before their million (Stop joined them).
  const uint64_t steps = trainer_.steps_.load();
  EXPECT_LT(steps, 2000000u);
  EXPECT_EQ(trainer_.steps_.load(), steps);
}

TEST_F(LocalTrainingTest, TheWorkersStopStopsIt) {
  overlap_.Bind(&trainer_);
  parent_.Cancel();
  EXPECT_TRUE(overlap_.stop()->cancelled());
}

// Each step doubles every parameter, and runs only once the test allows
// it, so the test knows where an average comes in.
class GatedTrainer : public AddingTrainer {
 public:
  explicit GatedTrainer(uint64_t n) : AddingTrainer(n, 0.0f) {}
  void Step() override {
    absl::MutexLock lock(&mu_);
    ++entered_;
    mu_.Await(absl::Condition(
        +[](GatedTrainer* t) { return t->allowed_ > 0; }, this));
    --allowed_;
    for (float& p : params_) p *= 2;
  }
  void Allow(int n) {
    absl::MutexLock lock(&mu_);
    allowed_ += n;
  }
  // Waits until `n` steps started (the last one maybe blocked in Step).
  void AwaitEntered(int n) {
    absl::MutexLock lock(&mu_);
    want_entered_ = n;
    mu_.AwaitWithTimeout(absl::Condition(this, &GatedTrainer::EnteredEnough), absl::Seconds(10));
  }

 private:
  absl::Mutex mu_;
  int allowed_ ABSL_GUARDED_BY(mu_) = 0;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  int want_entered_ ABSL_GUARDED_BY(mu_) = 0;
  bool EnteredEnough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return entered_ >= want_entered_;
  }
};

TEST(LocalTrainingMergeTest, TheAverageIsTakenBetweenTwoStepsAhead) {
  GatedTrainer trainer(2);
  CancellationToken parent;
  LocalTraining overlap(&parent);
  trainer.params_ = {1.0f, 1.0f};
  float* params = overlap.Bind(&trainer);
  trainer.Allow(3);
  overlap.TrainRound(1, 0, 3, params);  // 1 -> 8: the contribution
  ASSERT_FLOAT_EQ(params[0], 8.0f);
  overlap.Release();        // round 1's plan came
  trainer.Allow(1);         // the first step ahead: 16
  trainer.AwaitEntered(5);  // the second one waits in Step (its check is past)
  // The exchange's average of round 1 is 10: before the third step the
  // local model moves by 10 - 8.
  const std::vector<float> average = {10.0f, 10.0f};
  overlap.Post(average.data());
  trainer.Allow(2);                               // 32, then 34 -> 68
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;  // round 1 committed
  const LocalTraining::Round r = overlap.TrainRound(2, 1, 3, params);
  EXPECT_EQ(r.use, AheadUse::kCarry);
  // C_2 = G_1 + (L - 10) = 10 + (68 - 10): the third step trained from
  // the average; without it the carry would be 10 + (64 - 8) = 66.
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 68.0f);
  EXPECT_EQ(overlap.merged_early(), 1u);
  trainer.Allow(1000);
  overlap.Stop();
}

TEST(LocalTrainingMergeTest, StepsAheadWaitForThePlanOrTheAverage) {
  GatedTrainer trainer(2);
  trainer.params_ = {1.0f, 1.0f};
  CancellationToken parent;
  LocalTraining overlap(&parent);
  float* params = overlap.Bind(&trainer);
  trainer.Allow(1000);
  overlap.TrainRound(1, 0, 2, params);
  // Ready, the others are not: nothing trains from the stale model.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(trainer.steps_.load(), 2u);
  // The average of a round whose plan this worker never saw (it came by
  // another attempt's exchange) ends the hold too.
  const std::vector<float> average = {3.0f, 3.0f};
  overlap.Post(average.data());
  trainer.AwaitSteps(4);
  overlap.Stop();
}

TEST(LocalTrainingMergeTest, HeldStepsTrainAtTheNextRoundStart) {
  GatedTrainer trainer(2);
  trainer.params_ = {1.0f, 1.0f};
  CancellationToken parent;
  LocalTraining overlap(&parent);
  float* params = overlap.Bind(&trainer);
  trainer.Allow(1000);
  overlap.TrainRound(1, 0, 2, params);  // contribution 4, held
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;
  // Round 1 completed without this worker's exchange (no plan, no
  // average): its steps for round 2 train now, and carry.
  const LocalTraining::Round r = overlap.TrainRound(2, 1, 2, params);
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_EQ(r.steps, 2u);
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 10.0f + 16.0f - 4.0f);
  overlap.Stop();
}

// Steps that multiply by 1.1 (inexact in float), for bit comparisons.
class ScalingTrainer : public AddingTrainer {
 public:
  explicit ScalingTrainer(uint64_t n) : AddingTrainer(n, 0.0f) {}
  void Step() override {
    for (float& p : params_) p = p * 1.1f + 0.3f;
  }
};

TEST(LocalTrainingMergeTest, AnAverageBeforeTheFirstStepGivesTheBitsOfAPlainRound) {
  // The average comes before any step ahead: the round is then the plain
  // round, bit for bit (the carry's arithmetic is skipped where nothing
  // moved), so a run whose exchanges are never overlapped by a step
  // agrees with the same run without --overlap.
  ScalingTrainer trainer(3);
  trainer.params_ = {0.7f, -1.3f, 2.9f};
  CancellationToken parent;
  LocalTraining overlap(&parent);
  float* params = overlap.Bind(&trainer);
  overlap.TrainRound(1, 0, 5, params);
  const std::vector<float> average = {0.123f, -4.56f, 7.89f};
  overlap.Post(average.data());  // before the plan's Release: no step ran
  trainer.AwaitSteps(10);
  std::copy(average.begin(), average.end(), params);  // round 1 committed
  overlap.TrainRound(2, 1, 5, params);
  std::vector<float> plain = average;
  for (int s = 0; s < 5; ++s) {
    for (float& p : plain) p = p * 1.1f + 0.3f;
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(params[i], plain[i]) << i;  // bits, not FLOAT_EQ
  overlap.Stop();
}

TEST(LocalTrainingMergeTest, AnAverageAfterTheLastStepIsTakenAtTheRoundStart) {
  GatedTrainer trainer(2);
  CancellationToken parent;
  LocalTraining overlap(&parent);
  trainer.params_ = {1.0f, 1.0f};
  float* params = overlap.Bind(&trainer);
  trainer.Allow(4);
  overlap.TrainRound(1, 0, 2, params);  // contribution 4
  overlap.Release();
  trainer.AwaitSteps(4);  // both steps ahead ended: 16
  const std::vector<float> average = {10.0f, 10.0f};
  overlap.Post(average.data());
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;
  overlap.TrainRound(2, 1, 2, params);
  // The plain delayed carry: 10 + (16 - 4).
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 22.0f);
  EXPECT_EQ(overlap.merged_early(), 0u);
  trainer.Allow(1000);
  overlap.Stop();
}

// ---- The average read in place (no copy of it), through the worker's
// ModelState: a rewrite of X closes its window first.

TEST(LocalTrainingInPlaceTest, TheStepsAheadReadTheAverageFromTheAgreedModel) {
  GatedTrainer trainer(2);
  trainer.params_ = {1.0f, 1.0f};
  CancellationToken parent;
  LocalTraining overlap(&parent);
  ModelState state;
  float* params = overlap.Bind(&trainer, &state);
  state.Bind(params, 2, "test");
  // Held beyond the trainer's: X and S, no buffer for what is posted.
  EXPECT_EQ(overlap.model_bytes(), 2 * 2 * sizeof(float));
  trainer.Allow(3);
  overlap.TrainRound(1, 0, 3, params);  // 1 -> 8: the contribution
  overlap.Release();
  trainer.Allow(1);         // the first step ahead: 16
  trainer.AwaitEntered(5);  // the second one waits in Step
  // The exchange averages into X (10), which holds the average until the
  // round is settled.
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;
  overlap.Post(params);
  trainer.Allow(2);  // 32; then the average: 34 -> 68
  const LocalTraining::Round r = overlap.TrainRound(2, 1, 3, params);
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_EQ(overlap.merged_early(), 1u);
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 68.0f);
  EXPECT_EQ(state.chunks_lent(ModelState::Buffer::kParameters), 0);
  EXPECT_EQ(overlap.model_bytes(), 2 * 2 * sizeof(float));
  trainer.Allow(1000);
  overlap.Stop();
}

TEST(LocalTrainingInPlaceTest, AnAverageRewrittenBeforeItIsTakenIsLeftToTheRoundStart) {
  GatedTrainer trainer(2);
  trainer.params_ = {1.0f, 1.0f};
  CancellationToken parent;
  LocalTraining overlap(&parent);
  ModelState state;
  float* params = overlap.Bind(&trainer, &state);
  state.Bind(params, 2, "test");
  trainer.Allow(3);
  overlap.TrainRound(1, 0, 3, params);  // contribution 8
  overlap.Release();
  trainer.Allow(1);  // 16
  trainer.AwaitEntered(5);
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;
  overlap.Post(params);
  // Before the next step takes it, the average is void and the worker
  // catches up to the run's round 1 (12): as ModelMemory does, the window
  // of X closes, its lent chunks come back, and X is rewritten.
  state.Unready();
  ASSERT_TRUE(state.AwaitReturned(ModelState::Buffer::kParameters, absl::Seconds(10)));
  for (int i = 0; i < 2; ++i) params[i] = 12.0f;
  trainer.Allow(2);  // 32, 64: nothing taken between them
  trainer.AwaitSteps(6);
  const LocalTraining::Round r = overlap.TrainRound(2, 1, 3, params);
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_EQ(overlap.merged_early(), 0u);
  EXPECT_EQ(r.stale_steps, 3u);
  // The carry onto the model the worker holds: 12 + (64 - 8). Taking the
  // void 10 would have given 74, taking X as rewritten 80.
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 68.0f);
  trainer.Allow(1000);
  overlap.Stop();
}

TEST(LocalTrainingInPlaceTest, TheStepsAheadTakeTheAverageWhileTheRoundStartWaitsForThem) {
  GatedTrainer trainer(2);
  trainer.params_ = {1.0f, 1.0f};
  CancellationToken parent;
  LocalTraining overlap(&parent);
  ModelState state;
  float* params = overlap.Bind(&trainer, &state);
  state.Bind(params, 2, "test");
  trainer.Allow(3);
  overlap.TrainRound(1, 0, 3, params);  // contribution 8
  overlap.Release();
  trainer.Allow(1);  // 16
  trainer.AwaitEntered(5);
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;  // round 1's average, agreed
  overlap.Post(params);
  // Round 2 starts at once (a short exchange): ModelMemory::Train closes
  // X's window ahead of its write, which comes only after the steps ahead.
  state.BeginTraining(2);
  LocalTraining::Round r;
  std::thread round([&] { r = overlap.TrainRound(2, 1, 3, params); });
  for (int i = 0; i < 10000 && !overlap.round_waits(); ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(overlap.round_waits());
  trainer.Allow(2);  // 32; the average (X, unchanged): 34 -> 68
  round.join();
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_EQ(overlap.merged_early(), 1u);
  EXPECT_EQ(r.stale_steps, 2u);
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 68.0f);
  trainer.Allow(1000);
  overlap.Stop();
}

// The model lives apart from the buffer, as a Python module in bf16 or on
// a GPU does (ExternalTrainer on request): a step trains `module_`, pulled
// from the buffer when it was written since; the buffer holds the model
// only after SyncParameters. Progress that local training reads without a
// sync is lost, so the figures below show every sync it owes.
class MirroringTrainer : public AddingTrainer {
 public:
  MirroringTrainer(uint64_t n, float step) : AddingTrainer(n, step), module_(n, 0.0f) {}
  double TrainSteps(uint32_t steps) override {
    if (stale_ || !on_request_) module_ = params_;
    stale_ = false;
    {
      absl::MutexLock lock(&seen_mu_);
      seen_.push_back(module_);
    }
    for (uint32_t s = 0; s < steps; ++s) {
      for (float& p : module_) p += step_;
      ++steps_;
    }
    if (on_request_) {
      unpushed_ = true;
    } else {
      params_ = module_;
    }
    return 0.5;
  }
  void SyncOnRequest() override { on_request_ = true; }
  void SyncParameters() override {
    if (unpushed_) params_ = module_;
    unpushed_ = false;
    stale_ = true;
  }

  std::vector<float> module_;
  bool on_request_ = false;
  bool stale_ = true;
  bool unpushed_ = false;
};

TEST(LocalTrainingSyncTest, AModelApartFromTheBufferIsSyncedWhereItIsUsed) {
  MirroringTrainer trainer(2, 1.0f);
  CancellationToken parent;
  LocalTraining overlap(&parent, true, nullptr, AheadOptions{0, 2});
  float* params = overlap.Bind(&trainer);
  EXPECT_TRUE(trainer.on_request_);
  overlap.TrainRound(1, 0, 3, params);  // contribution 3
  const std::vector<float> average = {10.0f, 10.0f};
  overlap.Post(average.data());
  trainer.AwaitSteps(6);
  // Two steps from the contribution, then the average between two steps:
  // 5 + (10 - 3). Without a sync before it, the merge would have seen the
  // buffer at 3 and the module would restart from 10.
  EXPECT_EQ(trainer.Seen(1), std::vector<float>(2, 3.0f));
  EXPECT_EQ(trainer.Seen(2), std::vector<float>(2, 4.0f));
  EXPECT_EQ(trainer.Seen(3), std::vector<float>(2, 12.0f));
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;
  // The carry reads the steps' progress (13) after they ended.
  overlap.TrainRound(2, 1, 3, params);
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 13.0f);
  overlap.Release();
  trainer.AwaitSteps(7);  // the first step ahead (the third waits for an average)
  EXPECT_EQ(trainer.Seen(4), std::vector<float>(2, 13.0f));
  overlap.Stop();
  // At the stop the buffer takes the agreed model, and the module takes
  // the buffer at its next pull.
  EXPECT_EQ(trainer.params_, std::vector<float>(2, 13.0f));
  EXPECT_TRUE(trainer.stale_);
}

// ---- Streaming fragments (RunConfig.exchange.fragments).

TEST(LocalTrainingFragmentsTest, EachRoundContributesItsFragmentAndKeepsTheRestLocal) {
  // Not overlapped: the steps train at the round's start, nothing ahead.
  AddingTrainer trainer(8, 1.0f);
  CancellationToken parent;
  LocalTraining local(&parent, /*ahead=*/false);
  EXPECT_FALSE(local.overlapped());
  float* params = local.Bind(&trainer);
  // Round 1 averages fragment [0, 4): the contribution there, the agreed
  // model (0) elsewhere.
  LocalTraining::Round r = local.TrainRound(1, 0, 2, params, {0, 4});
  EXPECT_EQ(r.use, AheadUse::kRestart);
  EXPECT_EQ(std::vector<float>(params, params + 8), (std::vector<float>{2, 2, 2, 2, 0, 0, 0, 0}));
  // Nothing trains ahead.
  local.Release();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(trainer.steps_.load(), 2u);
  // Round 1's average of [0, 4) is 6; round 2 averages [4, 8). The local
  // model takes 6 there (its progress since the contribution: none) and
  // keeps its 2 steps on [4, 8): 2 + 2 more steps = 4.
  for (int i = 0; i < 4; ++i) params[i] = 6;
  r = local.TrainRound(2, 1, 2, params, {4, 8});
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_EQ(r.stale_steps, 0u);
  EXPECT_EQ(std::vector<float>(params, params + 8), (std::vector<float>{6, 6, 6, 6, 4, 4, 4, 4}));
  // Round 2's average of [4, 8) is 9. Round 3 averages [0, 4) again: its
  // contribution is the agreed 6 plus the 4 steps since (rounds 2 and 3).
  for (int i = 4; i < 8; ++i) params[i] = 9;
  r = local.TrainRound(3, 2, 2, params, {0, 4});
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_EQ(std::vector<float>(params, params + 8),
            (std::vector<float>{10, 10, 10, 10, 9, 9, 9, 9}));
  // The local model: [0, 4) continues from the contribution, [4, 8) took
  // 9 and trained 2 steps since.
  EXPECT_EQ(trainer.params_, (std::vector<float>{10, 10, 10, 10, 11, 11, 11, 11}));
  EXPECT_EQ(trainer.steps_.load(), 6u);
  local.Stop();
  // At exit the trainer holds the agreed model.
  EXPECT_EQ(trainer.params_, std::vector<float>(params, params + 8));
  EXPECT_EQ(local.carried(), 2u);
  EXPECT_EQ(local.restarted(), 1u);
}

TEST(LocalTrainingFragmentsTest, ARoundThatDoesNotFollowItsBaseRestartsTheLocalModel) {
  AddingTrainer trainer(4, 1.0f);
  CancellationToken parent;
  LocalTraining local(&parent, /*ahead=*/false);
  float* params = local.Bind(&trainer);
  local.TrainRound(1, 0, 3, params, {0, 2});  // local 3 everywhere
  // The worker caught up to the model of round 7 (20 everywhere): the
  // local progress of rounds before it does not apply to that model.
  for (int i = 0; i < 4; ++i) params[i] = 20;
  const LocalTraining::Round r = local.TrainRound(8, 7, 1, params, {2, 4});
  EXPECT_EQ(r.use, AheadUse::kRestart);
  EXPECT_EQ(std::vector<float>(params, params + 4), (std::vector<float>{20, 20, 21, 21}));
  EXPECT_EQ(trainer.params_, std::vector<float>(4, 21.0f));
  local.Stop();
}

TEST(LocalTrainingFragmentsTest, StepsAheadKeepTheProgressOutsideTheFragment) {
  // Overlapped and fragmented: round 2's steps run ahead from the local
  // model, which keeps round 1's progress outside round 1's fragment.
  AddingTrainer trainer(4, 1.0f);
  CancellationToken parent;
  LocalTraining local(&parent, /*ahead=*/true);
  float* params = local.Bind(&trainer);
  local.TrainRound(1, 0, 2, params, {0, 2});
  EXPECT_EQ(std::vector<float>(params, params + 4), (std::vector<float>{2, 2, 0, 0}));
  local.Release();
  trainer.AwaitSteps(4);
  EXPECT_EQ(trainer.Seen(1), std::vector<float>(4, 2.0f));
  // Round 1's average of [0, 2) is 5, taken after the steps ahead ended.
  const std::vector<float> average = {5, 5, 0, 0};
  local.Post(average.data());
  params[0] = params[1] = 5;
  const LocalTraining::Round r = local.TrainRound(2, 1, 2, params, {2, 4});
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_EQ(r.stale_steps, 2u);
  // [2, 4): 4 steps of progress (rounds 1 and 2) onto the agreed 0.
  EXPECT_EQ(std::vector<float>(params, params + 4), (std::vector<float>{5, 5, 4, 4}));
  local.Stop();
}

// AheadOptions::stale_steps and ::extrapolate (RunConfig.exchange.
// overlap_stale_steps / overlap_start; docs/OVERLAP.md).

TEST(LocalTrainingAheadOptionsTest, AnEarlyAverageIsHeldUntilTheStaleStep) {
  AddingTrainer trainer(2, 1.0f);
  CancellationToken parent;
  LocalTraining overlap(&parent, true, nullptr, AheadOptions{0, 2});
  float* params = overlap.Bind(&trainer);
  overlap.TrainRound(1, 0, 3, params);  // contribution 3
  const std::vector<float> average = {10.0f, 10.0f};
  overlap.Post(average.data());  // before any step ahead
  trainer.AwaitSteps(6);
  // Two steps from the contribution (3, 4), then the average: 5 + (10 - 3).
  EXPECT_EQ(trainer.Seen(1), std::vector<float>(2, 3.0f));
  EXPECT_EQ(trainer.Seen(2), std::vector<float>(2, 4.0f));
  EXPECT_EQ(trainer.Seen(3), std::vector<float>(2, 12.0f));
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;
  const LocalTraining::Round r = overlap.TrainRound(2, 1, 3, params);
  EXPECT_EQ(r.stale_steps, 2u);
  EXPECT_EQ(overlap.merged_early(), 1u);
  // C_2 = 10 + 3 steps, as without the hold.
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 13.0f);
  overlap.Stop();
}

TEST(LocalTrainingAheadOptionsTest, TheStaleStepWaitsForALateAverage) {
  AddingTrainer trainer(2, 1.0f);
  CancellationToken parent;
  LocalTraining overlap(&parent, true, nullptr, AheadOptions{0, 1});
  float* params = overlap.Bind(&trainer);
  overlap.TrainRound(1, 0, 3, params);  // contribution 3
  overlap.Release();
  trainer.AwaitSteps(4);  // one step ahead (4); the second waits for the average
  const std::vector<float> average = {10.0f, 10.0f};
  overlap.Post(average.data());
  trainer.AwaitSteps(6);
  // Had the second step not waited, it would have seen 4.
  EXPECT_EQ(trainer.Seen(2), std::vector<float>(2, 11.0f));
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;
  EXPECT_EQ(overlap.TrainRound(2, 1, 3, params).stale_steps, 1u);
  overlap.Stop();
}

TEST(LocalTrainingAheadOptionsTest, ANextRoundWithoutAnAverageEndsTheWait) {
  AddingTrainer trainer(2, 1.0f);
  CancellationToken parent;
  LocalTraining overlap(&parent, true, nullptr, AheadOptions{0, 1});
  float* params = overlap.Bind(&trainer);
  overlap.TrainRound(1, 0, 3, params);  // contribution 3
  overlap.Release();
  trainer.AwaitSteps(4);
  // Round 1 completed without this worker's average (a catch-up); round
  // 2 starts on its agreed model: the wait ends, and nothing hangs.
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;
  const LocalTraining::Round r = overlap.TrainRound(2, 1, 3, params);
  EXPECT_EQ(r.use, AheadUse::kCarry);
  EXPECT_EQ(r.steps, 3u);
  // 10 + one round of progress.
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 13.0f);
  overlap.Stop();
}

TEST(LocalTrainingAheadOptionsTest, ExtrapolatedStepsStartFromTheAgreedModelsNextMove) {
  AddingTrainer trainer(2, 1.0f);
  CancellationToken parent;
  LocalTraining overlap(&parent, true, nullptr, AheadOptions{1.0, 0});
  float* params = overlap.Bind(&trainer);
  overlap.TrainRound(1, 0, 2, params);  // contribution 2
  overlap.Release();
  trainer.AwaitSteps(4);
  // No agreed move seen yet: the steps ahead start from the contribution.
  EXPECT_EQ(trainer.Seen(1), std::vector<float>(2, 2.0f));
  for (int i = 0; i < 2; ++i) params[i] = 10.0f;  // G_1 (G_0 = 0)
  overlap.TrainRound(2, 1, 2, params);
  // C_2 = 10 + (4 - 2): the contribution is unchanged by the option.
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 12.0f);
  overlap.Release();
  trainer.AwaitSteps(6);
  // The steps ahead start from G_1 + (G_1 - G_0) = 20.
  EXPECT_EQ(trainer.Seen(3), std::vector<float>(2, 20.0f));
  for (int i = 0; i < 2; ++i) params[i] = 25.0f;  // G_2
  overlap.TrainRound(3, 2, 2, params);
  // Their progress (22 - 20) carries onto G_2: still one round's, no more.
  for (int i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(params[i], 27.0f);
  overlap.Release();
  trainer.AwaitSteps(8);
  EXPECT_EQ(trainer.Seen(5), std::vector<float>(2, 40.0f));  // 25 + (25 - 10)
  overlap.Stop();
}

TEST(LocalTrainingAheadOptionsTest, ExtrapolationMovesOnlyTheRoundsFragment) {
  AddingTrainer trainer(4, 1.0f);
  CancellationToken parent;
  LocalTraining overlap(&parent, true, nullptr, AheadOptions{0.5, 0});
  float* params = overlap.Bind(&trainer);
  overlap.TrainRound(1, 0, 2, params, {0, 2});  // fragment [0, 2): 2
  overlap.Release();
  trainer.AwaitSteps(4);
  params[0] = params[1] = 10.0f;  // G_1 on the fragment; [2, 4) stays 0
  overlap.TrainRound(2, 1, 2, params, {2, 4});
  // Round 2 averages [2, 4): the local progress there (4 steps) is its
  // contribution, and the last move ([0, 2): 0 -> 10) is not its fragment.
  EXPECT_FLOAT_EQ(params[0], 10.0f);
  EXPECT_FLOAT_EQ(params[2], 4.0f);
  overlap.Release();
  trainer.AwaitSteps(6);
  // [0, 2): the local model took G_1 (10 + 2 steps of progress since the
  // contribution); [2, 4): no move seen there yet, from the contribution.
  EXPECT_EQ(trainer.Seen(3), (std::vector<float>{12.0f, 12.0f, 4.0f, 4.0f}));
  params[2] = params[3] = 20.0f;  // G_2 on [2, 4)
  overlap.TrainRound(3, 2, 2, params, {0, 2});
  overlap.Release();
  trainer.AwaitSteps(8);
  // Round 3 averaged [0, 2): its steps ahead start there from
  // G + 0.5 (G - G_before) = 10 + 5; [2, 4) carried G_2: 20 + 2.
  EXPECT_EQ(trainer.Seen(5), (std::vector<float>{15.0f, 15.0f, 22.0f, 22.0f}));
  overlap.Stop();
}

}  // namespace
}  // namespace shoal::worker
