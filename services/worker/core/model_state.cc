#include "services/worker/core/model_state.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/logging.h"
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

namespace {

// CRC-32C of the cells [first, last) of `params` (`total` elements).
std::vector<uint32_t> CellCrcs(const float* params, uint64_t total, uint64_t first, uint64_t last) {
  std::vector<uint32_t> crcs;
  crcs.reserve(last - first);
  for (uint64_t c = first; c < last; ++c) {
    const uint64_t begin = c * ModelState::kCellElements;
    const uint64_t count = std::min(ModelState::kCellElements, total - begin);
    crcs.push_back(Crc32c(params + begin, count * sizeof(float)));
  }
  return crcs;
}

uint64_t CellCount(uint64_t total) {
  return (total + ModelState::kCellElements - 1) / ModelState::kCellElements;
}

}  // namespace

ModelState::~ModelState() {
  absl::MutexLock lock(&mu_);
  auto none_lent = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return lent_[0] == 0 && lent_[1] == 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&none_lent), absl::Seconds(10))) {
    SHOAL_LOG(ERROR) << "ModelState destroyed while gRPC still holds " << lent_[0]
                     << " parameter and " << lent_[1]
                     << " snapshot chunks of it after 10 s; aborting rather than let gRPC read "
                        "freed memory";
    std::abort();
  }
}

void ModelState::Bind(const float* params, uint64_t total_elements, std::string model) {
  {
    absl::MutexLock lock(&mu_);
    model_ = std::move(model);
    total_ = total_elements;
    params_ = params;
    CloseParametersWindow();
  }
  Notify(false);
}

void ModelState::CloseParametersWindow() { ++params_epoch_; }

void ModelState::Notify(bool revoke) const {
  std::vector<Observer*> observers;
  {
    absl::MutexLock lock(&observers_mu_);
    observers = observers_;
    for (Observer* o : observers) o->AddRef();  // alive until Release below
  }
  for (Observer* o : observers) {
    o->OnServingChange(revoke);
    o->Release();
  }
}

void ModelState::AddObserver(Observer* observer) const {
  observer->AddRef();
  absl::MutexLock lock(&observers_mu_);
  observers_.push_back(observer);
}

size_t ModelState::observer_count() const {
  absl::MutexLock lock(&observers_mu_);
  return observers_.size();
}

void ModelState::RemoveObserver(Observer* observer) const {
  bool found = false;
  {
    absl::MutexLock lock(&observers_mu_);
    auto it = std::find(observers_.begin(), observers_.end(), observer);
    if (it != observers_.end()) {
      observers_.erase(it);
      found = true;
    }
  }
  if (found) observer->Release();  // may delete it: outside the lock
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
      // The snapshot is read below without the lock: it counts as lent, so
      // that whoever rewrites that memory (AwaitReturned) waits for it.
      ++lent_[static_cast<int>(Buffer::kSnapshot)];
    }
  }
  if (!compute) {
    done(std::move(answer));
    return;
  }
  // Cache miss: hash on this thread, without the lock. The memory is lent
  // (see above) and only rewritten after BeginSnapshotUpdate() bumps the
  // generation, which is checked below: digests of a snapshot that changed
  // meanwhile are never cached nor returned.
  shoal::v1::ModelManifest manifest =
      ComputeModelManifest(snapshot, total, layers, piece_elements, round, known_hash);
  absl::StatusOr<shoal::v1::ModelManifest> result;
  std::vector<ManifestCallback> waiters;
  {
    absl::MutexLock lock(&mu_);
    --lent_[static_cast<int>(Buffer::kSnapshot)];
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
  {
    absl::MutexLock lock(&mu_);
    round_ = round;
    ready_ = has_plan_ = averaged_ = false;
    attempt_ = 0;
    CloseParametersWindow();
  }
  Notify(false);
}

void ModelState::SetReady(uint64_t round) {
  uint64_t epoch = 0;
  const float* params = nullptr;
  uint64_t total = 0;
  bool compute = false;
  {
    absl::MutexLock lock(&mu_);
    epoch = params_epoch_;
    params = params_.load();
    total = total_.load();
    compute = params != nullptr && cells_epoch_ != epoch;
  }
  // The contribution does not change until the window closes: its cells'
  // CRCs are computed once here (no lock held: reads are refused until
  // ready_ is set below) instead of once per chunk served.
  std::vector<uint32_t> cells;
  if (compute) cells = CellCrcs(params, total, 0, CellCount(total));
  {
    absl::MutexLock lock(&mu_);
    round_ = round;
    ready_ = true;
    if (compute && params_epoch_ == epoch) {
      cell_crc_ = std::move(cells);
      cells_epoch_ = epoch;
    }
  }
  Notify(false);
}

void ModelState::SetPlan(uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end) {
  {
    absl::MutexLock lock(&mu_);
    if (round != round_) return;
    // Streams of another attempt must not go on reading memory the worker
    // is about to restore (the Exchanger sets the same plan again: no-op).
    if (has_plan_ && attempt != attempt_) CloseParametersWindow();
    has_plan_ = true;
    averaged_ = false;
    attempt_ = attempt;
    own_begin_ = begin;
    own_end_ = end;
  }
  Notify(false);
}

void ModelState::Unready() {
  {
    absl::MutexLock lock(&mu_);
    ready_ = false;
    averaged_ = false;
    CloseParametersWindow();
  }
  Notify(false);
}

