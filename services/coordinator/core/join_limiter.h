// Joins per address (--max_joins_per_minute; docs/SECURITY.md "Limits"): a
// token bucket per caller host, so one address cannot flood the coordinator
// with joins while every other address joins as usual.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_JOIN_LIMITER_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_JOIN_LIMITER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shoal::coordinator {

// Thread-safe. A host may join `per_minute` times at once (a full bucket),
// then once every 60 s / per_minute.
class JoinLimiter {
 public:
  // Hosts tracked at most; past it, buckets that have refilled (they carry
  // no state) are dropped, then the least recently used.
  static constexpr size_t kMaxHosts = 65536;

  // per_minute = 0: no limit.
  JoinLimiter(uint32_t per_minute, const Clock* clock);

  // OK (and one join is counted), or RESOURCE_EXHAUSTED saying when the host
  // may join again.
  absl::Status Admit(absl::string_view host);

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time last;
  };
  double Refilled(const Bucket& b, absl::Time now) const;
  void Trim(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const double capacity_;
  const double per_second_;
  const Clock* const clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_JOIN_LIMITER_H_
