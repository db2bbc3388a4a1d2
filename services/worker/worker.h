// A running worker: the process around the round protocol. It loads the
// data, serves its Peer service, and carries out the actions that its
// protocol (core/worker_protocol.h) returns for each directive of the
// coordinator and each result of its own work: train, report, probe,
// average (through an Averager), catch up, upload. It makes no protocol
// decision of its own.
//
// Who owns what: the Trainer owns the parameter buffer; ModelMemory
// (core/model_memory.h) is the only code that rewrites it or the snapshot
// outside the exchange; ModelState says what peers may read; the Averager
// writes the average in place.
//
// Threads: Run() drives everything on the calling thread; gRPC threads serve
// peers (reading ModelState and model memory); the coordinator session has a
// reader and a heartbeat thread that only enqueue events, and cancel the
// running exchange when a directive makes it pointless (a cancellation
// token, no polling).
#ifndef SHOAL_SERVICES_WORKER_WORKER_H_
#define SHOAL_SERVICES_WORKER_WORKER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/grpc_util.h"
#include "common/metrics.h"
#include "common/rate_limiter.h"
#include "common/signals.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/core/averager.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/gossip_board.h"
#include "services/worker/core/idx_reader.h"
#include "services/worker/core/model_memory.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/trainer.h"
#include "services/worker/core/worker_protocol.h"
#include "services/worker/core/zone_measurements.h"
#include "services/worker/exchanger.h"
#include "services/worker/model_syncer.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"
#include "services/worker/relay_frontend.h"
#include "services/worker/routed_coordinator_client.h"

namespace shoal::worker {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:50051";
  // Who may read from this worker's Peer service (--token_file: the run
  // token; common/auth.h). The token this worker sends is process-wide
  // (SetProcessToken). Open by default.
  TokenGate gate;
  std::string listen = "127.0.0.1:50060";
  // Address peers use to reach us; empty = the listen host and bound port.
  std::string advertise;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  // --dataset: "" (Fashion-MNIST in data_dir), "idx:DIR" or "npy:DIR" (core/dataset.h).
  std::string dataset;
  std::string name;
  // --zone: where this worker sits (common/zone.h); empty = the root.
  std::string zone;
  // --outbound_only: this worker cannot accept connections (behind NAT).
  bool outbound_only = false;
  int torch_threads = 1;
  // Caps the bytes per second this worker serves to peers (0 = no cap).
  double upload_rate_mbps = 0;
  // Reads one caller host may run at once on the Peer service; 0 = no limit.
  uint32_t max_reads_per_peer = 0;
  uint32_t eval_limit = 0;
  // Give up when the coordinator cannot be reached at start for this long.
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Time to reach each peer of a plan before reporting it unreachable.
  absl::Duration probe_timeout = absl::Seconds(3);
  ExchangeOptions exchange;
  SyncOptions sync;
  // Serves Prometheus metrics on this "host:port" (port 0 = any); empty = off.
  std::string metrics_listen;
  // Time source of the protocol, the exchange and the syncer (the real
  // clock when null).
  const Clock* clock = nullptr;
  // Cancelled to stop Run() gracefully (tests; may be null). The shutdown
  // signal (SIGTERM, SIGINT) stops it too.
  CancellationToken* stop = nullptr;
  // Test seam, never set by shoal-worker: rewrites this worker's freshly
  // trained model (all `n` elements) right before it becomes readable as its
  // contribution of `round`. The misbehaving peer of the poisoning test
  // (tests/support/poison_worker.cc) scales it; the exchange then overwrites
  // the model with the round's averages as for any worker.
  std::function<void(uint64_t round, float* params, uint64_t n)> contribution_transform;
};

class Worker {
 public:
  using Options = WorkerOptions;
  // Loads the data and binds the Peer service. NOT_FOUND for a missing data
  // directory, UNAVAILABLE when the listen address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(Options options);
  ~Worker();

  // Joins and trains until the run finishes (OK), the worker is stopped (OK,
  // after a graceful Leave), or it is removed from the run
  // (FAILED_PRECONDITION: connection failure, asked to leave).
  absl::Status Run();
  // Writes the current model's predictions of the first `n` test images to
  // `path` (a header with the model's round and hash, then "index label
  // predicted" per line), for checking an export against the worker.
  absl::Status WritePredictions(const std::string& path, int64_t n);

  const std::string& address() const { return advertise_; }
  int port() const { return server_->port(); }
  // The metrics port, 0 when metrics_listen is off.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }

 private:
  struct Event {
    enum Kind { kMessage, kSessionClosed, kStop } kind;
    shoal::v1::CoordinatorMessage message;
    absl::Status status;
  };

  explicit Worker(Options options);
  bool StopRequested() const;
  void Push(Event event);
  bool Pop(Event* event, absl::Duration timeout);

