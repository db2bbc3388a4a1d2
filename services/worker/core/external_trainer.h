// A trainer whose steps are taken elsewhere: the training loop of a Python
// process (python/shoal, docs/PYTHON.md). The loop's module stands behind
// Shoal's flat float32 buffer: its float32 CPU tensors are views of it (the
// exchange averages them in place, as it does the built-in trainer's), its
// other tensors (bf16, fp16, CUDA) keep their own memory and are synced
// with the buffer, which holds their float32 master values, at the turns'
// edges (python/shoal's _Sync).
//
// Turns: the runner's thread calls TrainSteps(n) when the protocol wants n
// local steps. That opens a turn and waits; the loop, waiting in AwaitTurn,
// gets the turn, trains n steps on its own thread, and calls EndTurn with
// the mean loss. Between turns the loop does not touch the module (it waits
// in AwaitTurn), so whoever writes the buffer between two TrainSteps calls
// never races the loop. Close() ends the handover for good: a waiting
// TrainSteps returns, and so does every later one, at once.
//
// Syncing the buffer and the module. By default every training turn tells
// the loop to take the buffer first (`pull`: the exchange may have written
// it) and to give its progress back at the end (`push`: the exchange reads
// it next). Local training (services/worker/local_training.h: overlapped
// rounds and fragments) trains a step per turn and touches the buffer only
// at a few points; it calls SyncOnRequest() once, and then SyncParameters()
// before each of those points: that opens a turn of no steps in which the
// loop only pushes (skipped when nothing trained since the last push), and
// the next training turn pulls. So a bf16 or CUDA module is copied when the
// buffer is used, not twice per step; a float32 CPU module costs nothing
// either way.
//
// The sample ledger (RunConfig.training.sample_ledger, docs/DATA.md): the
// loop declares its training set's size (options.train_samples); SetSamples
// names a round's samples as positions of the run's per-epoch permutation,
// which this class turns into indices of the loop's training set
// (sample_order.h, as the built-in trainer does), and TrainSteps hands the
// loop a batch of them (the run's batch_size) per step, in order: a turn
// trains fewer steps when they run out, and none is opened when none is
// left. The loop trains exactly the turn's samples (python/shoal's
// Worker.sampler() and Worker.batches()).
//
// Audits (RunConfig.trust.audit_rate, docs/PYTHON.md "Audits"): a loop
// that handed Shoal its step and optimizer (options.replayable) replays
// another member's round on its own thread. Replay, on the runner's thread,
// opens a turn of kind kReplay naming the round, its samples and steps; the
// loop copies the round's base into a second instance of its module
// (CopyReplayBase), trains it as the participant trained the round, and
// ends the turn with the result's hash (EndReplay). So a replay never runs
// beside the loop's own steps, and torch's global generator and threads,
// which both use, are the loop's alone at any time.
//
// No Torch here: the loop's side (the casts, the views) is python/shoal's.
// Thread-safe; one caller opens turns at a time (a second one waits).
#ifndef SHOAL_SERVICES_WORKER_CORE_EXTERNAL_TRAINER_H_
#define SHOAL_SERVICES_WORKER_CORE_EXTERNAL_TRAINER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/worker/core/sample_order.h"
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
  // Samples in the loop's whole training set, when it says: the sample
  // ledger's positions are over them (0: the loop cannot follow a ledger).
  uint64_t train_samples = 0;
  // The loop handed Shoal its step and optimizer: it can replay a round.
  bool replayable = false;
};

class ExternalTrainer final : public Trainer {
 public:
  explicit ExternalTrainer(ExternalTrainerOptions options);

  // The run's configuration, given when the host makes its trainer (each
  // join): whether it keeps a sample ledger, its seed (the permutations)
  // and batch size (samples per step).
  void Configure(const shoal::v1::RunConfig& config);

  // Trainer, on the runner's (or local training's) thread. TrainSteps
  // waits for the loop to end the turn (or Close()); its loss then, NaN
  // when closed.
  double TrainSteps(uint32_t steps) override;
  void SetRound(uint64_t round) override;
  // An audit's replay, by the loop (see the file comment): waits until the
  // loop ends the replay turn (EndReplay) or Close(). FAILED_PRECONDITION in
  // a run without audits, UNIMPLEMENTED for a loop that handed no step,
  // INVALID_ARGUMENT for samples past the training set, CANCELLED once
  // closed, UNKNOWN with the loop's message when its replay failed.
  absl::StatusOr<std::string> Replay(const float* base,
                                     absl::Span<const shoal::v1::SampleRange> samples,
                                     uint64_t round) override;
  // The ledger's samples of the next training turns (the round's).
  // FAILED_PRECONDITION in a run without a ledger or for a loop that did not
  // declare its training set; INVALID_ARGUMENT for a range past it.
  absl::Status SetSamples(absl::Span<const shoal::v1::SampleRange> ranges) override;
  uint64_t train_samples() const override { return options_.train_samples; }
  void SyncOnRequest() override;
  // Waits for the loop's push when it trained since the last one (or
  // Close()).
  void SyncParameters() override;
  bool ComputesOnCallingThread() const override { return false; }
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

