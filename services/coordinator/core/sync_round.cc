// SyncRound: the events of a member (join, session, heartbeat, departure),
// admission, the round's start, ready reports and audits, the plan and the
// connection barrier. The rest of the round (its completion, aborts,
// deadlines, status) is in sync_round_settle.cc.
#include "services/coordinator/core/sync_round.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/member_credentials.h"
#include "common/shard_plan.h"
#include "common/status_util.h"

namespace shoal::coordinator {

using shoal::v1::CoordinatorMessage;

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

SyncRound::Options SyncRound::OptionsOf(const EngineOptions& engine) {
  Options o;
  o.config = engine.config;
  o.run_id = engine.run_id;
  o.round_timeout = engine.round_timeout;
  o.connection_timeout = engine.connection_timeout;
  o.max_connection_retry = engine.max_connection_retry;
  o.max_missed_rounds = engine.max_missed_rounds;
  o.adaptive_deadline = engine.adaptive_deadline;
  o.audit_secret = engine.audit_secret;
  return o;
}

SyncRound::SyncRound(Options options, absl::Time started_at)
    : options_(std::move(options)),
      trust_(options_.config.trust(),
             options_.audit_secret.empty() ? RandomCredentialSecret() : options_.audit_secret) {
  if (options_.config.training().sample_ledger()) {
    ledger_.emplace(static_cast<uint64_t>(options_.config.training().local_steps()) *
                        options_.config.training().batch_size(),
                    options_.config.training().epochs());
  }
  // Versions of participant lists from different coordinator starts never
  // meet (a worker may keep a list across a restart): they start at the
  // start time in ms times 1000.
  plan_.list_version =
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(started_at))) * 1000;
}

RoundOutput SyncRound::Step(const RoundEvent& event, absl::Time now, const RoundWorld& world) {
  RoundOutput out;
  Ctx c{now, world, out};
  namespace e = round_event;
  std::visit(Overloaded{
                 [&](const e::CheckJoin& x) { OnCheckJoin(c, x); },
                 [&](const e::Joined& x) { OnJoined(c, x); },
                 [&](const e::Connected& x) {
                   // A new session has no participant list yet.
                   if (HasSeat(x.worker_id)) S(x.worker_id).plan_list_known = 0;
                 },
                 [&](const e::Heartbeat& x) { OnHeartbeat(c, x); },
                 [&](const e::JoinRound& x) { OnJoinRound(c, x); },
                 [&](const e::Ready& x) { OnReady(c, *x.request); },
                 [&](const e::ConnectionsReady& x) { OnConnectionsReady(c, *x.request); },
                 [&](const e::RoundDone& x) { OnRoundDone(c, *x.request); },
                 [&](const e::Audit& x) { OnAudit(c, *x.request); },
                 [&](const e::Tick& x) { OnTick(c, x); },
                 [&](const e::Hold& x) { OnHold(c, x.hold); },
                 [&](const e::Forget& x) { out.was_participant = Forget(x.worker_id); },
                 [&](const e::Departed& x) { OnDeparted(c, x); },
                 [&](const e::Finish&) { OnFinish(); },
                 [&](const e::Resume& x) { OnResume(c, *x.record); },
                 [&](const e::StartRound&) { MaybeStartRound(c); },
             },
             event);
  return out;
}

size_t SyncRound::SampleWindow() const {
  return std::max<size_t>(5, options_.adaptive_deadline.after_rounds);
}

void SyncRound::OnResume(Ctx& c, const shoal::v1::RunRecord& record) {
  last_completed_round_ = record.last_completed_round();
  agreed_hash_ = record.model_hash();
  round_ = last_completed_round_ + 1;
  if (ledger_.has_value()) ledger_->Resume(record.ledger());
  trust_.Resume(record, c.now);
  if (record.finished()) phase_ = shoal::v1::FINISHED;
  SHOAL_LOG(INFO) << "resuming run " << options_.run_id << " after round " << last_completed_round_
                  << " (next round " << round_ << ")";
}

void SyncRound::OnFinish() {
  phase_ = shoal::v1::FINISHED;
  TakeParticipants();
  TakeQueue();
  for (auto& [id, s] : seats_) s.state = MemberState::kWaiting;
}

void SyncRound::FinishRun(Ctx& c, const std::string& reason, bool failed) {
  OnFinish();
  c.Intend(round_intent::Finish{reason, failed});
}

// ------------------------------------------------- Participants and queue

void SyncRound::CountFlags(const Seat& s, int sign) {
  // Unsigned wrap-around makes -1 a decrement.
  const size_t d = static_cast<size_t>(sign);
  if (s.ready) roster_.ready += d;
  if (s.connections_ok) roster_.connected += d;
  if (s.connections_ok && !s.unreachable.empty()) roster_.unreachable += d;
  if (s.done) roster_.done += d;
}

void SyncRound::UpdateFlags(const std::string& worker_id, absl::FunctionRef<void(Seat&)> update) {
  Seat& s = S(worker_id);
  const bool counted = IsParticipant(worker_id);
  if (counted) CountFlags(s, -1);
  update(s);
  if (counted) CountFlags(s, +1);
}

