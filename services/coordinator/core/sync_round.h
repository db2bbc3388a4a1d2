// The synchronous round as a value (docs/ARCHITECTURE.md "A round"):
// WAITING_FOR_MEMBERS -> TRAINING -> SHARING -> next round / FINISHED.
// Everything the round protocol decides on lives here: the participants and
// the queue, the per-round flags and their counters, the attempt, the
// deadlines, the participant list of the latest plan, each member's seat
// (the model it holds, its flags, its ready times, its pending late work),
// the sample ledger and the audits. One function changes it:
//
//   RoundOutput Step(const RoundEvent& event, absl::Time now, const RoundWorld& world)
//
// An event is a worker's call (JoinRound, ReportReady, ...), a membership
// change the engine made (joined, connected, forgotten, departed) or a tick;
// `now` is the caller's time (the round reads no clock: tests pass any time
// they like); `world` is what the round reads of the engine's other parts
// (members' addresses and zones, the election, the latest checkpoint),
// never written through. The output holds the answer to the call, the
// directives for the workers and the round's intents in order: what it
// wants the engine and its parts to do (remove a member, finish the run,
// ask for a checkpoint, re-elect, record a member's figures). The round has
// already taken every intent into account in its own state: a member it
// removes has no seat any more, even while the world still lists it until
// the engine carries the intent out. Like etcd's raft (one Step, time from
// the caller, effects handed back) and torchft's quorum (decisions as pure
// functions, here round_decisions.h and hierarchy_plan.h).
//
// What only feeds the status (a member's metrics, bytes, time shares,
// completed rounds, fold counts, recent rounds) is not here: SyncRounds
// keeps it in RoundStats (round_stats.h) from the events and intents.
//
// A value: copyable, no pointer to anything outside itself. Not
// thread-safe (SyncRounds calls it under the engine's mutex).
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUND_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUND_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/hierarchy_plan.h"
#include "services/coordinator/core/membership.h"
#include "services/coordinator/core/round_decisions.h"
#include "services/coordinator/core/round_trust.h"
#include "services/coordinator/core/sample_ledger.h"
#include "services/coordinator/core/slice_sizing.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// What the round reads of the engine's other parts. Implemented by
// SyncRounds over Membership, Topology and CheckpointPlanner (tests: a
// fake). The members are those the engine knows: within a step, one the
// round just removed may still be listed (the round skips members without
// a seat).
class RoundWorld {
 public:
  virtual ~RoundWorld() = default;
  // The active members by id.
  virtual const std::map<std::string, Member>& members() const = 0;
  // The active member `worker_id`, or null.
  virtual const Member* Find(const std::string& worker_id) const = 0;
  // The active members at `address` other than `except`.
  virtual std::vector<std::string> AtAddress(const std::string& address,
                                             const Member* except) const = 0;
  // Its session is open and it sent heartbeats lately (Membership::Alive).
  virtual bool Alive(const Member& m, absl::Time now) const = 0;
  // The elected supernode of each zone (an up-to-date election).
  virtual ZoneHeads Heads(uint64_t round) const = 0;
  // The run's latest checkpoint, and its intact ones newest first.
  virtual const std::string& checkpoint_id() const = 0;
  virtual uint64_t checkpoint_round() const = 0;
  virtual const std::vector<shoal::v1::CheckpointRef>& known_checkpoints() const = 0;
  // Whether the completed round `round` is to be uploaded.
  virtual bool CheckpointDue(uint64_t round, bool last) const = 0;
  // Replicas (EngineOptions::before_round_start): whether a round may
  // start now. `record_changed`: this step changed the record so far (it
  // is committed first, so the record handed out has its own version).
  virtual bool MayStartRound(bool record_changed) const = 0;
};

