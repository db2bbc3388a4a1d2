// The engine's members: who joined (ids, data ranks, addresses, zones, how
// each can be reached), their sessions and leases, the members removed so
// far (as the status shows them), the worker numbering and, with
// --token_file, the member credentials. A part of RoundEngine: what the
// run's mode, the topology and the checkpoints keep of a member lives with
// them, keyed by the member's id; this holds what they all read.
//
// Not thread-safe: owned by RoundEngine and called only with the engine's
// mutex held (RoundEngine guards it with ABSL_GUARDED_BY); it never calls
// out.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_MEMBERSHIP_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_MEMBERSHIP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/member_credentials.h"
#include "services/coordinator/core/engine_types.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// The last four are how a member departed (common/worker_state.h):
//   kLeft      it said so (Leave: SIGTERM, a graceful stop, a replaced
//              process at the same address);
//   kLost      its session broke or its heartbeats stopped while the run
//              went on (a crash, kill -9, a cut link);
//   kFinished  its session ended after the run finished, or it left
//              because its own work was done (gossip steps);
//   kEvicted   the coordinator removed it (missed rounds, a bad hash, ...).
enum class MemberState { kWaiting, kTraining, kReady, kSharing, kLeft, kLost, kFinished, kEvicted };

// "waiting", "training", ... as the status shows it.
const char* MemberStateName(MemberState s);

// A member as every part of the engine sees it.
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
  // Set by the run's mode (training, ready, sharing, waiting); left and
  // evicted only on the way out.
  MemberState state = MemberState::kWaiting;
  bool connected = false;
  // Joined (or re-joined) and opened no session since: a stranger's Join
  // that is never followed up stays so until session_grace removes it.
  bool pending = false;
  absl::Time joined_at;
  absl::Time last_seen;
  // Its catch-up as its latest heartbeat says (Heartbeat.syncing and
  // sync_*): shown in the status, whatever the mode.
  bool syncing = false;
  uint64_t sync_bytes_done = 0;
  uint64_t sync_bytes_total = 0;
  uint32_t sync_sources = 0;
};

class Membership {
 public:
  // `started_at`: this start of the coordinator (the credentials' epoch).
  Membership(const EngineOptions& options, const Clock* clock, EngineVersions* versions,
             absl::Time started_at);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // A resumed run keeps its worker numbering.
  void Resume(const shoal::v1::RunRecord& record);

  // ------------------------------------------------------------- Lookups
  size_t size() const { return members_.size(); }
  bool Contains(const std::string& worker_id) const { return index_.contains(worker_id); }
  // The active member `worker_id`, or null.
  Member* Find(const std::string& worker_id) const;
  // INVALID_ARGUMENT for an empty id, NOT_FOUND for one that is not active.
  absl::StatusOr<Member*> FindActive(const std::string& worker_id) const;
  // The active member `worker_id` (which must be one).
  Member& At(const std::string& worker_id) const { return *index_.at(worker_id); }
  // The active members by id: the order Status(), Tick() and every
  // per-member list (peer lists, candidates) walk.
  const std::map<std::string, Member>& members() const { return members_; }
  uint64_t next_worker_number() const { return next_worker_number_; }
  // Members that joined and opened no session since (Member::pending).
  size_t pending() const { return pending_; }

  // ---------------------------------------------------------------- Join
  // What a JoinRequest must be before the engine takes its lock:
  // INVALID_ARGUMENT for a bad peer address, zone or model hash.
  static absl::Status CheckJoinRequest(const shoal::v1::JoinRequest& request);
  // The active members at `address` other than `except` (may be null): a
  // worker there means their process is gone (its port was reused).
  std::vector<std::string> AtAddress(const std::string& address, const Member* except) const;
  // A new member for `request`: after a coordinator restart it keeps its id
  // (previous_worker_id, unless that member was removed) and data rank
  // (previous_data_rank, when free); else the next number and the smallest
  // free rank. RESOURCE_EXHAUSTED past max_members. `round` is for the log.
  absl::StatusOr<Member*> Add(const shoal::v1::JoinRequest& request, uint64_t round);
  // Takes a join's address, name, zone and reachability (`unreachable`:
  // the service's probe failed); its session is to be opened again.
  void Refresh(Member& m, const shoal::v1::JoinRequest& request, const std::string& unreachable);
  // With member credentials: a fresh credential for `worker_id` (one it
  // held before stops working), the change going to every open session
  // (`out`). Empty when credentials are off.
  std::string IssueCredential(const std::string& worker_id, Directives* out);
  // A TorchScript run: up to 8 members with an open session that serve the
  // model file, a window that moves with every join.
  void AddModelFileHolders(const Member& joiner, shoal::v1::JoinResponse* response);

  // ------------------------------------------------------ Sessions, leases
  void Connect(Member& m);
  // A heartbeat's catch-up progress (marks the status changed when it
  // changed: the status shows it).
  void TakeProgress(Member& m, const shoal::v1::Heartbeat& heartbeat);
  // Members whose lease ran out (DecideLease), by id, with the reason.
  std::vector<std::pair<std::string, std::string>> ExpiredLeases(absl::Time now) const;
  // Its session is open and it sent a heartbeat within the last three
  // intervals (a stopped or hung process does not, long before its lease
  // runs out; a slow one does).
  bool Alive(const Member& m, absl::Time now) const;

  // ---------------------------------------------------------- Departures
  // Removes the active member `worker_id` (by value: callers may pass the
  // key itself): `gone` is what the status shows of it from now on. With
  // member credentials it revokes its credential and tells the others
  // (`out`). `round` is for the log.
  void Remove(std::string worker_id, MemberState why, const std::string& reason,
              shoal::v1::WorkerStatus gone, uint64_t round, Directives* out);
  // How many members were removed so far.
  uint64_t departures() const { return departures_; }
  // The removed members the status still shows, oldest first (at most
  // EngineOptions::max_departed_shown; departures() counts them all).
  const std::deque<shoal::v1::WorkerStatus>& departed() const { return departed_; }

  // ------------------------------------------------------------ Messages
  // The end of the run (`run_finished`) to every member, which then waits.
  void EndRun(const SharedMessage& run_finished, Directives* out);
  // `message` to every member with an open session.
  void SendToConnected(const SharedMessage& message, Directives* out) const;
  // With member credentials: the full list for a session just opened.
  SharedMessage MemberList(const std::string& worker_id) const;

  // -------------------------------------------------------------- Status
  // What the status shows of a member from this part (identity, address,
  // state, session). `active`: not removed.
  void FillWorker(const Member& m, bool active, absl::Time now, shoal::v1::WorkerStatus* w) const;
  // The id index matches the members (tests).
  bool ConsistentForTesting() const;

 private:
  const EngineOptions& options_;
  const Clock* const clock_;
  EngineVersions* const versions_;
  std::map<std::string, Member> members_;  // active ones, by id
  // The same members by id in O(1) for the per-report lookups (the map
  // keeps the id order; its nodes never move).
  absl::flat_hash_map<std::string, Member*> index_;
  std::deque<shoal::v1::WorkerStatus> departed_;
  uint64_t next_worker_number_ = 1;
  uint64_t departures_ = 0;
  size_t pending_ = 0;
  // Joins answered with model file holders (rotates the holders offered).
  uint64_t joins_for_file_ = 0;
  // Member credentials, when on (EngineOptions::member_credentials).
  std::optional<MemberRoster> roster_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_MEMBERSHIP_H_
