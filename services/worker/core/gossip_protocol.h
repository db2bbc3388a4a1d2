// The worker's side of gossip mode (dpwa, docs/GOSSIP.md) as a state
// machine with no gRPC types, threads or I/O: it takes the coordinator's
// directives, the clock's ticks and the results of the worker's own work
// (a trained step, a fetch, a received push, a publication, an evaluation,
// an upload, the final average) and returns the actions to carry out. The
// gossip runner (services/worker/gossip_runner.h) carries them out in order
// and feeds each result back; it makes no decision of its own.
//
// What it decides:
//  - joining: the join request, and that a re-join must find the same run
//    configuration;
//  - the start: wait (at most 2 s) for the first peer list, then the late
//    join: up to three peers' models are fetched in turn (the partner chosen
//    by the PeerChooser, a peer that does not answer loses score) and the
//    first trained one (clock > 0) becomes this worker's model; when no peer
//    has trained, a resumed run's checkpoint (the first JoinResponse's) is
//    loaded; a checkpoint that cannot be loaded makes the worker leave;
//  - training: one step at a time; after each, the finished background
//    work is collected (a fetch is interpolated with the factor of
//    InterpolationFactor, from its base copy; a pushed model against the
//    current parameters); every gossip_every steps: evaluate (every
//    eval_every publications), evaluate the consensus (only the member the
//    coordinator names, every consensus_eval_every publications), publish,
//    start the checkpoint upload when it is due, and start a background
//    fetch with probability fetch_probability (a seeded generator) from a
//    partner of the PeerChooser;
//  - checkpoints: the checkpointer's sequence number and due step, the
//    hand-over (a CheckpointRequest makes this worker the checkpointer; a
//    report refused as FAILED_PRECONDITION or NOT_FOUND, or a lost session,
//    ends it);
//  - the end (--gossip_steps): the final publication; with the final
//    average, wait (bounded by final_wait) for GossipFinal, average its
//    sources, evaluate, report the hash, upload (the checkpointer) and wait
//    (bounded) for RunFinished, leaving when a wait runs out; without it,
//    upload (the checkpointer), have one heartbeat carry the final figures,
//    and leave;
//  - the heartbeat report (clock, loss, steps, projection at most once per
//    heartbeat period, evaluations, fetch counts, final average).
//
// Not thread-safe: the runner's thread owns it. Time comes from the
// injected clock (deadlines of the waits, the projection's period, the
// PeerChooser's score recovery).
#ifndef SHOAL_SERVICES_WORKER_CORE_GOSSIP_PROTOCOL_H_
#define SHOAL_SERVICES_WORKER_CORE_GOSSIP_PROTOCOL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "services/worker/core/gossip_policy.h"
#include "services/worker/core/join_request.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

struct GossipAction {
  enum Kind {
    // Open the session and ask to take part (JoinRound(0)); a failure
    // means: join again.
    kOpenSession,
    // The session is lost: close it and join again (JoinRequest()).
    kRejoin,
    // Fetch the model of `peer_id` at `address` within `timeout` on this
    // thread, then OnFetched.
    kFetchNow,
    // The model becomes the model just fetched (a late join).
    kAdoptFetched,
    // Load checkpoint `checkpoint_id` of the store into the model, then
    // OnCheckpointLoaded.
    kLoadCheckpoint,
    // Train one step, then OnStepTrained.
    kTrainStep,
    // Feed the finished background work: the fetch's result (OnFetched),
    // a pushed model (OnPushReceived), the upload's result (OnUploaded);
    // then OnCollected.
    kCollect,
    // params += factor * (peer - base): the fetched model, from the copy
    // that was published when the fetch started.
    kInterpolate,
    // params += factor * (pushed - params): the model pushed to us.
    kInterpolatePush,
    // Evaluate the model on the test set, then OnEvaluated.
    kEvaluate,
    // Fetch the models of `peers` (failures skipped), average them with
    // this worker's model in a buffer of its own (never the live model) and
    // evaluate that, then OnConsensusEvaluated.
    kEvaluateConsensus,
    // Publish a copy of the model with (`clock`, `loss`), with the model's
    // projection (seed `projection_seed`) when `project`, then OnPublished.
    // `new_loss`: `loss` is a new training loss (the metric).
    kPublish,
    // Fetch the model of `peer_id` at `address` within `timeout` in the
    // background, from the latest publication (the base).
    kStartFetch,
    // Cancel the fetch in flight and wait for it; its result is dropped.
    kDropFetch,
    // Upload a published copy (`upload`) in the background.
    kStartUpload,
    // Wait for the upload in flight, then OnUploadDrained with its result.
    kDrainUpload,
    // Upload `upload` on this thread, then OnUploaded.
    kUploadNow,
    // Tell the coordinator that checkpoint `sequence` cannot be taken here
    // (`reason`).
    kRefuseCheckpoint,
    // Fetch the final models of `peers` (this worker's own final
    // publication at its place, up to `attempts` tries of `timeout` each),
    // add them in that order in float64, divide, and make that the model;
    // then OnFinalAveraged.
    kFinalAverage,
    // Heartbeats carry `report` from now on.
    kReport,
    // Heartbeats carry `report`; send one now and wait until it is written,
    // at most `timeout`.
    kFlushReport,
    // Leave the run (`reason`) and close the session.
    kLeave,
    // Stop: the run is over for this worker with `status`.
    kExit,
  };
  // Which published copy an upload takes.
  enum class Copy { kLatest, kFinalAverage };
  struct Upload {
    std::string run_id;
    uint64_t sequence = 0;
    uint64_t steps = 0;
    Copy copy = Copy::kLatest;
  };

