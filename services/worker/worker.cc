#include "services/worker/worker.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/logging.h"
#include "common/signals.h"
#include "common/status_util.h"

namespace shoal::worker {

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(WorkerOptions options) {
  std::unique_ptr<Worker> w(new Worker(std::move(options)));
  absl::StatusOr<FashionMnist> data = LoadFashionMnist(w->options_.data_dir);
  if (!data.ok()) return data.status();
  w->data_ = std::move(*data);
  w->state_ = std::make_unique<ModelState>();
  w->upload_limiter_ = std::make_unique<RateLimiter>(w->options_.upload_rate_mbps * 1e6 / 8);
  w->peer_service_ = std::make_unique<PeerService>(w->state_.get(), w->upload_limiter_.get());
  auto server = GrpcServer::Start(w->options_.listen, {w->peer_service_.get()});
  if (!server.ok()) return server.status();
  w->server_ = std::move(*server);
  w->advertise_ = w->options_.advertise.empty() ? w->server_->address() : w->options_.advertise;
  w->peers_ = std::make_unique<GrpcPeerClient>();
  CoordinatorClientOptions copts;
  copts.address = w->options_.coordinator;
  copts.rpc_timeout = w->options_.rpc_timeout;
  copts.retry_window = w->options_.connect_timeout;
  w->coordinator_ = std::make_unique<GrpcCoordinatorClient>(copts);
  return w;
}

namespace {

// How long the worker waits for gRPC to give back the model memory lent to
// peers before rewriting it (see "Lending model memory" in
// core/model_state.h). Readers that are reading return it within
// milliseconds; ModelState cancels the streams of readers that stopped.
constexpr absl::Duration kLentChunksTimeout = absl::Seconds(5);

}  // namespace

Worker::~Worker() {
  if (coordinator_) coordinator_->CloseSession();
  if (state_) state_->SetShuttingDown();
  if (server_) server_->Shutdown(absl::Seconds(1));
  // The members below (model, snapshot) are freed after this body; gRPC may
  // still hold slices pointing into them for a moment after the shutdown.
  if (state_ && !(state_->AwaitReturned(ModelState::Buffer::kParameters, kLentChunksTimeout) &&
                  state_->AwaitReturned(ModelState::Buffer::kSnapshot, kLentChunksTimeout))) {
    SHOAL_LOG(ERROR) << "gRPC still holds model memory lent to peers; leaking the model instead "
                        "of freeing memory it may read";
    (void)trainer_.release();
    (void)new std::vector<float>(std::move(snapshot_));  // keeps the buffer
    (void)state_.release();
  }
}

void Worker::AwaitLentChunks(ModelState::Buffer buffer) {
  if (!state_->AwaitReturned(buffer, kLentChunksTimeout)) {
    // Only a reader of a window that has closed can still hold the chunk:
    // whatever it receives now fails its CRC check there (DATA_LOSS).
    SHOAL_LOG(WARNING) << "after " << kLentChunksTimeout << " gRPC still holds "
                       << state_->chunks_lent(buffer) << " chunks of the "
                       << (buffer == ModelState::Buffer::kSnapshot ? "snapshot" : "model")
                       << " lent to peers; rewriting it anyway";
  }
}

bool Worker::StopRequested() const {
  return ShutdownSignal::Requested() || (options_.stop != nullptr && options_.stop->load());
}

void Worker::Push(Event event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
}

bool Worker::Pop(Event* event, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto has_event = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&has_event), timeout)) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  return true;
}

