// The coordinator's round state machine: membership, the synchronous round
// (WAITING_FOR_MEMBERS -> TRAINING -> SHARING -> next round / FINISHED), the
// shard plan of each round and the model hashes reported after it.
//
// Plain C++: no gRPC types. Every method takes the current time from the
// injected Clock and returns the directives to push to workers; the caller
// delivers them after the call returns (the engine never calls out).
//
// Thread-safe: one mutex guards all state.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_

#include <cstdint>
#include <deque>
#include <map>
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
  // Removed members stay visible in the status, up to this many.
  size_t max_departed_shown = 50;
};

// A message for one worker's session stream.
struct Directive {
  std::string worker_id;
  shoal::v1::CoordinatorMessage message;
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
  absl::Status Heartbeat(const std::string& worker_id);
  // The session stream broke or the worker left: it is removed at once.
  Directives Disconnect(const std::string& worker_id, const std::string& reason);

  // Admits the worker to `round` or, when that round already has a ready
  // participant, to the next one. Returns the admitted round.
  absl::StatusOr<uint64_t> JoinRound(const std::string& worker_id, uint64_t round, Directives* out);
  absl::Status ReportReady(const shoal::v1::ReportReadyRequest& request, Directives* out);
  absl::Status ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request, Directives* out);

  // Expires leases. Call periodically.
  Directives Tick();

  shoal::v1::RunStatus Status() const;
  bool finished() const;
  uint64_t last_completed_round() const;

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
    // Per current round.
    bool ready = false;
    bool done = false;
    double exchange_seconds = 0;
  };

  static const char* StateName(MemberState s);
  absl::StatusOr<Member*> FindActive(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsParticipant(const std::string& worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartRound(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSendPlan(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCompleteRound(Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the member to departed_ and out of the queue and the round;
  // returns true when it was a participant. No round consequences.
  bool Depart(const std::string& worker_id, MemberState why, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Depart plus what it means for the round (plan, abort, wait).
  void RemoveMember(const std::string& worker_id, MemberState why, const std::string& reason,
                    Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortRound(const std::string& reason, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(const std::string& reason, Directives* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  // Participants of round_ (in join order) while TRAINING / SHARING.
  std::vector<std::string> participants_ ABSL_GUARDED_BY(mu_);
  // Workers admitted to the next round to start (waiting).
  std::vector<std::string> queued_ ABSL_GUARDED_BY(mu_);
  bool any_ready_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t total_elements_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time round_started_at_ ABSL_GUARDED_BY(mu_);
  std::deque<shoal::v1::RoundSummary> recent_rounds_ ABSL_GUARDED_BY(mu_);
  absl::Time started_at_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_H_
