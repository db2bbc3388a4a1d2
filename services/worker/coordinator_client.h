// The worker's calls to the coordinator, behind an interface so that tests
// can fake the coordinator. Every unary call has a deadline; idempotent calls
// are retried on UNAVAILABLE with capped, jittered backoff.
#ifndef SHOAL_SERVICES_WORKER_COORDINATOR_CLIENT_H_
#define SHOAL_SERVICES_WORKER_COORDINATOR_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/member_credentials.h"
#include "shoal/v1/coordinator.grpc.pb.h"

namespace shoal::worker {

class CoordinatorClient {
 public:
  using MessageHandler = std::function<void(const shoal::v1::CoordinatorMessage&)>;
  using ClosedHandler = std::function<void(const absl::Status&)>;
  // Fills the progress fields of each heartbeat.
  using HeartbeatFiller = std::function<void(shoal::v1::Heartbeat*)>;

  virtual ~CoordinatorClient() = default;
  virtual absl::StatusOr<shoal::v1::JoinResponse> Join(const shoal::v1::JoinRequest& request) = 0;
  // `carried_round`: the round whose training this worker finished before
  // its session broke (JoinRoundRequest.carried_round; 0 = none).
  virtual absl::StatusOr<uint64_t> JoinRound(const std::string& worker_id, uint64_t round,
                                             uint64_t carried_round = 0) = 0;
  virtual absl::Status ReportReady(const shoal::v1::ReportReadyRequest& request) = 0;
  virtual absl::Status ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request) = 0;
  virtual absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request) = 0;
  // An audit's replay (AuditRequest, services/worker/audit_replay.h).
  virtual absl::Status ReportAudit(const shoal::v1::ReportAuditRequest& request) = 0;
  virtual absl::Status ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request) = 0;
  virtual absl::Status Leave(const std::string& worker_id, const std::string& reason) = 0;
  // Opens the session stream: sends Hello, then a heartbeat every
  // `heartbeat`. Directives go to `on_message` (from a reader thread); when
  // the stream ends, `on_closed` gets why. One session at a time.
  virtual absl::Status OpenSession(const std::string& worker_id, absl::Duration heartbeat,
                                   MessageHandler on_message, ClosedHandler on_closed,
                                   HeartbeatFiller fill = nullptr) = 0;
  // Ends the session (if any) and waits for its threads.
  virtual void CloseSession() = 0;
  // Writes a heartbeat (filled as the periodic ones are) on the session now
  // rather than at its next period, and waits until it is written, at most
  // `timeout`. False when there is no session, it ended, or the time ran
  // out. (A worker about to leave lets one heartbeat carry its final
  // figures.)
  virtual bool SendHeartbeatNow(absl::Duration timeout) = 0;
  // A UseRelay directive (docs/SUPERNODES.md "Relay"): the session and the
  // calls go through the supernode at `address` (empty: directly). Returns
  // at once. A client that cannot relay stays direct (the default).
  virtual void UseRelay(const std::string& relay_id, const std::string& address) {}
};

// Trailing-metadata key of the leader hint a standby coordinator sends.
inline constexpr char kLeaderHintKey[] = "shoal-leader";

struct CoordinatorClientOptions {
  // "host:port", or several separated by commas (coordinator replicas,
  // docs/REPLICAS.md), or a DNS name that resolves to several. A call
  // refused with UNAVAILABLE moves to the leader named in the trailing
  // metadata key "shoal-leader", or else to the next address.
  std::string address;
  // Deadline of each unary call.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Retries of UNAVAILABLE calls stop after this long.
  absl::Duration retry_window = absl::Seconds(30);
  // Longest pause between two retries of an UNAVAILABLE call (jittered,
  // growing from 50 ms): bounds how long a worker keeps missing a new
  // leader after a failover.
  absl::Duration max_backoff = absl::Milliseconds(250);
  // Sent as x-shoal-member with every call and session (null: none). Set
  // for a supernode's relay (services/worker/relay_frontend.h), which
  // checks it; outlives the client.
  const MemberCredentialHolder* credential = nullptr;
  // Stamps heartbeats (sent_unix_ms); the relay cooldown of
  // RoutedCoordinatorClient reads it too.
  const Clock* clock = RealClock::Get();
  // Ends the retries of the unary calls when cancelled (CANCELLED): a worker
  // told to stop while it joins, re-joins or reports to a coordinator that is
  // gone stops then, not after the window. Leave (one attempt of its own) is
  // not affected: a worker that stops still says so. May be null; outlives
  // the client.
  CancellationToken* stop = nullptr;
};

// Thread-safe.
class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(CoordinatorClientOptions options);
  ~GrpcCoordinatorClient() override;

  absl::StatusOr<shoal::v1::JoinResponse> Join(const shoal::v1::JoinRequest& request) override;
  absl::StatusOr<uint64_t> JoinRound(const std::string& worker_id, uint64_t round,
                                     uint64_t carried_round = 0) override;
  absl::Status ReportReady(const shoal::v1::ReportReadyRequest& request) override;
  absl::Status ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request) override;
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request) override;
  absl::Status ReportAudit(const shoal::v1::ReportAuditRequest& request) override;
  absl::Status ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request) override;
  absl::Status Leave(const std::string& worker_id, const std::string& reason) override;
  absl::Status OpenSession(const std::string& worker_id, absl::Duration heartbeat,
                           MessageHandler on_message, ClosedHandler on_closed,
                           HeartbeatFiller fill = nullptr) override;
  // OpenSession with a Hello of the caller's (its session number and
  // resume counts: the relay's routing, RoutedCoordinatorClient).
  absl::Status OpenSessionWith(const shoal::v1::Hello& hello, absl::Duration heartbeat,
                               MessageHandler on_message, ClosedHandler on_closed,
                               HeartbeatFiller fill = nullptr);
  void CloseSession() override;
  bool SendHeartbeatNow(absl::Duration timeout) override;

 private:
  struct Session;
  // Cancels `session` (may be null) and joins its threads.
  static void EndSession(std::shared_ptr<Session> session);
  // Calls `call(ctx)` with a fresh deadline until it is not UNAVAILABLE or the
  // retry window closes (or options_.stop is cancelled).
  absl::Status CallWithRetry(
      const std::function<grpc::Status(shoal::v1::Coordinator::Stub*, grpc::ClientContext*)>& call,
      absl::Duration window);

  // The stub of the coordinator calls go to now.
  shoal::v1::Coordinator::Stub* stub();
  // After an UNAVAILABLE from `used`: follow the leader hint in `ctx`'s
  // trailing metadata, or move to the next configured address.
  void MoveOn(shoal::v1::Coordinator::Stub* used, const grpc::ClientContext& ctx);

  const CoordinatorClientOptions options_;
  std::vector<std::string> addresses_;
  absl::Mutex stubs_mu_;
  // One stub per address ever used (configured or hinted); never removed.
  std::map<std::string, std::unique_ptr<shoal::v1::Coordinator::Stub>> stubs_
      ABSL_GUARDED_BY(stubs_mu_);
  std::string current_ ABSL_GUARDED_BY(stubs_mu_);
  absl::Mutex mu_;
  // Shared with SendHeartbeatNow's waits, which CloseSession wakes.
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_COORDINATOR_CLIENT_H_