  // Carries out `actions` (and the actions their results lead to) in
  // order. Returns the status of a kExit, or nullopt to go on.
  std::optional<absl::Status> Execute(Actions actions);
  // Carries out one action; its result's follow-up actions go to `next`.
  std::optional<absl::Status> ExecuteOne(Action& action, Actions* next);
  // Join (with retries while the coordinator is unreachable or restarting),
  // then the response's actions; the first join also builds the model.
  std::optional<absl::Status> JoinWithRetry(const Action& join);
  absl::Status BuildModel(const shoal::v1::JoinResponse& joined);
  // A TorchScript run's model file: from up to 3 holders of the model
  // (random order), then the coordinator; verified against its SHA-256.
  absl::StatusOr<std::string> FetchRunModelFile(const shoal::v1::JoinResponse& joined);
  // PeerService::sent() already added to the Prometheus counters.
  uint64_t sent_reported_[3] = {0, 0, 0};
  absl::Status OpenSession();
  std::vector<std::string> UnreachablePeers(const shoal::v1::RoundPlan& plan, uint32_t retry);
  absl::Status Exchange(const Action& action, std::string* hash);
  void Upload(const Action& action);
  // The outer optimizer's momentum of `a.round` from a holder (catch-up).
  absl::Status PullOuterState(const Action& a);
  // The same from checkpoint `a.checkpoint_id` of the store (a restart from
  // the store); zero when the checkpoint's run kept no momentum.
  absl::Status LoadOuterStateFromCheckpoint(const Action& a);
  // Serves the committed outer momentum as the state of the model of `round`.
  void PublishOuterState(uint64_t round);
  absl::Status PullModel(const Action& action, float* dst, uint64_t total);
  // Gossip mode (docs/GOSSIP.md): trains without stopping, publishes its
  // model every gossip_every steps, fetches and interpolates peers' models
  // in the background. Returns like Run().
  absl::Status RunGossip();
  // Gossip mode, a resumed run: loads checkpoint `id`'s model into
  // params[0, n) (every layer checked against its SHA-256, the whole model
  // against the manifest's model hash) and sets *clock to its clock.
  absl::Status LoadGossipCheckpoint(const std::string& id, float* params, uint64_t n,
                                    double* clock);

  Options options_;
  const Clock* const clock_;
  FashionMnist data_;
  std::unique_ptr<ModelState> state_;
  std::unique_ptr<RateLimiter> upload_limiter_;
  // Serves the encoded exchange's slices (declared before the service that
  // reads it).
  std::unique_ptr<EncodedStore> encoded_store_;
  // Contributions pushed by participants behind NAT (core/push_box.h).
  std::unique_ptr<PushBox> push_box_;
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
  std::unique_ptr<GrpcPeerClient> peers_;
  // Direct, or through the zone's supernode after a UseRelay (--relay=on).
  std::unique_ptr<RoutedCoordinatorClient> coordinator_;
  std::unique_ptr<checkpoint::GrpcCheckpointClient> store_;  // when the run has a store
  std::string advertise_;

  WorkerProtocol protocol_;
  std::unique_ptr<Trainer> trainer_;     // created after the first Join (needs the config)
  std::unique_ptr<ModelMemory> memory_;  // with the trainer
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<OuterStep> outer_;  // the run's outer optimizer (encoded exchange)
  // Set when changes travel (a codec or an outer optimizer): the outer
  // state is then published with every committed round.
  ExchangeParts encoded_parts_;
  // The averaging pipeline (exchanger.h).
  std::unique_ptr<Averager> averager_;
  SyncProgress sync_progress_;
  // Gossip mode: the published copies the Peer service serves, and what
  // the heartbeats report (filled by RunGossip, read by the heartbeat
  // thread).
  GossipBoard gossip_board_;
  absl::Mutex gossip_mu_;
  std::optional<shoal::v1::Heartbeat> gossip_report_ ABSL_GUARDED_BY(gossip_mu_);
  // The latest checkpoint the first Join named (gossip mode: where a
  // resumed run's workers start from when no peer has trained yet).
  std::string joined_checkpoint_id_;

  // Cancelled on shutdown (signal or options.stop); the parent of every
  // exchange's token.
  CancellationToken stop_token_{ShutdownSignal::Token()};
  uint64_t stop_registration_ = 0;
  AveragingStats last_stats_;  // of the latest exchange
  // Step time and bandwidth for the supernode election (ReportRoundDone).
  ZoneMeasurements zone_measurements_;
  absl::Mutex mu_;
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  // Interrupting directives received and not yet handled by Run(): an
  // exchange that starts while one is queued is cancelled at once.
  int unhandled_interrupts_ ABSL_GUARDED_BY(mu_) = 0;
  CancellationToken* exchange_token_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_WORKER_H_
