// The round engine's decisions as pure functions: admission of joiners, the
// start of a round, the peer-connection barrier and who fails it, the hash
// vote that settles a round, the round deadlines, missed rounds, member
// leases and checkpoint uploads.
//
// Each function takes a small snapshot of the state it needs, the options
// that bound it and, where time matters, `now`; it returns what to do and a
// readable `reason`. No mutex, no clock, no I/O, no logging: RoundEngine
// gathers the inputs under its lock, calls these and carries the decision
// out (messages, state changes, log lines). Where a reason ends up in a
// message to a worker (RoundAborted, RoundMissed, ConnectionFail, and
// LeaveRequested after missed rounds) it is exactly that message's text.
//
// Thread-compatible: no state.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ROUND_DECISIONS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ROUND_DECISIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// ------------------------------------------------------------- Admission

// The round a worker joining now can still take part in: the current one
// while it waits for members or trains with nobody ready yet (a joiner then
// trains the same base model), otherwise the next one.
uint64_t NextOpenRound(shoal::v1::Phase phase, uint64_t round, bool any_ready);

struct AdmissionInput {
  shoal::v1::Phase phase = shoal::v1::WAITING_FOR_MEMBERS;
  // The round in progress, or the next one to start.
  uint64_t round = 1;
  // A participant of `round` reported ready (the join window is closed).
  bool any_ready = false;
  // The round the worker asks for; 0 = the earliest one still open to it.
  uint64_t requested = 0;
  bool participant = false;  // already takes part in `round`
  bool queued = false;       // already queued
  // The round whose training the worker already finished before its
  // session broke (JoinRoundRequest.carried_round); 0 = none.
  uint64_t carried = 0;
};

struct AdmissionDecision {
  enum class Action {
    kReject,             // finished run, stale or future round: FAILED_PRECONDITION
    kAlreadyIn,          // a retried call: nothing changes
    kQueueForThisRound,  // queued; the round starts once min_participants are queued
    kJoinRunningRound,   // joins the round that is training (RoundStart now); also
                         // after a ready report when it carries that round's work
    kQueueForNextRound,  // queued for round + 1
  };
  Action action = Action::kReject;
  // The admitted round (not for kReject).
  uint64_t round = 0;
  std::string reason;
};

AdmissionDecision DecideAdmission(const AdmissionInput& in);

struct RoundStartDecision {
  bool start = false;
  std::string reason;
};

// Whether the next round starts now: only while the run waits for members,
// once at least max(1, min_participants) workers are queued.
RoundStartDecision DecideRoundStart(shoal::v1::Phase phase, uint64_t round, size_t queued,
                                    uint32_t min_participants);

// ---------------------------------------------------- Connection barrier

// What moved the barrier: a participant's ConnectionsReady report, or the
// connection deadline passing (applied only by Tick).
enum class ConnectionEvent { kReport, kDeadline };

struct ConnectionBarrierInput {
  uint64_t round = 0;
  size_t participants = 0;
  // Participants that reported ConnectionsReady for the current plan, and
  // how many of those named unreachable peers.
  size_t reported = 0;
  size_t reported_unreachable = 0;
  // Retries of the current plan so far.
  uint32_t retries = 0;
};

struct ConnectionBarrierDecision {
  enum class Action {
    kWait,          // reports are missing and the deadline has not passed
    kStartSharing,  // everyone reached everyone
    kRetry,         // RetryPeerConnections to all (retry number retries + 1)
    kEvictFailing,  // out of retries: the failing peers are evicted, the rest re-plan
  };
  Action action = Action::kWait;
  std::string reason;
};

// A report that completes the barrier without unreachable peers starts the
// sharing; a complete barrier with unreachable peers, or the deadline, is
// retried up to `max_connection_retry` times before the failing peers go.
ConnectionBarrierDecision DecideConnectionBarrier(const ConnectionBarrierInput& in,
                                                  ConnectionEvent event,
                                                  uint32_t max_connection_retry);

// One participant's connection report for the current plan.
struct PeerReport {
  absl::string_view worker_id;
  bool reported = false;  // sent ConnectionsReady
  // The participants it could not reach (empty when it did not report).
  absl::Span<const std::string> unreachable;
};

struct FailingPeers {
  std::vector<std::string> failing;
  std::string reason;
};

// Who is to blame for a failed barrier, by the first rule that names
// anyone: (1) participants that did not report, or that a strict majority of
// the others that reported cannot reach (so one worker that reaches nobody
// does not drag down the peers it names); (2) participants that cannot reach
// most of the others (their own outbound connections fail); (3) everyone
// named unreachable at least once (e.g. two workers that cannot reach each
// other). Rules 1 and 2 list in participant order, rule 3 by id.
FailingPeers FindFailingPeers(absl::Span<const PeerReport> participants);

