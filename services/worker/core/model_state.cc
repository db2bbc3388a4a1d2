#include "services/worker/core/model_state.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace shoal::worker {

ModelState::~ModelState() {
  // gRPC may still hold slices of a server that was just shut down.
  if (!ledger_.AwaitAllReturned(absl::Seconds(10))) {
    SHOAL_LOG(ERROR) << "ModelState destroyed while gRPC still holds "
                     << ledger_.lent(Buffer::kParameters) << " parameter and "
                     << ledger_.lent(Buffer::kSnapshot)
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
    serving_.bound = params != nullptr;
    serving_.total_elements = total_elements;
    CloseParametersWindow();
  }
  Notify(false);
}

void ModelState::CloseParametersWindow() { ledger_.CloseWindow(Buffer::kParameters); }

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
  return manifests_.SetLayers(std::move(layers), total_.load());
}

std::vector<LayerSpan> ModelState::layers() const {
  absl::MutexLock lock(&mu_);
  return manifests_.layers(total_.load());
}

void ModelState::SetDigestPieceElements(uint64_t elements) {
  absl::MutexLock lock(&mu_);
  manifests_.SetDigestPieceElements(elements);
}

void ModelState::GetManifest(uint64_t round, ManifestCallback done) const {
  const uint64_t total = total_.load();
  // Decided under the lock, answered after it (never call out holding it).
  absl::StatusOr<shoal::v1::ModelManifest> answer;
  ManifestCache::Job job;
  std::string known_hash;
  const float* snapshot = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = DecideManifest(serving_, round); !s.ok()) {
      answer = s;
    } else {
      shoal::v1::ModelManifest hit;
      switch (manifests_.Begin(ledger_.window(Buffer::kSnapshot), total, &done, &hit, &job)) {
        case ManifestCache::Lookup::kHit:
          answer = std::move(hit);
          break;
        case ManifestCache::Lookup::kJoined:
          return;  // answered by the thread computing the digests
        case ManifestCache::Lookup::kCompute:
          if (model_round_ == serving_.snapshot_round) known_hash = model_hash_;
          snapshot = snapshot_.load();
          // The snapshot is read below without the lock: it counts as lent,
          // so that whoever rewrites that memory (AwaitReturned) waits for it.
          ledger_.LendUnconditionally(Buffer::kSnapshot);
          break;
      }
    }
  }
  if (snapshot == nullptr) {
    done(std::move(answer));
    return;
  }
  // Cache miss: hash on this thread, without the lock. The memory is lent
  // (see above) and only rewritten after BeginSnapshotUpdate() moves the
  // snapshot to a new generation, which is checked below: digests of a
  // snapshot that changed meanwhile are never cached nor returned.
  shoal::v1::ModelManifest manifest =
      ComputeModelManifest(snapshot, total, job.layers, job.piece_elements, round, known_hash);
  ledger_.Return(Buffer::kSnapshot);
  absl::StatusOr<shoal::v1::ModelManifest> result;
  std::vector<ManifestCallback> waiters;
  {
    absl::MutexLock lock(&mu_);
    const bool current =
        ledger_.window(Buffer::kSnapshot) == job.generation && serving_.snapshot_valid;
    waiters = manifests_.Finish(job, manifest, current);
    if (current) {
      result = std::move(manifest);
    } else {
      result = absl::AbortedError(
          absl::StrCat("the snapshot of round ", round, " was replaced while being hashed"));
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
    serving_.round = round;
    serving_.ready = serving_.has_plan = serving_.averaged = false;
    serving_.averaged_until = 0;
    serving_.attempt = 0;
    ++trainings_;
    CloseParametersWindow();
  }
  Notify(false);
}

uint64_t ModelState::trainings() const {
  absl::MutexLock lock(&mu_);
  return trainings_;
}

void ModelState::SetReady(uint64_t round) {
  uint64_t epoch = 0;
  const float* params = nullptr;
  uint64_t total = 0;
  bool compute = false;
  {
    absl::MutexLock lock(&mu_);
    epoch = ledger_.window(Buffer::kParameters);
    params = params_.load();
    total = total_.load();
    compute = params != nullptr && !cell_crcs_.holds(epoch);
  }
  // The contribution does not change until the window closes: its cells'
  // CRCs are computed once here (no lock held: reads are refused until
  // ready is set below) instead of once per chunk served.
  std::vector<uint32_t> cells;
  if (compute) cells = CellCrcCache::Compute(params, total, 0, CellCount(total));
  {
    absl::MutexLock lock(&mu_);
    serving_.round = round;
    serving_.ready = true;
    if (compute && ledger_.window(Buffer::kParameters) == epoch) {
      cell_crcs_.Install(epoch, total, std::move(cells));
    }
  }
  Notify(false);
}

void ModelState::SetPlan(uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end) {
  {
    absl::MutexLock lock(&mu_);
    if (round != serving_.round) return;
    // Streams of another attempt must not go on reading memory the worker
    // is about to restore (the Exchanger sets the same plan again: no-op).
    if (serving_.has_plan && attempt != serving_.attempt) CloseParametersWindow();
    serving_.has_plan = true;
    serving_.averaged = false;
    serving_.averaged_until = 0;
    serving_.attempt = attempt;
    serving_.own_begin = begin;
    serving_.own_end = end;
  }
  Notify(false);
}

void ModelState::Unready() {
  {
    absl::MutexLock lock(&mu_);
    serving_.ready = false;
    serving_.averaged = false;
    serving_.averaged_until = 0;
    CloseParametersWindow();
  }
  Notify(false);
}

