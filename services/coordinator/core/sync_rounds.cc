// SyncRounds: the members' rounds (admission, missed rounds, departures),
// the round's phases (start, ready, plan, connection barrier, sharing, hash
// vote, re-plans, aborts, deadlines), checkpoints of completed rounds and
// what the status and the record say of the rounds.
#include "services/coordinator/core/sync_rounds.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/member_credentials.h"
#include "common/shard_plan.h"
#include "common/status_util.h"
#include "services/coordinator/core/base_recovery.h"
#include "services/coordinator/core/hierarchy_plan.h"

namespace shoal::coordinator {
namespace {

using shoal::v1::CoordinatorMessage;

// Keeps the newest `window` samples.
template <typename T>
void AddSample(std::deque<T>& samples, T sample, size_t window) {
  samples.push_back(sample);
  while (samples.size() > window) samples.pop_front();
}

}  // namespace

SyncRounds::SyncRounds(const EngineOptions& options, const Clock* clock, EngineVersions* versions,
                       Membership* members, Topology* topology, CheckpointPlanner* checkpoints,
                       EngineHost* host, absl::Time started_at)
    : options_(options),
      clock_(clock),
      versions_(versions),
      members_(members),
      topology_(topology),
      checkpoints_(checkpoints),
      host_(host),
      trust_(options.config.trust(),
             options.audit_secret.empty() ? RandomCredentialSecret() : options.audit_secret) {
  if (options_.config.training().sample_ledger()) {
    ledger_.emplace(static_cast<uint64_t>(options_.config.training().local_steps()) *
                        options_.config.training().batch_size(),
                    options_.config.training().epochs());
  }
  // Versions of participant lists from different coordinator starts never
  // meet (a worker may keep a list across a restart): they start at the
  // start time in ms times 1000.
  plan_list_version_ =
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(started_at))) * 1000;
}

void SyncRounds::Resume(const shoal::v1::RunRecord& record) {
  last_completed_round_ = record.last_completed_round();
  agreed_hash_ = record.model_hash();
  round_ = last_completed_round_ + 1;
  if (ledger_.has_value()) ledger_->Resume(record.ledger());
  trust_.Resume(record, clock_->Now());
  if (record.finished()) phase_ = shoal::v1::FINISHED;
  SHOAL_LOG(INFO) << "resuming run " << options_.run_id << " after round " << last_completed_round_
                  << " (next round " << round_ << ")";
}

void SyncRounds::OnFinish() {
  phase_ = shoal::v1::FINISHED;
  TakeParticipants();
  TakeQueue();
}

// ------------------------------------------------- Participants and queue

void SyncRounds::CountFlags(const RoundMember& r, int sign) {
  // Unsigned wrap-around makes -1 a decrement.
  const size_t d = static_cast<size_t>(sign);
  if (r.ready) ready_count_ += d;
  if (r.connections_ok) connected_count_ += d;
  if (r.connections_ok && !r.unreachable.empty()) unreachable_count_ += d;
  if (r.done) done_count_ += d;
}

template <typename F>
void SyncRounds::UpdateFlags(const std::string& worker_id, F&& update) {
  RoundMember& r = R(worker_id);
  const bool counted = IsParticipant(worker_id);
  if (counted) CountFlags(r, -1);
  update(r);
  if (counted) CountFlags(r, +1);
}

void SyncRounds::ResetRoundFlags(const std::string& worker_id) {
  UpdateFlags(worker_id, [](RoundMember& x) { x.ready = x.done = x.connections_ok = false; });
}

void SyncRounds::AddParticipant(const std::string& worker_id) {
  if (!participant_set_.insert(worker_id).second) return;
  participants_.push_back(worker_id);
  CountFlags(R(worker_id), +1);
}

bool SyncRounds::RemoveParticipant(const std::string& worker_id) {
  if (participant_set_.erase(worker_id) == 0) return false;
  // Its work will not be in the round: its samples go back to the pool.
  if (ledger_.has_value()) ledger_->Lost(worker_id);
  trust_.LeaveRound(worker_id);
  // Removals are rare (misses, departures); the vector keeps join order.
  participants_.erase(std::find(participants_.begin(), participants_.end(), worker_id));
  CountFlags(R(worker_id), -1);
  return true;
}

std::vector<std::string> SyncRounds::TakeParticipants() {
  std::vector<std::string> taken = std::move(participants_);
  participants_.clear();
  participant_set_.clear();
  ready_count_ = connected_count_ = unreachable_count_ = done_count_ = 0;
  return taken;
}

void SyncRounds::Enqueue(const std::string& worker_id) {
  if (queued_set_.insert(worker_id).second) queued_.push_back(worker_id);
}

void SyncRounds::Dequeue(const std::string& worker_id) {
  if (queued_set_.erase(worker_id) == 0) return;
  queued_.erase(std::find(queued_.begin(), queued_.end(), worker_id));
}

std::vector<std::string> SyncRounds::TakeQueue() {
  std::vector<std::string> taken = std::move(queued_);
  queued_.clear();
  queued_set_.clear();
  return taken;
}

bool SyncRounds::ConsistentForTesting() const {
  size_t ready = 0, connected = 0, unreachable = 0, done = 0;
  for (const std::string& id : participants_) {
    if (!members_->Contains(id) || !rounds_.contains(id)) return false;
    const RoundMember& r = R(id);
    ready += r.ready;
    connected += r.connections_ok;
    unreachable += r.connections_ok && !r.unreachable.empty();
    done += r.done;
  }
  if (participant_set_.size() != participants_.size() || queued_set_.size() != queued_.size() ||
      rounds_.size() != members_->size()) {
    return false;
  }
  for (const auto& [id, m] : members_->members()) {
    if (!rounds_.contains(id)) return false;
  }
  for (const std::string& id : participants_) {
    if (!participant_set_.contains(id)) return false;
  }
  for (const std::string& id : queued_) {
    if (!queued_set_.contains(id) || !members_->Contains(id)) return false;
  }
  return ready == ready_count_ && connected == connected_count_ &&
         unreachable == unreachable_count_ && done == done_count_;
}

// ----------------------------------------------------------------- Members

absl::Status SyncRounds::CheckRound(uint64_t round, const char* what) const {
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

absl::Status SyncRounds::CheckParticipant(const Member& m, uint64_t round, const char* what) const {
  if (absl::Status s = CheckRound(round, what); !s.ok()) return s;
  if (!IsParticipant(m.id)) {
    const std::string& missed = R(m.id).missed_reason;
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", m.id, " is not a participant of round ", round_,
                     missed.empty() ? "" : absl::StrCat(" (", missed, ")")));
  }
  return absl::OkStatus();
}

bool SyncRounds::HoldsAgreedModel(const RoundMember& r) const {
  return r.model_round == last_completed_round_ && r.model_hash == agreed_hash_ &&
         !agreed_hash_.empty();
}

std::vector<std::string> SyncRounds::Holders() const {
  std::vector<std::string> holders;
  for (const auto& [id, m] : members_->members()) {
    if (HoldsAgreedModel(R(id)) && !m.outbound_only) holders.push_back(m.address);
  }
  return holders;
}

absl::Status SyncRounds::CheckJoin(const shoal::v1::JoinRequest& request) {
  RETURN_IF_ERROR(trust_.CheckJoin(request, clock_->Now()));
  if (!ledger_.has_value()) return absl::OkStatus();
  // A worker's first join comes before its trainer exists (it needs the
  // run's config): it declares its training set with its model.
  if (request.train_samples() == 0 && !request.has_layout()) return absl::OkStatus();
  const uint64_t before = ledger_->dataset();
  RETURN_IF_ERROR(ledger_->CheckDataset(request.train_samples()));
  if (before == 0) versions_->MarkRecordChanged();
  return absl::OkStatus();
}

