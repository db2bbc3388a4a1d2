#include "services/worker/model_syncer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/progress.h"
#include "common/sha256.h"
#include "common/status_util.h"
#include "services/worker/core/manifest_cache.h"

namespace shoal::worker {

absl::Duration ManifestTimeout(const SyncOptions& options, uint64_t bytes) {
  if (!(options.manifest_min_rate > 0)) return options.manifest_timeout;
  return std::max(options.manifest_timeout,
                  absl::Seconds(static_cast<double>(bytes) / options.manifest_min_rate));
}
namespace {

using shoal::v1::ModelManifest;

// Source index of the checkpoint store (peers are 0..n-1).
constexpr size_t kStore = std::numeric_limits<size_t>::max();
// Throughput samples need at least this much busy time.
constexpr absl::Duration kMinSampleTime = absl::Milliseconds(20);
// Weight of a new throughput sample.
constexpr double kEwmaAlpha = 0.5;
// Rate assumed for a demoted peer never measured: 1 MiB/s.
constexpr double kFloorRate = 1 << 20;

struct Layer {
  std::string name;
  uint64_t offset = 0;
  uint64_t elements = 0;
  std::string sha256;  // empty: unknown (only the whole-model hash checks it)
  std::vector<size_t> pieces;
  size_t pieces_done = 0;
  std::set<size_t> sources;  // who supplied its accepted pieces
  // Its digest so far, fed in order as its pieces are accepted (layers of
  // more than one piece; one piece is checked on arrival).
  std::unique_ptr<Sha256> hash;
  bool checked_on_arrival() const { return pieces.size() == 1; }
};

struct Piece {
  enum State { kPending, kInFlight, kDone };
  uint32_t layer = 0;
  uint64_t begin = 0;  // elements of the flat vector
  uint64_t end = 0;
  std::string sha256;  // checked on arrival; empty: only the layer digest
  State state = kPending;
  uint64_t read_id = 0;          // the read whose result counts while kInFlight
  std::vector<size_t> excluded;  // peers that stalled or broke off on it
  int attempts = 0;              // reads from holders so far
  uint64_t bytes() const { return (end - begin) * sizeof(float); }
};

struct Peer {
  enum State { kAsking, kUsable, kUnused, kDropped };
  State state = kAsking;
  int active = 0;  // reads in flight, abandoned ones included
  int failures_in_row = 0;
  double rate = 0;  // bytes/s, EWMA; 0 = not measured
  // Throughput window: bytes and busy time (>= 1 read in flight) since the
  // last sample.
  uint64_t window_bytes = 0;
  absl::Duration window_busy;
  absl::Time busy_since;
  PeerSyncStats stats;
};

// The callback calls of a SyncRun (peer reads, manifest requests) that
// have not ended yet. Shared with their callbacks, whose last act is to
// count themselves out: once none is left, no callback touches the run.
class Outstanding {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++n_;
  }
  void Done() {
    absl::MutexLock lock(&mu_);
    --n_;
  }
  // Waits until none is left, at most `timeout`; false when some still are.
  bool WaitFor(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return n_ == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
  }
  int count() {
    absl::MutexLock lock(&mu_);
    return n_;
  }

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Read {
  uint64_t id = 0;
  size_t piece = 0;
  size_t source = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  std::string digest;
  std::vector<float> buffer;
  CancellationToken canceller;  // a store read stops between blocks once cancelled
  absl::Time last_progress;
  uint64_t received = 0;
  bool abandoned = false;  // its piece was moved; the result is ignored
  bool finished = false;
  bool digest_ok = true;
  absl::Status status;
  // A peer read: its callback call (PeerClient::StartReadSlice), once
  // started.
  std::shared_ptr<ChunkStreamCall> call;
  // A read from the checkpoint store: the thread it runs on (the store's
  // client is synchronous).
  std::thread thread;
};

struct ManifestCall {
  size_t peer = 0;
  CancellationToken canceller;  // ends the call (PeerClient::StartGetManifest)
  bool finished = false;
  bool processed = false;
  absl::StatusOr<ModelManifest> result;
};

// A checkpoint of the wanted round: its manifest and where each layer
// starts in the flat vector, in bytes.
struct StoreSource {
  std::string id;
  shoal::v1::Manifest manifest;
  std::vector<uint64_t> starts;
};

bool SameManifest(const ModelManifest& a, const ModelManifest& b) {
  if (a.round() != b.round() || a.model_hash() != b.model_hash() ||
      a.piece_elements() != b.piece_elements() || a.total_elements() != b.total_elements() ||
      a.layers_size() != b.layers_size()) {
    return false;
  }
  for (int i = 0; i < a.layers_size(); ++i) {
    const auto& x = a.layers(i);
    const auto& y = b.layers(i);
    if (x.name() != y.name() || x.offset() != y.offset() || x.elements() != y.elements() ||
        x.sha256() != y.sha256() || x.piece_sha256_size() != y.piece_sha256_size()) {
      return false;
    }
    for (int k = 0; k < x.piece_sha256_size(); ++k) {
      if (x.piece_sha256(k) != y.piece_sha256(k)) return false;
    }
  }
  return true;
}

// Dropping a peer for good: it does not hold (or cannot serve) the round.
bool IsFinalForPeer(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) || absl::IsAborted(s) || absl::IsInvalidArgument(s) ||
         absl::IsOutOfRange(s) || absl::IsNotFound(s) || absl::IsUnimplemented(s);
}

// One attempt of a pull. See ModelSyncer for the rules.
class SyncRun {
 public:
  SyncRun(PeerClient* client, const SyncOptions& options, uint64_t round, std::string hash,
          const std::vector<std::string>& holders, float* dst, uint64_t total, std::string self_id,
          SyncProgress* progress, const CheckpointFallback& fallback)
      : client_(client),
        options_(options),
        clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
        round_(round),
        hash_(std::move(hash)),
        dst_(dst),
        total_(total),
        self_id_(std::move(self_id)),
        progress_(progress),
        fallback_(fallback) {
    for (const std::string& h : holders) {
      if (std::find(addresses_.begin(), addresses_.end(), h) != addresses_.end()) continue;
      addresses_.push_back(h);
      Peer p;
      p.stats.address = h;
      peers_.push_back(std::move(p));
    }
    planner_ = options.planner;
    planner_.per_peer = std::max(1, options.per_peer);
  }