// ------------------------------------------------------------------ Events
namespace round_event {

// A Join about to be accepted: OK, or why the round refuses it (a banned
// member, a training set the ledger cannot follow).
struct CheckJoin {
  const shoal::v1::JoinRequest* request;
};
// Join took the member in (new or re-joining; the request says which model
// it holds).
struct Joined {
  std::string worker_id;
  const shoal::v1::JoinRequest* request;
};
// Its session opened.
struct Connected {
  std::string worker_id;
};
// A heartbeat: the peers it got bad chunks from move their scores.
struct Heartbeat {
  std::string worker_id;
  const shoal::v1::Heartbeat* heartbeat;
};
// The worker calls. `carried`: JoinRoundRequest.carried_round.
struct JoinRound {
  std::string worker_id;
  uint64_t round;
  uint64_t carried;
};
struct Ready {
  const shoal::v1::ReportReadyRequest* request;
};
struct ConnectionsReady {
  const shoal::v1::ConnectionsReadyRequest* request;
};
struct RoundDone {
  const shoal::v1::ReportRoundDoneRequest* request;
};
struct Audit {
  const shoal::v1::ReportAuditRequest* request;
};
// The deadlines and the bans due. `stalled_upload`: the round whose
// checkpoint upload moves to another worker now (0 = none).
struct Tick {
  uint64_t stalled_upload = 0;
};
// Replicas: while held, no round starts.
struct Hold {
  bool hold;
};
// The engine removes the member: the round forgets it with no consequence
// (RoundOutput::was_participant says whether it took part).
struct Forget {
  std::string worker_id;
};
// ... and then the consequence for the round: a new plan, or the round goes
// on without it, or the next round.
struct Departed {
  std::string worker_id;
  std::string reason;
  bool was_participant;
};
// The run is finished: nothing is in progress any more.
struct Finish {};
// Continues the run of a persisted record.
struct Resume {
  const shoal::v1::RunRecord* record;
};
// After a go-back to an older checkpoint was carried out: the next round
// starts when its members are queued.
struct StartRound {};

}  // namespace round_event

using RoundEvent =
    std::variant<round_event::CheckJoin, round_event::Joined, round_event::Connected,
                 round_event::Heartbeat, round_event::JoinRound, round_event::Ready,
                 round_event::ConnectionsReady, round_event::RoundDone, round_event::Audit,
                 round_event::Tick, round_event::Hold, round_event::Forget, round_event::Departed,
                 round_event::Finish, round_event::Resume, round_event::StartRound>;

// ----------------------------------------------------------------- Intents
namespace round_intent {

// For the engine: remove the member from every part. The round no longer
// holds it; `shown` is what the round showed of it (the status keeps it).
struct Depart {
  std::string worker_id;
  MemberState why;
  std::string reason;
  shoal::v1::WorkerStatus shown;
};
// For the engine: the run is over (`failed`: stopped on an error, the
// record is not marked finished). The round is FINISHED already.
struct Finish {
  std::string reason;
  bool failed = false;
};
// For the checkpoint planner: ask a holder of `round`'s agreed model to
// upload it (`first`: a new upload; else the next untried holder).
struct Checkpoint {
  uint64_t round = 0;
  bool first = false;
  std::string agreed_hash;
  std::vector<CheckpointCandidate> candidates;
  shoal::v1::SampleLedger ledger;
};
// For the checkpoint planner: the run went back to `to`.
struct GoBack {
  shoal::v1::CheckpointRef to;
  std::string damaged_id;
};
// For the topology: a member's measurements of its round (0 = not
// measured), and a re-election with a completed round's measurements.
struct Measure {
  std::string worker_id;
  double step_seconds = 0;
  double bandwidth_bps = 0;
};
struct Reelect {
  uint64_t round = 0;
};
// For the status (RoundStats): a participant sat the round out (`late`:
// the miss does not count, it was only slow); the ready deadline then.
struct Missed {
  std::string worker_id;
  bool late = false;
  double deadline_seconds = 0;
};
// For the status: a round completed with these participants (in plan
// order); those whose late work it folded, with what the fold was.
struct Completed {
  struct Fold {
    std::string worker_id;
    uint64_t staleness = 0;
    double weight = 0;
    double train_seconds = 0;
  };
  uint64_t round = 0;
  std::vector<std::string> participants;
  double seconds = 0;
  std::string model_hash;
  double deadline_seconds = 0;
  std::vector<Fold> folds;
};

}  // namespace round_intent