void ModelState::BindSnapshot(const float* snapshot) {
  absl::MutexLock lock(&mu_);
  snapshot_ = snapshot;
  ++snapshot_generation_;
}

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
  uint64_t epoch = 0;
  uint64_t first = 0, last = 0;  // whole cells inside the owned slice
  const float* params = nullptr;
  uint64_t total = 0;
  {
    absl::MutexLock lock(&mu_);
    if (round != round_) return;
    epoch = params_epoch_;
    params = params_.load();
    total = total_.load();
    if (params != nullptr && has_plan_ && cells_epoch_ == epoch) {
      first = (own_begin_ + kCellElements - 1) / kCellElements;
      last = first;
      while (last < CellCount(total) && std::min((last + 1) * kCellElements, total) <= own_end_) {
        ++last;
      }
    }
  }
  // The owned slice's cells now hold the average: their CRCs are computed
  // here (the bytes are still in cache after the scale) before any AVERAGED
  // read may be granted, then served N-1 times.
  std::vector<uint32_t> crcs = CellCrcs(params, total, first, last);
  {
    absl::MutexLock lock(&mu_);
    if (round != round_) return;
    averaged_ = true;
    if (params_epoch_ == epoch && cells_epoch_ == epoch) {
      std::copy(crcs.begin(), crcs.end(), cell_crc_.begin() + first);
    }
  }
  Notify(false);
}

void ModelState::Abort(uint64_t round) {
  {
    absl::MutexLock lock(&mu_);
    if (round != round_) return;
    ready_ = has_plan_ = averaged_ = false;
    CloseParametersWindow();
  }
  Notify(false);
}

void ModelState::SetModel(uint64_t round, const std::string& hash) {
  absl::MutexLock lock(&mu_);
  model_round_ = round;
  model_hash_ = hash;
}

void ModelState::SetShuttingDown() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  Notify(false);  // parked reads end now
}

absl::Status ModelState::CheckRead(const shoal::v1::ReadSliceRequest& r,
                                   uint64_t* generation) const {
  ReadGrant grant;
  absl::Status s = CheckRead(r, &grant, nullptr);
  if (s.ok() && generation != nullptr && grant.buffer == Buffer::kSnapshot) {
    *generation = grant.epoch;
  }
  return s;
}

absl::Status ModelState::CheckRead(const shoal::v1::ReadSliceRequest& r, ReadGrant* grant,
                                   bool* may_wait) const {
  if (may_wait != nullptr) *may_wait = false;
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
    *grant = {Buffer::kSnapshot, snapshot_generation_.load()};
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
  *grant = {Buffer::kParameters, params_epoch_};
  if (r.kind() == shoal::v1::CONTRIBUTION) return absl::OkStatus();
  if (!has_plan_) {
    if (may_wait != nullptr) *may_wait = true;
    return absl::UnavailableError("the round's plan has not arrived here yet");
  }
  if (r.begin() < own_begin_ || r.end() > own_end_) {
    return absl::FailedPreconditionError(absl::StrCat("this worker owns [", own_begin_, ", ",
                                                      own_end_, ") in round ", round_, ", not [",
                                                      r.begin(), ", ", r.end(), ")"));
  }
  if (!averaged_) {
    if (may_wait != nullptr) *may_wait = true;
    return absl::UnavailableError("slice not averaged yet");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelState::LentChunk> ModelState::LendChunk(const ReadGrant& grant, uint64_t begin,
                                                            uint64_t count) const {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("worker is shutting down");
  LentChunk chunk;
  if (grant.buffer == Buffer::kSnapshot) {
    if (snapshot_generation_.load() != grant.epoch || !snapshot_valid_) {
      // The bytes sent so far may mix two models; the reader must start over.
      return absl::AbortedError("the snapshot was replaced by a newer round during the read");
    }
    chunk.data = snapshot_.load() + begin;
  } else {
    if (params_epoch_ != grant.epoch) {
      return absl::AbortedError(absl::StrCat(
          "round ", round_,
          " is no longer served as it was when the read started (a new round, a new plan attempt "
          "or an abort)"));
    }
    chunk.data = params_.load() + begin;
    const uint64_t total = total_.load();
    if (cells_epoch_ == params_epoch_ && begin % kCellElements == 0 &&
        count == std::min(kCellElements, total - begin)) {
      chunk.has_crc = true;
      chunk.crc = cell_crc_[begin / kCellElements];
    }
  }
  ++lent_[static_cast<int>(grant.buffer)];
  return chunk;
}

void ModelState::ReturnChunk(Buffer buffer) const {
  absl::MutexLock lock(&mu_);
  --lent_[static_cast<int>(buffer)];
}

int ModelState::chunks_lent(Buffer buffer) const {
  absl::MutexLock lock(&mu_);
  return lent_[static_cast<int>(buffer)];
}

bool ModelState::IsCurrent(const ReadGrant& grant) const {
  absl::MutexLock lock(&mu_);
  if (grant.buffer == Buffer::kSnapshot) {
    return snapshot_generation_.load() == grant.epoch && snapshot_valid_;
  }
  return params_epoch_ == grant.epoch;
}

bool ModelState::AwaitReturned(Buffer buffer, absl::Duration timeout) const {
  const int b = static_cast<int>(buffer);
  auto none_lent = [this, b]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return lent_[b] == 0; };
  // A chunk on its way to a reader that is reading leaves within
  // milliseconds (200 ms is 1 MiB at 40 Mbit/s). One still there after
  // that sits behind a reader that stopped reading: its stream is
  // cancelled, which makes gRPC drop the chunk.
  const absl::Duration grace = std::min(timeout, absl::Milliseconds(200));
  {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&none_lent), grace)) return true;
  }
  Notify(/*revoke=*/true);
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&none_lent), timeout - grace);
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