  ~SyncRun() { StopAll(); }

  absl::Status Run();
  void FillStats(SyncStats* stats);
  // The whole model's SHA-256 computed while the pieces arrived; empty when
  // it could not be (compute it over the result then).
  std::string whole_digest() {
    absl::MutexLock lock(&mu_);
    return whole_digest_;
  }

 private:
  void StartManifestCalls();
  void ProcessManifests() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BuildTableFromManifest(const ModelManifest& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BuildTableFromCheckpoint(const StoreSource& store) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MatchCheckpoint(const StoreSource& store) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns the layers that became complete and need their digest checked.
  void ProcessReads() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Feeds the accepted pieces, in model order, to the whole-model hash and
  // their layer's hash, and checks each layer once complete; releases mu_
  // while hashing, so this overlaps with the reads still running.
  void HashAhead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LayerChecked(uint32_t layer, bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The progress line of the pull (bytes, rate, time left) in the log.
  void LogProgress(const std::string& layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckStalls() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartRead(size_t piece, size_t source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the peer reads Schedule decided and cancels the calls Abandon
  // gave up on, with mu_ released (never call into gRPC under it: the
  // reads' callbacks take it).
  void IssueCalls() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<ChunkStreamCall> StartPeerRead(Read* r);
  void RunStoreRead(Read* r);
  absl::Status ReadFromStore(Read* r);
  // Checks the piece's digest (on the read's thread, in parallel, before
  // the piece may touch the model) and hands the read to the scheduler.
  void EndRead(Read* r, absl::Status s);
  // False once the read was abandoned (stop it).
  bool OnBytes(Read* r, uint64_t bytes);
  void Abandon(Read* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Demote(size_t peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(size_t peer, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Sample(size_t peer, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateSources() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Complete() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ManifestsPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds the checkpoint to fall back on, once (releases mu_ meanwhile):
  // sets store_, or store_error_ saying why there is none.
  void EnsureStore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<StoreSource> ResolveStore();
  std::string PeerReasons() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopAll();

  PeerClient* const client_;
  const SyncOptions& options_;
  const Clock* const clock_;
  const uint64_t round_;
  const std::string hash_;
  float* const dst_;
  const uint64_t total_;
  const std::string self_id_;
  SyncProgress* const progress_;
  const CheckpointFallback& fallback_;
  const absl::Time started_ = clock_->Now();
  std::vector<std::string> addresses_;
  PlannerOptions planner_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<ManifestCall>> manifest_calls_ ABSL_GUARDED_BY(mu_);
  std::optional<ModelManifest> manifest_ ABSL_GUARDED_BY(mu_);
  bool have_table_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Layer> layers_ ABSL_GUARDED_BY(mu_);
  std::vector<Piece> pieces_ ABSL_GUARDED_BY(mu_);
  size_t pieces_done_ ABSL_GUARDED_BY(mu_) = 0;
  size_t layers_verified_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_progress_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<bool> layer_verified_ ABSL_GUARDED_BY(mu_);
  FailedPairs failed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Read>> reads_ ABSL_GUARDED_BY(mu_);
  // Peer reads decided but not started yet, and calls to cancel
  // (IssueCalls).
  std::vector<Read*> to_start_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<ChunkStreamCall>> to_cancel_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Outstanding> outstanding_ = std::make_shared<Outstanding>();
  uint64_t next_read_id_ ABSL_GUARDED_BY(mu_) = 0;
  int store_active_ ABSL_GUARDED_BY(mu_) = 0;
  // Store: unresolved until first needed; then either a source or why not.
  bool store_resolved_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<StoreSource> store_ ABSL_GUARDED_BY(mu_);
  absl::Status store_error_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_from_store_ ABSL_GUARDED_BY(mu_) = 0;
  int pieces_from_store_ ABSL_GUARDED_BY(mu_) = 0;
  int pieces_refetched_ ABSL_GUARDED_BY(mu_) = 0;
  // Incremental hashing (HashAhead): pieces [0, hashed_) are hashed; the
  // whole-model hash is dropped if a layer has to be read again.
  size_t hashed_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<Sha256> whole_hash_ ABSL_GUARDED_BY(mu_) = std::make_unique<Sha256>();
  std::string whole_digest_ ABSL_GUARDED_BY(mu_);
};

// The code of a sync that failed on the store: DATA_LOSS when the store
// found the checkpoint damaged, UNAVAILABLE otherwise (the store may come
// back).
absl::StatusCode StoreFailureCode(const absl::Status& store_error) {
  return absl::IsDataLoss(store_error) ? absl::StatusCode::kDataLoss
                                       : absl::StatusCode::kUnavailable;
}

absl::Status SyncRun::Run() {
  StartManifestCalls();
  absl::MutexLock lock(&mu_);
  while (true) {
    ProcessManifests();
    if (!have_table_ && !ManifestsPending()) {
      // No holder described the model: the store's manifest is the table.
      EnsureStore();
      if (!store_.has_value()) {
        Fail(absl::Status(
            StoreFailureCode(store_error_),
            absl::StrCat("no holder could describe the model of round ", round_, PeerReasons(),
                         " and the checkpoint store cannot serve it: ", store_error_.message())));
        break;
      }
      SHOAL_LOG(WARNING) << "no holder serves the model of round " << round_ << PeerReasons()
                         << "; reading it from checkpoint " << store_->id;
      BuildTableFromCheckpoint(*store_);
    }
    if (options_.stop != nullptr && options_.stop->cancelled()) {
      // The worker is stopping: the caller cancels the reads (StopAll).
      Fail(absl::CancelledError("the worker is shutting down"));
      break;
    }
    ProcessReads();
    HashAhead();
    if (!failure_.ok()) break;
    if (have_table_ && Complete()) break;
    CheckStalls();
    Schedule();
    IssueCalls();
    if (!failure_.ok()) break;
    cv_.WaitWithTimeout(&mu_, options_.poll_interval);
  }
  return failure_;
}

void SyncRun::HashAhead() {
  while (true) {
    // A run of accepted pieces from where hashing stands.
    const size_t from = hashed_;
    size_t to = from;
    while (to < pieces_.size() && pieces_[to].state == Piece::kDone && to - from < 16) ++to;
    if (to == from) return;
    struct Work {
      const float* data;
      size_t bytes;
      Sha256* layer;       // null: the layer was checked on arrival
      uint32_t index;      // of the layer
      bool layer_done;     // the layer's last piece
      std::string digest;  // its final digest, when layer_done
    };
    std::vector<Work> work;
    for (size_t i = from; i < to; ++i) {
      const Piece& piece = pieces_[i];
      Layer& layer = layers_[piece.layer];
      Sha256* layer_hash = nullptr;
      if (!layer.checked_on_arrival() && !layer.sha256.empty()) {
        if (i == layer.pieces.front()) layer.hash = std::make_unique<Sha256>();
        layer_hash = layer.hash.get();
      }
      work.push_back({dst_ + piece.begin, static_cast<size_t>(piece.bytes()), layer_hash,
                      piece.layer, i == layer.pieces.back(), ""});
    }
    // Only this thread writes `dst_` and changes pieces' states: the bytes
    // of accepted pieces stay put while mu_ is released.
    mu_.Unlock();
    for (Work& w : work) {
      if (whole_hash_ != nullptr) whole_hash_->Update(w.data, w.bytes);
      if (w.layer == nullptr) continue;
      w.layer->Update(w.data, w.bytes);
      if (w.layer_done) w.digest = w.layer->HexDigest();
    }
    mu_.Lock();
    hashed_ = to;
    for (const Work& w : work) {
      if (w.layer == nullptr || !w.layer_done) continue;
      layers_[w.index].hash.reset();
      const bool ok = w.digest == layers_[w.index].sha256;
      LayerChecked(w.index, ok);
      if (!ok) break;  // hashing went back to that layer's start
    }
    if (to == pieces_.size() && whole_hash_ != nullptr && hashed_ == to) {
      whole_digest_ = whole_hash_->HexDigest();
      whole_hash_.reset();
    }
  }
}

void SyncRun::StartManifestCalls() {
  std::vector<ManifestCall*> calls;
  {
    absl::MutexLock lock(&mu_);
    for (size_t p = 0; p < peers_.size(); ++p) {
      auto call = std::make_unique<ManifestCall>();
      call->peer = p;
      calls.push_back(call.get());
      manifest_calls_.push_back(std::move(call));
    }
  }
  // Not under mu_: the answers take it (and a fake may answer at once).
  for (ManifestCall* c : calls) {
    outstanding_->Add();
    client_->StartGetManifest(
        addresses_[c->peer], round_, self_id_, ManifestTimeout(options_, total_ * sizeof(float)), &c->canceller,
        [this, c, outstanding = outstanding_](absl::StatusOr<ModelManifest> m) {
          {
            absl::MutexLock lock(&mu_);
            c->result = std::move(m);
            c->finished = true;
            cv_.Signal();
          }
          outstanding->Done();  // the last touch of this run
        });
  }
}

bool SyncRun::ManifestsPending() const {
  for (const auto& c : manifest_calls_) {
    if (!c->finished) return true;
  }
  return false;
}

void SyncRun::ProcessManifests() {
  for (auto& c : manifest_calls_) {
    if (!c->finished || c->processed) continue;
    c->processed = true;
    Peer& peer = peers_[c->peer];
    if (!c->result.ok()) {
      peer.state = Peer::kUnused;
      peer.stats.why = std::string(c->result.status().message());
      SHOAL_VLOG(1) << "holder " << addresses_[c->peer] << " not used: " << c->result.status();
      continue;
    }
    const ModelManifest& m = *c->result;
    absl::Status s = CheckManifest(m, round_, hash_, total_);
    if (s.ok() && manifest_.has_value() && !SameManifest(*manifest_, m)) {
      s = absl::FailedPreconditionError("its manifest differs from the other holders'");
    }
    if (!s.ok()) {
      peer.state = Peer::kUnused;
      peer.stats.why = std::string(s.message());
      SHOAL_LOG(WARNING) << "holder " << addresses_[c->peer] << " not used: " << s.message();
      continue;
    }
    if (!manifest_.has_value()) {
      manifest_ = m;
      if (!have_table_) BuildTableFromManifest(m);
    }
    peer.state = Peer::kUsable;
    peer.stats.used = true;
  }
  UpdateSources();
}

void SyncRun::BuildTableFromManifest(const ModelManifest& m) {
  const uint64_t step = m.piece_elements();
  for (const auto& d : m.layers()) {
    Layer layer;
    layer.name = d.name();
    layer.offset = d.offset();
    layer.elements = d.elements();
    layer.sha256 = d.sha256();
    const uint32_t index = static_cast<uint32_t>(layers_.size());
    int k = 0;
    for (uint64_t b = 0; b < d.elements(); b += step, ++k) {
      Piece piece;
      piece.layer = index;
      piece.begin = d.offset() + b;
      piece.end = d.offset() + std::min(d.elements(), b + step);
      piece.sha256 = d.piece_sha256_size() > 0 ? d.piece_sha256(k) : d.sha256();
      layer.pieces.push_back(pieces_.size());
      pieces_.push_back(std::move(piece));
    }
    layers_.push_back(std::move(layer));
  }
  layer_verified_.assign(layers_.size(), false);
  have_table_ = true;
}

void SyncRun::BuildTableFromCheckpoint(const StoreSource& store) {
  const uint64_t step = std::max<uint64_t>(1, options_.max_piece_elements);
  for (int i = 0; i < store.manifest.layers_size(); ++i) {
    const auto& e = store.manifest.layers(i);
    Layer layer;
    layer.name = e.name();
    layer.offset = store.starts[i] / sizeof(float);
    layer.elements = e.bytes() / sizeof(float);
    layer.sha256 = e.sha256();
    const uint32_t index = static_cast<uint32_t>(layers_.size());
    for (uint64_t b = 0; b < layer.elements; b += step) {
      Piece piece;
      piece.layer = index;
      piece.begin = layer.offset + b;
      piece.end = layer.offset + std::min(layer.elements, b + step);
      // A one-piece layer is checked on arrival; bigger ones when complete.
      if (layer.elements <= step) piece.sha256 = e.sha256();
      layer.pieces.push_back(pieces_.size());
      pieces_.push_back(std::move(piece));
    }
    layers_.push_back(std::move(layer));
  }
  layer_verified_.assign(layers_.size(), false);
  have_table_ = true;
}

absl::Status SyncRun::MatchCheckpoint(const StoreSource& store) {
  // Same-named layers must sit at the same place and hold the same bytes.
  for (int i = 0; i < store.manifest.layers_size(); ++i) {
    const auto& e = store.manifest.layers(i);
    for (const Layer& l : layers_) {
      if (l.name != e.name()) continue;
      if (l.offset * sizeof(float) != store.starts[i] || l.elements * sizeof(float) != e.bytes() ||
          (!l.sha256.empty() && l.sha256 != e.sha256())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", store.id, " does not hold this model: layer '", l.name, "' differs"));
      }
    }
  }
  return absl::OkStatus();
}

void SyncRun::EnsureStore() {
  if (store_resolved_) return;
  mu_.Unlock();  // unary calls to the store
  absl::StatusOr<StoreSource> store = ResolveStore();
  mu_.Lock();
  store_resolved_ = true;
  if (!store.ok()) {
    store_error_ = store.status();
    return;
  }
  absl::Status match = MatchCheckpoint(*store);
  if (!match.ok()) {
    store_error_ = match;
    return;
  }
  store_ = std::move(*store);
}

absl::StatusOr<StoreSource> SyncRun::ResolveStore() {
  checkpoint::CheckpointClient* store = fallback_.client;
  if (store == nullptr) return absl::NotFoundError("no checkpoint store configured");
  StoreSource source;
  source.id = fallback_.checkpoint_id;
  if (source.id.empty()) {
    absl::StatusOr<std::vector<shoal::v1::CheckpointInfo>> list = store->List(fallback_.run_id);
    if (!list.ok()) return Annotate(list.status(), "checkpoint store");
    for (const auto& info : *list) {  // newest first
      if (info.round() == round_ && info.damage().empty()) {
        source.id = info.id();
        break;
      }
    }
    if (source.id.empty()) {
      return absl::NotFoundError(
          absl::StrCat("the checkpoint store has no checkpoint of round ", round_));
    }
  }
  absl::StatusOr<shoal::v1::Manifest> manifest = store->GetManifest(source.id);
  if (!manifest.ok()) return Annotate(manifest.status(), "checkpoint store");
  if (manifest->round() != round_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", source.id, " is of round ", manifest->round()));
  }
  if (!manifest->model_sha256().empty() && manifest->model_sha256() != hash_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", source.id, " does not hold this model: its hash is ",
                     manifest->model_sha256().substr(0, 12), ", not ", hash_.substr(0, 12)));
  }
  // The outer optimizer's state follows the model's layers: not pulled here.
  const int model_layers = checkpoint::ModelLayerCount(*manifest);
  manifest->mutable_layers()->DeleteSubrange(model_layers, manifest->layers_size() - model_layers);
  uint64_t bytes = 0;
  for (const auto& e : manifest->layers()) {
    if (e.dtype() != "float32" || e.bytes() % sizeof(float) != 0 || e.bytes() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", source.id, ": layer '", e.name(), "' is not float32"));
    }
    source.starts.push_back(bytes);
    bytes += e.bytes();
  }
  if (bytes != total_ * sizeof(float)) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", source.id, " holds ", bytes,
                                                      " bytes, the model has ",
                                                      total_ * sizeof(float)));
  }
  source.manifest = std::move(*manifest);
  return source;
}

void SyncRun::ProcessReads() {
  const absl::Time now = clock_->Now();
  for (auto it = reads_.begin(); it != reads_.end();) {
    Read& r = **it;
    if (!r.finished) {
      ++it;
      continue;
    }
    // A store read's thread has only its return left.
    if (r.thread.joinable()) r.thread.join();
    std::unique_ptr<Read> done = std::move(*it);
    it = reads_.erase(it);
    const bool store = r.source == kStore;
    if (store) {
      --store_active_;
    } else {
      Peer& peer = peers_[r.source];
      if (--peer.active == 0) peer.window_busy += now - peer.busy_since;
      Sample(r.source, now);
    }
    if (r.abandoned) continue;  // already accounted for when it was moved
    Piece& piece = pieces_[r.piece];
    if (r.status.ok() && r.digest_ok) {
      std::memcpy(dst_ + piece.begin, r.buffer.data(), piece.bytes());
      piece.state = Piece::kDone;
      ++pieces_done_;
      Layer& layer = layers_[piece.layer];
      layer.sources.insert(r.source);
      if (store) {
        bytes_from_store_ += piece.bytes();
        ++pieces_from_store_;
      } else {
        Peer& peer = peers_[r.source];
        peer.failures_in_row = 0;
        peer.stats.bytes += piece.bytes();
        peer.stats.pieces++;
      }
      if (++layer.pieces_done == layer.pieces.size() &&
          (layer.sha256.empty() || layer.checked_on_arrival())) {
        // Nothing to check, or checked against its own digest on arrival;
        // the others are checked by HashAhead.
        LayerChecked(piece.layer, true);
      }
      continue;
    }
    // The piece goes back to the queue, for another source.
    progress_->bytes_done -= r.received;
    piece.state = Piece::kPending;
    ++pieces_refetched_;
    if (store) {
      // Bytes that do not match the digest, or the store's own DATA_LOSS:
      // the checkpoint is damaged (the coordinator goes back to an older
      // one when nobody else holds the round).
      Fail(absl::Status(
          r.status.ok() ? absl::StatusCode::kDataLoss : StoreFailureCode(r.status),
          absl::StrCat("no holder can serve layer '", layers_[piece.layer].name, "' of round ",
                       round_, PeerReasons(), " and the checkpoint store failed: ",
                       r.status.ok() ? absl::StrCat("its bytes do not match the layer's digest")
                                     : std::string(r.status.message()))));
      continue;
    }
    Peer& peer = peers_[r.source];
    if (r.status.ok()) {
      // Bytes with valid CRCs that do not hash to the manifest's digest.
      peer.stats.corrupt_pieces++;
      failed_.insert({piece.layer, r.source});
      SHOAL_LOG(WARNING) << "holder " << addresses_[r.source]
                         << " served a corrupt piece of layer '" << layers_[piece.layer].name
                         << "'; reading it elsewhere";
      Demote(r.source);
      if (peer.stats.corrupt_pieces >= options_.max_corrupt_pieces) {
        Drop(r.source, absl::StrCat("served ", peer.stats.corrupt_pieces, " corrupt pieces"));
      }
      continue;
    }
    peer.stats.failed_reads++;
    piece.excluded.push_back(r.source);
    SHOAL_VLOG(1) << "read of [" << piece.begin << ", " << piece.end << ") from "
                  << addresses_[r.source] << " failed: " << r.status;
    if (IsFinalForPeer(r.status)) {
      Drop(r.source, std::string(r.status.message()));
    } else if (++peer.failures_in_row >= options_.max_peer_failures) {
      Drop(r.source, absl::StrCat(peer.failures_in_row,
                                  " failed reads in a row, the last: ", r.status.message()));
    }
  }
  UpdateSources();
}

void SyncRun::LogProgress(const std::string& layer) {
  // A line per verified layer, at most one a second (models of hundreds of
  // small layers), and always the last one.
  const absl::Time now = clock_->Now();
  const bool last = layers_verified_ == layers_.size();
  if (!last && now - last_progress_log_ < absl::Seconds(1)) return;
  last_progress_log_ = now;
  SHOAL_LOG(INFO) << "pull of round " << round_ << ": layer '" << layer << "' done ("
                  << layers_verified_ << "/" << layers_.size() << " layers); "
                  << FormatProgressFigures(progress_->bytes_done.load(), total_ * sizeof(float),
                                           now - started_);
}

void SyncRun::LayerChecked(uint32_t index, bool ok) {
  Layer& layer = layers_[index];
  if (ok) {
    if (!layer_verified_[index]) {
      layer_verified_[index] = true;
      ++layers_verified_;
      LogProgress(layer.name);
    }
    return;
  }
  // Every piece matched (or had no digest of its own) but the layer does
  // not: distrust every source of it for this layer.
  SHOAL_LOG(WARNING) << "layer '" << layer.name << "' of round " << round_
                     << " does not match its digest; reading it again elsewhere";
  for (size_t source : layer.sources) {
    if (source == kStore) {
      Fail(absl::DataLossError(absl::StrCat("layer '", layer.name,
                                            "' from the checkpoint store does not match "
                                            "its digest: the checkpoint is damaged")));
      return;
    }
    failed_.insert({index, source});
    peers_[source].stats.corrupt_pieces++;
    Demote(source);
  }
  for (size_t p : layer.pieces) {
    if (pieces_[p].state != Piece::kDone) continue;
    pieces_[p].state = Piece::kPending;
    --pieces_done_;
    ++pieces_refetched_;
    progress_->bytes_done -= pieces_[p].bytes();
  }
  layer.pieces_done = 0;
  layer.sources.clear();
  layer.hash.reset();
  // Hash again from this layer on; the whole-model hash cannot go back: it
  // is computed over the result at the end instead.
  hashed_ = std::min(hashed_, layer.pieces.front());
  whole_hash_.reset();
  for (size_t source = 0; source < peers_.size(); ++source) {
    if (peers_[source].state == Peer::kUsable &&
        peers_[source].stats.corrupt_pieces >= options_.max_corrupt_pieces) {
      Drop(source, absl::StrCat("served ", peers_[source].stats.corrupt_pieces, " corrupt pieces"));
    }
  }
}

void SyncRun::CheckStalls() {
  const absl::Time now = clock_->Now();
  for (auto& read : reads_) {
    Read& r = *read;
    if (r.finished || r.abandoned || r.source == kStore) continue;
    Peer& peer = peers_[r.source];
    if (now - r.last_progress <= options_.stall_timeout) continue;
    Piece& piece = pieces_[r.piece];
    SHOAL_LOG(INFO) << "read of layer '" << layers_[piece.layer].name << "' [" << piece.begin
                    << ", " << piece.end << ") from " << addresses_[r.source]
                    << " made no progress for " << absl::FormatDuration(now - r.last_progress)
                    << "; moving it to another holder";
    peer.stats.stalls++;
    piece.excluded.push_back(r.source);
    Abandon(&r);
    Demote(r.source);
    if (++peer.failures_in_row >= options_.max_peer_failures) {
      Drop(r.source, absl::StrCat(peer.failures_in_row, " reads in a row failed or stalled"));
    }
  }
}

void SyncRun::Abandon(Read* r) {
  if (r->abandoned) return;
  r->abandoned = true;
  // A store read hears the token between blocks; a peer read's call is
  // cancelled by IssueCalls, out of mu_ (one not started yet never starts).
  r->canceller.Cancel();
  if (r->call != nullptr) to_cancel_.push_back(r->call);
  progress_->bytes_done -= r->received;
  Piece& piece = pieces_[r->piece];
  if (piece.state == Piece::kInFlight && piece.read_id == r->id) {
    piece.state = Piece::kPending;
    ++pieces_refetched_;
  }
}

void SyncRun::Demote(size_t index) {
  Peer& peer = peers_[index];
  if (peer.rate <= 0) {
    // Never measured: start below every measured peer.
    double floor = kFloorRate;
    for (const Peer& p : peers_) {
      if (p.rate > 0) floor = std::min(floor, p.rate);
    }
    peer.rate = floor;
  }
  peer.rate *= 0.5;
}

void SyncRun::Drop(size_t index, const std::string& why) {
  Peer& peer = peers_[index];
  if (peer.state == Peer::kDropped) return;
  peer.state = Peer::kDropped;
  peer.stats.dropped = true;
  peer.stats.why = why;
  SHOAL_LOG(WARNING) << "dropping sync source " << addresses_[index] << ": " << why;
  for (auto& r : reads_) {
    if (r->source == index && !r->finished) Abandon(r.get());
  }
  UpdateSources();
}

void SyncRun::Sample(size_t index, absl::Time now) {
  Peer& peer = peers_[index];
  const absl::Duration busy =
      peer.window_busy + (peer.active > 0 ? now - peer.busy_since : absl::ZeroDuration());
  if (busy < kMinSampleTime) return;  // too short to mean anything (or a fake clock)
  const double sample = static_cast<double>(peer.window_bytes) / absl::ToDoubleSeconds(busy);
  peer.rate = peer.rate > 0 ? (1 - kEwmaAlpha) * peer.rate + kEwmaAlpha * sample : sample;
  peer.window_bytes = 0;
  peer.window_busy = absl::ZeroDuration();
  if (peer.active > 0) peer.busy_since = now;
}

void SyncRun::Schedule() {
  if (!have_table_) return;
  std::vector<PlannerPeer> view(peers_.size());
  for (size_t p = 0; p < peers_.size(); ++p) {
    view[p].rate = peers_[p].rate;
    view[p].in_flight = peers_[p].active;
    view[p].usable = peers_[p].state == Peer::kUsable;
  }
  for (const auto& r : reads_) {
    if (r->source != kStore && !r->finished) {
      const uint64_t bytes = (r->end - r->begin) * sizeof(float);
      view[r->source].backlog_bytes += bytes - std::min(bytes, r->received);
    }
  }
  std::vector<PlannerPiece> pending;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Piece& p = pieces_[i];
    if (p.state != Piece::kPending) continue;
    if (!p.excluded.empty() && p.attempts < options_.max_piece_attempts) {
      // Every usable holder that may serve the layer broke off or stalled
      // on this piece: give them another chance (a blip is not a verdict;
      // holders failing in a row are dropped, attempts are bounded).
      bool any_left = false;
      bool any_excluded = false;
      for (size_t q = 0; q < peers_.size(); ++q) {
        if (peers_[q].state != Peer::kUsable || failed_.count({p.layer, q}) > 0) continue;
        const bool excluded =
            std::find(p.excluded.begin(), p.excluded.end(), q) != p.excluded.end();
        any_excluded |= excluded;
        any_left |= !excluded;
      }
      if (!any_left && any_excluded) p.excluded.clear();
    }
    pending.push_back({i, p.layer, p.bytes(), p.excluded});
  }
  if (pending.empty()) return;
  const ReadPlan plan = PlanReads(view, pending, failed_, planner_);
  for (const Assignment& a : plan.assignments) {
    SHOAL_VLOG(2) << "piece [" << pieces_[a.piece].begin << ", " << pieces_[a.piece].end
                  << ") from " << addresses_[a.peer] << ": " << a.reason;
    StartRead(a.piece, a.peer);
  }
  // Pieces no holder may serve: wait for holders still describing the
  // model, then take them from the checkpoint store.
  if (plan.unservable.empty() || ManifestsPending()) return;
  if (!store_resolved_) {
    EnsureStore();
    if (store_.has_value()) {
      SHOAL_LOG(WARNING) << "no holder can serve every layer of round " << round_ << PeerReasons()
                         << "; reading the rest from checkpoint " << store_->id;
    }
  }
  if (!store_.has_value()) {
    const Piece& p = pieces_[plan.unservable.front()];
    Fail(absl::Status(
        StoreFailureCode(store_error_),
        absl::StrCat("no holder can serve layer '", layers_[p.layer].name, "' of round ", round_,
                     PeerReasons(), " and the checkpoint store cannot: ", store_error_.message())));
    return;
  }
  for (size_t piece : plan.unservable) {
    if (store_active_ >= planner_.per_peer) break;
    StartRead(piece, kStore);
  }
  UpdateSources();
}

void SyncRun::StartRead(size_t index, size_t source) {
  Piece& piece = pieces_[index];
  auto read = std::make_unique<Read>();
  Read* r = read.get();
  r->id = ++next_read_id_;
  r->piece = index;
  r->source = source;
  r->begin = piece.begin;
  r->end = piece.end;
  r->digest = piece.sha256;
  r->buffer.resize(piece.end - piece.begin);
  r->last_progress = clock_->Now();
  piece.state = Piece::kInFlight;
  piece.read_id = r->id;
  if (source == kStore) {
    ++store_active_;
  } else {
    ++piece.attempts;
    Peer& peer = peers_[source];
    if (peer.active++ == 0) peer.busy_since = r->last_progress;
  }
  reads_.push_back(std::move(read));
  if (source == kStore) {
    r->thread = std::thread([this, r] { RunStoreRead(r); });
  } else {
    to_start_.push_back(r);
  }
}

void SyncRun::IssueCalls() {
  std::vector<Read*> starts;
  starts.swap(to_start_);
  std::vector<std::shared_ptr<ChunkStreamCall>> cancels;
  cancels.swap(to_cancel_);
  if (starts.empty() && cancels.empty()) return;
  // Reads are erased by this thread only, and only once finished: the
  // pointers stay valid while mu_ is released.
  std::vector<Read*> go;
  for (Read* r : starts) {
    if (!r->abandoned) {
      go.push_back(r);
      continue;
    }
    r->status = absl::CancelledError("abandoned before it started");
    r->finished = true;
  }
  mu_.Unlock();
  for (const auto& call : cancels) call->Cancel();
  std::vector<std::shared_ptr<ChunkStreamCall>> calls;
  for (Read* r : go) calls.push_back(StartPeerRead(r));
  mu_.Lock();
  for (size_t i = 0; i < go.size(); ++i) go[i]->call = std::move(calls[i]);
}

std::shared_ptr<ChunkStreamCall> SyncRun::StartPeerRead(Read* r) {
  shoal::v1::ReadSliceRequest request;
  request.set_round(round_);
  request.set_begin(r->begin);
  request.set_end(r->end);
  request.set_kind(shoal::v1::SNAPSHOT);
  request.set_reader_id(self_id_);
  ChunkStreamCallbacks callbacks;
  callbacks.on_chunk = [this, r](const ChunkView& c) {
    // ChunkReceiver keeps chunks within [begin, end).
    c.CopyTo(r->buffer.data() + (c.begin - r->begin));
    return OnBytes(r, c.count * sizeof(float)) ? ChunkNext::kRead : ChunkNext::kStop;
  };
  callbacks.on_done = [this, r, outstanding = outstanding_](absl::Status s, uint64_t) {
    EndRead(r, std::move(s));
    outstanding->Done();  // the last touch of this run
  };
  outstanding_->Add();
  return client_->StartReadSlice(addresses_[r->source], request, options_.piece_timeout,
                                 std::move(callbacks));
}

void SyncRun::RunStoreRead(Read* r) { EndRead(r, ReadFromStore(r)); }

void SyncRun::EndRead(Read* r, absl::Status s) {
  // A 4 MiB piece at most (the manifest's digest pieces): hashed on the
  // read's gRPC thread, in parallel with the others.
  const bool digest_ok = !s.ok() || r->digest.empty() ||
                         Sha256Hex(r->buffer.data(), r->buffer.size() * sizeof(float)) == r->digest;
  absl::MutexLock lock(&mu_);
  r->status = std::move(s);
  r->digest_ok = digest_ok;
  r->finished = true;
  cv_.Signal();
}

absl::Status SyncRun::ReadFromStore(Read* r) {
  const StoreSource* store;
  {
    absl::MutexLock lock(&mu_);
    store = &*store_;  // set before any store read starts, never reset after
  }
  const uint64_t first = r->begin * sizeof(float);
  const uint64_t last = r->end * sizeof(float);
  uint8_t* out = reinterpret_cast<uint8_t*>(r->buffer.data());
  uint64_t received = 0;
  for (int i = 0; i < store->manifest.layers_size(); ++i) {
    const uint64_t start = store->starts[i];
    const uint64_t end = start + store->manifest.layers(i).bytes();
    if (end <= first || start >= last) continue;
    const uint64_t from = std::max(first, start);
    const uint64_t to = std::min(last, end);
    absl::Status s = fallback_.client->ReadLayer(
        store->id, static_cast<uint32_t>(i), from - start, to - from,
        [&](uint64_t offset, checkpoint::ByteSpan data) {
          const uint64_t at = start + offset;  // byte in the flat vector
          if (at < from || at + data.size() > to) return false;
          std::memcpy(out + (at - first), data.data(), data.size());
          received += data.size();
          return OnBytes(r, data.size()) && !r->canceller.cancelled();
        });
    if (!s.ok()) return Annotate(s, absl::StrCat("checkpoint ", store->id));
  }
  if (received != last - first) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", store->id, " sent ", received, " of ", last - first, " bytes"));
  }
  return absl::OkStatus();
}

bool SyncRun::OnBytes(Read* r, uint64_t bytes) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  r->received += bytes;
  r->last_progress = now;
  if (!r->abandoned) progress_->bytes_done += bytes;
  if (r->source != kStore) peers_[r->source].window_bytes += bytes;
  return !r->abandoned;
}

void SyncRun::Fail(absl::Status s) {
  if (failure_.ok()) failure_ = std::move(s);
}

void SyncRun::UpdateSources() {
  uint32_t n = store_active_ > 0 ? 1 : 0;
  for (const Peer& p : peers_) n += p.state == Peer::kUsable;
  progress_->sources = n;
}

bool SyncRun::Complete() const {
  return pieces_done_ == pieces_.size() && layers_verified_ == layers_.size();
}

std::string SyncRun::PeerReasons() const {
  std::vector<std::string> why;
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (peers_[p].state == Peer::kUnused || peers_[p].state == Peer::kDropped) {
      why.push_back(absl::StrCat(addresses_[p], ": ", peers_[p].stats.why));
    }
  }
  if (why.empty()) return peers_.empty() ? " (no holders)" : "";
  return absl::StrCat(" (", absl::StrJoin(why, "; "), ")");
}

