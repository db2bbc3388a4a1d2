// Gossip mode (docs/GOSSIP.md): the runner that carries out the actions of
// the gossip protocol (core/gossip_protocol.h) in order, feeding each
// result back; a result's follow-up actions run before the rest of the
// batch. It makes no decision of its own: it trains a step, publishes to
// the GossipBoard, fetches through GossipFetcher, interpolates and loads
// models through ModelMemory, uploads through GossipCheckpointer, and
// averages the final models, when and as the protocol says.
//
// Between actions it waits for the session's events until the protocol's
// wake_at(); while training it only takes the events already queued. Work
// that finishes in the background (a fetch, an upload, a pushed model) is
// collected when the protocol asks (kCollect, after every step).
//
// Threads: everything runs on the thread of Worker::Run(); GossipFetcher
// and GossipCheckpointer run one transfer each on a thread of their own.
#ifndef SHOAL_SERVICES_WORKER_GOSSIP_RUNNER_H_
#define SHOAL_SERVICES_WORKER_GOSSIP_RUNNER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/worker/core/gossip_board.h"
#include "services/worker/core/gossip_protocol.h"
#include "services/worker/core/push_box.h"
#include "services/worker/gossip_checkpointer.h"
#include "services/worker/gossip_fetcher.h"
#include "services/worker/runner.h"

namespace shoal::worker {

class GossipRunner final : public Runner {
 public:
  GossipRunner(RunnerHost* host, RunnerParts parts);
  ~GossipRunner() override;

  bool joined() const override { return protocol_.joined(); }
  shoal::v1::JoinRequest JoinRequest() override { return protocol_.JoinRequest(); }
  absl::Status OnJoined(const shoal::v1::JoinResponse& joined,
                        std::optional<absl::Status>* exit) override;
  absl::Status Run() override;
  uint64_t model_round() const override { return 0; }

 private:
  // Carries out `actions` and the actions their results lead to. Returns
  // the status of a kExit, or nullopt to go on.
  std::optional<absl::Status> Execute(GossipActions actions);
  // Carries out one action; its result's follow-up actions go to `next`.
  std::optional<absl::Status> ExecuteOne(GossipAction& action, GossipActions* next);
  // kCollect: the background work that finished, fed to the protocol.
  GossipActions Collect();
  // kEvaluateConsensus: the average of this worker's and `peers`' models,
  // evaluated in a buffer of its own.
  GossipActions EvaluateConsensus(const GossipAction& action);
  // kFinalAverage.
  GossipActions FinalAverage(const GossipAction& action);
  // A resumed run's checkpoint `id` into the model (every layer checked
  // against its SHA-256, the whole model against the manifest's model
  // hash); `*clock` gets its gossip clock.
  absl::Status LoadCheckpoint(const std::string& id, double* clock);
  GossipUploadJob UploadJob(const GossipAction::Upload& upload) const;
  std::unique_ptr<GossipFetcher> NewFetcher() const;

  RunnerHost* const host_;
  const RunnerParts parts_;
  const uint64_t elements_;
  GossipProtocol protocol_;
  // Background fetches (and the late join's, the final average's).
  std::unique_ptr<GossipFetcher> fetcher_;
  // The consensus evaluation's own fetcher, so that a background fetch in
  // flight is not disturbed.
  std::unique_ptr<GossipFetcher> consensus_fetcher_;
  std::unique_ptr<GossipCheckpointer> checkpointer_;  // when the run has a store
  // The latest publication (the base of the next fetch, the copy the next
  // upload takes); the final average's result as a copy.
  std::shared_ptr<const GossipCopy> latest_;
  std::shared_ptr<const GossipCopy> final_average_;
  // The fetch whose model an action of the protocol may use next
  // (kAdoptFetched, kInterpolate): its bytes are the fetcher's until its
  // next fetch. And the model pushed to us (kInterpolatePush).
  std::optional<GossipFetchResult> fetched_;
  std::optional<GossipPush> pushed_;
  // The consensus evaluation's average (allocated at its first use).
  std::vector<float> consensus_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_GOSSIP_RUNNER_H_
