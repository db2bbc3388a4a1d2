#include "services/coordinator/core/join_limiter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {

JoinLimiter::JoinLimiter(uint32_t per_minute, const Clock* clock)
    : capacity_(per_minute), per_second_(per_minute / 60.0), clock_(clock) {}

double JoinLimiter::Refilled(const Bucket& b, absl::Time now) const {
  // A clock set back (the real one is the wall clock) refills nothing; it
  // must not drain the bucket: a step back of an hour once told every
  // recent host to wait an hour (found by the join_limiter fuzz target).
  const absl::Duration elapsed = std::max(absl::ZeroDuration(), now - b.last);
  return std::min(capacity_, b.tokens + absl::ToDoubleSeconds(elapsed) * per_second_);
}

absl::Status JoinLimiter::Admit(absl::string_view host) {
  if (capacity_ <= 0) return absl::OkStatus();
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(host);
  if (it == buckets_.end()) {
    if (buckets_.size() >= kMaxHosts) Trim(now);
    it = buckets_.emplace(std::string(host), Bucket{capacity_, now}).first;
  }
  Bucket& b = it->second;
  b.tokens = Refilled(b, now);
  b.last = now;
  if (b.tokens < 1) {
    const double wait = (1 - b.tokens) / per_second_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many joins from ", host, " (--max_joins_per_minute=", static_cast<uint32_t>(capacity_),
        "); retry in ", std::ceil(wait), " s"));
  }
  b.tokens -= 1;
  return absl::OkStatus();
}

void JoinLimiter::Trim(absl::Time now) {
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    if (Refilled(it->second, now) >= capacity_) {
      buckets_.erase(it++);
    } else {
      ++it;
    }
  }
  if (buckets_.size() < kMaxHosts) return;
  auto oldest =
      std::min_element(buckets_.begin(), buckets_.end(),
                       [](const auto& a, const auto& b) { return a.second.last < b.second.last; });
  buckets_.erase(oldest);
}

}  // namespace shoal::coordinator