using RoundIntent =
    std::variant<round_intent::Depart, round_intent::Finish, round_intent::Checkpoint,
                 round_intent::GoBack, round_intent::Measure, round_intent::Reelect,
                 round_intent::Missed, round_intent::Completed>;

// An intent and where it falls among the directives: after the first `at`
// of them (its own directives, say a revoked credential, go there).
struct PlacedIntent {
  size_t at = 0;
  RoundIntent intent;
};

struct RoundOutput {
  // The answer to a worker's call (OK for the other events).
  absl::Status status;
  // JoinRound: the admitted round.
  uint64_t admitted_round = 0;
  // Forget: the member took part in the current round.
  bool was_participant = false;
  // A report was taken (not refused, not a retried call): its figures go
  // to the status.
  bool accepted = false;
  // The caller showed it is alive: its lease is refreshed.
  bool touched = false;
  // What the step changed: anything the status shows; the record.
  bool status_changed = false;
  bool record_changed = false;
  Directives directives;
  std::vector<PlacedIntent> intents;
  // Step again with this once the intents are carried out.
  std::optional<RoundEvent> then;
};

class SyncRound {
 public:
  // What the round takes of the engine's options.
  struct Options {
    shoal::v1::RunConfig config;
    std::string run_id;
    absl::Duration round_timeout = absl::Seconds(120);
    absl::Duration connection_timeout = absl::Seconds(10);
    uint32_t max_connection_retry = 3;
    uint32_t max_missed_rounds = 5;
    AdaptiveDeadlineOptions adaptive_deadline;
    // The audit draw's secret (empty: 32 random bytes).
    std::string audit_secret;
  };
  static Options OptionsOf(const EngineOptions& engine);

  // `started_at`: this start of the coordinator (participant list versions
  // of different starts never meet).
  SyncRound(Options options, absl::Time started_at);

  // The one way the round changes (see the file comment).
  RoundOutput Step(const RoundEvent& event, absl::Time now, const RoundWorld& world);

  shoal::v1::Phase phase() const { return phase_; }
  // The round in progress, or the next one to start.
  uint64_t round() const { return round_; }
  uint64_t last_completed_round() const { return last_completed_round_; }
  const std::string& agreed_hash() const { return agreed_hash_; }
  const Options& options() const { return options_; }
  // How many recent samples a member keeps (at least the adaptive
  // deadline's after_rounds).
  size_t SampleWindow() const;

  // Join's answer: the round open to the joiner and the holders of the
  // agreed model it catches up from.
  void FillJoinResponse(const Member& m, const RoundWorld& world, shoal::v1::JoinResponse* r) const;
  // The members that may upload `round`'s agreed model (by id).
  std::vector<CheckpointCandidate> CheckpointCandidates(uint64_t round,
                                                        const RoundWorld& world) const;
  void FillStatus(shoal::v1::RunStatus* s, absl::Time now, const RoundWorld& world) const;
  // What the status shows of a member from the round (its seat, its score).
  void FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const;
  void FillRecord(shoal::v1::RunRecord* r, absl::Time now) const;
  // Recomputes the counters and the indexes and compares them with the
  // maintained ones; every seat has a member and the other way round.
  bool ConsistentForTesting(const RoundWorld& world) const;

