#include "services/coordinator/core/replica.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace shoal::coordinator {

Replica::Replica(EtcdClient* etcd, ReplicaOptions options, const Clock* clock)
    : etcd_(etcd), options_(std::move(options)), clock_(clock) {}

ReplicaState Replica::state() const {
  ReplicaState s = state_;
  s.can_start_rounds = CanStartRounds();
  return s;
}

bool Replica::CanStartRounds() const {
  return state_.role == ReplicaRole::kLeader && clock_->Now() < lease_valid_until_;
}

bool Replica::RenewLease(absl::Time now) {
  if (lease_ == 0) {
    absl::StatusOr<int64_t> lease = etcd_->GrantLease(options_.lease_ttl);
    if (!lease.ok()) {
      state_.etcd_error = std::string(lease.status().message());
      return false;
    }
    lease_ = *lease;
    lease_valid_until_ = now + options_.lease_ttl;
    return true;
  }
  absl::StatusOr<absl::Duration> ttl = etcd_->KeepAlive(lease_);
  if (absl::IsNotFound(ttl.status())) {
    // Expired while etcd could not be reached (or revoked): a new one for
    // campaigning; the caller steps down if it was leading.
    lease_ = 0;
    lease_valid_until_ = absl::InfinitePast();
    state_.etcd_error = std::string(ttl.status().message());
    return true;
  }
  if (!ttl.ok()) {
    state_.etcd_error = std::string(ttl.status().message());
    return false;
  }
  // etcd counts the TTL from when it handled the renewal, after `now`.
  lease_valid_until_ = now + std::min(*ttl, options_.lease_ttl);
  return true;
}

ReplicaEvent Replica::StepDown(const std::string& why) {
  const bool was_leader = state_.role == ReplicaRole::kLeader;
  state_.role = ReplicaRole::kStandby;
  state_.term = 0;
  if (state_.leader == options_.self) state_.leader.clear();
  if (was_leader) {
    SHOAL_LOG(WARNING) << "replica: no longer the leader: " << why;
    return ReplicaEvent::kDeposed;
  }
  return ReplicaEvent::kNone;
}

ReplicaEvent Replica::Step() {
  const absl::Time now = clock_->Now();
  if (!RenewLease(now)) {
    // etcd unreachable: a leader keeps its role (its lease may still be
    // alive; CanStartRounds() turns false when it certainly is not) and a
    // standby stays one.
    return ReplicaEvent::kNone;
  }
  if (state_.role == ReplicaRole::kLeader) {
    if (lease_ == 0) return StepDown("the lease expired");
    state_.etcd_error.clear();
    return ReplicaEvent::kNone;
  }
  if (lease_ == 0 && !RenewLease(now)) return ReplicaEvent::kNone;
  // Look before campaigning: a transaction that holds a put is a raft
  // write in etcd (an entry in every member's log and an fsync on each)
  // even when its comparison fails, and a standby steps every TTL / 4 for
  // the life of the run. So it reads the key, and writes only when the key
  // is gone or is its own.
  absl::StatusOr<std::optional<EtcdKeyValue>> held = etcd_->Get(leader_key());
  if (!held.ok()) {
    state_.etcd_error = std::string(held.status().message());
    return ReplicaEvent::kNone;
  }
  if (held->has_value() && ((*held)->lease != lease_ || (*held)->value != options_.self)) {
    state_.etcd_error.clear();
    state_.leader = (*held)->value;
    leader_watch_revision_.store((*held)->read_revision);
    return ReplicaEvent::kNone;
  }
  leader_watch_revision_.store(0);
  // Campaign: create the leader key if nobody holds it.
  absl::StatusOr<EtcdTxnResult> txn = etcd_->Txn(
      {EtcdCompare::Absent(leader_key())}, {{leader_key(), options_.self, lease_}}, {leader_key()});
  if (!txn.ok()) {
    state_.etcd_error = std::string(txn.status().message());
    return ReplicaEvent::kNone;
  }
  state_.etcd_error.clear();
  int64_t term = txn->revision;
  if (!txn->succeeded) {
    const EtcdKeyValue* holder = txn->current.empty() ? nullptr : &txn->current.front();
    state_.leader = holder == nullptr ? "" : holder->value;
    if (holder != nullptr) leader_watch_revision_.store(holder->read_revision);
    // The key on our own lease is ours: this replica stepped down (a record
    // write it could not explain) while its lease, and so the key, lived on.
    // Nobody else can take the key before the lease ends, so take it back
    // in its own term instead of leaving the run without a leader.
    if (holder == nullptr || holder->lease != lease_ || holder->value != options_.self) {
      return ReplicaEvent::kNone;
    }
    term = holder->create_revision;
  }
  state_.role = ReplicaRole::kLeader;
  state_.term = term;
  leader_watch_revision_.store(0);
  saved_version_ = 0;
  saved_rare_.clear();  // the first write of a term puts both keys
  state_.leader = options_.self;
  SHOAL_LOG(INFO) << "replica: elected leader (term " << state_.term << ", lease " << lease_
                  << ", ttl " << options_.lease_ttl << ")";
  return ReplicaEvent::kElected;
}

