// SyncRound: how a round ends. The done reports and the hash vote, the
// completed round (its checkpoint, the next round), re-plans and aborts, a
// base nobody can load, the deadlines of each phase, and what the status
// and the record say of the rounds.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/coordinator/core/base_recovery.h"
#include "services/coordinator/core/sync_round.h"

namespace shoal::coordinator {

using shoal::v1::CoordinatorMessage;

// ------------------------------------------------------ Sharing and votes

absl::Status SyncRound::CheckRoundDone(const shoal::v1::ReportRoundDoneRequest& request) const {
  if (!IsParticipant(request.worker_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not a participant of round ", round_));
  }
  if (request.attempt() != 0 && request.attempt() != plan_.attempt) {
    return absl::FailedPreconditionError(absl::StrCat("plan attempt ", request.attempt(),
                                                      " is not current (round ", round_,
                                                      " is at attempt ", plan_.attempt, ")"));
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
  // One read per other participant at most (a bounded report).
  if (request.peer_reads_size() >= static_cast<int>(roster_.participants.size()) &&
      request.peer_reads_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer_reads has ", request.peer_reads_size(), " entries, the round has ",
                     roster_.participants.size(), " participants"));
  }
  for (const shoal::v1::PeerRead& r : request.peer_reads()) {
    if (!std::isfinite(r.seconds()) || r.seconds() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "peer_reads: seconds must be a finite number >= 0, got ", r.seconds()));
    }
  }
  return absl::OkStatus();
}

void SyncRound::OnRoundDone(Ctx& c, const shoal::v1::ReportRoundDoneRequest& request) {
  const std::string& id = request.worker_id();
  Seat& s = S(id);
  if (request.round() != round_ || phase_ != shoal::v1::SHARING || !plan_.sharing_started) {
    if (request.round() == last_completed_round_ && s.model_round == request.round()) {
      return;  // retried call for a round that completed
    }
    c.out.status = absl::FailedPreconditionError(
        absl::StrCat("round ", request.round(), " is not sharing (run at round ", round_, ", ",
                     shoal::v1::Phase_Name(phase_), ")"));
    return;
  }
  c.out.status = CheckRoundDone(request);
  if (!c.out.status.ok()) return;
  c.out.status_changed = true;
  c.out.accepted = true;
  c.out.touched = true;
  const bool again = s.done;
  UpdateFlags(id, [](Seat& x) { x.done = true; });
  s.model_hash = request.model_hash();
  s.model_round = request.round();
  // What the supernode election uses; 0 = not measured (keeps the last).
  c.Intend(round_intent::Measure{id, request.step_seconds(), request.bandwidth_bytes_per_second()});
  // What the slices of later rounds are sized by (core/slice_sizing.h);
  // a retried report of the same attempt is not counted twice. Kept only
  // when the run sizes by bandwidth, and at most kReadsPerSource readers
  // per member: O(N) per round, not O(N^2), however large the round.
  if (options_.config.exchange().slice_sizing() == "bandwidth" && !again) {
    for (const shoal::v1::PeerRead& r : request.peer_reads()) {
      if (!IsParticipant(r.worker_id())) continue;
      if (++round_reads_per_source_[r.worker_id()] > kReadsPerSource) continue;
      round_reads_.push_back({id, r.worker_id(), r.bytes(), r.seconds()});
    }
  }
  MaybeCompleteRound(c);
}

void SyncRound::MaybeCompleteRound(Ctx& c) {
  if (phase_ != shoal::v1::SHARING || !plan_.sharing_started || roster_.participants.empty()) {
    return;
  }
  if (roster_.done < roster_.participants.size()) return;
  HashVote vote;
  {
    std::vector<HashReport> reports;
    reports.reserve(roster_.participants.size());
    for (const std::string& id : roster_.participants) reports.push_back({id, S(id).model_hash});
    vote = DecideHashVote(reports);
  }  // the reports point into the participants, which the evictions below change
  if (vote.outcome == HashVote::Outcome::kNoMajority) {
    // Nobody can tell which copy is right, so everyone rolls back and the
    // round runs again.
    AbortRound(c, vote.reason);
    return;
  }
  const std::string hash = vote.hash;
  if (!vote.minority.empty()) SHOAL_LOG(ERROR) << "round " << round_ << ": " << vote.reason;
  for (const std::string& id : vote.minority) {
    SHOAL_LOG(ERROR) << "round " << round_ << ": worker " << id << " reported hash "
                     << S(id).model_hash.substr(0, 12) << ", majority has " << hash.substr(0, 12);
    Penalize(c, id, TrustEvent::kHashMinority, "", /*evicting=*/true);
    const std::string reason = absl::StrCat("model hash mismatch in round ", round_);
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(reason);
    c.Send(id, Share(std::move(msg)));
    Evict(c, id, MemberState::kEvicted, reason);
  }
  CompleteRound(c, hash);
}

