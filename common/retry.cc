#include "common/retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/status_util.h"

namespace shoal {

bool ShouldRetry(const RetryPolicy& policy, const absl::Status& status) {
  if (status.ok()) return false;
  if (IsRetryable(status) && !(policy.unavailable_only && absl::IsDeadlineExceeded(status))) {
    return true;
  }
  return std::find(policy.also_retry.begin(), policy.also_retry.end(), status.code()) !=
         policy.also_retry.end();
}

absl::Status Retry(const RetryPolicy& policy, CancellationToken* cancel,
                   const std::function<absl::Status(absl::Duration left)>& attempt,
                   const std::function<void(const absl::Status&, int attempt)>& on_retry,
                   RetryInfo* info) {
  const Clock* clock = policy.clock != nullptr ? policy.clock : RealClock::Get();
  const absl::Time deadline = policy.deadline == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : clock->Now() + policy.deadline;
  Backoff backoff(policy.initial_backoff, policy.max_backoff);
  RetryInfo local;
  RetryInfo* out = info != nullptr ? info : &local;
  *out = {};
  while (true) {
    if (cancel != nullptr && cancel->cancelled()) {
      return absl::CancelledError(
          out->last.ok() ? "cancelled" : absl::StrCat("cancelled after: ", out->last.message()));
    }
    const absl::Duration left = deadline - clock->Now();
    if (left <= absl::ZeroDuration()) {
      if (!out->last.ok()) {
        return Annotate(out->last, absl::StrCat("gave up after ", out->attempts, " attempts"));
      }
      return absl::DeadlineExceededError("no time left for an attempt");
    }
    ++out->attempts;
    absl::Status s = attempt(left);
    if (s.ok() || !ShouldRetry(policy, s)) return s;
    out->last = s;
    if (policy.max_attempts > 0 && out->attempts >= policy.max_attempts) {
      return Annotate(s, absl::StrCat("gave up after ", out->attempts, " attempts"));
    }
    if (on_retry) on_retry(s, out->attempts);
    const absl::Duration pause = std::min(backoff.Next(), deadline - clock->Now());
    if (pause > absl::ZeroDuration()) {
      if (cancel != nullptr) {
        cancel->WaitFor(pause);
      } else {
        absl::SleepFor(pause);
      }
    }
  }
}

}  // namespace shoal
