#include "services/worker/worker.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/member_credentials_grpc.h"
#include "common/metrics.h"
#include "common/model_file.h"
#include "common/model_layout.h"
#include "common/retry.h"
#include "common/run_options.h"
#include "common/status_util.h"
#include "services/worker/core/data_split.h"
#include "services/worker/core/dataset.h"
#include "services/worker/core/directive_route.h"
#include "services/worker/core/gossip_policy.h"
#include "services/worker/gossip_runner.h"
#include "services/worker/routed_coordinator_client.h"
#include "services/worker/sync_runner.h"
#include "services/worker/worker_metrics.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal::worker {
namespace {

// The first of --coordinator's comma-separated addresses: where a
// supernode's Relay stream goes first (with replicas it follows the leader:
// docs/SUPERNODES.md "Relay").
std::string FirstAddress(const std::string& addresses) {
  return std::string(absl::string_view(addresses).substr(0, addresses.find(',')));
}

// How long the worker waits for gRPC to give back the model memory lent to
// peers before freeing it at shutdown (see "Lending model memory" in
// core/model_state.h).
constexpr absl::Duration kLentChunksTimeout = absl::Seconds(5);

}  // namespace

Worker::Worker(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()) {}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(Options options) {
  std::unique_ptr<Worker> w(new Worker(std::move(options)));
  if (!w->options_.make_trainer) {  // the built-in trainer's data
    absl::StatusOr<FashionMnist> data = LoadDataset(w->options_.dataset, w->options_.data_dir);
    if (!data.ok()) return data.status();
    w->data_ = std::move(*data);
  }
  w->state_ = std::make_unique<ModelState>();
  w->upload_limiter_ = std::make_unique<RateLimiter>(w->options_.upload_rate_mbps * 1e6 / 8);
  PeerServiceOptions popts;
  popts.clock = w->clock_;
  popts.gate = w->options_.gate;
  popts.max_reads_per_peer = w->options_.max_reads_per_peer;
  popts.members = &w->members_;
  w->peer_service_ =
      std::make_unique<PeerService>(w->state_.get(), w->upload_limiter_.get(), popts);
  w->encoded_store_ = std::make_unique<EncodedStore>();
  w->peer_service_->set_encoded_store(w->encoded_store_.get());
  w->peer_service_->set_gossip_board(&w->gossip_board_);
  // Until the model's size is known, room for a small model's pushes.
  w->push_box_ = std::make_unique<PushBox>(uint64_t{64} << 20, w->clock_);
  w->peer_service_->set_push_box(w->push_box_.get());
  // Idle (no thread busy, no stream) until members of its zone use it.
  RelayFrontendOptions ropts;
  ropts.coordinator = MakeChannel(FirstAddress(w->options_.coordinator));
  for (absl::string_view address :
       absl::StrSplit(w->options_.coordinator, ',', absl::SkipWhitespace())) {
    // Replicas: the Relay stream follows the leader (docs/SUPERNODES.md).
    ropts.replicas.emplace_back(std::string(address), MakeChannel(std::string(address)));
  }
  if (ropts.replicas.size() < 2) ropts.replicas.clear();
  ropts.gate = w->options_.gate;
  ropts.members = &w->members_;
  ropts.call_timeout = w->options_.rpc_timeout;
  w->relay_frontend_ = std::make_unique<RelayFrontend>(ropts);
  auto server =
      GrpcServer::Start(w->options_.listen, {w->peer_service_.get(), w->relay_frontend_.get()});
  if (!server.ok()) return server.status();
  w->server_ = std::move(*server);
  if (!w->options_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Start(w->options_.metrics_listen);
    if (!metrics.ok()) return metrics.status();
    w->metrics_ = std::move(*metrics);
    M();  // every series is listed from the first scrape on
    SHOAL_LOG(INFO) << "metrics on " << w->metrics_->address();
  }
  w->advertise_ = w->options_.advertise.empty() ? w->server_->address() : w->options_.advertise;
  w->identity_.advertise = w->advertise_;
  w->identity_.name = w->options_.name;
  w->identity_.zone = w->options_.zone;
  w->identity_.outbound_only = w->options_.outbound_only;
  w->identity_.replay_fingerprint = ReplayFingerprint(w->options_.build);
  if (const std::optional<std::string>& step = w->options_.replay_step; step.has_value()) {
    w->identity_.replay_fingerprint =
        step->empty() ? std::string() : absl::StrCat(w->identity_.replay_fingerprint, " ", *step);
  }
  w->peers_ = std::make_unique<GrpcPeerClient>(&w->credential_);
  if (w->options_.coordinator_client != nullptr) {
    w->coordinator_ = w->options_.coordinator_client;
  } else {
    CoordinatorClientOptions copts;
    copts.address = w->options_.coordinator;
    copts.rpc_timeout = w->options_.rpc_timeout;
    copts.retry_window = w->options_.connect_timeout;
    copts.stop = &w->stop_token_;
    w->coordinator_ = std::make_shared<RoutedCoordinatorClient>(copts, &w->credential_);
  }
  if (w->options_.exchange.clock == nullptr) w->options_.exchange.clock = w->clock_;
  if (w->options_.sync.clock == nullptr) w->options_.sync.clock = w->clock_;
  Worker* self = w.get();
  w->stop_token_.Register([self] {
    WorkerEvent stop;
    stop.kind = WorkerEvent::kStop;
    self->Push(std::move(stop));
  });
  if (w->options_.stop != nullptr) {
    w->stop_registration_ = w->options_.stop->Register([self] { self->stop_token_.Cancel(); });
  }
  return w;
}

