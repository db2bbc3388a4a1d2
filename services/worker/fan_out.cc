#include "services/worker/fan_out.h"

#include <pthread.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
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

ReadLatch::ReadLatch(size_t slots) : state_(std::make_shared<State>()) {
  absl::MutexLock lock(&state_->mu);
  state_->statuses.assign(slots, absl::OkStatus());
}

ReadDone ReadLatch::Add(size_t i) {
  {
    absl::MutexLock lock(&state_->mu);
    ++state_->pending;
  }
  return [state = state_, i](absl::Status s) {
    absl::MutexLock lock(&state->mu);
    state->statuses[i] = std::move(s);
    --state->pending;
  };
}

void ReadLatch::Wait(absl::Time wall_deadline, CancellationToken* stop) {
  absl::MutexLock lock(&state_->mu);
  State* const st = state_.get();
  auto none = [st]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) { return st->pending == 0; };
  if (st->mu.AwaitWithDeadline(absl::Condition(&none), wall_deadline)) return;
  // Every read has its own deadline, so this is a safety net: stop them.
  st->mu.Unlock();
  SHOAL_LOG(WARNING) << "reads still running past the exchange's deadline: cancelling them";
  stop->Cancel();
  st->mu.Lock();
  while (!st->mu.AwaitWithTimeout(absl::Condition(&none), absl::Seconds(30))) {
    SHOAL_LOG(ERROR) << st->pending << " cancelled reads have not ended after 30 s";
  }
}

std::vector<absl::Status> ReadLatch::statuses() const {
  absl::MutexLock lock(&state_->mu);
  return state_->statuses;
}

namespace {

// The wall-clock time a step's reads must have ended by: the exchange's
// deadline (on the step's clock) and a margin for their last callbacks.
absl::Time WallDeadline(const StepCall& call) {
  return absl::Now() + (call.deadline - call.clock->Now()) + absl::Seconds(5);
}

}  // namespace

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

  // All-gather reads start at once; they wait for the owners' averages.
  ReadLatch gathers(n);
  for (int k = 0; k < n; ++k) {
    const SliceRange s = step.slices[k];
    if (k == self || s.begin == s.end) continue;
    transport->StartReadAverage(step, k, out + s.begin, call, &stop, gathers.Add(k));
  }
  // Behind NAT nobody can read our contributions: we push each owner its
  // slice of our input (its reduce waits for it). Our own slice is empty.
  // Pushes are writes of a client stream, each on a thread of its own.
  std::vector<absl::Status> push_status(n);
  std::vector<std::thread> pushers;
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
  // else kept apart and combined in member order, cell by cell.
  bool unit_weights = true;
  for (uint32_t w : step.weights) unit_weights = unit_weights && w == 1;
  ReduceWindowOptions window_options;
  window_options.own = own;
  window_options.members = n;
  window_options.self = self;
  window_options.out = out + own.begin;
  window_options.apart =
      !transport->SumsInArrivalOrder() || NeedsAllContributions(rule) || !unit_weights;
  window_options.rule = rule;
  window_options.weights = step.weights;
  if (window_options.weights.size() != static_cast<size_t>(n)) window_options.weights.assign(n, 1);
  window_options.on_prefix = [&](uint64_t until) {
    transport->PublishAveragePrefix(step, out + own.begin, until, call);
  };
  ReadLatch reduces(n);
  const absl::Time reduce_start = call.clock->Now();
  absl::Status result;
  if (count > 0) {
    window_options.own_input = transport->OwnContribution(step, in);
    ReduceWindow window(std::move(window_options));
    for (int k = 0; k < n; ++k) {
      if (k == self) continue;
      ReadDone done = reduces.Add(k);
      // The flat round's reads are timed: what the coordinator sizes
      // bandwidth-proportional slices by (ReportRoundDoneRequest.peer_reads).
      const bool timed = step.stage == 0;
      std::shared_ptr<ResumeHandle> handle = transport->StartReadContribution(
          step, k, call, &stop,
          [&window, k](const ChunkView& c, ReduceNext* next) { return window.Accept(k, c, next); },
          [&stop, done = std::move(done), timed, counters = call.counters, clock = call.clock,
           reduce_start, source = step.members[k].id,
           bytes = count * sizeof(float)](absl::Status s) {
            if (!s.ok()) stop.Cancel();
            if (s.ok() && timed) {
              const double seconds = absl::ToDoubleSeconds(clock->Now() - reduce_start);
              absl::MutexLock lock(&counters->reads_mu);
              counters->peer_reads.push_back({source, bytes, seconds});
            }
            done(std::move(s));
          });
      window.SetHandle(k, std::move(handle));
    }
    reduces.Wait(WallDeadline(call), &stop);
    if (n > 1) {
      call.counters->reduce_seconds += absl::ToDoubleSeconds(call.clock->Now() - reduce_start);
    }
    result = FirstError(reduces.statuses());
    if (result.ok() && !stop.cancelled()) {
      AggregationSpec rule_applied = rule;
      result = window.Finish(&rule_applied);
      if (result.ok() && applied != nullptr) *applied = rule_applied;
    }
  }
  for (auto& t : pushers) t.join();
  if (result.ok()) result = FirstError(push_status);
  if (result.ok() && stop.cancelled()) result = absl::AbortedError("round aborted");
  // We own nothing (behind NAT, or fewer elements than members): nothing
  // to publish.
  if (result.ok() && count > 0) result = transport->PublishAverage(step, out + own.begin, call);
  if (!result.ok()) stop.Cancel();
  gathers.Wait(WallDeadline(call), &stop);
  if (result.ok()) result = FirstError(gathers.statuses());
  if (result.ok() && stop.cancelled()) result = absl::AbortedError("round aborted");
  return result;
}

}  // namespace shoal::worker
