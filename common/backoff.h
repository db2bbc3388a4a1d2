// Capped exponential backoff with full jitter, for retrying idempotent calls
// on UNAVAILABLE.
#ifndef SHOAL_COMMON_BACKOFF_H_
#define SHOAL_COMMON_BACKOFF_H_

#include <algorithm>
#include <random>

#include "absl/time/time.h"

namespace shoal {

class Backoff {
 public:
  Backoff(absl::Duration initial, absl::Duration max, uint64_t seed = std::random_device{}())
      : initial_(initial), max_(max), current_(initial), rng_(seed) {}

  // The next delay: uniform in [current/2, current], then current doubles up
  // to max.
  absl::Duration Next() {
    const double hi = absl::ToDoubleSeconds(current_);
    std::uniform_real_distribution<double> dist(hi / 2, hi);
    const absl::Duration d = absl::Seconds(dist(rng_));
    current_ = std::min(current_ * 2, max_);
    return d;
  }
  void Reset() { current_ = initial_; }

 private:
  absl::Duration initial_;
  absl::Duration max_;
  absl::Duration current_;
  std::mt19937_64 rng_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_BACKOFF_H_
