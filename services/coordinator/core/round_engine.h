// The coordinator's round state machine: membership, the synchronous round
// (WAITING_FOR_MEMBERS -> TRAINING -> SHARING -> next round / FINISHED), the
// shard plan of each round, the peer-connection barrier with retries, round
// deadlines for stragglers, and the model hashes reported after each round.
//
// Plain C++: no gRPC types. Every method takes the current time from the
// injected Clock and returns the directives to push to workers; the caller
// delivers them after the call returns (the engine never calls out). Tick()
// applies every timeout; nothing waits inside the engine.
//
// The decisions themselves (who is admitted, when a round starts, the
// connection barrier, the hash vote, deadlines, leases, checkpoint uploads)
// are pure functions in round_decisions.h; the engine gathers their inputs,
// calls them and carries the result out. The implementation is split by
// concern: round_engine.cc (bookkeeping, indexes, versions, Tick),
// round_engine_membership.cc (join, admission, sessions, departures),
// round_engine_phases.cc (start, plan, barrier, sharing, completion,
// deadlines), round_engine_checkpoints.cc and round_engine_status.cc.
//
// Thread-safe: one mutex guards all state.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/member_credentials.h"
#include "services/coordinator/core/relay_assignment.h"
#include "services/coordinator/core/round_decisions.h"
#include "services/coordinator/core/zone_election.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

struct EngineOptions {
  shoal::v1::RunConfig config;
  std::string run_id;
  // A member whose session sent nothing for this long is removed.
  absl::Duration heartbeat_lease = absl::Seconds(10);
  // A joined worker that opens no session within this time is removed.
  absl::Duration session_grace = absl::Seconds(10);
  // Participants not ready this long after the round started sit the round
  // out; the same deadline applies to the exchange after sharing starts.
  absl::Duration round_timeout = absl::Seconds(120);
  // Time for every participant to report ConnectionsReady for a plan.
  absl::Duration connection_timeout = absl::Seconds(10);
  // Connection retries of one plan before the failing peers are evicted.
  uint32_t max_connection_retry = 3;
  // A worker that misses this many rounds in a row is asked to leave
  // (0 = never). Misses of the adaptive deadline by a live worker do not
  // count.
  uint32_t max_missed_rounds = 5;
  // The ready deadline from the participants' measured ready times
  // (DecideReadyDeadline); its round_timeout is taken from round_timeout
  // above. enabled = false keeps the fixed round_timeout.
  AdaptiveDeadlineOptions adaptive_deadline;
  // Largest number of members at once (--max_members); a new worker past it
  // is refused with RESOURCE_EXHAUSTED (a member re-joining under its id is
  // not new). 0 = no limit.
  uint32_t max_members = 0;
  // The service probes each joining worker's Peer address with a TCP
  // connect this long (--probe_joiners_timeout); a worker it cannot reach
  // is outbound-only (behind NAT: docs/SUPERNODES.md). 0 = no probe (only
  // workers that declare --outbound_only are).
  absl::Duration join_probe_timeout = absl::ZeroDuration();
  // Removed members stay visible in the status, up to this many.
  size_t max_departed_shown = 50;
  // Workers asked to upload each checkpoint, one after the other until one
  // succeeds (the first holder by id, then the next).
  uint32_t checkpointers = 1;
  // An upload not reported within this time moves to another worker.
  absl::Duration checkpoint_timeout = absl::Seconds(120);
  // Where the run continues from (a persisted record), if anywhere.
  std::optional<shoal::v1::RunRecord> resume;
  // Replicas (--etcd): called (under the engine's lock) with the run record
  // as it stands and its record_version() right before a round would start;
  // false = do not start it now (the record cannot be written under this
  // leader's term, or its lease is uncertain). The round starts on a later
  // event or HoldRounds(false). Unset = rounds start freely.
  std::function<bool(const shoal::v1::RunRecord&, uint64_t version)> before_round_start;
  // The supernode election (docs/SUPERNODES.md): hysteresis factor and
  // rounds (--supernode_switch_factor, --supernode_switch_rounds).
  ElectionOptions election;
  // Member credentials (common/member_credentials.h; on with --token_file):
  // every Join returns a fresh credential, and every member's session hears
  // which credentials are current (MemberUpdate). Off = no credentials.
  bool member_credentials = false;
  // Makes the random part of each credential (tests); RandomCredentialSecret
  // when unset.
  std::function<std::string()> credential_secret;
  // The secret shared with the checkpoint store (--upload_key_file; empty =
  // no grants): every CheckpointRequest carries an upload grant signed with
  // it (common/upload_grant.h), valid for checkpoint_timeout plus a minute
  // (gossip: gossip_grant_ttl, for every later sequence of the run).
  std::string upload_key;
  absl::Duration gossip_grant_ttl = absl::Hours(24);
};

