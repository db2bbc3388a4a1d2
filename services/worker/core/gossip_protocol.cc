#include "services/worker/core/gossip_protocol.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace shoal::worker {

const char* GossipActionName(GossipAction::Kind kind) {
  switch (kind) {
    case GossipAction::kOpenSession:
      return "open-session";
    case GossipAction::kRejoin:
      return "rejoin";
    case GossipAction::kFetchNow:
      return "fetch-now";
    case GossipAction::kAdoptFetched:
      return "adopt-fetched";
    case GossipAction::kLoadCheckpoint:
      return "load-checkpoint";
    case GossipAction::kTrainStep:
      return "train-step";
    case GossipAction::kCollect:
      return "collect";
    case GossipAction::kInterpolate:
      return "interpolate";
    case GossipAction::kInterpolatePush:
      return "interpolate-push";
    case GossipAction::kEvaluate:
      return "evaluate";
    case GossipAction::kEvaluateConsensus:
      return "evaluate-consensus";
    case GossipAction::kPublish:
      return "publish";
    case GossipAction::kStartFetch:
      return "start-fetch";
    case GossipAction::kDropFetch:
      return "drop-fetch";
    case GossipAction::kStartUpload:
      return "start-upload";
    case GossipAction::kDrainUpload:
      return "drain-upload";
    case GossipAction::kUploadNow:
      return "upload-now";
    case GossipAction::kRefuseCheckpoint:
      return "refuse-checkpoint";
    case GossipAction::kFinalAverage:
      return "final-average";
    case GossipAction::kReport:
      return "report";
    case GossipAction::kFlushReport:
      return "flush-report";
    case GossipAction::kLeave:
      return "leave";
    case GossipAction::kExit:
      return "exit";
  }
  return "?";
}

namespace {

GossipAction Make(GossipAction::Kind kind) {
  GossipAction a;
  a.kind = kind;
  return a;
}

GossipAction Exit(absl::Status status) {
  GossipAction a = Make(GossipAction::kExit);
  a.status = std::move(status);
  return a;
}

}  // namespace

GossipProtocol::GossipProtocol(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()) {
  report_.set_gossip(true);
}

shoal::v1::JoinRequest GossipProtocol::JoinRequest() const {
  shoal::v1::JoinRequest request = NewJoinRequest(options_.identity);
  request.set_previous_worker_id(worker_id_);
  if (has_config_) request.set_previous_data_rank(data_rank_);
  return request;
}

GossipActions GossipProtocol::OnJoined(const shoal::v1::JoinResponse& joined) {
  if (has_config_ && joined.config().SerializeAsString() != config_.SerializeAsString()) {
    return {
        Exit(absl::FailedPreconditionError("the coordinator now runs a different configuration"))};
  }
  worker_id_ = joined.worker_id();
  data_rank_ = joined.data_rank();
  if (!has_config_) {
    config_ = joined.config();
    has_config_ = true;
    checkpoint_id_ = joined.checkpoint_id();
    // The same seed picks the same partners (with the same peers and
    // results): a run can be replayed.
    const uint64_t seed =
        config_.training().seed() * 1000003ULL + std::hash<std::string>()(worker_id_);
    chooser_.emplace(clock_, seed);
    rng_.seed(seed ^ 0x90551bULL);
    absl::StatusOr<GossipConfig> parsed = ParseGossipConfig(config_);
    if (parsed.ok()) {
      g_ = *parsed;
    } else {
      config_error_ = parsed.status();
    }
  }
  return {Make(GossipAction::kOpenSession)};
}

GossipActions GossipProtocol::Start(uint64_t elements) {
  elements_ = elements;
  if (!config_error_.ok()) return Leave(config_error_.ToString(), config_error_);
  SHOAL_LOG(INFO) << "gossip mode: publish every " << g_.gossip_every
                  << " steps, fetch p=" << g_.fetch_probability << ", timeout "
                  << absl::FormatDuration(g_.timeout) << ", interpolation " << g_.interpolation_text
                  << ", divergence threshold " << g_.divergence_threshold << ", pulls "
                  << options_.codec_name
                  << (g_.steps ? absl::StrCat(", ", g_.steps, " steps") : std::string());
  // The first peer list comes right after JoinRound; it may be here
  // already.
  if (!peers_.empty()) return BeginLateJoin();
  phase_ = Phase::kAwaitingPeers;
  deadline_ = clock_->Now() + kPeerListWait;
  return {};
}