void SyncRound::ResetRoundFlags(const std::string& worker_id) {
  UpdateFlags(worker_id, [](Seat& x) { x.ready = x.done = x.connections_ok = false; });
}

void SyncRound::AddParticipant(const std::string& worker_id) {
  if (!roster_.participant_set.insert(worker_id).second) return;
  roster_.participants.push_back(worker_id);
  CountFlags(S(worker_id), +1);
}

bool SyncRound::RemoveParticipant(const std::string& worker_id) {
  if (roster_.participant_set.erase(worker_id) == 0) return false;
  // Its work will not be in the round: its samples go back to the pool.
  if (ledger_.has_value()) ledger_->Lost(worker_id);
  trust_.LeaveRound(worker_id);
  // Removals are rare (misses, departures); the vector keeps join order.
  std::vector<std::string>& p = roster_.participants;
  p.erase(std::find(p.begin(), p.end(), worker_id));
  CountFlags(S(worker_id), -1);
  return true;
}

std::vector<std::string> SyncRound::TakeParticipants() {
  std::vector<std::string> taken = std::move(roster_.participants);
  roster_.participants.clear();
  roster_.participant_set.clear();
  roster_.ready = roster_.connected = roster_.unreachable = roster_.done = 0;
  return taken;
}

void SyncRound::Enqueue(const std::string& worker_id) {
  if (roster_.queued_set.insert(worker_id).second) roster_.queued.push_back(worker_id);
}

void SyncRound::Dequeue(const std::string& worker_id) {
  if (roster_.queued_set.erase(worker_id) == 0) return;
  roster_.queued.erase(std::find(roster_.queued.begin(), roster_.queued.end(), worker_id));
}

std::vector<std::string> SyncRound::TakeQueue() {
  std::vector<std::string> taken = std::move(roster_.queued);
  roster_.queued.clear();
  roster_.queued_set.clear();
  return taken;
}

bool SyncRound::ConsistentForTesting(const RoundWorld& world) const {
  size_t ready = 0, connected = 0, unreachable = 0, done = 0;
  for (const std::string& id : roster_.participants) {
    if (world.Find(id) == nullptr || !HasSeat(id)) return false;
    const Seat& s = S(id);
    ready += s.ready;
    connected += s.connections_ok;
    unreachable += s.connections_ok && !s.unreachable.empty();
    done += s.done;
  }
  if (roster_.participant_set.size() != roster_.participants.size() ||
      roster_.queued_set.size() != roster_.queued.size() ||
      seats_.size() != world.members().size()) {
    return false;
  }
  for (const auto& [id, m] : world.members()) {
    if (!HasSeat(id)) return false;
  }
  for (const std::string& id : roster_.participants) {
    if (!roster_.participant_set.contains(id)) return false;
  }
  for (const std::string& id : roster_.queued) {
    if (!roster_.queued_set.contains(id) || world.Find(id) == nullptr) return false;
  }
  return ready == roster_.ready && connected == roster_.connected &&
         unreachable == roster_.unreachable && done == roster_.done;
}

// ----------------------------------------------------------------- Members

absl::Status SyncRound::CheckRound(uint64_t round, const char* what) const {
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

absl::Status SyncRound::CheckParticipant(const std::string& worker_id, uint64_t round,
                                         const char* what) const {
  if (absl::Status s = CheckRound(round, what); !s.ok()) return s;
  if (!IsParticipant(worker_id)) {
    const std::string& missed = S(worker_id).missed_reason;
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " is not a participant of round ", round_,
                     missed.empty() ? "" : absl::StrCat(" (", missed, ")")));
  }
  return absl::OkStatus();
}

bool SyncRound::HoldsAgreedModel(const Seat& s) const {
  return s.model_round == last_completed_round_ && s.model_hash == agreed_hash_ &&
         !agreed_hash_.empty();
}

std::vector<std::string> SyncRound::Holders(const RoundWorld& world) const {
  std::vector<std::string> holders;
  for (const auto& [id, m] : world.members()) {
    auto it = seats_.find(id);
    if (it != seats_.end() && HoldsAgreedModel(it->second) && !m.outbound_only) {
      holders.push_back(m.address);
    }
  }
  return holders;
}

void SyncRound::OnCheckJoin(Ctx& c, const round_event::CheckJoin& e) {
  const shoal::v1::JoinRequest& request = *e.request;
  c.out.status = trust_.CheckJoin(request, c.now);
  if (!c.out.status.ok() || !ledger_.has_value()) return;
  // A worker's first join comes before its trainer exists (it needs the
  // run's config): it declares its training set with its model.
  if (request.train_samples() == 0 && !request.has_layout()) return;
  const uint64_t before = ledger_->dataset();
  c.out.status = ledger_->CheckDataset(request.train_samples());
  if (c.out.status.ok() && before == 0) c.out.record_changed = true;
}

