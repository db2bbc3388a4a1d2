#include "common/cancellation.h"

#include <utility>

namespace shoal {

CancellationToken::CancellationToken(CancellationToken* parent) : parent_(parent) {
  if (parent_ != nullptr) parent_registration_ = parent_->Register([this] { Cancel(); });
}

CancellationToken::~CancellationToken() {
  if (parent_ != nullptr) parent_->Unregister(parent_registration_);
}

void CancellationToken::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  for (auto& [id, callback] : callbacks_) callback();
  callbacks_.clear();
}

bool CancellationToken::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool CancellationToken::WaitFor(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto is_cancelled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_; };
  return mu_.AwaitWithTimeout(absl::Condition(&is_cancelled), timeout);
}

uint64_t CancellationToken::Register(std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) {
    callback();
    return 0;
  }
  const uint64_t id = next_id_++;
  callbacks_.emplace(id, std::move(callback));
  return id;
}

void CancellationToken::Unregister(uint64_t id) {
  if (id == 0) return;
  absl::MutexLock lock(&mu_);
  callbacks_.erase(id);
}

}  // namespace shoal