absl::Status Worker::JoinRun(const std::string& previous_id) {
  shoal::v1::JoinRequest request;
  request.set_peer_address(advertise_);
  request.set_name(options_.name);
  request.set_previous_worker_id(previous_id);
  // A pending round is not claimed: the coordinator may have voided it
  // (Settle below learns which).
  const uint64_t held_round = pending_ ? agreed_round_ : model_round_;
  request.set_model_round(held_round);
  if (held_round > 0) request.set_model_hash(pending_ ? agreed_hash_ : model_hash_);
  if (has_data_rank_) request.set_previous_data_rank(data_rank_);
  absl::StatusOr<shoal::v1::JoinResponse> joined = coordinator_->Join(request);
  if (!joined.ok()) {
    return absl::Status(joined.status().code(),
                        absl::StrCat("cannot join the run at coordinator ", options_.coordinator,
                                     ": ", joined.status().message()));
  }
  const bool first = trainer_ == nullptr;
  if (!first && joined->config().SerializeAsString() != config_.SerializeAsString()) {
    return absl::FailedPreconditionError("the coordinator now runs a different configuration");
  }
  worker_id_ = joined->worker_id();
  config_ = joined->config();
  data_rank_ = joined->data_rank();
  has_data_rank_ = true;
  SetLogTag(absl::StrCat("worker ", worker_id_));
  state_->SetWorkerId(worker_id_);
  if (first) {
    TrainerOptions topts;
    topts.config = config_;
    topts.data_rank = joined->data_rank();
    topts.threads = options_.torch_threads;
    topts.eval_limit = options_.eval_limit;
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(topts, &data_);
    if (!trainer.ok()) return trainer.status();
    trainer_ = std::move(*trainer);
    const uint64_t n = trainer_->num_elements();
    state_->Bind(trainer_->parameters(), n, config_.model());
    // Peers catching up pull (and verify) the model layer by layer.
    std::vector<LayerSpan> spans;
    for (const LayerInfo& l : trainer_->layers()) spans.push_back({l.name, l.offset, l.elements});
    if (absl::Status ls = state_->SetLayers(std::move(spans)); !ls.ok()) {
      SHOAL_LOG(WARNING) << "layer table refused: " << ls.message();
    }
    snapshot_.assign(trainer_->parameters(), trainer_->parameters() + n);
    contribution_.resize(n);
    state_->BindSnapshot(snapshot_.data());
    model_hash_ = HashParameters(trainer_->parameters(), n);
    state_->SetModel(0, model_hash_);
    state_->SetSnapshot(0);
    SHOAL_LOG(INFO) << "joined run " << joined->run_id() << " as " << worker_id_
                    << " data_rank=" << joined->data_rank() << " shard=" << trainer_->shard_size()
                    << " images, model=" << config_.model() << " (" << n << " parameters, hash "
                    << model_hash_.substr(0, 12) << ")";
  } else {
    SHOAL_LOG(INFO) << "re-joined run " << joined->run_id() << " as " << worker_id_;
  }
  if (!config_.checkpoint_store().empty() && store_ == nullptr) {
    store_ = std::make_unique<checkpoint::GrpcCheckpointClient>(config_.checkpoint_store());
  }
  // A run in progress: take its current model before anything else.
  Settle(joined->model_round(), joined->model_hash());
  CatchUp(joined->model_round(), joined->model_hash(),
          {joined->holders().begin(), joined->holders().end()}, joined->checkpoint_id(),
          joined->checkpoint_round());
  RETURN_IF_ERROR(OpenSession());
  // Round 0: the earliest open one (the catch-up above may have taken a
  // while, so joined->next_round() may be over already).
  absl::StatusOr<uint64_t> admitted = coordinator_->JoinRound(worker_id_, 0);
  if (!admitted.ok()) return admitted.status();
  SHOAL_LOG(INFO) << "admitted to round " << *admitted;
  return absl::OkStatus();
}

bool Worker::Interrupts(const shoal::v1::CoordinatorMessage& msg) {
  return msg.has_round_plan() || msg.has_round_aborted() || msg.has_round_missed() ||
         msg.has_connection_fail() || msg.has_leave_requested() || msg.has_run_finished();
}

absl::Status Worker::OpenSession() {
  return coordinator_->OpenSession(
      worker_id_, absl::Milliseconds(std::max<uint32_t>(100, config_.heartbeat_interval_ms())),
      [this](const shoal::v1::CoordinatorMessage& msg) {
        // A running exchange sees these at once, not when Run() pops them.
        if (Interrupts(msg)) ++interrupts_seen_;
        Push({Event::kMessage, msg, absl::OkStatus()});
      },
      [this](const absl::Status& status) {
        Push({Event::kSessionClosed, {}, status});
      },
      [this](shoal::v1::Heartbeat* hb) {
        if (!sync_progress_.syncing.load()) return;
        hb->set_syncing(true);
        hb->set_sync_bytes_done(sync_progress_.bytes_done.load());
        hb->set_sync_bytes_total(sync_progress_.bytes_total.load());
        hb->set_sync_sources(sync_progress_.sources.load());
      });
}

