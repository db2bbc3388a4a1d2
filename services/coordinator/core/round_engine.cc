// RoundEngine: construction, the member and participant indexes with their
// barrier counters, the version bookkeeping (Changes) and Tick.
#include "services/coordinator/core/round_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/coordinator/core/round_engine_internal.h"

namespace shoal::coordinator {

RoundEngine::RoundEngine(EngineOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock), started_at_(clock->Now()) {
  // Versions of participant lists from different coordinator starts never
  // meet (a worker may keep a list across a restart): they start at the
  // start time in ms times 1000.
  plan_list_version_ =
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(started_at_))) * 1000;
  if (options_.member_credentials) {
    // The epoch names this start: a credential of an earlier start (or of
    // another replica's term) is never judged against this roster's list.
    roster_.emplace(static_cast<uint64_t>(std::max<int64_t>(1, absl::ToUnixMicros(started_at_))),
                    options_.credential_secret
                        ? options_.credential_secret
                        : std::function<std::string()>(RandomCredentialSecret));
  }
  if (options_.resume.has_value()) {
    const shoal::v1::RunRecord& r = *options_.resume;
    if (!gossip()) {
      // A gossip run has no rounds nor agreed model: its workers start from
      // checkpoint_id (docs/GOSSIP.md, "Checkpoints").
      last_completed_round_ = r.last_completed_round();
      agreed_hash_ = r.model_hash();
    }
    round_ = last_completed_round_ + 1;
    next_worker_number_ = std::max<uint64_t>(1, r.next_worker_number());
    checkpoint_id_ = r.checkpoint_id();
    checkpoint_round_ = r.checkpoint_round();
    if (r.finished()) phase_ = shoal::v1::FINISHED;
    if (gossip()) {
      SHOAL_LOG(INFO) << "resuming gossip run " << options_.run_id
                      << (checkpoint_id_.empty()
                              ? std::string(" with no checkpoint")
                              : absl::StrCat(" from checkpoint ", checkpoint_id_));
    } else {
      SHOAL_LOG(INFO) << "resuming run " << options_.run_id << " after round "
                      << last_completed_round_ << " (next round " << round_ << ")";
    }
  }
}

// ---------------------------------------------------------------- Versions

RoundEngine::Changes::Changes(RoundEngine* engine) : engine_(engine) {}

RoundEngine::Changes::~Changes() {
  if (engine_->record_changed_) {
    ++engine_->record_version_;
    engine_->status_changed_ = true;
  }
  if (engine_->status_changed_) ++engine_->status_version_;
  engine_->record_changed_ = engine_->status_changed_ = false;
}

void RoundEngine::MarkStatusChanged() { status_changed_ = true; }

void RoundEngine::MarkRecordChanged() { record_changed_ = true; }

// ------------------------------------------------------ Members and indexes

RoundEngine::Member& RoundEngine::At(const std::string& worker_id) const {
  return *index_.at(worker_id);
}

absl::StatusOr<RoundEngine::Member*> RoundEngine::FindActive(const std::string& worker_id) {
  auto it = index_.find(worker_id);
  if (it == index_.end()) {
    if (worker_id.empty()) return absl::InvalidArgumentError("worker_id is empty");
    return absl::NotFoundError(absl::StrCat("unknown worker id '", worker_id,
                                            "' (never joined, left or was evicted: Join again)"));
  }
  return it->second;
}

bool RoundEngine::IsParticipant(const std::string& worker_id) const {
  return participant_set_.contains(worker_id);
}

void RoundEngine::CountFlags(const Member& m, int sign) {
  // Unsigned wrap-around makes -1 a decrement.
  const size_t d = static_cast<size_t>(sign);
  if (m.ready) ready_count_ += d;
  if (m.connections_ok) connected_count_ += d;
  if (m.connections_ok && !m.unreachable.empty()) unreachable_count_ += d;
  if (m.done) done_count_ += d;
}

void RoundEngine::ResetRoundFlags(Member& m) {
  UpdateFlags(m, [](Member& x) { x.ready = x.done = x.connections_ok = false; });
}

void RoundEngine::AddParticipant(const std::string& worker_id) {
  if (!participant_set_.insert(worker_id).second) return;
  participants_.push_back(worker_id);
  CountFlags(At(worker_id), +1);
}

bool RoundEngine::RemoveParticipant(const std::string& worker_id) {
  if (participant_set_.erase(worker_id) == 0) return false;
  // Removals are rare (misses, departures); the vector keeps join order.
  participants_.erase(std::find(participants_.begin(), participants_.end(), worker_id));
  CountFlags(At(worker_id), -1);
  return true;
}