// -------------------------------------------------------------- Hash vote

struct HashReport {
  absl::string_view worker_id;
  absl::string_view model_hash;
};

struct HashVote {
  enum class Outcome {
    kAgreed,      // `hash` is the round's model; `minority` is evicted
    kNoMajority,  // nobody can tell which copy is right: the round is aborted
  };
  Outcome outcome = Outcome::kNoMajority;
  std::string hash;
  // Participants whose hash differs from `hash` (in report order).
  std::vector<std::string> minority;
  std::string reason;
};

// The hash a strict majority of the participants reported wins (a single
// hash always wins); with several hashes and no strict majority (a tie) the
// round is aborted and everyone rolls back.
HashVote DecideHashVote(absl::Span<const HashReport> reports);

// -------------------------------------------------------- Round deadlines

// Where the round is, as far as its running deadline is concerned.
enum class RoundStage {
  kWaitingForMembers,  // no deadline
  kTraining,           // round start -> every participant ready (round_timeout)
  kConnecting,         // plan -> every participant connected (connection_timeout)
  kSharing,            // StartWeightSharing -> every participant done (round_timeout)
  kFinished,           // no deadline
};

RoundStage StageOf(shoal::v1::Phase phase, bool sharing_started);

// How the wait for the ready reports adapts to the participants' measured
// times (--adaptive_deadline and the flags after it).
struct AdaptiveDeadlineOptions {
  bool enabled = true;
  // A participant's recent ready time counts once it was measured in at
  // least this many rounds.
  uint32_t after_rounds = 3;
  // Budget = factor x the median of the measured participants' recent ready
  // times, at least `floor`, at most `round_timeout`.
  double factor = 2.0;
  absl::Duration floor = absl::Seconds(2);
  absl::Duration round_timeout = absl::Seconds(120);
};

struct ReadyDeadlineInput {
  absl::Time round_started;
  // The deadline --round_timeout sets: round_started + round_timeout, or
  // later once nobody was ready by then (the wait is extended).
  absl::Time hard_deadline = absl::InfiniteFuture();
  // Per participant measured in at least `after_rounds` rounds: the median
  // of its recent ready times (round start -> ReportReady, as the
  // coordinator saw them). Participants not measured enough are left out.
  std::vector<absl::Duration> measured;
  size_t participants = 0;
  // The first ready report of this round, time since the round started
  // (none yet: nullopt).
  std::optional<absl::Duration> first_ready;
};

struct ReadyDeadlineDecision {
  // When the participants not ready by then sit the round out.
  absl::Time deadline = absl::InfiniteFuture();
  // True when `deadline` is the adaptive one (earlier than --round_timeout):
  // those who miss it are slow, not lost (see DecideMissedRound).
  bool adaptive = false;
  std::string reason;
};

// The deadline of the ready reports. Off, or with no participant measured
// in `after_rounds` rounds yet: `hard_deadline` (today's rule). Else
// round_started + clamp(factor x basis, floor, round_timeout), where the
// basis is the median of `measured` or, when this round's first ready
// report came later than that median (everyone is slower now), that first
// report's time; so a round where everyone slows down does not leave all
// but the fastest out. When nobody is ready by the adaptive deadline
// (`now` past it) the wait falls back to `hard_deadline` until the first
// ready report, which computes it again. Never later than `hard_deadline`.
ReadyDeadlineDecision DecideReadyDeadline(const ReadyDeadlineInput& in,
                                          const AdaptiveDeadlineOptions& options, absl::Time now);

// The median of `samples` (the mean of the middle two for an even count);
// zero when empty.
absl::Duration MedianDuration(std::vector<absl::Duration> samples);

struct RoundDeadlineInput {
  RoundStage stage = RoundStage::kWaitingForMembers;
  absl::Time deadline = absl::InfiniteFuture();
  size_t participants = 0;
  // The participants that have not reported for this stage: not ready while
  // training, not done while sharing (unused while connecting).
  std::vector<std::string> late;
  // While training: `deadline` is the adaptive one (ReadyDeadlineDecision),
  // and why it is where it is.
  bool adaptive = false;
  std::string adaptive_reason;
};

