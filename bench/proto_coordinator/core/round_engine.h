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
// Thread-safe: one mutex guards all state.
#ifndef SHOAL_BENCH_PROTO_COORDINATOR_CORE_ROUND_ENGINE_H_
#define SHOAL_BENCH_PROTO_COORDINATOR_CORE_ROUND_ENGINE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
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
  // (0 = never).
  uint32_t max_missed_rounds = 5;
  // Removed members stay visible in the status, up to this many.
  size_t max_departed_shown = 50;
  // Workers asked to upload each checkpoint, one after the other until one
  // succeeds (the first holder by id, then the next).
  uint32_t checkpointers = 1;
  // An upload not reported within this time moves to another worker.
  absl::Duration checkpoint_timeout = absl::Seconds(120);
  // Where the run continues from (a persisted record), if anywhere.
  std::optional<shoal::v1::RunRecord> resume;
};

// A message for one worker's session stream.
// PROTOTYPE (bench/proto_coordinator): the message is shared, not copied,
// by every recipient of a broadcast (a round plan of N participants was
// copied N times here and N times again into the session queues).
struct Directive {
  Directive(std::string id, shoal::v1::CoordinatorMessage m)
      : worker_id(std::move(id)),
        message(std::make_shared<const shoal::v1::CoordinatorMessage>(std::move(m))) {}
  Directive(std::string id, std::shared_ptr<const shoal::v1::CoordinatorMessage> m)
      : worker_id(std::move(id)), message(std::move(m)) {}
  std::string worker_id;
  std::shared_ptr<const shoal::v1::CoordinatorMessage> message;
};
using Directives = std::vector<Directive>;

struct JoinResult {
  shoal::v1::JoinResponse response;
  Directives directives;
};

class RoundEngine {
 public:
  RoundEngine(EngineOptions options, const Clock* clock);

  absl::StatusOr<JoinResult> Join(const shoal::v1::JoinRequest& request);
  // The worker opened its session stream. NOT_FOUND for an unknown id.
  absl::Status Connect(const std::string& worker_id);
  // A heartbeat arrived. NOT_FOUND for an unknown id.
  absl::Status Heartbeat(const std::string& worker_id,
                         const shoal::v1::Heartbeat& heartbeat = shoal::v1::Heartbeat());
  // The session stream broke or the worker left: it is removed at once.
  Directives Disconnect(const std::string& worker_id, const std::string& reason);

  // Admits the worker to `round` or, when that round already has a ready
  // participant, to the next one. Returns the admitted round.
  absl::StatusOr<uint64_t> JoinRound(const std::string& worker_id, uint64_t round, Directives* out);
  absl::Status ReportReady(const shoal::v1::ReportReadyRequest& request, Directives* out);
  absl::Status ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request, Directives* out);
  absl::Status ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request, Directives* out);
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request, Directives* out);

  // Applies every timeout: leases, round deadline, connection deadline.
  Directives Tick();

  shoal::v1::RunStatus Status() const;
  // The record to persist (run id, config, counters).
  shoal::v1::RunRecord Record() const;
  // Increments whenever Record() changes; the server persists on change.
  uint64_t record_version() const;
  bool finished() const;
  uint64_t last_completed_round() const;
  bool IsActive(const std::string& worker_id) const;

 private:
  enum class MemberState { kWaiting, kTraining, kReady, kSharing, kLeft, kEvicted };
  struct Member {
    std::string id;
    std::string address;
    std::string name;
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
    // Per current round.
    bool ready = false;
    bool connections_ok = false;
    std::vector<std::string> unreachable;
    bool done = false;
    double exchange_seconds = 0;
  };

  static const char* StateName(MemberState s);
  absl::StatusOr<Member*> FindActive(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsParticipant(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRound(uint64_t round, const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> Holders() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  shoal::v1::CoordinatorMessage RoundStartMessage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartRound(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSendPlan(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendPlan(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartSharing(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ConnectionTimeout(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> FailingPeers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCompleteRound(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker sits the round out; it stays a member (queued for the next
  // round) unless it missed too many in a row.
  void MissRound(const std::string& worker_id, const std::string& reason, Directives* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the member to departed_ and out of the queue and the round;
  // returns true when it was a participant. No round consequences.
  bool Depart(const std::string& worker_id, MemberState why, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Depart plus what it means for the round (plan, re-plan, wait).
  void RemoveMember(const std::string& worker_id, MemberState why, const std::string& reason,
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

  const EngineOptions options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);  // active ones
  std::deque<Member> departed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_worker_number_ ABSL_GUARDED_BY(mu_) = 1;
  shoal::v1::Phase phase_ ABSL_GUARDED_BY(mu_) = shoal::v1::WAITING_FOR_MEMBERS;
  // The round in progress, or the next one to start.
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t last_completed_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::string agreed_hash_ ABSL_GUARDED_BY(mu_);
  // No round completed since this coordinator started (restart window).
  bool fresh_start_ ABSL_GUARDED_BY(mu_) = true;
  // Participants of round_ (in join order) while TRAINING / SHARING.
  std::vector<std::string> participants_ ABSL_GUARDED_BY(mu_);
  // Workers admitted to the next round to start (waiting).
  std::vector<std::string> queued_ ABSL_GUARDED_BY(mu_);
  bool any_ready_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t total_elements_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time round_started_at_ ABSL_GUARDED_BY(mu_);
  // The running timeout: training deadline, connection deadline or exchange
  // deadline, depending on the phase.
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  uint32_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t connection_retries_ ABSL_GUARDED_BY(mu_) = 0;
  bool sharing_started_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<shoal::v1::SliceAssignment> plan_ ABSL_GUARDED_BY(mu_);
  std::deque<shoal::v1::RoundSummary> recent_rounds_ ABSL_GUARDED_BY(mu_);
  uint64_t record_version_ ABSL_GUARDED_BY(mu_) = 1;
  std::string checkpoint_id_ ABSL_GUARDED_BY(mu_);
  uint64_t checkpoint_round_ ABSL_GUARDED_BY(mu_) = 0;
  // The upload in progress: round (0 = none), worker, since when, and the
  // workers already tried for it.
  uint64_t pending_checkpoint_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::string pending_checkpoint_worker_ ABSL_GUARDED_BY(mu_);
  absl::Time pending_checkpoint_since_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> checkpoint_tried_ ABSL_GUARDED_BY(mu_);
  absl::Time started_at_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_BENCH_PROTO_COORDINATOR_CORE_ROUND_ENGINE_H_