void SyncRounds::OnJoined(Member& m, const shoal::v1::JoinRequest& request) {
  RoundMember& r = rounds_[m.id];
  r.plan_list_known = 0;  // a new session has no participant list yet
  trust_.OnJoined(m.id, request);
  r.model_round = request.model_round();
  r.model_hash = request.model_hash();
  if (request.model_round() == 0 && !request.initial_model_hash().empty()) {
    // A worker that declares its model (docs/PYTHON.md "Any model"): the
    // first initial model declared before round 1 starts is the run's; a
    // worker holding another one takes it from the holders (RoundStart).
    r.model_hash = request.initial_model_hash();
    if (last_completed_round_ == 0 && agreed_hash_.empty() && round_ == 1 &&
        phase_ == shoal::v1::WAITING_FOR_MEMBERS && participants_.empty()) {
      agreed_hash_ = request.initial_model_hash();
      versions_->MarkRecordChanged();
      SHOAL_LOG(INFO) << "the run's initial model is " << m.id << "'s (hash "
                      << agreed_hash_.substr(0, 12) << ")";
    }
  }
  // After a restart, workers may hold a round the record had not saved yet
  // (the coordinator died between their reports and the write): adopt it.
  if (fresh_start_ && request.model_round() > last_completed_round_ &&
      !request.model_hash().empty() && phase_ == shoal::v1::WAITING_FOR_MEMBERS &&
      participants_.empty()) {
    SHOAL_LOG(WARNING) << "worker " << m.id << " holds round " << request.model_round()
                       << ", newer than the record's " << last_completed_round_
                       << "; continuing from it";
    last_completed_round_ = request.model_round();
    agreed_hash_ = request.model_hash();
    round_ = last_completed_round_ + 1;
    versions_->MarkRecordChanged();
  }
}

void SyncRounds::FillJoinResponse(const Member& m, shoal::v1::JoinResponse* r) const {
  r->set_next_round(NextOpenRound(phase_, round_, any_ready_));
  r->set_model_round(last_completed_round_);
  r->set_model_hash(agreed_hash_);
  for (const std::string& h : Holders()) {
    if (h != m.address) r->add_holders(h);
  }
}

void SyncRounds::OnConnected(Member& m) {
  R(m.id).plan_list_known = 0;  // a new session has no participant list yet
}

bool SyncRounds::Forget(const std::string& worker_id) {
  if (!rounds_.contains(worker_id)) return false;
  // Out of the round first: its flags leave the counters with it.
  const bool was_participant = RemoveParticipant(worker_id);
  trust_.Forget(worker_id);
  Dequeue(worker_id);
  rounds_.erase(worker_id);
  return was_participant;
}

void SyncRounds::RemoveMember(std::string worker_id, MemberState why, const std::string& reason,
                              Directives* out) {
  if (!host_->DepartMember(worker_id, why, reason, out)) return;
  if (phase_ == shoal::v1::TRAINING) {
    if (participants_.empty()) {
      phase_ = shoal::v1::WAITING_FOR_MEMBERS;
      MaybeStartRound(out);
    } else {
      // Before sharing the round goes on without the worker.
      MaybeSendPlan(out);
    }
  } else if (phase_ == shoal::v1::SHARING) {
    Replan(absl::StrCat("participant ", worker_id, " lost: ", reason), out);
  }
}

absl::StatusOr<uint64_t> SyncRounds::JoinRound(Member& m, uint64_t round, uint64_t carried,
                                               Directives* out) {
  const std::string& worker_id = m.id;
  AdmissionInput in;
  in.phase = phase_;
  in.round = round_;
  in.any_ready = any_ready_;
  in.requested = round;
  in.participant = IsParticipant(worker_id);
  in.queued = IsQueued(worker_id);
  in.carried = carried;
  const AdmissionDecision admission = DecideAdmission(in);
  using Action = AdmissionDecision::Action;
  if (admission.action == Action::kReject) {
    return absl::FailedPreconditionError(admission.reason);
  }
  versions_->MarkStatusChanged();
  if (admission.action == Action::kAlreadyIn) return admission.round;  // a retried call
  m.last_seen = clock_->Now();
  RoundMember& r = R(worker_id);
  r.carried_round = carried;
  switch (admission.action) {
    case Action::kQueueForThisRound:
      Enqueue(worker_id);
      SHOAL_LOG(INFO) << "member " << worker_id << " waits for round " << round_ << " ("
                      << queued_.size() << "/" << options_.config.sync().min_participants() << ")";
      MaybeStartRound(out);
      break;
    case Action::kJoinRunningRound:
      ResetRoundFlags(worker_id);
      r.training_since = clock_->Now();
      AddParticipant(worker_id);
      m.state = MemberState::kTraining;
      if (ledger_.has_value()) {
        // Its own samples, as for those that started the round: without
        // them it would train nothing and its base model would count as
        // its work.
        CoordinatorMessage mine = RoundStartMessage(!HoldsAgreedModel(r));
        for (shoal::v1::SampleRange& range : ledger_->Assign(worker_id)) {
          *mine.mutable_round_start()->add_samples() = std::move(range);
        }
        out->push_back({worker_id, Share(std::move(mine))});
      } else {
        out->push_back({worker_id, Share(RoundStartMessage(!HoldsAgreedModel(r)))});
      }
      SHOAL_LOG(INFO) << "member " << worker_id << " joins running round " << round_
                      << " participants=" << participants_.size()
                      << (carried == round_ ? " (carries its trained work)" : "");
      break;
    default:
      Enqueue(worker_id);
      SHOAL_LOG(INFO) << "member " << worker_id << ": " << admission.reason;
      break;
  }
  return admission.round;
}

void SyncRounds::MissRound(const std::string& worker_id, const std::string& reason, Directives* out,
                           bool adaptive) {
  Member& m = members_->At(worker_id);
  RoundMember& r = R(worker_id);
  RemoveParticipant(worker_id);
  MissedRoundInput in;
  in.missed_before = r.missed_in_row;
  in.adaptive = adaptive;
  in.alive = members_->Alive(m, clock_->Now());
  const MissedRoundDecision missed = DecideMissedRound(in, options_.max_missed_rounds, reason);
  r.missed_in_row = missed.missed_in_row;
  if (!missed.counts) ++r.rounds_late;
  r.deadline_seconds = ReadyDeadlineSeconds();
  r.fold_round = 0;
  r.missed_reason = absl::StrCat("round ", round_, ": ", reason);
  m.state = MemberState::kWaiting;
  ResetRoundFlags(worker_id);
  SHOAL_LOG(WARNING) << "worker " << worker_id << " sits out round " << round_ << ": " << reason
                     << " (" << r.missed_in_row << " in a row"
                     << (missed.counts ? "" : "; slow, does not count") << ")";
  if (missed.evict) {
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(missed.reason);
    out->push_back({worker_id, Share(std::move(msg))});
    Penalize(worker_id, TrustEvent::kEvicted, "(missed rounds)", out, /*evicting=*/true);
    host_->DepartMember(worker_id, MemberState::kEvicted, missed.reason, out);
    return;
  }
  CoordinatorMessage msg;
  msg.mutable_round_missed()->set_round(round_);
  msg.mutable_round_missed()->set_reason(reason);
  out->push_back({worker_id, Share(std::move(msg))});
  Enqueue(worker_id);  // takes part again from the next round
}