void SyncRound::OnJoined(Ctx& c, const round_event::Joined& e) {
  const shoal::v1::JoinRequest& request = *e.request;
  Seat& s = seats_[e.worker_id];
  s.plan_list_known = 0;  // a new session has no participant list yet
  trust_.OnJoined(e.worker_id, request);
  s.model_round = request.model_round();
  s.model_hash = request.model_hash();
  if (request.model_round() == 0 && !request.initial_model_hash().empty()) {
    // A worker that declares its model (docs/PYTHON.md "Any model"): the
    // first initial model declared before round 1 starts is the run's; a
    // worker holding another one takes it from the holders (RoundStart).
    s.model_hash = request.initial_model_hash();
    if (last_completed_round_ == 0 && agreed_hash_.empty() && round_ == 1 &&
        phase_ == shoal::v1::WAITING_FOR_MEMBERS && roster_.participants.empty()) {
      agreed_hash_ = request.initial_model_hash();
      c.out.record_changed = true;
      SHOAL_LOG(INFO) << "the run's initial model is " << e.worker_id << "'s (hash "
                      << agreed_hash_.substr(0, 12) << ")";
    }
  }
  // After a restart, workers may hold a round the record had not saved yet
  // (the coordinator died between their reports and the write): adopt it.
  if (fresh_start_ && request.model_round() > last_completed_round_ &&
      !request.model_hash().empty() && phase_ == shoal::v1::WAITING_FOR_MEMBERS &&
      roster_.participants.empty()) {
    SHOAL_LOG(WARNING) << "worker " << e.worker_id << " holds round " << request.model_round()
                       << ", newer than the record's " << last_completed_round_
                       << "; continuing from it";
    last_completed_round_ = request.model_round();
    agreed_hash_ = request.model_hash();
    round_ = last_completed_round_ + 1;
    c.out.record_changed = true;
  }
}

void SyncRound::FillJoinResponse(const Member& m, const RoundWorld& world,
                                 shoal::v1::JoinResponse* r) const {
  r->set_next_round(NextOpenRound(phase_, round_, any_ready_));
  r->set_model_round(last_completed_round_);
  r->set_model_hash(agreed_hash_);
  for (const std::string& h : Holders(world)) {
    if (h != m.address) r->add_holders(h);
  }
}

bool SyncRound::Forget(const std::string& worker_id) {
  if (!HasSeat(worker_id)) return false;
  // Out of the round first: its flags leave the counters with it.
  const bool was_participant = RemoveParticipant(worker_id);
  trust_.Forget(worker_id);
  sizer_.Forget(worker_id);
  plan_.owned_fraction.erase(worker_id);
  Dequeue(worker_id);
  seats_.erase(worker_id);
  return was_participant;
}

bool SyncRound::Evict(Ctx& c, const std::string& worker_id, MemberState why,
                      const std::string& reason) {
  if (!HasSeat(worker_id)) return false;
  round_intent::Depart depart{worker_id, why, reason, {}};
  FillWorker(worker_id, &depart.shown);
  const bool was_participant = Forget(worker_id);
  c.out.status_changed = true;
  c.Intend(std::move(depart));
  return was_participant;
}

void SyncRound::RemoveMember(Ctx& c, const std::string& worker_id, MemberState why,
                             const std::string& reason) {
  const bool was_participant = Evict(c, worker_id, why, reason);
  OnDeparted(c, {worker_id, reason, was_participant});
}

void SyncRound::OnDeparted(Ctx& c, const round_event::Departed& e) {
  if (!e.was_participant) return;
  if (phase_ == shoal::v1::TRAINING) {
    if (roster_.participants.empty()) {
      phase_ = shoal::v1::WAITING_FOR_MEMBERS;
      MaybeStartRound(c);
    } else {
      // Before sharing the round goes on without the worker.
      MaybeSendPlan(c);
    }
  } else if (phase_ == shoal::v1::SHARING) {
    Replan(c, absl::StrCat("participant ", e.worker_id, " lost: ", e.reason));
  }
}

void SyncRound::OnJoinRound(Ctx& c, const round_event::JoinRound& e) {
  const std::string& worker_id = e.worker_id;
  AdmissionInput in;
  in.phase = phase_;
  in.round = round_;
  in.any_ready = any_ready_;
  in.requested = e.round;
  in.participant = IsParticipant(worker_id);
  in.queued = IsQueued(worker_id);
  in.carried = e.carried;
  const AdmissionDecision admission = DecideAdmission(in);
  using Action = AdmissionDecision::Action;
  if (admission.action == Action::kReject) {
    c.out.status = absl::FailedPreconditionError(admission.reason);
    return;
  }
  c.out.status_changed = true;
  c.out.admitted_round = admission.round;
  if (admission.action == Action::kAlreadyIn) return;  // a retried call
  c.out.touched = true;
  Seat& s = S(worker_id);
  s.carried_round = e.carried;
  switch (admission.action) {
    case Action::kQueueForThisRound:
      Enqueue(worker_id);
      SHOAL_LOG(INFO) << "member " << worker_id << " waits for round " << round_ << " ("
                      << roster_.queued.size() << "/" << options_.config.sync().min_participants()
                      << ")";
      MaybeStartRound(c);
      break;
    case Action::kJoinRunningRound: {
      ResetRoundFlags(worker_id);
      s.training_since = c.now;
      AddParticipant(worker_id);
      s.state = MemberState::kTraining;
      // With the ledger, its own samples, as for those that started the
      // round: without them it would train nothing and its base model
      // would count as its work.
      CoordinatorMessage mine = RoundStartMessage(c.world, !HoldsAgreedModel(s));
      if (ledger_.has_value()) {
        for (shoal::v1::SampleRange& range : ledger_->Assign(worker_id)) {
          *mine.mutable_round_start()->add_samples() = std::move(range);
        }
      }
      c.Send(worker_id, Share(std::move(mine)));
      SHOAL_LOG(INFO) << "member " << worker_id << " joins running round " << round_
                      << " participants=" << roster_.participants.size()
                      << (e.carried == round_ ? " (carries its trained work)" : "");
      break;
    }
    default:
      Enqueue(worker_id);
      SHOAL_LOG(INFO) << "member " << worker_id << ": " << admission.reason;
      break;
  }
}

