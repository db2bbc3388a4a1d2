// Bandwidth-proportional slices (RunConfig.exchange.slice_sizing =
// "bandwidth"; docs/ARCHITECTURE.md, "Bandwidth-proportional slices"):
// how big each owner's slice of the flat exchange is.
//
// The measurement: in a round's reduce-scatter every owner reads its slice
// of every other member's contribution, all reads at once, and reports
// each read's bytes and time (ReportRoundDoneRequest.peer_reads). What a
// reader sees of a member is bounded by that member's uplink, shared among
// its readers: a member's rate for the round is the median, over its
// readers, of their read rates from it, times the number of its readers
// (an estimate of what it served per second). The median keeps one slow
// reader's downlink from counting against every member it read. Rates are
// smoothed over completed rounds (an exponentially weighted mean).
//
// The rule (SizeSlices): each owner's share in proportion to its rate, a
// member not measured yet at the median of the measured ones, every owner
// at least `min_fraction` / owners of the model (so that a member whose
// reports are noisy, or a link that recovers, is still measured, and so
// that no slice is so small that its reads measure latency instead of
// rate); hysteresis: the current shares stay while no owner's new fraction
// differs from its current one by more than `hysteresis` of it, so that
// noise does not resend the participant list every round.
//
// Pure: no clock, no I/O. SliceSizer is not thread-safe (a part of
// SyncRound, called under the engine's mutex).
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_SLICE_SIZING_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_SLICE_SIZING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace shoal::coordinator {

struct SliceSizingOptions {
  // Weight of a round's rate in the smoothed rate (the rest: the old one).
  double smoothing = 0.5;
  // The least fraction of the model an owner holds, times the number of
  // owners: 1/8 means at least 1/(8N) each.
  double min_fraction = 1.0 / 8;
  // Relative change of some owner's fraction below which the shares stay.
  double hysteresis = 0.15;
  // About the sum of the shares (their resolution).
  uint32_t scale = 1u << 20;
};

// One read of a round's reduce-scatter: `reader` read `bytes` of `source`'s
// contribution in `seconds`.
struct ReadSample {
  std::string reader;
  std::string source;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Each source's rate (bytes per second) in one round's reads: the median
// over its readers of bytes / seconds, times the number of its readers.
// Reads of no bytes or no time are skipped.
absl::flat_hash_map<std::string, double> RoundRates(const std::vector<ReadSample>& reads);

// The shares of a plan's participants. `rates`: each participant's
// smoothed rate, 0 = not measured; `outbound_only`: the participants that
// own nothing (their share is 0); `current`: the shares each participant
// had in the last plan (0 = none, e.g. a new member). Returns all zeros
// (the even formula) while no owner is measured; else one positive share
// per owner. The same sizes throughout.
std::vector<uint32_t> SizeSlices(const std::vector<double>& rates,
                                 const std::vector<bool>& outbound_only,
                                 const std::vector<uint32_t>& current,
                                 const SliceSizingOptions& options = {});

// The measurements kept between rounds, and the rule applied to them.
class SliceSizer {
 public:
  explicit SliceSizer(SliceSizingOptions options = {}) : options_(options) {}

  // A completed round's reads.
  void AddRound(const std::vector<ReadSample>& reads);
  // A member left: its rate and share are dropped.
  void Forget(const std::string& worker_id);
  // Its smoothed rate, bytes per second; 0 = not measured.
  double Rate(const std::string& worker_id) const;
  // The shares of the next round's participants (SizeSlices over the
  // smoothed rates and the shares of the last decision), kept as the
  // current ones.
  std::vector<uint32_t> Decide(const std::vector<std::string>& participants,
                               const std::vector<bool>& outbound_only);

 private:
  SliceSizingOptions options_;
  absl::flat_hash_map<std::string, double> rates_;
  absl::flat_hash_map<std::string, uint32_t> shares_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_SLICE_SIZING_H_