// ------------------------------------------------------------------- Start

CoordinatorMessage SyncRounds::RoundStartMessage(bool with_holders) const {
  CoordinatorMessage msg;
  auto* start = msg.mutable_round_start();
  start->set_round(round_);
  start->set_base_model_round(last_completed_round_);
  start->set_base_model_hash(agreed_hash_);
  if (with_holders) {
    for (const std::string& h : Holders()) start->add_holders(h);
  }
  start->set_checkpoint_id(checkpoints_->checkpoint_id());
  start->set_checkpoint_round(checkpoints_->checkpoint_round());
  return msg;
}

void SyncRounds::HoldRounds(bool hold, Directives* out) {
  if (rounds_held_ != hold) {
    SHOAL_LOG(INFO) << (hold ? "rounds held: no round starts until released" : "rounds released");
  }
  rounds_held_ = hold;
  // Also when it was not held: a start refused by before_round_start.
  if (!hold) MaybeStartRound(out);
}

void SyncRounds::MaybeStartRound(Directives* out) {
  if (rounds_held_) return;
  const RoundStartDecision decision =
      DecideRoundStart(phase_, round_, queued_.size(), options_.config.sync().min_participants());
  if (!decision.start) return;
  if (options_.before_round_start) {
    // A change made earlier in this call (the round that just completed)
    // gets its version now, so that the record handed out is known by its
    // own version: with the version of the state before it, a writer that
    // already saved that version would skip the write, and the RoundStart
    // would go out before the completed round is in the record.
    versions_->CommitRecord();
    if (!options_.before_round_start(host_->CurrentRecord(), versions_->record_version())) return;
  }
  TakeParticipants();  // none while waiting; the queue becomes the round
  const std::vector<std::string> starting = TakeQueue();
  trust_.StartRound(round_);
  phase_ = shoal::v1::TRAINING;
  any_ready_ = false;
  attempt_ = 0;
  connection_retries_ = 0;
  sharing_started_ = false;
  round_started_at_ = clock_->Now();
  hard_ready_deadline_ = round_started_at_ + options_.round_timeout;
  first_ready_.reset();
  deadline_ = hard_ready_deadline_;
  // Two shared messages: the holders of the base model (O(N)) go only to
  // the workers that lack it.
  const SharedMessage start = Share(RoundStartMessage(/*with_holders=*/false));
  SharedMessage start_with_holders;
  for (const std::string& id : starting) {
    RoundMember& r = R(id);
    const bool holds = HoldsAgreedModel(r);
    if (!holds && start_with_holders == nullptr) {
      start_with_holders = Share(RoundStartMessage(/*with_holders=*/true));
    }
    members_->At(id).state = MemberState::kTraining;
    ResetRoundFlags(id);
    r.exchange_seconds = 0;
    r.training_since = round_started_at_;
    AddParticipant(id);
    if (ledger_.has_value()) {
      // Each participant's own samples: one message each.
      CoordinatorMessage mine = *(holds ? start : start_with_holders);
      for (shoal::v1::SampleRange& range : ledger_->Assign(id)) {
        *mine.mutable_round_start()->add_samples() = std::move(range);
      }
      out->push_back({id, Share(std::move(mine))});
      continue;
    }
    out->push_back({id, holds ? start : start_with_holders});
  }
  UpdateReadyDeadline(round_started_at_);
  SHOAL_LOG(INFO) << "round " << round_ << " started with " << participants_.size()
                  << " participants: " << absl::StrJoin(participants_, ",");
}

// --------------------------------------------------------- Ready and plan

absl::Status SyncRounds::ReportReady(Member& m, const shoal::v1::ReportReadyRequest& request,
                                     Directives* out) {
  if (absl::Status s = CheckParticipant(m, request.round(), "ready"); !s.ok()) return s;
  RoundMember& r = R(m.id);
  if (phase_ != shoal::v1::TRAINING) {
    if (r.ready) return absl::OkStatus();  // retried call
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round_, " is no longer accepting ready reports"));
  }
  if (!request.base_unavailable().empty()) return BaseUnavailable(m, request, out);
  if (request.total_elements() == 0) {
    return absl::InvalidArgumentError("total_elements must be positive");
  }
  if (request.total_elements() < options_.config.exchange().fragments()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a model of ", request.total_elements(), " elements cannot be cut into ",
                     options_.config.exchange().fragments(), " fragments (--fragments)"));
  }
  if (total_elements_ == 0) total_elements_ = request.total_elements();
  if (request.total_elements() != total_elements_) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", request.total_elements(),
                                                   " elements, the run's model has ",
                                                   total_elements_, " (different --model?)"));
  }
  std::optional<FoldedReady> fold;
  if (request.folded()) {
    FoldedReadyInput in;
    in.fold_late_work = options_.config.sync().fold_late_work();
    in.max_staleness = options_.config.sync().max_staleness();
    in.round = round_;
    in.base_round = last_completed_round_;
    in.folded_base_round = request.folded_base_round();
    in.folded_trained_round = request.folded_trained_round();
    in.folded_weight = request.folded_weight();
    absl::StatusOr<FoldedReady> checked = CheckFoldedReady(in);
    if (!checked.ok()) return checked.status();
    fold = *checked;
  }
  versions_->MarkStatusChanged();
  const absl::Time now = clock_->Now();
  m.last_seen = now;
  // A retried report is measured once; a fold did not train in this round,
  // nor did work carried across a failover (trained under the old leader),
  // so neither says anything of the worker's speed.
  if (!r.ready && !fold.has_value() && r.carried_round != round_) {
    AddSample(r.ready_times, now - r.training_since, SampleWindow());
  }
  if (fold.has_value()) {
    r.fold_round = round_;
    r.fold_staleness = fold->staleness;
    r.fold_weight = fold->weight;
    r.fold_train_seconds = request.folded_train_seconds();
  } else {
    r.fold_round = 0;
  }
  UpdateFlags(m.id, [](RoundMember& x) { x.ready = true; });
  m.state = MemberState::kReady;
  r.train_loss = request.train_loss();
  if (trust_.audits_on()) {
    trust_.OnReady(
        m.id, request,
        ledger_.has_value() ? ledger_->InFlight(m.id) : std::vector<shoal::v1::SampleRange>());
  }
  any_ready_ = true;
  if (!first_ready_.has_value()) {
    first_ready_ = now - round_started_at_;
    UpdateReadyDeadline(now);
  }
  MaybeSendPlan(out);
  return absl::OkStatus();
}

void SyncRounds::MaybeSendPlan(Directives* out) {
  if (phase_ != shoal::v1::TRAINING || participants_.empty()) return;
  if (ready_count_ < participants_.size()) return;
  if (trust_.audits_on() && !AuditsSettled(out)) return;
  phase_ = shoal::v1::SHARING;
  SendPlan(out);
}

// ------------------------------------------------------------------ Audits

bool SyncRounds::AuditsSettled(Directives* out) {
  if (!trust_.assigned()) {
    for (RoundTrust::Assignment& a :
         trust_.Assign(last_completed_round_, agreed_hash_, participants_)) {
      SHOAL_LOG(INFO) << "round " << round_ << ": " << a.auditor << " replays the work of "
                      << a.request.participant() << " (audit " << a.request.audit_id() << ")";
      CoordinatorMessage msg;
      *msg.mutable_audit_request() = std::move(a.request);
      out->push_back({a.auditor, Share(std::move(msg))});
    }
    if (trust_.Pending()) {
      // A replay takes about as long as the training it replays.
      deadline_ = clock_->Now() + options_.round_timeout;
      versions_->MarkStatusChanged();
    }
  }
  return !trust_.Pending();
}

