#include "services/worker/core/layer_planner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"

namespace shoal::worker {

double EffectiveRate(const PlannerPeer& peer, const PlannerOptions& options) {
  return peer.rate > 0 ? peer.rate : options.default_rate;
}

std::vector<size_t> RankPeers(const std::vector<PlannerPeer>& peers,
                              const PlannerOptions& options) {
  std::vector<size_t> order(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (peers[a].usable != peers[b].usable) return peers[a].usable;
    return EffectiveRate(peers[a], options) > EffectiveRate(peers[b], options);
  });
  return order;
}

ReadPlan PlanReads(const std::vector<PlannerPeer>& peers, const std::vector<PlannerPiece>& pending,
                   const FailedPairs& failed, const PlannerOptions& options) {
  ReadPlan plan;
  const size_t n = peers.size();
  std::vector<int> free_slots(n, 0);
  std::vector<double> backlog(n, 0);
  std::vector<double> rate(n, 0);
  double sum_rate = 0;
  double bytes_left = 0;
  for (size_t p = 0; p < n; ++p) {
    if (!peers[p].usable) continue;
    rate[p] = EffectiveRate(peers[p], options);
    backlog[p] = static_cast<double>(peers[p].backlog_bytes);
    free_slots[p] = std::max(0, options.per_peer - peers[p].in_flight);
    sum_rate += rate[p];
    bytes_left += backlog[p];
  }
  for (const PlannerPiece& piece : pending) bytes_left += static_cast<double>(piece.bytes);
  // When everything left would be done if all peers worked until the end.
  const double estimated_end =
      sum_rate > 0 ? bytes_left / sum_rate : std::numeric_limits<double>::infinity();

  for (const PlannerPiece& piece : pending) {
    const double bytes = static_cast<double>(piece.bytes);
    double best_finish = std::numeric_limits<double>::infinity();
    double free_finish = std::numeric_limits<double>::infinity();
    size_t free_peer = n;
    bool eligible = false;
    for (size_t p = 0; p < n; ++p) {
      if (!peers[p].usable || failed.count({piece.layer, p}) > 0 ||
          std::find(piece.excluded_peers.begin(), piece.excluded_peers.end(), p) !=
              piece.excluded_peers.end()) {
        continue;
      }
      eligible = true;
      const double finish = (backlog[p] + bytes) / rate[p];
      best_finish = std::min(best_finish, finish);
      if (free_slots[p] > 0 && finish < free_finish) {
        free_finish = finish;
        free_peer = p;
      }
    }
    if (!eligible) {
      plan.unservable.push_back(piece.id);
      continue;
    }
    if (free_peer == n) {
      ++plan.deferred;  // every peer that may serve it is busy
      continue;
    }
    const bool fastest = free_finish <= best_finish;
    if (!fastest && free_finish > std::max(best_finish, estimated_end) * options.tail_slack) {
      // Only a slow peer is free and it would finish after the estimated
      // end: a faster one takes the piece when a slot frees up.
      ++plan.deferred;
      continue;
    }
    free_slots[free_peer]--;
    backlog[free_peer] += bytes;
    plan.assignments.push_back(
        {piece.id, free_peer,
         fastest ? absl::StrFormat("earliest finish (%.2fs)", free_finish)
                 : absl::StrFormat("finishes in %.2fs, before the estimated end %.2fs", free_finish,
                                   estimated_end)});
  }
  return plan;
}

}  // namespace shoal::worker