void Worker::HoldPending(uint64_t round, const std::string& hash) {
  // Peers catching up may read this round at once: serve it from the
  // parameters (nothing rewrites them before the round is settled) and keep
  // the previous agreed model in snapshot_ in case the round is voided.
  // snapshot_ is not rewritten here, so chunks of it still lent may stay
  // out (CommitPending and UncommitPending wait for them before writing it).
  state_->BeginSnapshotUpdate();
  state_->BindSnapshot(trainer_->parameters());
  agreed_round_ = model_round_;
  agreed_hash_ = model_hash_;
  pending_ = true;
  model_round_ = round;
  model_hash_ = hash;
  state_->SetSnapshot(round);
  state_->SetModel(round, hash);
}

void Worker::CommitPending() {
  if (!pending_) return;
  state_->BeginSnapshotUpdate();
  AwaitLentChunks(ModelState::Buffer::kSnapshot);
  std::memcpy(snapshot_.data(), trainer_->parameters(), snapshot_.size() * sizeof(float));
  state_->BindSnapshot(snapshot_.data());
  state_->SetSnapshot(model_round_);
  pending_ = false;
}

void Worker::UncommitPending(const std::string& why) {
  if (!pending_) return;
  SHOAL_LOG(WARNING) << "the average of round " << model_round_ << " computed here is void (" << why
                     << "); back to the agreed model of round " << agreed_round_;
  state_->BeginSnapshotUpdate();
  AwaitLentChunks(ModelState::Buffer::kSnapshot);
  state_->BindSnapshot(snapshot_.data());
  model_round_ = agreed_round_;
  model_hash_ = agreed_hash_;
  state_->SetSnapshot(model_round_);
  state_->SetModel(model_round_, model_hash_);
  pending_ = false;
}

void Worker::Settle(uint64_t agreed_round, const std::string& agreed_hash) {
  if (!pending_) return;
  if ((agreed_round == model_round_ && agreed_hash == model_hash_) || agreed_round > model_round_) {
    // Agreed; or the run moved on without telling us this round's outcome,
    // and the catch-up that follows replaces the model anyway.
    CommitPending();
  } else {
    // Voided, or agreed with another hash (this worker missed the new
    // attempt): back to the last agreed model; a catch-up follows if needed.
    UncommitPending(absl::StrCat("the run's model is round ", agreed_round, " hash ",
                                 agreed_hash.substr(0, 12)));
    DropRound("round not agreed");
  }
}

void Worker::DropRound(const std::string& why) {
  if (round_ > model_round_) {
    state_->Abort(round_);
    AwaitLentChunks(ModelState::Buffer::kParameters);
    std::memcpy(trainer_->parameters(), snapshot_.data(), snapshot_.size() * sizeof(float));
  }
  // Otherwise the parameters hold the model of model_round_ already (agreed,
  // or pending and settled later), possibly still read by a slower peer.
  contribution_round_ = 0;
  plan_.Clear();
  SHOAL_LOG(INFO) << "local work of round " << round_ << " dropped (" << why
                  << "); model back to the average of round " << model_round_;
}

void Worker::CatchUp(uint64_t round, const std::string& hash,
                     const std::vector<std::string>& holders, const std::string& checkpoint_id,
                     uint64_t checkpoint_round) {
  if ((round == model_round_ && hash == model_hash_) || hash.empty()) return;
  if (round < model_round_) {
    SHOAL_LOG(WARNING) << "the run is at round " << round << ", this worker holds round "
                       << model_round_ << "; keeping it";
    return;
  }
  std::vector<std::string> sources;
  for (const std::string& h : holders) {
    if (h != advertise_) sources.push_back(h);
  }
  SHOAL_LOG(INFO) << "catching up: pulling the model of round " << round << " from "
                  << sources.size() << " peers";
  const absl::Time t0 = absl::Now();
  // Pull into the snapshot buffer: it is not served while being replaced.
  state_->BeginSnapshotUpdate();
  AwaitLentChunks(ModelState::Buffer::kSnapshot);
  // Peers first; the checkpoint store serves what no peer can.
  CheckpointFallback fallback;
  if (store_ != nullptr && !checkpoint_id.empty() && checkpoint_round == round) {
    fallback.client = store_.get();
    fallback.checkpoint_id = checkpoint_id;
    if (sources.empty()) {
      SHOAL_LOG(INFO) << "no peer holds round " << round << "; loading checkpoint " << checkpoint_id
                      << " from the store";
    }
  }
  ModelSyncer syncer(peers_.get(), options_.sync);
  absl::Status s = syncer.Sync(round, hash, sources, snapshot_.data(), snapshot_.size(), worker_id_,
                               &sync_progress_, fallback);
  if (!s.ok()) {
    // Keep what we had; the next average folds this worker's model in.
    std::memcpy(snapshot_.data(), trainer_->parameters(), snapshot_.size() * sizeof(float));
    state_->SetSnapshot(model_round_);
    SHOAL_LOG(WARNING) << "catch-up to round " << round << " failed: " << s
                       << "; continuing with the model of round " << model_round_;
    return;
  }
  // The parameters switch to a newer model: nothing of the old round is
  // served from them any more.
  state_->Unready();
  AwaitLentChunks(ModelState::Buffer::kParameters);
  std::memcpy(trainer_->parameters(), snapshot_.data(), snapshot_.size() * sizeof(float));
  model_round_ = round;
  model_hash_ = hash;
  state_->SetSnapshot(round);
  state_->SetModel(round, hash);
  SHOAL_LOG(INFO) << absl::StrFormat("caught up to round %d in %.2fs (%d MiB)", round,
                                     absl::ToDoubleSeconds(absl::Now() - t0),
                                     snapshot_.size() * sizeof(float) >> 20);
}

