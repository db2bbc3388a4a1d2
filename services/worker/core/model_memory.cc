#include "services/worker/core/model_memory.h"

#include <cstring>
#include <utility>

#include "common/logging.h"
#include "services/worker/core/gossip_policy.h"

namespace shoal::worker {

ModelMemory::ModelMemory(ModelState* state, float* params, uint64_t total, const std::string& hash,
                         absl::Duration lent_timeout)
    : state_(state),
      params_(params),
      total_(total),
      lent_timeout_(lent_timeout),
      snapshot_(params, params + total) {
  state_->BindSnapshot(snapshot_.data());
  state_->SetModel(0, hash);
  state_->SetSnapshot(0);
}

ModelMemory::~ModelMemory() {
  state_->BeginSnapshotUpdate();
  if (!state_->AwaitReturned(ModelState::Buffer::kSnapshot, lent_timeout_)) {
    SHOAL_LOG(ERROR) << "gRPC still holds snapshot memory lent to peers; leaking it instead of "
                        "freeing memory it may read";
    (void)new std::vector<float>(std::move(snapshot_));
  }
}

void ModelMemory::AwaitLent(ModelState::Buffer buffer) {
  if (!state_->AwaitReturned(buffer, lent_timeout_)) {
    // Only a reader of a window that has closed can still hold the chunk:
    // whatever it receives now fails its CRC check there (DATA_LOSS).
    SHOAL_LOG(WARNING) << "after " << lent_timeout_ << " gRPC still holds "
                       << state_->chunks_lent(buffer) << " chunks of the "
                       << (buffer == ModelState::Buffer::kSnapshot ? "snapshot" : "model")
                       << " lent to peers; rewriting it anyway";
  }
}

double ModelMemory::Train(uint64_t round, const std::function<double(float*)>& train) {
  state_->BeginTraining(round);
  AwaitLent(ModelState::Buffer::kParameters);
  const double loss = train(params_);
  state_->SetReady(round);
  return loss;
}

void ModelMemory::ContributeAgain(uint64_t round) {
  (void)round;
  // Reads of the previous attempt are refused, and their chunks given back,
  // before the parameters are served again.
  state_->Unready();
  AwaitLent(ModelState::Buffer::kParameters);
}

void ModelMemory::ServePlan(uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end) {
  state_->SetPlan(round, attempt, begin, end);
  state_->SetReady(round);
}

void ModelMemory::HoldPending(uint64_t round, const std::string& hash) {
  // Peers catching up may read this round at once: serve it from the
  // parameters (nothing rewrites them before the round is settled). The
  // snapshot buffer is not written here, so its chunks still lent may stay
  // out (CommitPending and VoidPending wait for them before writing it).
  state_->BeginSnapshotUpdate();
  state_->BindSnapshot(params_);
  state_->SetSnapshot(round);
  state_->SetModel(round, hash);
}

void ModelMemory::CommitPending(uint64_t round) {
  state_->BeginSnapshotUpdate();
  AwaitLent(ModelState::Buffer::kSnapshot);
  std::memcpy(snapshot_.data(), params_, total_ * sizeof(float));
  state_->BindSnapshot(snapshot_.data());
  state_->SetSnapshot(round);
}

void ModelMemory::VoidPending(uint64_t round, const std::string& hash) {
  state_->BeginSnapshotUpdate();
  AwaitLent(ModelState::Buffer::kSnapshot);
  state_->BindSnapshot(snapshot_.data());
  state_->SetSnapshot(round);
  state_->SetModel(round, hash);
}

void ModelMemory::DropWork(uint64_t round) {
  state_->Abort(round);
  AwaitLent(ModelState::Buffer::kParameters);
  std::memcpy(params_, snapshot_.data(), total_ * sizeof(float));
}

void ModelMemory::KeepLateWork(uint64_t round) {
  state_->Abort(round);
  AwaitLent(ModelState::Buffer::kParameters);
  late_.resize(total_);
  const float* base = snapshot_.data();
  for (uint64_t i = 0; i < total_; ++i) {
    late_[i] = params_[i] - base[i];
    params_[i] = base[i];
  }
}

void ModelMemory::FoldLateWork(uint64_t round, double weight) {
  if (late_.empty()) {
    SHOAL_LOG(ERROR) << "round " << round << ": no late work kept to fold; contributing the base";
  }
  state_->BeginTraining(round);
  AwaitLent(ModelState::Buffer::kParameters);
  const float w = static_cast<float>(weight);
  const float* base = snapshot_.data();
  if (late_.empty()) {
    std::memcpy(params_, base, total_ * sizeof(float));
  } else {
    for (uint64_t i = 0; i < total_; ++i) params_[i] = base[i] + w * late_[i];
  }
  state_->SetReady(round);
}

void ModelMemory::DropLateWork() { std::vector<float>().swap(late_); }

absl::Status ModelMemory::CatchUp(
    uint64_t round, const std::string& hash, uint64_t model_round,
    const std::function<absl::Status(float* dst, uint64_t total)>& pull) {
  // Pull into the snapshot buffer: it is not served while being replaced.
  state_->BeginSnapshotUpdate();
  AwaitLent(ModelState::Buffer::kSnapshot);
  state_->BindSnapshot(snapshot_.data());
  absl::Status s = pull(snapshot_.data(), total_);
  if (!s.ok()) {
    // Keep what we had (the worker sits the round out).
    std::memcpy(snapshot_.data(), params_, total_ * sizeof(float));
    state_->SetSnapshot(model_round);
    return s;
  }
  // The parameters switch to a newer model: nothing of the old round is
  // served from them any more.
  state_->Unready();
  AwaitLent(ModelState::Buffer::kParameters);
  std::memcpy(params_, snapshot_.data(), total_ * sizeof(float));
  state_->SetSnapshot(round);
  state_->SetModel(round, hash);
  return absl::OkStatus();
}

void ModelMemory::BeginUnservedWrite() {
  state_->Unready();
  AwaitLent(ModelState::Buffer::kParameters);
}

double ModelMemory::TrainUnserved(const std::function<double(float*)>& train) {
  BeginUnservedWrite();
  return train(params_);
}

void ModelMemory::Interpolate(const float* base, const float* peer, double a) {
  BeginUnservedWrite();
  ApplyInterpolation(params_, base, peer, total_, a);
}

void ModelMemory::ReplaceModel(const float* model) {
  BeginUnservedWrite();
  if (model != params_) std::memcpy(params_, model, total_ * sizeof(float));
}

absl::Status ModelMemory::LoadModel(
    const std::function<absl::Status(float* params, uint64_t total)>& load) {
  BeginUnservedWrite();
  return load(params_, total_);
}

}  // namespace shoal::worker