void SyncRound::MissRound(Ctx& c, const std::string& worker_id, const std::string& reason,
                          bool adaptive) {
  Seat& s = S(worker_id);
  RemoveParticipant(worker_id);
  MissedRoundInput in;
  in.missed_before = s.missed_in_row;
  in.adaptive = adaptive;
  const Member* m = c.world.Find(worker_id);
  in.alive = m != nullptr && c.world.Alive(*m, c.now);
  const MissedRoundDecision missed = DecideMissedRound(in, options_.max_missed_rounds, reason);
  s.missed_in_row = missed.missed_in_row;
  s.fold_round = 0;
  s.missed_reason = absl::StrCat("round ", round_, ": ", reason);
  s.state = MemberState::kWaiting;
  ResetRoundFlags(worker_id);
  c.Intend(round_intent::Missed{worker_id, !missed.counts, ReadyDeadlineSeconds()});
  SHOAL_LOG(WARNING) << "worker " << worker_id << " sits out round " << round_ << ": " << reason
                     << " (" << s.missed_in_row << " in a row"
                     << (missed.counts ? "" : "; slow, does not count") << ")";
  if (missed.evict) {
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(missed.reason);
    c.Send(worker_id, Share(std::move(msg)));
    Penalize(c, worker_id, TrustEvent::kEvicted, "(missed rounds)", /*evicting=*/true);
    Evict(c, worker_id, MemberState::kEvicted, missed.reason);
    return;
  }
  CoordinatorMessage msg;
  msg.mutable_round_missed()->set_round(round_);
  msg.mutable_round_missed()->set_reason(reason);
  c.Send(worker_id, Share(std::move(msg)));
  Enqueue(worker_id);  // takes part again from the next round
}

// ------------------------------------------------------------------- Start

CoordinatorMessage SyncRound::RoundStartMessage(const RoundWorld& world, bool with_holders) const {
  CoordinatorMessage msg;
  auto* start = msg.mutable_round_start();
  start->set_round(round_);
  start->set_base_model_round(last_completed_round_);
  start->set_base_model_hash(agreed_hash_);
  if (with_holders) {
    for (const std::string& h : Holders(world)) start->add_holders(h);
  }
  start->set_checkpoint_id(world.checkpoint_id());
  start->set_checkpoint_round(world.checkpoint_round());
  return msg;
}

void SyncRound::OnHold(Ctx& c, bool hold) {
  if (held_ != hold) {
    SHOAL_LOG(INFO) << (hold ? "rounds held: no round starts until released" : "rounds released");
  }
  held_ = hold;
  // Also when it was not held: a start refused by before_round_start.
  if (!hold) MaybeStartRound(c);
}

void SyncRound::MaybeStartRound(Ctx& c) {
  if (held_) return;
  const RoundStartDecision decision = DecideRoundStart(phase_, round_, roster_.queued.size(),
                                                       options_.config.sync().min_participants());
  if (!decision.start) return;
  // A change made earlier in this step (the round that just completed) is
  // committed before the record is handed out (RoundWorld::MayStartRound).
  if (!c.world.MayStartRound(std::exchange(c.out.record_changed, false))) return;
  c.out.status_changed = true;
  TakeParticipants();  // none while waiting; the queue becomes the round
  const std::vector<std::string> starting = TakeQueue();
  trust_.StartRound(round_);
  phase_ = shoal::v1::TRAINING;
  any_ready_ = false;
  plan_.attempt = 0;
  plan_.connection_retries = 0;
  plan_.sharing_started = false;
  timing_.started_at = c.now;
  timing_.hard_ready_deadline = c.now + options_.round_timeout;
  timing_.first_ready.reset();
  timing_.deadline = timing_.hard_ready_deadline;
  // Two shared messages: the holders of the base model (O(N)) go only to
  // the workers that lack it.
  const SharedMessage start = Share(RoundStartMessage(c.world, /*with_holders=*/false));
  SharedMessage start_with_holders;
  for (const std::string& id : starting) {
    Seat& s = S(id);
    const bool holds = HoldsAgreedModel(s);
    if (!holds && start_with_holders == nullptr) {
      start_with_holders = Share(RoundStartMessage(c.world, /*with_holders=*/true));
    }
    s.state = MemberState::kTraining;
    ResetRoundFlags(id);
    s.training_since = c.now;
    AddParticipant(id);
    if (ledger_.has_value()) {
      // Each participant's own samples: one message each.
      CoordinatorMessage mine = *(holds ? start : start_with_holders);
      for (shoal::v1::SampleRange& range : ledger_->Assign(id)) {
        *mine.mutable_round_start()->add_samples() = std::move(range);
      }
      c.Send(id, Share(std::move(mine)));
      continue;
    }
    c.Send(id, holds ? start : start_with_holders);
  }
  DecideShares(c);
  UpdateReadyDeadline(c);
  SHOAL_LOG(INFO) << "round " << round_ << " started with " << roster_.participants.size()
                  << " participants: " << absl::StrJoin(roster_.participants, ",");
}

