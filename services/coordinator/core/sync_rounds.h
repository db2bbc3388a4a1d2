// The synchronous rounds as a RunMode of RoundEngine (RunConfig.sync,
// docs/ARCHITECTURE.md "A round"). The round itself is a value, SyncRound
// (sync_round.h): every call becomes one of its events, stepped with the
// caller's time. This runs it, as the worker's SyncRunner runs
// WorkerProtocol: it shows the round the engine's other parts
// (RoundWorld: members, the election, the latest checkpoint), carries out
// the round's intents for those parts (checkpoint uploads and go-backs,
// measurements and re-elections, the status figures in RoundStats) and
// hands the engine's (departures, the end of the run) back to the engine
// in its ModeOutput.
//
// Not thread-safe: called only with the engine's mutex held; it never
// calls out, except the round-start gate (EngineOptions::before_round_start,
// under that lock, by its contract).
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUNDS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUNDS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/coordinator/core/checkpoint_planner.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/membership.h"
#include "services/coordinator/core/round_stats.h"
#include "services/coordinator/core/run_mode.h"
#include "services/coordinator/core/sync_round.h"
#include "services/coordinator/core/topology.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

class SyncRounds : public RunMode, private RoundWorld {
 public:
  // Whether a round may start now (replicas: the record as it stands can
  // be written under this leader's term); null = always. Given the
  // engine's record with its version.
  using RoundStartGate = std::function<bool()>;

  // `started_at`: this start of the coordinator.
  SyncRounds(const EngineOptions& options, EngineVersions* versions, Membership* members,
             Topology* topology, CheckpointPlanner* checkpoints, RoundStartGate gate,
             absl::Time started_at);

  shoal::v1::Phase phase() const override { return round_.phase(); }
  uint64_t round() const override { return round_.round(); }
  uint64_t last_completed_round() const override { return round_.last_completed_round(); }
  void Resume(const shoal::v1::RunRecord& record, absl::Time now) override;

  absl::Status CheckJoin(const shoal::v1::JoinRequest& request, absl::Time now) override;
  void OnJoined(Member& m, const shoal::v1::JoinRequest& request, absl::Time now) override;
  void FillJoinResponse(const Member& m, shoal::v1::JoinResponse* r) const override;
  void OnConnected(Member& m, absl::Time now) override;
  // Bad-chunk reports (Heartbeat.bad_chunks_from) move scores; a ban they
  // lead to is carried out at the next Tick.
  bool OnHeartbeat(Member& m, const shoal::v1::Heartbeat& heartbeat, absl::Time now) override;
  bool Forget(const std::string& worker_id, absl::Time now) override;
  void OnDeparted(const std::string& worker_id, MemberState why, const std::string& reason,
                  bool was_participant, absl::Time now, ModeOutput* out) override;

  absl::StatusOr<uint64_t> JoinRound(Member& m, uint64_t round, uint64_t carried, absl::Time now,
                                     ModeOutput* out) override;
  absl::Status ReportReady(Member& m, const shoal::v1::ReportReadyRequest& request, absl::Time now,
                           ModeOutput* out) override;
  absl::Status ConnectionsReady(Member& m, const shoal::v1::ConnectionsReadyRequest& request,
                                absl::Time now, ModeOutput* out) override;
  absl::Status ReportRoundDone(Member& m, const shoal::v1::ReportRoundDoneRequest& request,
                               absl::Time now, ModeOutput* out) override;
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request, absl::Time now,
                                ModeOutput* out) override;
  absl::Status ReportAudit(Member& m, const shoal::v1::ReportAuditRequest& request, absl::Time now,
                           ModeOutput* out) override;
  // The checkpoint upload in progress, the bans due, then the round's
  // running deadline.
  void Tick(absl::Time now, ModeOutput* out) override;
  void HoldRounds(bool hold, absl::Time now, ModeOutput* out) override;

  void FillStatus(shoal::v1::RunStatus* s, absl::Time now) const override;
  void FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const override;
  void FillRecord(shoal::v1::RunRecord* r, absl::Time now) const override;
  bool ConsistentForTesting() const override;

 private:
  // RoundWorld: what the round reads of the other parts.
  const std::map<std::string, Member>& members() const override { return members_->members(); }
  const Member* Find(const std::string& worker_id) const override {
    return members_->Find(worker_id);
  }
  std::vector<std::string> AtAddress(const std::string& address,
                                     const Member* except) const override {
    return members_->AtAddress(address, except);
  }
  bool Alive(const Member& m, absl::Time now) const override { return members_->Alive(m, now); }
  ZoneHeads Heads(uint64_t round) const override;
  const std::string& checkpoint_id() const override { return checkpoints_->checkpoint_id(); }
  uint64_t checkpoint_round() const override { return checkpoints_->checkpoint_round(); }
  const std::vector<shoal::v1::CheckpointRef>& known_checkpoints() const override {
    return checkpoints_->known();
  }
  bool CheckpointDue(uint64_t round, bool last) const override {
    return checkpoints_->Due(round, last);
  }
  bool MayStartRound(bool record_changed) const override;

  // Steps the round with `event` and carries out its output: the status
  // figures of an accepted report, the intents in order (and a follow-up
  // step when the round asks for one). `m`: the caller (its lease is
  // refreshed when the round says so), or null.
  absl::Status Run(const RoundEvent& event, absl::Time now, Member* m, ModeOutput* out,
                   RoundOutput* result = nullptr);
  // One intent: the parts' own here, the engine's into `out`.
  void Apply(RoundIntent& intent, ModeOutput* out);

  EngineVersions* const versions_;
  Membership* const members_;
  Topology* const topology_;
  CheckpointPlanner* const checkpoints_;
  const RoundStartGate gate_;

  SyncRound round_;
  RoundStats stats_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUNDS_H_