 private:
  // What the round keeps of a member.
  struct Seat {
    // The model it holds: the round (0 = the initial model) and its hash.
    std::string model_hash;
    uint64_t model_round = 0;
    // As the status shows it: waiting, training, ready, sharing.
    MemberState state = MemberState::kWaiting;
    uint32_t missed_in_row = 0;
    std::string missed_reason;
    // Recent ready times (from the start of its training in a round to
    // its ReportReady), newest last: the adaptive deadline's input.
    std::deque<absl::Duration> ready_times;
    // When it started training in the current round.
    absl::Time training_since;
    // Late work reported ready for fold_round (0 = none), counted when
    // that round completes with it.
    uint64_t fold_round = 0;
    uint64_t fold_staleness = 0;
    double fold_weight = 0;
    double fold_train_seconds = 0;
    // Per current round.
    bool ready = false;
    bool connections_ok = false;
    std::vector<std::string> unreachable;
    bool done = false;
    // Version of the participant list this member's session was given in a
    // full plan (0 = none): plans with that list go to it without slices.
    uint64_t plan_list_known = 0;
    // The round whose training it finished before its session broke (its
    // JoinRound said so; 0 = none): that ready report says nothing of its
    // speed.
    uint64_t carried_round = 0;
  };

  // The participants (join order decides the plan's slice order) and the
  // queue, each an ordered list with a set; the per-round flags counted
  // over the participants, so that a report checks its barrier in O(1).
  struct Roster {
    std::vector<std::string> participants;
    absl::flat_hash_set<std::string> participant_set;
    std::vector<std::string> queued;
    absl::flat_hash_set<std::string> queued_set;
    size_t ready = 0;
    size_t connected = 0;
    // Of the connected: how many named unreachable peers.
    size_t unreachable = 0;
    size_t done = 0;
  };

  // The clocks of the current round.
  struct Timing {
    absl::Time started_at = absl::InfinitePast();
    // The ready deadline --round_timeout sets (extended while nobody is
    // ready), the first ready report's time since the start, and the
    // deadline in force with its reason (kept for the status after the
    // round moved on).
    absl::Time hard_ready_deadline;
    std::optional<absl::Duration> first_ready;
    ReadyDeadlineDecision ready_deadline;
    // The running timeout: training, connection or exchange deadline,
    // depending on the phase.
    absl::Time deadline = absl::InfiniteFuture();
  };

  // The current plan: its attempt, its connection retries, whether sharing
  // started; the participant list (id, address, in order) of the latest
  // plan, which of them are outbound-only (part of the list's identity)
  // and its version (RoundPlan.participants_version: one version names one
  // list within a coordinator's lifetime, unique across starts).
  struct Plan {
    uint32_t attempt = 0;
    uint32_t connection_retries = 0;
    bool sharing_started = false;
    std::vector<std::pair<std::string, std::string>> list;
    std::vector<bool> list_outbound;
    // SliceAssignment.share of each entry of `list` (all zero: even).
    std::vector<uint32_t> list_shares;
    uint64_t list_version = 0;
    // Bandwidth-proportional slices: the shares decided at the round's
    // start (core/slice_sizing.h), which every attempt of the round cuts
    // by; and the fraction of the model each participant owned in the
    // latest plan (WorkerStatus.slice_share).
    absl::flat_hash_map<std::string, uint32_t> round_shares;
    absl::flat_hash_map<std::string, double> owned_fraction;
  };

  // One step's context: the time, the world, the output being built.
  struct Ctx {
    absl::Time now;
    const RoundWorld& world;
    RoundOutput& out;
    void Send(const std::string& worker_id, SharedMessage message) {
      out.directives.push_back({worker_id, std::move(message)});
    }
    void Intend(RoundIntent intent) {
      out.intents.push_back({out.directives.size(), std::move(intent)});
    }
  };

  Seat& S(const std::string& worker_id) { return seats_.at(worker_id); }
  const Seat& S(const std::string& worker_id) const { return seats_.at(worker_id); }
  bool HasSeat(const std::string& worker_id) const { return seats_.contains(worker_id); }

