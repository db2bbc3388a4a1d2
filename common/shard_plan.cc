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

std::vector<SliceRange> PlanSlicesAmong(uint64_t total_elements,
                                        const std::vector<bool>& outbound_only) {
  size_t owners = 0;
  for (bool o : outbound_only) owners += !o;
  const std::vector<SliceRange> owned =
      owners > 0 ? PlanSlices(total_elements, owners) : std::vector<SliceRange>();
  std::vector<SliceRange> slices(outbound_only.size());
  size_t next = 0;
  for (size_t k = 0; k < slices.size(); ++k) {
    if (outbound_only[k]) {
      const uint64_t at = next < owned.size() ? owned[next].begin : total_elements;
      slices[k] = {at, at};
    } else {
      slices[k] = owned[next++];
    }
  }
  return slices;
}

std::vector<SliceRange> PlanSlicesAmong(SliceRange range, const std::vector<bool>& outbound_only) {
  std::vector<SliceRange> slices = PlanSlicesAmong(range.end - range.begin, outbound_only);
  for (SliceRange& s : slices) {
    s.begin += range.begin;
    s.end += range.begin;
  }
  return slices;
}

std::vector<SliceRange> PlanSlicesWeighted(SliceRange range, const std::vector<bool>& outbound_only,
                                           const std::vector<uint32_t>& shares) {
  unsigned __int128 total_share = 0;
  if (shares.size() == outbound_only.size()) {
    for (size_t k = 0; k < shares.size(); ++k) total_share += outbound_only[k] ? 0 : shares[k];
  }
  // No shares (or none positive): the even formula, bit for bit.
  if (total_share == 0) return PlanSlicesAmong(range, outbound_only);
  const auto length = static_cast<unsigned __int128>(range.end - range.begin);
  auto cut = [&](unsigned __int128 prefix) {
    return range.begin + static_cast<uint64_t>(length * prefix / total_share);
  };
  std::vector<SliceRange> slices(outbound_only.size());
  unsigned __int128 prefix = 0;
  // Outbound-only participants sit, empty, where the next owner begins:
  // the cut at the prefix so far.
  for (size_t k = 0; k < slices.size(); ++k) {
    const uint64_t begin = cut(prefix);
    if (!outbound_only[k]) prefix += shares[k];
    slices[k] = {begin, cut(prefix)};
  }
  return slices;
}

SliceRange FragmentOf(uint64_t total_elements, uint32_t fragments, uint64_t round) {
  if (fragments <= 1) return {0, total_elements};
  const uint64_t k = round % fragments;
  const auto t = static_cast<unsigned __int128>(total_elements);
  return {static_cast<uint64_t>(t * k / fragments), static_cast<uint64_t>(t * (k + 1) / fragments)};
}

}  // namespace shoal
