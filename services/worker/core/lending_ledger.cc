#include "services/worker/core/lending_ledger.h"

#include <algorithm>

namespace shoal::worker {

uint64_t LendingLedger::window(ModelBuffer buffer) const {
  absl::MutexLock lock(&mu_);
  return window_[Index(buffer)];
}

bool LendingLedger::IsOpen(ModelBuffer buffer, uint64_t window) const {
  absl::MutexLock lock(&mu_);
  return window_[Index(buffer)] == window;
}

void LendingLedger::CloseWindow(ModelBuffer buffer) {
  absl::MutexLock lock(&mu_);
  ++window_[Index(buffer)];
}

bool LendingLedger::Lend(ModelBuffer buffer, uint64_t window) {
  absl::MutexLock lock(&mu_);
  if (window_[Index(buffer)] != window) return false;
  ++lent_[Index(buffer)];
  return true;
}

void LendingLedger::LendUnconditionally(ModelBuffer buffer) {
  absl::MutexLock lock(&mu_);
  ++lent_[Index(buffer)];
}

void LendingLedger::Return(ModelBuffer buffer) {
  absl::MutexLock lock(&mu_);
  --lent_[Index(buffer)];
}

int LendingLedger::lent(ModelBuffer buffer) const {
  absl::MutexLock lock(&mu_);
  return lent_[Index(buffer)];
}

bool LendingLedger::AwaitReturned(ModelBuffer buffer, absl::Duration timeout,
                                  const std::function<void()>& revoke) const {
  const int b = Index(buffer);
  auto none_lent = [this, b]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return lent_[b] == 0; };
  // A chunk still out after the grace sits behind a reader that stopped
  // reading: `revoke` cancels its stream, which makes gRPC drop the chunk.
  const absl::Duration grace = std::min(timeout, kRevokeGrace);
  {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&none_lent), grace)) return true;
  }
  if (revoke) revoke();
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&none_lent), timeout - grace);
}

bool LendingLedger::AwaitAllReturned(absl::Duration timeout) const {
  auto none_lent = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return lent_[0] == 0 && lent_[1] == 0;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&none_lent), timeout);
}

}  // namespace shoal::worker