void Worker::UploadCheckpoint(const shoal::v1::CheckpointRequest& request) {
  shoal::v1::ReportCheckpointRequest report;
  report.set_worker_id(worker_id_);
  report.set_round(request.round());
  if (store_ == nullptr) {
    report.set_error("this worker has no checkpoint store configured");
  } else if (model_round_ != request.round() || model_hash_ != request.model_hash()) {
    report.set_error(absl::StrCat("holds round ", model_round_, ", not ", request.round()));
  } else {
    shoal::v1::Manifest manifest;
    manifest.set_run_id(request.run_id());
    manifest.set_round(request.round());
    manifest.set_model(config_.model());
    manifest.set_model_sha256(request.model_hash());
    const uint64_t seen = request.round() * config_.local_steps() * config_.batch_size();
    manifest.set_epoch(trainer_->shard_size() ? seen / trainer_->shard_size() : 0);
    std::vector<checkpoint::ByteSpan> spans;
    for (const LayerInfo& l : trainer_->layers()) {
      auto* entry = manifest.add_layers();
      entry->set_name(l.name);
      entry->set_dtype("float32");
      for (int64_t d : l.shape) entry->add_shape(d);
      spans.push_back({reinterpret_cast<const uint8_t*>(snapshot_.data() + l.offset),
                       l.elements * sizeof(float)});
    }
    const absl::Time t0 = absl::Now();
    absl::Status s = checkpoint::CompleteManifest(&manifest, spans);
    absl::StatusOr<shoal::v1::CheckpointInfo> info =
        s.ok() ? store_->Upload(manifest, spans) : absl::StatusOr<shoal::v1::CheckpointInfo>(s);
    if (info.ok()) {
      report.set_checkpoint_id(info->id());
      SHOAL_LOG(INFO) << absl::StrFormat("checkpoint %s of round %d uploaded in %.2fs", info->id(),
                                         request.round(), absl::ToDoubleSeconds(absl::Now() - t0));
    } else {
      report.set_error(info.status().ToString());
      SHOAL_LOG(WARNING) << "checkpoint upload of round " << request.round()
                         << " failed: " << info.status();
    }
  }
  absl::Status s = coordinator_->ReportCheckpoint(report);
  if (!s.ok()) SHOAL_LOG(WARNING) << "checkpoint report refused: " << s.message();
}

absl::Status Worker::Rejoin(const std::string& why) {
  SHOAL_LOG(WARNING) << "lost the coordinator session (" << why << "); re-joining";
  coordinator_->CloseSession();
  DropRound("session lost");
  // The coordinator may be restarting: keep trying (capped, jittered
  // backoff) for as long as the worker runs.
  Backoff backoff(absl::Milliseconds(200), absl::Seconds(5));
  absl::Time next_log = absl::Now();
  while (!StopRequested()) {
    absl::Status s = JoinRun(worker_id_);
    if (s.ok()) return s;
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s) && !absl::IsNotFound(s) &&
        !absl::IsFailedPrecondition(s)) {
      return s;
    }
    if (absl::Now() >= next_log) {
      SHOAL_LOG(WARNING) << "re-join failed, retrying: " << s.message();
      next_log = absl::Now() + absl::Seconds(10);
    }
    coordinator_->CloseSession();
    ShutdownSignal::WaitFor(backoff.Next());
  }
  return absl::OkStatus();
}

