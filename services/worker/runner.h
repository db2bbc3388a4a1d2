// The seam between the worker's host (worker.h) and its mode. A Runner is
// one mode of training: the pure protocol that decides
// (core/worker_protocol.h for synchronous rounds, core/gossip_protocol.h
// for gossip) and the code that carries its actions out (sync_runner.h,
// gossip_runner.h). The host owns everything a runner uses (RunnerParts)
// and offers what only it can do (RunnerHost): the event queue the
// session's directives arrive in, joining, the session, the heartbeats.
// A new mode is a new Runner, not a branch in the host.
//
// Threads: a runner runs on the thread that calls Worker::Run(). The host
// calls OnJoined from inside RunnerHost::Join on that same thread.
#ifndef SHOAL_SERVICES_WORKER_RUNNER_H_
#define SHOAL_SERVICES_WORKER_RUNNER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/worker/averaging.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/core/gossip_board.h"
#include "services/worker/core/join_request.h"
#include "services/worker/core/model_memory.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/push_box.h"
#include "services/worker/core/trainer.h"
#include "services/worker/local_training.h"
#include "services/worker/model_syncer.h"
#include "services/worker/peer_client.h"
#include "services/worker/worker_options.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

// What the runner's thread waits for: a directive of the session, the
// session's end, or the shutdown.
struct WorkerEvent {
  enum Kind { kMessage, kSessionClosed, kStop } kind = kStop;
  shoal::v1::CoordinatorMessage message;
  absl::Status status;   // kSessionClosed: why
  uint64_t session = 0;  // kSessionClosed: the host's session it ended
};

// What a runner asks of its host (Worker implements it).
class RunnerHost {
 public:
  virtual ~RunnerHost() = default;
  // The next event, or false after `timeout` without one.
  virtual bool PopEvent(WorkerEvent* event, absl::Duration timeout) = 0;
  // The worker is being stopped (signal, WorkerOptions::stop); the token is
  // already cancelled.
  virtual bool StopRequested() const = 0;
  // Why (Worker::SetStopReason; "worker shut down" for a signal): the
  // Leave's reason, which the status shows.
  virtual std::string StopReason() const = 0;
  // Joins the run with `request` (a re-join: the runner's JoinRequest()),
  // retrying while the coordinator is unreachable or restarting; each
  // answer goes to the runner's OnJoined. An exit status, or nullopt to go
  // on.
  virtual std::optional<absl::Status> Join(const shoal::v1::JoinRequest& request) = 0;
  // Opens the session: heartbeats (with a catch-up's progress) and
  // directives. On failure the error is returned: join again.
  virtual absl::Status OpenSession() = 0;
  // On the open session, asks to take part (JoinRound(0, carried_round)).
  // On failure the session is closed and the error returned: join again.
  virtual absl::Status JoinRound(uint64_t carried_round) = 0;
  virtual void CloseSession() = 0;
  // Leaves the run: nothing more is served, Leave(reason), the session
  // closes.
  virtual void Leave(const std::string& reason) = 0;
  // Heartbeats carry `report` (gossip figures) from now on.
  virtual void SetHeartbeatReport(const shoal::v1::Heartbeat& report) = 0;
  // Sends a heartbeat now and waits until it is written, at most `timeout`.
  virtual bool SendHeartbeatNow(absl::Duration timeout) = 0;
  // While `token` is set (null clears it), a directive that interrupts the
  // running work (WorkerProtocol::Interrupts) cancels it at once, from the
  // session's thread; one already queued cancels it when it is set.
  virtual void SetInterruptible(CancellationToken* token) = 0;
  // Adds the bytes the Peer service sent since the last call to the
  // metrics (once per action, never per chunk).
  virtual void CountServedBytes() = 0;
};

// The host's parts a runner uses; they outlive it.
struct RunnerParts {
  const WorkerOptions* options = nullptr;
  const Clock* clock = nullptr;
  JoinIdentity identity;
  // Cancelled on shutdown; the parent of every cancellable work's token.
  CancellationToken* stop = nullptr;
  CoordinatorClient* coordinator = nullptr;
  PeerClient* peers = nullptr;
  ModelState* state = nullptr;
  ModelMemory* memory = nullptr;
  Trainer* trainer = nullptr;
  // Null when the run has no checkpoint store.
  checkpoint::CheckpointClient* store = nullptr;
  PushBox* push_box = nullptr;
  // Gossip: the published copies the Peer service serves.
  GossipBoard* board = nullptr;
  // The coordinator says this worker cannot accept connections (the first
  // JoinResponse).
  bool outbound_only = false;
  // The run's codec: gossip pulls travel in it (docs/GOSSIP.md,
  // "Compressed pulls").
  const Codec* codec = nullptr;
  // The synchronous exchange (MakeAverager; null in gossip mode).
  Averaging* averaging = nullptr;
  // A catch-up's progress, read by the heartbeats.
  SyncProgress* sync_progress = nullptr;
  // Overlapped rounds or fragments (RunConfig.exchange.overlap,
  // .fragments): the trainer trains the local model there, and `memory`
  // manages its other buffer, the agreed model. Null otherwise.
  LocalTraining* local = nullptr;
};

class Runner {
 public:
  virtual ~Runner() = default;
  // The protocol knows its worker id (a join was answered).
  virtual bool joined() const = 0;
  // The request of a re-join.
  virtual shoal::v1::JoinRequest JoinRequest() = 0;
  // The coordinator's answer to a join: the protocol's actions, carried out
  // here, open the session (RunnerHost::OpenSession). An error makes the
  // host join again; `*exit` set ends the run with that status.
  virtual absl::Status OnJoined(const shoal::v1::JoinResponse& joined,
                                std::optional<absl::Status>* exit) = 0;
  // After the first join: runs until the run ends for this worker (OK),
  // the worker is stopped (OK, after leaving), or it is removed
  // (FAILED_PRECONDITION).
  virtual absl::Status Run() = 0;
  // The round of the model the worker holds (0 in gossip mode).
  virtual uint64_t model_round() const = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_RUNNER_H_
