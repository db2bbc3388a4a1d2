// Pulls the averaged model of a round from the peers that hold it (workers
// catching up: late joiners, stragglers, workers back after an outage).
// The model is cut into pieces (its layers, big ones split) fetched in
// parallel from all holders, at most `per_peer` requests per holder at once;
// a piece whose read fails goes back to the queue for another holder, and a
// holder that fails twice is dropped. The whole model is verified against
// the round's agreed SHA-256; on a mismatch everything is fetched again.
#ifndef SHOAL_SERVICES_WORKER_MODEL_SYNCER_H_
#define SHOAL_SERVICES_WORKER_MODEL_SYNCER_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/worker/peer_client.h"

namespace shoal::worker {

struct SyncOptions {
  // Largest piece, in elements (4 MiB).
  uint64_t max_piece_elements = 1 << 20;
  // Concurrent requests per holder.
  int per_peer = 2;
  // Deadline of one piece's read.
  absl::Duration piece_timeout = absl::Seconds(30);
  // Whole sync attempts (hash mismatch → again).
  int attempts = 3;
};

struct SyncProgress {
  std::atomic<bool> syncing{false};
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<uint64_t> bytes_total{0};
  std::atomic<uint32_t> sources{0};
};

class ModelSyncer {
 public:
  ModelSyncer(PeerClient* peers, SyncOptions options) : peers_(peers), options_(options) {}

  // Fills dst[0, total) with the model of `round` whose hash is
  // `expected_hash`, read from `holders`. UNAVAILABLE when no holder can
  // serve it, DATA_LOSS when the hash never matches. `self_id` is for logs.
  absl::Status Sync(uint64_t round, const std::string& expected_hash,
                    const std::vector<std::string>& holders,
                    const std::vector<uint64_t>& layer_offsets, float* dst, uint64_t total,
                    const std::string& self_id, SyncProgress* progress);

 private:
  absl::Status SyncOnce(uint64_t round, const std::vector<std::string>& holders,
                        const std::vector<std::pair<uint64_t, uint64_t>>& pieces, float* dst,
                        const std::string& self_id, SyncProgress* progress);

  PeerClient* const peers_;
  const SyncOptions options_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_MODEL_SYNCER_H_
