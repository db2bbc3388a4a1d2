// A trainer whose steps are taken elsewhere: the training loop of a Python
// process (python/shoal, docs/PYTHON.md). The loop's module keeps its
// tensors in Shoal's flat buffer (each one a view of it), so the exchange
// averages them in place, as it does the built-in trainer's.
//
// Turns: the runner's thread calls TrainSteps(n) when the protocol wants n
// local steps. That opens a turn and waits; the loop, waiting in AwaitTurn,
// gets the model and n, trains on its own thread, and calls EndTurn with
// the mean loss. Between turns the loop does not touch the module (it waits
// in AwaitTurn), so the exchange owns the buffer exactly as with the
// built-in trainer. Close() ends the handover for good: a waiting
// TrainSteps returns, and so does every later one, at once.
//
// No Torch here: the loop's side (integer buffers mirrored, the module's
// views) is python/shoal's. Thread-safe.
#ifndef SHOAL_SERVICES_WORKER_CORE_EXTERNAL_TRAINER_H_
#define SHOAL_SERVICES_WORKER_CORE_EXTERNAL_TRAINER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/worker/core/trainer.h"

namespace shoal::worker {

struct ExternalTrainerOptions {
  // The flat buffer (owned by the loop's side, which keeps it alive as long
  // as the worker) and its layers.
  float* parameters = nullptr;
  uint64_t elements = 0;
  std::vector<LayerInfo> layers;
  // Samples in the loop's shard, when it says (0: unknown).
  size_t shard_size = 0;
};

class ExternalTrainer final : public Trainer {
 public:
  explicit ExternalTrainer(ExternalTrainerOptions options);

  // Trainer, on the runner's thread. TrainSteps waits for the loop to end
  // the turn (or Close()); its loss then, NaN when closed.
  double TrainSteps(uint32_t steps) override;
  void SetRound(uint64_t round) override;
  // The figures the loop reported since the last call (ReportMetrics);
  // evaluated() false when none.
  shoal::v1::Metrics Evaluate() override;
  // UNIMPLEMENTED: the model's forward is the loop's.
  absl::StatusOr<shoal::v1::Metrics> EvaluateParams(const float* params) override;
  std::vector<Prediction> Predict(int64_t n) override;
  float* parameters() override { return options_.parameters; }
  uint64_t num_elements() const override { return options_.elements; }
  const std::vector<LayerInfo>& layers() const override { return options_.layers; }
  size_t shard_size() const override { return options_.shard_size; }
  const std::vector<uint64_t>& shard_label_counts() const override { return no_counts_; }

  // The loop's side. The steps of the next turn once one is open (the
  // model is the loop's until EndTurn); 0 once closed; nullopt after
  // `timeout` without either.
  std::optional<uint32_t> AwaitTurn(absl::Duration timeout);
  // Ends the open turn with the mean loss of its steps.
  void EndTurn(double mean_loss);
  // Test-set figures for the next Evaluate.
  void ReportMetrics(const shoal::v1::Metrics& metrics);
  void Close();
  // Turns ended so far.
  uint64_t turns() const;
  // The synchronous round of the open (or last) turn; 0 in gossip mode.
  uint64_t round() const;

 private:
  const ExternalTrainerOptions options_;
  const std::vector<uint64_t> no_counts_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // The open turn's number and steps (0: none open), whether the loop took
  // it, and the number of the last turn ended.
  uint64_t turn_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  bool taken_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t ended_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  double loss_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<shoal::v1::Metrics> metrics_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_EXTERNAL_TRAINER_H_