Worker::~Worker() {
  if (options_.stop != nullptr) options_.stop->Unregister(stop_registration_);
  stop_token_.Cancel();
  if (coordinator_) EndOwnSession();
  if (relay_frontend_) relay_frontend_->Shutdown();  // its members go direct
  if (state_) state_->SetShuttingDown();
  if (server_) server_->Shutdown(absl::Seconds(1));
  // The runner's transfers in flight (cancelled with the stop token) end
  // before the memory they use goes.
  runner_.reset();
  if (local_) local_->Stop();  // the steps ahead end after their current one
  averaging_.reset();
  codec_.reset();
  memory_.reset();  // waits for (or leaks) the snapshot's lent chunks
  // The parameters belong to the trainer; gRPC may still hold slices
  // pointing into them for a moment after the shutdown.
  if (state_ && !state_->AwaitReturned(ModelState::Buffer::kParameters, kLentChunksTimeout)) {
    SHOAL_LOG(ERROR) << "gRPC still holds model memory lent to peers; leaking the model instead "
                        "of freeing memory it may read";
    (void)trainer_.release();
    (void)local_.release();  // holds the parameters gRPC may read
    (void)state_.release();
  }
  local_.reset();  // before stop_token_, its stop's parent
}

absl::Status Worker::Run() {
  SHOAL_LOG(INFO) << "peer service on " << server_->address() << ", advertised as " << advertise_
                  << "; joining coordinator " << options_.coordinator;
  // The first join: the run's configuration (and so the mode) comes with
  // its answer, which builds the model and the mode's runner.
  if (std::optional<absl::Status> exit = Join(NewJoinRequest(identity_))) {
    // Stopped after the coordinator took the join (while the model was
    // built or the session opened): say goodbye, so that the status reads
    // "left", not "lost" once the session grace runs out.
    if (StopRequested() && !worker_id_.empty()) Leave("worker shut down");
    return *exit;
  }
  if (runner_ == nullptr) return absl::OkStatus();  // stopped before the first join
  absl::Status s = runner_->Run();
  // Nothing trains after Run(): the trainer's model becomes the agreed one
  // (a Python loop reads its module next).
  if (local_) local_->Stop();
  return s;
}

bool Worker::StopRequested() const { return stop_token_.cancelled(); }

