// The run's mode on the coordinator, a seam of the engine: synchronous
// rounds (SyncRounds, sync_rounds.h) or gossip peers (GossipPeers,
// gossip_peers.h). RoundEngine picks one from RunConfig's `oneof mode` when
// it is built and hands it every call whose meaning depends on the mode
// (JoinRound, the round reports, checkpoint reports, the consequences of a
// departure, Tick's timeouts, what the status and the record say of the
// run), so that no other part asks which mode the run is in.
//
// Not thread-safe: a mode is a part of RoundEngine, called only with the
// engine's mutex held; it never calls out.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_RUN_MODE_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_RUN_MODE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/membership.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// What a mode asks of the engine that holds it: the operations that span
// every part (RoundEngine implements it).
class EngineHost {
 public:
  virtual ~EngineHost() = default;
  // Removes `worker_id` from every part (the mode's state first, so that a
  // participant's flags leave the round's counters with it; then the
  // members, the credentials and the topology) with no consequence for the
  // round. True when it took part in the current round. By value: callers
  // may pass a key that this erases.
  virtual bool DepartMember(std::string worker_id, MemberState why, const std::string& reason,
                            Directives* out) = 0;
  // Ends the run: RunFinished to every member.
  virtual void FinishRun(const std::string& reason, Directives* out) = 0;
  // Stops the run on an error: RunFinished (failed) to every member, and
  // the status shows `error`. The record is not marked finished, so a
  // restarted coordinator tries again.
  virtual void FailRun(const std::string& error, Directives* out) { FinishRun(error, out); }
  // The run record as it stands.
  virtual shoal::v1::RunRecord CurrentRecord() const = 0;
};

class RunMode {
 public:
  virtual ~RunMode() = default;

  // ------------------------------------------------------------- The run
  virtual shoal::v1::Phase phase() const = 0;
  // The round in progress, or the next one to start (gossip: always 1).
  virtual uint64_t round() const = 0;
  virtual uint64_t last_completed_round() const = 0;
  // Continues the run of a persisted record (EngineOptions::resume).
  virtual void Resume(const shoal::v1::RunRecord& record) = 0;
  // The run is finished (EngineHost::FinishRun): nothing is in progress.
  virtual void OnFinish() = 0;

  // ------------------------------------------------------------- Members
  // Join took the member in (new or re-joining; `request` says which model
  // it holds): what the mode keeps of it.
  // A join the mode refuses (the engine's own checks passed), e.g. a
  // worker that cannot follow the sample ledger.
  virtual absl::Status CheckJoin(const shoal::v1::JoinRequest&) { return absl::OkStatus(); }
  virtual void OnJoined(Member& m, const shoal::v1::JoinRequest& request) = 0;
  // Join's answer: the round open to the joiner and what it catches up on.
  virtual void FillJoinResponse(const Member& m, shoal::v1::JoinResponse* r) const = 0;
  // Its session opened (Connect).
  virtual void OnConnected(Member& m) = 0;
  // A heartbeat (Membership refreshed its lease): false = nothing else of
  // it is taken (not even its catch-up progress).
  virtual bool OnHeartbeat(Member& m, const shoal::v1::Heartbeat& heartbeat) = 0;
  // Drops what the mode keeps of `worker_id`, with no consequence (part of
  // EngineHost::DepartMember); true when it took part in the current round.
  virtual bool Forget(const std::string& worker_id) = 0;
  // Removes the member (EngineHost::DepartMember) with what that means for the
  // run: a new plan or the next round; a new peer list or the end of the
  // run. By value, as Depart.
  virtual void RemoveMember(std::string worker_id, MemberState why, const std::string& reason,
                            Directives* out) = 0;

  // ------------------------------------------------ The workers' calls
  // `m` is the active caller (the engine checked the id).
  virtual absl::StatusOr<uint64_t> JoinRound(Member& m, uint64_t round, uint64_t carried,
                                             Directives* out) = 0;
  virtual absl::Status ReportReady(Member& m, const shoal::v1::ReportReadyRequest& request,
                                   Directives* out) = 0;
  virtual absl::Status ConnectionsReady(Member& m,
                                        const shoal::v1::ConnectionsReadyRequest& request,
                                        Directives* out) = 0;
  virtual absl::Status ReportRoundDone(Member& m, const shoal::v1::ReportRoundDoneRequest& request,
                                       Directives* out) = 0;
  virtual absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                        Directives* out) = 0;
  // An auditor's replay (RunConfig.trust.audit_rate). Modes without audits
  // refuse it.
  virtual absl::Status ReportAudit(Member& m, const shoal::v1::ReportAuditRequest& request,
                                   Directives* out) {
    return absl::FailedPreconditionError("this run's mode has no audits");
  }
  // The mode's timeouts and periodic decisions (after the leases).
  virtual void Tick(absl::Time now, Directives* out) = 0;
  // Replicas: while held, no round starts (RoundEngine::HoldRounds).
  virtual void HoldRounds(bool hold, Directives* out) = 0;

  // ---------------------------------------------------- Status, record
  virtual void FillStatus(shoal::v1::RunStatus* s) const = 0;
  // What the status shows of a member from the mode; also for a member
  // being removed (before Forget).
  virtual void FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const = 0;
  // The rounds in the record (last completed round and agreed model).
  virtual void FillRecord(shoal::v1::RunRecord* r) const = 0;
  // The mode's indexes and counters agree with its members (tests).
  virtual bool ConsistentForTesting() const = 0;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_RUN_MODE_H_
