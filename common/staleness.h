// The weight of late work folded into a later round (issue 11, stragglers
// in synchronous mode), shared by the worker that applies it and the
// coordinator that checks and reports it. See docs/MEMBERSHIP.md.
//
// staleness s = (base model round of the round the update is folded into)
//             - (base model round the update was trained from).
// A worker that misses round r (trained from the model of r - 1) and folds
// into round r + 1 (base r) has s = 1.
//
//   w(s) = 1 / (1 + s)   for s <= max_staleness,
//   w(s) = 0             beyond the cap: the update is dropped.
// s = 0 happens when the round the worker missed was aborted and is run
// again on the same base: its update is then as fresh as anyone's (w = 1).
//
// Pure and deterministic: the same (s, cap) gives the same double on every
// machine; the worker multiplies its float delta by (float)w.
#ifndef SHOAL_COMMON_STALENESS_H_
#define SHOAL_COMMON_STALENESS_H_

#include <cstdint>

namespace shoal {

// Default of --max_staleness.
inline constexpr uint32_t kDefaultMaxStaleness = 4;

inline double StalenessWeight(uint64_t staleness, uint32_t max_staleness) {
  if (staleness > max_staleness) return 0.0;
  return 1.0 / (1.0 + static_cast<double>(staleness));
}

}  // namespace shoal

#endif  // SHOAL_COMMON_STALENESS_H_