  // ------------------------------------------------ The events (Step)
  void OnCheckJoin(Ctx& c, const round_event::CheckJoin& e);
  void OnJoined(Ctx& c, const round_event::Joined& e);
  void OnHeartbeat(Ctx& c, const round_event::Heartbeat& e);
  void OnJoinRound(Ctx& c, const round_event::JoinRound& e);
  void OnReady(Ctx& c, const shoal::v1::ReportReadyRequest& request);
  void OnConnectionsReady(Ctx& c, const shoal::v1::ConnectionsReadyRequest& request);
  void OnRoundDone(Ctx& c, const shoal::v1::ReportRoundDoneRequest& request);
  void OnAudit(Ctx& c, const shoal::v1::ReportAuditRequest& request);
  void OnTick(Ctx& c, const round_event::Tick& e);
  void OnHold(Ctx& c, bool hold);
  void OnDeparted(Ctx& c, const round_event::Departed& e);
  void OnFinish();
  void OnResume(Ctx& c, const shoal::v1::RunRecord& record);

  // ------------------------------------------- Participants and queue
  void AddParticipant(const std::string& worker_id);
  // False when the worker was no participant.
  bool RemoveParticipant(const std::string& worker_id);
  // Hands the participants over (in order) and leaves none.
  std::vector<std::string> TakeParticipants();
  bool IsParticipant(const std::string& worker_id) const {
    return roster_.participant_set.contains(worker_id);
  }
  void Enqueue(const std::string& worker_id);
  bool IsQueued(const std::string& worker_id) const {
    return roster_.queued_set.contains(worker_id);
  }
  void Dequeue(const std::string& worker_id);
  std::vector<std::string> TakeQueue();
  // Applies `update` to the member's per-round flags, keeping the counters
  // right when it is a participant.
  void UpdateFlags(const std::string& worker_id, absl::FunctionRef<void(Seat&)> update);
  void ResetRoundFlags(const std::string& worker_id);
  void CountFlags(const Seat& s, int sign);

  // ------------------------------------------------------- Departures
  // Drops the member from the round with no consequence; true when it took
  // part in the current round.
  bool Forget(const std::string& worker_id);
  // The round removes the member: what the round shows of it, Forget, and
  // the Depart intent. False when it has no seat (already removed).
  bool Evict(Ctx& c, const std::string& worker_id, MemberState why, const std::string& reason);
  // Evict, then the consequence for the round (OnDeparted).
  void RemoveMember(Ctx& c, const std::string& worker_id, MemberState why,
                    const std::string& reason);
  // The run ends (the round is FINISHED at once): the Finish intent.
  void FinishRun(Ctx& c, const std::string& reason, bool failed);

