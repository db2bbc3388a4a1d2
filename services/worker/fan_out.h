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
//     combine them with ours (the members' weights, the run's rule) cell by
//     cell in a bounded window (core/reduce_window.h);
//  3. the average of our slice is published (encoded once: every member,
//     us included, applies the same decoded bytes); a transport that serves
//     model memory publishes it cell by cell as the window completes them,
//     so the others' gathers run while our reduce goes on;
//  4. gather: we read every other owner's average into the output.
// Every read starts at once and is driven by gRPC's callbacks (no thread
// per read; gathers wait on the owners' servers until the average is
// there); the calling thread only waits for them to end. The first failure
// cancels the step's token and every read still running ends. Reads resume
// where they stopped, so a retried read never adds twice.
//
// Not thread-safe: one step at a time per transport.
#ifndef SHOAL_SERVICES_WORKER_FAN_OUT_H_
#define SHOAL_SERVICES_WORKER_FAN_OUT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/run_options.h"
#include "common/tensor_wire.h"
#include "services/worker/core/averager.h"
#include "services/worker/core/averaging_steps.h"
#include "services/worker/core/reduce_window.h"
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
  // The flat step's reads of contributions, as they end (any thread).
  absl::Mutex reads_mu;
  std::vector<PeerReadTiming> peer_reads ABSL_GUARDED_BY(reads_mu);
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
// valid during the call only). The sink may ask the stream to pause
// (`*next = ReduceNext::kPause`); it is then resumed through the handle
// its Start call returned. An error from it is final.
using ChunkSink = std::function<absl::Status(const ChunkView&, ReduceNext* next)>;
// The end of a read, once, on any thread.
using ReadDone = std::function<void(absl::Status)>;

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
  // Starts reading member `k`'s contribution to our slice, in checked
  // chunks, and returns at once (the handle resumes a paused stream; null
  // when the transport cannot pause). `done` hears the end.
  virtual std::shared_ptr<ResumeHandle> StartReadContribution(const GroupStep& step, int k,
                                                              const StepCall& call,
                                                              CancellationToken* stop,
                                                              ChunkSink sink, ReadDone done) = 0;
  // Our slice's average holds on [own.begin, until) (the elements
  // `avg` points at from own.begin on) and will not change: a transport that
  // serves it as it grows does so now. Others wait for PublishAverage.
  virtual void PublishAveragePrefix(const GroupStep& step, const float* avg, uint64_t until,
                                    const StepCall& call) {}
  // `avg` (our slice, combined) is published for the members and becomes
  // what they decode from it.
  virtual absl::Status PublishAverage(const GroupStep& step, float* avg, const StepCall& call) = 0;
  // Starts reading owner `k`'s average of its slice into `dst` (its first
  // element) and returns at once; `done` hears the end.
  virtual void StartReadAverage(const GroupStep& step, int k, float* dst, const StepCall& call,
                                CancellationToken* stop, ReadDone done) = 0;
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

// Reads in flight, each ending once with a status: the calling thread waits
// for all of them. Thread-safe.
class ReadLatch {
 public:
  // A read of slot `i` (statuses()[i]) starts; the function it returns is
  // its end. Must be called before the read can end.
  ReadDone Add(size_t i);
  // Waits until every read that was added ended; past `wall_deadline`
  // (real time) it cancels `stop` and waits for them to end (they end at
  // once then: every read hears its token).
  void Wait(absl::Time wall_deadline, CancellationToken* stop);
  // Each slot's status (OK for slots whose read was never added).
  std::vector<absl::Status> statuses() const;
  explicit ReadLatch(size_t slots);

 private:
  // Shared with the ends it handed out: one may still be leaving the lock
  // when Wait returns.
  struct State {
    absl::Mutex mu;
    size_t pending ABSL_GUARDED_BY(mu) = 0;
    std::vector<absl::Status> statuses ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

// Names the calling thread (at most 15 characters), so that profiles tell
// the exchange's reads from gRPC's threads.
void NameThread(const char* name);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_FAN_OUT_H_