absl::Status SyncRounds::ReportAudit(Member& m, const shoal::v1::ReportAuditRequest& request,
                                     Directives* out) {
  absl::StatusOr<RoundTrust::Verdict> verdict = trust_.OnReport(m.id, request);
  if (!verdict.ok()) return verdict.status();
  versions_->MarkStatusChanged();
  m.last_seen = clock_->Now();
  using Kind = RoundTrust::Verdict::Kind;
  switch (verdict->kind) {
    case Kind::kPassed:
      SHOAL_LOG(INFO) << "round " << round_ << ": " << verdict->reason;
      Penalize(verdict->participant, TrustEvent::kAuditPassed, absl::StrCat("by ", m.id), out);
      break;
    case Kind::kDropped:
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << verdict->reason;
      break;
    case Kind::kSecondOpinion: {
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << verdict->reason;
      CoordinatorMessage msg;
      *msg.mutable_audit_request() = verdict->second.request;
      out->push_back({verdict->second.auditor, Share(std::move(msg))});
      deadline_ = clock_->Now() + options_.round_timeout;
      return absl::OkStatus();
    }
    case Kind::kAuditorWrong:
      SHOAL_LOG(ERROR) << "round " << round_ << ": " << verdict->reason;
      Penalize(verdict->participant, TrustEvent::kAuditPassed, "on a second opinion", out);
      Penalize(verdict->auditor, TrustEvent::kAuditFailed,
               absl::StrCat("(its replay of ", verdict->participant, "'s work was wrong)"), out);
      break;
    case Kind::kFailed:
      SHOAL_LOG(ERROR) << "round " << round_ << ": worker " << verdict->participant << " "
                       << verdict->reason << "; its contribution leaves the round";
      if (IsParticipant(verdict->participant) && phase_ == shoal::v1::TRAINING) {
        // Its samples go back to the ledger's pool with it.
        MissRound(verdict->participant, verdict->reason, out);
      }
      Penalize(verdict->participant, TrustEvent::kAuditFailed, absl::StrCat("by ", m.id), out);
      break;
  }
  MaybeSendPlan(out);
  return absl::OkStatus();
}

bool SyncRounds::OnHeartbeat(Member& m, const shoal::v1::Heartbeat& heartbeat) {
  for (const std::string& address : heartbeat.bad_chunks_from()) {
    for (const std::string& accused : members_->AtAddress(address, &m)) {
      std::string reporters;
      if (!trust_.OnBadChunks(m.id, accused, &reporters)) continue;
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << accused << " sent bad chunks to "
                         << reporters;
      const std::string ban =
          trust_.Record(accused, TrustEvent::kBadChunks, absl::StrCat("to ", reporters));
      versions_->MarkStatusChanged();
      if (ban.empty()) continue;
      const Member* banned = members_->Find(accused);
      trust_.Ban(accused, banned == nullptr ? "" : banned->name, ban, clock_->Now());
      versions_->MarkRecordChanged();
      SHOAL_LOG(WARNING) << "worker " << accused << " banned: " << ban;
      bans_due_.push_back({accused, absl::StrCat("banned: ", ban)});
    }
  }
  return true;
}

void SyncRounds::Penalize(const std::string& worker_id, TrustEvent event, const std::string& detail,
                          Directives* out, bool evicting) {
  const std::string ban = trust_.Record(worker_id, event, detail);
  if (ban.empty()) return;
  const Member* m = members_->Find(worker_id);
  trust_.Ban(worker_id, m == nullptr ? "" : m->name, ban, clock_->Now());
  versions_->MarkRecordChanged();
  SHOAL_LOG(WARNING) << "worker " << worker_id << (m != nullptr && !m->name.empty() ? " (" : "")
                     << (m != nullptr ? m->name : "")
                     << (m != nullptr && !m->name.empty() ? ")" : "") << " banned: " << ban;
  if (evicting || m == nullptr) return;
  const std::string reason = absl::StrCat("banned: ", ban);
  CoordinatorMessage msg;
  msg.mutable_leave_requested()->set_reason(reason);
  out->push_back({worker_id, Share(std::move(msg))});
  RemoveMember(worker_id, MemberState::kEvicted, reason, out);
}

void SyncRounds::SendPlan(Directives* out) {
  ++attempt_;
  connection_retries_ = 0;
  sharing_started_ = false;
  deadline_ = clock_->Now() + options_.connection_timeout;
  std::vector<bool> outbound(participants_.size());
  for (size_t k = 0; k < participants_.size(); ++k) {
    outbound[k] = members_->At(participants_[k]).outbound_only;
  }
  // Streaming fragments: the round averages its fragment only.
  const SliceRange fragment =
      FragmentOf(total_elements_, options_.config.exchange().fragments(), round_);
  const std::vector<SliceRange> slices = PlanSlicesAmong(fragment, outbound);
  // A new version whenever the list (ids, addresses, outbound-only, order)
  // changed.
  bool same_list = plan_list_.size() == participants_.size() && plan_list_outbound_ == outbound;
  for (size_t k = 0; same_list && k < participants_.size(); ++k) {
    const Member& m = members_->At(participants_[k]);
    same_list = plan_list_[k].first == m.id && plan_list_[k].second == m.address;
  }
  if (!same_list) {
    ++plan_list_version_;
    plan_list_.clear();
    plan_list_.reserve(participants_.size());
    for (const std::string& id : participants_) {
      plan_list_.emplace_back(id, members_->At(id).address);
    }
    plan_list_outbound_ = outbound;
  }
  CoordinatorMessage msg;
  shoal::v1::RoundPlan* plan = msg.mutable_round_plan();
  plan->set_round(round_);
  plan->set_total_elements(total_elements_);
  plan->set_attempt(attempt_);
  plan->set_participants_version(plan_list_version_);
  if (fragment.end - fragment.begin != total_elements_) {
    plan->set_fragment_begin(fragment.begin);
    plan->set_fragment_end(fragment.end);
  }
  size_t stages = 0;
  // A participant behind NAT cannot serve a stage's copies: such rounds
  // stay flat (docs/SUPERNODES.md, "NAT").
  const bool any_outbound = std::find(outbound.begin(), outbound.end(), true) != outbound.end();
  if (options_.config.topology().hierarchy() && !any_outbound) {
    // The stages name participants by plan index, so they travel with the
    // compact plan too (a few bytes per participant).
    std::vector<HierarchyParticipant> hp;
    hp.reserve(participants_.size());
    for (const std::string& id : participants_) hp.push_back({id, members_->At(id).zone});
    // The elected supernodes lead their zones (a head that is not a
    // candidate of this round, e.g. it sits the round out, gets the
    // builder's default).
    topology_->ReelectIfStale(round_);
    ZoneHeads heads;
    for (const ZoneElection& z : topology_->election().zones) {
      if (!z.supernode.empty()) heads[z.path] = z.supernode;
    }
    HierarchyPlan h = BuildHierarchyPlan(hp, heads);
    stages = static_cast<size_t>(h.hierarchy.stages_size());
    if (stages > 0) *plan->mutable_hierarchy() = std::move(h.hierarchy);
  }
  CoordinatorMessage compact = msg;  // the same plan without the list
  plan->mutable_slices()->Reserve(static_cast<int>(participants_.size()));
  for (size_t k = 0; k < participants_.size(); ++k) {
    const std::string& id = participants_[k];
    Member& m = members_->At(id);
    RoundMember& r = R(id);
    m.state = MemberState::kSharing;
    if (r.done && r.model_round == round_) {
      // A report of an earlier attempt: that model is discarded.
      r.model_round = last_completed_round_;
      r.model_hash = agreed_hash_;
    }
    UpdateFlags(id, [](RoundMember& x) {
      x.connections_ok = x.done = false;
      x.unreachable.clear();
    });
    auto* s = plan->add_slices();
    s->set_worker_id(m.id);
    s->set_peer_address(m.address);
    s->set_begin(slices[k].begin);
    s->set_end(slices[k].end);
    s->set_outbound_only(outbound[k]);
  }
  // The full plan names every participant (O(N) bytes): it goes, as one
  // shared copy, only to sessions that do not hold this list yet.
  const SharedMessage full = Share(std::move(msg));
  const SharedMessage small = Share(std::move(compact));
  for (const std::string& id : participants_) {
    RoundMember& r = R(id);
    out->push_back({id, r.plan_list_known == plan_list_version_ ? small : full});
    r.plan_list_known = plan_list_version_;
  }
  SHOAL_LOG(INFO) << "round " << round_ << " plan attempt " << attempt_ << ": "
                  << participants_.size() << " participants, " << total_elements_ << " elements"
                  << (stages > 0 ? absl::StrCat(", ", stages, " hierarchical stages") : "");
}

