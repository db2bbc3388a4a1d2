// The worker's coordinator client with the control-plane relay
// (docs/SUPERNODES.md "Relay"): the session and the round calls go to the
// coordinator directly, or, after a UseRelay names one, through the zone's
// supernode (its RelayFrontend serves the same Coordinator methods). A
// direct path always remains: when the relayed session ends (the supernode
// died, its stream with the coordinator broke), a direct session opens at
// once, and a relayed call refused with UNAVAILABLE or PERMISSION_DENIED is
// made again directly; the coordinator keeps the member's lease and its
// directives meanwhile, so no round is lost.
//
// Without a UseRelay it is the direct client, unchanged: every call and
// every session event passes straight through.
//
// Route changes run on the client's own router thread (a session's
// handlers run on that session's reader thread, which cannot close its
// own session). Thread-safe.
#ifndef SHOAL_SERVICES_WORKER_ROUTED_COORDINATOR_CLIENT_H_
#define SHOAL_SERVICES_WORKER_ROUTED_COORDINATOR_CLIENT_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/worker/coordinator_client.h"

namespace shoal::worker {

class RoutedCoordinatorClient : public CoordinatorClient {
 public:
  // `direct`: the coordinator's client options; relay clients copy them
  // with the relay's address, a retry window of at most
  // `relay_retry_window` (a failing relay is left quickly) and the
  // member's credential (`credential`, may be null; outlives this).
  RoutedCoordinatorClient(CoordinatorClientOptions direct, const MemberCredentialHolder* credential,
                          absl::Duration relay_retry_window = absl::Seconds(2));
  ~RoutedCoordinatorClient() override;

  // A UseRelay arrived: go through `address` (empty: go direct). Returns at
  // once; the router thread moves the session. A relay address that failed
  // less than kRelayCooldown ago is not tried at once: the member stays
  // direct and tries it when the cooldown is over (unless another UseRelay
  // came meanwhile). A relayed session that fails is likewise tried again
  // after the cooldown.
  void UseRelay(const std::string& relay_id, const std::string& address) override;
  // The relay the session goes through now (empty: direct).
  std::string relay() const;

  // How many times a relayed session failed and the member went direct.
  uint64_t fall_backs() const;

  static constexpr absl::Duration kRelayCooldown = absl::Seconds(10);

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
  void CloseSession() override;
  bool SendHeartbeatNow(absl::Duration timeout) override;

 private:
  // Makes `call` through the relay when the session is relayed, and again
  // directly when the relay refuses it as unavailable or not its member's.
  absl::Status Routed(const std::function<absl::Status(CoordinatorClient*)>& call);
  // Opens the session through `client` with handlers of generation `gen`.
  absl::Status OpenOn(GrpcCoordinatorClient* client, uint64_t gen);
  void Closed(uint64_t gen, const absl::Status& status);
  void Post(std::function<void()> task);
  void Router();
  // Router tasks.
  void MoveTo(const std::string& relay_id, const std::string& address);
  void FallBack(uint64_t gen, const absl::Status& why);

  const CoordinatorClientOptions relay_options_;
  GrpcCoordinatorClient direct_;

  mutable absl::Mutex mu_;
  // The relay client (null: none) and whether the session goes through it.
  std::shared_ptr<GrpcCoordinatorClient> relay_ ABSL_GUARDED_BY(mu_);
  // Relay clients replaced by a move. Their session is not cancelled here:
  // a cancel that reached the coordinator before the new session's Hello
  // would remove the member; the coordinator ends a superseded session
  // itself. Dropped at the next move (long after that).
  std::vector<std::shared_ptr<GrpcCoordinatorClient>> retired_ ABSL_GUARDED_BY(mu_);
  std::string relay_id_ ABSL_GUARDED_BY(mu_);
  std::string relay_address_ ABSL_GUARDED_BY(mu_);
  bool relayed_ ABSL_GUARDED_BY(mu_) = false;
  std::string failed_address_ ABSL_GUARDED_BY(mu_);
  // A UseRelay put off by the cooldown (empty address: none).
  std::string deferred_id_ ABSL_GUARDED_BY(mu_);
  std::string deferred_address_ ABSL_GUARDED_BY(mu_);
  absl::Time failed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The session the worker asked for (OpenSession's arguments).
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_ ABSL_GUARDED_BY(mu_);
  MessageHandler on_message_ ABSL_GUARDED_BY(mu_);
  ClosedHandler on_closed_ ABSL_GUARDED_BY(mu_);
  HeartbeatFiller fill_ ABSL_GUARDED_BY(mu_);
  // The generation of the current session: ends of older ones are the
  // route changes' own doing and are not reported.
  uint64_t gen_ ABSL_GUARDED_BY(mu_) = 0;
  // The generation of the direct session while it lives (0: none). A move
  // to a relay leaves it open (the relayed Hello supersedes it at the
  // coordinator); when the relayed session fails before that, the fall-back
  // keeps this one instead of re-opening: re-opening cancels it first, and
  // a cancelled session is a departure for the coordinator.
  uint64_t direct_gen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fall_backs_ ABSL_GUARDED_BY(mu_) = 0;
  // The latest relayed sessions (newest last, at most kMaxResumes) and how
  // many directives each delivered while it was the current one. Every
  // Hello carries them: the coordinator sends again what the last relayed
  // session did not deliver (a relay that died with directives in
  // flight). Directives of a relayed session that a newer one replaced
  // are dropped here: the coordinator resends them on the new one.
  struct Taken {
    uint64_t gen = 0;
    uint64_t received = 0;
  };
  std::deque<Taken> taken_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kMaxResumes = 4;
  // Hello.session = session_base_ + gen: random, so that a restarted
  // worker's numbers do not match its predecessor's.
  const uint64_t session_base_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::thread router_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_ROUTED_COORDINATOR_CLIENT_H_