  // What the loop is asked to do.
  struct Turn {
    enum Kind {
      // Train `steps` steps (the model is the loop's until EndTurn).
      kTrain,
      // No steps: push, then EndTurn.
      kSync,
      // An audit: train a copy of the module from the round's base
      // (CopyReplayBase) on `samples`, `batch` a step, `steps` steps, as
      // the round `round` was trained; then EndReplay. The module and the
      // buffer are not touched (no pull, no push).
      kReplay,
      // The handover is over (Close): pull if asked, and stop.
      kClosed,
    };
    Kind kind = kClosed;
    uint32_t steps = 0;
    // kTrain: the synchronous round the steps are for (SetRound; 0 in
    // gossip mode).
    uint64_t round = 0;
    // Before the steps (kClosed: now), the module takes the buffer.
    bool pull = false;
    // When the turn ends, the buffer takes the module's progress.
    bool push = false;
    // SyncOnRequest was called: the buffer is a local model apart from the
    // agreed one, and a training turn is a step, not a round.
    bool local = false;
    // kTrain in a ledger run: the turn trains exactly these samples (indices
    // into the loop's training set), `batch` per step in order, `steps`
    // batches (the last may be short).
    bool ledger = false;
    std::vector<int64_t> samples;
    uint32_t batch = 0;
  };

  // The loop's side. The next turn once one is open (or kClosed once
  // closed); nullopt after `timeout` without either.
  std::optional<Turn> AwaitTurn(absl::Duration timeout);
  // Ends the open turn, with the mean loss of its steps.
  void EndTurn(double mean_loss);
  // The open replay turn: copies its base (num_elements() floats) into
  // `dst`. FAILED_PRECONDITION when no replay turn is open and taken, or
  // for another size.
  absl::Status CopyReplayBase(float* dst, uint64_t elements);
  // Ends the open replay turn with the hash of the replayed model, or with
  // `error` (non-empty) when the loop could not replay.
  void EndReplay(const std::string& hash, const std::string& error);
  // Test-set figures for the next Evaluate.
  void ReportMetrics(const shoal::v1::Metrics& metrics);
  void Close();
  // Training turns ended so far.
  uint64_t turns() const;
  // The synchronous round set last (SetRound); 0 in gossip mode.
  uint64_t round() const;

 private:
  // Opens a turn and waits until the loop ends it (true) or Close().
  bool RunTurn(Turn turn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ExternalTrainerOptions options_;
  const std::vector<uint64_t> no_counts_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool on_request_ ABSL_GUARDED_BY(mu_) = false;
  // The open turn (open_), its number, whether the loop took it, and the
  // number of the last turn ended.
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  Turn turn_ ABSL_GUARDED_BY(mu_);
  uint64_t number_ ABSL_GUARDED_BY(mu_) = 0;
  bool taken_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t ended_ ABSL_GUARDED_BY(mu_) = 0;
  // The buffer may hold what the module has not taken yet (the module
  // pulls at its next turn); the module trained since it last pushed.
  bool stale_ ABSL_GUARDED_BY(mu_) = true;
  bool unpushed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t trained_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  // The ledger (Configure): the order of the training set, the run's batch
  // size, and the samples SetSamples named, of which the turns handed out
  // those before `cursor_`.
  std::optional<SampleOrder> order_ ABSL_GUARDED_BY(mu_);
  uint32_t batch_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<int64_t> samples_ ABSL_GUARDED_BY(mu_);
  size_t cursor_ ABSL_GUARDED_BY(mu_) = 0;
  double loss_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<shoal::v1::Metrics> metrics_ ABSL_GUARDED_BY(mu_);
  // Configure: an audited synchronous run, and its steps a round.
  bool audited_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t local_steps_ ABSL_GUARDED_BY(mu_) = 1;
  // The open replay turn's base, and the result EndReplay gave.
  const float* replay_base_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string replay_hash_ ABSL_GUARDED_BY(mu_);
  std::string replay_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_EXTERNAL_TRAINER_H_
