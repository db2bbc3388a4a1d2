// The description of a worker's snapshot layer by layer (Peer.GetManifest):
// the layer table, the digest piece size, and the manifest computed for one
// snapshot generation, with the requests waiting while it is computed.
//
// The digests are computed on the first request for a generation, on the
// requesting thread (a gRPC thread: about 0.1 s per 150 MB with SHA-NI),
// and cached until the snapshot changes. Concurrent requests for the same
// generation wait for that one computation through their callbacks, never
// by blocking. ManifestCache only keeps the books; the owner (ModelState)
// decides whether the snapshot may be described, lends its memory for the
// computation and runs the callbacks outside its lock.
//
// Not thread-safe: ModelState guards it with its mutex.
#ifndef SHOAL_SERVICES_WORKER_CORE_MANIFEST_CACHE_H_
#define SHOAL_SERVICES_WORKER_CORE_MANIFEST_CACHE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// Checks a manifest received from a peer (Peer.GetManifest) before the
// syncer builds its piece table from it: the wanted `round` and agreed
// `hash` (FAILED_PRECONDITION otherwise), and a layer table that fits a
// model of `total` elements with one digest per piece (INVALID_ARGUMENT).
absl::Status CheckManifest(const shoal::v1::ModelManifest& m, uint64_t round,
                           const std::string& hash, uint64_t total);

using ManifestCallback = std::function<void(absl::StatusOr<shoal::v1::ModelManifest>)>;

class ManifestCache {
 public:
  // INVALID_ARGUMENT (nothing changes) unless CheckLayers(layers, total).
  absl::Status SetLayers(std::vector<LayerSpan> layers, uint64_t total);
  // The table, or the whole vector as one layer "all" when none was set.
  std::vector<LayerSpan> layers(uint64_t total) const;
  void SetDigestPieceElements(uint64_t elements);

  // A computation to run: what to describe.
  struct Job {
    uint64_t generation = 0;
    uint64_t layout = 0;  // layout version it was started with
    std::vector<LayerSpan> layers;
    uint64_t piece_elements = 0;
  };
  enum class Lookup {
    kHit,     // `*hit` is the cached manifest of `generation`
    kJoined,  // `*done` was kept: Finish of the running computation answers it
    kCompute  // `*job` is filled: compute it, then call Finish
  };
  Lookup Begin(uint64_t generation, uint64_t total, ManifestCallback* done,
               shoal::v1::ModelManifest* hit, Job* job);
  // Ends `job`: caches `manifest` when `current` (the snapshot is still that
  // generation) and the layer table did not change meanwhile. Returns the
  // callbacks that joined it, to be answered by the caller.
  std::vector<ManifestCallback> Finish(const Job& job, const shoal::v1::ModelManifest& manifest,
                                       bool current);

 private:
  std::vector<LayerSpan> layers_;
  uint64_t digest_piece_elements_ = kDefaultDigestPieceElements;
  // Bumped by SetLayers / SetDigestPieceElements: digests computed for an
  // older table are not cached.
  uint64_t layout_version_ = 0;
  // The manifest of snapshot generation `generation_`.
  std::optional<shoal::v1::ModelManifest> manifest_;
  uint64_t generation_ = 0;
  // Generation whose digests are being computed, and who waits for them.
  std::optional<uint64_t> computing_;
  std::vector<std::pair<uint64_t, ManifestCallback>> waiters_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_MANIFEST_CACHE_H_
