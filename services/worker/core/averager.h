// The seam between the round protocol and the ways of averaging
// (../shared/DESIGN.md, "Growing the averaging"): given the local model and
// the round's directive, produce the new model in place. The protocol
// (core/worker_protocol.h) and the sync runner do not know which
// implementation runs. The implementation today: services/worker/exchanger.h,
// which runs every round (flat or hierarchical, raw or encoded) as a plan of
// steps (core/averaging_steps.h) through one fan-out (fan_out.h). Gossip
// runs outside rounds (core/gossip_protocol.h, gossip_fetcher.h).
//
// An implementation writes only the memory it was given, follows the
// lending rules of core/model_state.h for it, and returns when the average
// is complete, the work is cancelled (CANCELLED or ABORTED: nothing is
// reported, the coordinator decides what comes next), or it failed.
#ifndef SHOAL_SERVICES_WORKER_CORE_AVERAGER_H_
#define SHOAL_SERVICES_WORKER_CORE_AVERAGER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cancellation.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

// One read of the flat reduce-scatter: `worker_id`'s contribution to this
// worker's slice, `bytes` as float32, `seconds` from the start of the
// reduce's reads (all started at once) to this read's end.
struct PeerReadTiming {
  std::string worker_id;
  uint64_t bytes = 0;
  double seconds = 0;
};

struct AveragingStats {
  // Bytes of slices received (encoded bytes for an encoded codec).
  uint64_t bytes_received = 0;
  // The same slices as float32 bytes: bytes_received / raw_bytes_received
  // is the compression ratio (1 for fp32).
  uint64_t raw_bytes_received = 0;
  // Bytes of this worker's encodings its peers read: contributions to the
  // other owners and its own slice's average once per reader.
  uint64_t bytes_published = 0;
  int retries = 0;
  // The reduce-scatter's reads of the contributions to this worker's slice
  // (all in parallel, and ready to read when the plan comes, so no waiting
  // is counted): bytes received and their wall time, seconds. The worker's
  // bandwidth for the supernode election (core/zone_measurements.h); 0 =
  // nothing read (a round alone, an empty slice).
  uint64_t reduce_bytes = 0;
  double reduce_seconds = 0;
  // Hierarchical round: bytes received in each stage (index 0 = stage 1),
  // zero for the stages this worker sits out. Empty for the flat exchange.
  std::vector<uint64_t> stage_bytes_received;
  // The flat exchange's reads of the contributions to this worker's slice,
  // one per member read from (ReportRoundDoneRequest.peer_reads: what the
  // coordinator sizes the slices of later rounds by). Empty for a
  // hierarchical round and for an empty slice.
  std::vector<PeerReadTiming> peer_reads;
  // Hierarchical round: the stages this worker carried from an earlier
  // attempt of the round instead of redoing them (their group and its
  // inputs were unchanged; core/averaging_steps.h GroupIdentities).
  uint32_t stages_carried = 0;
};

class Averager {
 public:
  virtual ~Averager() = default;
  // A short name for logs and status ("sharded").
  virtual const char* name() const = 0;
  // Averages the model in `params` according to `plan`, as participant
  // `self_id`. `cancel` (may be null) ends it early.
  virtual absl::Status Average(const shoal::v1::RoundPlan& plan, const std::string& self_id,
                               float* params, CancellationToken* cancel, AveragingStats* stats) = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_AVERAGER_H_
