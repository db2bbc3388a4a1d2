// A running worker: the host of one mode's runner (runner.h). The host owns
// the process around the training: the data, the gRPC server with the Peer
// service and the supernode's relay frontend, the coordinator client
// (any CoordinatorClient: the routed gRPC client, or a test's fake), the
// session and its event queue, the Trainer and ModelMemory once the first
// join gave the run's configuration, the averaging of synchronous rounds
// (MakeAverager), the checkpoint store client, the metrics.
//
// Run() joins the run (the mode comes with the answer), builds the model,
// and hands over to the mode's runner: SyncRunner (synchronous rounds,
// core/worker_protocol.h) or GossipRunner (gossip, core/gossip_protocol.h).
// The runner's protocol makes every protocol decision; the host makes none.
//
// Directives are dispatched in one place (OnSessionMessage): what belongs
// to the host (a MemberUpdate, a UseRelay, a checkpoint's upload grant) is
// applied there at once, on the session's thread; everything else becomes
// an event of the runner, and a directive that makes the running exchange
// pointless cancels it at once (core/directive_route.h).
//
// Who owns what: the Trainer owns the parameter buffer; ModelMemory
// (core/model_memory.h) is the only code that rewrites it or the snapshot,
// in both modes, outside the exchange; ModelState says what peers may read;
// the Averager writes the average in place.
//
// Threads: Run() drives everything on the calling thread; gRPC threads serve
// peers (reading ModelState, model memory and the gossip board); the
// coordinator session has a reader and a heartbeat thread that only apply
// host directives, enqueue events and cancel the running exchange (a
// cancellation token, no polling).
#ifndef SHOAL_SERVICES_WORKER_WORKER_H_
#define SHOAL_SERVICES_WORKER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/grpc_util.h"
#include "common/member_credentials.h"
#include "common/metrics.h"
#include "common/rate_limiter.h"
#include "common/signals.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/worker/averaging.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/core/gossip_board.h"
#include "services/worker/core/idx_reader.h"
#include "services/worker/core/model_memory.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/push_box.h"
#include "services/worker/core/trainer.h"
#include "services/worker/model_syncer.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"
#include "services/worker/relay_frontend.h"
#include "services/worker/runner.h"
#include "services/worker/worker_options.h"

namespace shoal::worker {

class Worker final : private RunnerHost {
 public:
  using Options = WorkerOptions;
  // Loads the data and binds the Peer service. NOT_FOUND for a missing data
  // directory, UNAVAILABLE when the listen address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(Options options);
  ~Worker() override;

  // Joins and trains until the run finishes (OK), the worker is stopped (OK,
  // after a graceful Leave), or it is removed from the run
  // (FAILED_PRECONDITION: connection failure, asked to leave).
  absl::Status Run();
  // Writes the current model's predictions of the first `n` test images to
  // `path` (a header with the model's round and hash, then "index label
  // predicted" per line), for checking an export against the worker.
  absl::Status WritePredictions(const std::string& path, int64_t n);

  const std::string& address() const { return advertise_; }
  // The id the run gave this worker (empty before the first join). Set on
  // Run()'s thread: read it after something Run() did since (the Python
  // module: after its first turn).
  const std::string& worker_id() const { return worker_id_; }
  // The round of the averaged model this worker holds and its SHA-256: the
  // hash the members vote on (pending until the round is settled). The
  // Python module's model_hash() when its module is a local model apart
  // (overlapped rounds, fragments). Thread-safe.
  shoal::v1::PeerInfo model_info() const { return state_->Info(); }
  int port() const { return server_->port(); }
  // The metrics port, 0 when metrics_listen is off.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // The reason the run's status gives for this worker leaving when it is
  // stopped next (the Python API's close(reason)); call before the stop.
  void SetStopReason(std::string reason);

 private:
  explicit Worker(Options options);

  // RunnerHost.
  bool PopEvent(WorkerEvent* event, absl::Duration timeout) override;
  bool StopRequested() const override;
  std::string StopReason() const override;
  std::optional<absl::Status> Join(const shoal::v1::JoinRequest& request) override;
  absl::Status OpenSession() override;
  absl::Status JoinRound(uint64_t carried_round) override;
  void CloseSession() override;
  void Leave(const std::string& reason) override;
  void SetHeartbeatReport(const shoal::v1::Heartbeat& report) override;
  bool SendHeartbeatNow(absl::Duration timeout) override;
  void SetInterruptible(CancellationToken* token) override;
  void CountServedBytes() override;