GossipActions GossipProtocol::BeginLateJoin() {
  phase_ = Phase::kLateJoin;
  late_join_attempts_ = 0;
  return NextLateJoinStep();
}

absl::Time GossipProtocol::wake_at() const {
  switch (phase_) {
    case Phase::kTraining:
      return absl::InfinitePast();
    case Phase::kAwaitingPeers:
    case Phase::kAwaitingFinalList:
    case Phase::kAwaitingEnd:
      return deadline_;
    default:
      // Nothing to do until an event comes (every phase that needs one is
      // bounded by the one before it).
      return absl::InfiniteFuture();
  }
}

GossipActions GossipProtocol::OnTick() {
  switch (phase_) {
    case Phase::kAwaitingPeers:
      if (clock_->Now() < deadline_) return {};
      return BeginLateJoin();
    case Phase::kTraining:
      if (g_.steps > 0 && steps_ >= g_.steps) return Finish();
      return {Make(GossipAction::kTrainStep)};
    case Phase::kAwaitingFinalList:
    case Phase::kAwaitingEnd: {
      if (clock_->Now() < deadline_) return {};
      const std::string what =
          phase_ == Phase::kAwaitingFinalList ? "the final average's list" : "the run's end";
      SHOAL_LOG(WARNING) << "gossip: " << what << " did not come within "
                         << absl::FormatDuration(g_.final_wait) << "; leaving";
      return Leave(absl::StrCat("finished ", steps_, " gossip steps (", what, " did not come)"),
                   absl::OkStatus());
    }
    default:
      return {};
  }
}

GossipActions GossipProtocol::OnDirective(const shoal::v1::CoordinatorMessage& msg) {
  if (phase_ == Phase::kDone) return {};
  if (msg.has_peer_update()) {
    peers_.clear();
    for (const auto& p : msg.peer_update().peers()) {
      if (p.worker_id() != worker_id_) peers_[p.worker_id()] = p.peer_address();
    }
    if (chooser_.has_value()) chooser_->SetPeers(peers_);
    consensus_evaluator_ = msg.peer_update().consensus_evaluator() == worker_id_;
    SHOAL_LOG(INFO) << "gossip peers (version " << msg.peer_update().version()
                    << "): " << peers_.size();
    if (phase_ == Phase::kAwaitingPeers) return BeginLateJoin();
    return {};
  }
  if (msg.has_checkpoint_request() && msg.checkpoint_request().gossip()) {
    const shoal::v1::CheckpointRequest& request = msg.checkpoint_request();
    if (!options_.has_store) {
      GossipAction refuse = Make(GossipAction::kRefuseCheckpoint);
      refuse.sequence = request.round();
      refuse.reason = "this worker has no checkpoint store configured";
      return {std::move(refuse)};
    }
    ckpt_sequence_ = std::max<uint64_t>(1, request.round());
    ckpt_run_id_ = request.run_id();
    ckpt_due_ = NextCheckpointStep(steps_, g_.checkpoint_every);
    SHOAL_LOG(INFO) << "this worker is the checkpointer: uploads every " << g_.checkpoint_every
                    << " local steps (next at step " << ckpt_due_ << "), from sequence "
                    << ckpt_sequence_;
    return {};
  }
  if (msg.has_gossip_final()) {
    final_list_ = msg.gossip_final();
    if (phase_ == Phase::kAwaitingFinalList) return StartFinalAverage();
    return {};
  }
  if (msg.has_run_finished()) {
    SHOAL_LOG(INFO) << "run finished: " << msg.run_finished().reason();
    phase_ = Phase::kDone;
    return {Exit(absl::OkStatus())};
  }
  if (msg.has_leave_requested()) {
    return Leave(msg.leave_requested().reason(),
                 absl::FailedPreconditionError(
                     absl::StrCat("asked to leave: ", msg.leave_requested().reason())));
  }
  return {};
}

GossipActions GossipProtocol::OnSessionClosed(const absl::Status& why) {
  if (phase_ == Phase::kDone) return {};
  SHOAL_LOG(WARNING) << "session lost (" << why.message() << "); re-joining";
  // The coordinator names the checkpointer again after the re-join.
  ckpt_sequence_ = 0;
  return {Make(GossipAction::kRejoin)};
}

GossipActions GossipProtocol::OnStopRequested(const std::string& reason) {
  if (phase_ == Phase::kDone) return {};
  return Leave(reason, absl::OkStatus());
}

