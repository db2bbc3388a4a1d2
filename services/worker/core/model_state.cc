#include "services/worker/core/model_state.h"

#include "absl/strings/str_cat.h"

namespace shoal::worker {

void ModelState::Bind(const float* params, uint64_t total_elements, std::string model) {
  absl::MutexLock lock(&mu_);
  model_ = std::move(model);
  total_ = total_elements;
  params_ = params;
}

void ModelState::SetWorkerId(const std::string& id) {
  absl::MutexLock lock(&mu_);
  worker_id_ = id;
}

void ModelState::BeginTraining(uint64_t round) {
  absl::MutexLock lock(&mu_);
  round_ = round;
  ready_ = has_plan_ = averaged_ = false;
  attempt_ = 0;
}

void ModelState::SetReady(uint64_t round) {
  absl::MutexLock lock(&mu_);
  round_ = round;
  ready_ = true;
}

void ModelState::SetPlan(uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end) {
  absl::MutexLock lock(&mu_);
  if (round != round_) return;
  has_plan_ = true;
  averaged_ = false;
  attempt_ = attempt;
  own_begin_ = begin;
  own_end_ = end;
}

void ModelState::Unready() {
  absl::MutexLock lock(&mu_);
  ready_ = false;
  averaged_ = false;
}

void ModelState::BindSnapshot(const float* snapshot) { snapshot_ = snapshot; }

void ModelState::BeginSnapshotUpdate() {
  absl::MutexLock lock(&mu_);
  snapshot_valid_ = false;
  ++snapshot_generation_;
}

void ModelState::SetSnapshot(uint64_t round) {
  absl::MutexLock lock(&mu_);
  snapshot_round_ = round;
  snapshot_valid_ = true;
  ++snapshot_generation_;
}

void ModelState::MarkAveraged(uint64_t round) {
  absl::MutexLock lock(&mu_);
  if (round == round_) averaged_ = true;
}

void ModelState::Abort(uint64_t round) {
  absl::MutexLock lock(&mu_);
  if (round != round_) return;
  ready_ = has_plan_ = averaged_ = false;
}

void ModelState::SetModel(uint64_t round, const std::string& hash) {
  absl::MutexLock lock(&mu_);
  model_round_ = round;
  model_hash_ = hash;
}

void ModelState::SetShuttingDown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
}

absl::Status ModelState::CheckRead(const shoal::v1::ReadSliceRequest& r,
                                   uint64_t* generation) const {
  const uint64_t total = total_elements();
  if (params_.load() == nullptr) return absl::UnavailableError("this worker has no model yet");
  if (r.end() <= r.begin()) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty or reversed range [", r.begin(), ", ", r.end(), ")"));
  }
  if (r.end() > total) {
    return absl::OutOfRangeError(
        absl::StrCat("range end ", r.end(), " is past the model's ", total, " elements"));
  }
  if (r.kind() != shoal::v1::CONTRIBUTION && r.kind() != shoal::v1::AVERAGED &&
      r.kind() != shoal::v1::SNAPSHOT) {
    return absl::InvalidArgumentError("kind must be CONTRIBUTION, AVERAGED or SNAPSHOT");
  }
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("worker is shutting down");
  if (r.kind() == shoal::v1::SNAPSHOT) {
    if (snapshot_.load() == nullptr || !snapshot_valid_) {
      return absl::UnavailableError("the snapshot is being replaced");
    }
    if (r.round() != snapshot_round_) {
      return absl::FailedPreconditionError(absl::StrCat("this worker holds the model of round ",
                                                        snapshot_round_, ", not ", r.round()));
    }
    if (generation != nullptr) *generation = snapshot_generation_.load();
    return absl::OkStatus();
  }
  if (r.round() < round_) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", r.round(), " is stale: this worker is at round ", round_));
  }
  if (r.round() > round_) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", r.round(), " is in the future: this worker is at round ", round_));
  }
  if (!ready_) {
    return absl::FailedPreconditionError(
        absl::StrCat("this worker has not finished training round ", round_));
  }
  if (has_plan_ && r.attempt() != attempt_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan attempt ", r.attempt(), " is not current (this worker is at ", attempt_, ")"));
  }
  if (r.kind() == shoal::v1::CONTRIBUTION) return absl::OkStatus();
  if (!has_plan_) return absl::UnavailableError("the round's plan has not arrived here yet");
  if (r.begin() < own_begin_ || r.end() > own_end_) {
    return absl::FailedPreconditionError(absl::StrCat("this worker owns [", own_begin_, ", ",
                                                      own_end_, ") in round ", round_, ", not [",
                                                      r.begin(), ", ", r.end(), ")"));
  }
  if (!averaged_) return absl::UnavailableError("slice not averaged yet");
  return absl::OkStatus();
}

shoal::v1::PeerInfo ModelState::Info() const {
  absl::MutexLock lock(&mu_);
  shoal::v1::PeerInfo info;
  info.set_worker_id(worker_id_);
  info.set_model_round(model_round_);
  info.set_model_hash(model_hash_);
  info.set_total_elements(total_.load());
  info.set_model(model_);
  return info;
}

}  // namespace shoal::worker
