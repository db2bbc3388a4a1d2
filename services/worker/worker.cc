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
  w->peer_service_ = std::make_unique<PeerService>(w->state_.get());
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

Worker::~Worker() {
  if (coordinator_) coordinator_->CloseSession();
  if (state_) state_->SetShuttingDown();
  if (server_) server_->Shutdown(absl::Seconds(1));
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
    state_->Bind(trainer_->parameters(), trainer_->num_elements(), config_.model());
    snapshot_.assign(trainer_->parameters(), trainer_->parameters() + trainer_->num_elements());
    model_hash_ = HashParameters(trainer_->parameters(), trainer_->num_elements());
    state_->SetModel(0, model_hash_);
    SHOAL_LOG(INFO) << "joined run " << joined->run_id() << " as " << worker_id_
                    << " data_rank=" << joined->data_rank() << " shard=" << trainer_->shard_size()
                    << " images, model=" << config_.model() << " (" << trainer_->num_elements()
                    << " parameters, hash " << model_hash_.substr(0, 12) << ")";
  } else {
    SHOAL_LOG(INFO) << "re-joined run " << joined->run_id() << " as " << worker_id_;
  }
  if (joined->model_round() > model_round_) {
    // Catching up on missed rounds by pulling the current model from peers
    // is the late-join path (issue #4); until then the worker trains from
    // the model it has and the next average folds it in.
    SHOAL_LOG(WARNING) << "the run's model is at round " << joined->model_round()
                       << ", this worker holds round " << model_round_
                       << "; it joins with its own model";
  }
  RETURN_IF_ERROR(OpenSession());
  absl::StatusOr<uint64_t> admitted = coordinator_->JoinRound(worker_id_, joined->next_round());
  if (!admitted.ok()) return admitted.status();
  SHOAL_LOG(INFO) << "admitted to round " << *admitted;
  return absl::OkStatus();
}

absl::Status Worker::OpenSession() {
  return coordinator_->OpenSession(
      worker_id_, absl::Milliseconds(std::max<uint32_t>(100, config_.heartbeat_interval_ms())),
      [this](const shoal::v1::CoordinatorMessage& msg) {
        // Abort is seen at once by a running exchange, not only when the
        // main loop pops the event.
        if (msg.has_round_aborted()) aborted_round_ = msg.round_aborted().round();
        Push({Event::kMessage, msg, absl::OkStatus()});
      },
      [this](const absl::Status& status) {
        Push({Event::kSessionClosed, {}, status});
      });
}

void Worker::RestoreSnapshot(const std::string& why) {
  std::memcpy(trainer_->parameters(), snapshot_.data(), snapshot_.size() * sizeof(float));
  SHOAL_LOG(INFO) << "model restored to the average of round " << model_round_ << " (" << why
                  << ")";
}

absl::Status Worker::Rejoin(const std::string& why) {
  SHOAL_LOG(WARNING) << "lost the coordinator session (" << why << "); re-joining";
  coordinator_->CloseSession();
  if (round_ > model_round_) {
    state_->Abort(round_);
    RestoreSnapshot("left the round unfinished");
  }
  Backoff backoff(absl::Milliseconds(200), absl::Seconds(5));
  absl::Status s;
  const absl::Time give_up = absl::Now() + options_.connect_timeout;
  while (!StopRequested()) {
    s = JoinRun(worker_id_);
    if (s.ok()) return s;
    if (absl::Now() >= give_up) break;
    SHOAL_LOG(WARNING) << "re-join failed: " << s.message();
    coordinator_->CloseSession();
    ShutdownSignal::WaitFor(backoff.Next());
  }
  return s;
}