struct RoundDeadlineDecision {
  enum class Action {
    kNone,               // no deadline in this stage, or not reached yet
    kKeepWaiting,        // nobody is ready: no one to go on with, extend
    kSitOut,             // `sit_out` miss the round; the others go on
    kConnectionBarrier,  // apply DecideConnectionBarrier(kDeadline)
    kAbort,              // nobody finished sharing: the round is aborted
  };
  Action action = Action::kNone;
  std::vector<std::string> sit_out;
  // For kSitOut the reason each late participant is given (RoundMissed).
  std::string reason;
  // kSitOut / kKeepWaiting at the adaptive deadline (not --round_timeout).
  bool adaptive = false;
};

RoundDeadlineDecision DecideRoundDeadline(const RoundDeadlineInput& in,
                                          absl::Duration round_timeout, absl::Time now);

struct MissedRoundInput {
  // Rounds missed in a row before this one (only those that count).
  uint32_t missed_before = 0;
  // It missed the adaptive ready deadline, not --round_timeout.
  bool adaptive = false;
  // Its session is open and it sends heartbeats (it is training, only
  // slowly): the engine asks for one within the last 3 heartbeat intervals.
  bool alive = true;
};

struct MissedRoundDecision {
  bool evict = false;  // asked to leave instead of sitting out
  // Whether this miss counts towards max_missed_rounds, and the count after
  // it.
  bool counts = true;
  uint32_t missed_in_row = 0;
  std::string reason;
};

// A participant sits a round out for `why`. A miss of the adaptive deadline
// by a live member does not count: slow workers are not evicted for being
// slow (a dead one goes by its broken session or expired lease, at once).
// Every other miss counts; at `max_missed_rounds` in a row (0 = never) the
// worker is asked to leave.
MissedRoundDecision DecideMissedRound(const MissedRoundInput& in, uint32_t max_missed_rounds,
                                      absl::string_view why);

// ------------------------------------------------------------------ Leases

struct LeaseDecision {
  bool expired = false;
  std::string reason;
};

// A member with an open session is removed after `heartbeat_lease` without
// a heartbeat; a joined worker that opens no session within
// `session_grace` is removed too.
LeaseDecision DecideLease(bool session_open, absl::Time last_seen, absl::Duration heartbeat_lease,
                          absl::Duration session_grace, absl::Time now);

// ------------------------------------------------------------- Checkpoints

struct CheckpointWatch {
  uint64_t pending_round = 0;  // 0 = no upload in progress
  absl::string_view worker_id;
  bool worker_active = false;
  absl::Time since;
};

struct CheckpointWatchDecision {
  bool reassign = false;
  std::string reason;
};

// An upload moves to another worker when its uploader is gone or did not
// report within `checkpoint_timeout`.
CheckpointWatchDecision DecideCheckpointWatch(const CheckpointWatch& in,
                                              absl::Duration checkpoint_timeout, absl::Time now);

struct CheckpointCandidate {
  absl::string_view worker_id;
  // It holds the round's agreed model.
  bool holds_model = false;
};

struct CheckpointUploaderDecision {
  enum class Action {
    kAssign,    // ask `worker_id` to upload
    kGiveUp,    // too many attempts for this round
    kNoneLeft,  // no untried holder of the model
  };
  Action action = Action::kNoneLeft;
  std::string worker_id;
  std::string reason;
};

// The next untried holder (in the given order, by id) uploads the
// checkpoint of a round; after max(1, checkpointers) + 2 attempts the round
// is given up (the next checkpoint round tries again).
CheckpointUploaderDecision DecideCheckpointUploader(absl::Span<const CheckpointCandidate> members,
                                                    const std::set<std::string>& tried,
                                                    uint32_t checkpointers);

// ------------------------------------------------------------ Late work

struct FoldedReadyInput {
  bool fold_late_work = false;  // RunConfig.sync.fold_late_work
  uint32_t max_staleness = 0;   // RunConfig.sync.max_staleness
  uint64_t round = 0;           // the current round
  uint64_t base_round = 0;      // its base model round (last completed)
  // From the ReportReadyRequest.
  uint64_t folded_base_round = 0;
  uint64_t folded_trained_round = 0;
  double folded_weight = 0;
};
struct FoldedReady {
  uint64_t staleness = 0;
  double weight = 0;
};
// A ready report that folds late work in instead of training: staleness =
// base_round - folded_base_round, and the weight must be the run's rule
// (StalenessWeight in common/staleness.h). FAILED_PRECONDITION when the run
// drops late work; INVALID_ARGUMENT for a base newer than the round's, a
// trained round not after its base or after this round, staleness over
// the cap, or another weight.
absl::StatusOr<FoldedReady> CheckFoldedReady(const FoldedReadyInput& in);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ROUND_DECISIONS_H_
