// Cuts the flat parameter vector into one contiguous slice per participant,
// balanced by bytes (all parameters are float32, so by elements). The
// coordinator plans with it; a worker given a plan without slices (see
// RoundPlan.participants_version) cuts the same slices with it.
#ifndef SHOAL_COMMON_SHARD_PLAN_H_
#define SHOAL_COMMON_SHARD_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

namespace shoal {

struct SliceRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // one past the last element
};

// Slice k = [floor(k*T/N), floor((k+1)*T/N)): sizes differ by at most one
// element, slices are in participant order and cover [0, T) exactly.
// Requires participants > 0.
std::vector<SliceRange> PlanSlices(uint64_t total_elements, size_t participants);

// The same among the participants that own a slice: those with
// outbound_only[k] (behind NAT: docs/SUPERNODES.md) get an empty slice
// [b, b) where b is where the next owner's slice begins (or T), so slices
// stay in participant order. The owners' slices are PlanSlices(T, owners).
// When nobody owns (all outbound-only), every slice is empty.
std::vector<SliceRange> PlanSlicesAmong(uint64_t total_elements,
                                        const std::vector<bool>& outbound_only);

// The same inside `range`: every slice is offset by range.begin and the
// empty slices of outbound-only participants sit at range.end when no
// owner follows them.
std::vector<SliceRange> PlanSlicesAmong(SliceRange range, const std::vector<bool>& outbound_only);

// Bandwidth-proportional slices (RunConfig.exchange.slice_sizing): the
// owners' slices in proportion to their shares. With P_k the sum of the
// shares of the owners before owner k and P the sum of all owners' shares,
// owner k's slice is [floor(L*P_k/P), floor(L*P_{k+1}/P)) inside `range`
// (L its length). Outbound-only participants own nothing, as above, and
// their shares are ignored. Equal shares give exactly PlanSlicesAmong's
// slices; so do all-zero shares (the plans of runs without the option),
// and an empty `shares`. Otherwise `shares` has one entry per participant;
// an owner of share 0 among owners of positive shares owns nothing.
std::vector<SliceRange> PlanSlicesWeighted(SliceRange range, const std::vector<bool>& outbound_only,
                                           const std::vector<uint32_t>& shares);

// Streaming fragments (RunConfig.exchange.fragments): the fragment that
// round `round` exchanges, fragment round mod K of PlanSlices(T, K). The
// coordinator plans inside it and a worker trains its contribution for it,
// before the plan comes, from the same formula. K of 0 or 1: [0, T).
SliceRange FragmentOf(uint64_t total_elements, uint32_t fragments, uint64_t round);

}  // namespace shoal

#endif  // SHOAL_COMMON_SHARD_PLAN_H_
