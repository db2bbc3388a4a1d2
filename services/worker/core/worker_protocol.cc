#include "services/worker/core/worker_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/worker/core/sample_order.h"

namespace shoal::worker {

const char* ActionName(Action::Kind kind) {
  switch (kind) {
    case Action::kJoin:
      return "join";
    case Action::kOpenSession:
      return "open-session";
    case Action::kJoinRound:
      return "join-round";
    case Action::kCatchUp:
      return "catch-up";
    case Action::kTrain:
      return "train";
    case Action::kReportReady:
      return "report-ready";
    case Action::kContributeAgain:
      return "contribute-again";
    case Action::kServePlan:
      return "serve-plan";
    case Action::kProbe:
      return "probe";
    case Action::kExchange:
      return "exchange";
    case Action::kHoldPending:
      return "hold-pending";
    case Action::kCommit:
      return "commit";
    case Action::kVoid:
      return "void";
    case Action::kDropWork:
      return "drop-work";
    case Action::kKeepLateWork:
      return "keep-late-work";
    case Action::kFoldLateWork:
      return "fold-late-work";
    case Action::kDropLateWork:
      return "drop-late-work";
    case Action::kReportDone:
      return "report-done";
    case Action::kUpload:
      return "upload";
    case Action::kRejoin:
      return "rejoin";
    case Action::kLeave:
      return "leave";
    case Action::kExit:
      return "exit";
    case Action::kAudit:
      return "audit";
  }
  return "?";
}

namespace {

Action Make(Action::Kind kind, uint64_t round = 0) {
  Action a{kind};
  a.round = round;
  return a;
}

}  // namespace

WorkerProtocol::WorkerProtocol(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()) {}

void WorkerProtocol::SetInitialModel(const std::string& hash) {
  model_round_ = 0;
  model_hash_ = hash;
}

Actions WorkerProtocol::Start() {
  Action a = Make(Action::kJoin);
  shoal::v1::JoinRequest& request = a.join;
  request.set_peer_address(options_.advertise);
  request.set_name(options_.name);
  request.set_zone(options_.zone);
  request.set_outbound_only(options_.outbound_only);
  request.set_replay_fingerprint(options_.replay_fingerprint);
  request.set_previous_worker_id(worker_id_);
  // A pending round is not claimed: the coordinator may have voided it
  // (Settle learns which from the response).
  const uint64_t held_round = pending_ ? agreed_round_ : model_round_;
  request.set_model_round(held_round);
  if (held_round > 0) request.set_model_hash(pending_ ? agreed_hash_ : model_hash_);
  if (has_data_rank_) request.set_previous_data_rank(data_rank_);
  return {std::move(a)};
}

Actions WorkerProtocol::OnJoined(const shoal::v1::JoinResponse& joined) {
  if (has_config_ && joined.config().SerializeAsString() != config_.SerializeAsString()) {
    Action exit = Make(Action::kExit);
    exit.status =
        absl::FailedPreconditionError("the coordinator now runs a different configuration");
    return {std::move(exit)};
  }
  worker_id_ = joined.worker_id();
  config_ = joined.config();
  has_config_ = true;
  data_rank_ = joined.data_rank();
  has_data_rank_ = true;
  Actions out;
  // A run in progress: take its current model before anything else.
  Settle(joined.model_round(), joined.model_hash(), &out);
  if (carried_.round != 0 &&
      (carried_.round <= model_round_ || joined.model_round() != carried_.base_round ||
       joined.model_hash() != carried_.base_hash)) {
    DiscardCarried(absl::StrCat("the run's model is round ", joined.model_round()), &out);
  }
  // The session first: the coordinator removes a member that opens none
  // within one heartbeat lease, and pulling a model of gigabytes takes
  // longer than that. Its heartbeats report the pull's progress.
  out.push_back(Make(Action::kOpenSession));
  CatchUp(joined.model_round(), joined.model_hash(),
          {joined.holders().begin(), joined.holders().end()}, joined.checkpoint_id(),
          joined.checkpoint_round(), &out);
  // JoinRound(0): the earliest open round (the catch-up may take a while,
  // so joined.next_round() may be over by then).
  out.push_back(Make(Action::kJoinRound));
  return out;
}

bool WorkerProtocol::Interrupts(const shoal::v1::CoordinatorMessage& msg) {
  return msg.has_round_plan() || msg.has_round_aborted() || msg.has_round_missed() ||
         msg.has_connection_fail() || msg.has_leave_requested() || msg.has_run_finished();
}

Actions WorkerProtocol::OnDirective(const shoal::v1::CoordinatorMessage& msg) {
  if (leaving_) return {};
  Actions out;
  switch (msg.kind_case()) {
    case shoal::v1::CoordinatorMessage::kRoundStart:
      return OnRoundStart(msg.round_start());
    case shoal::v1::CoordinatorMessage::kRoundPlan:
      return OnRoundPlan(msg.round_plan());
    case shoal::v1::CoordinatorMessage::kRetryConnections:
      if (msg.retry_connections().round() == round_ && plan_.round() == round_ &&
          msg.retry_connections().attempt() == plan_.attempt()) {
        Action probe = Make(Action::kProbe, round_);
        probe.attempt = plan_.attempt();
        probe.retry = msg.retry_connections().retry();
        probe.plan = plan_;
        out.push_back(std::move(probe));
      }
      return out;
    case shoal::v1::CoordinatorMessage::kStartSharing:
      return OnStartSharing(msg.start_sharing());
    case shoal::v1::CoordinatorMessage::kCheckpointRequest:
      return OnCheckpointRequest(msg.checkpoint_request());
    case shoal::v1::CoordinatorMessage::kRoundComplete: {
      const auto& complete = msg.round_complete();
      Settle(complete.round(), complete.model_hash(), &out);
      if (complete.round() == model_round_ && complete.model_hash() != model_hash_) {
        SHOAL_LOG(ERROR) << "round " << complete.round() << " completed with hash "
                         << complete.model_hash() << ", this worker has " << model_hash_;
      }
      return out;
    }
    case shoal::v1::CoordinatorMessage::kRoundAborted:
      if (msg.round_aborted().round() == round_) {
        // Also when this worker's exchange had ended: everyone goes back.
        Void("round aborted", &out);
        if (round_ > model_round_) {
          DropRound(absl::StrCat("round aborted: ", msg.round_aborted().reason()), &out);
        }
      }
      return out;
    case shoal::v1::CoordinatorMessage::kRoundMissed:
      SHOAL_LOG(WARNING) << "sat out round " << msg.round_missed().round() << ": "
                         << msg.round_missed().reason();
      if (msg.round_missed().round() == round_) {
        Void("sat the round out", &out);
        if (round_ > model_round_) DropRound("sat the round out", &out);
      }
      return out;
    case shoal::v1::CoordinatorMessage::kConnectionFail: {
      SHOAL_LOG(ERROR) << "removed from the run in round " << msg.connection_fail().round() << ": "
                       << msg.connection_fail().reason() << ". Check that peers can reach this "
                       << "worker at " << options_.advertise
                       << " (--listen / --advertise) and that it can reach them.";
      Action exit = Make(Action::kExit);
      exit.status = absl::FailedPreconditionError(
          absl::StrCat("connection failure: ", msg.connection_fail().reason()));
      return {std::move(exit)};
    }
    case shoal::v1::CoordinatorMessage::kAuditRequest: {
      Action audit = Make(Action::kAudit, msg.audit_request().round());
      audit.audit = msg.audit_request();
      return {std::move(audit)};
    }
    case shoal::v1::CoordinatorMessage::kLeaveRequested: {
      SHOAL_LOG(ERROR) << "the coordinator asked this worker to leave: "
                       << msg.leave_requested().reason();
      Action exit = Make(Action::kExit);
      exit.status = absl::FailedPreconditionError(
          absl::StrCat("asked to leave: ", msg.leave_requested().reason()));
      return {std::move(exit)};
    }
    case shoal::v1::CoordinatorMessage::kRunFinished: {
      Action exit = Make(Action::kExit);
      if (msg.run_finished().failed()) {
        SHOAL_LOG(ERROR) << "the run stopped after round " << msg.run_finished().last_round()
                         << ": " << msg.run_finished().reason();
        exit.status = absl::FailedPreconditionError(
            absl::StrCat("the run stopped: ", msg.run_finished().reason()));
        return {std::move(exit)};
      }
      SHOAL_LOG(INFO) << "run finished after round " << msg.run_finished().last_round() << ": "
                      << msg.run_finished().reason();
      exit.status = absl::OkStatus();
      return {std::move(exit)};
    }
    default:
      return out;
  }
}

Actions WorkerProtocol::OnRoundStart(const shoal::v1::RoundStart& start) {
  Actions out;
  Settle(start.base_model_round(), start.base_model_hash(), &out);
  if (carried_.round != 0) {
    if (start.round() == carried_.round && start.base_model_round() == carried_.base_round &&
        start.base_model_hash() == carried_.base_hash && model_round_ == carried_.base_round &&
        !pending_) {
      // The round this worker trained before its session broke, reopened
      // from the same base (a new leader resuming after the round before):
      // its trained model is this round's contribution.
      round_ = start.round();
      round_base_ = start.base_model_round();
      round_base_hash_ = start.base_model_hash();
      contribution_round_ = 0;
      plan_.Clear();
      if (carried_.in_contribution) out.push_back(Make(Action::kContributeAgain, round_));
      trained_round_ = round_;
      carried_ = {};
      ++resumed_rounds_;
      SHOAL_LOG(INFO) << "round " << round_ << ": reporting ready with the model trained before "
                      << "the coordinator session was lost (not trained again)";
      out.push_back(ReadyAction(/*resumed=*/true));
      return out;
    }
    DiscardCarried(
        absl::StrCat("round ", start.round(), " starts from round ", start.base_model_round()),
        &out);
  }
  round_ = start.round();
  round_base_ = start.base_model_round();
  round_base_hash_ = start.base_model_hash();
  round_samples_.assign(start.samples().begin(), start.samples().end());
  trained_round_ = 0;
  contribution_round_ = 0;
  plan_.Clear();
  train_started_ = clock_->Now();
  if (start.base_model_round() != model_round_ || start.base_model_hash() != model_hash_) {
    std::vector<std::string> holders(start.holders().begin(), start.holders().end());
    if (holders.empty()) {
      // The coordinator counted this worker as a holder (it sends the list
      // only to the others): ask the participants of the last plan instead;
      // the syncer skips those that do not hold the round.
      holders = plan_list_.Addresses();
    }
    if (CatchUp(start.base_model_round(), start.base_model_hash(), std::move(holders),
                start.checkpoint_id(), start.checkpoint_round(), &out)) {
      // The round's work starts once the catch-up has ended (OnCaughtUp).
      work_after_catch_up_ = round_;
      return out;
    }
  }
  StartWork(&out);
  return out;
}

void WorkerProtocol::StartWork(Actions* out) {
  if (late_.held && FoldLateWork(round_base_, out)) return;
  Action train = Make(Action::kTrain, round_);
  train.samples = round_samples_;
  if (config_.training().sample_ledger()) {
    trained_samples_ = round_samples_;
    trained_samples_round_ = round_;
  }
  out->push_back(std::move(train));
}

bool WorkerProtocol::FoldLateWork(uint64_t base_round, Actions* out) {
  // A base older than the update's: the run went back (a coordinator that
  // restarted without its record); the update belongs to another history.
  const bool older = base_round < late_.base_round;
  const uint64_t staleness = older ? 0 : base_round - late_.base_round;
  const double weight = older ? 0 : StalenessWeight(staleness, config_.sync().max_staleness());
  if (weight <= 0) {
    SHOAL_LOG(WARNING) << "late work of round " << late_.trained_round << " (base "
                       << late_.base_round << ") dropped: "
                       << (older ? absl::StrCat("the run is back at round ", base_round)
                                 : absl::StrCat("staleness ", staleness, " > --max_staleness=",
                                                config_.sync().max_staleness()));
    out->push_back(Make(Action::kDropLateWork, late_.trained_round));
    late_ = {};
    ++late_dropped_;
    return false;
  }
  late_.folded_into = round_;
  late_.staleness = staleness;
  late_.weight = weight;
  SHOAL_LOG(INFO) << "round " << round_ << ": folding in the late work of round "
                  << late_.trained_round << " (base " << late_.base_round << ", staleness "
                  << staleness << ", weight " << weight << ") instead of training";
  Action fold = Make(Action::kFoldLateWork, round_);
  fold.weight = weight;
  out->push_back(std::move(fold));
  // The training behind this contribution took place in the late round.
  train_seconds_ = late_.train_seconds;
  Action a = Make(Action::kReportReady, round_);
  a.ready.set_worker_id(worker_id_);
  a.ready.set_round(round_);
  a.ready.set_train_loss(train_loss_);
  a.ready.set_total_elements(total_elements_);
  a.ready.set_folded(true);
  a.ready.set_folded_base_round(late_.base_round);
  a.ready.set_folded_trained_round(late_.trained_round);
  a.ready.set_folded_weight(weight);
  a.ready.set_folded_train_seconds(late_.train_seconds);
  out->push_back(std::move(a));
  return true;
}

Actions WorkerProtocol::OnTrained(uint64_t round, double train_loss, uint64_t total_elements,
                                  const std::string& contribution_hash, double train_seconds) {
  if (round != round_) return {};
  train_loss_ = train_loss;
  total_elements_ = total_elements;
  contribution_hash_ = contribution_hash;
  train_seconds_ =
      train_seconds >= 0 ? train_seconds : absl::ToDoubleSeconds(clock_->Now() - train_started_);
  trained_round_ = round;
  return {ReadyAction(/*resumed=*/false)};
}

Action WorkerProtocol::ReadyAction(bool resumed) const {
  Action a = Make(Action::kReportReady, round_);
  a.ready.set_worker_id(worker_id_);
  a.ready.set_round(round_);
  a.ready.set_train_loss(train_loss_);
  a.ready.set_total_elements(total_elements_);
  // Work carried across a re-join may have trained other samples than a
  // new leader's ledger names: it is not offered for audit.
  if (!resumed) a.ready.set_contribution_hash(contribution_hash_);
  a.resumed = resumed;
  return a;
}

Actions WorkerProtocol::OnReadyReported(uint64_t round, const absl::Status& result) {
  if (result.ok() || round != round_) return {};
  if (base_reported_round_ == round) {
    // Nothing was trained: the session says what comes next.
    SHOAL_LOG(WARNING) << "round " << round << ": the report that the base cannot be loaded was "
                       << "not taken: " << result.message();
    return {};
  }
  if (absl::IsNotFound(result) || absl::IsUnavailable(result) || absl::IsDeadlineExceeded(result)) {
    // No coordinator took the report (it died, or this is a new leader that
    // does not know this worker yet): the session is lost too, and its end
    // re-joins carrying this work. Should the session live on, the round's
    // deadline settles it (RoundMissed).
    SHOAL_LOG(WARNING) << "ready for round " << round << " not delivered (" << result.message()
                       << "); keeping the trained model for the re-join";
    return {};
  }
  SHOAL_LOG(WARNING) << "ready for round " << round << " refused: " << result.message();
  // The session tells us what comes next.
  Actions out;
  const bool was_fold = late_.held && late_.folded_into == round_;
  if (!was_fold && config_.sync().fold_late_work() && absl::IsFailedPrecondition(result) &&
      round_ > model_round_) {
    // Too late for this round (the deadline passed, or the run moved on):
    // the update is kept for a later round.
    if (late_.held) {
      // Cannot happen (a round with late work held folds, it does not
      // train); the newer update replaces the older one.
      ++late_dropped_;
    }
    late_ = {};
    late_.held = true;
    late_.trained_round = round_;
    late_.base_round = model_round_;
    late_.train_seconds = train_seconds_;
    ++late_kept_;
    trained_round_ = 0;  // the work is the late update now
    out.push_back(Make(Action::kKeepLateWork, round_));
    contribution_round_ = 0;
    plan_.Clear();
    SHOAL_LOG(INFO) << "round " << round_ << ": late, its update (base round " << model_round_
                    << ") is kept to be folded into a later round";
    return out;
  }
  if (!was_fold && round_ > model_round_) ++late_dropped_;
  DropRound("ready refused", &out);
  return out;
}

Actions WorkerProtocol::OnRoundPlan(shoal::v1::RoundPlan plan) {
  if (absl::Status s = plan_list_.Expand(&plan); !s.ok()) {
    // Only a fresh session gets the list again.
    return Rejoin(s.ToString());
  }
  Actions out;
  if (pending_ && plan.round() == round_ && plan.attempt() > plan_.attempt() &&
      contribution_round_ == round_) {
    // This worker's exchange ended before a peer was lost, theirs did not:
    // the round is re-planned among the survivors and it exchanges again.
    Void(absl::StrCat("plan attempt ", plan.attempt(), " replaces attempt ", plan_.attempt()),
         &out);
  }
  if (plan.round() != round_ || round_ <= model_round_) {
    SHOAL_LOG(WARNING) << "ignoring the plan of round " << plan.round() << " (at round " << round_
                       << ")";
    return out;
  }
  if (contribution_round_ != round_) {
    // First plan of the round.
    contribution_round_ = round_;
  } else {
    // A participant was lost: exchange again from what the last attempt
    // left in the parameters.
    SHOAL_LOG(INFO) << "round " << round_ << ": new plan (attempt " << plan.attempt() << ", "
                    << plan.slices_size() << " participants)";
    out.push_back(Make(Action::kContributeAgain, round_));
  }
  plan_ = std::move(plan);
  Action serve = Make(Action::kServePlan, round_);
  serve.attempt = plan_.attempt();
  serve.plan = plan_;
  out.push_back(std::move(serve));
  Action probe = Make(Action::kProbe, round_);
  probe.attempt = plan_.attempt();
  probe.plan = plan_;
  out.push_back(std::move(probe));
  return out;
}

Actions WorkerProtocol::OnStartSharing(const shoal::v1::StartWeightSharing& start) {
  if (start.round() != round_ || start.attempt() != plan_.attempt() || plan_.round() != round_ ||
      round_ <= model_round_) {
    // Also a duplicate for a round whose exchange ended here (pending).
    SHOAL_LOG(WARNING) << "ignoring start of sharing for round " << start.round() << " attempt "
                       << start.attempt();
    return {};
  }
  exchange_started_ = clock_->Now();
  Action a = Make(Action::kExchange, round_);
  a.attempt = plan_.attempt();
  a.plan = plan_;
  return {std::move(a)};
}

Actions WorkerProtocol::OnExchanged(uint64_t round, uint32_t attempt, const absl::Status& result,
                                    const std::string& hash) {
  if (!result.ok()) {
    // Nothing is reported: a new plan or the round deadline decides what
    // comes next (the coordinator never waits forever).
    SHOAL_LOG(WARNING) << "exchange of round " << round << " attempt " << attempt
                       << " stopped: " << result;
    return {};
  }
  if (round != round_ || attempt != plan_.attempt() || round_ <= model_round_) return {};
  const double exchange_seconds = absl::ToDoubleSeconds(clock_->Now() - exchange_started_);
  Actions out;
  Action hold = Make(Action::kHoldPending, round);
  hold.hash = hash;
  out.push_back(std::move(hold));
  agreed_round_ = model_round_;
  agreed_hash_ = model_hash_;
  pending_ = true;
  model_round_ = round;
  model_hash_ = hash;
  averaged_round_ = round;

  Action done = Make(Action::kReportDone, round);
  done.attempt = attempt;
  done.hash = hash;
  const bool last = config_.sync().rounds() > 0 && round >= config_.sync().rounds();
  done.evaluate = round % std::max<uint32_t>(1, config_.training().eval_every()) == 0 || last;
  done.done.set_worker_id(worker_id_);
  done.done.set_round(round);
  done.done.set_attempt(attempt);
  done.done.set_model_hash(hash);
  done.done.set_exchange_seconds(exchange_seconds);
  done.done.set_train_seconds(train_seconds_);
  out.push_back(std::move(done));
  return out;
}

Actions WorkerProtocol::OnCheckpointRequest(const shoal::v1::CheckpointRequest& request) {
  Actions out;
  // Only agreed rounds are checkpointed (a takeover may name an older one).
  if (request.round() == model_round_) Settle(request.round(), request.model_hash(), &out);
  Action upload = Make(Action::kUpload, request.round());
  upload.checkpoint = request;
  if (model_round_ != request.round() || model_hash_ != request.model_hash()) {
    upload.reason = absl::StrCat("holds round ", model_round_, ", not ", request.round());
  }
  out.push_back(std::move(upload));
  return out;
}

Actions WorkerProtocol::OnCaughtUp(uint64_t round, const std::string& hash,
                                   const absl::Status& result) {
  if (result.ok()) {
    model_round_ = round;
    model_hash_ = hash;
    averaged_round_ = 0;
  } else {
    SHOAL_LOG(WARNING) << "catch-up to round " << round << " failed: " << result
                       << "; this worker holds round " << model_round_;
  }
  Actions out;
  if (work_after_catch_up_ != round_ || round_ == 0) return out;
  work_after_catch_up_ = 0;
  if (!result.ok()) {
    // Work from another model than the round's base would be a model
    // nobody else has (an encoded exchange applies changes to the base) or
    // drag the average back to an older model (raw fp32); when nobody can
    // load the base it would be another model under the run's round
    // numbers. So the worker sits the round out and says why: the
    // coordinator decides whether the run goes on, goes back to an older
    // checkpoint or stops (docs/CHECKPOINTS.md).
    const bool damaged = absl::IsDataLoss(result) && !catch_up_checkpoint_.empty();
    SHOAL_LOG(WARNING) << "round " << round_ << ": sitting out: cannot load the round's base "
                       << "(round " << round << ")"
                       << (damaged
                               ? absl::StrCat(": checkpoint ", catch_up_checkpoint_, " is damaged")
                               : std::string())
                       << "; this worker holds round " << model_round_;
    ++rounds_sat_out_for_base_;
    base_reported_round_ = round_;
    Action report = ReadyAction(/*resumed=*/false);
    report.ready.set_base_unavailable(std::string(result.message()));
    report.ready.set_base_checkpoint_damaged(damaged);
    out.push_back(std::move(report));
    return out;
  }
  StartWork(&out);
  return out;
}

Actions WorkerProtocol::OnSessionClosed(const absl::Status& why) {
  if (leaving_) return {};
  return Rejoin(why.ToString());
}

Actions WorkerProtocol::OnSessionOpenFailed(const absl::Status& why) {
  return Rejoin(why.ToString());
}

Actions WorkerProtocol::OnStopRequested(const std::string& reason) {
  if (leaving_) return {};
  leaving_ = true;
  SHOAL_LOG(INFO) << "leaving the run (shutdown requested)";
  Action leave = Make(Action::kLeave);
  leave.reason = reason;
  Action exit = Make(Action::kExit);
  exit.status = absl::OkStatus();
  return {std::move(leave), std::move(exit)};
}

Actions WorkerProtocol::Rejoin(const std::string& why) {
  SHOAL_LOG(WARNING) << "lost the coordinator session (" << why << "); re-joining";
  Actions out;
  Action rejoin = Make(Action::kRejoin);
  rejoin.reason = why;
  out.push_back(std::move(rejoin));
  CarryOrDrop(&out);
  Actions join = Start();
  out.insert(out.end(), join.begin(), join.end());
  return out;
}

void WorkerProtocol::CarryOrDrop(Actions* out) {
  if (carried_.round != 0 && carried_.round == round_) return;  // carried already
  const bool fold = late_.held && late_.folded_into == round_;
  const bool trained = round_ != 0 && trained_round_ == round_ && !fold &&
                       (round_ > model_round_ || (pending_ && model_round_ == round_));
  if (!trained) {
    DropRound("session lost", out);
    return;
  }
  carried_.round = round_;
  carried_.base_round = round_base_;
  carried_.base_hash = round_base_hash_;
  carried_.in_contribution = contribution_round_ == round_;
  contribution_round_ = 0;
  plan_.Clear();
  SHOAL_LOG(INFO) << "round " << round_ << ": keeping the model trained from round " << round_base_
                  << " for the re-join"
                  << (pending_ ? " (the average computed here is pending)" : "");
}

void WorkerProtocol::DiscardCarried(const std::string& why, Actions* out) {
  if (carried_.round == 0) return;
  if (carried_.round > model_round_) {
    Action a = Make(Action::kDropWork, carried_.round);
    a.reason = why;
    out->push_back(std::move(a));
  }
  SHOAL_LOG(INFO) << "the work of round " << carried_.round << " kept for the re-join is dropped ("
                  << why << ")";
  if (trained_round_ == carried_.round) trained_round_ = 0;
  if (trained_samples_round_ == carried_.round) trained_samples_round_ = 0;
  carried_ = {};
}

void WorkerProtocol::Settle(uint64_t agreed_round, const std::string& agreed_hash, Actions* out) {
  if (trained_samples_round_ != 0 && agreed_round == trained_samples_round_ &&
      agreed_round == averaged_round_ && agreed_round == model_round_ &&
      agreed_hash == model_hash_) {
    // The ledger's record of this worker: samples in an agreed round, by
    // whichever message brings the agreement first (RoundComplete, a
    // checkpoint request, the next RoundStart, or a re-join's reply when
    // the session broke before RoundComplete came).
    SHOAL_LOG(INFO) << "ledger: round " << agreed_round << " trained samples "
                    << FormatRanges(trained_samples_);
    ledger_recorded_round_ = agreed_round;
    trained_samples_round_ = 0;
  }
  if (!pending_) return;
  if ((agreed_round == model_round_ && agreed_hash == model_hash_) || agreed_round > model_round_) {
    // Agreed; or the run moved on without telling us this round's outcome,
    // and the catch-up that follows replaces the model anyway.
    Commit(out);
  } else {
    // Voided, or agreed with another hash (this worker missed the new
    // attempt): back to the last agreed model; a catch-up follows if needed.
    Void(absl::StrCat("the run's model is round ", agreed_round, " hash ",
                      agreed_hash.substr(0, 12)),
         out);
    DropRound("round not agreed", out);
  }
}

void WorkerProtocol::Commit(Actions* out) {
  if (!pending_) return;
  out->push_back(Make(Action::kCommit, model_round_));
  out->back().hash = model_hash_;
  pending_ = false;
  if (late_.held && late_.folded_into != 0 && model_round_ >= late_.folded_into) {
    // The round it was folded into is agreed: the late work is in the run.
    out->push_back(Make(Action::kDropLateWork, late_.trained_round));
    late_ = {};
    ++late_folded_;
  }
}

void WorkerProtocol::Void(const std::string& why, Actions* out) {
  if (!pending_) return;
  SHOAL_LOG(WARNING) << "the average of round " << model_round_ << " computed here is void (" << why
                     << "); back to the agreed model of round " << agreed_round_;
  Action a = Make(Action::kVoid, agreed_round_);
  a.hash = agreed_hash_;
  a.reason = why;
  out->push_back(std::move(a));
  model_round_ = agreed_round_;
  model_hash_ = agreed_hash_;
  averaged_round_ = 0;
  pending_ = false;
}

void WorkerProtocol::DropRound(const std::string& why, Actions* out) {
  if (carried_.round != 0 && carried_.round == round_) {
    // The round's trained model stays for the re-join (a voided pending
    // average is contributed again (kContributeAgain) or dropped later).
    contribution_round_ = 0;
    plan_.Clear();
    return;
  }
  trained_round_ = 0;
  const bool fold_round = late_.held && late_.folded_into == round_;
  if (fold_round) {
    // The round the late work was folded into is not agreed here: it
    // stays, for the next round (its staleness grows with the base).
    late_.folded_into = 0;
  }
  // kKeepLateWork already put the parameters back to the base.
  const bool kept_late = !fold_round && late_.held && late_.trained_round == round_;
  if (round_ > model_round_ && !kept_late) {
    Action a = Make(Action::kDropWork, round_);
    a.reason = why;
    out->push_back(std::move(a));
  }
  // Otherwise the parameters hold the model of model_round_ already
  // (agreed, or pending and settled later), possibly still read by a slower
  // peer.
  contribution_round_ = 0;
  plan_.Clear();
  if (kept_late) return;
  SHOAL_LOG(INFO) << "local work of round " << round_ << " dropped (" << why
                  << "); model back to the average of round " << model_round_;
}

bool WorkerProtocol::CatchUp(uint64_t round, const std::string& hash,
                             std::vector<std::string> holders, const std::string& checkpoint_id,
                             uint64_t checkpoint_round, Actions* out) {
  if ((round == model_round_ && hash == model_hash_) || hash.empty()) return false;
  const bool from_checkpoint = checkpoint_round == round && !checkpoint_id.empty();
  if (round < model_round_) {
    if (!from_checkpoint) {
      SHOAL_LOG(WARNING) << "the run is at round " << round << ", this worker holds round "
                         << model_round_ << "; keeping it";
      return false;
    }
    // The run went back to an older checkpoint (no member could load the
    // newer base): this worker's newer model is not the run's any more.
    SHOAL_LOG(WARNING) << "the run went back to checkpoint " << checkpoint_id << " of round "
                       << round << "; this worker holds round " << model_round_ << " and loads it";
  }
  holders.erase(std::remove(holders.begin(), holders.end(), options_.advertise), holders.end());
  Action a = Make(Action::kCatchUp, round);
  a.hash = hash;
  a.holders = std::move(holders);
  catch_up_checkpoint_.clear();
  if (from_checkpoint) {
    a.checkpoint_id = checkpoint_id;
    a.checkpoint_round = checkpoint_round;
    catch_up_checkpoint_ = checkpoint_id;
  }
  out->push_back(std::move(a));
  return true;
}

}  // namespace shoal::worker