  Kind kind = kExit;
  std::string peer_id;
  std::string address;
  absl::Duration timeout = absl::ZeroDuration();
  double factor = 0;
  double clock = 0;
  double loss = 0;
  bool new_loss = false;
  bool project = false;
  uint64_t projection_seed = 0;
  std::vector<shoal::v1::GossipPeer> peers;  // kEvaluateConsensus, kFinalAverage
  uint32_t attempts = 0;                     // kFinalAverage
  std::string checkpoint_id;                 // kLoadCheckpoint
  Upload upload;                             // kStartUpload, kUploadNow
  uint64_t sequence = 0;                     // kRefuseCheckpoint
  std::string reason;                        // kLeave, kRefuseCheckpoint
  shoal::v1::Heartbeat report;               // kReport, kFlushReport
  absl::Status status;                       // kExit
};
using GossipActions = std::vector<GossipAction>;

const char* GossipActionName(GossipAction::Kind kind);

// The result of a fetch, as the protocol needs it (no model bytes).
struct GossipFetchOutcome {
  std::string peer_id;
  absl::Status status;
  // The peer did not answer in time or at all: its score goes down.
  bool not_answering = false;
  double peer_clock = 0;
  double peer_loss = 0;
  // A background fetch: the state of the copy it started from.
  bool has_base = false;
  double base_clock = 0;
  double base_loss = 0;
  absl::Duration took;
  // Behind NAT: pushing our model to the partner after the fetch failed.
  bool push_failed = false;
  std::string push_error;
};

// A model pushed to us by a partner behind NAT.
struct GossipPushOutcome {
  std::string pusher;
  double clock = 0;
  double loss = 0;
  uint64_t bytes = 0;
};

struct GossipUploadOutcome {
  uint64_t sequence = 0;
  // The upload's status, and the coordinator's answer to its report.
  absl::Status upload;
  absl::Status report;
};

class GossipProtocol {
 public:
  struct Options {
    JoinIdentity identity;
    // A checkpoint store is configured (this worker can be the
    // checkpointer).
    bool has_store = false;
    // How pulls travel (the run's codec), for the log.
    std::string codec_name = "fp32";
    const Clock* clock = nullptr;  // the real clock when null
  };
  // How long the start waits for the first peer list.
  static constexpr absl::Duration kPeerListWait = absl::Seconds(2);
  // Peers tried in turn by a late join; tries of each final-average source.
  static constexpr int kLateJoinAttempts = 3;
  static constexpr uint32_t kFinalFetchAttempts = 3;

  explicit GossipProtocol(Options options);

  // Joining. The request of the next (re-)join.
  shoal::v1::JoinRequest JoinRequest() const;
  // The coordinator's answer to a join: kOpenSession, or kExit
  // (FAILED_PRECONDITION) when a re-join finds another configuration.
  GossipActions OnJoined(const shoal::v1::JoinResponse& joined);
  bool joined() const { return !worker_id_.empty(); }

  // After the first join opened the session: the model has `elements`
  // float32 parameters. Waits for the first peer list; a configuration that
  // does not parse makes the worker leave.
  GossipActions Start(uint64_t elements);
  // How long the runner may wait for an event before it calls OnTick:
  // InfinitePast while training (tick at once), the deadline of a wait.
  absl::Time wake_at() const;
  GossipActions OnTick();
  GossipActions OnDirective(const shoal::v1::CoordinatorMessage& message);
  // The session ended (not asked for by this worker).
  GossipActions OnSessionClosed(const absl::Status& why);
  // Shutdown requested.
  GossipActions OnStopRequested(const std::string& reason = "worker shut down");

