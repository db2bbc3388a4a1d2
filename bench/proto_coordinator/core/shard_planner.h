// Cuts the flat parameter vector into one contiguous slice per participant,
// balanced by bytes (all parameters are float32, so by elements).
#ifndef SHOAL_BENCH_PROTO_COORDINATOR_CORE_SHARD_PLANNER_H_
#define SHOAL_BENCH_PROTO_COORDINATOR_CORE_SHARD_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::coordinator {

struct SliceRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // one past the last element
};

// Slice k = [floor(k*T/N), floor((k+1)*T/N)): sizes differ by at most one
// element, slices are in participant order and cover [0, T) exactly.
// Requires participants > 0.
std::vector<SliceRange> PlanSlices(uint64_t total_elements, size_t participants);

}  // namespace shoal::coordinator

#endif  // SHOAL_BENCH_PROTO_COORDINATOR_CORE_SHARD_PLANNER_H_
