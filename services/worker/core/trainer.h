// Local training of one worker, behind one interface (the trainer seam):
//   - the built-in trainer (Trainer::Create): the model (MLP or CNN, built in
//     C++ with deterministic initialisation from the run seed, or a
//     TorchScript module loaded from the run's file), its optimizer (SGD with
//     momentum, Adam or AdamW; the state stays local) and its disjoint shard
//     of the training set (--data_split: iid or Dirichlet label skew,
//     data_split.h);
//   - an external trainer (external_trainer.h): the training loop of a
//     Python process, whose module's tensors are views of Shoal's buffer
//     (docs/PYTHON.md).
//
// All parameters live in one flat float32 buffer (each parameter tensor is a
// view into it), so slices of the model are plain memory ranges that the
// exchange reads and writes in place, without whole-model copies. A
// module's buffers follow its parameters in the same buffer: float32
// buffers (BatchNorm running_mean / running_var) are views too, so they are
// averaged (plain mean), hashed and checkpointed with the weights; integer
// buffers (num_batches_tracked) are mirrored as float32 elements, copied in
// before and out after each TrainSteps call. Layer names are the module's
// own state_dict keys.
//
// This header has no Torch types; only trainer.cc includes LibTorch.
// Not thread-safe: one thread trains; the exchange touches the buffer only
// between TrainSteps calls. EvaluateParams runs on a second instance of the
// model with a flat buffer of its own.
#ifndef SHOAL_SERVICES_WORKER_CORE_TRAINER_H_
#define SHOAL_SERVICES_WORKER_CORE_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cancellation.h"
#include "services/worker/core/idx_reader.h"
#include "shoal/v1/common.pb.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

struct TrainerOptions {
  shoal::v1::RunConfig config;
  uint32_t data_rank = 0;
  // Torch intra-op threads (several workers share a machine in the demo).
  int threads = 1;
  // Evaluate on at most this many test images (0 = all).
  uint32_t eval_limit = 0;
  // config.model().name() == "torchscript": the file's bytes (verified against
  // config.model().file_sha256() by the caller).
  std::string model_file;
  // The worker's stop (SIGTERM): TrainSteps ends after the step in progress
  // once it is cancelled, so that a long round never delays the shutdown.
  // Not owned; null = never.
  const CancellationToken* stop = nullptr;
};

// A parameter tensor's place in the flat buffer.
struct LayerInfo {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // first element
  uint64_t elements = 0;
  // The module's own dtype; anything but float32 is mirrored.
  std::string dtype = "float32";
};

class Trainer {
 public:
  // The built-in trainer. INVALID_ARGUMENT for an unknown model name.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                         const FashionMnist* data);
  virtual ~Trainer() = default;

  // Runs `steps` SGD steps on the worker's shard (fewer when the options'
  // stop is cancelled); returns the mean loss of the steps run.
  virtual double TrainSteps(uint32_t steps) = 0;
  // The synchronous round the next TrainSteps trains (from the model of the
  // rounds before it). In an audited run (RunConfig.trust.audit_rate) the
  // built-in trainer starts each round with a fresh local optimizer and
  // torch's generator seeded from the run seed and the round, so that
  // another member can replay it.
  virtual void SetRound(uint64_t round) {}
  // A trainer whose flat buffer stands for a model kept elsewhere (a Python
  // module in bf16 or on a GPU: external_trainer.h) copies between the two
  // around every TrainSteps call, so that whoever reads or writes
  // parameters() between two calls (the exchange) sees the model. Local
  // training (services/worker/local_training.h) trains a step per call and
  // touches the buffer at a few points only: it calls SyncOnRequest() once,
  // then SyncParameters() before each of those points, so the copies happen
  // there, not around every step. No-ops where the buffer is the model.
  virtual void SyncOnRequest() {}
  // Between two TrainSteps calls: parameters() holds the trained model now,
  // and the model takes parameters() again before its next step (the
  // caller reads them and may write them).
  virtual void SyncParameters() {}
  // False when TrainSteps waits while another thread computes (a Python
  // loop's): local training then leaves the priority of its thread of
  // steps ahead alone, since the loop waits for what that thread does
  // between steps (taking an average).
  virtual bool ComputesOnCallingThread() const { return true; }
  // An audit (docs/SECURITY.md "Audits, scores and bans"): trains
  // `samples` of `round` from `base` (num_elements() floats) the way
  // TrainSteps trains an audited round, on a separate instance of the model
  // (the trained parameters are neither read nor written), and returns the
  // SHA-256 of the result. FAILED_PRECONDITION in a run without audits;
  // UNIMPLEMENTED for a trainer that cannot (an external one).
  virtual absl::StatusOr<std::string> Replay(const float* base,
                                             absl::Span<const shoal::v1::SampleRange> samples,
                                             uint64_t round) {
    return absl::UnimplementedError("this trainer cannot replay another member's round");
  }
  // The sample ledger (RunConfig.training.sample_ledger, docs/DATA.md): the
  // next TrainSteps trains these samples, a batch per step in order, rather
  // than its shard, and runs fewer steps when they run out. INVALID_ARGUMENT
  // for a range past the training set; UNIMPLEMENTED for a trainer that
  // chooses its own samples.
  virtual absl::Status SetSamples(absl::Span<const shoal::v1::SampleRange> ranges) {
    return absl::UnimplementedError("this trainer chooses its own samples");
  }
  // Samples in the training set the ledger's positions are over (0: the
  // trainer cannot follow the ledger).
  virtual uint64_t train_samples() const { return 0; }
  // Accuracy and mean loss on the test set (evaluated() false when the
  // trainer has nothing to evaluate on).
  virtual shoal::v1::Metrics Evaluate() = 0;
  // The same for the model with parameters `params` (num_elements(), in
  // the flat buffer's layout), e.g. an average of several workers' models,
  // evaluated on a second instance of the model: the trained parameters are
  // neither read nor written. The instance is built at the first call
  // (its memory is kept). UNIMPLEMENTED when the trainer cannot.
  virtual absl::StatusOr<shoal::v1::Metrics> EvaluateParams(const float* params) = 0;
  // The predicted class (argmax of the logits) and the label of each of
  // the first `n` test images (fewer if the test set is smaller).
  struct Prediction {
    int64_t label = 0;
    int64_t predicted = 0;
  };
  virtual std::vector<Prediction> Predict(int64_t n) = 0;

  virtual float* parameters() = 0;
  virtual uint64_t num_elements() const = 0;
  virtual const std::vector<LayerInfo>& layers() const = 0;
  // Number of training samples in this worker's shard (0: unknown).
  virtual size_t shard_size() const = 0;
  // Samples per label (index = label) in this worker's shard (empty:
  // unknown).
  virtual const std::vector<uint64_t>& shard_label_counts() const = 0;
};

// The layout the worker declares at join (common/model_layout.h), sealed.
shoal::v1::ModelLayout LayoutOf(const std::vector<LayerInfo>& layers);

// What a replay must share with the training it replays to be bit-identical
// (JoinRequest.replay_fingerprint): `build` (Shoal's version and commit),
// Torch's version, the CPU kernels ATen dispatches to, and the BLAS core.
// The intra-op threads are the run's (RunConfig.trust.audit_threads).
std::string ReplayFingerprint(const std::string& build);

// SHA-256 (hex) of `count` float32 elements.
std::string HashParameters(const float* data, uint64_t count);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_TRAINER_H_
