// The outer optimizer of the encoded exchange (DiLoCo; docs/COMPRESSION.md).
//
// Sign convention: the round's pseudo-gradient is g = base - average of the
// trained models = -(averaged change), where base is the agreed model the
// round started from and the averaged change is what the owners' encoded
// averages decode to. The new model is base - step(g):
//   none:     new = base - g                    (= base + averaged change)
//   sgd:      new = base - lr g
//   nesterov: m = mu m + g; new = base - lr (g + mu m)   (PyTorch's form)
// Every worker computes it from identical inputs (the agreed base, the same
// decoded bytes, the same committed momentum) in the same order, so models
// and momentum stay bit-identical.
//
// The momentum of a round is pending until the round is agreed (Commit);
// a void round leaves the committed one in place. The pending momentum is
// not kept: Commit computes it again from the committed one and the
// round's averaged change, which the caller keeps unchanged between Apply
// and Commit (the exchanger's change buffer), so the outer optimizer adds
// one model-sized buffer, its momentum. The committed momentum
// belongs to the model of round momentum_round(): it travels with that
// model to workers catching up (Peer.ReadEncoded SNAPSHOT) and in
// checkpoints.
//
// Not thread-safe: the worker's main thread (and the exchange it runs).
#ifndef SHOAL_SERVICES_WORKER_CORE_OUTER_OPTIMIZER_H_
#define SHOAL_SERVICES_WORKER_CORE_OUTER_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/run_options.h"

namespace shoal::worker {

// The name of the checkpoint layer that holds the committed momentum
// (flagged optimizer_state; docs/COMPRESSION.md).
inline constexpr char kMomentumLayer[] = "outer.momentum";

struct OuterOptions {
  OuterOptimizer kind = OuterOptimizer::kNone;
  float lr = 1.0f;
  float momentum = 0.0f;
};

class OuterStep {
 public:
  OuterStep(OuterOptions options, uint64_t total);

  // True when the optimizer keeps state (nesterov).
  bool has_state() const { return options_.kind == OuterOptimizer::kNesterov; }
  const OuterOptions& options() const { return options_; }

  // out[i] = new model for elements [begin, begin + n) of round `round`,
  // from base[i] and change[i] (all three point at element `begin`); the
  // momentum of those elements becomes pending for `round`; the other
  // elements' momentum stays as committed (a round that averages one
  // fragment moves only its momentum). `out` may be `base` but not
  // `change`: `change` must hold its values until Commit (or the next
  // Apply), which reads them again.
  void Apply(uint64_t round, uint64_t begin, size_t n, const float* base, const float* change,
             float* out);
  // `round` is agreed: its pending momentum becomes the committed one.
  void Commit(uint64_t round);
  // The committed momentum (of the model of momentum_round()).
  const std::vector<float>& momentum() const { return momentum_; }
  uint64_t momentum_round() const { return momentum_round_; }
  // A worker catching up to the model of `round` takes its momentum
  // (INVALID_ARGUMENT when the size differs or a value is not finite;
  // nothing changes then).
  absl::Status SetMomentum(uint64_t round, const std::vector<float>& momentum);

 private:
  const OuterOptions options_;
  std::vector<float> momentum_;
  uint64_t momentum_round_ = 0;
  // The round of the last Apply, and the ranges it moved with the change
  // each read (Commit reads them again).
  struct Moved {
    uint64_t begin = 0;
    size_t n = 0;
    const float* change = nullptr;
  };
  uint64_t pending_round_ = 0;
  bool pending_valid_ = false;
  std::vector<Moved> pending_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_OUTER_OPTIMIZER_H_