void SyncRound::DecideShares(Ctx& c) {
  // Measurements that come in during the round change the next round's
  // plan, never this one's: every attempt cuts by these shares.
  plan_.round_shares.clear();
  round_reads_.clear();
  round_reads_per_source_.clear();
  if (options_.config.exchange().slice_sizing() != "bandwidth") return;
  const std::vector<std::string>& participants = roster_.participants;
  std::vector<bool> outbound(participants.size());
  for (size_t k = 0; k < participants.size(); ++k) {
    const Member* m = c.world.Find(participants[k]);
    outbound[k] = m != nullptr && m->outbound_only;
  }
  const std::vector<uint32_t> shares = sizer_.Decide(participants, outbound);
  for (size_t k = 0; k < participants.size(); ++k) {
    plan_.round_shares[participants[k]] = shares[k];
  }
}

// --------------------------------------------------------- Ready and plan

absl::Status SyncRound::CheckReady(const shoal::v1::ReportReadyRequest& request,
                                   std::optional<FoldedReady>* fold) {
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
  if (!request.folded()) return absl::OkStatus();
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
  *fold = *checked;
  return absl::OkStatus();
}

void SyncRound::OnReady(Ctx& c, const shoal::v1::ReportReadyRequest& request) {
  const std::string& id = request.worker_id();
  c.out.status = CheckParticipant(id, request.round(), "ready");
  if (!c.out.status.ok()) return;
  Seat& s = S(id);
  if (phase_ != shoal::v1::TRAINING) {
    if (s.ready) return;  // retried call
    c.out.status = absl::FailedPreconditionError(
        absl::StrCat("round ", round_, " is no longer accepting ready reports"));
    return;
  }
  if (!request.base_unavailable().empty()) {
    BaseUnavailable(c, request);
    return;
  }
  std::optional<FoldedReady> fold;
  c.out.status = CheckReady(request, &fold);
  if (!c.out.status.ok()) return;
  c.out.status_changed = true;
  c.out.accepted = true;
  c.out.touched = true;
  // A retried report is measured once; a fold did not train in this round,
  // nor did work carried across a failover (trained under the old leader),
  // so neither says anything of the worker's speed.
  if (!s.ready && !fold.has_value() && s.carried_round != round_) {
    s.ready_times.push_back(c.now - s.training_since);
    while (s.ready_times.size() > SampleWindow()) s.ready_times.pop_front();
  }
  if (fold.has_value()) {
    s.fold_round = round_;
    s.fold_staleness = fold->staleness;
    s.fold_weight = fold->weight;
    s.fold_train_seconds = request.folded_train_seconds();
  } else {
    s.fold_round = 0;
  }
  UpdateFlags(id, [](Seat& x) { x.ready = true; });
  s.state = MemberState::kReady;
  if (trust_.audits_on()) {
    trust_.OnReady(
        id, request,
        ledger_.has_value() ? ledger_->InFlight(id) : std::vector<shoal::v1::SampleRange>());
  }
  any_ready_ = true;
  if (!timing_.first_ready.has_value()) {
    timing_.first_ready = c.now - timing_.started_at;
    UpdateReadyDeadline(c);
  }
  MaybeSendPlan(c);
}

void SyncRound::MaybeSendPlan(Ctx& c) {
  if (phase_ != shoal::v1::TRAINING || roster_.participants.empty()) return;
  if (roster_.ready < roster_.participants.size()) return;
  if (trust_.audits_on() && !AuditsSettled(c)) return;
  phase_ = shoal::v1::SHARING;
  SendPlan(c);
}

// ------------------------------------------------------------------ Audits

bool SyncRound::AuditsSettled(Ctx& c) {
  if (!trust_.assigned()) {
    for (RoundTrust::Assignment& a :
         trust_.Assign(last_completed_round_, agreed_hash_, roster_.participants)) {
      SHOAL_LOG(INFO) << "round " << round_ << ": " << a.auditor << " replays the work of "
                      << a.request.participant() << " (audit " << a.request.audit_id() << ")";
      CoordinatorMessage msg;
      *msg.mutable_audit_request() = std::move(a.request);
      c.Send(a.auditor, Share(std::move(msg)));
    }
    if (trust_.Pending()) {
      // A replay takes about as long as the training it replays.
      timing_.deadline = c.now + options_.round_timeout;
      c.out.status_changed = true;
    }
  }
  return !trust_.Pending();
}