absl::Status Worker::OnRoundStart(const shoal::v1::RoundStart& start) {
  round_ = start.round();
  aborted_round_ = 0;  // an abort of an earlier attempt of this round is done
  if (start.base_model_round() != model_round_) {
    SHOAL_LOG(WARNING) << "round " << round_ << " starts from the model of round "
                       << start.base_model_round() << ", this worker holds round " << model_round_;
  }
  state_->BeginTraining(round_);
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
    state_->Abort(round_);
    RestoreSnapshot("ready refused");
    return absl::OkStatus();  // the session tells us what comes next
  }
  SHOAL_VLOG(1) << "round " << round_ << " ready, loss " << train_loss_;
  return absl::OkStatus();
}

absl::Status Worker::OnRoundPlan(const shoal::v1::RoundPlan& plan) {
  if (plan.round() != round_) {
    SHOAL_LOG(WARNING) << "ignoring the plan of round " << plan.round() << " (at round " << round_
                       << ")";
    return absl::OkStatus();
  }
  Exchanger exchanger(peers_.get(), state_.get(), trainer_->parameters(), options_.exchange);
  std::atomic<bool> abort{false};
  // The exchanger polls `abort`; mirror the session's abort flag into it.
  const uint64_t round = round_;
  ExchangeStats stats;
  const absl::Time t0 = absl::Now();
  absl::Status s;
  {
    std::atomic<bool> done{false};
    std::thread watcher([&] {
      while (!done.load()) {
        if (aborted_round_.load() == round || StopRequested()) abort = true;
        absl::SleepFor(absl::Milliseconds(5));
      }
    });
    s = exchanger.Run(plan, worker_id_, &abort, &stats);
    done = true;
    watcher.join();
  }
  const double exchange_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  if (!s.ok()) {
    SHOAL_LOG(WARNING) << "exchange of round " << round << " failed: " << s;
    state_->Abort(round);
    RestoreSnapshot("exchange failed");
    if (absl::IsAborted(s)) return absl::OkStatus();  // RoundAborted is queued
    // Leave and join again: the coordinator then aborts the round for
    // everyone and restarts it, instead of waiting for our report.
    coordinator_->Leave(worker_id_, absl::StrCat("exchange failed: ", s.message())).IgnoreError();
    return Rejoin("exchange failed");
  }
  model_hash_ = HashParameters(trainer_->parameters(), trainer_->num_elements());
  shoal::v1::ReportRoundDoneRequest done;
  done.set_worker_id(worker_id_);
  done.set_round(round);
  done.set_model_hash(model_hash_);
  done.set_exchange_seconds(exchange_seconds);
  done.set_train_seconds(train_seconds_);
  const bool last = config_.rounds() > 0 && round >= config_.rounds();
  if (round % std::max<uint32_t>(1, config_.eval_every()) == 0 || last) {
    *done.mutable_metrics() = trainer_->Evaluate();
  }
  std::memcpy(snapshot_.data(), trainer_->parameters(), snapshot_.size() * sizeof(float));
  model_round_ = round;
  state_->SetModel(round, model_hash_);
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
  return absl::OkStatus();
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
    switch (msg.kind_case()) {
      case shoal::v1::CoordinatorMessage::kRoundStart:
        RETURN_IF_ERROR(OnRoundStart(msg.round_start()));
        break;
      case shoal::v1::CoordinatorMessage::kRoundPlan:
        RETURN_IF_ERROR(OnRoundPlan(msg.round_plan()));
        break;
      case shoal::v1::CoordinatorMessage::kRoundComplete:
        if (msg.round_complete().model_hash() != model_hash_) {
          SHOAL_LOG(ERROR) << "round " << msg.round_complete().round() << " completed with hash "
                           << msg.round_complete().model_hash() << ", this worker has "
                           << model_hash_;
        }
        break;
      case shoal::v1::CoordinatorMessage::kRoundAborted:
        if (msg.round_aborted().round() == round_ && round_ > model_round_) {
          SHOAL_LOG(WARNING) << "round " << round_ << " aborted: " << msg.round_aborted().reason();
          state_->Abort(round_);
          RestoreSnapshot("round aborted");
        }
        break;
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
