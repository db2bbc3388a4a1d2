// Synchronous rounds (docs/ARCHITECTURE.md "A round"): the runner that
// carries out the actions of the round protocol (core/worker_protocol.h)
// in order, feeding each result back; a result's follow-up actions run
// before the rest of the batch. It makes no protocol decision: train,
// report, probe, average (through the host's Averager), catch up, upload,
// re-join, leave are what the protocol asked for.
//
// Threads: everything runs on the thread of Worker::Run(); the averager
// has threads of its own; the session's thread cancels a running exchange
// through RunnerHost::SetInterruptible.
#ifndef SHOAL_SERVICES_WORKER_SYNC_RUNNER_H_
#define SHOAL_SERVICES_WORKER_SYNC_RUNNER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/worker/core/averager.h"
#include "services/worker/core/worker_protocol.h"
#include "services/worker/core/zone_measurements.h"
#include "services/worker/runner.h"

namespace shoal::worker {

class SyncRunner final : public Runner {
 public:
  // `initial_hash`: the hash of the model the trainer was built with (round
  // 0).
  SyncRunner(RunnerHost* host, RunnerParts parts, const std::string& initial_hash);

  bool joined() const override { return protocol_.joined(); }
  shoal::v1::JoinRequest JoinRequest() override { return protocol_.Start().front().join; }
  absl::Status OnJoined(const shoal::v1::JoinResponse& joined,
                        std::optional<absl::Status>* exit) override;
  absl::Status Run() override;
  uint64_t model_round() const override { return protocol_.model_round(); }

 private:
  // Carries out `actions` (and the actions their results lead to) in
  // order. Returns the status of a kExit, or nullopt to go on.
  std::optional<absl::Status> Execute(Actions actions);
  // Carries out one action; its result's follow-up actions go to `next`.
  std::optional<absl::Status> ExecuteOne(Action& action, Actions* next);
  // ExecuteOne's longer actions, one each (the same contract).
  std::optional<absl::Status> CatchUp(Action& a, Actions* next);
  std::optional<absl::Status> Train(Action& a, Actions* next);
  std::optional<absl::Status> ReportReady(Action& a, Actions* next);
  std::optional<absl::Status> Probe(Action& a, Actions* next);
  std::optional<absl::Status> RunExchange(Action& a, Actions* next);
  std::optional<absl::Status> ReportDone(Action& a, Actions* next);
  std::optional<absl::Status> Audit(Action& a, Actions* next);
  // The plan's peers this worker cannot reach (probed all at once).
  std::vector<std::string> UnreachablePeers(const shoal::v1::RoundPlan& plan, uint32_t retry);
  absl::Status Exchange(const Action& action, std::string* hash);
  // The test set's accuracy of the model the worker holds (the round's
  // average; with a local model, not that one).
  shoal::v1::Metrics Evaluate();
  void Upload(const Action& action);
  // The outer optimizer's momentum of `a.round` from a holder (catch-up).
  absl::Status PullOuterState(const Action& a);
  // The same from checkpoint `a.checkpoint_id` of the store (a restart from
  // the store); zero when the checkpoint's run kept no momentum.
  absl::Status LoadOuterStateFromCheckpoint(const Action& a);
  absl::Status PullModel(const Action& action, float* dst, uint64_t total);

  RunnerHost* const host_;
  const RunnerParts parts_;
  WorkerProtocol protocol_;
  AveragingStats last_stats_;  // of the latest exchange
  // A local model (parts_.local): " fragment=k/K" and, overlapped,
  // " stale=S/N" for the round's log line (S of the N steps behind the
  // contribution ran before the last average came).
  std::string round_note_;
  bool Overlapped() const { return parts_.local != nullptr && parts_.local->overlapped(); }
  // The encoded exchange's blobs of the current round are of a void plan:
  // none is served again (EncodedStore::Withdraw).
  void WithdrawPublished() {
    if (parts_.averaging->encoded_store != nullptr) parts_.averaging->encoded_store->Withdraw();
  }
  // Step time and bandwidth for the supernode election (ReportRoundDone).
  ZoneMeasurements zone_measurements_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_SYNC_RUNNER_H_
