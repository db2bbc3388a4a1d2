// A byte-rate limit shared by every stream of a server (e.g. a worker's
// --upload_rate_mbps): Reserve() returns when a piece may be sent so that
// the total rate stays at the limit. Callers wait with a timer (grpc::Alarm
// in callback handlers), never by blocking a gRPC thread. Thread-safe.
#ifndef SHOAL_COMMON_RATE_LIMITER_H_
#define SHOAL_COMMON_RATE_LIMITER_H_

#include <algorithm>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shoal {

class RateLimiter {
 public:
  // bytes_per_second <= 0: unlimited.
  explicit RateLimiter(double bytes_per_second, const Clock* clock = RealClock::Get())
      : rate_(bytes_per_second), clock_(clock) {}

  bool limited() const { return rate_ > 0; }

  // Books `bytes` and returns the time they may start going out.
  absl::Time Reserve(size_t bytes) {
    const absl::Time now = clock_->Now();
    if (rate_ <= 0) return now;
    absl::MutexLock lock(&mu_);
    // No credit for idle time beyond one piece: a burst after a pause stays
    // at the limit.
    const absl::Time start = std::max(now, next_free_);
    next_free_ = start + absl::Seconds(bytes / rate_);
    return start;
  }

 private:
  const double rate_;
  const Clock* const clock_;
  absl::Mutex mu_;
  absl::Time next_free_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace shoal

#endif  // SHOAL_COMMON_RATE_LIMITER_H_
