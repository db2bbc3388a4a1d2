// Pulls the averaged model of a round from the peers that hold it (workers
// catching up: late joiners, stragglers, workers back after an outage).
//
//  1. Asks every holder for its manifest (Peer.GetManifest) at once. The
//     first one whose model hash is the agreed one fixes the layer table and
//     the digests; every other holder is used only once its manifest is
//     identical (cross-check). A holder refusing (another round) or
//     differing is not used.
//  2. Cuts the model into pieces (layers, big ones split into the
//     manifest's digest pieces, 4 MiB) and reads them from the holders in
//     parallel, at most `per_peer` reads per holder; LayerPlanner decides
//     who reads what, ranking holders by measured throughput (EWMA).
//  3. Checks every piece against its digest before it touches `dst`, and
//     every layer against its digest once complete. A bad piece or layer is
//     discarded and read from another holder; its holder never serves that
//     layer again and loses rank. A read without a byte for
//     `stall_timeout` is cancelled and its piece moves to another holder. A
//     holder that keeps failing, or that no longer holds the round, is
//     dropped.
//  4. A piece no holder can serve any more is read from the checkpoint
//     store (a checkpoint of the same round), when one is configured.
//  5. Checks the whole model against the agreed SHA-256; on a mismatch the
//     whole pull starts over (up to `attempts`).
//
// Threads: Sync() runs on the caller's thread, which schedules. Peer reads
// and manifest requests are gRPC callback calls (PeerClient::StartReadSlice,
// StartGetManifest), no thread of their own: a read's callbacks copy its
// chunks into the piece's buffer, check the piece's digest at its end and
// hand it over under the pull's lock; the scheduler starts and cancels calls
// with that lock released. A read from the checkpoint store still runs on a
// thread of its own (CheckpointClient::ReadLayer is synchronous). Before Sync
// returns it cancels every call still in flight and waits until each has
// ended (cancelled calls end at once; every call has its deadline), logging
// while it waits. Not thread-safe: one Sync at a time per ModelSyncer.
#ifndef SHOAL_SERVICES_WORKER_MODEL_SYNCER_H_
#define SHOAL_SERVICES_WORKER_MODEL_SYNCER_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/worker/core/layer_planner.h"
#include "services/worker/peer_client.h"

namespace shoal::worker {

struct SyncOptions;
// The deadline of one holder's manifest for a model of `bytes`.
absl::Duration ManifestTimeout(const SyncOptions& options, uint64_t bytes);

struct SyncOptions {
  // Largest piece, in elements (4 MiB), when the source gives no piece
  // digests (the checkpoint store); peers' manifests fix their own.
  uint64_t max_piece_elements = 1 << 20;
  // Concurrent reads per holder (and from the checkpoint store).
  int per_peer = 2;
  // Deadline of one piece's read.
  absl::Duration piece_timeout = absl::Seconds(30);
  // A read that receives no byte for this long is cancelled and its piece
  // goes to another holder. Must exceed the time one 1 MiB chunk takes at
  // the slowest holder's --upload_rate_mbps with every stream it serves
  // (5 s: caps down to about 4 Mbit/s for 2 streams).
  absl::Duration stall_timeout = absl::Seconds(5);
  // Deadline of one holder's manifest (it may hash the model first): at
  // least this, and at least the model's bytes at manifest_min_rate (a
  // holder hashing a model of gigabytes on busy cores takes longer than
  // 10 s: ManifestTimeout).
  absl::Duration manifest_timeout = absl::Seconds(10);
  double manifest_min_rate = 50e6;  // bytes per second
  // Whole sync attempts (whole-model hash mismatch → again).
  int attempts = 3;
  // Failed reads in a row after which a holder is dropped.
  int max_peer_failures = 2;
  // Pieces failing their digest after which a holder is dropped.
  int max_corrupt_pieces = 2;
  // Reads of one piece from holders: once every holder left broke off or
  // stalled on it, it is tried on them again up to this many reads in all,
  // then taken from the checkpoint store.
  int max_piece_attempts = 4;
  // Ranking and tail rules (per_peer above overrides planner.per_peer).
  PlannerOptions planner;
  // How often stalls are looked for.
  absl::Duration poll_interval = absl::Milliseconds(50);
  // Time source for throughput and stalls; the real clock when null.
  const Clock* clock = nullptr;
  // The worker's stop: once cancelled the sync ends (CANCELLED) within a
  // poll interval, its reads cancelled. Not owned; null = never.
  const CancellationToken* stop = nullptr;
};

// Where to read what no holder can serve. Unused when `client` is null.
struct CheckpointFallback {
  checkpoint::CheckpointClient* client = nullptr;
  // The checkpoint to read; when empty, the newest undamaged checkpoint of
  // `run_id` (any run when empty) whose round is the one wanted.
  std::string checkpoint_id;
  std::string run_id;
};

// Shown in the worker's status (heartbeats) while a pull runs.
struct SyncProgress {
  std::atomic<bool> syncing{false};
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<uint64_t> bytes_total{0};
  // Holders in use (plus one while the checkpoint store serves pieces).
  std::atomic<uint32_t> sources{0};
};

// What one holder did during a Sync (for logs and tests).
struct PeerSyncStats {
  std::string address;
  uint64_t bytes = 0;  // accepted bytes
  int pieces = 0;      // accepted pieces
  int failed_reads = 0;
  int stalls = 0;
  int corrupt_pieces = 0;
  // Rate the planner last used, bytes per second (0: never measured).
  double rate = 0;
  // 0 = ranked first when the pull ended; dropped holders rank last.
  int rank = 0;
  bool used = false;  // its manifest was accepted
  bool dropped = false;
  std::string why;  // why it was not used or dropped
};

struct SyncStats {
  std::vector<PeerSyncStats> peers;  // in the order of `holders`
  uint64_t bytes_from_store = 0;
  int pieces_from_store = 0;
  int pieces_refetched = 0;  // reads whose piece had to be read again
  int attempts = 0;
  // The checkpoint read from, when the store was used.
  std::string checkpoint_id;
};

class ModelSyncer {
 public:
  ModelSyncer(PeerClient* peers, SyncOptions options) : peers_(peers), options_(options) {}

  // Fills dst[0, total) with the model of `round` whose hash is
  // `expected_hash`, read from `holders` (and from `fallback` what they
  // cannot serve). UNAVAILABLE when neither can serve some piece, DATA_LOSS
  // when the whole-model hash never matches (the holders' manifests carry
  // the layer table); `self_id` is for logs. `stats` (optional) gets what happened.
  absl::Status Sync(uint64_t round, const std::string& expected_hash,
                    const std::vector<std::string>& holders, float* dst, uint64_t total,
                    const std::string& self_id, SyncProgress* progress,
                    const CheckpointFallback& fallback = {}, SyncStats* stats = nullptr);

 private:
  PeerClient* const peers_;
  const SyncOptions options_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_MODEL_SYNCER_H_
