// The coordinator's engine: the run's state machine behind one mutex. A thin
// facade over its parts, one per concern, each in its own files:
//   Membership (membership.h)       joins, ids and data ranks, sessions,
//                                   leases, departures, member credentials;
//   the run's mode (run_mode.h), picked once from RunConfig's oneof mode:
//     SyncRounds (sync_rounds.h)    the synchronous rounds: admission, start,
//                                   plan, connection barrier, sharing, hash
//                                   vote, deadlines, late work;
//     GossipPeers (gossip_peers.h)  gossip: peer lists, each member's gossip
//                                   figures, the consensus evaluator, the
//                                   final average;
//   Topology (topology.h)           zones, the supernode election, relay
//                                   routes;
//   CheckpointPlanner (checkpoint_planner.h)  who uploads which checkpoint.
// The decisions are pure functions (round_decisions.h, zone_election.h,
// hierarchy_plan.h, relay_assignment.h, final_average.h, gossip_status.h);
// the parts gather their inputs, call them and carry the result out. The
// facade takes the lock, finds the caller, hands the call to the part it
// concerns, and composes what spans the parts: a join, a departure, the end
// of the run, Status() and Record(). The mode never calls the facade back:
// the departures it decides and the end of the run come back as intents in
// its ModeOutput (run_mode.h), carried out here after its call.
//
// Plain C++: no gRPC types. Every method takes the current time from the
// injected Clock and returns the directives to push to workers; the caller
// delivers them after the call returns. Tick() applies every timeout;
// nothing waits inside the engine.
//
// Thread-safe: one mutex guards every part (they are not locked separately
// and are only called with it held), and nothing calls out while holding
// it, except EngineOptions::before_round_start (see there). The parts mark
// what they change in EngineVersions; Changes commits the marks when a
// public call returns, so status_version() moves at most once per call.
// record_version() moves there too, and also right before
// before_round_start is handed the record (EngineVersions::CommitRecord),
// so a call that changed the record both before and after a round start
// moves it twice.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "services/coordinator/core/checkpoint_planner.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/layout_book.h"
#include "services/coordinator/core/membership.h"
#include "services/coordinator/core/run_mode.h"
#include "services/coordinator/core/topology.h"
#include "services/coordinator/core/zone_election.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

struct JoinResult {
  shoal::v1::JoinResponse response;
  Directives directives;
};

class RoundEngine {
 public:
  RoundEngine(EngineOptions options, const Clock* clock);
  ~RoundEngine();

  // `unreachable` (from the service's probe of request.peer_address, not
  // from the worker): why the worker cannot be reached; non-empty makes it
  // outbound-only.
  absl::StatusOr<JoinResult> Join(const shoal::v1::JoinRequest& request,
                                  const std::string& unreachable = "");
  absl::Duration join_probe_timeout() const { return options_.join_probe_timeout; }
  // The worker opened its session stream. NOT_FOUND for an unknown id.
  absl::Status Connect(const std::string& worker_id);
  // A heartbeat arrived. NOT_FOUND for an unknown id.
  absl::Status Heartbeat(const std::string& worker_id,
                         const shoal::v1::Heartbeat& heartbeat = shoal::v1::Heartbeat());
  // The worker left (kLeave: its Leave call) or its session stream broke
  // (kBroken): it is removed at once, as "left", or as "lost" ("finished"
  // once the run has finished: every worker's session ends then).
  enum class SessionEnd { kLeave, kBroken };
  Directives Disconnect(const std::string& worker_id, const std::string& reason,
                        SessionEnd how = SessionEnd::kLeave);