GossipActions GossipProtocol::Leave(const std::string& reason, absl::Status status) {
  phase_ = Phase::kDone;
  GossipAction leave = Make(GossipAction::kLeave);
  leave.reason = reason;
  return {std::move(leave), Exit(std::move(status))};
}

GossipActions GossipProtocol::NextLateJoinStep() {
  if (late_join_attempts_ >= kLateJoinAttempts || !chooser_.has_value() || chooser_->size() == 0) {
    return AfterLateJoin();
  }
  ++late_join_attempts_;
  const std::optional<std::string> id = chooser_->Choose();
  GossipAction fetch = Make(GossipAction::kFetchNow);
  fetch.peer_id = *id;
  fetch.address = chooser_->Address(*id);
  fetch.timeout = g_.timeout;
  return {std::move(fetch)};
}

GossipActions GossipProtocol::AfterLateJoin() {
  if (clock_value_ == 0 && !checkpoint_id_.empty()) {
    // A resumed run (docs/GOSSIP.md, "Checkpoints"): no peer has trained
    // yet, so start from the run's latest checkpoint, not the seed's model.
    phase_ = Phase::kLoadingCheckpoint;
    GossipAction load = Make(GossipAction::kLoadCheckpoint);
    load.checkpoint_id = checkpoint_id_;
    return {std::move(load)};
  }
  return BeginTraining();
}

GossipActions GossipProtocol::OnCheckpointLoaded(const absl::Status& result, double clock) {
  if (phase_ != Phase::kLoadingCheckpoint) return {};
  if (!result.ok()) {
    return Leave(absl::StrCat("cannot load checkpoint ", checkpoint_id_, ": ", result.message()),
                 result);
  }
  clock_value_ = clock;
  return BeginTraining();
}

GossipActions GossipProtocol::BeginTraining() {
  phase_ = Phase::kTraining;
  return {Publish(AfterPublish::kNothing, /*new_loss=*/false)};
}

GossipAction GossipProtocol::Publish(AfterPublish then, bool new_loss) {
  after_publish_ = then;
  GossipAction a = Make(GossipAction::kPublish);
  a.clock = clock_value_;
  a.loss = last_loss_;
  a.new_loss = new_loss;
  report_.set_gossip_clock(clock_value_);
  report_.set_gossip_loss(last_loss_);
  report_.set_gossip_steps(steps_);
  // The projection costs O(n x 32): at most once per heartbeat period.
  const absl::Time now = clock_->Now();
  if (now >= next_projection_) {
    a.project = true;
    a.projection_seed = g_.seed;
    next_projection_ = now + g_.heartbeat_period;
  }
  return a;
}

GossipActions GossipProtocol::OnFetched(const GossipFetchOutcome& r) {
  if (phase_ == Phase::kLateJoin) {
    if (!r.status.ok()) {
      SHOAL_LOG(WARNING) << "late join: " << r.status.message();
      if (r.not_answering) chooser_->OnTimeout(r.peer_id);
      return NextLateJoinStep();
    }
    GossipActions out;
    if (r.peer_clock > 0) {
      out.push_back(Make(GossipAction::kAdoptFetched));
      clock_value_ = r.peer_clock;
      last_loss_ = r.peer_loss;
      SHOAL_LOG(INFO) << absl::StrFormat("late join: started from %s's model (clock %.0f) in %.2fs",
                                         r.peer_id, r.peer_clock, absl::ToDoubleSeconds(r.took));
    }
    GossipActions next = AfterLateJoin();
    out.insert(out.end(), next.begin(), next.end());
    return out;
  }
  if (!fetch_in_flight_) return {};  // dropped (kDropFetch)
  fetch_in_flight_ = false;
  if (phase_ != Phase::kTraining) return {};
  if (r.status.ok() && r.has_base) {
    const GossipState own{r.base_clock, r.base_loss > 0 ? r.base_loss : last_loss_};
    const double a = InterpolationFactor(g_, own, {r.peer_clock, r.peer_loss});
    GossipAction merge = Make(GossipAction::kInterpolate);
    merge.factor = a;
    clock_value_ = InterpolateClock(clock_value_, r.base_clock, r.peer_clock, a);
    chooser_->OnSuccess(r.peer_id);
    report_.set_fetches_done(report_.fetches_done() + 1);
    report_.set_last_partner(r.peer_id);
    report_.set_last_factor(a);
    SHOAL_VLOG(1) << absl::StrFormat("gossip: merged %s's model (clock %.0f) a=%.3f in %.3fs",
                                     r.peer_id, r.peer_clock, a, absl::ToDoubleSeconds(r.took));
    if (r.push_failed) {
      SHOAL_LOG(WARNING) << "gossip: pushing our model to " << r.peer_id
                         << " failed: " << r.push_error;
    }
    return {std::move(merge)};
  }
  if (r.not_answering) {
    chooser_->OnTimeout(r.peer_id);
    report_.set_fetches_timed_out(report_.fetches_timed_out() + 1);
  } else {
    report_.set_fetches_failed(report_.fetches_failed() + 1);
  }
  SHOAL_LOG(WARNING) << r.status.message() << " (dropped whole)";
  return {};
}