std::string Worker::StopReason() const {
  absl::MutexLock lock(&mu_);
  return stop_reason_;
}

void Worker::SetStopReason(std::string reason) {
  absl::MutexLock lock(&mu_);
  if (!reason.empty()) stop_reason_ = std::move(reason);
}

void Worker::Push(WorkerEvent event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
}

bool Worker::PopEvent(WorkerEvent* event, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto has_event = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The end of a session queued before this worker re-joined is news of
    // nothing (the session it has now is another).
    while (!events_.empty() && events_.front().kind == WorkerEvent::kSessionClosed &&
           events_.front().session != session_gen_.load()) {
      events_.pop_front();
    }
    return !events_.empty();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&has_event), timeout)) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  if (event->kind == WorkerEvent::kMessage && RouteDirective(event->message).interrupts) {
    --unhandled_interrupts_;
  }
  return true;
}

void Worker::OnSessionMessage(const shoal::v1::CoordinatorMessage& msg) {
  const DirectiveRoute route = RouteDirective(msg);
  if (route.upload_grant && store_ != nullptr) {
    store_->SetUploadGrant(msg.checkpoint_request().upload_grant());
  }
  if (route.use_relay)
    coordinator_->UseRelay(msg.use_relay().relay_id(), msg.use_relay().address());
  if (route.member_update) members_.Apply(msg.member_update());
  if (!route.to_runner) return;
  WorkerEvent event;
  event.kind = WorkerEvent::kMessage;
  event.message = msg;
  absl::MutexLock lock(&mu_);
  if (route.interrupts) {
    // A running exchange hears it at once, not when the runner pops it.
    ++unhandled_interrupts_;
    if (interruptible_ != nullptr) interruptible_->Cancel();
  }
  events_.push_back(std::move(event));
}

void Worker::SetInterruptible(CancellationToken* token) {
  absl::MutexLock lock(&mu_);
  // A directive that interrupts this work may already be queued.
  if (token != nullptr && unhandled_interrupts_ > 0) token->Cancel();
  interruptible_ = token;
}

void Worker::FillHeartbeat(shoal::v1::Heartbeat* hb) {
  {
    absl::MutexLock lock(&report_mu_);
    if (report_.has_value()) {
      const int64_t sent = hb->sent_unix_ms();
      *hb = *report_;
      hb->set_sent_unix_ms(sent);
    }
  }
  for (std::string& address : bad_chunks_.Take()) hb->add_bad_chunks_from(std::move(address));
  if (!sync_progress_.syncing.load()) return;
  hb->set_syncing(true);
  hb->set_sync_bytes_done(sync_progress_.bytes_done.load());
  hb->set_sync_bytes_total(sync_progress_.bytes_total.load());
  hb->set_sync_sources(sync_progress_.sources.load());
}

void Worker::SetHeartbeatReport(const shoal::v1::Heartbeat& report) {
  absl::MutexLock lock(&report_mu_);
  report_ = report;
}

bool Worker::SendHeartbeatNow(absl::Duration timeout) {
  return coordinator_->SendHeartbeatNow(timeout);
}

void Worker::CountServedBytes() {
  if (metrics_ == nullptr) return;
  const PeerSentBytes& sent = peer_service_->sent();
  const uint64_t now[3] = {sent.exchange.load(std::memory_order_relaxed),
                           sent.snapshot.load(std::memory_order_relaxed),
                           sent.model_file.load(std::memory_order_relaxed)};
  const MetricCounter* counters[3] = {&M().sent_exchange, &M().sent_snapshot, &M().sent_model_file};
  for (int i = 0; i < 3; ++i) {
    counters[i]->Add(static_cast<double>(now[i] - sent_reported_[i]));
    sent_reported_[i] = now[i];
  }
}