  // Admits the worker to `round` or, when that round already has a ready
  // participant, to the next one. Returns the admitted round. `carried`:
  // the round the worker already trained before its session broke
  // (JoinRoundRequest.carried_round, 0 = none). Gossip: joins the peer list
  // (returns 0).
  absl::StatusOr<uint64_t> JoinRound(const std::string& worker_id, uint64_t round, Directives* out,
                                     uint64_t carried = 0);
  absl::Status ReportReady(const shoal::v1::ReportReadyRequest& request, Directives* out);
  absl::Status ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request, Directives* out);
  absl::Status ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request, Directives* out);
  // An auditor's replay (RunConfig.trust, core/round_trust.h).
  absl::Status ReportAudit(const shoal::v1::ReportAuditRequest& request, Directives* out);
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request, Directives* out);

  // Applies every timeout: leases, the checkpoint upload in progress, the
  // round's deadline (gossip: the consensus evaluator and the final
  // average), then a stale election and the relay routes it changed.
  Directives Tick();
  // While held, no round starts (the current one may finish): a replica
  // that cannot renew its etcd lease, or whose run record is not written.
  // Releasing starts the next round when its members are queued.
  Directives HoldRounds(bool hold);

  shoal::v1::RunStatus Status() const;
  // The latest supernode election (brought up to date first when
  // membership changed since): what the hierarchical plan builds on.
  ElectionResult Election();
  // The record to persist (run id, config, counters).
  shoal::v1::RunRecord Record() const;
  // Increments whenever Record() changes (when the call that changed it
  // returns, or before before_round_start sees it); the server persists on
  // change.
  uint64_t record_version() const;
  bool finished() const;
  uint64_t last_completed_round() const;
  bool IsActive(const std::string& worker_id) const;
  // How many members were removed so far (left, evicted, replaced): the
  // service re-checks its sessions only when this moved.
  uint64_t departures() const;
  // Increments whenever anything Status() reports changes, except the
  // passing of time and heartbeats that only refresh a member's last_seen
  // (their sync progress does count). Lets the service serve a cached
  // status until something happened.
  uint64_t status_version() const;
  // Status() together with the status_version() it reflects.
  shoal::v1::RunStatus Status(uint64_t* version) const;
  // With member credentials: the full list of current credentials for the
  // session `worker_id` just opened (send it first; updates may arrive in
  // any order). Null when credentials are off or the worker is not active.
  SharedMessage MemberList(const std::string& worker_id) const;
  // With RunConfig.topology.relay: the UseRelay for the direct session `worker_id`
  // just opened (its current route, "go direct" included, so a member
  // that fell back to direct learns again where to go). Null when relay is
  // off or the worker is not active.
  SharedMessage RelayRoute(const std::string& worker_id);
  // The RunFinished for a session `worker_id` opens after the run finished
  // (it is broadcast once, at the finish: a member whose session broke just
  // then, a relay's member falling back to direct, would never hear it).
  // Null while the run goes on or when the worker is not a member.
  SharedMessage FinishedNotice(const std::string& worker_id) const;
  // Recomputes the barrier counters and the participant/queue indexes from
  // the members and compares them with the maintained ones, and checks that
  // every part knows the same members (tests).
  bool CountersConsistentForTesting() const;

 private:
  // Declared right after taking mu_ by each public call that may change the
  // state: commits the call's marks (EngineVersions::Commit) when it
  // returns, still under mu_, so the status version moves at most once per
  // call (the record version, see the class comment).
  class Changes {
   public:
    explicit Changes(RoundEngine* engine) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine->mu_)
        : engine_(engine) {}
    // Runs before the MutexLock declared ahead of it releases mu_.
    ~Changes() ABSL_NO_THREAD_SAFETY_ANALYSIS { engine_->versions_.Commit(); }
    Changes(const Changes&) = delete;
    Changes& operator=(const Changes&) = delete;

   private:
    RoundEngine* const engine_;
  };

  // The run's mode (from the constructor, before any call).
  std::unique_ptr<RunMode> MakeMode() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Removes a member the engine decided to remove (its lease, its session,
  // its address taken): every part forgets it, then the mode draws the
  // consequences (a re-plan, the next round, a new peer list).
  void Remove(const std::string& worker_id, MemberState why, const std::string& reason,
              absl::Time now, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes it from the members and the topology; `gone` is what the
  // status shows of it from now on.
  void Depart(const std::string& worker_id, MemberState why, const std::string& reason,
              shoal::v1::WorkerStatus gone, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A mode's output into `out`: its directives, and its intents carried
  // out in their place among them.
  void Apply(ModeOutput mode, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The run is over (`failed`: stopped on an error, the record is not
  // marked finished, the status shows `reason`): RunFinished to every
  // member.
  void EndRun(const std::string& reason, bool failed, Directives* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  shoal::v1::RunRecord CurrentRecord() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  shoal::v1::RunStatus StatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the status shows of a member, from every part. `active`: not
  // removed (a member being removed is shown as it was).
  void FillWorker(const Member& m, bool active, absl::Time now, shoal::v1::WorkerStatus* w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineOptions options_;
  const Clock* const clock_;
  const absl::Time started_at_;

  mutable absl::Mutex mu_;
  EngineVersions versions_ ABSL_GUARDED_BY(mu_);
  Membership membership_ ABSL_GUARDED_BY(mu_);
  Topology topology_ ABSL_GUARDED_BY(mu_);
  CheckpointPlanner checkpoints_ ABSL_GUARDED_BY(mu_);
  // The run's model layout (JoinRequest.layout).
  LayoutBook layouts_ ABSL_GUARDED_BY(mu_);
  // Why the run stopped (a failed EndRun); empty otherwise.
  std::string run_error_ ABSL_GUARDED_BY(mu_);
  // SyncRounds or GossipPeers, for the whole run.
  const std::unique_ptr<RunMode> mode_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_
