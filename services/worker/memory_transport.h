// The raw transport of the averaging pipeline (services/worker/fan_out.h):
// a flat round of float32 models averaged in place, peers reading our
// contributions and our slice's average straight from model memory
// (Peer.ReadSlice, zero-copy: core/model_state.h) and we theirs, chunk by
// chunk, added into our slice as they arrive. The fastest path, and the only
// one that reads model memory; every other round (a codec, an outer
// optimizer, a hierarchy) travels as immutable blobs (blob_transport.h).
//
// Why peers may read our parameters while we write them: we write a slice
// other than our own only in the all-gather, with its owner's average, and
// the owner averages only after it has received our contribution of that
// slice completely; we write a cell of our own slice once, with its average
// (core/reduce_window.h: the sums live in the window's slots), before it is
// published (ModelState::MarkAveragedUntil), and nobody else reads it
// before that. So `in` and `out` of the step are the same buffer, the
// parameters, and each element of it holds either this worker's
// contribution or the round's average, never anything in between.
//
// Not thread-safe: one step at a time (its reads run on gRPC's callbacks).
#ifndef SHOAL_SERVICES_WORKER_MEMORY_TRANSPORT_H_
#define SHOAL_SERVICES_WORKER_MEMORY_TRANSPORT_H_

#include "services/worker/core/codec.h"
#include "services/worker/core/model_state.h"
#include "services/worker/fan_out.h"
#include "services/worker/slice_io.h"

namespace shoal::worker {

class MemoryTransport final : public StepTransport {
 public:
  // `codec` must be raw (fp32); all pointers outlive this.
  MemoryTransport(SliceIo io, ModelState* state, const Codec* codec)
      : io_(io), state_(state), codec_(codec) {}

  absl::Status Publish(const GroupStep& step, const float* in, const StepCall& call) override;
  absl::Status PushContribution(const GroupStep& step, int k, const float* in, const StepCall& call,
                                CancellationToken* stop) override;
  const float* OwnContribution(const GroupStep& step, const float* in) override;
  std::shared_ptr<ResumeHandle> StartReadContribution(const GroupStep& step, int k,
                                                      const StepCall& call, CancellationToken* stop,
                                                      ChunkSink sink, ReadDone done) override;
  void PublishAveragePrefix(const GroupStep& step, const float* avg, uint64_t until,
                            const StepCall& call) override;
  absl::Status PublishAverage(const GroupStep& step, float* avg, const StepCall& call) override;
  void StartReadAverage(const GroupStep& step, int k, float* dst, const StepCall& call,
                        CancellationToken* stop, ReadDone done) override;
  bool SumsInArrivalOrder() const override { return true; }

 private:
  const SliceIo io_;
  ModelState* const state_;
  const Codec* const codec_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_MEMORY_TRANSPORT_H_
