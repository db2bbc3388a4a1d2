#include "services/worker/core/outer_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal::worker {

OuterStep::OuterStep(OuterOptions options, uint64_t total) : options_(options) {
  if (has_state()) momentum_.assign(total, 0.0f);
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
      // Every attempt starts from the committed momentum (a void round
      // leaves it as it is); Commit recomputes `next` from the same inputs.
      if (!pending_valid_ || pending_round_ != round) pending_.clear();
      pending_round_ = round;
      pending_valid_ = true;
      // A new attempt of the range replaces the last one's.
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                    [&](const Moved& m) {
                                      return m.begin < begin + n && begin < m.begin + m.n;
                                    }),
                     pending_.end());
      pending_.push_back({begin, n, change});
      const float mu = options_.momentum;
      const float* m = momentum_.data() + begin;
      for (size_t i = 0; i < n; ++i) {
        const float g = -change[i];
        const float next = mu * m[i] + g;
        out[i] = base[i] - lr * (g + mu * next);
      }
      return;
    }
  }
}

void OuterStep::Commit(uint64_t round) {
  if (!has_state() || !pending_valid_ || pending_round_ != round) return;
  // The same expression as Apply's, on the same inputs: the same bits.
  const float mu = options_.momentum;
  for (const Moved& moved : pending_) {
    float* m = momentum_.data() + moved.begin;
    for (size_t i = 0; i < moved.n; ++i) {
      const float g = -moved.change[i];
      m[i] = mu * m[i] + g;
    }
  }
  pending_.clear();
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