GossipActions GossipProtocol::OnStepTrained(double loss) {
  if (phase_ != Phase::kTraining) return {};
  loss_sum_ += loss;
  ++loss_count_;
  ++steps_;
  clock_value_ += g_.batch;
  return {Make(GossipAction::kCollect)};
}

GossipActions GossipProtocol::OnPushReceived(const GossipPushOutcome& p) {
  if (phase_ != Phase::kTraining) return {};
  if (p.bytes != elements_ * sizeof(float)) {
    SHOAL_LOG(WARNING) << "gossip: dropped a model of " << p.bytes << " bytes pushed by "
                       << p.pusher << " (the model has " << elements_ * sizeof(float) << ")";
    return {};
  }
  // A partner behind NAT pushed us its model (it cannot be fetched):
  // merged like a fetched one, against our current parameters.
  const double a = InterpolationFactor(g_, {clock_value_, last_loss_}, {p.clock, p.loss});
  GossipAction merge = Make(GossipAction::kInterpolatePush);
  merge.factor = a;
  clock_value_ = InterpolateClock(clock_value_, clock_value_, p.clock, a);
  report_.set_last_partner(p.pusher);
  report_.set_last_factor(a);
  report_.set_pushes_merged(report_.pushes_merged() + 1);
  SHOAL_VLOG(1) << absl::StrFormat("gossip: merged %s's pushed model (clock %.0f) a=%.3f", p.pusher,
                                   p.clock, a);
  return {std::move(merge)};
}

void GossipProtocol::ApplyUpload(const GossipUploadOutcome& r) {
  if (r.upload.ok() && ckpt_sequence_ == r.sequence) ckpt_sequence_ = r.sequence + 1;
  if (absl::IsFailedPrecondition(r.report) || absl::IsNotFound(r.report)) {
    // Another worker is the checkpointer now (this one lost its session
    // meanwhile), or the coordinator no longer knows this worker.
    SHOAL_LOG(WARNING) << "gossip checkpoint report refused (" << r.report.message()
                       << "); no longer the checkpointer";
    ckpt_sequence_ = 0;
  } else if (!r.report.ok()) {
    SHOAL_LOG(WARNING) << "gossip checkpoint report failed: " << r.report.message();
  }
}

GossipActions GossipProtocol::OnUploaded(const GossipUploadOutcome& upload) {
  ApplyUpload(upload);
  if (phase_ == Phase::kFinalUpload) return AfterFinalUpload();
  upload_in_flight_ = false;
  return {};
}

GossipActions GossipProtocol::OnUploadDrained(const std::optional<GossipUploadOutcome>& upload) {
  if (upload.has_value()) ApplyUpload(*upload);
  upload_in_flight_ = false;
  if (phase_ != Phase::kFinalUpload) return {};
  if (ckpt_sequence_ == 0) return AfterFinalUpload();
  return {MakeUpload(GossipAction::kUploadNow,
                     final_ok_ ? GossipAction::Copy::kFinalAverage : GossipAction::Copy::kLatest)};
}

GossipAction GossipProtocol::MakeUpload(GossipAction::Kind kind, GossipAction::Copy copy) const {
  GossipAction a = Make(kind);
  a.upload.run_id = ckpt_run_id_;
  a.upload.sequence = ckpt_sequence_;
  a.upload.steps = steps_;
  a.upload.copy = copy;
  return a;
}

