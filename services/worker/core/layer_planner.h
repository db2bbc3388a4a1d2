// Decides which pieces of a model a worker catching up reads next, and from
// which peer. A pure function of the peers' measured throughput, their reads
// in flight, the pieces still wanted and the (piece or layer, peer) pairs
// that already failed; the caller (ModelSyncer) owns the state, runs the
// reads and asks again whenever a read ends.
//
// The rule is "earliest estimated finish": a piece goes to the free peer
// that would finish it first, (bytes queued at the peer + the piece) / its
// rate. A slower peer still gets work as long as it would finish its piece
// before the whole transfer is expected to end (everything left divided by
// the peers' summed rate), so it adds its throughput instead of being
// starved by faster ones; near the end it is left out so that it does not
// become the straggler. Peers whose rate is unknown get an optimistic
// default, so every peer is tried (and measured) early.
//
// No threads, no clock, no gRPC: tested directly (layer_planner_test).
#ifndef SHOAL_SERVICES_WORKER_CORE_LAYER_PLANNER_H_
#define SHOAL_SERVICES_WORKER_CORE_LAYER_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace shoal::worker {

// What the planner knows about one source peer.
struct PlannerPeer {
  // Measured bytes per second (all its reads together); <= 0 = not measured
  // yet (PlannerOptions::default_rate is assumed).
  double rate = 0;
  // Reads in flight at this peer.
  int in_flight = 0;
  // Bytes still to come of those reads.
  uint64_t backlog_bytes = 0;
  // False once the peer is dropped (or before it described the model).
  bool usable = true;
};

// One piece still wanted (not in flight, not done).
struct PlannerPiece {
  // The caller's id of the piece (returned in Assignment::piece).
  size_t id = 0;
  // Index of the layer the piece belongs to.
  uint32_t layer = 0;
  uint64_t bytes = 0;
  // Peers that failed this very piece (stalled, broke off); never asked
  // again for it.
  std::vector<size_t> excluded_peers;
};

struct PlannerOptions {
  // Concurrent reads per peer.
  int per_peer = 2;
  // Rate assumed for a peer not measured yet (optimistic: 1 GB/s).
  double default_rate = 1e9;
  // A peer that is not the fastest choice for a piece still takes it when
  // it would finish within this factor of the estimated end of the whole
  // transfer (or of the best peer's finish, whichever is later).
  double tail_slack = 1.25;
};

struct Assignment {
  size_t piece = 0;  // PlannerPiece::id
  size_t peer = 0;   // index into the peers given
  std::string reason;
};

struct ReadPlan {
  // Reads to start now, in order.
  std::vector<Assignment> assignments;
  // Pieces no usable peer may serve (every one is dropped or failed it):
  // the caller reads them from elsewhere (the checkpoint store).
  std::vector<size_t> unservable;
  // Pieces left for later: every peer that may serve them is busy, or only
  // a peer that would finish after the estimated end is free.
  size_t deferred = 0;
};

// (layer, peer) pairs that failed: a layer whose bytes from that peer did
// not hash to the manifest's digest is never read from that peer again.
using FailedPairs = std::set<std::pair<uint32_t, size_t>>;

// Plans the next reads. `pending` in the order the caller prefers (the
// planner keeps it among equally good choices).
ReadPlan PlanReads(const std::vector<PlannerPeer>& peers, const std::vector<PlannerPiece>& pending,
                   const FailedPairs& failed, const PlannerOptions& options);

// The rate the planner uses for `peer` (measured, or the default).
double EffectiveRate(const PlannerPeer& peer, const PlannerOptions& options);

// Usable peers, fastest first (ties: lower index first); dropped peers last.
std::vector<size_t> RankPeers(const std::vector<PlannerPeer>& peers, const PlannerOptions& options);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_LAYER_PLANNER_H_
