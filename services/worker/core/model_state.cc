#include "services/worker/core/model_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace shoal::worker {

absl::Status CheckLayers(const std::vector<LayerSpan>& layers, uint64_t total) {
  if (layers.empty()) return absl::InvalidArgumentError("no layers");
  uint64_t next = 0;
  for (const LayerSpan& l : layers) {
    if (l.name.empty()) return absl::InvalidArgumentError("a layer has no name");
    if (l.offset != next || l.elements == 0) {
      return absl::InvalidArgumentError(absl::StrCat("layer '", l.name, "' is [", l.offset, ", +",
                                                     l.elements, "), expected it to start at ",
                                                     next, " and not be empty"));
    }
    next += l.elements;
  }
  if (next != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layers cover ", next, " elements, the model has ", total));
  }
  return absl::OkStatus();
}

shoal::v1::ModelManifest ComputeModelManifest(const float* data, uint64_t total,
                                              const std::vector<LayerSpan>& layers,
                                              uint64_t piece_elements, uint64_t round,
                                              const std::string& model_hash) {
  shoal::v1::ModelManifest m;
  m.set_round(round);
  m.set_piece_elements(piece_elements);
  m.set_total_elements(total);
  // One pass over memory: the whole-model hash (when not known) is fed with
  // the same bytes as the layer and piece hashes.
  std::optional<Sha256> whole;
  if (model_hash.empty()) whole.emplace();
  for (const LayerSpan& l : layers) {
    auto* d = m.add_layers();
    d->set_name(l.name);
    d->set_offset(l.offset);
    d->set_elements(l.elements);
    Sha256 layer;
    const bool pieces = l.elements > piece_elements;
    for (uint64_t b = 0; b < l.elements; b += piece_elements) {
      const uint64_t count = std::min(piece_elements, l.elements - b);
      const float* p = data + l.offset + b;
      const size_t bytes = count * sizeof(float);
      layer.Update(p, bytes);
      if (whole) whole->Update(p, bytes);
      if (pieces) d->add_piece_sha256(Sha256Hex(p, bytes));
    }
    d->set_sha256(layer.HexDigest());
  }
  m.set_model_hash(whole ? whole->HexDigest() : model_hash);
  return m;
}

void ModelState::Bind(const float* params, uint64_t total_elements, std::string model) {
  absl::MutexLock lock(&mu_);
  model_ = std::move(model);
  total_ = total_elements;
  params_ = params;
}

absl::Status ModelState::SetLayers(std::vector<LayerSpan> layers) {
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckLayers(layers, total_.load());
  if (!s.ok()) return s;
  layers_ = std::move(layers);
  ++layout_version_;
  manifest_.reset();  // describe the new table from now on
  return absl::OkStatus();
}

std::vector<LayerSpan> ModelState::layers() const {
  absl::MutexLock lock(&mu_);
  if (!layers_.empty()) return layers_;
  return {LayerSpan{"all", 0, total_.load()}};
}

void ModelState::SetDigestPieceElements(uint64_t elements) {
  absl::MutexLock lock(&mu_);
  digest_piece_elements_ = std::max<uint64_t>(1, elements);
  ++layout_version_;
  manifest_.reset();
}

void ModelState::GetManifest(uint64_t round, ManifestCallback done) const {
  uint64_t generation = 0;
  uint64_t layout = 0;
  std::vector<LayerSpan> layers;
  uint64_t piece_elements = 0;
  std::string known_hash;
  const float* snapshot = nullptr;
  const uint64_t total = total_.load();
  // Decided under the lock, answered after it (never call out holding it).
  absl::StatusOr<shoal::v1::ModelManifest> answer;
  bool compute = false;
  {
    absl::MutexLock lock(&mu_);
    generation = snapshot_generation_.load();
    if (params_.load() == nullptr || snapshot_.load() == nullptr) {
      answer = absl::UnavailableError("this worker has no model yet");
    } else if (shutting_down_) {
      answer = absl::UnavailableError("worker is shutting down");
    } else if (!snapshot_valid_) {
      answer = absl::UnavailableError("the snapshot is being replaced");
    } else if (round != snapshot_round_) {
      answer = absl::FailedPreconditionError(
          absl::StrCat("this worker holds the model of round ", snapshot_round_, ", not ", round));
    } else if (manifest_.has_value() && manifest_generation_ == generation) {
      answer = *manifest_;
    } else if (computing_generation_ == generation) {
      manifest_waiters_.emplace_back(generation, std::move(done));
      return;  // answered by the thread computing the digests
    } else {
      compute = true;
      computing_generation_ = generation;
      layers = layers_.empty() ? std::vector<LayerSpan>{{"all", 0, total}} : layers_;
      piece_elements = digest_piece_elements_;
      layout = layout_version_;
      if (model_round_ == snapshot_round_) known_hash = model_hash_;
      snapshot = snapshot_.load();
    }
  }
  if (!compute) {
    done(std::move(answer));
    return;
  }
  // Cache miss: hash on this thread, without the lock. The snapshot is
  // only rewritten after BeginSnapshotUpdate() bumps the generation, which
  // is checked below: digests of a snapshot that changed meanwhile are
  // never cached nor returned.
  shoal::v1::ModelManifest manifest =
      ComputeModelManifest(snapshot, total, layers, piece_elements, round, known_hash);
  absl::StatusOr<shoal::v1::ModelManifest> result;
  std::vector<ManifestCallback> waiters;
  {
    absl::MutexLock lock(&mu_);
    if (computing_generation_ == generation) computing_generation_.reset();
    for (auto it = manifest_waiters_.begin(); it != manifest_waiters_.end();) {
      if (it->first == generation) {
        waiters.push_back(std::move(it->second));
        it = manifest_waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (snapshot_generation_.load() != generation || !snapshot_valid_) {
      result = absl::AbortedError(
          absl::StrCat("the snapshot of round ", round, " was replaced while being hashed"));
    } else {
      if (layout == layout_version_) {
        manifest_ = manifest;
        manifest_generation_ = generation;
      }
      result = std::move(manifest);
    }
  }
  for (ManifestCallback& w : waiters) w(result);
  done(std::move(result));
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