void SyncRound::CompleteRound(Ctx& c, const std::string& hash) {
  round_intent::Completed completed;
  completed.round = round_;
  completed.participants = roster_.participants;
  completed.seconds = absl::ToDoubleSeconds(c.now - timing_.started_at);
  completed.model_hash = hash;
  completed.deadline_seconds = ReadyDeadlineSeconds();
  for (const std::string& id : roster_.participants) {
    Seat& s = S(id);
    if (ledger_.has_value()) ledger_->Trained(id);
    Penalize(c, id, TrustEvent::kRoundCompleted, "", /*evicting=*/true);
    s.missed_in_row = 0;
    if (s.fold_round == round_) {
      completed.folds.push_back({id, s.fold_staleness, s.fold_weight, s.fold_train_seconds});
      s.fold_round = 0;
    }
    s.state = MemberState::kWaiting;
  }
  sizer_.AddRound(round_reads_);
  round_reads_.clear();
  round_reads_per_source_.clear();
  const size_t participants = roster_.participants.size();
  const double seconds = completed.seconds;
  c.Intend(std::move(completed));
  last_completed_round_ = round_;
  agreed_hash_ = hash;
  fresh_start_ = false;
  c.out.record_changed = true;
  SHOAL_LOG(INFO) << "round " << round_ << " complete: participants=" << participants
                  << " hash=" << hash.substr(0, 16) << " seconds=" << seconds;
  // The round's measurements are in: the one evaluation per round that
  // may move a supernode (after several rounds of a clear advantage).
  c.Intend(round_intent::Reelect{round_});

  CoordinatorMessage done;
  done.mutable_round_complete()->set_round(round_);
  done.mutable_round_complete()->set_model_hash(hash);
  const SharedMessage shared_done = Share(std::move(done));
  for (const std::string& id : roster_.participants) c.Send(id, shared_done);

  const uint64_t limit = options_.config.sync().rounds();
  const bool epochs_done = ledger_.has_value() && ledger_->Finished();
  const bool last = (limit > 0 && last_completed_round_ >= limit) || epochs_done;
  if (c.world.CheckpointDue(last_completed_round_, last)) {
    AssignCheckpoint(c, last_completed_round_, /*first=*/true);
  }
  if (last) {
    FinishRun(c,
              epochs_done ? absl::StrCat("completed ", ledger_->epochs_done(), " epochs")
                          : absl::StrCat("completed ", limit, " rounds"),
              /*failed=*/false);
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
  MaybeStartRound(c);
}

// ------------------------------------------------- Re-plans and aborts

void SyncRound::Replan(Ctx& c, const std::string& reason) {
  if (roster_.participants.empty()) {
    AbortRound(c, reason);
    return;
  }
  SHOAL_LOG(WARNING) << "round " << round_ << ": " << reason << "; " << roster_.participants.size()
                     << " survivors exchange again";
  SendPlan(c);
}

void SyncRound::BaseUnavailable(Ctx& c, const shoal::v1::ReportReadyRequest& request) {
  const std::string& id = request.worker_id();
  BaseUnavailableInput in;
  in.worker_id = id;
  in.round = round_;
  in.base_round = last_completed_round_;
  for (const auto& [other, seat] : seats_) {
    if (other != id && HoldsAgreedModel(seat)) in.base_held = true;
  }
  in.checkpoint_id = c.world.checkpoint_id();
  in.checkpoint_round = c.world.checkpoint_round();
  in.why = request.base_unavailable();
  in.checkpoint_damaged = request.base_checkpoint_damaged();
  const BaseUnavailableDecision d = DecideBaseUnavailable(in, c.world.known_checkpoints());
  c.out.status_changed = true;
  switch (d.action) {
    case BaseUnavailableDecision::Action::kSitOut:
      MissRound(c, id, d.reason);
      if (roster_.participants.empty()) {
        AbortRound(c, "no participant could load the round's base");
      } else {
        MaybeSendPlan(c);
      }
      return;
    case BaseUnavailableDecision::Action::kGoBack:
      SHOAL_LOG(ERROR) << d.reason;
      base_fallback_ = d.reason;
      TakeBackRound(c, d.reason);
      c.Intend(round_intent::GoBack{d.to, in.checkpoint_damaged ? in.checkpoint_id : ""});
      last_completed_round_ = d.to.round();
      agreed_hash_ = d.to.model_hash();
      // The ledger as it was at that checkpoint: the rounds after it are
      // trained again, with their samples.
      if (ledger_.has_value()) ledger_->Resume(d.to.ledger());
      round_ = last_completed_round_ + 1;
      // Nobody holds the model of a round after it any more.
      for (auto& [other, seat] : seats_) {
        if (seat.model_round > last_completed_round_) seat.model_round = 0;
      }
      c.out.record_changed = true;
      // The next round names the checkpoint it went back to: it starts
      // once the planner has taken the GoBack.
      c.out.then = round_event::StartRound{};
      return;
    case BaseUnavailableDecision::Action::kStop:
      TakeBackRound(c, d.reason);
      FinishRun(c, d.reason, /*failed=*/true);
      return;
  }
}

void SyncRound::AbortRound(Ctx& c, const std::string& reason) {
  TakeBackRound(c, reason);
  MaybeStartRound(c);
}

void SyncRound::TakeBackRound(Ctx& c, const std::string& reason) {
  SHOAL_LOG(WARNING) << "round " << round_ << " aborted: " << reason;
  c.out.status_changed = true;
  CoordinatorMessage msg;
  msg.mutable_round_aborted()->set_round(round_);
  msg.mutable_round_aborted()->set_reason(reason);
  const SharedMessage shared = Share(std::move(msg));
  const std::vector<std::string> aborted = TakeParticipants();
  const std::vector<std::string> waiting = TakeQueue();
  for (const std::string& id : aborted) {
    if (ledger_.has_value()) ledger_->Lost(id);
    c.Send(id, shared);
    Seat& s = S(id);
    s.state = MemberState::kWaiting;
    if (s.done && s.model_round == round_) {
      // It rolls back to the last agreed model.
      s.model_round = last_completed_round_;
      s.model_hash = agreed_hash_;
    }
    ResetRoundFlags(id);
    Enqueue(id);
  }
  for (const std::string& id : waiting) Enqueue(id);
  phase_ = shoal::v1::WAITING_FOR_MEMBERS;
}

// ------------------------------------------------------------- Checkpoints

std::vector<CheckpointCandidate> SyncRound::CheckpointCandidates(uint64_t round,
                                                                 const RoundWorld& world) const {
  std::vector<CheckpointCandidate> candidates;
  candidates.reserve(seats_.size());
  for (const auto& [id, m] : world.members()) {
    auto it = seats_.find(id);
    if (it == seats_.end()) continue;  // removed in this step
    const Seat& s = it->second;
    candidates.push_back({id, s.model_round == round && s.model_hash == agreed_hash_});
  }
  return candidates;
}

void SyncRound::AssignCheckpoint(Ctx& c, uint64_t round, bool first) {
  round_intent::Checkpoint checkpoint;
  checkpoint.round = round;
  checkpoint.first = first;
  checkpoint.agreed_hash = agreed_hash_;
  checkpoint.candidates = CheckpointCandidates(round, c.world);
  if (first && ledger_.has_value()) checkpoint.ledger = ledger_->Durable();
  c.Intend(std::move(checkpoint));
}

// --------------------------------------------------------------- Deadlines

void SyncRound::OnTick(Ctx& c, const round_event::Tick& e) {
  for (const auto& [id, reason] : std::exchange(bans_due_, {})) {
    if (!HasSeat(id)) continue;
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(reason);
    c.Send(id, Share(std::move(msg)));
    RemoveMember(c, id, MemberState::kEvicted, reason);
  }
  if (e.stalled_upload > 0) AssignCheckpoint(c, e.stalled_upload, /*first=*/false);
  ApplyRoundDeadline(c);
}

AdaptiveDeadlineOptions SyncRound::AdaptiveOptions() const {
  AdaptiveDeadlineOptions o = options_.adaptive_deadline;
  o.round_timeout = options_.round_timeout;
  return o;
}

double SyncRound::ReadyDeadlineSeconds() const {
  if (timing_.ready_deadline.deadline == absl::InfiniteFuture() ||
      timing_.started_at == absl::InfinitePast()) {
    return 0;
  }
  return absl::ToDoubleSeconds(timing_.ready_deadline.deadline - timing_.started_at);
}

void SyncRound::UpdateReadyDeadline(Ctx& c) {
  if (phase_ != shoal::v1::TRAINING) return;
  const AdaptiveDeadlineOptions adaptive = AdaptiveOptions();
  ReadyDeadlineInput in;
  in.round_started = timing_.started_at;
  in.hard_deadline = timing_.hard_ready_deadline;
  in.participants = roster_.participants.size();
  in.first_ready = timing_.first_ready;
  if (adaptive.enabled) {
    for (const std::string& id : roster_.participants) {
      const Seat& s = S(id);
      if (s.ready_times.size() < std::max<uint32_t>(1, adaptive.after_rounds)) continue;
      in.measured.push_back(MedianDuration({s.ready_times.begin(), s.ready_times.end()}));
    }
  }
  ReadyDeadlineDecision decision = DecideReadyDeadline(in, adaptive, c.now);
  if (decision.deadline != timing_.ready_deadline.deadline ||
      decision.reason != timing_.ready_deadline.reason) {
    c.out.status_changed = true;
    SHOAL_LOG(INFO) << "round " << round_ << ": ready deadline "
                    << absl::FormatDuration(decision.deadline - timing_.started_at)
                    << " after the start: " << decision.reason;
  }
  timing_.ready_deadline = std::move(decision);
  timing_.deadline = timing_.ready_deadline.deadline;
}

void SyncRound::ApplyRoundDeadline(Ctx& c) {
  // Listing the late participants is O(N): only once the deadline passed.
  if (c.now < timing_.deadline) return;
  if (phase_ == shoal::v1::TRAINING && trust_.Pending() &&
      roster_.ready == roster_.participants.size()) {
    // The plan goes without the replays that did not come back.
    for (const RoundTrust::Verdict& v : trust_.DropPending("no report within --round_timeout")) {
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << v.reason;
    }
    c.out.status_changed = true;
    MaybeSendPlan(c);
    return;
  }
  RoundDeadlineInput in;
  in.stage = StageOf(phase_, plan_.sharing_started);
  in.deadline = timing_.deadline;
  in.participants = roster_.participants.size();
  if (in.stage == RoundStage::kTraining) {
    in.adaptive = timing_.ready_deadline.adaptive;
    in.adaptive_reason = timing_.ready_deadline.reason;
  }
  if (in.stage == RoundStage::kTraining || in.stage == RoundStage::kSharing) {
    for (const std::string& id : roster_.participants) {
      const Seat& s = S(id);
      if (in.stage == RoundStage::kTraining ? !s.ready : !s.done) in.late.push_back(id);
    }
  }
  const RoundDeadlineDecision deadline = DecideRoundDeadline(in, options_.round_timeout, c.now);
  // Only the stages with a deadline act on it (a quiet tick leaves the status).
  if (deadline.action == RoundDeadlineDecision::Action::kNone) return;
  c.out.status_changed = true;
  ApplyDeadlineDecision(c, in.stage, deadline);
}

void SyncRound::ApplyDeadlineDecision(Ctx& c, RoundStage stage,
                                      const RoundDeadlineDecision& deadline) {
  using Action = RoundDeadlineDecision::Action;
  switch (deadline.action) {
    case Action::kKeepWaiting:
      // Past --round_timeout it waits another round_timeout (as always);
      // past the adaptive deadline it waits up to --round_timeout.
      if (!deadline.adaptive) timing_.hard_ready_deadline = c.now + options_.round_timeout;
      UpdateReadyDeadline(c);
      SHOAL_LOG(WARNING) << "round " << round_ << ": " << deadline.reason;
      return;
    case Action::kConnectionBarrier:
      ApplyConnectionBarrier(c, ConnectionEvent::kDeadline);
      return;
    case Action::kAbort:
      AbortRound(c, deadline.reason);
      return;
    case Action::kSitOut:
      for (const std::string& id : deadline.sit_out) {
        if (!HasSeat(id)) continue;  // banned and removed by an earlier one
        MissRound(c, id, deadline.reason, deadline.adaptive);
        if (stage == RoundStage::kTraining) {
          Penalize(c, id, TrustEvent::kMissedDeadline, "");
        }
      }
      // Those ready go on to the plan; those done hold the complete average
      // (the others catch up later).
      if (stage == RoundStage::kTraining) {
        MaybeSendPlan(c);
      } else {
        MaybeCompleteRound(c);
      }
      return;
    case Action::kNone:
      return;
  }
}

// ------------------------------------------------------------------ Status

std::string SyncRound::PhaseDetail(const RoundWorld& world) const {
  const uint32_t min = std::max<uint32_t>(1, options_.config.sync().min_participants());
  const size_t participants = roster_.participants.size();
  switch (phase_) {
    case shoal::v1::WAITING_FOR_MEMBERS: {
      // Members join first and queue for a round once their model and data
      // are loaded: say both, so "0 of 3" with members present is clear.
      const size_t members = world.members().size();
      return absl::StrCat(roster_.queued.size(), " of ", min, " participants needed for round ",
                          round_, " are queued (", members, members == 1 ? " member" : " members",
                          " joined; a member queues once its model and data are loaded)");
    }
    case shoal::v1::TRAINING:
      if (trust_.Pending()) {
        return absl::StrCat(roster_.ready, "/", participants,
                            " participants ready; waiting for the round's audits (replays)");
      }
      return absl::StrCat(roster_.ready, "/", participants, " participants ready");
    case shoal::v1::SHARING:
      if (!plan_.sharing_started) {
        return absl::StrCat("connecting: ", roster_.connected, "/", participants,
                            " participants reached their peers (attempt ", plan_.attempt,
                            ", retry ", plan_.connection_retries, "/",
                            options_.max_connection_retry, ")");
      }
      return absl::StrCat(roster_.done, "/", participants, " participants done sharing (attempt ",
                          plan_.attempt, ")");
    case shoal::v1::FINISHED:
      return absl::StrCat("finished after round ", last_completed_round_);
    default:
      return "";
  }
}

void SyncRound::FillStatus(shoal::v1::RunStatus* s, absl::Time now, const RoundWorld& world) const {
  s->set_phase(phase_);
  s->set_round(round_);
  s->set_last_completed_round(last_completed_round_);
  for (const auto& id : roster_.participants) s->add_participants(id);
  s->set_model_hash(agreed_hash_);
  s->set_detail(PhaseDetail(world));
  s->set_connection_retries(plan_.connection_retries);
  s->set_attempt(phase_ == shoal::v1::SHARING ? plan_.attempt : 0);
  s->set_queued(roster_.queued.size());
  s->set_base_fallback(base_fallback_);
  if (ledger_.has_value()) *s->mutable_ledger() = ledger_->Status();
  trust_.FillStatus(s, now);
  if (timing_.ready_deadline.deadline != absl::InfiniteFuture() &&
      timing_.started_at != absl::InfinitePast() && !timing_.ready_deadline.reason.empty()) {
    s->set_ready_deadline_seconds(ReadyDeadlineSeconds());
    s->set_ready_deadline_reason(timing_.ready_deadline.reason);
    s->set_ready_deadline_adaptive(timing_.ready_deadline.adaptive);
  }
}

void SyncRound::FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const {
  auto it = seats_.find(worker_id);
  if (it == seats_.end()) return;
  const Seat& s = it->second;
  // The round's state of the member, unless it is catching up (the
  // membership's "syncing" says more).
  if (w->state() != "syncing") w->set_state(MemberStateName(s.state));
  w->set_model_hash(s.model_hash);
  w->set_model_round(s.model_round);
  w->set_rounds_missed(s.missed_in_row);
  w->set_missed_reason(s.missed_reason);
  if (!s.ready_times.empty()) {
    w->set_ready_seconds_median(
        absl::ToDoubleSeconds(MedianDuration({s.ready_times.begin(), s.ready_times.end()})));
  }
  // Overlapped rounds: once ready, a participant trains the next round
  // while this one is averaged.
  const bool ahead = options_.config.exchange().overlap() && s.ready;
  w->set_rounds_in_flight(IsParticipant(worker_id) ? (ahead ? 2 : 1) : 0);
  w->set_exchange_rate_bytes_per_second(sizer_.Rate(worker_id));
  if (auto f = plan_.owned_fraction.find(worker_id); f != plan_.owned_fraction.end()) {
    w->set_slice_share(f->second);
  }
  trust_.FillWorker(worker_id, w);
}

void SyncRound::FillRecord(shoal::v1::RunRecord* r, absl::Time now) const {
  r->set_last_completed_round(last_completed_round_);
  r->set_model_hash(agreed_hash_);
  if (ledger_.has_value()) *r->mutable_ledger() = ledger_->Durable();
  trust_.FillRecord(r, now);
}

}  // namespace shoal::coordinator