absl::Status Worker::OpenSession() {
  const absl::Duration heartbeat = absl::Milliseconds(std::max<uint32_t>(100, heartbeat_ms_));
  const uint64_t gen = session_gen_.fetch_add(1) + 1;
  absl::Status opened = coordinator_->OpenSession(
      worker_id_, heartbeat,
      [this](const shoal::v1::CoordinatorMessage& msg) { OnSessionMessage(msg); },
      [this, gen](const absl::Status& status) {
        if (session_gen_.load() != gen) return;  // closed or replaced by this worker
        WorkerEvent closed;
        closed.kind = WorkerEvent::kSessionClosed;
        closed.status = status;
        closed.session = gen;
        Push(std::move(closed));
      },
      [this](shoal::v1::Heartbeat* hb) { FillHeartbeat(hb); });
  if (!opened.ok()) EndOwnSession();
  return opened;
}

absl::Status Worker::JoinRound(uint64_t carried_round) {
  absl::StatusOr<uint64_t> admitted = coordinator_->JoinRound(worker_id_, 0, carried_round);
  if (!admitted.ok()) {
    EndOwnSession();
    return admitted.status();
  }
  SHOAL_LOG(INFO) << "admitted to round " << *admitted
                  << (carried_round != 0 ? absl::StrCat(" (carrying the trained work of round ",
                                                        carried_round, ")")
                                         : std::string());
  return absl::OkStatus();
}

void Worker::EndOwnSession() {
  session_gen_.fetch_add(1);
  coordinator_->CloseSession();
}

void Worker::CloseSession() { EndOwnSession(); }

void Worker::Leave(const std::string& reason) {
  state_->SetShuttingDown();
  coordinator_->Leave(worker_id_, reason).IgnoreError();
  EndOwnSession();
}

std::optional<absl::Status> Worker::Join(const shoal::v1::JoinRequest& first) {
  // The coordinator may be restarting: keep trying (capped, jittered
  // backoff) for as long as the worker runs; the first join gives up after
  // --connect_timeout (the client's own retry window).
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(200);
  policy.max_backoff = absl::Seconds(5);
  policy.clock = clock_;
  const bool rejoin = runner_ != nullptr && runner_->joined();
  policy.deadline = absl::InfiniteDuration();
  if (!rejoin) {
    policy.max_attempts = 1;  // the client retries UNAVAILABLE for --connect_timeout
  } else {
    // NOT_FOUND: a restarted coordinator has not seen this worker yet;
    // FAILED_PRECONDITION: it is not accepting joins yet.
    policy.also_retry = {absl::StatusCode::kNotFound, absl::StatusCode::kFailedPrecondition};
  }
  std::optional<absl::Status> exit;
  absl::Time next_log = clock_->Now();
  bool first_attempt = true;
  // The first join builds the model between Join and opening the session;
  // on a loaded machine that can outlast the coordinator's session grace
  // (its --heartbeat_lease), which then forgets the worker (NOT_FOUND).
  // The model is built by then, so one more join opens the session at once.
  bool session_lost_to_build = false;
  absl::Status s;
  for (int pass = 0; pass < 2; ++pass) {
    s = Retry(
        policy, &stop_token_,
        [&](absl::Duration) -> absl::Status {
          // What this worker holds may have changed since the last attempt.
          shoal::v1::JoinRequest request =
              first_attempt || runner_ == nullptr ? first : runner_->JoinRequest();
          first_attempt = false;
          AddDeclaration(&request);
          absl::StatusOr<shoal::v1::JoinResponse> joined = JoinOnce(request);
          if (!joined.ok()) return joined.status();
          const bool first_join = runner_ == nullptr;
          if (first_join) {
            // The model is built from the first answer; the run learns its
            // layout from this worker unless a member declared one.
            AcceptJoin(*joined);
            RETURN_IF_ERROR(BuildModel(*joined));
            RETURN_IF_ERROR(DeclareModel(&*joined));
          }
          if (!first_join) {
            AcceptJoin(*joined);
            SHOAL_LOG(INFO) << "re-joined run " << joined->run_id() << " as "
                            << joined->worker_id();
          }
          absl::Status opened = runner_->OnJoined(*joined, &exit);
          if (!opened.ok()) session_lost_to_build = first_join && absl::IsNotFound(opened);
          return opened;
        },
        [&](const absl::Status& failed, int) {
          if (clock_->Now() >= next_log) {
            SHOAL_LOG(WARNING) << "re-join failed, retrying: " << failed.message();
            next_log = clock_->Now() + absl::Seconds(10);
          }
          EndOwnSession();
        });
    if (exit.has_value() || s.ok() || !session_lost_to_build || pass > 0) break;
    SHOAL_LOG(WARNING) << "the coordinator forgot this worker while it built the model ("
                       << s.message() << "); joining again";
    session_lost_to_build = false;
  }
  if (exit.has_value()) return exit;
  if (absl::IsCancelled(s)) return absl::OkStatus();  // stopped while re-joining
  if (!s.ok()) return s;
  return std::nullopt;
}

