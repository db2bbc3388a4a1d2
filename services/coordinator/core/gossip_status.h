// Gossip mode on the coordinator (docs/GOSSIP.md): the checks of the gossip
// knobs of a run config and the run-wide consensus distance computed from
// the model projections the workers report with their heartbeats. Pure
// functions, no state.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_STATUS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_STATUS_H_

#include <vector>

#include "absl/status/status.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// INVALID_ARGUMENT naming the bad knob: fetch_probability outside [0, 1],
// interpolation not constant:A (0 < A <= 1) / clock / loss, a negative
// divergence_threshold; UNIMPLEMENTED for checkpoints in gossip mode (not
// done yet).
absl::Status ValidateGossipConfig(const shoal::v1::RunConfig& config);

// The root mean square Euclidean distance of `projections` (one per worker,
// equal lengths; others are skipped) to their mean: 0 when all agree. -1
// when fewer than two are usable. Sets *used to the number used.
double ConsensusDistance(
    const std::vector<const google::protobuf::RepeatedField<float>*>& projections, uint32_t* used);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_STATUS_H_
