#include "services/worker/core/encoded_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shoal::worker {

void EncodedStore::BeginRound(uint64_t round, uint32_t attempt) {
  absl::ReleasableMutexLock lock(&mu_);
  DropLocked(round);
  round_ = round;
  attempt_ = attempt;
  started_ = true;
  stage_ = 0;
  Answered answered = TakeAnsweredLocked();
  lock.Release();
  Deliver(std::move(answered));
}

void EncodedStore::Withdraw() {
  absl::MutexLock lock(&mu_);
  if (!started_) return;
  DropLocked(round_);
  started_ = false;
  stage_ = 0;
  // Waiting reads stay UNAVAILABLE (they park until the next plan's
  // Publish or their own wait ends).
}

void EncodedStore::DropLocked(uint64_t round) {
  for (auto it = blobs_.begin(); it != blobs_.end();) {
    const auto& [r, a, stage, kind, b, e] = it->first;
    const bool keep = r + 1 == round && kind == shoal::v1::AVERAGED;
    it = keep ? std::next(it) : blobs_.erase(it);
  }
}

void EncodedStore::ReachStage(uint64_t round, uint32_t attempt, uint32_t stage) {
  absl::ReleasableMutexLock lock(&mu_);
  if (!started_ || round != round_ || attempt != attempt_) return;
  stage_ = std::max(stage_, stage);
  Answered answered = TakeAnsweredLocked();
  lock.Release();
  Deliver(std::move(answered));
}

void EncodedStore::Publish(uint64_t round, uint32_t attempt, shoal::v1::SliceKind kind,
                           uint64_t begin, uint64_t end, Blob blob, uint32_t stage) {
  absl::ReleasableMutexLock lock(&mu_);
  if (!started_ || round != round_ || attempt != attempt_) return;
  blobs_[Key{round, attempt, stage, kind, begin, end}] = std::move(blob);
  Answered answered = TakeAnsweredLocked();
  lock.Release();
  Deliver(std::move(answered));
}

void EncodedStore::SetState(uint64_t round, Blob state) {
  absl::ReleasableMutexLock lock(&mu_);
  state_round_ = round;
  state_ = std::move(state);
  Answered answered = TakeAnsweredLocked();
  lock.Release();
  Deliver(std::move(answered));
}

uint64_t EncodedStore::Await(const shoal::v1::ReadEncodedRequest& request, Waiter done) const {
  absl::ReleasableMutexLock lock(&mu_);
  absl::StatusOr<Blob> now = FindLocked(request);
  if (!absl::IsUnavailable(now.status())) {
    lock.Release();
    done(std::move(now));
    return 0;
  }
  const uint64_t ticket = next_ticket_++;
  waits_.emplace(ticket, Wait{request, std::move(done)});
  return ticket;
}

bool EncodedStore::CancelWait(uint64_t ticket) const {
  absl::MutexLock lock(&mu_);
  return waits_.erase(ticket) > 0;
}

size_t EncodedStore::waiting() const {
  absl::MutexLock lock(&mu_);
  return waits_.size();
}

EncodedStore::Answered EncodedStore::TakeAnsweredLocked() {
  Answered answered;
  for (auto it = waits_.begin(); it != waits_.end();) {
    absl::StatusOr<Blob> found = FindLocked(it->second.request);
    if (absl::IsUnavailable(found.status())) {
      ++it;
      continue;
    }
    answered.emplace_back(std::move(it->second.done), std::move(found));
    it = waits_.erase(it);
  }
  return answered;
}

void EncodedStore::Deliver(Answered answered) {
  for (auto& [done, found] : answered) done(std::move(found));
}

absl::StatusOr<Blob> EncodedStore::Find(const shoal::v1::ReadEncodedRequest& r) const {
  absl::MutexLock lock(&mu_);
  return FindLocked(r);
}

absl::StatusOr<Blob> EncodedStore::FindLocked(const shoal::v1::ReadEncodedRequest& r) const {
  if (r.kind() == shoal::v1::SLICE_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError("ReadEncoded needs a kind");
  }
  // A kind never published here never comes: not UNAVAILABLE, which would
  // have the reader ask again until its deadline (found by the
  // read_encoded_request fuzz target).
  if (r.kind() != shoal::v1::CONTRIBUTION && r.kind() != shoal::v1::AVERAGED &&
      r.kind() != shoal::v1::STAGE_MODEL && r.kind() != shoal::v1::SNAPSHOT) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadEncoded of kind ", static_cast<int>(r.kind()),
                     " is not served from the encoded exchange (CONTRIBUTION, AVERAGED, "
                     "STAGE_MODEL, SNAPSHOT)"));
  }
  if (r.kind() == shoal::v1::SNAPSHOT) {
    if (state_ != nullptr && r.round() == state_round_) return state_;
    if (state_ == nullptr || r.round() > state_round_) {
      return absl::UnavailableError(
          absl::StrCat("no outer optimizer state of round ", r.round(), " here yet"));
    }
    return absl::FailedPreconditionError(absl::StrCat("outer optimizer state of round ", r.round(),
                                                      " was replaced by round ", state_round_));
  }
  if (r.begin() >= r.end()) {
    return absl::InvalidArgumentError(absl::StrCat("empty slice [", r.begin(), ", ", r.end(), ")"));
  }
  auto it = blobs_.find(Key{r.round(), r.attempt(), r.stage(), r.kind(), r.begin(), r.end()});
  if (it != blobs_.end()) return it->second;
  const std::string what = absl::StrCat(shoal::v1::SliceKind_Name(r.kind()), " [", r.begin(), ", ",
                                        r.end(), ") of round ", r.round(), " attempt ", r.attempt(),
                                        r.stage() > 0 ? absl::StrCat(" stage ", r.stage()) : "");
  if (started_ && r.round() == round_ && r.attempt() == attempt_ && r.stage() < stage_) {
    // A stage this worker has passed: what it did not publish there never
    // comes.
    return absl::FailedPreconditionError(absl::StrCat(
        what, " is not served here (this worker published no such slice there and is at stage ",
        stage_, ")"));
  }
  if (!started_ || r.round() > round_ || (r.round() == round_ && r.attempt() >= attempt_)) {
    return absl::UnavailableError(absl::StrCat(what, " not encoded here yet"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, " is not served here (this worker is at round ", round_, " attempt ", attempt_, ")"));
}

}  // namespace shoal::worker