absl::StatusOr<shoal::v1::JoinResponse> Worker::JoinOnce(const shoal::v1::JoinRequest& request) {
  absl::StatusOr<shoal::v1::JoinResponse> joined = coordinator_->Join(request);
  if (joined.ok()) return joined;
  return absl::Status(
      joined.status().code(),
      absl::StrCat("cannot join the run at coordinator ", options_.coordinator, ": ",
                   joined.status().message(),
                   absl::IsUnavailable(joined.status()) || absl::IsDeadlineExceeded(joined.status())
                       ? " (is the coordinator running, and is --coordinator its address and "
                         "port?)"
                       : ""));
}

void Worker::AcceptJoin(const shoal::v1::JoinResponse& joined) {
  SetLogTag(options_.name.empty()
                ? absl::StrCat("worker ", joined.worker_id())
                : absl::StrCat("worker ", joined.worker_id(), " (", options_.name, ")"));
  worker_id_ = joined.worker_id();
  outbound_only_ = joined.outbound_only();
  if (outbound_only_) {
    SHOAL_LOG(INFO) << "outbound connections only (" << joined.outbound_reason()
                    << "): this worker pushes its contributions";
  }
  if (!joined.member_credential().empty()) {
    // The run checks members: send this credential to peers, and serve only
    // current members from now on.
    credential_.Set(joined.worker_id(), joined.member_credential());
    members_.Enable();
  }
  // The RelayHello of the stream it opens if members use it.
  relay_frontend_->SetRelayId(joined.worker_id());
  state_->SetWorkerId(joined.worker_id());
}

void Worker::AddDeclaration(shoal::v1::JoinRequest* request) const {
  if (trainer_ != nullptr) request->set_train_samples(trainer_->train_samples());
  if (layout_.has_value()) {
    *request->mutable_layout() = *layout_;
  } else if (options_.layout.has_value()) {  // the first join of a Python worker
    *request->mutable_layout() = *options_.layout;
    request->set_initial_model_hash(options_.initial_model_hash);
    request->set_train_samples(options_.train_samples);
  }
}