absl::Status Worker::OnRoundStart(const shoal::v1::RoundStart& start) {
  Settle(start.base_model_round(), start.base_model_hash());
  if (start.base_model_round() != model_round_ || start.base_model_hash() != model_hash_) {
    std::vector<std::string> holders(start.holders().begin(), start.holders().end());
    if (holders.empty()) {
      // The coordinator counted this worker as a holder (it sends the list
      // only to the others): ask the participants of the last plan instead;
      // the syncer skips those that do not hold the round.
      holders = plan_list_.Addresses();
    }
    CatchUp(start.base_model_round(), start.base_model_hash(), holders, start.checkpoint_id(),
            start.checkpoint_round());
  }
  round_ = start.round();
  contribution_round_ = 0;
  plan_.Clear();
  state_->BeginTraining(round_);
  AwaitLentChunks(ModelState::Buffer::kParameters);  // training rewrites them
  const absl::Time t0 = absl::Now();
  train_loss_ = trainer_->TrainSteps(config_.local_steps());
  train_seconds_ = absl::ToDoubleSeconds(absl::Now() - t0);
  state_->SetReady(round_);
  shoal::v1::ReportReadyRequest ready;
  ready.set_worker_id(worker_id_);
  ready.set_round(round_);
  ready.set_train_loss(train_loss_);
  ready.set_total_elements(trainer_->num_elements());
  absl::Status s = coordinator_->ReportReady(ready);
  if (!s.ok()) {
    SHOAL_LOG(WARNING) << "ready for round " << round_ << " refused: " << s.message();
    DropRound("ready refused");
    return absl::OkStatus();  // the session tells us what comes next
  }
  SHOAL_VLOG(1) << "round " << round_ << " ready, loss " << train_loss_;
  return absl::OkStatus();
}

void Worker::OnRoundPlan(const shoal::v1::RoundPlan& plan) {
  if (pending_ && plan.round() == round_ && plan.attempt() > plan_.attempt() &&
      contribution_round_ == round_) {
    // Our exchange ended before a peer was lost, theirs did not: the round
    // is re-planned among the survivors and this worker exchanges again.
    UncommitPending(
        absl::StrCat("plan attempt ", plan.attempt(), " replaces attempt ", plan_.attempt()));
  }
  if (plan.round() != round_ || round_ <= model_round_) {
    SHOAL_LOG(WARNING) << "ignoring the plan of round " << plan.round() << " (at round " << round_
                       << ")";
    return;
  }
  if (contribution_round_ != round_) {
    // First plan of the round: keep the trained model for re-plans. Nobody
    // reads it yet (peers start at StartWeightSharing, which waits for our
    // ConnectionsReady below), and it does not change: the contribution's
    // window (and the CRCs SetReady computed) stays open.
    std::memcpy(contribution_.data(), trainer_->parameters(), contribution_.size() * sizeof(float));
    contribution_round_ = round_;
  } else {
    // A participant was lost: exchange again from the trained model. Reads
    // of the previous attempt are refused, and their chunks given back,
    // before the parameters are restored.
    state_->Unready();
    AwaitLentChunks(ModelState::Buffer::kParameters);
    std::memcpy(trainer_->parameters(), contribution_.data(), contribution_.size() * sizeof(float));
    SHOAL_LOG(INFO) << "round " << round_ << ": new plan (attempt " << plan.attempt() << ", "
                    << plan.slices_size() << " participants)";
  }
  plan_ = plan;
  for (const auto& s : plan.slices()) {
    if (s.worker_id() == worker_id_) state_->SetPlan(round_, plan.attempt(), s.begin(), s.end());
  }
  state_->SetReady(round_);
  ProbePeers(0);
}

