#include "services/worker/exchanger.h"

#include <pthread.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/chunk_codec.h"
#include "common/logging.h"

namespace shoal::worker {
namespace {

// Names the calling thread (at most 15 characters), so that profiles and
// debuggers tell the exchange's reads apart from gRPC's threads.
void NameThread(const char* name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#endif
}

}  // namespace

absl::Status Exchanger::ReadWithRetry(const std::string& address, shoal::v1::SliceKind kind,
                                      uint64_t round, uint32_t attempt, uint64_t begin,
                                      uint64_t end, const std::string& self_id, absl::Time deadline,
                                      const std::function<bool()>& stopped,
                                      const std::function<void(const ChunkView&)>& apply,
                                      ReadCanceller* canceller, std::atomic<int>* retries) {
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  uint64_t next = begin;
  absl::Status last;
  while (next < end) {
    if (stopped()) return absl::AbortedError("round aborted");
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("exchange of round ", round, " timed out reading [", next, ", ", end,
                       ") from ", address, last.ok() ? "" : absl::StrCat(": ", last.message())));
    }
    shoal::v1::ReadSliceRequest request;
    request.set_round(round);
    request.set_begin(next);
    request.set_end(end);
    request.set_kind(kind);
    request.set_reader_id(self_id);
    request.set_attempt(attempt);
    last = peers_->ReadSliceCancellable(address, request, left, canceller,
                                        [&](const ChunkView& chunk) {
                                          apply(chunk);
                                          next = chunk.begin + chunk.count;
                                          return !stopped();
                                        });
    if (last.ok()) return last;
    if (stopped()) return absl::AbortedError("round aborted");
    // Only transient failures are retried; bad data or a refused request
    // (wrong round, wrong range) would fail the same way again.
    if (!absl::IsUnavailable(last) && !absl::IsDeadlineExceeded(last)) return last;
    ++*retries;
    absl::SleepFor(std::min(backoff.Next(), deadline - absl::Now()));
  }
  return absl::OkStatus();
}

absl::Status Exchanger::Run(const shoal::v1::RoundPlan& plan, const std::string& self_id,
                            const std::atomic<bool>* abort, ExchangeStats* stats) {
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
  const absl::Time deadline = absl::Now() + options_.timeout;

  std::mutex accumulate_mu;
  std::atomic<uint64_t> received{0};
  std::atomic<int> retries{0};
  std::vector<absl::Status> reduce_status(n), gather_status(n);
  std::vector<std::thread> reducers, gatherers;
  // One per read, so that a stopped exchange can end reads that are waiting
  // (an all-gather read parked on its owner's server) at once.
  std::vector<std::unique_ptr<ReadCanceller>> cancellers;
  // Set when the reduce part failed: our own slice will never be averaged,
  // so waiting for the others' is pointless.
  std::atomic<bool> failed{false};
  auto stopped = [&] { return failed.load() || (abort != nullptr && abort->load()); };
  // Reads still running, per phase.
  absl::Mutex running_mu;
  int reducers_running = 0, gatherers_running = 0;
  auto done = [&](int* counter) {
    absl::MutexLock lock(&running_mu);
    --*counter;
  };
  // Waits for `*counter` to reach 0; cancels every read once the exchange
  // is stopped (`abort` is a flag set by another thread: polled).
  bool cancelled = false;
  auto join = [&](int* counter) {
    auto finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(running_mu) { return *counter == 0; };
    absl::MutexLock lock(&running_mu);
    while (!running_mu.AwaitWithTimeout(absl::Condition(&finished), absl::Milliseconds(2))) {
      if (!cancelled && stopped()) {
        cancelled = true;
        for (auto& c : cancellers) c->Cancel();
      }
    }
  };

  // All-gather reads start at once; they wait for the owners' averages.
  for (int k = 0; k < n; ++k) {
    if (k == self || plan.slices(k).begin() == plan.slices(k).end()) continue;
    const auto& s = plan.slices(k);
    ReadCanceller* canceller = cancellers.emplace_back(std::make_unique<ReadCanceller>()).get();
    ++gatherers_running;
    gatherers.emplace_back([&, k, s, canceller] {
      NameThread("shoal-gather");
      gather_status[k] = ReadWithRetry(
          s.peer_address(), shoal::v1::AVERAGED, round, plan.attempt(), s.begin(), s.end(), self_id,
          deadline, stopped,
          [&](const ChunkView& c) {
            c.CopyTo(params_ + c.begin);
            received += c.count * sizeof(float);
          },
          canceller, &retries);
      done(&gatherers_running);
    });
  }
  // Reduce-scatter: sum every other participant's copy of our slice.
  if (own.begin() < own.end()) {
    for (int k = 0; k < n; ++k) {
      if (k == self) continue;
      const auto& s = plan.slices(k);
      ReadCanceller* canceller = cancellers.emplace_back(std::make_unique<ReadCanceller>()).get();
      ++reducers_running;
      reducers.emplace_back([&, k, s, canceller] {
        NameThread("shoal-reduce");
        reduce_status[k] = ReadWithRetry(
            s.peer_address(), shoal::v1::CONTRIBUTION, round, plan.attempt(), own.begin(),
            own.end(), self_id, deadline, stopped,
            [&](const ChunkView& c) {
              std::lock_guard<std::mutex> lock(accumulate_mu);
              c.AddTo(params_ + c.begin);
              received += c.count * sizeof(float);
            },
            canceller, &retries);
        done(&reducers_running);
      });
    }
  }
  join(&reducers_running);
  for (auto& t : reducers) t.join();
  absl::Status result;
  for (const auto& s : reduce_status) {
    if (!s.ok() && result.ok()) result = s;
  }
  if (result.ok()) {
    DivideFloats(params_ + own.begin(), own.end() - own.begin(), static_cast<float>(n));
    state_->MarkAveraged(round);
  } else {
    failed = true;
  }
  join(&gatherers_running);
  for (auto& t : gatherers) t.join();
  for (const auto& s : gather_status) {
    if (!s.ok() && result.ok()) result = s;
  }
  if (stats != nullptr) {
    stats->bytes_received = received.load();
    stats->retries = retries.load();
  }
  return result;
}

}  // namespace shoal::worker