bool Replica::LeaderGone() {
  if (state_.role == ReplicaRole::kLeader) return false;
  // A local read: this look repeats every few hundred milliseconds, and a
  // linearizable read costs etcd a consensus round (the leader confirms its
  // leadership with the other members) each time. A stale answer delays the
  // campaign at most to the next Step, whose read and Txn are linearizable;
  // a wrong "gone" only makes that Step come sooner.
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = etcd_->GetLocal(leader_key());
  if (!kv.ok()) return false;
  if (!kv->has_value()) return true;
  state_.leader = (*kv)->value;
  return false;
}

bool Replica::AwaitLeaderGone(int64_t revision, absl::Duration timeout) const {
  if (revision <= 0) return false;
  absl::StatusOr<bool> gone = etcd_->AwaitDelete(leader_key(), revision, timeout);
  return gone.ok() && *gone;
}

namespace {

// The parts of the record that change rarely (the run's configuration and
// layout, its checkpoints, its bans): kept under a key of their own so that
// the write of every round stays a few hundred bytes (etcd keeps its recent
// raft entries in memory).
void SplitRecord(const shoal::v1::RunRecord& record, shoal::v1::RunRecord* progress,
                 shoal::v1::RunRecord* rare) {
  *progress = record;
  progress->clear_config();
  progress->clear_layout();
  progress->clear_checkpoints();
  progress->clear_bans();
  rare->Clear();
  *rare->mutable_config() = record.config();
  if (record.has_layout()) *rare->mutable_layout() = record.layout();
  *rare->mutable_checkpoints() = record.checkpoints();
  *rare->mutable_bans() = record.bans();
}

}  // namespace

absl::StatusOr<std::optional<shoal::v1::RunRecord>> Replica::LoadRecord() {
  // The two keys are written in one transaction, and every write puts the
  // progress key: the pair is consistent when the progress key did not
  // change while the rare key was read.
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<std::optional<EtcdKeyValue>> kv = etcd_->Get(record_key());
    if (!kv.ok()) return kv.status();
    if (!kv->has_value()) {
      record_revision_ = 0;
      loaded_.reset();
      return std::optional<shoal::v1::RunRecord>();
    }
    // Unchanged since the last load (a standby reads it every step): the
    // rare part is written only together with this key, so it is unchanged
    // too, and one read is enough. (The bytes too: an etcd rebuilt from
    // nothing counts its revisions from 1 again.)
    if (loaded_.has_value() && (*kv)->mod_revision == loaded_revision_ &&
        (*kv)->value == loaded_bytes_) {
      record_revision_ = loaded_revision_;
      return loaded_;
    }
    absl::StatusOr<std::optional<EtcdKeyValue>> rare_kv = etcd_->Get(rare_key());
    if (!rare_kv.ok()) return rare_kv.status();
    absl::StatusOr<std::optional<EtcdKeyValue>> again = etcd_->Get(record_key());
    if (!again.ok()) return again.status();
    if (!again->has_value() || (*again)->mod_revision != (*kv)->mod_revision) continue;
    shoal::v1::RunRecord record;
    if (!record.ParseFromString((*kv)->value) || record.run_id().empty()) {
      return absl::DataLossError(
          absl::StrCat("etcd key ", record_key(), " does not hold a valid run record"));
    }
    // A record written before the split holds everything in one key.
    if (rare_kv->has_value()) {
      shoal::v1::RunRecord rare;
      if (!rare.ParseFromString((*rare_kv)->value)) {
        return absl::DataLossError(
            absl::StrCat("etcd key ", rare_key(), " does not hold a valid run record part"));
      }
      *record.mutable_config() = rare.config();
      if (rare.has_layout()) *record.mutable_layout() = rare.layout();
      *record.mutable_checkpoints() = rare.checkpoints();
      *record.mutable_bans() = rare.bans();
    }
    constexpr uint64_t kMaxRound = uint64_t{1} << 62;
    if (record.last_completed_round() > kMaxRound || record.checkpoint_round() > kMaxRound) {
      return absl::DataLossError(absl::StrCat("etcd key ", record_key(), " names round ",
                                              record.last_completed_round(),
                                              ", past the largest round this coordinator runs"));
    }
    record_revision_ = (*kv)->mod_revision;
    loaded_revision_ = record_revision_;
    loaded_bytes_ = (*kv)->value;
    loaded_ = std::move(record);
    return loaded_;
  }
  return absl::UnavailableError(absl::StrCat(
      "etcd key ", record_key(), " changed during each of 3 reads: no consistent run record"));
}

