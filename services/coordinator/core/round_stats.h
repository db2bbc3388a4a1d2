// What the status shows of the synchronous rounds and is no input of any
// decision: each member's metrics, losses, bytes on the wire, time shares,
// completed and late rounds and folded updates (MemberStats), and the
// summaries of the recent rounds. Kept apart from the round's state
// (SyncRound, sync_round.h): SyncRounds feeds it the reports the round
// took and the round's Missed / Completed intents.
//
// Not thread-safe: a part of SyncRounds, called under the engine's mutex.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ROUND_STATS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ROUND_STATS_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/container/node_hash_map.h"
#include "services/coordinator/core/sync_round.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

struct MemberStats {
  // Its latest evaluation and the round of it.
  shoal::v1::Metrics metrics;
  uint64_t metrics_round = 0;
  // Its latest ready report's loss, and its latest exchange's time.
  double train_loss = 0;
  double exchange_seconds = 0;
  uint64_t rounds_completed = 0;
  // Rounds it sat out without it counting (too slow for the adaptive
  // deadline).
  uint64_t rounds_late = 0;
  // train_seconds of its recent done reports, newest last; and of its
  // recent completed rounds its train and exchange seconds and the round's
  // wall seconds (WorkerStatus.train_share and the others).
  std::deque<double> train_seconds;
  struct TimeShare {
    double train = 0;
    double exchange = 0;
    double wall = 0;
  };
  std::deque<TimeShare> time_shares;
  double round_train_seconds = 0;  // its done report of the current round
  // Its latest exchange's bytes on the wire.
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  double compression_ratio = 0;
  uint64_t wire_round = 0;
  // Late work folded into completed rounds, and the last fold.
  uint64_t folded_updates = 0;
  uint64_t last_fold_staleness = 0;
  double last_fold_weight = 0;
  uint64_t last_fold_round = 0;
  double last_fold_train_seconds = 0;
  // The ready deadline (after the round start) of the last round it took
  // part in or sat out; 0 = none yet.
  double deadline_seconds = 0;
};

class RoundStats {
 public:
  // `window`: how many recent samples a member keeps.
  explicit RoundStats(size_t window) : window_(window) {}

  // A ready report the round took.
  void OnReady(const shoal::v1::ReportReadyRequest& request);
  // A done report the round took.
  void OnRoundDone(const shoal::v1::ReportRoundDoneRequest& request);
  void OnMissed(const round_intent::Missed& missed);
  // Builds the round's summary from its participants' figures.
  void OnCompleted(const round_intent::Completed& completed);
  void Forget(const std::string& worker_id) { members_.erase(worker_id); }

  void FillStatus(shoal::v1::RunStatus* s) const;
  void FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const;

 private:
  const size_t window_;
  absl::node_hash_map<std::string, MemberStats> members_;
  std::deque<shoal::v1::RoundSummary> recent_rounds_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ROUND_STATS_H_
