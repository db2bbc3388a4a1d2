// The run's mode on the coordinator, a seam of the engine: synchronous
// rounds (SyncRounds, sync_rounds.h) or gossip peers (GossipPeers,
// gossip_peers.h). RoundEngine picks one from RunConfig's `oneof mode` when
// it is built and hands it every call whose meaning depends on the mode
// (JoinRound, the round reports, checkpoint reports, the consequences of a
// departure, Tick's timeouts, what the status and the record say of the
// run), so that no other part asks which mode the run is in.
//
// A mode never calls the engine back: what it wants done beyond its own
// state (remove a member it evicts, end the run) it returns as
// EngineIntents in its ModeOutput, which the engine carries out after the
// call, in order with the directives. Time comes from the caller (`now`).
//
// Not thread-safe: a mode is a part of RoundEngine, called only with the
// engine's mutex held; it never calls out.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_RUN_MODE_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_RUN_MODE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/membership.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// What a mode wants the engine to do.
struct EngineIntent {
  enum class Kind {
    // Remove `worker_id` from every part as `why` with `reason`. The mode
    // has forgotten it already; `shown` is what the mode showed of it, for
    // the status of the departed.
    kDepart,
    // The run is over (`reason`): RunFinished to every member. The mode is
    // FINISHED already.
    kFinishRun,
    // The run stops on an error (`reason`): RunFinished (failed) to every
    // member, the status shows the error, and the record is not marked
    // finished, so a restarted coordinator tries again.
    kFailRun,
  };
  Kind kind = Kind::kDepart;
  std::string worker_id;
  MemberState why = MemberState::kLeft;
  std::string reason;
  shoal::v1::WorkerStatus shown;
};

// What a call of a mode produces: directives, and intents, each with how
// many directives come before it (its own directives go there).
struct ModeOutput {
  Directives directives;
  std::vector<std::pair<size_t, EngineIntent>> intents;
  void Intend(EngineIntent intent) { intents.emplace_back(directives.size(), std::move(intent)); }
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
  virtual void Resume(const shoal::v1::RunRecord& record, absl::Time now) = 0;

  // ------------------------------------------------------------- Members
  // A join the mode refuses (the engine's own checks passed), e.g. a
  // worker that cannot follow the sample ledger.
  virtual absl::Status CheckJoin(const shoal::v1::JoinRequest&, absl::Time) {
    return absl::OkStatus();
  }
  // Join took the member in (new or re-joining; `request` says which model
  // it holds): what the mode keeps of it.
  virtual void OnJoined(Member& m, const shoal::v1::JoinRequest& request, absl::Time now) = 0;
  // Join's answer: the round open to the joiner and what it catches up on.
  virtual void FillJoinResponse(const Member& m, shoal::v1::JoinResponse* r) const = 0;
  // Its session opened (Connect).
  virtual void OnConnected(Member& m, absl::Time now) = 0;
  // A heartbeat (Membership refreshed its lease): false = nothing else of
  // it is taken (not even its catch-up progress).
  virtual bool OnHeartbeat(Member& m, const shoal::v1::Heartbeat& heartbeat, absl::Time now) = 0;
  // How the departure of a member the engine removes shows (gossip: a
  // worker that left after its steps is "finished").
  virtual MemberState DepartureState(MemberState why, const std::string&) const { return why; }
  // Drops what the mode keeps of `worker_id`, with no consequence (the
  // engine removes a member); true when it took part in the run's current
  // work (a round's participants; gossip: the peer list), which
  // OnDeparted then gets.
  virtual bool Forget(const std::string& worker_id, absl::Time now) = 0;
  // The engine removed the member (after Forget): what that means for the
  // run, a new plan or the next round; a new peer list or its end.
  virtual void OnDeparted(const std::string& worker_id, MemberState why, const std::string& reason,
                          bool was_participant, absl::Time now, ModeOutput* out) = 0;

  // ------------------------------------------------ The workers' calls
  // `m` is the active caller (the engine checked the id).
  virtual absl::StatusOr<uint64_t> JoinRound(Member& m, uint64_t round, uint64_t carried,
                                             absl::Time now, ModeOutput* out) = 0;
  virtual absl::Status ReportReady(Member& m, const shoal::v1::ReportReadyRequest& request,
                                   absl::Time now, ModeOutput* out) = 0;
  virtual absl::Status ConnectionsReady(Member& m,
                                        const shoal::v1::ConnectionsReadyRequest& request,
                                        absl::Time now, ModeOutput* out) = 0;
  virtual absl::Status ReportRoundDone(Member& m, const shoal::v1::ReportRoundDoneRequest& request,
                                       absl::Time now, ModeOutput* out) = 0;
  virtual absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                        absl::Time now, ModeOutput* out) = 0;
  // An auditor's replay (RunConfig.trust.audit_rate). Modes without audits
  // refuse it.
  virtual absl::Status ReportAudit(Member&, const shoal::v1::ReportAuditRequest&, absl::Time,
                                   ModeOutput*) {
    return absl::FailedPreconditionError("this run's mode has no audits");
  }
  // The mode's timeouts and periodic decisions (after the leases).
  virtual void Tick(absl::Time now, ModeOutput* out) = 0;
  // Replicas: while held, no round starts (RoundEngine::HoldRounds).
  virtual void HoldRounds(bool hold, absl::Time now, ModeOutput* out) = 0;

  // ---------------------------------------------------- Status, record
  virtual void FillStatus(shoal::v1::RunStatus* s, absl::Time now) const = 0;
  // What the status shows of a member from the mode; also for a member
  // being removed (before Forget).
  virtual void FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const = 0;
  // The rounds in the record (last completed round and agreed model).
  virtual void FillRecord(shoal::v1::RunRecord* r, absl::Time now) const = 0;
  // The mode's indexes and counters agree with its members (tests).
  virtual bool ConsistentForTesting() const = 0;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_RUN_MODE_H_