absl::Status Replica::SaveRecord(const shoal::v1::RunRecord& record, uint64_t version) {
  if (state_.role != ReplicaRole::kLeader) {
    return absl::FailedPreconditionError("not the leader: the run record is not written");
  }
  if (version != 0 && version <= saved_version_) return absl::OkStatus();
  shoal::v1::RunRecord progress;
  shoal::v1::RunRecord rare;
  SplitRecord(record, &progress, &rare);
  const std::string bytes = progress.SerializeAsString();
  const std::string rare_bytes = rare.SerializeAsString();
  std::vector<EtcdPut> puts = {{record_key(), bytes, 0}};
  // The rare part only when it changed since this term last wrote it.
  if (rare_bytes != saved_rare_) puts.push_back({rare_key(), rare_bytes, 0});
  std::string holder = "nobody";
  int64_t record_rev = 0;
  // At most two tries: the second after recognising our own earlier write.
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<EtcdTxnResult> txn =
        etcd_->Txn({EtcdCompare::ModifiedAt(record_key(), record_revision_),
                    EtcdCompare::CreatedAt(leader_key(), state_.term)},
                   puts, {leader_key(), record_key()});
    if (!txn.ok()) {
      // Deadline passed or the member went away mid-call: etcd may still
      // apply it (a member that lost its raft leader commits it later).
      // Whether the rare part landed is unknown: the next write puts it.
      unconfirmed_write_ = bytes;
      saved_rare_.clear();
      return txn.status();
    }
    if (txn->succeeded) {
      unconfirmed_write_.clear();
      saved_rare_ = rare_bytes;
      record_revision_ = txn->revision;
      saved_version_ = std::max(saved_version_, version);
      return absl::OkStatus();
    }
    bool our_term = false;
    const EtcdKeyValue* stored = nullptr;
    for (const EtcdKeyValue& kv : txn->current) {
      if (kv.key == leader_key()) {
        holder = kv.value;
        our_term = kv.create_revision == state_.term;
      }
      if (kv.key == record_key()) {
        record_rev = kv.mod_revision;
        stored = &kv;
      }
    }
    // Only the leader of the term writes the record, so a newer record
    // under our own leader key holding exactly the bytes of our unconfirmed
    // write is that write, applied after its deadline: adopt its revision.
    const bool ours = our_term && stored != nullptr && !unconfirmed_write_.empty() &&
                      stored->value == unconfirmed_write_;
    if (!ours) break;
    SHOAL_LOG(INFO) << "replica: the run record write that timed out was applied (revision "
                    << record_rev << "); writing on from there";
    unconfirmed_write_.clear();
    record_revision_ = record_rev;
    if (stored->value == bytes) {
      saved_version_ = std::max(saved_version_, version);
      return absl::OkStatus();
    }
  }
  const std::string why = absl::StrCat(
      "refused to write the run record: leader key held by ", holder, ", record at revision ",
      record_rev, " (this replica read ", record_revision_, ", term ", state_.term, ")");
  StepDown(why);
  return absl::FailedPreconditionError(why);
}

void Replica::Resign() {
  if (state_.role == ReplicaRole::kLeader) {
    (void)etcd_->Delete(leader_key(), EtcdCompare::CreatedAt(leader_key(), state_.term));
  }
  if (lease_ != 0) (void)etcd_->RevokeLease(lease_);
  lease_ = 0;
  lease_valid_until_ = absl::InfinitePast();
  StepDown("resigned");
}

}  // namespace shoal::coordinator
