// A running worker: loads its data, serves its Peer service, joins the run
// and follows the coordinator's directives round after round: train, report
// ready, exchange, report the hash of the averaged model.
//
// Threads: Run() drives everything on the calling thread; gRPC threads serve
// peers (reading ModelState and model memory); the coordinator session has a
// reader and a heartbeat thread that only enqueue events.
#ifndef SHOAL_SERVICES_WORKER_WORKER_H_
#define SHOAL_SERVICES_WORKER_WORKER_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/core/idx_reader.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/plan_list.h"
#include "services/worker/core/trainer.h"
#include "services/worker/exchanger.h"
#include "services/worker/model_syncer.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"

namespace shoal::worker {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:50051";
  std::string listen = "127.0.0.1:50060";
  // Address peers use to reach us; empty = the listen host and bound port.
  std::string advertise;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string name;
  int torch_threads = 1;
  // Caps the bytes per second this worker serves to peers (0 = no cap).
  double upload_rate_mbps = 0;
  uint32_t eval_limit = 0;
  // Give up when the coordinator cannot be reached at start for this long.
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Time to reach each peer of a plan before reporting it unreachable.
  absl::Duration probe_timeout = absl::Seconds(3);
  ExchangeOptions exchange;
  SyncOptions sync;
  // Set to stop Run() (tests); the binary uses the shutdown signal too.
  const std::atomic<bool>* stop = nullptr;
};

class Worker {
 public:
  // Loads the data and binds the Peer service. NOT_FOUND for a missing data
  // directory, UNAVAILABLE when the listen address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(WorkerOptions options);
  ~Worker();

  // Joins and trains until the run finishes (OK), the worker is stopped (OK,
  // after a graceful Leave), or it is removed from the run
  // (FAILED_PRECONDITION: connection failure, asked to leave).
  absl::Status Run();

  const std::string& address() const { return advertise_; }

 private:
  struct Event {
    enum Kind { kMessage, kSessionClosed } kind;
    shoal::v1::CoordinatorMessage message;
    absl::Status status;
  };

  explicit Worker(WorkerOptions options) : options_(std::move(options)) {}
  bool StopRequested() const;
  absl::Status JoinRun(const std::string& previous_id);
  absl::Status OpenSession();
  void Push(Event event);
  bool Pop(Event* event, absl::Duration timeout);
  absl::Status OnRoundStart(const shoal::v1::RoundStart& start);
  void OnRoundPlan(const shoal::v1::RoundPlan& plan);
  void ProbePeers(uint32_t retry);
  void OnStartSharing(const shoal::v1::StartWeightSharing& start);
  // Pulls the model of `round` from `holders` when ours is another one; with
  // no holder, loads checkpoint `checkpoint_id` when it is of that round.
  void CatchUp(uint64_t round, const std::string& hash, const std::vector<std::string>& holders,
               const std::string& checkpoint_id, uint64_t checkpoint_round);
  // Uploads the snapshot (the averaged model of `request.round`).
  void UploadCheckpoint(const shoal::v1::CheckpointRequest& request);
  // Discards the local work of the current round.
  void DropRound(const std::string& why);
  // The exchange of round_ ended here: its average becomes this worker's
  // model, pending until the coordinator agrees (see pending_).
  void HoldPending(uint64_t round, const std::string& hash);
  // The coordinator names the run's agreed model: a pending round with that
  // round and hash (or older than it) is kept (committed); otherwise it is
  // rolled back with the local work.
  void Settle(uint64_t agreed_round, const std::string& agreed_hash);
  // The pending round is agreed: the snapshot buffer takes its average.
  void CommitPending();
  // The pending round is void (re-plan, abort, sat out): back to the
  // previous agreed model's round and hash; the snapshot buffer still holds
  // it. The parameters are restored by the caller (DropRound or a re-plan).
  void UncommitPending(const std::string& why);
  // Waits (bounded) until gRPC has given back every chunk of `buffer` lent
  // to peers, before the worker rewrites it outside the exchange protocol.
  // Call after closing the buffer's window in state_ (BeginTraining,
  // Unready, Abort, BeginSnapshotUpdate).
  void AwaitLentChunks(ModelState::Buffer buffer);
  absl::Status Rejoin(const std::string& why);
  // True for directives that make a running exchange pointless.
  static bool Interrupts(const shoal::v1::CoordinatorMessage& msg);

  WorkerOptions options_;
  FashionMnist data_;
  std::unique_ptr<Trainer> trainer_;  // created after Join (needs the run config)
  std::unique_ptr<ModelState> state_;
  std::unique_ptr<RateLimiter> upload_limiter_;
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<GrpcPeerClient> peers_;
  std::unique_ptr<GrpcCoordinatorClient> coordinator_;
  std::unique_ptr<checkpoint::GrpcCheckpointClient> store_;  // when the run has a store
  std::string advertise_;

  std::string worker_id_;
  shoal::v1::RunConfig config_;
  uint64_t round_ = 0;        // round being worked on
  uint64_t model_round_ = 0;  // round of the averaged model we hold
  std::string model_hash_;
  std::vector<float> snapshot_;  // the averaged model of model_round_ (see pending_)
  // True from the end of an exchange until the coordinator agrees on the
  // round (RoundComplete, or a later RoundStart, checkpoint request or
  // Join naming it) or voids it (a new plan attempt, RoundAborted,
  // RoundMissed). Meanwhile model_round_ is that round, the parameters hold
  // its average and are served as the snapshot, and snapshot_ keeps the
  // previous agreed model (agreed_round_, agreed_hash_) to go back to.
  bool pending_ = false;
  uint64_t agreed_round_ = 0;
  std::string agreed_hash_;
  std::vector<float> contribution_;  // the trained model of round_, for re-plans
  uint64_t contribution_round_ = 0;
  shoal::v1::RoundPlan plan_;  // the current plan of round_
  PlanList plan_list_;         // the participant list of the latest full plan
  double train_seconds_ = 0;
  double train_loss_ = 0;
  uint32_t data_rank_ = 0;
  bool has_data_rank_ = false;
  SyncProgress sync_progress_;
  // Interrupting directives read by the session thread vs. handled by Run().
  std::atomic<uint64_t> interrupts_seen_{0};
  uint64_t interrupts_handled_ = 0;

  absl::Mutex mu_;
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_WORKER_H_