// ------------------------------------------------------ Connection barrier

absl::Status SyncRounds::ConnectionsReady(Member& m,
                                          const shoal::v1::ConnectionsReadyRequest& request,
                                          Directives* out) {
  if (absl::Status s = CheckParticipant(m, request.round(), "connections ready"); !s.ok()) {
    return s;
  }
  if (phase_ != shoal::v1::SHARING || request.attempt() != attempt_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan attempt ", request.attempt(), " is not current (round ", round_, " is at attempt ",
        attempt_, phase_ == shoal::v1::SHARING ? "" : ", not sharing", ")"));
  }
  if (sharing_started_) return absl::OkStatus();  // retried call
  for (const std::string& id : request.unreachable()) {
    if (!IsParticipant(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unreachable worker '", id, "' is not a participant of round ", round_));
    }
  }
  versions_->MarkStatusChanged();
  m.last_seen = clock_->Now();
  UpdateFlags(m.id, [&request](RoundMember& x) {
    x.connections_ok = true;
    x.unreachable.assign(request.unreachable().begin(), request.unreachable().end());
  });
  const RoundMember& r = R(m.id);
  if (!r.unreachable.empty()) {
    SHOAL_LOG(WARNING) << "round " << round_ << ": " << m.id << " cannot reach "
                       << absl::StrJoin(r.unreachable, ",");
  }
  MaybeStartSharing(out);
  return absl::OkStatus();
}

FailingPeers SyncRounds::ComputeFailingPeers() const {
  std::vector<PeerReport> reports;
  reports.reserve(participants_.size());
  for (const std::string& id : participants_) {
    const RoundMember& r = R(id);
    reports.push_back({id, r.connections_ok, r.unreachable});
  }
  return FindFailingPeers(reports);
}

void SyncRounds::MaybeStartSharing(Directives* out) {
  if (phase_ != shoal::v1::SHARING || sharing_started_) return;
  ApplyConnectionBarrier(ConnectionEvent::kReport, out);
}

void SyncRounds::ApplyConnectionBarrier(ConnectionEvent event, Directives* out) {
  ConnectionBarrierInput in;
  in.round = round_;
  in.participants = participants_.size();
  in.reported = connected_count_;
  in.reported_unreachable = unreachable_count_;
  in.retries = connection_retries_;
  const ConnectionBarrierDecision barrier =
      DecideConnectionBarrier(in, event, options_.max_connection_retry);
  switch (barrier.action) {
    case ConnectionBarrierDecision::Action::kWait:
      return;
    case ConnectionBarrierDecision::Action::kRetry:
      RetryConnections(barrier.reason, out);
      return;
    case ConnectionBarrierDecision::Action::kEvictFailing:
      EvictFailingPeers(barrier.reason, out);
      return;
    case ConnectionBarrierDecision::Action::kStartSharing:
      break;
  }
  sharing_started_ = true;
  deadline_ = clock_->Now() + options_.round_timeout;
  CoordinatorMessage msg;
  msg.mutable_start_sharing()->set_round(round_);
  msg.mutable_start_sharing()->set_attempt(attempt_);
  const SharedMessage shared = Share(std::move(msg));
  for (const std::string& id : participants_) out->push_back({id, shared});
  SHOAL_LOG(INFO) << "round " << round_ << ": all " << participants_.size()
                  << " participants connected, sharing starts (attempt " << attempt_ << ")";
}

void SyncRounds::RetryConnections(const std::string& reason, Directives* out) {
  const FailingPeers failing = ComputeFailingPeers();
  ++connection_retries_;
  deadline_ = clock_->Now() + options_.connection_timeout;
  SHOAL_LOG(WARNING) << "round " << round_ << ": peers not connected ("
                     << absl::StrJoin(failing.failing, ",") << ": " << failing.reason << "), "
                     << reason;
  CoordinatorMessage msg;
  auto* retry = msg.mutable_retry_connections();
  retry->set_round(round_);
  retry->set_attempt(attempt_);
  retry->set_retry(connection_retries_);
  for (const std::string& id : failing.failing) retry->add_failing(id);
  const SharedMessage shared = Share(std::move(msg));
  for (const std::string& id : participants_) {
    UpdateFlags(id, [](RoundMember& x) {
      x.connections_ok = false;
      x.unreachable.clear();
    });
    out->push_back({id, shared});
  }
}

void SyncRounds::EvictFailingPeers(const std::string& reason, Directives* out) {
  const FailingPeers failing = ComputeFailingPeers();
  SHOAL_LOG(WARNING) << "round " << round_ << ": evicting " << absl::StrJoin(failing.failing, ",")
                     << " (" << failing.reason << ")";
  for (const std::string& id : failing.failing) {
    CoordinatorMessage msg;
    msg.mutable_connection_fail()->set_round(round_);
    msg.mutable_connection_fail()->set_reason(reason);
    out->push_back({id, Share(std::move(msg))});
    Penalize(id, TrustEvent::kEvicted, "(unreachable)", out, /*evicting=*/true);
    host_->DepartMember(id, MemberState::kEvicted, reason, out);
  }
  if (participants_.empty()) {
    AbortRound("no participant left after connection failures", out);
    return;
  }
  SendPlan(out);  // the rest go on with a recomputed plan
}

// ------------------------------------------------------ Sharing and votes