GossipActions GossipProtocol::OnCollected() {
  if (phase_ != Phase::kTraining || steps_ % g_.gossip_every != 0) return {};
  last_loss_ = loss_sum_ / std::max<uint32_t>(1, loss_count_);
  loss_sum_ = 0;
  loss_count_ = 0;
  GossipActions out;
  const uint64_t publication = steps_ / g_.gossip_every;
  if (publication % g_.eval_every == 0) out.push_back(Make(GossipAction::kEvaluate));
  if (g_.consensus_eval_every > 0 && publication % g_.consensus_eval_every == 0 &&
      consensus_evaluator_) {
    // The consensus evaluation (docs/GOSSIP.md, "Consensus accuracy"), by
    // the member the coordinator names (the most trained).
    GossipAction consensus = Make(GossipAction::kEvaluateConsensus);
    for (const auto& [id, address] : peers_) {
      shoal::v1::GossipPeer p;
      p.set_worker_id(id);
      p.set_peer_address(address);
      consensus.peers.push_back(std::move(p));
    }
    consensus.timeout = g_.timeout;
    out.push_back(std::move(consensus));
  }
  out.push_back(Publish(AfterPublish::kGossip, /*new_loss=*/true));
  return out;
}

GossipActions GossipProtocol::OnPublished(bool published, std::vector<float> projection) {
  if (!projection.empty()) {
    report_.clear_projection();
    for (float v : projection) report_.add_projection(v);
  }
  GossipActions out = {Report()};
  const AfterPublish then = after_publish_;
  after_publish_ = AfterPublish::kNothing;
  if (then == AfterPublish::kFinish) {
    GossipActions next = AfterFinalPublication();
    out.insert(out.end(), next.begin(), next.end());
    return out;
  }
  if (then != AfterPublish::kGossip || !published || phase_ != Phase::kTraining) return out;
  if (ckpt_sequence_ > 0 && CheckpointDue(steps_, ckpt_due_) && !upload_in_flight_) {
    // The published copy is held for the whole upload: training goes on
    // in the parameters, peers keep reading the same bytes.
    out.push_back(MakeUpload(GossipAction::kStartUpload, GossipAction::Copy::kLatest));
    upload_in_flight_ = true;
    ckpt_due_ = NextCheckpointStep(steps_, g_.checkpoint_every);
  }
  if (!fetch_in_flight_ && chooser_->size() > 0 &&
      std::bernoulli_distribution(g_.fetch_probability)(rng_)) {
    const std::optional<std::string> id = chooser_->Choose();
    GossipAction fetch = Make(GossipAction::kStartFetch);
    fetch.peer_id = *id;
    fetch.address = chooser_->Address(*id);
    fetch.timeout = g_.timeout;
    out.push_back(std::move(fetch));
    fetch_in_flight_ = true;
  }
  return out;
}

GossipActions GossipProtocol::OnEvaluated(const shoal::v1::Metrics& m) {
  report_.set_test_accuracy(m.test_accuracy());
  report_.set_test_loss(m.test_loss());
  report_.set_eval_clock(clock_value_);
  SHOAL_LOG(INFO) << absl::StrFormat(
      "gossip step %d clock=%.0f train_loss=%.4f test_accuracy=%.4f test_loss=%.4f fetches "
      "done=%d timed_out=%d failed=%d",
      steps_, clock_value_, last_loss_, m.test_accuracy(), m.test_loss(), report_.fetches_done(),
      report_.fetches_timed_out(), report_.fetches_failed());
  if (phase_ != Phase::kFinalAveraging) return {};
  report_.set_final_hash(final_hash_);
  report_.set_final_models(final_models_);
  SHOAL_LOG(INFO) << absl::StrFormat(
      "gossip: final average of %d models in %.2fs: hash %s test_accuracy=%.4f", final_models_,
      absl::ToDoubleSeconds(final_took_), final_hash_.substr(0, 16), report_.test_accuracy());
  return AfterFinalAverage();
}

GossipActions GossipProtocol::OnConsensusEvaluated(const shoal::v1::Metrics& m, uint32_t models,
                                                   double peer_clocks, absl::Duration took) {
  const double clocks = clock_value_ + peer_clocks;
  report_.set_consensus_accuracy(m.test_accuracy());
  report_.set_consensus_loss(m.test_loss());
  report_.set_consensus_models(models);
  report_.set_consensus_clock(clocks);
  SHOAL_LOG(INFO) << absl::StrFormat(
      "gossip step %d consensus of %d models (clocks %.0f): test_accuracy=%.4f test_loss=%.4f "
      "(%.2fs)",
      steps_, models, clocks, m.test_accuracy(), m.test_loss(), absl::ToDoubleSeconds(took));
  return {};
}