  // The one dispatcher of the session's messages (see the class comment).
  void OnSessionMessage(const shoal::v1::CoordinatorMessage& message);
  void FillHeartbeat(shoal::v1::Heartbeat* heartbeat);
  void Push(WorkerEvent event);
  // One Join call; its error says what to check.
  absl::StatusOr<shoal::v1::JoinResponse> JoinOnce(const shoal::v1::JoinRequest& request);
  // Takes the id, credential and routing a join answer gives.
  void AcceptJoin(const shoal::v1::JoinResponse& joined);
  // The model's layout on every join once it is known (JoinRequest.layout).
  void AddDeclaration(shoal::v1::JoinRequest* request) const;
  // After BuildModel: this worker's layout must be the run's; when the run
  // has none yet, joins once more declaring it and the initial model
  // (`joined` becomes that answer).
  absl::Status DeclareModel(shoal::v1::JoinResponse* joined);
  // After the first join: the model, the averaging (synchronous rounds),
  // and the mode's runner.
  absl::Status BuildModel(const shoal::v1::JoinResponse& joined);
  // A TorchScript run's model file: from up to 3 holders of the model
  // (random order), then the coordinator; verified against its SHA-256.
  absl::StatusOr<std::string> FetchRunModelFile(const shoal::v1::JoinResponse& joined);
  RunnerParts Parts();

  Options options_;
  const Clock* const clock_;
  JoinIdentity identity_;
  FashionMnist data_;
  std::unique_ptr<ModelState> state_;
  std::unique_ptr<RateLimiter> upload_limiter_;
  // Serves the encoded exchange's slices (declared before the service that
  // reads it).
  std::unique_ptr<EncodedStore> encoded_store_;
  // Contributions pushed by participants behind NAT (core/push_box.h).
  std::unique_ptr<PushBox> push_box_;
  // Gossip mode: the published copies the Peer service serves.
  GossipBoard gossip_board_;
  // The coordinator says we are outbound-only (JoinResponse).
  bool outbound_only_ = false;
  // Member credentials (common/member_credentials.h): the ones this worker's
  // Peer service accepts (from the session's MemberUpdates) and its own,
  // sent with its Peer calls. Both before peers_ and peer_service_, which
  // point at them.
  MemberSet members_;
  MemberCredentialHolder credential_;
  std::unique_ptr<PeerService> peer_service_;
  // The control-plane relay this worker serves when it is its zone's
  // supernode (docs/SUPERNODES.md "Relay"); registered on server_, which
  // it outlives.
  std::unique_ptr<RelayFrontend> relay_frontend_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<Metrics> metrics_;  // when metrics_listen is set
  // PeerService::sent() already added to the Prometheus counters.
  uint64_t sent_reported_[3] = {0, 0, 0};
  std::unique_ptr<GrpcPeerClient> peers_;
  // Direct, or through the zone's supernode after a UseRelay (--relay=on);
  // or the test's (WorkerOptions::coordinator_client).
  std::shared_ptr<CoordinatorClient> coordinator_;
  std::unique_ptr<checkpoint::GrpcCheckpointClient> store_;  // when the run has a store
  std::string advertise_;
  // From the latest JoinResponse: this worker's id, and the session's
  // heartbeat period (RunConfig.heartbeat_interval_ms).
  std::string worker_id_;
  uint32_t heartbeat_ms_ = 0;

  std::unique_ptr<Trainer> trainer_;  // created after the first Join (needs the config)
  // Overlapped rounds or fragments (RunConfig.exchange.overlap,
  // .fragments): the trainer's buffer is the local model, and this holds
  // the agreed one memory_ manages. Null otherwise. Reset explicitly in the
  // destructor (its stop is a child of stop_token_, declared later).
  std::unique_ptr<LocalTraining> local_;
  // Its layout, declared with every join once the model is built.
  std::optional<shoal::v1::ModelLayout> layout_;
  std::unique_ptr<ModelMemory> memory_;  // with the trainer
  // The run's codec: how the synchronous exchange's changes and gossip
  // pulls travel (with the trainer).
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Averaging> averaging_;  // synchronous rounds
  SyncProgress sync_progress_;
  // Peers that sent bad chunks, for the next heartbeat.
  BadChunkLog bad_chunks_;
  // The mode, from the first join on (its protocol decides).
  std::unique_ptr<Runner> runner_;

  // Cancelled on shutdown (signal or options.stop); the parent of every
  // exchange's token.
  CancellationToken stop_token_{ShutdownSignal::Token()};
  uint64_t stop_registration_ = 0;

  mutable absl::Mutex mu_;
  std::deque<WorkerEvent> events_ ABSL_GUARDED_BY(mu_);
  std::string stop_reason_ ABSL_GUARDED_BY(mu_) = "worker shut down";
  // Interrupting directives received and not yet handled by the runner:
  // an exchange that starts while one is queued is cancelled at once.
  int unhandled_interrupts_ ABSL_GUARDED_BY(mu_) = 0;
  CancellationToken* interruptible_ ABSL_GUARDED_BY(mu_) = nullptr;
  // What the heartbeats carry besides the catch-up's progress (gossip).
  absl::Mutex report_mu_;
  std::optional<shoal::v1::Heartbeat> report_ ABSL_GUARDED_BY(report_mu_);
  // The coordinator session this worker has open (counted up at every open
  // and every close of its own): the end of a session it closed or replaced
  // itself is not a lost session. Found by the soak: the end of a live
  // session closed for a re-join was reported after the re-join, which
  // re-joined again, closing the next live session: a re-join every few
  // ms, a new worker id each time, for the whole run.
  std::atomic<uint64_t> session_gen_{0};
  // Closes the session as this worker's own doing (its end is not reported).
  void EndOwnSession();
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_WORKER_H_