void SyncRound::OnAudit(Ctx& c, const shoal::v1::ReportAuditRequest& request) {
  const std::string& id = request.worker_id();
  absl::StatusOr<RoundTrust::Verdict> verdict = trust_.OnReport(id, request);
  if (!verdict.ok()) {
    c.out.status = verdict.status();
    return;
  }
  c.out.status_changed = true;
  c.out.touched = true;
  using Kind = RoundTrust::Verdict::Kind;
  switch (verdict->kind) {
    case Kind::kPassed:
      SHOAL_LOG(INFO) << "round " << round_ << ": " << verdict->reason;
      Penalize(c, verdict->participant, TrustEvent::kAuditPassed, absl::StrCat("by ", id));
      break;
    case Kind::kDropped:
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << verdict->reason;
      break;
    case Kind::kSecondOpinion: {
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << verdict->reason;
      CoordinatorMessage msg;
      *msg.mutable_audit_request() = verdict->second.request;
      c.Send(verdict->second.auditor, Share(std::move(msg)));
      timing_.deadline = c.now + options_.round_timeout;
      return;
    }
    case Kind::kAuditorWrong:
      SHOAL_LOG(ERROR) << "round " << round_ << ": " << verdict->reason;
      Penalize(c, verdict->participant, TrustEvent::kAuditPassed, "on a second opinion");
      Penalize(c, verdict->auditor, TrustEvent::kAuditFailed,
               absl::StrCat("(its replay of ", verdict->participant, "'s work was wrong)"));
      break;
    case Kind::kFailed:
      SHOAL_LOG(ERROR) << "round " << round_ << ": worker " << verdict->participant << " "
                       << verdict->reason << "; its contribution leaves the round";
      if (IsParticipant(verdict->participant) && phase_ == shoal::v1::TRAINING) {
        // Its samples go back to the ledger's pool with it.
        MissRound(c, verdict->participant, verdict->reason);
      }
      Penalize(c, verdict->participant, TrustEvent::kAuditFailed, absl::StrCat("by ", id));
      break;
  }
  MaybeSendPlan(c);
}

void SyncRound::OnHeartbeat(Ctx& c, const round_event::Heartbeat& e) {
  const Member* reporter = c.world.Find(e.worker_id);
  for (const std::string& address : e.heartbeat->bad_chunks_from()) {
    for (const std::string& accused : c.world.AtAddress(address, reporter)) {
      std::string reporters;
      if (!trust_.OnBadChunks(e.worker_id, accused, &reporters)) continue;
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << accused << " sent bad chunks to "
                         << reporters;
      const std::string ban =
          trust_.Record(accused, TrustEvent::kBadChunks, absl::StrCat("to ", reporters));
      c.out.status_changed = true;
      if (ban.empty()) continue;
      const Member* banned = c.world.Find(accused);
      trust_.Ban(accused, banned == nullptr ? "" : banned->name, ban, c.now);
      c.out.record_changed = true;
      SHOAL_LOG(WARNING) << "worker " << accused << " banned: " << ban;
      bans_due_.push_back({accused, absl::StrCat("banned: ", ban)});
    }
  }
}

void SyncRound::Penalize(Ctx& c, const std::string& worker_id, TrustEvent event,
                         const std::string& detail, bool evicting) {
  const std::string ban = trust_.Record(worker_id, event, detail);
  if (ban.empty()) return;
  // The world may still list a member this step removed: only a seat
  // says it is in the round.
  const Member* m = HasSeat(worker_id) ? c.world.Find(worker_id) : nullptr;
  const std::string name = m == nullptr ? "" : m->name;
  trust_.Ban(worker_id, name, ban, c.now);
  c.out.record_changed = true;
  SHOAL_LOG(WARNING) << "worker " << worker_id
                     << (name.empty() ? "" : absl::StrCat(" (", name, ")")) << " banned: " << ban;
  if (evicting || m == nullptr) return;
  const std::string reason = absl::StrCat("banned: ", ban);
  CoordinatorMessage msg;
  msg.mutable_leave_requested()->set_reason(reason);
  c.Send(worker_id, Share(std::move(msg)));
  RemoveMember(c, worker_id, MemberState::kEvicted, reason);
}

size_t SyncRound::AddHierarchy(Ctx& c, const std::vector<bool>& outbound,
                               shoal::v1::RoundPlan* plan) {
  // A participant behind NAT cannot serve a stage's copies: such rounds
  // stay flat (docs/SUPERNODES.md, "NAT").
  const bool any_outbound = std::find(outbound.begin(), outbound.end(), true) != outbound.end();
  if (!options_.config.topology().hierarchy() || any_outbound) return 0;
  // The stages name participants by plan index, so they travel with the
  // compact plan too (a few bytes per participant).
  std::vector<HierarchyParticipant> hp;
  hp.reserve(roster_.participants.size());
  for (const std::string& id : roster_.participants) {
    const Member* m = c.world.Find(id);
    hp.push_back({id, m == nullptr ? std::string() : m->zone});
  }
  // The elected supernodes lead their zones (a head that is not a
  // candidate of this round, e.g. it sits the round out, gets the
  // builder's default).
  HierarchyPlan h = BuildHierarchyPlan(hp, c.world.Heads(round_));
  const size_t stages = static_cast<size_t>(h.hierarchy.stages_size());
  if (stages > 0) *plan->mutable_hierarchy() = std::move(h.hierarchy);
  return stages;
}