  // Results of actions.
  GossipActions OnFetched(const GossipFetchOutcome& fetch);
  GossipActions OnCheckpointLoaded(const absl::Status& result, double clock);
  GossipActions OnStepTrained(double loss);
  GossipActions OnPushReceived(const GossipPushOutcome& push);
  GossipActions OnUploaded(const GossipUploadOutcome& upload);
  GossipActions OnUploadDrained(const std::optional<GossipUploadOutcome>& upload);
  GossipActions OnCollected();
  // `projection` is empty unless the publication asked for it.
  GossipActions OnPublished(bool published, std::vector<float> projection);
  GossipActions OnEvaluated(const shoal::v1::Metrics& metrics);
  // `models` averaged (this worker's included), `peer_clocks` the sum of
  // the fetched peers' clocks.
  GossipActions OnConsensusEvaluated(const shoal::v1::Metrics& metrics, uint32_t models,
                                     double peer_clocks, absl::Duration took);
  GossipActions OnFinalAveraged(const absl::Status& result, uint32_t models,
                                const std::string& hash, absl::Duration took);

  const std::string& worker_id() const { return worker_id_; }
  const GossipConfig& config() const { return g_; }
  double clock() const { return clock_value_; }
  uint64_t steps() const { return steps_; }
  double last_loss() const { return last_loss_; }
  const shoal::v1::Heartbeat& report() const { return report_; }
  // 0 = not the checkpointer; else the sequence of its next upload.
  uint64_t checkpoint_sequence() const { return ckpt_sequence_; }
  uint64_t checkpoint_due() const { return ckpt_due_; }
  bool consensus_evaluator() const { return consensus_evaluator_; }
  size_t peer_count() const { return peers_.size(); }
  double peer_score(const std::string& id) const;
  bool fetch_in_flight() const { return fetch_in_flight_; }
  bool upload_in_flight() const { return upload_in_flight_; }

  enum class Phase {
    kJoining,            // before Start
    kAwaitingPeers,      // the first peer list (kPeerListWait)
    kLateJoin,           // fetching a trained peer's model
    kLoadingCheckpoint,  // the resumed run's checkpoint
    kTraining,
    kFinishing,          // the final publication
    kAwaitingFinalList,  // GossipFinal (final_wait)
    kFinalAveraging,     // kFinalAverage, then its evaluation
    kFinalUpload,        // the checkpointer's last upload
    kAwaitingEnd,        // RunFinished (final_wait)
    kDone,
  };
  Phase phase() const { return phase_; }

 private:
  enum class AfterPublish { kNothing, kGossip, kFinish };
  GossipActions BeginLateJoin();
  GossipActions NextLateJoinStep();
  GossipActions AfterLateJoin();
  GossipActions BeginTraining();
  GossipAction Publish(AfterPublish then, bool new_loss);
  GossipActions Finish();
  GossipActions AfterFinalPublication();
  GossipActions StartFinalAverage();
  GossipActions AfterFinalAverage();
  GossipActions AfterFinalUpload();
  GossipActions LeaveAfterSteps();
  GossipActions Leave(const std::string& reason, absl::Status status);
  void ApplyUpload(const GossipUploadOutcome& upload);
  GossipAction MakeUpload(GossipAction::Kind kind, GossipAction::Copy copy) const;
  GossipAction Report(GossipAction::Kind kind = GossipAction::kReport) const;

  Options options_;
  const Clock* clock_;

  std::string worker_id_;
  shoal::v1::RunConfig config_;
  bool has_config_ = false;
  uint32_t data_rank_ = 0;
  // The first JoinResponse's checkpoint: where a resumed run starts from
  // when no peer has trained yet.
  std::string checkpoint_id_;
  GossipConfig g_;
  // The run configuration does not parse: the worker leaves at Start.
  absl::Status config_error_;
  uint64_t elements_ = 0;
  Phase phase_ = Phase::kJoining;
  // Deadline of the current wait (kAwaitingPeers, kAwaitingFinalList,
  // kAwaitingEnd).
  absl::Time deadline_ = absl::InfiniteFuture();

  std::optional<PeerChooser> chooser_;
  std::mt19937_64 rng_;
  std::map<std::string, std::string> peers_;
  bool consensus_evaluator_ = false;
  int late_join_attempts_ = 0;

  double clock_value_ = 0;
  double loss_sum_ = 0;
  uint32_t loss_count_ = 0;
  double last_loss_ = 0;
  uint64_t steps_ = 0;
  shoal::v1::Heartbeat report_;
  absl::Time next_projection_ = absl::InfinitePast();
  AfterPublish after_publish_ = AfterPublish::kNothing;
  bool fetch_in_flight_ = false;
  bool upload_in_flight_ = false;

  uint64_t ckpt_sequence_ = 0;
  uint64_t ckpt_due_ = 0;
  std::string ckpt_run_id_;

  std::optional<shoal::v1::GossipFinal> final_list_;
  // The final average succeeded: it is what the checkpointer uploads.
  bool final_ok_ = false;
  uint32_t final_models_ = 0;
  std::string final_hash_;
  absl::Duration final_took_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_GOSSIP_PROTOCOL_H_
