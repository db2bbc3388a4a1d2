#include "services/worker/core/push_box.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shoal::worker {

PushBox::PushBox(uint64_t max_bytes, const Clock* clock)
    : max_bytes_(max_bytes), clock_(clock != nullptr ? clock : RealClock::Get()) {}

absl::Status PushBox::Put(const PushKey& key, std::string bytes) {
  absl::MutexLock lock(&mu_);
  if (key.round < oldest_round_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push of round ", key.round, " is too old (this worker is at round ", oldest_round_, ")"));
  }
  auto it = pushes_.find(key);
  const uint64_t replaced = it == pushes_.end() ? 0 : it->second.size();
  if (bytes_ - replaced + bytes.size() > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("this worker keeps at most ", max_bytes_,
                                                     " bytes of pushed contributions; ", bytes_,
                                                     " are waiting"));
  }
  bytes_ = bytes_ - replaced + bytes.size();
  pushes_[key] = std::move(bytes);
  arrived_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> PushBox::Take(const PushKey& key, absl::Time deadline,
                                          CancellationToken* cancel) {
  bool fired = false;
  // Runs under the token's lock; takes ours to wake the waiter below.
  ScopedCancelCallback on_cancel(cancel, [&] {
    absl::MutexLock lock(&mu_);
    fired = true;
    arrived_.SignalAll();
  });
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = pushes_.find(key);
    if (it != pushes_.end()) {
      std::string out = std::move(it->second);
      bytes_ -= out.size();
      pushes_.erase(it);
      return out;
    }
    if (fired) return absl::AbortedError("round aborted");
    const absl::Time now = clock_->Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("the contribution of ", key.pusher, " to [",
                                                      key.begin, ", ", key.end, ") of round ",
                                                      key.round, " was not pushed in time"));
    }
    // Woken by a Put or the cancel callback; at the latest after 100 ms
    // (the deadline is on `clock_`, which may not be the real one).
    arrived_.WaitWithTimeout(&mu_, std::min(deadline - now, absl::Milliseconds(100)));
  }
}

absl::Status PushBox::PutGossip(GossipPush push) {
  absl::MutexLock lock(&mu_);
  uint64_t replaced = 0;
  auto same = gossip_.end();
  for (auto it = gossip_.begin(); it != gossip_.end(); ++it) {
    if (it->pusher == push.pusher) {
      same = it;
      replaced = it->bytes.size();
    }
  }
  if (bytes_ - replaced + push.bytes.size() > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("this worker keeps at most ", max_bytes_,
                                                     " bytes of pushed models; ", bytes_, " wait"));
  }
  if (same != gossip_.end()) gossip_.erase(same);
  bytes_ = bytes_ - replaced + push.bytes.size();
  gossip_.push_back(std::move(push));
  return absl::OkStatus();
}

std::optional<GossipPush> PushBox::TakeGossip() {
  absl::MutexLock lock(&mu_);
  if (gossip_.empty()) return std::nullopt;
  GossipPush out = std::move(gossip_.front());
  gossip_.pop_front();
  bytes_ -= out.bytes.size();
  return out;
}

void PushBox::DropBefore(uint64_t round) {
  absl::MutexLock lock(&mu_);
  if (round <= oldest_round_) return;
  oldest_round_ = round;
  for (auto it = pushes_.begin(); it != pushes_.end();) {
    if (it->first.round < round) {
      bytes_ -= it->second.size();
      it = pushes_.erase(it);
    } else {
      ++it;
    }
  }
}

void PushBox::SetMaxBytes(uint64_t max_bytes) {
  absl::MutexLock lock(&mu_);
  max_bytes_ = max_bytes;
}

uint64_t PushBox::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace shoal::worker
