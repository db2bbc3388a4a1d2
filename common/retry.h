// The one retry loop of Shoal: calls an attempt until it succeeds, fails in
// a way that retrying cannot fix, the deadline passes or the work is
// cancelled, sleeping a capped, jittered backoff in between.
//
// What is retried: IsRetryable (UNAVAILABLE, DEADLINE_EXCEEDED of one
// attempt), plus the codes a call site names in `also_retry` with a comment
// saying why (a re-join retries NOT_FOUND while a restarted coordinator has
// not loaded its run record yet). Only idempotent calls, or calls that
// resume where they stopped, may be retried.
#ifndef SHOAL_COMMON_RETRY_H_
#define SHOAL_COMMON_RETRY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"

namespace shoal {

struct RetryPolicy {
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // No attempt starts after this long from the first; the last failure is
  // returned (annotated). absl::InfiniteDuration(): until cancelled.
  absl::Duration deadline = absl::Seconds(30);
  // Attempts in all (0: no limit but the deadline).
  int max_attempts = 0;
  // Codes retried besides IsRetryable's.
  std::vector<absl::StatusCode> also_retry;
  // Retry UNAVAILABLE (and also_retry) but not DEADLINE_EXCEEDED: for calls
  // that may have taken effect when their deadline passed (the worker's
  // reports to the coordinator: their caller decides).
  bool unavailable_only = false;
  // Time source for the deadline (the real clock when null); the sleeps
  // between attempts are real waits on the cancellation token.
  const Clock* clock = nullptr;
};

// True when `status` may be retried under `policy`.
bool ShouldRetry(const RetryPolicy& policy, const absl::Status& status);

struct RetryInfo {
  int attempts = 0;
  absl::Status last;  // the last failure that was retried
};

// Runs `attempt` until it returns OK or a status ShouldRetry refuses, the
// deadline passes (DEADLINE_EXCEEDED unless the last failure says more:
// then that one), or `cancel` (may be null) is cancelled (CANCELLED).
// `on_retry` (may be null) hears each failure that is retried, e.g. to log.
// `attempt` gets the time left before the deadline, for its own call
// deadline.
absl::Status Retry(const RetryPolicy& policy, CancellationToken* cancel,
                   const std::function<absl::Status(absl::Duration left)>& attempt,
                   const std::function<void(const absl::Status&, int attempt)>& on_retry = nullptr,
                   RetryInfo* info = nullptr);

}  // namespace shoal

#endif  // SHOAL_COMMON_RETRY_H_
