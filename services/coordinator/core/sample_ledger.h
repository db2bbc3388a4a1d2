// The sample ledger (RunConfig.training.sample_ledger, docs/DATA.md): which
// samples of the training set each participant trains in a round, so that
// every sample is trained exactly once per epoch whatever the churn.
//
// Positions, not images: epoch e's samples are positions [0, N) of a
// permutation of the training set that every worker computes from the run
// seed and e (services/worker/core/sample_order.h). The ledger hands out
// ranges of positions:
//  - Assign: local_steps x batch_size positions per participant per round,
//    from the pool of lost work first (oldest first), then fresh ones from
//    the current epoch and on into the next (up to the run's epoch limit);
//  - Trained: the round completed with that participant's work in it;
//  - Lost: its work never made it into a completed round (it sat out, was
//    evicted or lost, its round was aborted): its ranges go back to the pool.
// An epoch is done when all N of its positions are trained: each position
// is trained at most once since it is handed out again only after it was
// lost.
//
// Pure state, no clock, no I/O. Not thread-safe: SyncRounds owns it under
// the engine's lock.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_SAMPLE_LEDGER_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_SAMPLE_LEDGER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "shoal/v1/common.pb.h"

namespace shoal::coordinator {

class SampleLedger {
 public:
  // `per_round`: positions per participant per round; `epochs`: the run's
  // limit (0 = none).
  SampleLedger(uint64_t per_round, uint32_t epochs);

  // A resumed run continues `saved` (its pool holds what was in flight).
  void Resume(const shoal::v1::SampleLedger& saved);
  // The training set size a member declares at join: the first one sets
  // it; another size is FAILED_PRECONDITION (a different dataset), and 0 is
  // a worker that cannot follow the ledger.
  absl::Status CheckDataset(uint64_t samples);
  uint64_t dataset() const { return dataset_; }

  // `worker`'s ranges for the round starting now (empty once the run's
  // epochs are all handed out). Ranges it still held go back to the pool
  // first.
  std::vector<shoal::v1::SampleRange> Assign(const std::string& worker);
  // `worker`'s ranges of the round in progress (what an audit replays).
  std::vector<shoal::v1::SampleRange> InFlight(const std::string& worker) const;
  // The round completed with `worker`'s work in it.
  void Trained(const std::string& worker);
  // `worker`'s work of the round is lost: its ranges go back to the pool.
  void Lost(const std::string& worker);
  // Every epoch of the limit is trained (false without a limit).
  bool Finished() const;
  uint64_t epochs_done() const { return epochs_done_; }

  // The ledger as the status shows it.
  shoal::v1::SampleLedger Status() const;
  // The ledger as the record and checkpoints keep it: ranges in flight are
  // back in the pool (a resumed run hands them out again).
  shoal::v1::SampleLedger Durable() const;

 private:
  struct Entry {
    shoal::v1::SampleRange range;
    bool redo = false;  // from the pool: counted as redone once trained
  };
  shoal::v1::SampleLedger Fill(bool in_flight_to_pool) const;
  // Advances epochs_done_ over finished epochs and drops their counts.
  void CloseFinishedEpochs();

  const uint64_t per_round_;
  const uint32_t epochs_;
  uint64_t dataset_ = 0;
  uint64_t epoch_ = 0;
  uint64_t offset_ = 0;
  std::deque<Entry> pool_;
  std::map<std::string, std::vector<Entry>> in_flight_;
  // Samples trained in epochs counted_from_, counted_from_ + 1, ...; the
  // epochs before counted_from_ are done (dropped from the front as they
  // finish, so that the durable ledger does not grow with the run).
  uint64_t counted_from_ = 0;
  std::deque<uint64_t> trained_per_epoch_;
  uint64_t trained_ = 0;
  uint64_t lost_ = 0;
  uint64_t redone_ = 0;
  uint64_t epochs_done_ = 0;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_SAMPLE_LEDGER_H_