void Worker::ProbePeers(uint32_t retry) {
  shoal::v1::ConnectionsReadyRequest req;
  req.set_worker_id(worker_id_);
  req.set_round(plan_.round());
  req.set_attempt(plan_.attempt());
  // Report within the coordinator's connection timeout.
  absl::Duration budget = options_.probe_timeout;
  if (config_.connection_timeout_ms() > 0) {
    budget = std::min(budget, absl::Milliseconds(config_.connection_timeout_ms()) / 2);
  }
  std::vector<std::thread> probes;
  std::vector<absl::Status> results(plan_.slices_size());
  for (int k = 0; k < plan_.slices_size(); ++k) {
    if (plan_.slices(k).worker_id() == worker_id_) continue;
    probes.emplace_back(
        [&, k] { results[k] = peers_->Probe(plan_.slices(k).peer_address(), budget).status(); });
  }
  for (auto& t : probes) t.join();
  for (int k = 0; k < plan_.slices_size(); ++k) {
    if (results[k].ok()) continue;
    SHOAL_LOG(WARNING) << "round " << plan_.round() << ": cannot reach "
                       << plan_.slices(k).worker_id() << " (" << results[k].message() << ")"
                       << (retry ? absl::StrCat(", retry ", retry) : "");
    req.add_unreachable(plan_.slices(k).worker_id());
  }
  absl::Status s = coordinator_->ConnectionsReady(req);
  if (!s.ok()) SHOAL_LOG(WARNING) << "connections-ready refused: " << s.message();
}

void Worker::OnStartSharing(const shoal::v1::StartWeightSharing& start) {
  if (start.round() != round_ || start.attempt() != plan_.attempt() || plan_.round() != round_ ||
      round_ <= model_round_) {
    SHOAL_LOG(WARNING) << "ignoring start of sharing for round " << start.round() << " attempt "
                       << start.attempt();
    return;
  }
  const uint64_t round = round_;
  Exchanger exchanger(peers_.get(), state_.get(), trainer_->parameters(), options_.exchange);
  std::atomic<bool> abort{false};
  ExchangeStats stats;
  const absl::Time t0 = absl::Now();
  absl::Status s;
  {
    // Mirror interrupting directives (a new plan, an abort) into `abort`.
    std::atomic<bool> done{false};
    std::thread watcher([&] {
      while (!done.load()) {
        if (interrupts_seen_.load() > interrupts_handled_ || StopRequested()) abort = true;
        absl::SleepFor(absl::Milliseconds(2));
      }
    });
    s = exchanger.Run(plan_, worker_id_, &abort, &stats);
    done = true;
    watcher.join();
  }
  const double exchange_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  if (!s.ok()) {
    // Nothing is reported: a new plan or the round deadline decides what
    // comes next (the coordinator never waits forever).
    SHOAL_LOG(WARNING) << "exchange of round " << round << " attempt " << plan_.attempt()
                       << " stopped: " << s;
    return;
  }
  const std::string hash = HashParameters(trainer_->parameters(), trainer_->num_elements());
  shoal::v1::ReportRoundDoneRequest done;
  done.set_worker_id(worker_id_);
  done.set_round(round);
  done.set_attempt(plan_.attempt());
  done.set_model_hash(hash);
  done.set_exchange_seconds(exchange_seconds);
  done.set_train_seconds(train_seconds_);
  const bool last = config_.rounds() > 0 && round >= config_.rounds();
  if (round % std::max<uint32_t>(1, config_.eval_every()) == 0 || last) {
    *done.mutable_metrics() = trainer_->Evaluate();
  }
  HoldPending(round, hash);
  SHOAL_LOG(INFO) << absl::StrFormat(
      "round %d: train_loss=%.4f%s train=%.2fs exchange=%.3fs (%d KiB in, %d retries) hash=%s",
      round, train_loss_,
      done.metrics().evaluated()
          ? absl::StrFormat(" test_accuracy=%.4f test_loss=%.4f", done.metrics().test_accuracy(),
                            done.metrics().test_loss())
          : "",
      train_seconds_, exchange_seconds, stats.bytes_received / 1024, stats.retries,
      model_hash_.substr(0, 12));
  absl::Status r = coordinator_->ReportRoundDone(done);
  if (!r.ok()) SHOAL_LOG(WARNING) << "report of round " << round << " refused: " << r.message();
}

