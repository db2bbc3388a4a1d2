// RoundEngine, the round's phases: start (DecideRoundStart), readiness and
// the plan, the peer-connection barrier (DecideConnectionBarrier,
// FindFailingPeers), sharing and completion (DecideHashVote), re-plans,
// aborts, the end of the run and the round deadlines (DecideRoundDeadline).
#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/shard_plan.h"
#include "services/coordinator/core/hierarchy_plan.h"
#include "services/coordinator/core/round_decisions.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/round_engine_internal.h"

namespace shoal::coordinator {
namespace {

using internal::IsHexSha256;
using internal::Share;
using shoal::v1::CoordinatorMessage;

// Keeps the newest `window` samples.
template <typename T>
void AddSample(std::deque<T>& samples, T sample, size_t window) {
  samples.push_back(sample);
  while (samples.size() > window) samples.pop_front();
}

}  // namespace

// ------------------------------------------------------------------- Start

CoordinatorMessage RoundEngine::RoundStartMessage(bool with_holders) const {
  CoordinatorMessage msg;
  auto* start = msg.mutable_round_start();
  start->set_round(round_);
  start->set_base_model_round(last_completed_round_);
  start->set_base_model_hash(agreed_hash_);
  if (with_holders) {
    for (const std::string& h : Holders()) start->add_holders(h);
  }
  start->set_checkpoint_id(checkpoint_id_);
  start->set_checkpoint_round(checkpoint_round_);
  return msg;
}

void RoundEngine::MaybeStartRound(Directives* out) {
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
    if (record_changed_) {
      ++record_version_;
      record_changed_ = false;
      status_changed_ = true;
    }
    if (!options_.before_round_start(RecordLocked(), record_version_)) return;
  }
  TakeParticipants();  // none while waiting; the queue becomes the round
  const std::vector<std::string> starting = TakeQueue();
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
    Member& m = At(id);
    const bool holds = HoldsAgreedModel(m);
    if (!holds && start_with_holders == nullptr) {
      start_with_holders = Share(RoundStartMessage(/*with_holders=*/true));
    }
    m.state = MemberState::kTraining;
    ResetRoundFlags(m);
    m.exchange_seconds = 0;
    m.training_since = round_started_at_;
    AddParticipant(id);
    out->push_back({id, holds ? start : start_with_holders});
  }
  UpdateReadyDeadline(round_started_at_);
  SHOAL_LOG(INFO) << "round " << round_ << " started with " << participants_.size()
                  << " participants: " << absl::StrJoin(participants_, ",");
}

// --------------------------------------------------------- Ready and plan

absl::Status RoundEngine::ReportReady(const shoal::v1::ReportReadyRequest& request,
                                      Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  auto found = FindParticipant(request.worker_id(), request.round(), "ready");
  if (!found.ok()) return found.status();
  Member* member = *found;
  if (phase_ != shoal::v1::TRAINING) {
    if (member->ready) return absl::OkStatus();  // retried call
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round_, " is no longer accepting ready reports"));
  }
  if (request.total_elements() == 0) {
    return absl::InvalidArgumentError("total_elements must be positive");
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
  MarkStatusChanged();
  const absl::Time now = clock_->Now();
  member->last_seen = now;
  // A retried report is measured once; a fold did not train in this round,
  // nor did work carried across a failover (trained under the old leader),
  // so neither says anything of the worker's speed.
  if (!member->ready && !fold.has_value() && member->carried_round != round_) {
    AddSample(member->ready_times, now - member->training_since, SampleWindow());
  }
  if (fold.has_value()) {
    member->fold_round = round_;
    member->fold_staleness = fold->staleness;
    member->fold_weight = fold->weight;
    member->fold_train_seconds = request.folded_train_seconds();
  } else {
    member->fold_round = 0;
  }
  UpdateFlags(*member, [](Member& m) { m.ready = true; });
  member->state = MemberState::kReady;
  member->train_loss = request.train_loss();
  any_ready_ = true;
  if (!first_ready_.has_value()) {
    first_ready_ = now - round_started_at_;
    UpdateReadyDeadline(now);
  }
  MaybeSendPlan(out);
  return absl::OkStatus();
}