// A message for one worker's session stream. Immutable and shared: a
// broadcast (RoundStart with its holders, RoundPlan with one slice per
// participant) is built once and every recipient's Directive points at the
// same object. Copying an O(N) message per recipient made each round O(N^2);
// the service also serializes each shared message only once.
using SharedMessage = std::shared_ptr<const shoal::v1::CoordinatorMessage>;
struct Directive {
  std::string worker_id;
  SharedMessage message;
};
using Directives = std::vector<Directive>;

struct JoinResult {
  shoal::v1::JoinResponse response;
  Directives directives;
};

class RoundEngine {
 public:
  RoundEngine(EngineOptions options, const Clock* clock);

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
  // The session stream broke or the worker left: it is removed at once.
  Directives Disconnect(const std::string& worker_id, const std::string& reason);

  // Admits the worker to `round` or, when that round already has a ready
  // participant, to the next one. Returns the admitted round. `carried`:
  // the round the worker already trained before its session broke
  // (JoinRoundRequest.carried_round, 0 = none).
  absl::StatusOr<uint64_t> JoinRound(const std::string& worker_id, uint64_t round, Directives* out,
                                     uint64_t carried = 0);
  absl::Status ReportReady(const shoal::v1::ReportReadyRequest& request, Directives* out);
  absl::Status ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request, Directives* out);
  absl::Status ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request, Directives* out);
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request, Directives* out);

  // Applies every timeout: leases, round deadline, connection deadline.
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
  // Increments whenever Record() changes (once per call that changed it);
  // the server persists on change.
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
  // the members and compares them with the maintained ones (tests).
  bool CountersConsistentForTesting() const;

 private:
  enum class MemberState { kWaiting, kTraining, kReady, kSharing, kLeft, kEvicted };

  // The one place status_version_ and record_version_ move. Each public call
  // that may change the state declares a Changes right after taking mu_;
  // the code it runs marks what changed (MarkStatusChanged,
  // MarkRecordChanged) and the Changes bumps each version at most once
  // when the call returns, still under mu_. A record change is a status
  // change too.
  class Changes {
   public:
    explicit Changes(RoundEngine* engine) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine->mu_);
    // Runs before the MutexLock declared ahead of it releases mu_.
    ~Changes() ABSL_NO_THREAD_SAFETY_ANALYSIS;
    Changes(const Changes&) = delete;
    Changes& operator=(const Changes&) = delete;

   private:
    RoundEngine* const engine_;
  };
  struct Member {
    std::string id;
    std::string address;
    std::string name;
    // Its zone (JoinRequest.zone, common/zone.h); empty = the root.
    std::string zone;
    // Behind NAT: owns no slice, pushes its contributions, is never read,
    // probed or offered as a source (docs/SUPERNODES.md "NAT"); and why.
    bool outbound_only = false;
    std::string outbound_reason;
    uint32_t data_rank = 0;
    MemberState state = MemberState::kWaiting;
    bool connected = false;
    absl::Time joined_at;
    absl::Time last_seen;
    std::string model_hash;
    uint64_t model_round = 0;
    shoal::v1::Metrics metrics;
    uint64_t metrics_round = 0;
    double train_loss = 0;
    uint64_t rounds_completed = 0;
    std::string reason;
    uint32_t missed_in_row = 0;
    std::string missed_reason;
    shoal::v1::Heartbeat progress;  // latest heartbeat (sync progress)
    // Recent ready times (from the start of its training in a round to its
    // ReportReady, as measured here) and train_seconds of its RoundDone
    // reports, newest last; and the rounds it sat out for the adaptive
    // deadline.
    std::deque<absl::Duration> ready_times;
    std::deque<double> train_seconds;
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
    // Gossip mode: it called JoinRound and is in the peer lists.
    bool gossiping = false;
    // What the supernode election uses (ReportRoundDone fields 110-111):
    // median step time, seconds, and median inbound bandwidth, bytes per
    // second; 0 = not measured.
    double step_seconds = 0;
    double bandwidth_bps = 0;
    // The round whose training it finished before its session broke, as
    // its JoinRound said (0 = none): its ready report for that round comes
    // at once and says nothing of its speed.
    uint64_t carried_round = 0;
  };

  static const char* StateName(MemberState s);
  // Something Status() reports changed (not the passing of time).
  void MarkStatusChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Something Record() reports changed (worker numbering, the agreed model,
  // the checkpoint, finished).
  void MarkRecordChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  shoal::v1::RunStatus StatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current ready deadline in seconds after the round start (0 when
  // none is set).
  double ReadyDeadlineSeconds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  shoal::v1::RunRecord RecordLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Participants and the queue: an ordered vector (join order decides the
  // plan's slice order) plus a hash set for O(1) membership tests, and the
  // counters of the per-round flags (ready, connections_ok, done) over the
  // current participants, so that a report checks its barrier in O(1)
  // instead of walking every participant. All changes go through these.
  void AddParticipant(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns false when the worker was no participant.
  bool RemoveParticipant(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the participants over (in order) and leaves none.
  std::vector<std::string> TakeParticipants() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Enqueue(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsQueued(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Dequeue(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> TakeQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `update` to the member's per-round flags (ready,
  // connections_ok, unreachable, done), keeping the counters right when it
  // is a participant.
  template <typename F>
  void UpdateFlags(Member& m, F&& update) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Clears ready, connections_ok and done.
  void ResetRoundFlags(Member& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountFlags(const Member& m, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Member*> FindActive(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The active member `worker_id` (which must be one).
  Member& At(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsParticipant(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRound(uint64_t round, const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The active member `worker_id`, when `round` is the current round (for
  // `what`) and it takes part in it; FAILED_PRECONDITION / NOT_FOUND else.
  absl::StatusOr<Member*> FindParticipant(const std::string& worker_id, uint64_t round,
                                          const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> Holders() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the member holds the run's agreed model (no catch-up).
  bool HoldsAgreedModel(const Member& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins answered with model file holders (rotates the holders offered).
  uint64_t joins_for_file_ ABSL_GUARDED_BY(mu_) = 0;
  // RoundStart of the current round; `with_holders` lists the holders of
  // its base model (O(N)), which only a worker without it needs.
  shoal::v1::CoordinatorMessage RoundStartMessage(bool with_holders) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartRound(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSendPlan(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendPlan(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartSharing(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies DecideConnectionBarrier after a report (kReport) or at the
  // connection deadline (kDeadline).
  void ApplyConnectionBarrier(ConnectionEvent event, Directives* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetryConnections(const std::string& reason, Directives* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictFailingPeers(const std::string& reason, Directives* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FindFailingPeers over the current participants.
  FailingPeers ComputeFailingPeers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCompleteRound(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The parts of Tick: member leases, the checkpoint upload in progress and
  // the round's running deadline.
  void ExpireLeases(absl::Time now, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchCheckpoint(absl::Time now, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyRoundDeadline(absl::Time now, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker sits the round out; it stays a member (queued for the next
  // round) unless it missed too many in a row. `adaptive`: it missed the
  // adaptive ready deadline (DecideMissedRound).
  void MissRound(const std::string& worker_id, const std::string& reason, Directives* out,
                 bool adaptive = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recomputes the ready deadline (DecideReadyDeadline) while TRAINING and
  // makes it the running deadline.
  void UpdateReadyDeadline(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // options_.adaptive_deadline with options_.round_timeout.
  AdaptiveDeadlineOptions AdaptiveOptions() const;
  // How many recent samples a member keeps (at least after_rounds).
  size_t SampleWindow() const;
  // Moves the member to departed_ and out of the queue and the round;
  // returns true when it was a participant. No round consequences. The id is
  // taken by value: callers pass the members_ key itself, which this erases.
  // With member credentials it also revokes the member's credential and
  // tells the other members (`out`).
  bool Depart(std::string worker_id, MemberState why, const std::string& reason, Directives* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A credential change goes to every member with an open session (one
  // shared message; O(1) bytes per recipient).
  void SendMemberUpdate(shoal::v1::MemberUpdate update, Directives* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Depart plus what it means for the round (plan, re-plan, wait); the id by
  // value for the same reason.
  void RemoveMember(std::string worker_id, MemberState why, const std::string& reason,
                    Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A participant was lost after the plan: the survivors exchange again
  // with a new plan (attempt + 1), from their trained models.
  void Replan(const std::string& reason, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortRound(const std::string& reason, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(const std::string& reason, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the next untried holder of `round` to upload it; gives up when none
  // is left.
  void AssignCheckpoint(uint64_t round, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PhaseDetail() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gossip mode (docs/GOSSIP.md): no rounds; JoinRound puts a member in
  // the peer list, and every change of the list goes to every gossiping
  // member as a PeerUpdate.
  bool gossip() const { return options_.config.has_gossip(); }
  void SendPeerUpdate(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gossip with gossip_final_average: sends the GossipFinal once every
  // member is done, and finishes the run once they all reported
  // (core/final_average.h). Called by Tick.
  void MaybeFinalAverage(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With consensus_eval_every: names the consensus evaluator, the member
  // that trained the most steps (sticky: another takes over only with 1.5 x
  // its steps, or when it is gone); a change goes out as a PeerUpdate.
  void UpdateConsensusEvaluator(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gossip mode with a checkpoint store: keeps one gossiping member as the
  // checkpointer (DecideGossipCheckpointer) and tells a new one with a
  // CheckpointRequest (gossip = true). Called on every peer-list change.
  void AssignGossipCheckpointer(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The supernode election (zone_election.h). Membership changes mark it
  // stale and the next Tick re-elects (so a burst of joins costs one
  // O(N log N) election, not one per join); the loss of a supernode or a
  // standby re-elects at once, so that the standby takes over before any
  // plan is built; a completed round re-elects with its new measurements
  // (the only evaluations that count for the hysteresis).
  void MarkElectionStale() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { election_stale_ = true; }
  void Reelect(ElectionTrigger trigger) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A departure: re-elects at once when `worker_id` held a role.
  void ReelectAfterDeparture(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With RunConfig.topology.relay, after an election: the members' routes
  // (relay_assignment.h); those that changed are queued in relay_changes_
  // as UseRelay directives, which the next Tick hands out.
  void UpdateRelayRoutes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReportCheckpoint in gossip mode: a report from the checkpointer of a
  // sequence number past the latest.
  absl::Status ReportGossipCheckpoint(const shoal::v1::ReportCheckpointRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineOptions options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  bool rounds_held_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);  // active ones, by id
  // The same members by id in O(1) for the per-report lookups (the map keeps
  // the id order that Status() and Tick() walk; its nodes never move).
  absl::flat_hash_map<std::string, Member*> index_ ABSL_GUARDED_BY(mu_);
  std::deque<Member> departed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_worker_number_ ABSL_GUARDED_BY(mu_) = 1;
  shoal::v1::Phase phase_ ABSL_GUARDED_BY(mu_) = shoal::v1::WAITING_FOR_MEMBERS;
  // The round in progress, or the next one to start.
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t last_completed_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::string agreed_hash_ ABSL_GUARDED_BY(mu_);
  // No round completed since this coordinator started (restart window).
  bool fresh_start_ ABSL_GUARDED_BY(mu_) = true;
  // Participants of round_ (in join order) while TRAINING / SHARING, and the
  // same ids as a set.
  std::vector<std::string> participants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> participant_set_ ABSL_GUARDED_BY(mu_);
  // How many participants are ready / reported ConnectionsReady (and of
  // those, how many named unreachable peers) / reported RoundDone.
  size_t ready_count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t connected_count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t unreachable_count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_count_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers admitted to the next round to start (waiting), and as a set.
  std::vector<std::string> queued_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> queued_set_ ABSL_GUARDED_BY(mu_);
  bool any_ready_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t total_elements_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time round_started_at_ ABSL_GUARDED_BY(mu_);
  // The ready deadline of the current round: the one --round_timeout sets
  // (extended while nobody is ready), the first ready report's time since
  // the round started, and the deadline in force with its reason (kept for
  // the status after the round moved on).
  absl::Time hard_ready_deadline_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Duration> first_ready_ ABSL_GUARDED_BY(mu_);
  ReadyDeadlineDecision ready_deadline_ ABSL_GUARDED_BY(mu_);
  // The running timeout: training deadline, connection deadline or exchange
  // deadline, depending on the phase.
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  uint32_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  // The participant list (id, address, in order) of the latest plan and its
  // version (RoundPlan.participants_version): one version names one list
  // within a coordinator's lifetime, and versions are unique across starts.
  std::vector<std::pair<std::string, std::string>> plan_list_ ABSL_GUARDED_BY(mu_);
  // Which of plan_list_ are outbound-only (part of the list's identity).
  std::vector<bool> plan_list_outbound_ ABSL_GUARDED_BY(mu_);
  uint64_t plan_list_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Gossip mode: version of the latest PeerUpdate.
  uint64_t peer_list_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Gossip mode: members that left after their --gossip_steps.
  uint64_t gossip_finished_ ABSL_GUARDED_BY(mu_) = 0;
  // The final average: whether the GossipFinal went out, to whom, and what
  // the status says of it.
  bool final_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> final_recipients_ ABSL_GUARDED_BY(mu_);
  std::string final_summary_ ABSL_GUARDED_BY(mu_);
  std::string consensus_evaluator_ ABSL_GUARDED_BY(mu_);
  uint32_t connection_retries_ ABSL_GUARDED_BY(mu_) = 0;
  bool sharing_started_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<shoal::v1::RoundSummary> recent_rounds_ ABSL_GUARDED_BY(mu_);
  // Moved only by Changes; the flags collect one call's changes.
  uint64_t record_version_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t status_version_ ABSL_GUARDED_BY(mu_) = 1;
  bool record_changed_ ABSL_GUARDED_BY(mu_) = false;
  bool status_changed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t departures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string checkpoint_id_ ABSL_GUARDED_BY(mu_);
  uint64_t checkpoint_round_ ABSL_GUARDED_BY(mu_) = 0;
  // The upload in progress: round (0 = none), worker, since when, and the
  // workers already tried for it.
  uint64_t pending_checkpoint_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::string pending_checkpoint_worker_ ABSL_GUARDED_BY(mu_);
  absl::Time pending_checkpoint_since_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> checkpoint_tried_ ABSL_GUARDED_BY(mu_);
  // Gossip mode: the checkpointer (empty = none), and of the latest
  // checkpoint the uploader's clock, steps, id and when it was recorded.
  std::string gossip_checkpointer_ ABSL_GUARDED_BY(mu_);
  double checkpoint_clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t checkpoint_steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::string checkpoint_worker_ ABSL_GUARDED_BY(mu_);
  absl::Time checkpoint_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The latest election, whether membership changed since, and the roles it
  // gives (id -> "supernode" / "standby"; absent = "member").
  ElectionResult election_ ABSL_GUARDED_BY(mu_);
  bool election_stale_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, const char*> roles_ ABSL_GUARDED_BY(mu_);
  // RunConfig.topology.relay: every member's route after the latest election, and
  // the UseRelay directives not handed out yet.
  std::vector<RelayAssignment> relay_routes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> relay_route_of_ ABSL_GUARDED_BY(mu_);
  Directives relay_changes_ ABSL_GUARDED_BY(mu_);
  absl::Time started_at_;
  // Member credentials, when on (EngineOptions::member_credentials).
  std::optional<MemberRoster> roster_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_