void ModelState::BindSnapshot(const float* snapshot) {
  absl::MutexLock lock(&mu_);
  snapshot_ = snapshot;
  serving_.has_snapshot = snapshot != nullptr;
  ledger_.CloseWindow(Buffer::kSnapshot);
}

void ModelState::BeginSnapshotUpdate() {
  absl::MutexLock lock(&mu_);
  serving_.snapshot_valid = false;
  ledger_.CloseWindow(Buffer::kSnapshot);
}

void ModelState::SetSnapshot(uint64_t round) {
  absl::MutexLock lock(&mu_);
  serving_.snapshot_round = round;
  serving_.snapshot_valid = true;
  ledger_.CloseWindow(Buffer::kSnapshot);
}

void ModelState::MarkAveraged(uint64_t round) { MarkAveragedUntil(round, ~uint64_t{0}); }

void ModelState::MarkAveragedUntil(uint64_t round, uint64_t until) {
  uint64_t epoch = 0;
  CellRange cells;  // whole cells of the owned slice averaged since the last call
  const float* params = nullptr;
  uint64_t total = 0;
  {
    absl::MutexLock lock(&mu_);
    if (round != serving_.round || !serving_.has_plan || serving_.averaged) return;
    until = std::min(until, serving_.own_end);
    const uint64_t from = std::max(serving_.own_begin, serving_.averaged_until);
    if (until <= from && until != serving_.own_end) return;
    epoch = ledger_.window(Buffer::kParameters);
    params = params_.load();
    total = total_.load();
    if (params != nullptr && cell_crcs_.holds(epoch) && until > from) {
      cells = CellsWithin(from, until, total);
    }
  }
  // These cells now hold the average: their CRCs are computed here (the
  // bytes are still in cache after the combine) before any AVERAGED read
  // may be granted them, then served N-1 times.
  std::vector<uint32_t> crcs = CellCrcCache::Compute(params, total, cells.first, cells.last);
  {
    absl::MutexLock lock(&mu_);
    if (round != serving_.round || !serving_.has_plan) return;
    if (ledger_.window(Buffer::kParameters) == epoch) cell_crcs_.Update(epoch, cells.first, crcs);
    serving_.averaged_until = std::max(serving_.averaged_until, until);
    if (serving_.averaged_until >= serving_.own_end) serving_.averaged = true;
  }
  Notify(false);
}

uint64_t ModelState::AveragedLimit(uint64_t round, uint32_t attempt) const {
  absl::MutexLock lock(&mu_);
  if (round != serving_.round || !serving_.has_plan || attempt != serving_.attempt) return 0;
  return serving_.averaged ? serving_.own_end : serving_.averaged_until;
}

void ModelState::Abort(uint64_t round) {
  {
    absl::MutexLock lock(&mu_);
    if (round != serving_.round) return;
    serving_.ready = serving_.has_plan = serving_.averaged = false;
    serving_.averaged_until = 0;
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
    serving_.shutting_down = true;
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
  absl::MutexLock lock(&mu_);
  ServingDecision d = DecideRead(serving_, r);
  if (may_wait != nullptr) *may_wait = d.may_wait;
  if (d.status.ok()) *grant = {d.buffer, ledger_.window(d.buffer)};
  return d.status;
}

absl::StatusOr<ModelState::LentChunk> ModelState::LendChunk(const ReadGrant& grant, uint64_t begin,
                                                            uint64_t count) const {
  absl::MutexLock lock(&mu_);
  if (serving_.shutting_down) return absl::UnavailableError("worker is shutting down");
  LentChunk chunk;
  if (grant.buffer == Buffer::kSnapshot) {
    if (!serving_.snapshot_valid || !ledger_.Lend(Buffer::kSnapshot, grant.epoch)) {
      // The bytes sent so far may mix two models; the reader must start over.
      return absl::AbortedError("the snapshot was replaced by a newer round during the read");
    }
    chunk.data = snapshot_.load() + begin;
    return chunk;
  }
  if (!ledger_.Lend(Buffer::kParameters, grant.epoch)) {
    return absl::AbortedError(absl::StrCat(
        "round ", serving_.round,
        " is no longer served as it was when the read started (a new round, a new plan attempt "
        "or an abort)"));
  }
  chunk.data = params_.load() + begin;
  if (std::optional<uint32_t> crc = cell_crcs_.Lookup(grant.epoch, begin, count)) {
    chunk.has_crc = true;
    chunk.crc = *crc;
  }
  return chunk;
}

void ModelState::ReturnChunk(Buffer buffer) const { ledger_.Return(buffer); }

int ModelState::chunks_lent(Buffer buffer) const { return ledger_.lent(buffer); }

ModelState::ReadGrant ModelState::GrantParameters() const {
  absl::MutexLock lock(&mu_);
  return ReadGrant{Buffer::kParameters, ledger_.window(Buffer::kParameters)};
}

bool ModelState::IsCurrent(const ReadGrant& grant) const {
  absl::MutexLock lock(&mu_);
  if (grant.buffer == Buffer::kSnapshot && !serving_.snapshot_valid) return false;
  return ledger_.IsOpen(grant.buffer, grant.epoch);
}

bool ModelState::AwaitReturned(Buffer buffer, absl::Duration timeout) const {
  // Streams still holding a chunk after the ledger's grace are asked to
  // cancel themselves (their reader stopped reading).
  return ledger_.AwaitReturned(buffer, timeout, [this] { Notify(/*revoke=*/true); });
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