absl::Status SyncRounds::ReportRoundDone(Member& m,
                                         const shoal::v1::ReportRoundDoneRequest& request,
                                         Directives* out) {
  RoundMember& r = R(m.id);
  if (request.round() != round_ || phase_ != shoal::v1::SHARING || !sharing_started_) {
    if (request.round() == last_completed_round_ && r.model_round == request.round()) {
      return absl::OkStatus();  // retried call for a round that completed
    }
    return absl::FailedPreconditionError(absl::StrCat("round ", request.round(),
                                                      " is not sharing (run at round ", round_,
                                                      ", ", shoal::v1::Phase_Name(phase_), ")"));
  }
  if (!IsParticipant(m.id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", m.id, " is not a participant of round ", round_));
  }
  if (request.attempt() != 0 && request.attempt() != attempt_) {
    return absl::FailedPreconditionError(absl::StrCat("plan attempt ", request.attempt(),
                                                      " is not current (round ", round_,
                                                      " is at attempt ", attempt_, ")"));
  }
  if (!IsHexSha256(request.model_hash())) {
    return absl::InvalidArgumentError("model_hash must be 64 lowercase hex digits (SHA-256)");
  }
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"step_seconds", request.step_seconds()},
        {"bandwidth_bytes_per_second", request.bandwidth_bytes_per_second()}}) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be a finite number >= 0 (0 = not measured), got ", value));
    }
  }
  versions_->MarkStatusChanged();
  m.last_seen = clock_->Now();
  UpdateFlags(m.id, [](RoundMember& x) { x.done = true; });
  r.model_hash = request.model_hash();
  r.model_round = request.round();
  r.exchange_seconds = request.exchange_seconds();
  r.bytes_received = request.bytes_received();
  r.bytes_sent = request.bytes_sent();
  r.compression_ratio = request.compression_ratio();
  r.wire_round = request.round();
  // What the supernode election uses; 0 = not measured (keeps the last).
  topology_->Measure(m.id, request.step_seconds(), request.bandwidth_bytes_per_second());
  if (request.train_seconds() > 0) {
    AddSample(r.train_seconds, request.train_seconds(), SampleWindow());
  }
  r.round_train_seconds = request.train_seconds();
  if (request.metrics().evaluated()) {
    r.metrics = request.metrics();
    r.metrics_round = request.round();
  }
  MaybeCompleteRound(out);
  return absl::OkStatus();
}

void SyncRounds::MaybeCompleteRound(Directives* out) {
  if (phase_ != shoal::v1::SHARING || !sharing_started_ || participants_.empty()) return;
  if (done_count_ < participants_.size()) return;
  HashVote vote;
  {
    std::vector<HashReport> reports;
    reports.reserve(participants_.size());
    for (const std::string& id : participants_) reports.push_back({id, R(id).model_hash});
    vote = DecideHashVote(reports);
  }  // the reports point into participants_, which the evictions below change
  if (vote.outcome == HashVote::Outcome::kNoMajority) {
    // Nobody can tell which copy is right, so everyone rolls back and the
    // round runs again.
    AbortRound(vote.reason, out);
    return;
  }
  const std::string& hash = vote.hash;
  if (!vote.minority.empty()) SHOAL_LOG(ERROR) << "round " << round_ << ": " << vote.reason;
  for (const std::string& id : vote.minority) {
    SHOAL_LOG(ERROR) << "round " << round_ << ": worker " << id << " reported hash "
                     << R(id).model_hash.substr(0, 12) << ", majority has " << hash.substr(0, 12);
    Penalize(id, TrustEvent::kHashMinority, "", out, /*evicting=*/true);
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(
        absl::StrCat("model hash mismatch in round ", round_));
    out->push_back({id, Share(std::move(msg))});
    host_->DepartMember(id, MemberState::kEvicted,
                        absl::StrCat("model hash mismatch in round ", round_), out);
  }

  const absl::Time now = clock_->Now();
  shoal::v1::RoundSummary summary;
  summary.set_round(round_);
  summary.set_participants(participants_.size());
  summary.set_seconds(absl::ToDoubleSeconds(now - round_started_at_));
  summary.set_model_hash(hash);
  double loss = 0, exchange = 0;
  const double ready_deadline_seconds = ReadyDeadlineSeconds();
  for (const std::string& id : participants_) {
    RoundMember& r = R(id);
    loss += r.train_loss;
    exchange += r.exchange_seconds;
    if (r.metrics_round == round_ && !summary.evaluated()) {
      summary.set_evaluated(true);
      summary.set_test_accuracy(r.metrics.test_accuracy());
      summary.set_test_loss(r.metrics.test_loss());
    }
    r.rounds_completed++;
    if (ledger_.has_value()) ledger_->Trained(id);
    Penalize(id, TrustEvent::kRoundCompleted, "", out, /*evicting=*/true);
    AddSample(r.time_shares,
              RoundMember::TimeShare{r.round_train_seconds, r.exchange_seconds, summary.seconds()},
              SampleWindow());
    r.missed_in_row = 0;
    r.deadline_seconds = ready_deadline_seconds;
    if (r.fold_round == round_) {
      ++r.folded_updates;
      r.last_fold_round = round_;
      r.last_fold_staleness = r.fold_staleness;
      r.last_fold_weight = r.fold_weight;
      r.last_fold_train_seconds = r.fold_train_seconds;
      r.fold_round = 0;
    }
    members_->At(id).state = MemberState::kWaiting;
  }
  summary.set_train_loss(loss / participants_.size());
  summary.set_exchange_seconds(exchange / participants_.size());
  if (!summary.evaluated() && !recent_rounds_.empty()) {
    summary.set_test_accuracy(recent_rounds_.back().test_accuracy());
    summary.set_test_loss(recent_rounds_.back().test_loss());
  }
  recent_rounds_.push_back(summary);
  while (recent_rounds_.size() > 100) recent_rounds_.pop_front();
  last_completed_round_ = round_;
  agreed_hash_ = hash;
  fresh_start_ = false;
  versions_->MarkRecordChanged();
  SHOAL_LOG(INFO) << "round " << round_ << " complete: participants=" << participants_.size()
                  << " hash=" << hash.substr(0, 16) << " seconds=" << summary.seconds();
  // The round's measurements are in: the one evaluation per round that
  // may move a supernode (after several rounds of a clear advantage).
  topology_->Reelect(ElectionTrigger::kMeasurements, round_);

  CoordinatorMessage done;
  done.mutable_round_complete()->set_round(round_);
  done.mutable_round_complete()->set_model_hash(hash);
  const SharedMessage shared_done = Share(std::move(done));
  for (const std::string& id : participants_) out->push_back({id, shared_done});

  const uint64_t limit = options_.config.sync().rounds();
  const bool epochs_done = ledger_.has_value() && ledger_->Finished();
  const bool last = (limit > 0 && last_completed_round_ >= limit) || epochs_done;
  if (checkpoints_->Due(last_completed_round_, last)) {
    AssignCheckpoint(last_completed_round_, /*first=*/true, out);
  }
  if (last) {
    host_->FinishRun(epochs_done ? absl::StrCat("completed ", ledger_->epochs_done(), " epochs")
                                 : absl::StrCat("completed ", limit, " rounds"),
                     out);
    return;
  }
  // Participation is sticky: this round's participants take part in the next
  // one, joined by those queued during this round.
  const std::vector<std::string> stay = TakeParticipants();
  const std::vector<std::string> joining = TakeQueue();
  for (const std::string& id : stay) Enqueue(id);
  for (const std::string& id : joining) Enqueue(id);  // skips those already in
  ++round_;
  phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  MaybeStartRound(out);
}

// ------------------------------------------------- Re-plans and aborts

void SyncRounds::Replan(const std::string& reason, Directives* out) {
  if (participants_.empty()) {
    AbortRound(reason, out);
    return;
  }
  SHOAL_LOG(WARNING) << "round " << round_ << ": " << reason << "; " << participants_.size()
                     << " survivors exchange again";
  SendPlan(out);
}

