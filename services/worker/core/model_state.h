// What a worker may serve to its peers right now: which round it is in,
// whether its contribution is trained, which slice it owns and whether that
// slice is averaged. The peer service asks it before reading model memory.
//
// It also describes the snapshot layer by layer (GetManifest): the digests
// are computed on the first request for a snapshot generation, on the
// requesting thread (a gRPC thread: about 0.1 s per 150 MB with SHA-NI;
// the worker's main thread never waits for it), and cached until the
// snapshot changes. Concurrent requests for the same generation wait for
// that one computation through their callbacks, never by blocking.
//
// Thread-safe: the worker's main thread updates it, gRPC threads read it.
#ifndef SHOAL_SERVICES_WORKER_CORE_MODEL_STATE_H_
#define SHOAL_SERVICES_WORKER_CORE_MODEL_STATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "shoal/v1/peer.pb.h"

namespace shoal::worker {

// One parameter tensor within the flat vector.
struct LayerSpan {
  std::string name;
  uint64_t offset = 0;  // first element
  uint64_t elements = 0;
};

// Pieces of this many elements (4 MiB) carry their own digest in a manifest.
inline constexpr uint64_t kDefaultDigestPieceElements = 1 << 20;

// Describes `data` (`total` elements): the digest of each layer and of each
// piece of `piece_elements` of the layers longer than that. `model_hash` is
// used as the whole vector's hash when not empty (computed otherwise).
// `layers` must be contiguous from 0 to `total` (see CheckLayers).
shoal::v1::ModelManifest ComputeModelManifest(const float* data, uint64_t total,
                                              const std::vector<LayerSpan>& layers,
                                              uint64_t piece_elements, uint64_t round,
                                              const std::string& model_hash);

// OK when `layers` are non-empty, in order, contiguous from element 0 and
// cover exactly `total` elements; INVALID_ARGUMENT otherwise.
absl::Status CheckLayers(const std::vector<LayerSpan>& layers, uint64_t total);

class ModelState {
 public:
  ModelState() = default;
  ModelState(const float* params, uint64_t total_elements, std::string model) {
    Bind(params, total_elements, std::move(model));
  }

  // Attaches the model memory (once, before the worker joins a round). Until
  // then every read gets UNAVAILABLE.
  void Bind(const float* params, uint64_t total_elements, std::string model);

  // The layer table of the flat vector (names, offsets, sizes in parameter
  // order), given once after Bind. Until then (or when it is rejected:
  // INVALID_ARGUMENT, not contiguous or not covering the model) the
  // manifest describes the whole vector as one layer named "all".
  absl::Status SetLayers(std::vector<LayerSpan> layers);
  std::vector<LayerSpan> layers() const;
  // Piece size of the manifest's piece digests (tests use small ones).
  void SetDigestPieceElements(uint64_t elements);

  // Describes the snapshot of `round` (see the class comment). `done` runs
  // exactly once, on this thread or on the thread computing the digests.
  // FAILED_PRECONDITION: the snapshot holds another round. UNAVAILABLE: no
  // snapshot, being replaced, or shutting down. ABORTED: the snapshot
  // changed while it was being hashed.
  using ManifestCallback = std::function<void(absl::StatusOr<shoal::v1::ModelManifest>)>;
  void GetManifest(uint64_t round, ManifestCallback done) const;

  void SetWorkerId(const std::string& id);
  // The worker starts local training of `round`: nothing of it is served yet.
  void BeginTraining(uint64_t round);
  // Local training of `round` is done: its contribution may be read.
  void SetReady(uint64_t round);
  // A plan (attempt) of the round arrived: the worker owns [begin, end).
  // Reads of other attempts are refused from now on.
  void SetPlan(uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end);
  // Contribution reads are refused until SetReady (the worker is restoring
  // its trained model for a new attempt).
  void Unready();
  // The owned slice now holds the average.
  void MarkAveraged(uint64_t round);
  // The round was aborted; nothing of it is served any more.
  void Abort(uint64_t round);
  // The worker holds the averaged model of `round` with this hash.
  void SetModel(uint64_t round, const std::string& hash);
  void SetShuttingDown();

  // The snapshot buffer (the averaged model kept for workers catching up).
  void BindSnapshot(const float* snapshot);
  // Call before overwriting the snapshot buffer; reads in flight end ABORTED.
  void BeginSnapshotUpdate();
  // The snapshot buffer now holds the averaged model of `round`.
  void SetSnapshot(uint64_t round);
  // Changes whenever the snapshot is being or was replaced.
  uint64_t snapshot_generation() const { return snapshot_generation_.load(); }
  const float* snapshot() const { return snapshot_.load(); }

  // OK when `request` may be served now from parameters(). UNAVAILABLE when it
  // may be served later (slice not averaged yet, or shutting down); every
  // other code is final: INVALID_ARGUMENT (empty range, no kind),
  // OUT_OF_RANGE (past the end), FAILED_PRECONDITION (stale or future round,
  // not trained yet, a slice the worker does not own).
  // For SNAPSHOT, `generation` gets the snapshot generation to re-check
  // while streaming.
  absl::Status CheckRead(const shoal::v1::ReadSliceRequest& request,
                         uint64_t* generation = nullptr) const;

  shoal::v1::PeerInfo Info() const;
  const float* parameters() const { return params_.load(); }
  uint64_t total_elements() const { return total_.load(); }

 private:
  std::atomic<const float*> params_{nullptr};
  std::atomic<uint64_t> total_{0};

  mutable absl::Mutex mu_;
  std::string model_ ABSL_GUARDED_BY(mu_);
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool has_plan_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t snapshot_round_ ABSL_GUARDED_BY(mu_) = 0;
  bool snapshot_valid_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<const float*> snapshot_{nullptr};
  std::atomic<uint64_t> snapshot_generation_{0};
  uint64_t own_begin_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t own_end_ ABSL_GUARDED_BY(mu_) = 0;
  bool averaged_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t model_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::string model_hash_ ABSL_GUARDED_BY(mu_);
  std::vector<LayerSpan> layers_ ABSL_GUARDED_BY(mu_);
  uint64_t digest_piece_elements_ ABSL_GUARDED_BY(mu_) = kDefaultDigestPieceElements;
  // Bumped by SetLayers / SetDigestPieceElements: digests computed for an
  // older table are not cached.
  uint64_t layout_version_ ABSL_GUARDED_BY(mu_) = 0;

  // Manifest cache: valid for snapshot generation manifest_generation_.
  mutable std::optional<shoal::v1::ModelManifest> manifest_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t manifest_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Generation whose digests are being computed, and who waits for them.
  mutable std::optional<uint64_t> computing_generation_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::pair<uint64_t, ManifestCallback>> manifest_waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_MODEL_STATE_H_
