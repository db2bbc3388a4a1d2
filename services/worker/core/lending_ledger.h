// The ledger of model memory lent to gRPC (the zero-copy Peer.ReadSlice):
// per buffer, its current window and how many chunks are out.
//
// gRPC reads a chunk's bytes when it writes them to the socket, possibly
// well after the write was started, so memory is lent in windows: a read is
// granted within its buffer's current window (an epoch number), each chunk
// is lent only while that window is still open (Lend), and is returned when
// gRPC drops its last reference (Return). Whoever rewrites a buffer outside
// the exchange protocol closes its window first (CloseWindow) and then waits
// until every chunk is back (AwaitReturned), which after a short grace asks
// the streams still holding one to cancel themselves.
//
// Thread-safe; Return takes only this ledger's lock (it runs inside gRPC).
// Callers may hold their own lock around Lend / CloseWindow (ModelState
// does: its lock, then this one), never around AwaitReturned.
#ifndef SHOAL_SERVICES_WORKER_CORE_LENDING_LEDGER_H_
#define SHOAL_SERVICES_WORKER_CORE_LENDING_LEDGER_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/worker/core/serving_rule.h"

namespace shoal::worker {

class LendingLedger {
 public:
  // How long AwaitReturned waits before it asks holders to cancel: a chunk
  // on its way to a reader that is reading leaves within milliseconds
  // (200 ms is 1 MiB at 40 Mbit/s).
  static constexpr absl::Duration kRevokeGrace = absl::Milliseconds(200);

  // The window reads of `buffer` are granted in now.
  uint64_t window(ModelBuffer buffer) const;
  bool IsOpen(ModelBuffer buffer, uint64_t window) const;
  // Opens a new window: chunks of older grants are no longer lent.
  void CloseWindow(ModelBuffer buffer);

  // Lends one chunk of `buffer` when `window` is still open (false
  // otherwise: the read must start over).
  bool Lend(ModelBuffer buffer, uint64_t window);
  // Counts memory read outside gRPC (hashing a manifest) as lent, whatever
  // the window, so that a rewrite waits for it too.
  void LendUnconditionally(ModelBuffer buffer);
  void Return(ModelBuffer buffer);
  int lent(ModelBuffer buffer) const;

  // Waits until no chunk of `buffer` is lent, at most `timeout`. After
  // min(timeout, kRevokeGrace) it runs `revoke` once (without the lock) and
  // waits the rest. False on timeout.
  bool AwaitReturned(ModelBuffer buffer, absl::Duration timeout,
                     const std::function<void()>& revoke) const;
  // Waits until nothing of any buffer is lent; false on timeout.
  bool AwaitAllReturned(absl::Duration timeout) const;

 private:
  static int Index(ModelBuffer b) { return b == ModelBuffer::kSnapshot ? 1 : 0; }

  mutable absl::Mutex mu_;
  // Parameters start at window 1, the snapshot at 0 (its generation).
  uint64_t window_[2] ABSL_GUARDED_BY(mu_) = {1, 0};
  int lent_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_LENDING_LEDGER_H_
