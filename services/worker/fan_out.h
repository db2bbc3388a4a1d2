// The one fan-out of the averaging pipeline (services/worker/exchanger.h):
// one group step's reduce-scatter and all-gather (core/averaging_steps.h).
// Every averaging Shoal does, flat or hierarchical, raw or encoded, runs
// here; what differs is how the bytes of a slice travel (a StepTransport)
// and how the owner combines the contributions (core/aggregation.h).
//
// One step, for the member `self` of a group of n:
//  1. publish: our contribution to every other member's slice becomes
//     readable (or, behind NAT, is pushed to its owner);
//  2. reduce: we read every other member's contribution to our slice and
//     combine them with ours (the members' weights, the run's rule);
//  3. the average of our slice is published (encoded once: every member,
//     us included, applies the same decoded bytes);
//  4. gather: we read every other owner's average into the output.
// Reads run at once, one thread per read (gathers wait on the owners'
// servers until the average is there); the first failure cancels the
// step's token and every read still running ends. Reads resume where they
// stopped, so a retried read never adds twice.
//
// Not thread-safe: one step at a time per transport.
#ifndef SHOAL_SERVICES_WORKER_FAN_OUT_H_
#define SHOAL_SERVICES_WORKER_FAN_OUT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/run_options.h"
#include "common/tensor_wire.h"
#include "services/worker/core/averaging_steps.h"
#include "services/worker/uplink_pacer.h"

namespace shoal::worker {

// What the reads of one Average call counted (all its steps).
struct StepCounters {
  // Bytes received on the wire, and the same slices as float32 bytes.
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> raw_received{0};
  // Bytes of our encodings the members read (each reader counted).
  std::atomic<uint64_t> published{0};
  // The reduce's reads of contributions to our slice.
  std::atomic<uint64_t> reduce_bytes{0};
  std::atomic<int> retries{0};
  // Wall time of the reduce's reads (the steps run one after the other on
  // the caller's thread, which alone writes it).
  double reduce_seconds = 0;
};

// One Average call as the steps see it.
struct StepCall {
  uint64_t round = 0;
  uint32_t attempt = 0;
  std::string self_id;
  absl::Time deadline;
  const Clock* clock = nullptr;
  StepCounters* counters = nullptr;
  // Shares the uplink among the step's readers (null: unpaced).
  UplinkPacer* pacer = nullptr;
};

// A chunk of a contribution, checked and decoded to float32 (its view is
// valid during the call only).
using ChunkSink = std::function<absl::Status(const ChunkView&)>;

// How one step's slices travel. `stop` ends a call early (ABORTED).
class StepTransport {
 public:
  virtual ~StepTransport() = default;
  // Makes our contribution (from `in`, the whole vector) to every other
  // member's slice readable. Called once, before any read of the step.
  virtual absl::Status Publish(const GroupStep& step, const float* in, const StepCall& call) = 0;
  // Behind NAT: sends owner `k` our contribution of its slice.
  virtual absl::Status PushContribution(const GroupStep& step, int k, const float* in,
                                        const StepCall& call, CancellationToken* stop) = 0;
  // Our own contribution to our slice as the owner counts it: what the
  // others would decode from our encoding of it (after Publish).
  virtual const float* OwnContribution(const GroupStep& step, const float* in) = 0;
  // Member `k`'s contribution to our slice, in checked chunks.
  virtual absl::Status ReadContribution(const GroupStep& step, int k, const StepCall& call,
                                        CancellationToken* stop, const ChunkSink& sink) = 0;
  // `avg` (our slice, combined) is published for the members and becomes
  // what they decode from it.
  virtual absl::Status PublishAverage(const GroupStep& step, float* avg, const StepCall& call) = 0;
  // Owner `k`'s average of its slice into `dst` (its first element).
  virtual absl::Status ReadAverage(const GroupStep& step, int k, float* dst, const StepCall& call,
                                   CancellationToken* stop) = 0;
  // True when contributions may be added as they arrive (the average's last
  // bit may then differ from run to run, never between workers: only the
  // owner computes it). False: kept apart, combined in member order.
  virtual bool SumsInArrivalOrder() const = 0;
};

// Runs one kAverage step: `in` is this worker's input (the whole vector),
// `out` receives the step's result (every slice); they may be the same
// buffer when the transport allows it (see each transport). `applied`
// (may be null) receives the rule the owner applied to our slice.
// ABORTED when `cancel` fires.
absl::Status RunAverageStep(const GroupStep& step, const float* in, float* out,
                            const AggregationSpec& rule, StepTransport* transport,
                            const StepCall& call, CancellationToken* cancel,
                            AggregationSpec* applied = nullptr);

// The first failure of `statuses`, preferring one that stopped the others
// over their ABORTED / CANCELLED.
absl::Status FirstError(const std::vector<absl::Status>& statuses);

// Names the calling thread (at most 15 characters), so that profiles tell
// the exchange's reads from gRPC's threads.
void NameThread(const char* name);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_FAN_OUT_H_
