// The synchronous rounds (RunConfig.sync, docs/ARCHITECTURE.md "A round"):
// WAITING_FOR_MEMBERS -> TRAINING -> SHARING -> next round / FINISHED.
// Admission (DecideAdmission), the round start (DecideRoundStart), ready
// reports and folded late work, the shard plan of each attempt (with its
// participant list version and, with --hierarchy, its stages), the
// peer-connection barrier with retries and evictions, the hash vote that
// settles a round, re-plans and aborts, the ready deadline (fixed or
// adaptive) and the round's running deadline, missed rounds, and when a
// completed round is checkpointed. The decisions are the pure functions of
// round_decisions.h and hierarchy_plan.h; this gathers their inputs and
// carries them out.
//
// What it keeps of a member (RoundMember): the model it holds, its per-round
// flags, its measured times, its reports and late work. The round's
// participants and the queue are ordered lists (join order decides the
// plan's slice order) with a hash set each, and the per-round flags are
// counted over the participants, so that a report checks its barrier in
// O(1) instead of walking every participant.
//
// A RunMode of RoundEngine. Not thread-safe: called only with the engine's
// mutex held; it never calls out, except EngineOptions::before_round_start
// (under that lock, by its contract).
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUNDS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUNDS_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "services/coordinator/core/checkpoint_planner.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/membership.h"
#include "services/coordinator/core/round_decisions.h"
#include "services/coordinator/core/round_trust.h"
#include "services/coordinator/core/run_mode.h"
#include "services/coordinator/core/sample_ledger.h"
#include "services/coordinator/core/topology.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

class SyncRounds : public RunMode {
 public:
  // `started_at`: this start of the coordinator (participant list versions
  // of different starts never meet).
  SyncRounds(const EngineOptions& options, const Clock* clock, EngineVersions* versions,
             Membership* members, Topology* topology, CheckpointPlanner* checkpoints,
             EngineHost* host, absl::Time started_at);

  shoal::v1::Phase phase() const override { return phase_; }
  uint64_t round() const override { return round_; }
  uint64_t last_completed_round() const override { return last_completed_round_; }
  void Resume(const shoal::v1::RunRecord& record) override;
  void OnFinish() override;

  absl::Status CheckJoin(const shoal::v1::JoinRequest& request) override;
  void OnJoined(Member& m, const shoal::v1::JoinRequest& request) override;
  void FillJoinResponse(const Member& m, shoal::v1::JoinResponse* r) const override;
  void OnConnected(Member& m) override;
  // Bad-chunk reports (Heartbeat.bad_chunks_from) move scores; a ban they
  // lead to is carried out at the next Tick.
  bool OnHeartbeat(Member& m, const shoal::v1::Heartbeat& heartbeat) override;
  bool Forget(const std::string& worker_id) override;
  void RemoveMember(std::string worker_id, MemberState why, const std::string& reason,
                    Directives* out) override;