absl::Status Worker::Run() {
  SHOAL_LOG(INFO) << "peer service on " << server_->address() << ", advertised as " << advertise_
                  << "; joining coordinator " << options_.coordinator;
  RETURN_IF_ERROR(JoinRun(""));
  while (true) {
    if (StopRequested()) {
      SHOAL_LOG(INFO) << "leaving the run (shutdown requested)";
      state_->SetShuttingDown();
      coordinator_->Leave(worker_id_, "worker shut down").IgnoreError();
      coordinator_->CloseSession();
      return absl::OkStatus();
    }
    Event event;
    if (!Pop(&event, absl::Milliseconds(200))) continue;
    if (event.kind == Event::kSessionClosed) {
      if (StopRequested()) continue;
      RETURN_IF_ERROR(Rejoin(event.status.ToString()));
      continue;
    }
    const shoal::v1::CoordinatorMessage& msg = event.message;
    if (Interrupts(msg)) ++interrupts_handled_;
    switch (msg.kind_case()) {
      case shoal::v1::CoordinatorMessage::kRoundStart:
        RETURN_IF_ERROR(OnRoundStart(msg.round_start()));
        break;
      case shoal::v1::CoordinatorMessage::kRoundPlan: {
        shoal::v1::RoundPlan plan = msg.round_plan();
        if (absl::Status s = plan_list_.Expand(&plan); !s.ok()) {
          // Only a fresh session gets the list again.
          RETURN_IF_ERROR(Rejoin(s.ToString()));
          break;
        }
        OnRoundPlan(plan);
        break;
      }
      case shoal::v1::CoordinatorMessage::kRetryConnections:
        if (msg.retry_connections().round() == round_ &&
            msg.retry_connections().attempt() == plan_.attempt()) {
          ProbePeers(msg.retry_connections().retry());
        }
        break;
      case shoal::v1::CoordinatorMessage::kStartSharing:
        OnStartSharing(msg.start_sharing());
        break;
      case shoal::v1::CoordinatorMessage::kCheckpointRequest:
        // Only agreed rounds are checkpointed (a takeover may name an older one).
        if (msg.checkpoint_request().round() == model_round_) {
          Settle(msg.checkpoint_request().round(), msg.checkpoint_request().model_hash());
        }
        UploadCheckpoint(msg.checkpoint_request());
        break;
      case shoal::v1::CoordinatorMessage::kRoundComplete:
        Settle(msg.round_complete().round(), msg.round_complete().model_hash());
        if (msg.round_complete().model_hash() != model_hash_) {
          SHOAL_LOG(ERROR) << "round " << msg.round_complete().round() << " completed with hash "
                           << msg.round_complete().model_hash() << ", this worker has "
                           << model_hash_;
        }
        break;
      case shoal::v1::CoordinatorMessage::kRoundAborted:
        if (msg.round_aborted().round() == round_) {
          // Also when our exchange had ended: everyone goes back.
          UncommitPending("round aborted");
        }
        if (msg.round_aborted().round() == round_ && round_ > model_round_) {
          DropRound(absl::StrCat("round aborted: ", msg.round_aborted().reason()));
        }
        break;
      case shoal::v1::CoordinatorMessage::kRoundMissed:
        SHOAL_LOG(WARNING) << "sat out round " << msg.round_missed().round() << ": "
                           << msg.round_missed().reason();
        if (msg.round_missed().round() == round_) UncommitPending("sat the round out");
        if (msg.round_missed().round() == round_ && round_ > model_round_) {
          DropRound("sat the round out");
        }
        break;
      case shoal::v1::CoordinatorMessage::kConnectionFail:
        SHOAL_LOG(ERROR) << "removed from the run in round " << msg.connection_fail().round()
                         << ": " << msg.connection_fail().reason()
                         << ". Check that peers can reach this worker at " << advertise_
                         << " (--listen / --advertise) and that it can reach them.";
        coordinator_->CloseSession();
        return absl::FailedPreconditionError(
            absl::StrCat("connection failure: ", msg.connection_fail().reason()));
      case shoal::v1::CoordinatorMessage::kLeaveRequested:
        SHOAL_LOG(ERROR) << "the coordinator asked this worker to leave: "
                         << msg.leave_requested().reason();
        coordinator_->CloseSession();
        return absl::FailedPreconditionError(
            absl::StrCat("asked to leave: ", msg.leave_requested().reason()));
      case shoal::v1::CoordinatorMessage::kRunFinished:
        SHOAL_LOG(INFO) << "run finished after round " << msg.run_finished().last_round() << ": "
                        << msg.run_finished().reason();
        coordinator_->CloseSession();
        return absl::OkStatus();
      default:
        break;
    }
  }
}

}  // namespace shoal::worker
