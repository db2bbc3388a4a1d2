// Coordinator replicas on etcd (--etcd; docs/REPLICAS.md): leader election
// with a lease and a transaction, and the run record kept in etcd with
// revision-checked writes.
//
// Keys under the prefix P (--etcd_prefix):
//   P + "leader"  the leader's address, attached to its lease: created only
//                 when absent (Txn: create_revision == 0), so one holder at a
//                 time; it disappears when the holder's lease expires.
//   P + "record"  the serialized shoal.v1.RunRecord without its rarely
//                 changing parts (the round, hash, worker numbers, ledger:
//                 a few hundred bytes, written every round). Written only in
//                 a Txn that checks (a) the record's mod_revision is the one
//                 this replica last read or wrote, and (b) the leader key
//                 still has the create_revision of this replica's own
//                 election (its "term"): a deposed leader's write fails, it
//                 never overwrites its successor's record.
//   P + "record-rare"  a RunRecord holding only config, layout, checkpoints
//                 and bans: put in the same Txn as "record", and only when
//                 it changed since this term last wrote it (etcd keeps its
//                 recent raft entries in memory, so the per-round write is
//                 kept small). A record from before the split (everything
//                 in P + "record", no rare key) still loads.
//
// A leader may start rounds only while its lease is certainly alive: until
// (time the last successful renewal was *sent*) + TTL, which is never later
// than etcd's own expiry. Past that, with etcd unreachable, it keeps its
// engine (the current round may finish) but starts nothing until a renewal
// succeeds; when etcd answers that the lease is gone, it is deposed.
//
// Not thread-safe by itself: Step/LoadRecord/SaveRecord/Resign are called by
// one owner (the coordinator server serialises them under a mutex); state()
// returns a copy.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_REPLICA_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_REPLICA_H_

#include <atomic>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/etcd_client.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

struct ReplicaOptions {
  // Key prefix (several runs can share one etcd), e.g. "/shoal/run-a/".
  std::string prefix = "/shoal/";
  // This coordinator's address as workers should dial it (the leader hint).
  std::string self;
  // Lease TTL: how long a dead leader keeps its role (whole seconds).
  absl::Duration lease_ttl = absl::Seconds(3);
};

enum class ReplicaRole {
  kStandby,
  kLeader,
};

struct ReplicaState {
  ReplicaRole role = ReplicaRole::kStandby;
  // The leader's address as etcd names it ("" when unknown or none).
  std::string leader;
  // create_revision of the leader key when this replica won it (0 when not
  // leader); changes with every election.
  int64_t term = 0;
  // Leader whose lease is certainly alive now: may start rounds.
  bool can_start_rounds = false;
  // Last etcd failure ("" when the last step reached etcd).
  std::string etcd_error;
};

// What a Step changed, for the server to act on.
enum class ReplicaEvent {
  kNone,
  kElected,  // this replica just became the leader
  kDeposed,  // it was the leader and is not any more
};

class Replica {
 public:
  Replica(EtcdClient* etcd, ReplicaOptions options, const Clock* clock);

  // One round of lease renewal and campaigning; call every lease_ttl / 4.
  // A standby reads the leader key and writes (campaigns) only when the
  // key is gone or its own: no raft write while another replica leads.
  ReplicaEvent Step();
  // A standby's cheap look at the leader key between Steps (one local
  // read: no write, no consensus round): true when no leader holds it (its lease expired or it
  // resigned), so that the caller campaigns (Step) at once instead of at
  // its next period. False for a leader and when etcd cannot be reached.
  bool LeaderGone();
  // Where a standby's watch of the leader key starts: the store's revision
  // when its last Step read the key held by another replica (0 when none:
  // it leads, the key was absent, or etcd was not reached).
  int64_t leader_watch_revision() const { return leader_watch_revision_.load(); }
  // Blocks until the leader key is deleted after `revision` (its holder's
  // lease expired, or it resigned), or `timeout` passes: one etcd watch
  // instead of repeated reads. True when it was deleted (campaign now);
  // false on timeout, when etcd cannot be reached or compacted that
  // history, or for revision 0.
  // Thread-safe (it reads only the options and uses the client), so the
  // caller need not hold the lock that serialises the other calls while it
  // waits.
  bool AwaitLeaderGone(int64_t revision, absl::Duration timeout) const;
  ReplicaState state() const;
  // True while this replica is the leader and its lease certainly alive.
  bool CanStartRounds() const;

  // Reads the record (nullopt when none yet) and remembers its revision for
  // the next SaveRecord. One read when the record key has not changed
  // since the last load; three (record, rare part, record) when it has.
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> LoadRecord();
  // Writes `record` if this replica is still the leader of its term and
  // nobody wrote the record since it last read or wrote it.
  // FAILED_PRECONDITION (and the replica steps down) when either check
  // fails; UNAVAILABLE / DEADLINE_EXCEEDED when etcd cannot be reached.
  // A write whose outcome was unknown and that etcd did apply is recognised
  // on the next write (the leader key is still of this term and the record
  // holds exactly those bytes) and is not mistaken for another writer.
  // `version` (the engine's record_version, 0 = unversioned): a version at
  // or below one already written is not written again (OK), so that a
  // slower writer never replaces a newer record with an older one.
  absl::Status SaveRecord(const shoal::v1::RunRecord& record, uint64_t version = 0);
  // Gives up leadership (deletes the leader key if it is ours, revokes the
  // lease): a clean shutdown hands over at once instead of after a TTL.
  void Resign();

  std::string leader_key() const { return options_.prefix + "leader"; }
  std::string record_key() const { return options_.prefix + "record"; }
  std::string rare_key() const { return options_.prefix + "record-rare"; }

 private:
  // Keeps the lease alive (grants one when there is none); false when etcd
  // cannot be reached.
  bool RenewLease(absl::Time now);
  ReplicaEvent StepDown(const std::string& why);

  EtcdClient* const etcd_;
  const ReplicaOptions options_;
  const Clock* const clock_;
  int64_t lease_ = 0;
  // The lease is certainly alive until then (renewal sent time + TTL).
  absl::Time lease_valid_until_ = absl::InfinitePast();
  ReplicaState state_;
  // mod_revision of the record as last read or written (0 = none).
  int64_t record_revision_ = 0;
  std::atomic<int64_t> leader_watch_revision_{0};
  // The record as last loaded, its mod_revision and its progress key's
  // bytes: a load that finds the key so returns it without reading more.
  std::optional<shoal::v1::RunRecord> loaded_;
  int64_t loaded_revision_ = 0;
  std::string loaded_bytes_;
  // Highest record version written under the current term.
  uint64_t saved_version_ = 0;
  // Bytes of the last record write whose outcome is unknown (its deadline
  // passed or the member went away mid-call: etcd may still have applied
  // it); "" when the last write's outcome is known.
  std::string unconfirmed_write_;
  // The rare part (rare_key) as this term last wrote it ("" = unknown: the
  // next write puts it).
  std::string saved_rare_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_REPLICA_H_
