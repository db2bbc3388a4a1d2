#include "services/worker/exchanger.h"

#include <pthread.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/chunk_codec.h"
#include "common/logging.h"
#include "common/retry.h"

namespace shoal::worker {
namespace {

// Names the calling thread (at most 15 characters), so that profiles and
// debuggers tell the exchange's reads apart from gRPC's threads.
void NameThread(const char* name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#endif
}

const Fp32Codec kFp32;

// The first failure, preferring the one that stopped the others over their
// ABORTED.
absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  absl::Status aborted;
  for (const auto& s : statuses) {
    if (s.ok()) continue;
    if (!absl::IsAborted(s)) return s;
    if (aborted.ok()) aborted = s;
  }
  return aborted;
}

}  // namespace

Exchanger::Exchanger(PeerClient* peers, ModelState* state, ExchangeOptions options,
                     const Codec* codec)
    : peers_(peers),
      state_(state),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
      codec_(codec != nullptr ? codec : &kFp32) {}

absl::Status Exchanger::ReadWithRetry(const std::string& address, shoal::v1::SliceKind kind,
                                      uint64_t round, uint32_t attempt, uint64_t begin,
                                      uint64_t end, const std::string& self_id, absl::Time deadline,
                                      CancellationToken* stop,
                                      const std::function<absl::Status(const ChunkView&)>& apply,
                                      std::atomic<int>* retries) {
  RetryPolicy policy;
  policy.initial_backoff = options_.initial_backoff;
  policy.max_backoff = options_.max_backoff;
  policy.deadline = deadline - clock_->Now();
  policy.clock = clock_;
  uint64_t next = begin;
  absl::Status s = Retry(
      policy, stop,
      [&](absl::Duration left) {
        shoal::v1::ReadSliceRequest request;
        request.set_round(round);
        request.set_begin(next);
        request.set_end(end);
        request.set_kind(kind);
        request.set_reader_id(self_id);
        request.set_attempt(attempt);
        absl::Status applied;
        absl::Status read =
            peers_->ReadSliceCancellable(address, request, left, stop, [&](const ChunkView& chunk) {
              applied = apply(chunk);
              if (!applied.ok()) return false;
              next = chunk.begin + chunk.count;
              return !stop->cancelled();
            });
        // A chunk the codec refuses is final (bad data would fail again).
        if (!applied.ok()) return applied;
        return read;
      },
      [&](const absl::Status&, int) { ++*retries; });
  if (stop->cancelled()) return absl::AbortedError("round aborted");
  if (absl::IsDeadlineExceeded(s) || (!s.ok() && clock_->Now() >= deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("exchange of round ", round,
                                                    " timed out reading [", next, ", ", end,
                                                    ") from ", address, ": ", s.message()));
  }
  return s;
}

absl::Status Exchanger::Average(const shoal::v1::RoundPlan& plan, const std::string& self_id,
                                float* params, CancellationToken* cancel, AveragingStats* stats) {
  const uint64_t round = plan.round();
  const int n = plan.slices_size();
  int self = -1;
  for (int k = 0; k < n; ++k) {
    if (plan.slices(k).worker_id() == self_id) self = k;
  }
  if (self < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan of round ", round, " has no slice for ", self_id));
  }
  if (plan.total_elements() != state_->total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("plan is for ", plan.total_elements(),
                                                   " elements, the model has ",
                                                   state_->total_elements()));
  }
  const auto& own = plan.slices(self);
  state_->SetPlan(round, plan.attempt(), own.begin(), own.end());
  const absl::Time deadline = clock_->Now() + options_.timeout;

  std::mutex accumulate_mu;
  std::atomic<uint64_t> received{0};
  std::atomic<int> retries{0};
  std::vector<absl::Status> reduce_status(n), gather_status(n);
  std::vector<std::thread> reducers, gatherers;
  // Cancelled with the caller's token, or when the reduce part failed (our
  // own slice will never be averaged, so waiting for the others' is
  // pointless): either ends every read at once.
  CancellationToken stop(cancel);

  // All-gather reads start at once; they wait for the owners' averages.
  for (int k = 0; k < n; ++k) {
    if (k == self || plan.slices(k).begin() == plan.slices(k).end()) continue;
    const auto& s = plan.slices(k);
    gatherers.emplace_back([&, k, s] {
      NameThread("shoal-gather");
      gather_status[k] = ReadWithRetry(
          s.peer_address(), shoal::v1::AVERAGED, round, plan.attempt(), s.begin(), s.end(), self_id,
          deadline, &stop,
          [&](const ChunkView& c) {
            received += c.count * sizeof(float);
            return codec_->ApplyAverage(c, params + c.begin);
          },
          &retries);
    });
  }
  // Reduce-scatter: sum every other participant's copy of our slice.
  if (own.begin() < own.end()) {
    for (int k = 0; k < n; ++k) {
      if (k == self) continue;
      const auto& s = plan.slices(k);
      reducers.emplace_back([&, k, s] {
        NameThread("shoal-reduce");
        reduce_status[k] = ReadWithRetry(
            s.peer_address(), shoal::v1::CONTRIBUTION, round, plan.attempt(), own.begin(),
            own.end(), self_id, deadline, &stop,
            [&](const ChunkView& c) {
              std::lock_guard<std::mutex> lock(accumulate_mu);
              received += c.count * sizeof(float);
              return codec_->AccumulateContribution(c, params + c.begin);
            },
            &retries);
        if (!reduce_status[k].ok()) stop.Cancel();
      });
    }
  }
  for (auto& t : reducers) t.join();
  absl::Status result = FirstError(reduce_status);
  if (result.ok() && !stop.cancelled()) {
    const uint64_t count = own.end() - own.begin();
    DivideFloats(params + own.begin(), count, static_cast<float>(n));
    codec_->RoundTripAverage(params + own.begin(), count);
    state_->MarkAveraged(round);
  } else if (result.ok()) {
    result = absl::AbortedError("round aborted");
  }
  for (auto& t : gatherers) t.join();
  if (result.ok()) result = FirstError(gather_status);
  if (stats != nullptr) {
    stats->bytes_received = received.load();
    stats->retries = retries.load();
  }
  return result;
}

}  // namespace shoal::worker
