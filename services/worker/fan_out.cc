#include "services/worker/fan_out.h"

#include <pthread.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/worker/core/aggregation.h"

namespace shoal::worker {

void NameThread(const char* name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#endif
}

absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  absl::Status aborted;
  for (const auto& s : statuses) {
    if (s.ok()) continue;
    if (!absl::IsAborted(s) && !absl::IsCancelled(s)) return s;
    if (aborted.ok()) aborted = s;
  }
  return aborted;
}

absl::Status RunAverageStep(const GroupStep& step, const float* in, float* out,
                            const AggregationSpec& rule, StepTransport* transport,
                            const StepCall& call, CancellationToken* cancel,
                            AggregationSpec* applied) {
  const int n = static_cast<int>(step.members.size());
  const int self = step.self;
  const SliceRange own = step.own();
  const uint64_t count = own.end - own.begin;
  // Cancelled with the caller's token, or when the reduce failed (our own
  // slice will never be averaged, so waiting for the others' is
  // pointless): either ends every read at once.
  CancellationToken stop(cancel);
  // Every other member reads our contribution to its slice, then our slice's
  // average, at once.
  if (call.pacer != nullptr) call.pacer->Share(n - 1);
  if (absl::Status s = transport->Publish(step, in, call); !s.ok()) return s;

  std::vector<absl::Status> reduce_status(n), gather_status(n), push_status(n);
  std::vector<std::thread> reducers, gatherers, pushers;
  // All-gather reads start at once; they wait for the owners' averages.
  for (int k = 0; k < n; ++k) {
    const SliceRange s = step.slices[k];
    if (k == self || s.begin == s.end) continue;
    gatherers.emplace_back([&, k, s] {
      NameThread("shoal-gather");
      gather_status[k] = transport->ReadAverage(step, k, out + s.begin, call, &stop);
    });
  }
  // Behind NAT nobody can read our contributions: we push each owner its
  // slice of our input (its reduce waits for it). Our own slice is empty.
  if (step.members[self].outbound_only) {
    for (int k = 0; k < n; ++k) {
      const SliceRange s = step.slices[k];
      if (k == self || s.begin == s.end) continue;
      pushers.emplace_back([&, k] {
        NameThread("shoal-push");
        push_status[k] = transport->PushContribution(step, k, in, call, &stop);
        if (!push_status[k].ok()) stop.Cancel();
      });
    }
  }
  // Reduce-scatter: every other member's contribution to our slice, summed
  // as it arrives where the transport allows it (unit weights, the mean),
  // else kept apart and combined in member order once all are in.
  bool unit_weights = true;
  for (uint32_t w : step.weights) unit_weights = unit_weights && w == 1;
  const bool keep_apart =
      !transport->SumsInArrivalOrder() || NeedsAllContributions(rule) || !unit_weights;
  std::vector<std::vector<float>> parts(keep_apart ? n : 0);
  const float* own_input = nullptr;
  std::mutex sum_mu;
  const absl::Time reduce_start = call.clock->Now();
  if (count > 0) {
    own_input = transport->OwnContribution(step, in);
    if (!keep_apart && out + own.begin != own_input) {
      std::memcpy(out + own.begin, own_input, count * sizeof(float));
    }
    for (int k = 0; k < n; ++k) {
      if (k == self) continue;
      if (keep_apart) parts[k].resize(count);
      reducers.emplace_back([&, k] {
        NameThread("shoal-reduce");
        reduce_status[k] =
            transport->ReadContribution(step, k, call, &stop, [&](const ChunkView& c) {
              // The transport checked that the chunk lies in our slice.
              if (keep_apart) {
                c.CopyTo(parts[k].data() + (c.begin - own.begin));
              } else {
                std::lock_guard<std::mutex> lock(sum_mu);
                c.AddTo(out + c.begin);
              }
              return absl::OkStatus();
            });
        if (!reduce_status[k].ok()) stop.Cancel();
      });
    }
  }
  for (auto& t : reducers) t.join();
  if (!reducers.empty()) {
    call.counters->reduce_seconds += absl::ToDoubleSeconds(call.clock->Now() - reduce_start);
  }
  for (auto& t : pushers) t.join();
  absl::Status result = FirstError(reduce_status);
  if (result.ok()) result = FirstError(push_status);
  if (result.ok() && !stop.cancelled()) {
    if (count == 0) {
      // We own nothing (behind NAT, or fewer elements than members).
    } else if (keep_apart) {
      std::vector<const float*> inputs(n);
      for (int k = 0; k < n; ++k) inputs[k] = k == self ? own_input : parts[k].data();
      absl::StatusOr<AggregationSpec> r =
          CombineWeighted(rule, inputs, step.weights, count, out + own.begin);
      if (r.ok() && applied != nullptr) *applied = *r;
      result = r.status();
      parts.clear();
    } else {
      DivideFloats(out + own.begin, count, static_cast<float>(n));
      if (applied != nullptr) *applied = rule;
    }
    if (result.ok()) result = transport->PublishAverage(step, out + own.begin, call);
  } else if (result.ok() && stop.cancelled()) {
    result = absl::AbortedError("round aborted");
  }
  if (!result.ok()) stop.Cancel();
  for (auto& t : gatherers) t.join();
  if (result.ok()) result = FirstError(gather_status);
  if (result.ok() && stop.cancelled()) result = absl::AbortedError("round aborted");
  return result;
}

}  // namespace shoal::worker