absl::Status Worker::DeclareModel(shoal::v1::JoinResponse* joined) {
  layout_ = LayoutOf(trainer_->layers());
  if (joined->has_layout()) {
    // Declared by a member (maybe this worker, at this join): the run's.
    return CompareLayouts(joined->layout(), *layout_, "as the coordinator recorded it");
  }
  // The first member to declare: join once more, with the layout and the
  // initial model (the same id; the coordinator records both).
  shoal::v1::JoinRequest declare = NewJoinRequest(identity_);
  declare.set_previous_worker_id(joined->worker_id());
  declare.set_previous_data_rank(joined->data_rank());
  *declare.mutable_layout() = *layout_;
  declare.set_initial_model_hash(HashParameters(trainer_->parameters(), trainer_->num_elements()));
  declare.set_train_samples(trainer_->train_samples());
  absl::StatusOr<shoal::v1::JoinResponse> again = JoinOnce(declare);
  if (!again.ok()) return again.status();
  if (again->config().SerializeAsString() != joined->config().SerializeAsString()) {
    return absl::UnavailableError("the run changed while this worker declared its model");
  }
  if (again->worker_id() != joined->worker_id()) {
    // The coordinator let the first id go while the model was fetched and
    // built (longer than its --heartbeat_lease without a session: a large
    // model file over a slow link). The model is the run's all the same;
    // only a different data rank would make it another worker's.
    if (again->data_rank() != joined->data_rank()) {
      return absl::UnavailableError(
          absl::StrCat("the coordinator forgot this worker (", joined->worker_id(),
                       ") while it built the model and gave it another data rank (",
                       again->data_rank(), ", not ", joined->data_rank(), "); start it again"));
    }
    SHOAL_LOG(WARNING) << "the coordinator forgot " << joined->worker_id()
                       << " while this worker fetched and built the model (longer than the run's "
                          "heartbeat lease without a session); it is "
                       << again->worker_id() << " now, with the same data rank";
  }
  *joined = std::move(*again);
  AcceptJoin(*joined);
  if (joined->has_layout())
    return CompareLayouts(joined->layout(), *layout_, "as the coordinator recorded it");
  return absl::OkStatus();
}

absl::Status Worker::BuildModel(const shoal::v1::JoinResponse& joined) {
  const shoal::v1::RunConfig& config = joined.config();
  TrainerOptions topts;
  topts.config = config;
  topts.data_rank = joined.data_rank();
  topts.threads = options_.torch_threads;
  topts.eval_limit = options_.eval_limit;
  topts.stop = &stop_token_;
  if ((config.exchange().overlap() || config.exchange().fragments() > 1) && !IsGossipMode(config)) {
    local_ = std::make_unique<LocalTraining>(&stop_token_, config.exchange().overlap(), clock_,
                                             AheadOptionsOf(config.exchange()));
    topts.stop = local_->stop();
  }
  if (config.model().name() == "torchscript" && !options_.make_trainer) {
    absl::StatusOr<std::string> file = FetchRunModelFile(joined);
    if (!file.ok()) return file.status();
    topts.model_file = std::move(*file);
  }
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      options_.make_trainer ? options_.make_trainer(topts) : Trainer::Create(topts, &data_);
  if (!trainer.ok()) return trainer.status();
  absl::StatusOr<DataSplit> split = ParseDataSplit(config.training().data_split());
  if (!split.ok()) return split.status();
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(config.exchange().codec());
  if (!codec.ok()) return codec.status();
  trainer_ = std::move(*trainer);
  codec_ = std::move(*codec);
  // Gossip publications are encoded in it (docs/GOSSIP.md, "Compressed
  // pulls").
  gossip_board_.SetCodec(codec_.get());
  if (!topts.model_file.empty()) {
    // Workers joining later read it from here rather than the coordinator.
    peer_service_->SetModelFile(std::move(topts.model_file), config.model().file_sha256());
  }
  const uint64_t n = trainer_->num_elements();
  // What the round protocol, the exchange and the peers use: the trainer's
  // buffer, or (a local model) a buffer apart from it.
  float* params =
      local_ != nullptr ? local_->Bind(trainer_.get(), state_.get()) : trainer_->parameters();
  state_->Bind(params, n, config.model().name());
  // Peers catching up pull (and verify) the model layer by layer.
  std::vector<LayerSpan> spans;
  for (const LayerInfo& l : trainer_->layers()) spans.push_back({l.name, l.offset, l.elements});
  if (absl::Status ls = state_->SetLayers(std::move(spans)); !ls.ok()) {
    SHOAL_LOG(WARNING) << "layer table refused: " << ls.message();
  }
  const std::string hash = HashParameters(params, n);
  memory_ = std::make_unique<ModelMemory>(state_.get(), params, n, hash);
  // Pushes from behind NAT (contributions, gossip models): at most the
  // current and the next round's, each at most the whole model (8 bytes an
  // element for encodings).
  push_box_->SetMaxBytes(2 * 8 * n + (uint64_t{16} << 20));
  if (store_ == nullptr && !config.checkpoints().store().empty()) {
    checkpoint::CheckpointClientOptions store_options;
    store_options.stop = &stop_token_;  // SIGTERM cancels an upload in flight
    store_ = std::make_unique<checkpoint::GrpcCheckpointClient>(config.checkpoints().store(),
                                                                store_options);
  }
  heartbeat_ms_ = config.timeouts().heartbeat_interval_ms();
  std::string averaging = absl::StrCat("gossip, pulls ", codec_->name());
  if (IsGossipMode(config)) {
    runner_ = std::make_unique<GossipRunner>(static_cast<RunnerHost*>(this), Parts());
  } else {
    AveragerDeps deps;
    deps.codec = codec_.get();
    deps.peers = peers_.get();
    deps.state = state_.get();
    deps.encoded_store = encoded_store_.get();
    deps.push_box = push_box_.get();
    deps.snapshot = memory_->snapshot();
    deps.elements = n;
    deps.exchange = options_.exchange;
    deps.exchange.bad_chunks = &bad_chunks_;
    absl::StatusOr<std::unique_ptr<Averaging>> made = MakeAverager(config, deps);
    if (!made.ok()) return made.status();
    averaging_ = std::move(*made);
    averaging = averaging_->Describe(config);
    runner_ = std::make_unique<SyncRunner>(static_cast<RunnerHost*>(this), Parts(), hash);
  }
  Metrics::SetRunInfo(joined.run_id());
  SHOAL_LOG(INFO) << "joined run " << joined.run_id() << " as " << joined.worker_id()
                  << " data_rank=" << joined.data_rank() << " shard=" << trainer_->shard_size()
                  << " images, model=" << config.model().name() << " (" << n << " parameters, hash "
                  << hash.substr(0, 12) << "), averaging " << averaging;
  if (options_.make_trainer) return absl::OkStatus();  // the data is the caller's
  SHOAL_LOG(INFO) << "data split "
                  << (config.training().data_split().empty() ? "iid"
                                                             : config.training().data_split())
                  << " shard "
                  << joined.data_rank() % std::max<uint32_t>(1, config.training().data_shards())
                  << "/" << std::max<uint32_t>(1, config.training().data_shards()) << " (seed "
                  << config.training().seed()
                  << "): " << LabelCountsSummary(trainer_->shard_label_counts());
  return absl::OkStatus();
}