void RoundEngine::MaybeSendPlan(Directives* out) {
  if (phase_ != shoal::v1::TRAINING || participants_.empty()) return;
  if (ready_count_ < participants_.size()) return;
  phase_ = shoal::v1::SHARING;
  SendPlan(out);
}

void RoundEngine::SendPlan(Directives* out) {
  ++attempt_;
  connection_retries_ = 0;
  sharing_started_ = false;
  deadline_ = clock_->Now() + options_.connection_timeout;
  std::vector<bool> outbound(participants_.size());
  for (size_t k = 0; k < participants_.size(); ++k)
    outbound[k] = At(participants_[k]).outbound_only;
  const std::vector<SliceRange> slices = PlanSlicesAmong(total_elements_, outbound);
  // A new version whenever the list (ids, addresses, outbound-only, order)
  // changed.
  bool same_list = plan_list_.size() == participants_.size() && plan_list_outbound_ == outbound;
  for (size_t k = 0; same_list && k < participants_.size(); ++k) {
    const Member& m = At(participants_[k]);
    same_list = plan_list_[k].first == m.id && plan_list_[k].second == m.address;
  }
  if (!same_list) {
    ++plan_list_version_;
    plan_list_.clear();
    plan_list_.reserve(participants_.size());
    for (const std::string& id : participants_) plan_list_.emplace_back(id, At(id).address);
    plan_list_outbound_ = outbound;
  }
  CoordinatorMessage msg;
  shoal::v1::RoundPlan* plan = msg.mutable_round_plan();
  plan->set_round(round_);
  plan->set_total_elements(total_elements_);
  plan->set_attempt(attempt_);
  plan->set_participants_version(plan_list_version_);
  size_t stages = 0;
  // A participant behind NAT cannot serve a stage's copies: such rounds
  // stay flat (docs/SUPERNODES.md, "NAT").
  const bool any_outbound = std::find(outbound.begin(), outbound.end(), true) != outbound.end();
  if (options_.config.topology().hierarchy() && !any_outbound) {
    // The stages name participants by plan index, so they travel with the
    // compact plan too (a few bytes per participant).
    std::vector<HierarchyParticipant> hp;
    hp.reserve(participants_.size());
    for (const std::string& id : participants_) hp.push_back({id, At(id).zone});
    // The elected supernodes lead their zones (a head that is not a
    // candidate of this round, e.g. it sits the round out, gets the
    // builder's default).
    if (election_stale_) Reelect(ElectionTrigger::kMembership);
    ZoneHeads heads;
    for (const ZoneElection& z : election_.zones) {
      if (!z.supernode.empty()) heads[z.path] = z.supernode;
    }
    HierarchyPlan h = BuildHierarchyPlan(hp, heads);
    stages = static_cast<size_t>(h.hierarchy.stages_size());
    if (stages > 0) *plan->mutable_hierarchy() = std::move(h.hierarchy);
  }
  CoordinatorMessage compact = msg;  // the same plan without the list
  plan->mutable_slices()->Reserve(static_cast<int>(participants_.size()));
  for (size_t k = 0; k < participants_.size(); ++k) {
    Member& m = At(participants_[k]);
    m.state = MemberState::kSharing;
    if (m.done && m.model_round == round_) {
      // A report of an earlier attempt: that model is discarded.
      m.model_round = last_completed_round_;
      m.model_hash = agreed_hash_;
    }
    UpdateFlags(m, [](Member& x) {
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
    Member& m = At(id);
    out->push_back({id, m.plan_list_known == plan_list_version_ ? small : full});
    m.plan_list_known = plan_list_version_;
  }
  SHOAL_LOG(INFO) << "round " << round_ << " plan attempt " << attempt_ << ": "
                  << participants_.size() << " participants, " << total_elements_ << " elements"
                  << (stages > 0 ? absl::StrCat(", ", stages, " hierarchical stages") : "");
}

// ------------------------------------------------------ Connection barrier

absl::Status RoundEngine::ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request,
                                           Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  auto found = FindParticipant(request.worker_id(), request.round(), "connections ready");
  if (!found.ok()) return found.status();
  Member* member = *found;
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
  MarkStatusChanged();
  member->last_seen = clock_->Now();
  UpdateFlags(*member, [&request](Member& m) {
    m.connections_ok = true;
    m.unreachable.assign(request.unreachable().begin(), request.unreachable().end());
  });
  if (!member->unreachable.empty()) {
    SHOAL_LOG(WARNING) << "round " << round_ << ": " << member->id << " cannot reach "
                       << absl::StrJoin(member->unreachable, ",");
  }
  MaybeStartSharing(out);
  return absl::OkStatus();
}

FailingPeers RoundEngine::ComputeFailingPeers() const {
  std::vector<PeerReport> reports;
  reports.reserve(participants_.size());
  for (const std::string& id : participants_) {
    const Member& m = At(id);
    reports.push_back({id, m.connections_ok, m.unreachable});
  }
  return FindFailingPeers(reports);
}

void RoundEngine::MaybeStartSharing(Directives* out) {
  if (phase_ != shoal::v1::SHARING || sharing_started_) return;
  ApplyConnectionBarrier(ConnectionEvent::kReport, out);
}

void RoundEngine::ApplyConnectionBarrier(ConnectionEvent event, Directives* out) {
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

void RoundEngine::RetryConnections(const std::string& reason, Directives* out) {
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
    UpdateFlags(At(id), [](Member& m) {
      m.connections_ok = false;
      m.unreachable.clear();
    });
    out->push_back({id, shared});
  }
}

void RoundEngine::EvictFailingPeers(const std::string& reason, Directives* out) {
  const FailingPeers failing = ComputeFailingPeers();
  SHOAL_LOG(WARNING) << "round " << round_ << ": evicting " << absl::StrJoin(failing.failing, ",")
                     << " (" << failing.reason << ")";
  for (const std::string& id : failing.failing) {
    CoordinatorMessage msg;
    msg.mutable_connection_fail()->set_round(round_);
    msg.mutable_connection_fail()->set_reason(reason);
    out->push_back({id, Share(std::move(msg))});
    Depart(id, MemberState::kEvicted, reason, out);
  }
  if (participants_.empty()) {
    AbortRound("no participant left after connection failures", out);
    return;
  }
  SendPlan(out);  // the rest go on with a recomputed plan
}

// ------------------------------------------------------ Sharing and votes

absl::Status RoundEngine::ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request,
                                          Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  auto found = FindActive(request.worker_id());
  if (!found.ok()) return found.status();
  Member* member = *found;
  if (request.round() != round_ || phase_ != shoal::v1::SHARING || !sharing_started_) {
    if (request.round() == last_completed_round_ && member->model_round == request.round()) {
      return absl::OkStatus();  // retried call for a round that completed
    }
    return absl::FailedPreconditionError(absl::StrCat("round ", request.round(),
                                                      " is not sharing (run at round ", round_,
                                                      ", ", shoal::v1::Phase_Name(phase_), ")"));
  }
  if (!IsParticipant(request.worker_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not a participant of round ", round_));
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
  MarkStatusChanged();
  member->last_seen = clock_->Now();
  UpdateFlags(*member, [](Member& m) { m.done = true; });
  member->model_hash = request.model_hash();
  member->model_round = request.round();
  member->exchange_seconds = request.exchange_seconds();
  member->bytes_received = request.bytes_received();
  member->bytes_sent = request.bytes_sent();
  member->compression_ratio = request.compression_ratio();
  member->wire_round = request.round();
  // What the supernode election uses; 0 = not measured (keeps the last).
  if (request.step_seconds() > 0) member->step_seconds = request.step_seconds();
  if (request.bandwidth_bytes_per_second() > 0) {
    member->bandwidth_bps = request.bandwidth_bytes_per_second();
  }
  if (request.train_seconds() > 0) {
    AddSample(member->train_seconds, request.train_seconds(), SampleWindow());
  }
  if (request.metrics().evaluated()) {
    member->metrics = request.metrics();
    member->metrics_round = request.round();
  }
  MaybeCompleteRound(out);
  return absl::OkStatus();
}

void RoundEngine::MaybeCompleteRound(Directives* out) {
  if (phase_ != shoal::v1::SHARING || !sharing_started_ || participants_.empty()) return;
  if (done_count_ < participants_.size()) return;
  HashVote vote;
  {
    std::vector<HashReport> reports;
    reports.reserve(participants_.size());
    for (const std::string& id : participants_) reports.push_back({id, At(id).model_hash});
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
                     << At(id).model_hash.substr(0, 12) << ", majority has " << hash.substr(0, 12);
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(
        absl::StrCat("model hash mismatch in round ", round_));
    out->push_back({id, Share(std::move(msg))});
    Depart(id, MemberState::kEvicted, absl::StrCat("model hash mismatch in round ", round_), out);
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
    Member& m = At(id);
    loss += m.train_loss;
    exchange += m.exchange_seconds;
    if (m.metrics_round == round_ && !summary.evaluated()) {
      summary.set_evaluated(true);
      summary.set_test_accuracy(m.metrics.test_accuracy());
      summary.set_test_loss(m.metrics.test_loss());
    }
    m.rounds_completed++;
    m.missed_in_row = 0;
    m.deadline_seconds = ready_deadline_seconds;
    if (m.fold_round == round_) {
      ++m.folded_updates;
      m.last_fold_round = round_;
      m.last_fold_staleness = m.fold_staleness;
      m.last_fold_weight = m.fold_weight;
      m.last_fold_train_seconds = m.fold_train_seconds;
      m.fold_round = 0;
    }
    m.state = MemberState::kWaiting;
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
  MarkRecordChanged();
  SHOAL_LOG(INFO) << "round " << round_ << " complete: participants=" << participants_.size()
                  << " hash=" << hash.substr(0, 16) << " seconds=" << summary.seconds();
  // The round's measurements are in: the one evaluation per round that
  // may move a supernode (after several rounds of a clear advantage).
  Reelect(ElectionTrigger::kMeasurements);

  CoordinatorMessage done;
  done.mutable_round_complete()->set_round(round_);
  done.mutable_round_complete()->set_model_hash(hash);
  const SharedMessage shared_done = Share(std::move(done));
  for (const std::string& id : participants_) out->push_back({id, shared_done});

  const uint64_t limit = options_.config.sync().rounds();
  const bool last = limit > 0 && last_completed_round_ >= limit;
  const uint32_t every = options_.config.checkpoints().every();
  if (!options_.config.checkpoints().store().empty() && every > 0 &&
      (last_completed_round_ % every == 0 || last)) {
    checkpoint_tried_.clear();
    AssignCheckpoint(last_completed_round_, out);
  }
  if (last) {
    Finish(absl::StrCat("completed ", limit, " rounds"), out);
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

// ------------------------------------------------- Re-plans, aborts, end

void RoundEngine::Replan(const std::string& reason, Directives* out) {
  if (participants_.empty()) {
    AbortRound(reason, out);
    return;
  }
  SHOAL_LOG(WARNING) << "round " << round_ << ": " << reason << "; " << participants_.size()
                     << " survivors exchange again";
  SendPlan(out);
}

void RoundEngine::AbortRound(const std::string& reason, Directives* out) {
  SHOAL_LOG(WARNING) << "round " << round_ << " aborted: " << reason;
  CoordinatorMessage msg;
  msg.mutable_round_aborted()->set_round(round_);
  msg.mutable_round_aborted()->set_reason(reason);
  const SharedMessage shared = Share(std::move(msg));
  const std::vector<std::string> aborted = TakeParticipants();
  const std::vector<std::string> waiting = TakeQueue();
  for (const std::string& id : aborted) {
    out->push_back({id, shared});
    Member& m = At(id);
    m.state = MemberState::kWaiting;
    if (m.done && m.model_round == round_) {
      // It rolls back to the last agreed model.
      m.model_round = last_completed_round_;
      m.model_hash = agreed_hash_;
    }
    ResetRoundFlags(m);
    Enqueue(id);
  }
  for (const std::string& id : waiting) Enqueue(id);
  phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  MaybeStartRound(out);
}

void RoundEngine::Finish(const std::string& reason, Directives* out) {
  phase_ = shoal::v1::FINISHED;
  MarkRecordChanged();
  SHOAL_LOG(INFO) << "run " << options_.run_id << " finished: " << reason;
  CoordinatorMessage msg;
  msg.mutable_run_finished()->set_last_round(last_completed_round_);
  msg.mutable_run_finished()->set_reason(reason);
  const SharedMessage shared = Share(std::move(msg));
  for (auto& [id, m] : members_) {
    m.state = MemberState::kWaiting;
    out->push_back({id, shared});
  }
  TakeParticipants();
  TakeQueue();
}

// --------------------------------------------------------------- Deadlines

AdaptiveDeadlineOptions RoundEngine::AdaptiveOptions() const {
  AdaptiveDeadlineOptions o = options_.adaptive_deadline;
  o.round_timeout = options_.round_timeout;
  return o;
}

size_t RoundEngine::SampleWindow() const {
  return std::max<size_t>(5, options_.adaptive_deadline.after_rounds);
}

void RoundEngine::UpdateReadyDeadline(absl::Time now) {
  if (phase_ != shoal::v1::TRAINING) return;
  const AdaptiveDeadlineOptions adaptive = AdaptiveOptions();
  ReadyDeadlineInput in;
  in.round_started = round_started_at_;
  in.hard_deadline = hard_ready_deadline_;
  in.participants = participants_.size();
  in.first_ready = first_ready_;
  if (adaptive.enabled) {
    for (const std::string& id : participants_) {
      const Member& m = At(id);
      if (m.ready_times.size() < std::max<uint32_t>(1, adaptive.after_rounds)) continue;
      in.measured.push_back(MedianDuration({m.ready_times.begin(), m.ready_times.end()}));
    }
  }
  ReadyDeadlineDecision decision = DecideReadyDeadline(in, adaptive, now);
  if (decision.deadline != ready_deadline_.deadline || decision.reason != ready_deadline_.reason) {
    MarkStatusChanged();
    SHOAL_LOG(INFO) << "round " << round_ << ": ready deadline "
                    << absl::FormatDuration(decision.deadline - round_started_at_)
                    << " after the start: " << decision.reason;
  }
  ready_deadline_ = std::move(decision);
  deadline_ = ready_deadline_.deadline;
}

void RoundEngine::ApplyRoundDeadline(absl::Time now, Directives* out) {
  // Listing the late participants is O(N): only once the deadline passed.
  if (now < deadline_) return;
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
      const Member& m = At(id);
      if (in.stage == RoundStage::kTraining ? !m.ready : !m.done) in.late.push_back(id);
    }
  }
  const RoundDeadlineDecision deadline = DecideRoundDeadline(in, options_.round_timeout, now);
  using Action = RoundDeadlineDecision::Action;
  // Only the stages with a deadline act on it (a quiet tick leaves the status).
  if (deadline.action == Action::kNone) return;
  MarkStatusChanged();
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

}  // namespace shoal::coordinator
