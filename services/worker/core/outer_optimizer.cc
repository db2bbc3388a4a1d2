#include "services/worker/core/outer_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal::worker {

OuterStep::OuterStep(OuterOptions options, uint64_t total) : options_(options) {
  if (has_state()) {
    momentum_.assign(total, 0.0f);
    pending_.assign(total, 0.0f);
  }
}

void OuterStep::Apply(uint64_t round, uint64_t begin, size_t n, const float* base,
                      const float* change, float* out) {
  const float lr = options_.lr;
  switch (options_.kind) {
    case OuterOptimizer::kNone:
      for (size_t i = 0; i < n; ++i) out[i] = base[i] + change[i];
      return;
    case OuterOptimizer::kSgd:
      for (size_t i = 0; i < n; ++i) out[i] = base[i] - lr * -change[i];
      return;
    case OuterOptimizer::kNesterov: {
      if (!pending_valid_ || pending_round_ != round) {
        // A new round (or attempt after a void): start from the committed,
        // which the elements outside [begin, begin + n) keep.
        std::copy(momentum_.begin(), momentum_.end(), pending_.begin());
        pending_round_ = round;
        pending_valid_ = true;
      }
      const float mu = options_.momentum;
      const float* m = momentum_.data() + begin;
      float* p = pending_.data() + begin;
      for (size_t i = 0; i < n; ++i) {
        const float g = -change[i];
        const float next = mu * m[i] + g;
        p[i] = next;
        out[i] = base[i] - lr * (g + mu * next);
      }
      return;
    }
  }
}

void OuterStep::Commit(uint64_t round) {
  if (!has_state() || !pending_valid_ || pending_round_ != round) return;
  momentum_.swap(pending_);
  momentum_round_ = round;
  pending_valid_ = false;
}

absl::Status OuterStep::SetMomentum(uint64_t round, const std::vector<float>& momentum) {
  if (!has_state()) return absl::OkStatus();
  if (momentum.size() != momentum_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("outer momentum of ", momentum.size(),
                                                   " elements for a model of ", momentum_.size()));
  }
  if (!std::all_of(momentum.begin(), momentum.end(), [](float v) { return std::isfinite(v); })) {
    return absl::InvalidArgumentError("outer momentum holds a value that is not finite");
  }
  momentum_ = momentum;
  momentum_round_ = round;
  pending_valid_ = false;
  return absl::OkStatus();
}

}  // namespace shoal::worker