  absl::StatusOr<uint64_t> JoinRound(Member& m, uint64_t round, uint64_t carried,
                                     Directives* out) override;
  absl::Status ReportReady(Member& m, const shoal::v1::ReportReadyRequest& request,
                           Directives* out) override;
  absl::Status ConnectionsReady(Member& m, const shoal::v1::ConnectionsReadyRequest& request,
                                Directives* out) override;
  absl::Status ReportRoundDone(Member& m, const shoal::v1::ReportRoundDoneRequest& request,
                               Directives* out) override;
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                Directives* out) override;
  absl::Status ReportAudit(Member& m, const shoal::v1::ReportAuditRequest& request,
                           Directives* out) override;
  // The checkpoint upload in progress, then the round's running deadline.
  void Tick(absl::Time now, Directives* out) override;
  void HoldRounds(bool hold, Directives* out) override;

  void FillStatus(shoal::v1::RunStatus* s) const override;
  void FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const override;
  void FillRecord(shoal::v1::RunRecord* r) const override;
  // Recomputes the barrier counters and the participant/queue indexes from
  // the members and compares them with the maintained ones.
  bool ConsistentForTesting() const override;

 private:
  // What the rounds keep of a member.
  struct RoundMember {
    // The model it holds: the round (0 = the initial model) and its hash.
    std::string model_hash;
    uint64_t model_round = 0;
    shoal::v1::Metrics metrics;
    uint64_t metrics_round = 0;
    double train_loss = 0;
    uint64_t rounds_completed = 0;
    uint32_t missed_in_row = 0;
    std::string missed_reason;
    // Recent ready times (from the start of its training in a round to its
    // ReportReady, as measured here) and train_seconds of its RoundDone
    // reports, newest last; and the rounds it sat out for the adaptive
    // deadline.
    std::deque<absl::Duration> ready_times;
    std::deque<double> train_seconds;
    // Of its recent completed rounds: its train and exchange seconds and
    // the round's wall seconds (WorkerStatus.train_share and the others).
    struct TimeShare {
      double train = 0;
      double exchange = 0;
      double wall = 0;
    };
    std::deque<TimeShare> time_shares;
    double round_train_seconds = 0;  // its RoundDone report of round_
    uint64_t rounds_late = 0;
    // Its latest exchange's bytes on the wire (ReportRoundDone).
    uint64_t bytes_received = 0;
    uint64_t bytes_sent = 0;
    double compression_ratio = 0;
    uint64_t wire_round = 0;
    // Late work: the fold reported ready for fold_round (0 = none), counted
    // when that round completes with it; what status shows of the last.
    uint64_t fold_round = 0;
    uint64_t fold_staleness = 0;
    double fold_weight = 0;
    double fold_train_seconds = 0;
    uint64_t folded_updates = 0;
    uint64_t last_fold_staleness = 0;
    double last_fold_weight = 0;
    uint64_t last_fold_round = 0;
    double last_fold_train_seconds = 0;
    // The ready deadline (after the round start) of the last round it took
    // part in or sat out; 0 = none yet.
    double deadline_seconds = 0;
    // When it started training in the current round (round start, or its
    // admission to the running round).
    absl::Time training_since;
    // Per current round.
    bool ready = false;
    bool connections_ok = false;
    std::vector<std::string> unreachable;
    bool done = false;
    double exchange_seconds = 0;
    // Version of the participant list this member's session was given in a
    // full plan (0 = none): plans with that list go to it without slices.
    uint64_t plan_list_known = 0;
    // The round whose training it finished before its session broke, as
    // its JoinRound said (0 = none): its ready report for that round comes
    // at once and says nothing of its speed.
    uint64_t carried_round = 0;
  };

  RoundMember& R(const std::string& worker_id) { return rounds_.at(worker_id); }
  const RoundMember& R(const std::string& worker_id) const { return rounds_.at(worker_id); }

  // Participants and the queue; all changes go through these.
  void AddParticipant(const std::string& worker_id);
  // Returns false when the worker was no participant.
  bool RemoveParticipant(const std::string& worker_id);
  // Hands the participants over (in order) and leaves none.
  std::vector<std::string> TakeParticipants();
  bool IsParticipant(const std::string& worker_id) const {
    return participant_set_.contains(worker_id);
  }
  void Enqueue(const std::string& worker_id);
  bool IsQueued(const std::string& worker_id) const { return queued_set_.contains(worker_id); }
  void Dequeue(const std::string& worker_id);
  std::vector<std::string> TakeQueue();
  // Applies `update` to the member's per-round flags (ready,
  // connections_ok, unreachable, done), keeping the counters right when it
  // is a participant.
  template <typename F>
  void UpdateFlags(const std::string& worker_id, F&& update);
  // Clears ready, connections_ok and done.
  void ResetRoundFlags(const std::string& worker_id);
  void CountFlags(const RoundMember& r, int sign);

  absl::Status CheckRound(uint64_t round, const char* what) const;
  // `m` when `round` is the current round (for `what`) and it takes part
  // in it; FAILED_PRECONDITION else.
  absl::Status CheckParticipant(const Member& m, uint64_t round, const char* what) const;
  // True when the member holds the run's agreed model (no catch-up).
  bool HoldsAgreedModel(const RoundMember& r) const;
  // The Peer addresses of the members that hold the agreed model.
  std::vector<std::string> Holders() const;
  // RoundStart of the current round; `with_holders` lists the holders of
  // its base model (O(N)), which only a worker without it needs.
  shoal::v1::CoordinatorMessage RoundStartMessage(bool with_holders) const;

  void MaybeStartRound(Directives* out);
  void MaybeSendPlan(Directives* out);
  // Every participant is ready: sends the round's audits (once) and
  // returns true when none is out any more (the plan may go).
  bool AuditsSettled(Directives* out);
  // Moves the member's score (core/round_trust.h); below the ban line it is
  // banned and, unless `evicting` (its caller evicts it), evicted.
  void Penalize(const std::string& worker_id, TrustEvent event, const std::string& detail,
                Directives* out, bool evicting = false);
  void SendPlan(Directives* out);
  void MaybeStartSharing(Directives* out);
  // Applies DecideConnectionBarrier after a report (kReport) or at the
  // connection deadline (kDeadline).
  void ApplyConnectionBarrier(ConnectionEvent event, Directives* out);
  void RetryConnections(const std::string& reason, Directives* out);
  void EvictFailingPeers(const std::string& reason, Directives* out);
  // FindFailingPeers over the current participants.
  FailingPeers ComputeFailingPeers() const;
  void MaybeCompleteRound(Directives* out);
  // A participant was lost after the plan: the survivors exchange again
  // with a new plan (attempt + 1), from their trained models.
  void Replan(const std::string& reason, Directives* out);
  void AbortRound(const std::string& reason, Directives* out);
  // AbortRound without starting the next round.
  void TakeBackRound(const std::string& reason, Directives* out);
  // A participant could not load the round's base (ReportReadyRequest.
  // base_unavailable): it sits out, or the run goes back to an older
  // checkpoint, or it stops (core/base_recovery.h).
  absl::Status BaseUnavailable(Member& m, const shoal::v1::ReportReadyRequest& request,
                               Directives* out);
  // The worker sits the round out; it stays a member (queued for the next
  // round) unless it missed too many in a row. `adaptive`: it missed the
  // adaptive ready deadline (DecideMissedRound).
  void MissRound(const std::string& worker_id, const std::string& reason, Directives* out,
                 bool adaptive = false);
  // Recomputes the ready deadline (DecideReadyDeadline) while TRAINING and
  // makes it the running deadline.
  void UpdateReadyDeadline(absl::Time now);
  void ApplyRoundDeadline(absl::Time now, Directives* out);
  // options_.adaptive_deadline with options_.round_timeout.
  AdaptiveDeadlineOptions AdaptiveOptions() const;
  // How many recent samples a member keeps (at least after_rounds).
  size_t SampleWindow() const;
  // The current ready deadline in seconds after the round start (0 when
  // none is set).
  double ReadyDeadlineSeconds() const;
  // Asks a holder of the agreed model of `round` to upload it (`first`: a
  // new upload, nobody tried yet).
  void AssignCheckpoint(uint64_t round, bool first, Directives* out);
  std::string PhaseDetail() const;

  const EngineOptions& options_;
  const Clock* const clock_;
  EngineVersions* const versions_;
  Membership* const members_;
  Topology* const topology_;
  CheckpointPlanner* const checkpoints_;
  EngineHost* const host_;

  // What the rounds keep of each active member (nodes never move).
  absl::node_hash_map<std::string, RoundMember> rounds_;
  bool rounds_held_ = false;
  shoal::v1::Phase phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  // The round in progress, or the next one to start.
  uint64_t round_ = 1;
  uint64_t last_completed_round_ = 0;
  std::string agreed_hash_;
  // The latest time the run went back to an older checkpoint (status).
  std::string base_fallback_;
  // RunConfig.training.sample_ledger: which samples each participant
  // trains (core/sample_ledger.h); none when off.
  std::optional<SampleLedger> ledger_;
  // Audits, scores and bans (RunConfig.trust).
  RoundTrust trust_;
  // Members banned where no directive could be sent (a heartbeat): evicted
  // at the next Tick.
  std::vector<std::pair<std::string, std::string>> bans_due_;  // id, reason
  // No round completed since this coordinator started (restart window).
  bool fresh_start_ = true;
  // Participants of round_ (in join order) while TRAINING / SHARING, and the
  // same ids as a set.
  std::vector<std::string> participants_;
  absl::flat_hash_set<std::string> participant_set_;
  // How many participants are ready / reported ConnectionsReady (and of
  // those, how many named unreachable peers) / reported RoundDone.
  size_t ready_count_ = 0;
  size_t connected_count_ = 0;
  size_t unreachable_count_ = 0;
  size_t done_count_ = 0;
  // Workers admitted to the next round to start (waiting), and as a set.
  std::vector<std::string> queued_;
  absl::flat_hash_set<std::string> queued_set_;
  bool any_ready_ = false;
  uint64_t total_elements_ = 0;
  absl::Time round_started_at_;
  // The ready deadline of the current round: the one --round_timeout sets
  // (extended while nobody is ready), the first ready report's time since
  // the round started, and the deadline in force with its reason (kept for
  // the status after the round moved on).
  absl::Time hard_ready_deadline_;
  std::optional<absl::Duration> first_ready_;
  ReadyDeadlineDecision ready_deadline_;
  // The running timeout: training deadline, connection deadline or exchange
  // deadline, depending on the phase.
  absl::Time deadline_;
  uint32_t attempt_ = 0;
  // The participant list (id, address, in order) of the latest plan and its
  // version (RoundPlan.participants_version): one version names one list
  // within a coordinator's lifetime, and versions are unique across starts.
  std::vector<std::pair<std::string, std::string>> plan_list_;
  // Which of plan_list_ are outbound-only (part of the list's identity).
  std::vector<bool> plan_list_outbound_;
  uint64_t plan_list_version_ = 0;
  uint32_t connection_retries_ = 0;
  bool sharing_started_ = false;
  std::deque<shoal::v1::RoundSummary> recent_rounds_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUNDS_H_