GossipActions GossipProtocol::Finish() {
  phase_ = Phase::kFinishing;
  GossipActions out;
  if (g_.final_average) {
    // A fetch in flight is dropped: the final model is what this worker
    // had when it finished.
    if (fetch_in_flight_) out.push_back(Make(GossipAction::kDropFetch));
    fetch_in_flight_ = false;
  }
  out.push_back(Make(GossipAction::kEvaluate));
  next_projection_ = absl::InfinitePast();
  out.push_back(Publish(AfterPublish::kFinish, /*new_loss=*/false));
  return out;
}

GossipActions GossipProtocol::AfterFinalPublication() {
  if (!g_.final_average) {
    if (ckpt_sequence_ > 0) {
      // The checkpointer's final model goes to the store too, as a
      // synchronous run's last round does.
      phase_ = Phase::kFinalUpload;
      return {Make(GossipAction::kDrainUpload)};
    }
    return LeaveAfterSteps();
  }
  // The final average (docs/GOSSIP.md): serve this worker's final model
  // unchanged until the run ends; average the sources GossipFinal names.
  report_.set_gossip_done(true);
  SHOAL_LOG(INFO) << "gossip: trained " << steps_ << " steps; serving the final model, waiting "
                  << "(at most " << absl::FormatDuration(g_.final_wait) << ") for the others";
  phase_ = Phase::kAwaitingFinalList;
  deadline_ = clock_->Now() + g_.final_wait;
  GossipActions out = {Report()};
  if (final_list_.has_value()) {
    GossipActions next = StartFinalAverage();
    out.insert(out.end(), next.begin(), next.end());
  }
  return out;
}

GossipActions GossipProtocol::StartFinalAverage() {
  phase_ = Phase::kFinalAveraging;
  GossipAction a = Make(GossipAction::kFinalAverage);
  a.peers.assign(final_list_->sources().begin(), final_list_->sources().end());
  a.attempts = kFinalFetchAttempts;
  a.timeout = g_.timeout;
  return {std::move(a)};
}

GossipActions GossipProtocol::OnFinalAveraged(const absl::Status& result, uint32_t models,
                                              const std::string& hash, absl::Duration took) {
  if (phase_ != Phase::kFinalAveraging) return {};
  if (result.ok() && models > 0) {
    final_ok_ = true;
    final_models_ = models;
    final_hash_ = hash;
    final_took_ = took;
    // Its evaluation (OnEvaluated) reports the hash.
    return {Make(GossipAction::kEvaluate)};
  }
  const std::string error = result.ok() ? "no model to average" : std::string(result.message());
  report_.set_final_error(error);
  SHOAL_LOG(WARNING) << "gossip: final average failed (" << error
                     << "); this worker keeps its own model";
  return AfterFinalAverage();
}

GossipActions GossipProtocol::AfterFinalAverage() {
  GossipActions out = {Report()};
  if (ckpt_sequence_ > 0) {
    phase_ = Phase::kFinalUpload;
    out.push_back(Make(GossipAction::kDrainUpload));
    return out;
  }
  GossipActions next = AfterFinalUpload();
  out.insert(out.end(), next.begin(), next.end());
  return out;
}

GossipActions GossipProtocol::AfterFinalUpload() {
  if (!g_.final_average) return LeaveAfterSteps();
  // Others may still be fetching our final model: serve it until the
  // coordinator ends the run (RunFinished), at most final_wait.
  phase_ = Phase::kAwaitingEnd;
  deadline_ = clock_->Now() + g_.final_wait;
  return {};
}

GossipActions GossipProtocol::LeaveAfterSteps() {
  // One heartbeat carries the final figures before the worker leaves.
  GossipAction flush = Report(GossipAction::kFlushReport);
  flush.timeout = std::min(absl::Seconds(2), g_.heartbeat_period * 3 / 2);
  SHOAL_LOG(INFO) << "gossip: finished " << steps_ << " steps";
  GossipActions out = {std::move(flush)};
  GossipActions leave = Leave(absl::StrCat("finished ", steps_, " gossip steps"), absl::OkStatus());
  out.insert(out.end(), leave.begin(), leave.end());
  return out;
}

GossipAction GossipProtocol::Report(GossipAction::Kind kind) const {
  GossipAction a = Make(kind);
  a.report = report_;
  return a;
}

double GossipProtocol::peer_score(const std::string& id) const {
  return chooser_.has_value() ? chooser_->Score(id) : 1.0;
}

}  // namespace shoal::worker