void SyncRun::StopAll() {
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<ChunkStreamCall>> calls;
  std::vector<CancellationToken*> manifests;
  {
    absl::MutexLock lock(&mu_);
    for (Read* r : to_start_) {  // never started (the pass broke off)
      r->status = absl::CancelledError("never started");
      r->finished = true;
    }
    to_start_.clear();
    to_cancel_.clear();
    for (auto& r : reads_) {
      r->canceller.Cancel();
      if (r->call != nullptr && !r->finished) calls.push_back(r->call);
      if (r->thread.joinable()) threads.push_back(std::move(r->thread));
    }
    for (auto& c : manifest_calls_) manifests.push_back(&c->canceller);
  }
  // Outside the lock: the calls' and threads' ends take it to report.
  for (const auto& call : calls) call->Cancel();
  for (CancellationToken* token : manifests) token->Cancel();
  for (std::thread& t : threads) t.join();
  // Cancelled calls end at once; each also ends by its own deadline (the
  // piece's or the manifest's timeout), so this wait ends. Until it does,
  // the calls' callbacks may still touch this run: it cannot be left.
  const absl::Time since = absl::Now();
  while (!outstanding_->WaitFor(absl::Seconds(10))) {
    SHOAL_LOG(WARNING) << "pull of round " << round_ << ": " << outstanding_->count()
                       << " cancelled calls have not ended after "
                       << absl::FormatDuration(absl::Now() - since) << "; still waiting";
  }
}

