// One way to stop work in Shoal: a token that one side trips and every
// waiter hears at once. Nothing polls a flag.
//  - Waiters block in WaitFor (a sleep that ends early when cancelled).
//  - Calls in flight register a callback (e.g. ClientContext::TryCancel)
//    that runs when the token is cancelled, so a read waiting for a chunk
//    ends at once.
//  - A child token (an exchange's, a read's) is cancelled with its parent
//    (the worker's "this round is over" token), and may be cancelled alone.
//
// Thread-safe. Callbacks run under the token's lock, on the thread that
// calls Cancel() (or on the registering thread, when the token is already
// cancelled): they must be quick and must not touch the same token. In
// exchange, once Unregister returns the callback is not running and never
// will, so what it captured may go away.
#ifndef SHOAL_COMMON_CANCELLATION_H_
#define SHOAL_COMMON_CANCELLATION_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shoal {

class CancellationToken {
 public:
  CancellationToken() = default;
  // Cancelled when `parent` is (at once when it already is). `parent`
  // must outlive this token.
  explicit CancellationToken(CancellationToken* parent);
  ~CancellationToken();
  CancellationToken(const CancellationToken&) = delete;
  CancellationToken& operator=(const CancellationToken&) = delete;

  // Idempotent: the first call runs every registered callback and wakes
  // every waiter.
  void Cancel();
  bool cancelled() const;

  // Sleeps for `timeout` or until cancelled, whichever comes first; true
  // when cancelled.
  bool WaitFor(absl::Duration timeout) const;

  // Runs `callback` once at Cancel(), or at once (before returning 0) when
  // already cancelled. Returns an id for Unregister (never 0 otherwise).
  uint64_t Register(std::function<void()> callback);
  // Idempotent; id 0 is ignored.
  void Unregister(uint64_t id);

 private:
  CancellationToken* const parent_ = nullptr;
  uint64_t parent_registration_ = 0;

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

// Registers a callback for the scope of one call. `token` may be null.
class ScopedCancelCallback {
 public:
  ScopedCancelCallback(CancellationToken* token, std::function<void()> callback)
      : token_(token), id_(token ? token->Register(std::move(callback)) : 0) {}
  ~ScopedCancelCallback() {
    if (token_ != nullptr) token_->Unregister(id_);
  }
  ScopedCancelCallback(const ScopedCancelCallback&) = delete;
  ScopedCancelCallback& operator=(const ScopedCancelCallback&) = delete;

 private:
  CancellationToken* const token_;
  const uint64_t id_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_CANCELLATION_H_