RunnerParts Worker::Parts() {
  RunnerParts p;
  p.options = &options_;
  p.clock = clock_;
  p.identity = identity_;
  p.stop = &stop_token_;
  p.coordinator = coordinator_.get();
  p.peers = peers_.get();
  p.state = state_.get();
  p.memory = memory_.get();
  p.trainer = trainer_.get();
  p.store = store_.get();
  p.push_box = push_box_.get();
  p.board = &gossip_board_;
  p.outbound_only = outbound_only_;
  p.codec = codec_.get();
  p.averaging = averaging_.get();
  p.sync_progress = &sync_progress_;
  p.local = local_.get();
  return p;
}

absl::StatusOr<std::string> Worker::FetchRunModelFile(const shoal::v1::JoinResponse& joined) {
  const shoal::v1::RunConfig& c = joined.config();
  // Members that hold the file (they opened their session after verifying
  // it), else members that hold the model (so the file too).
  std::vector<std::string> holders;
  for (const auto* list : {&joined.model_file_holders(), &joined.holders()}) {
    for (const std::string& h : *list) {
      if (h != advertise_ && std::find(holders.begin(), holders.end(), h) == holders.end()) {
        holders.push_back(h);
      }
    }
    if (!holders.empty()) break;
  }
  std::shuffle(holders.begin(), holders.end(), std::mt19937(std::random_device{}()));
  if (holders.size() > 3) holders.resize(3);
  const absl::Duration timeout = options_.rpc_timeout;
  std::vector<ModelFileSource> sources;
  for (const std::string& h : holders) {
    auto stub = std::shared_ptr<shoal::v1::Peer::Stub>(shoal::v1::Peer::NewStub(MakeChannel(h)));
    const MemberCredentialHolder* credential = &credential_;
    sources.push_back({absl::StrCat("peer ", h),
                       [stub, timeout, credential](const shoal::v1::GetModelFileRequest& r)
                           -> absl::StatusOr<shoal::v1::ModelFileChunk> {
                         // Right after Join the peer may not have heard of
                         // this worker's credential yet (UNAVAILABLE): retry
                         // that for a second before the next source.
                         RetryPolicy policy;
                         policy.initial_backoff = absl::Milliseconds(10);
                         policy.max_backoff = absl::Milliseconds(200);
                         policy.deadline = std::min(timeout, absl::Seconds(1));
                         policy.unavailable_only = true;
                         shoal::v1::ModelFileChunk out;
                         absl::Status s = Retry(policy, nullptr, [&](absl::Duration) {
                           grpc::ClientContext ctx;
                           ctx.set_deadline(DeadlineIn(timeout));
                           AddMemberCredential(*credential, &ctx);
                           return FromGrpcStatus(stub->GetModelFile(&ctx, r, &out));
                         });
                         if (!s.ok()) return s;
                         return out;
                       }});
  }
  auto coord = std::shared_ptr<shoal::v1::Coordinator::Stub>(
      shoal::v1::Coordinator::NewStub(MakeChannel(options_.coordinator)));
  sources.push_back({absl::StrCat("coordinator ", options_.coordinator),
                     [coord, timeout](const shoal::v1::GetModelFileRequest& r)
                         -> absl::StatusOr<shoal::v1::ModelFileChunk> {
                       grpc::ClientContext ctx;
                       ctx.set_deadline(DeadlineIn(timeout));
                       shoal::v1::ModelFileChunk out;
                       grpc::Status s = coord->GetModelFile(&ctx, r, &out);
                       if (!s.ok()) return FromGrpcStatus(s);
                       return out;
                     }});
  const absl::Time start = clock_->Now();
  uint64_t next_log = 16u << 20;
  auto progress = [&](uint64_t done, uint64_t total, const std::string& from) {
    if (done < next_log && done < total) return;
    next_log = done + (16u << 20);
    const double secs = std::max(1e-3, absl::ToDoubleSeconds(clock_->Now() - start));
    const double rate = done / secs;
    SHOAL_LOG(INFO) << absl::StrFormat(
        "model file: %.1f of %.1f MiB from %s, %.1f MiB/s, %.0f s left", done / 1048576.0,
        total / 1048576.0, from, rate / 1048576.0, (total - done) / std::max(rate, 1.0));
  };
  absl::StatusOr<FetchedModelFile> file =
      FetchModelFile(sources, c.model().file_sha256(), c.model().file_bytes(), progress);
  if (!file.ok()) return file.status();
  SHOAL_LOG(INFO) << "model file " << c.model().file_sha256().substr(0, 12) << " ("
                  << file->bytes.size() << " bytes) from " << file->source << ", SHA-256 verified";
  return std::move(file->bytes);
}

absl::Status Worker::WritePredictions(const std::string& path, int64_t n) {
  if (trainer_ == nullptr) return absl::FailedPreconditionError("no model was built");
  const std::vector<Trainer::Prediction> predictions = trainer_->Predict(n);
  std::string text = absl::StrCat("# shoal-worker predictions: model round ",
                                  runner_ != nullptr ? runner_->model_round() : 0, " hash ",
                                  HashParameters(memory_->parameters(), memory_->total()),
                                  "\n# index label predicted\n");
  for (size_t i = 0; i < predictions.size(); ++i) {
    absl::StrAppend(&text, i, " ", predictions[i].label, " ", predictions[i].predicted, "\n");
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  SHOAL_LOG(INFO) << "wrote the predictions of " << predictions.size() << " test images to "
                  << path;
  return absl::OkStatus();
}

}  // namespace shoal::worker