void SyncRun::FillStats(SyncStats* stats) {
  StopAll();
  absl::MutexLock lock(&mu_);
  ProcessManifests();  // answers that came after the last pass, for the record
  std::vector<PlannerPeer> view(peers_.size());
  for (size_t p = 0; p < peers_.size(); ++p) {
    view[p].rate = peers_[p].rate;
    view[p].usable = peers_[p].state == Peer::kUsable;
  }
  const std::vector<size_t> order = RankPeers(view, planner_);
  stats->peers.clear();
  for (size_t p = 0; p < peers_.size(); ++p) {
    PeerSyncStats s = peers_[p].stats;
    s.rate = peers_[p].rate;
    s.rank = static_cast<int>(std::find(order.begin(), order.end(), p) - order.begin());
    stats->peers.push_back(std::move(s));
  }
  stats->bytes_from_store = bytes_from_store_;
  stats->pieces_from_store = pieces_from_store_;
  stats->pieces_refetched += pieces_refetched_;
  if (store_.has_value() && pieces_from_store_ > 0) stats->checkpoint_id = store_->id;
}

}  // namespace

absl::Status ModelSyncer::Sync(uint64_t round, const std::string& expected_hash,
                               const std::vector<std::string>& holders, float* dst, uint64_t total,
                               const std::string& self_id, SyncProgress* progress,
                               const CheckpointFallback& fallback, SyncStats* stats) {
  SyncStats local;
  if (stats == nullptr) stats = &local;
  *stats = SyncStats();
  if (holders.empty() && fallback.client == nullptr) {
    return absl::UnavailableError(absl::StrCat("no peer holds the model of round ", round));
  }
  progress->syncing = true;
  progress->bytes_total = total * sizeof(float);
  const Clock* clock = options_.clock != nullptr ? options_.clock : RealClock::Get();
  const absl::Time start = clock->Now();
  absl::Status last;
  for (int attempt = 1; attempt <= std::max(1, options_.attempts); ++attempt) {
    progress->bytes_done = 0;
    stats->attempts = attempt;
    std::string hash;
    {
      SyncRun run(peers_, options_, round, expected_hash, holders, dst, total, self_id, progress,
                  fallback);
      last = run.Run();
      run.FillStats(stats);
      hash = run.whole_digest();
    }
    if (!last.ok()) break;
    // The final check: the whole model against the agreed hash (hashed in
    // model order as the pieces were accepted, unless a layer was redone).
    if (hash.empty()) hash = Sha256Hex(dst, total * sizeof(float));
    if (hash == expected_hash) {
      std::vector<std::string> parts;
      for (const PeerSyncStats& p : stats->peers) {
        if (p.bytes == 0) continue;
        parts.push_back(absl::StrFormat("%s %.1f MiB", p.address, p.bytes / 1048576.0));
      }
      if (stats->bytes_from_store > 0) {
        parts.push_back(absl::StrFormat("checkpoint %s %.1f MiB", stats->checkpoint_id,
                                        stats->bytes_from_store / 1048576.0));
      }
      SHOAL_LOG(INFO) << absl::StrFormat("pulled the model of round %d in %.2fs: %s", round,
                                         absl::ToDoubleSeconds(clock->Now() - start),
                                         absl::StrJoin(parts, ", "));
      progress->syncing = false;
      return absl::OkStatus();
    }
    last = absl::DataLossError(absl::StrCat("model of round ", round, " pulled has hash ",
                                            hash.substr(0, 12), ", expected ",
                                            expected_hash.substr(0, 12)));
    SHOAL_LOG(WARNING) << last.message() << "; pulling again (attempt " << attempt << ")";
  }
  progress->syncing = false;
  return last;
}

}  // namespace shoal::worker