void SyncRound::SendPlan(Ctx& c) {
  const std::vector<std::string>& participants = roster_.participants;
  ++plan_.attempt;
  plan_.connection_retries = 0;
  plan_.sharing_started = false;
  timing_.deadline = c.now + options_.connection_timeout;
  c.out.status_changed = true;
  std::vector<const Member*> members(participants.size());
  std::vector<bool> outbound(participants.size());
  for (size_t k = 0; k < participants.size(); ++k) {
    members[k] = c.world.Find(participants[k]);
    outbound[k] = members[k] != nullptr && members[k]->outbound_only;
  }
  // Streaming fragments: the round averages its fragment only.
  const SliceRange fragment =
      FragmentOf(total_elements_, options_.config.exchange().fragments(), round_);
  // The shares decided at the round's start (all zero: even slices).
  std::vector<uint32_t> shares(participants.size(), 0);
  for (size_t k = 0; k < participants.size(); ++k) {
    auto it = plan_.round_shares.find(participants[k]);
    if (it != plan_.round_shares.end()) shares[k] = it->second;
  }
  const std::vector<SliceRange> slices = PlanSlicesWeighted(fragment, outbound, shares);
  // This attempt's reads are the ones that count.
  round_reads_.clear();
  round_reads_per_source_.clear();
  auto address = [&](size_t k) { return members[k] == nullptr ? "" : members[k]->address; };
  // A new version whenever the list (ids, addresses, outbound-only, shares,
  // order) changed.
  bool same_list = plan_.list.size() == participants.size() && plan_.list_outbound == outbound &&
                   plan_.list_shares == shares;
  for (size_t k = 0; same_list && k < participants.size(); ++k) {
    same_list = plan_.list[k].first == participants[k] && plan_.list[k].second == address(k);
  }
  if (!same_list) {
    ++plan_.list_version;
    plan_.list.clear();
    plan_.list.reserve(participants.size());
    for (size_t k = 0; k < participants.size(); ++k) {
      plan_.list.emplace_back(participants[k], address(k));
    }
    plan_.list_outbound = outbound;
    plan_.list_shares = shares;
  }
  CoordinatorMessage msg;
  shoal::v1::RoundPlan* plan = msg.mutable_round_plan();
  plan->set_round(round_);
  plan->set_total_elements(total_elements_);
  plan->set_attempt(plan_.attempt);
  plan->set_participants_version(plan_.list_version);
  if (fragment.end - fragment.begin != total_elements_) {
    plan->set_fragment_begin(fragment.begin);
    plan->set_fragment_end(fragment.end);
  }
  const size_t stages = AddHierarchy(c, outbound, plan);
  // What the status shows of the slices (a hierarchical round's groups
  // cut their own, even ones: nothing to show).
  plan_.owned_fraction.clear();
  for (size_t k = 0; stages == 0 && total_elements_ > 0 && k < participants.size(); ++k) {
    plan_.owned_fraction[participants[k]] =
        static_cast<double>(slices[k].end - slices[k].begin) /
        static_cast<double>(fragment.end - fragment.begin);
  }
  CoordinatorMessage compact = msg;  // the same plan without the list
  plan->mutable_slices()->Reserve(static_cast<int>(participants.size()));
  for (size_t k = 0; k < participants.size(); ++k) {
    const std::string& id = participants[k];
    Seat& s = S(id);
    s.state = MemberState::kSharing;
    if (s.done && s.model_round == round_) {
      // A report of an earlier attempt: that model is discarded.
      s.model_round = last_completed_round_;
      s.model_hash = agreed_hash_;
    }
    UpdateFlags(id, [](Seat& x) {
      x.connections_ok = x.done = false;
      x.unreachable.clear();
    });
    auto* slice = plan->add_slices();
    slice->set_worker_id(id);
    slice->set_peer_address(address(k));
    slice->set_begin(slices[k].begin);
    slice->set_end(slices[k].end);
    slice->set_outbound_only(outbound[k]);
    slice->set_share(shares[k]);
  }
  // The full plan names every participant (O(N) bytes): it goes, as one
  // shared copy, only to sessions that do not hold this list yet.
  const SharedMessage full = Share(std::move(msg));
  const SharedMessage small = Share(std::move(compact));
  for (const std::string& id : participants) {
    Seat& s = S(id);
    c.Send(id, s.plan_list_known == plan_.list_version ? small : full);
    s.plan_list_known = plan_.list_version;
  }
  SHOAL_LOG(INFO) << "round " << round_ << " plan attempt " << plan_.attempt << ": "
                  << participants.size() << " participants, " << total_elements_ << " elements"
                  << (stages > 0 ? absl::StrCat(", ", stages, " hierarchical stages") : "");
}

// ------------------------------------------------------ Connection barrier