absl::Status SyncRounds::BaseUnavailable(Member& m, const shoal::v1::ReportReadyRequest& request,
                                         Directives* out) {
  BaseUnavailableInput in;
  in.worker_id = m.id;
  in.round = round_;
  in.base_round = last_completed_round_;
  for (const auto& [id, other] : members_->members()) {
    if (id != m.id && HoldsAgreedModel(R(id))) in.base_held = true;
  }
  in.checkpoint_id = checkpoints_->checkpoint_id();
  in.checkpoint_round = checkpoints_->checkpoint_round();
  in.why = request.base_unavailable();
  in.checkpoint_damaged = request.base_checkpoint_damaged();
  const BaseUnavailableDecision d = DecideBaseUnavailable(in, checkpoints_->known());
  versions_->MarkStatusChanged();
  switch (d.action) {
    case BaseUnavailableDecision::Action::kSitOut:
      MissRound(m.id, d.reason, out);
      if (participants_.empty()) {
        AbortRound("no participant could load the round's base", out);
      } else {
        MaybeSendPlan(out);
      }
      return absl::OkStatus();
    case BaseUnavailableDecision::Action::kGoBack: {
      SHOAL_LOG(ERROR) << d.reason;
      base_fallback_ = d.reason;
      TakeBackRound(d.reason, out);
      checkpoints_->GoBack(d.to, in.checkpoint_damaged ? in.checkpoint_id : std::string());
      last_completed_round_ = d.to.round();
      agreed_hash_ = d.to.model_hash();
      // The ledger as it was at that checkpoint: the rounds after it are
      // trained again, with their samples.
      if (ledger_.has_value()) ledger_->Resume(d.to.ledger());
      round_ = last_completed_round_ + 1;
      // Nobody holds the model of a round after it any more.
      for (auto& [id, r] : rounds_) {
        if (r.model_round > last_completed_round_) r.model_round = 0;
      }
      versions_->MarkRecordChanged();
      MaybeStartRound(out);
      return absl::OkStatus();
    }
    case BaseUnavailableDecision::Action::kStop:
      TakeBackRound(d.reason, out);
      host_->FailRun(d.reason, out);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

void SyncRounds::AbortRound(const std::string& reason, Directives* out) {
  TakeBackRound(reason, out);
  MaybeStartRound(out);
}

void SyncRounds::TakeBackRound(const std::string& reason, Directives* out) {
  SHOAL_LOG(WARNING) << "round " << round_ << " aborted: " << reason;
  CoordinatorMessage msg;
  msg.mutable_round_aborted()->set_round(round_);
  msg.mutable_round_aborted()->set_reason(reason);
  const SharedMessage shared = Share(std::move(msg));
  const std::vector<std::string> aborted = TakeParticipants();
  const std::vector<std::string> waiting = TakeQueue();
  for (const std::string& id : aborted) {
    if (ledger_.has_value()) ledger_->Lost(id);
    out->push_back({id, shared});
    RoundMember& r = R(id);
    members_->At(id).state = MemberState::kWaiting;
    if (r.done && r.model_round == round_) {
      // It rolls back to the last agreed model.
      r.model_round = last_completed_round_;
      r.model_hash = agreed_hash_;
    }
    ResetRoundFlags(id);
    Enqueue(id);
  }
  for (const std::string& id : waiting) Enqueue(id);
  phase_ = shoal::v1::WAITING_FOR_MEMBERS;
}

// ------------------------------------------------------------- Checkpoints

absl::Status SyncRounds::ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                          Directives* out) {
  bool reassign = false;
  if (absl::Status s = checkpoints_->ReportUpload(request, &reassign); !s.ok()) return s;
  if (reassign) AssignCheckpoint(request.round(), /*first=*/false, out);
  return absl::OkStatus();
}

void SyncRounds::AssignCheckpoint(uint64_t round, bool first, Directives* out) {
  std::vector<CheckpointCandidate> candidates;
  candidates.reserve(members_->size());
  for (const auto& [id, m] : members_->members()) {
    const RoundMember& r = R(id);
    candidates.push_back({id, r.model_round == round && r.model_hash == agreed_hash_});
  }
  if (first) {
    checkpoints_->StartUpload(round, agreed_hash_, candidates, out,
                              ledger_.has_value() ? ledger_->Durable() : shoal::v1::SampleLedger());
  } else {
    checkpoints_->AssignUpload(round, agreed_hash_, candidates, out);
  }
}

// --------------------------------------------------------------- Deadlines

void SyncRounds::Tick(absl::Time now, Directives* out) {
  for (const auto& [id, reason] : std::exchange(bans_due_, {})) {
    if (!members_->Contains(id)) continue;
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(reason);
    out->push_back({id, Share(std::move(msg))});
    RemoveMember(id, MemberState::kEvicted, reason, out);
  }
  if (const uint64_t stalled = checkpoints_->StalledUpload(now); stalled > 0) {
    AssignCheckpoint(stalled, /*first=*/false, out);
  }
  ApplyRoundDeadline(now, out);
}

AdaptiveDeadlineOptions SyncRounds::AdaptiveOptions() const {
  AdaptiveDeadlineOptions o = options_.adaptive_deadline;
  o.round_timeout = options_.round_timeout;
  return o;
}

size_t SyncRounds::SampleWindow() const {
  return std::max<size_t>(5, options_.adaptive_deadline.after_rounds);
}

double SyncRounds::ReadyDeadlineSeconds() const {
  if (ready_deadline_.deadline == absl::InfiniteFuture() ||
      round_started_at_ == absl::InfinitePast()) {
    return 0;
  }
  return absl::ToDoubleSeconds(ready_deadline_.deadline - round_started_at_);
}

void SyncRounds::UpdateReadyDeadline(absl::Time now) {
  if (phase_ != shoal::v1::TRAINING) return;
  const AdaptiveDeadlineOptions adaptive = AdaptiveOptions();
  ReadyDeadlineInput in;
  in.round_started = round_started_at_;
  in.hard_deadline = hard_ready_deadline_;
  in.participants = participants_.size();
  in.first_ready = first_ready_;
  if (adaptive.enabled) {
    for (const std::string& id : participants_) {
      const RoundMember& r = R(id);
      if (r.ready_times.size() < std::max<uint32_t>(1, adaptive.after_rounds)) continue;
      in.measured.push_back(MedianDuration({r.ready_times.begin(), r.ready_times.end()}));
    }
  }
  ReadyDeadlineDecision decision = DecideReadyDeadline(in, adaptive, now);
  if (decision.deadline != ready_deadline_.deadline || decision.reason != ready_deadline_.reason) {
    versions_->MarkStatusChanged();
    SHOAL_LOG(INFO) << "round " << round_ << ": ready deadline "
                    << absl::FormatDuration(decision.deadline - round_started_at_)
                    << " after the start: " << decision.reason;
  }
  ready_deadline_ = std::move(decision);
  deadline_ = ready_deadline_.deadline;
}

void SyncRounds::ApplyRoundDeadline(absl::Time now, Directives* out) {
  // Listing the late participants is O(N): only once the deadline passed.
  if (now < deadline_) return;
  if (phase_ == shoal::v1::TRAINING && trust_.Pending() && ready_count_ == participants_.size()) {
    // The plan goes without the replays that did not come back.
    for (const RoundTrust::Verdict& v : trust_.DropPending("no report within --round_timeout")) {
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << v.reason;
    }
    versions_->MarkStatusChanged();
    MaybeSendPlan(out);
    return;
  }
  RoundDeadlineInput in;
  in.stage = StageOf(phase_, sharing_started_);
  in.deadline = deadline_;
  in.participants = participants_.size();
  if (in.stage == RoundStage::kTraining) {
    in.adaptive = ready_deadline_.adaptive;
    in.adaptive_reason = ready_deadline_.reason;
  }
  if (in.stage == RoundStage::kTraining || in.stage == RoundStage::kSharing) {
    for (const std::string& id : participants_) {
      const RoundMember& r = R(id);
      if (in.stage == RoundStage::kTraining ? !r.ready : !r.done) in.late.push_back(id);
    }
  }
  const RoundDeadlineDecision deadline = DecideRoundDeadline(in, options_.round_timeout, now);
  using Action = RoundDeadlineDecision::Action;
  // Only the stages with a deadline act on it (a quiet tick leaves the status).
  if (deadline.action == Action::kNone) return;
  versions_->MarkStatusChanged();
  switch (deadline.action) {
    case Action::kKeepWaiting:
      // Past --round_timeout it waits another round_timeout (as always);
      // past the adaptive deadline it waits up to --round_timeout.
      if (!deadline.adaptive) hard_ready_deadline_ = now + options_.round_timeout;
      UpdateReadyDeadline(now);
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << deadline.reason;
      return;
    case Action::kConnectionBarrier:
      ApplyConnectionBarrier(ConnectionEvent::kDeadline, out);
      return;
    case Action::kAbort:
      AbortRound(deadline.reason, out);
      return;
    case Action::kSitOut:
      for (const std::string& id : deadline.sit_out) {
        MissRound(id, deadline.reason, out, deadline.adaptive);
        if (in.stage == RoundStage::kTraining) {
          Penalize(id, TrustEvent::kMissedDeadline, "", out);
        }
      }
      // Those ready go on to the plan; those done hold the complete average
      // (the others catch up later).
      if (in.stage == RoundStage::kTraining) {
        MaybeSendPlan(out);
      } else {
        MaybeCompleteRound(out);
      }
      return;
    case Action::kNone:
      return;
  }
}

// ------------------------------------------------------------------ Status

std::string SyncRounds::PhaseDetail() const {
  const uint32_t min = std::max<uint32_t>(1, options_.config.sync().min_participants());
  switch (phase_) {
    case shoal::v1::WAITING_FOR_MEMBERS:
      // Members join first and queue for a round once their model and data
      // are loaded: say both, so "0 of 3" with members present is clear.
      return absl::StrCat(queued_.size(), " of ", min, " participants needed for round ", round_,
                          " are queued (", members_->size(),
                          members_->size() == 1 ? " member" : " members",
                          " joined; a member queues once its model and data are loaded)");
    case shoal::v1::TRAINING:
      if (trust_.Pending()) {
        return absl::StrCat(ready_count_, "/", participants_.size(),
                            " participants ready; waiting for the round's audits (replays)");
      }
      return absl::StrCat(ready_count_, "/", participants_.size(), " participants ready");
    case shoal::v1::SHARING: {
      if (!sharing_started_) {
        return absl::StrCat("connecting: ", connected_count_, "/", participants_.size(),
                            " participants reached their peers (attempt ", attempt_, ", retry ",
                            connection_retries_, "/", options_.max_connection_retry, ")");
      }
      return absl::StrCat(done_count_, "/", participants_.size(),
                          " participants done sharing (attempt ", attempt_, ")");
    }
    case shoal::v1::FINISHED:
      return absl::StrCat("finished after round ", last_completed_round_);
    default:
      return "";
  }
}

void SyncRounds::FillStatus(shoal::v1::RunStatus* s) const {
  s->set_phase(phase_);
  s->set_round(round_);
  s->set_last_completed_round(last_completed_round_);
  for (const auto& id : participants_) s->add_participants(id);
  for (const auto& r : recent_rounds_) *s->add_recent_rounds() = r;
  s->set_model_hash(agreed_hash_);
  s->set_detail(PhaseDetail());
  s->set_connection_retries(connection_retries_);
  s->set_attempt(phase_ == shoal::v1::SHARING ? attempt_ : 0);
  s->set_queued(queued_.size());
  s->set_base_fallback(base_fallback_);
  if (ledger_.has_value()) *s->mutable_ledger() = ledger_->Status();
  trust_.FillStatus(s, clock_->Now());
  if (ready_deadline_.deadline != absl::InfiniteFuture() &&
      round_started_at_ != absl::InfinitePast() && !ready_deadline_.reason.empty()) {
    s->set_ready_deadline_seconds(ReadyDeadlineSeconds());
    s->set_ready_deadline_reason(ready_deadline_.reason);
    s->set_ready_deadline_adaptive(ready_deadline_.adaptive);
  }
}

void SyncRounds::FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const {
  auto it = rounds_.find(worker_id);
  if (it == rounds_.end()) return;
  const RoundMember& r = it->second;
  w->set_model_hash(r.model_hash);
  w->set_model_round(r.model_round);
  w->set_test_accuracy(r.metrics.test_accuracy());
  w->set_test_loss(r.metrics.test_loss());
  w->set_metrics_round(r.metrics_round);
  w->set_train_loss(r.train_loss);
  w->set_rounds_completed(r.rounds_completed);
  w->set_rounds_missed(r.missed_in_row);
  w->set_missed_reason(r.missed_reason);
  if (!r.train_seconds.empty()) {
    std::vector<double> t(r.train_seconds.begin(), r.train_seconds.end());
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    w->set_train_seconds_median(n % 2 == 1 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2);
  }
  if (!r.ready_times.empty()) {
    w->set_ready_seconds_median(
        absl::ToDoubleSeconds(MedianDuration({r.ready_times.begin(), r.ready_times.end()})));
  }
  w->set_rounds_late(r.rounds_late);
  w->set_bytes_received(r.bytes_received);
  w->set_bytes_sent(r.bytes_sent);
  w->set_compression_ratio(r.compression_ratio);
  w->set_wire_round(r.wire_round);
  w->set_folded_updates(r.folded_updates);
  w->set_last_fold_staleness(r.last_fold_staleness);
  w->set_last_fold_weight(r.last_fold_weight);
  w->set_last_fold_round(r.last_fold_round);
  w->set_last_fold_train_seconds(r.last_fold_train_seconds);
  w->set_deadline_seconds(r.deadline_seconds);
  double train = 0, exchange = 0, wall = 0;
  for (const RoundMember::TimeShare& t : r.time_shares) {
    train += t.train;
    exchange += t.exchange;
    wall += t.wall;
  }
  if (wall > 0) {
    // Measured on two clocks (the worker's parts, the coordinator's
    // round): clamped so that the shares stay shares.
    const double t = std::min(1.0, train / wall);
    const double e = std::min(1.0 - t, exchange / wall);
    w->set_train_share(t);
    w->set_exchange_share(e);
    w->set_idle_share(1.0 - t - e);
  }
  // Overlapped rounds: once ready, a participant trains the next round
  // while this one is averaged.
  const bool ahead = options_.config.exchange().overlap() && r.ready;
  w->set_rounds_in_flight(IsParticipant(worker_id) ? (ahead ? 2 : 1) : 0);
  trust_.FillWorker(worker_id, w);
}

void SyncRounds::FillRecord(shoal::v1::RunRecord* r) const {
  r->set_last_completed_round(last_completed_round_);
  r->set_model_hash(agreed_hash_);
  if (ledger_.has_value()) *r->mutable_ledger() = ledger_->Durable();
  trust_.FillRecord(r, clock_->Now());
}

}  // namespace shoal::coordinator