std::vector<std::string> RoundEngine::TakeParticipants() {
  std::vector<std::string> taken = std::move(participants_);
  participants_.clear();
  participant_set_.clear();
  ready_count_ = connected_count_ = unreachable_count_ = done_count_ = 0;
  return taken;
}

void RoundEngine::Enqueue(const std::string& worker_id) {
  if (queued_set_.insert(worker_id).second) queued_.push_back(worker_id);
}

bool RoundEngine::IsQueued(const std::string& worker_id) const {
  return queued_set_.contains(worker_id);
}

void RoundEngine::Dequeue(const std::string& worker_id) {
  if (queued_set_.erase(worker_id) == 0) return;
  queued_.erase(std::find(queued_.begin(), queued_.end(), worker_id));
}

std::vector<std::string> RoundEngine::TakeQueue() {
  std::vector<std::string> taken = std::move(queued_);
  queued_.clear();
  queued_set_.clear();
  return taken;
}

bool RoundEngine::CountersConsistentForTesting() const {
  absl::MutexLock lock(&mu_);
  size_t ready = 0, connected = 0, unreachable = 0, done = 0;
  for (const std::string& id : participants_) {
    if (!index_.contains(id)) return false;
    const Member& m = At(id);
    ready += m.ready;
    connected += m.connections_ok;
    unreachable += m.connections_ok && !m.unreachable.empty();
    done += m.done;
  }
  if (participant_set_.size() != participants_.size() || queued_set_.size() != queued_.size() ||
      index_.size() != members_.size()) {
    return false;
  }
  for (const auto& [id, m] : members_) {
    auto it = index_.find(id);
    if (it == index_.end() || it->second != &m) return false;
  }
  for (const std::string& id : participants_) {
    if (!participant_set_.contains(id)) return false;
  }
  for (const std::string& id : queued_) {
    if (!queued_set_.contains(id) || !index_.contains(id)) return false;
  }
  return ready == ready_count_ && connected == connected_count_ &&
         unreachable == unreachable_count_ && done == done_count_;
}

bool RoundEngine::IsActive(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(worker_id);
}

absl::StatusOr<RoundEngine::Member*> RoundEngine::FindParticipant(const std::string& worker_id,
                                                                  uint64_t round,
                                                                  const char* what) {
  auto found = FindActive(worker_id);
  if (!found.ok()) return found.status();
  if (absl::Status s = CheckRound(round, what); !s.ok()) return s;
  if (!IsParticipant(worker_id)) {
    const std::string& missed = (*found)->missed_reason;
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " is not a participant of round ", round_,
                     missed.empty() ? "" : absl::StrCat(" (", missed, ")")));
  }
  return *found;
}

absl::Status RoundEngine::CheckRound(uint64_t round, const char* what) const {
  if (round < round_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for round ", round, " is stale: the run is at round ", round_));
  }
  if (round > round_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " for round ", round, " is in the future: the run is at round ", round_));
  }
  return absl::OkStatus();
}

bool RoundEngine::HoldsAgreedModel(const Member& m) const {
  return m.model_round == last_completed_round_ && m.model_hash == agreed_hash_ &&
         !agreed_hash_.empty();
}

std::vector<std::string> RoundEngine::Holders() const {
  std::vector<std::string> holders;
  for (const auto& [id, m] : members_) {
    if (HoldsAgreedModel(m) && !m.outbound_only) holders.push_back(m.address);
  }
  return holders;
}

// -------------------------------------------------------------------- Tick

Directives RoundEngine::Tick() {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  Directives out;
  const absl::Time now = clock_->Now();
  ExpireLeases(now, &out);
  WatchCheckpoint(now, &out);
  if (!gossip()) ApplyRoundDeadline(now, &out);
  if (gossip()) {
    UpdateConsensusEvaluator(&out);
    MaybeFinalAverage(&out);
  }
  if (election_stale_) Reelect(ElectionTrigger::kMembership);
  // Routes changed by an election since the last tick (relay on).
  for (Directive& d : relay_changes_) out.push_back(std::move(d));
  relay_changes_.clear();
  return out;
}

Directives RoundEngine::HoldRounds(bool hold) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  Directives out;
  if (rounds_held_ != hold) {
    SHOAL_LOG(INFO) << (hold ? "rounds held: no round starts until released" : "rounds released");
  }
  rounds_held_ = hold;
  // Also when it was not held: a start refused by before_round_start.
  if (!hold) MaybeStartRound(&out);
  return out;
}

}  // namespace shoal::coordinator