  // ------------------------------------------------------------ Rounds
  absl::Status CheckRound(uint64_t round, const char* what) const;
  absl::Status CheckParticipant(const std::string& worker_id, uint64_t round,
                                const char* what) const;
  // True when the member holds the run's agreed model (no catch-up).
  bool HoldsAgreedModel(const Seat& s) const;
  // The Peer addresses of the members that hold the agreed model.
  std::vector<std::string> Holders(const RoundWorld& world) const;
  // RoundStart of the current round; `with_holders` lists the holders of
  // its base model (O(N)), which only a worker without it needs.
  shoal::v1::CoordinatorMessage RoundStartMessage(const RoundWorld& world, bool with_holders) const;
  void MaybeStartRound(Ctx& c);
  // The checks of a ready report before it is taken; the fold it carries.
  absl::Status CheckReady(const shoal::v1::ReportReadyRequest& request,
                          std::optional<FoldedReady>* fold);
  void MaybeSendPlan(Ctx& c);
  // At a round's start: the shares its plans cut the slices by
  // (RunConfig.exchange.slice_sizing; none when equal).
  void DecideShares(Ctx& c);
  // Every participant is ready: sends the round's audits (once) and
  // returns true when none is out any more (the plan may go).
  bool AuditsSettled(Ctx& c);
  // Moves the member's score; below the ban line it is banned and, unless
  // `evicting` (its caller evicts it), removed.
  void Penalize(Ctx& c, const std::string& worker_id, TrustEvent event, const std::string& detail,
                bool evicting = false);
  void SendPlan(Ctx& c);
  // The plan's hierarchical stages (RoundPlan.hierarchy) when the run has
  // them and the participants sit in several zones; how many stages.
  size_t AddHierarchy(Ctx& c, const std::vector<bool>& outbound, shoal::v1::RoundPlan* plan);
  void MaybeStartSharing(Ctx& c);
  void ApplyConnectionBarrier(Ctx& c, ConnectionEvent event);
  void RetryConnections(Ctx& c, const std::string& reason);
  void EvictFailingPeers(Ctx& c, const std::string& reason);
  FailingPeers ComputeFailingPeers() const;
  absl::Status CheckRoundDone(const shoal::v1::ReportRoundDoneRequest& request) const;
  void MaybeCompleteRound(Ctx& c);
  // The round's hash vote is settled with `hash`: the round is complete.
  void CompleteRound(Ctx& c, const std::string& hash);
  // A participant was lost after the plan: the survivors exchange again.
  void Replan(Ctx& c, const std::string& reason);
  void AbortRound(Ctx& c, const std::string& reason);
  // AbortRound without starting the next round.
  void TakeBackRound(Ctx& c, const std::string& reason);
  // A participant could not load the round's base: it sits out, or the run
  // goes back to an older checkpoint, or it stops (core/base_recovery.h).
  void BaseUnavailable(Ctx& c, const shoal::v1::ReportReadyRequest& request);
  // The worker sits the round out; it stays a member (queued for the next
  // round) unless it missed too many in a row. `adaptive`: it missed the
  // adaptive ready deadline.
  void MissRound(Ctx& c, const std::string& worker_id, const std::string& reason,
                 bool adaptive = false);
  // Recomputes the ready deadline while TRAINING; it becomes the running
  // deadline.
  void UpdateReadyDeadline(Ctx& c);
  void ApplyRoundDeadline(Ctx& c);
  void ApplyDeadlineDecision(Ctx& c, RoundStage stage, const RoundDeadlineDecision& deadline);
  AdaptiveDeadlineOptions AdaptiveOptions() const;
  // The current ready deadline in seconds after the round start (0: none).
  double ReadyDeadlineSeconds() const;
  // Asks a holder of the agreed model of `round` to upload it.
  void AssignCheckpoint(Ctx& c, uint64_t round, bool first);
  std::string PhaseDetail(const RoundWorld& world) const;

  Options options_;
  shoal::v1::Phase phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  // The round in progress, or the next one to start.
  uint64_t round_ = 1;
  uint64_t last_completed_round_ = 0;
  std::string agreed_hash_;
  // The latest time the run went back to an older checkpoint (status).
  std::string base_fallback_;
  bool held_ = false;
  // No round completed since this coordinator started (restart window).
  bool fresh_start_ = true;
  // A participant of the current round reported ready (the join window is
  // closed), and the model size the run's reports agree on.
  bool any_ready_ = false;
  uint64_t total_elements_ = 0;
  // Every active member's seat (nodes never move).
  absl::node_hash_map<std::string, Seat> seats_;
  Roster roster_;
  Timing timing_;
  Plan plan_;
  // RunConfig.training.sample_ledger: which samples each participant
  // trains (core/sample_ledger.h); none when off.
  std::optional<SampleLedger> ledger_;
  // Audits, scores and bans (RunConfig.trust).
  RoundTrust trust_;
  // Each member's measured exchange rate and the shares of the plans
  // (RunConfig.exchange.slice_sizing); the reads the current attempt's
  // done reports carried, added to it when the round completes.
  SliceSizer sizer_;
  std::vector<ReadSample> round_reads_;
  absl::flat_hash_map<std::string, uint32_t> round_reads_per_source_;
  static constexpr uint32_t kReadsPerSource = 64;
  // Members banned where no directive could be sent (a heartbeat): removed
  // at the next tick. (id, reason)
  std::vector<std::pair<std::string, std::string>> bans_due_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_SYNC_ROUND_H_