void SyncRound::OnConnectionsReady(Ctx& c, const shoal::v1::ConnectionsReadyRequest& request) {
  const std::string& id = request.worker_id();
  c.out.status = CheckParticipant(id, request.round(), "connections ready");
  if (!c.out.status.ok()) return;
  if (phase_ != shoal::v1::SHARING || request.attempt() != plan_.attempt) {
    c.out.status = absl::FailedPreconditionError(absl::StrCat(
        "plan attempt ", request.attempt(), " is not current (round ", round_, " is at attempt ",
        plan_.attempt, phase_ == shoal::v1::SHARING ? "" : ", not sharing", ")"));
    return;
  }
  if (plan_.sharing_started) return;  // retried call
  for (const std::string& other : request.unreachable()) {
    if (!IsParticipant(other)) {
      c.out.status = absl::InvalidArgumentError(
          absl::StrCat("unreachable worker '", other, "' is not a participant of round ", round_));
      return;
    }
  }
  c.out.status_changed = true;
  c.out.accepted = true;
  c.out.touched = true;
  UpdateFlags(id, [&request](Seat& x) {
    x.connections_ok = true;
    x.unreachable.assign(request.unreachable().begin(), request.unreachable().end());
  });
  if (const Seat& s = S(id); !s.unreachable.empty()) {
    SHOAL_LOG(WARNING) << "round " << round_ << ": " << id << " cannot reach "
                       << absl::StrJoin(s.unreachable, ",");
  }
  MaybeStartSharing(c);
}

FailingPeers SyncRound::ComputeFailingPeers() const {
  std::vector<PeerReport> reports;
  reports.reserve(roster_.participants.size());
  for (const std::string& id : roster_.participants) {
    const Seat& s = S(id);
    reports.push_back({id, s.connections_ok, s.unreachable});
  }
  return FindFailingPeers(reports);
}

void SyncRound::MaybeStartSharing(Ctx& c) {
  if (phase_ != shoal::v1::SHARING || plan_.sharing_started) return;
  ApplyConnectionBarrier(c, ConnectionEvent::kReport);
}

void SyncRound::ApplyConnectionBarrier(Ctx& c, ConnectionEvent event) {
  ConnectionBarrierInput in;
  in.round = round_;
  in.participants = roster_.participants.size();
  in.reported = roster_.connected;
  in.reported_unreachable = roster_.unreachable;
  in.retries = plan_.connection_retries;
  const ConnectionBarrierDecision barrier =
      DecideConnectionBarrier(in, event, options_.max_connection_retry);
  switch (barrier.action) {
    case ConnectionBarrierDecision::Action::kWait:
      return;
    case ConnectionBarrierDecision::Action::kRetry:
      RetryConnections(c, barrier.reason);
      return;
    case ConnectionBarrierDecision::Action::kEvictFailing:
      EvictFailingPeers(c, barrier.reason);
      return;
    case ConnectionBarrierDecision::Action::kStartSharing:
      break;
  }
  plan_.sharing_started = true;
  timing_.deadline = c.now + options_.round_timeout;
  c.out.status_changed = true;
  CoordinatorMessage msg;
  msg.mutable_start_sharing()->set_round(round_);
  msg.mutable_start_sharing()->set_attempt(plan_.attempt);
  const SharedMessage shared = Share(std::move(msg));
  for (const std::string& id : roster_.participants) c.Send(id, shared);
  SHOAL_LOG(INFO) << "round " << round_ << ": all " << roster_.participants.size()
                  << " participants connected, sharing starts (attempt " << plan_.attempt << ")";
}

void SyncRound::RetryConnections(Ctx& c, const std::string& reason) {
  const FailingPeers failing = ComputeFailingPeers();
  ++plan_.connection_retries;
  timing_.deadline = c.now + options_.connection_timeout;
  c.out.status_changed = true;
  SHOAL_LOG(WARNING) << "round " << round_ << ": peers not connected ("
                     << absl::StrJoin(failing.failing, ",") << ": " << failing.reason << "), "
                     << reason;
  CoordinatorMessage msg;
  auto* retry = msg.mutable_retry_connections();
  retry->set_round(round_);
  retry->set_attempt(plan_.attempt);
  retry->set_retry(plan_.connection_retries);
  for (const std::string& id : failing.failing) retry->add_failing(id);
  const SharedMessage shared = Share(std::move(msg));
  for (const std::string& id : roster_.participants) {
    UpdateFlags(id, [](Seat& x) {
      x.connections_ok = false;
      x.unreachable.clear();
    });
    c.Send(id, shared);
  }
}

void SyncRound::EvictFailingPeers(Ctx& c, const std::string& reason) {
  const FailingPeers failing = ComputeFailingPeers();
  SHOAL_LOG(WARNING) << "round " << round_ << ": evicting " << absl::StrJoin(failing.failing, ",")
                     << " (" << failing.reason << ")";
  for (const std::string& id : failing.failing) {
    CoordinatorMessage msg;
    msg.mutable_connection_fail()->set_round(round_);
    msg.mutable_connection_fail()->set_reason(reason);
    c.Send(id, Share(std::move(msg)));
    Penalize(c, id, TrustEvent::kEvicted, "(unreachable)", /*evicting=*/true);
    Evict(c, id, MemberState::kEvicted, reason);
  }
  if (roster_.participants.empty()) {
    AbortRound(c, "no participant left after connection failures");
    return;
  }
  SendPlan(c);  // the rest go on with a recomputed plan
}

}  // namespace shoal::coordinator
