#include "common/shard_plan.h"

namespace shoal {

std::vector<SliceRange> PlanSlices(uint64_t total_elements, size_t participants) {
  std::vector<SliceRange> slices(participants);
  // 128-bit intermediate: T * N can exceed 64 bits for huge models.
  for (size_t k = 0; k < participants; ++k) {
    slices[k].begin =
        static_cast<uint64_t>(static_cast<unsigned __int128>(total_elements) * k / participants);
    slices[k].end = static_cast<uint64_t>(static_cast<unsigned __int128>(total_elements) * (k + 1) /
                                          participants);
  }
  return slices;
}

}  // namespace shoal
