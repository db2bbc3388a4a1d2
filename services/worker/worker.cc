#include "services/worker/worker.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/member_credentials_grpc.h"
#include "common/model_file.h"
#include "common/retry.h"
#include "common/run_options.h"
#include "common/sha256.h"
#include "common/signals.h"
#include "common/status_util.h"
#include "common/tensor_wire.h"
#include "services/worker/core/data_split.h"
#include "services/worker/core/dataset.h"
#include "services/worker/core/gossip_policy.h"
#include "services/worker/core/transfer_checks.h"
#include "services/worker/gossip_checkpointer.h"
#include "services/worker/gossip_fetcher.h"
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

WorkerProtocol::Options ProtocolOptions(const WorkerOptions& options, const std::string& advertise,
                                        const Clock* clock) {
  WorkerProtocol::Options p;
  p.advertise = advertise;
  p.name = options.name;
  p.zone = options.zone;
  p.outbound_only = options.outbound_only;
  p.clock = clock;
  return p;
}

// The worker's Prometheus series, updated once per action (never per chunk:
// the exchange's hot path stays free of metric calls).
struct WorkerMetrics {
  MetricHistogram train_seconds = Metrics::Histogram(
      "shoal_train_duration_seconds", "Local training of one round (all its local steps).",
      Metrics::SecondsBuckets());
  MetricGauge train_loss =
      Metrics::Gauge("shoal_train_loss", "Mean training loss of this worker's latest round.");
  MetricGauge test_accuracy = Metrics::Gauge(
      "shoal_test_accuracy", "Test accuracy (0..1) of the averaged model, latest evaluation.");
  MetricGauge test_loss =
      Metrics::Gauge("shoal_test_loss", "Test loss of the averaged model, latest evaluation.");
  MetricGauge model_round =
      Metrics::Gauge("shoal_worker_round", "Round of the latest exchange this worker reported.");
  MetricHistogram exchange_seconds = Metrics::Histogram(
      "shoal_exchange_duration_seconds",
      "A successful sharded exchange (reduce-scatter and all-gather) of one round.",
      Metrics::SecondsBuckets());
  MetricCounter exchanges_ok =
      Metrics::Counter("shoal_exchanges_total", "Exchanges by result.", {{"result", "ok"}});
  MetricCounter exchanges_failed =
      Metrics::Counter("shoal_exchanges_total", "Exchanges by result.", {{"result", "error"}});
  MetricCounter received_bytes = Metrics::Counter("shoal_exchange_received_bytes_total",
                                                  "Model bytes received from peers in exchanges.");
  MetricCounter sent_exchange = Metrics::Counter(
      "shoal_peer_sent_bytes_total",
      "Model bytes this worker served to peers (written to their streams), by what was read.",
      {{"kind", "exchange"}});
  MetricCounter sent_snapshot = Metrics::Counter(
      "shoal_peer_sent_bytes_total",
      "Model bytes this worker served to peers (written to their streams), by what was read.",
      {{"kind", "snapshot"}});
  MetricCounter sent_model_file = Metrics::Counter(
      "shoal_peer_sent_bytes_total",
      "Model bytes this worker served to peers (written to their streams), by what was read.",
      {{"kind", "model_file"}});
  MetricCounter retries = Metrics::Counter("shoal_exchange_retries_total",
                                           "Slice reads retried (resumed) during exchanges.");
  MetricHistogram catchup_seconds = Metrics::Histogram(
      "shoal_catchup_duration_seconds",
      "A catch-up (late join or missed round): the model pulled from peers or the store.",
      Metrics::SecondsBuckets());
  MetricCounter catchup_bytes = Metrics::Counter("shoal_catchup_received_bytes_total",
                                                 "Model bytes pulled by successful catch-ups.");
  MetricCounter catchups_ok =
      Metrics::Counter("shoal_catchups_total", "Catch-ups by result.", {{"result", "ok"}});
  MetricCounter catchups_failed =
      Metrics::Counter("shoal_catchups_total", "Catch-ups by result.", {{"result", "error"}});
  MetricHistogram upload_seconds = Metrics::Histogram(
      "shoal_checkpoint_upload_duration_seconds",
      "A checkpoint upload by this worker to the store.", Metrics::SecondsBuckets());
  MetricCounter uploads_ok =
      Metrics::Counter("shoal_checkpoint_uploads_total",
                       "Checkpoint uploads by this worker, by result.", {{"result", "ok"}});
  MetricCounter uploads_failed =
      Metrics::Counter("shoal_checkpoint_uploads_total",
                       "Checkpoint uploads by this worker, by result.", {{"result", "error"}});
};

const WorkerMetrics& M() {
  static const WorkerMetrics* m = new WorkerMetrics();
  return *m;
}

}  // namespace

Worker::Worker(Options options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      protocol_(WorkerProtocol::Options{}) {}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(Options options) {
  std::unique_ptr<Worker> w(new Worker(std::move(options)));
  absl::StatusOr<FashionMnist> data = LoadDataset(w->options_.dataset, w->options_.data_dir);
  if (!data.ok()) return data.status();
  w->data_ = std::move(*data);
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
  w->protocol_ = WorkerProtocol(ProtocolOptions(w->options_, w->advertise_, w->clock_));
  w->peers_ = std::make_unique<GrpcPeerClient>(&w->credential_);
  CoordinatorClientOptions copts;
  copts.address = w->options_.coordinator;
  copts.rpc_timeout = w->options_.rpc_timeout;
  copts.retry_window = w->options_.connect_timeout;
  w->coordinator_ = std::make_unique<RoutedCoordinatorClient>(copts, &w->credential_);
  if (w->options_.exchange.clock == nullptr) w->options_.exchange.clock = w->clock_;
  if (w->options_.sync.clock == nullptr) w->options_.sync.clock = w->clock_;
  Worker* self = w.get();
  w->stop_token_.Register([self] {
    absl::MutexLock lock(&self->mu_);
    self->events_.push_back({Event::kStop, {}, absl::OkStatus()});
  });
  if (w->options_.stop != nullptr) {
    w->stop_registration_ = w->options_.stop->Register([self] { self->stop_token_.Cancel(); });
  }
  return w;
}

Worker::~Worker() {
  if (options_.stop != nullptr) options_.stop->Unregister(stop_registration_);
  stop_token_.Cancel();
  if (coordinator_) coordinator_->CloseSession();
  if (relay_frontend_) relay_frontend_->Shutdown();  // its members go direct
  if (state_) state_->SetShuttingDown();
  if (server_) server_->Shutdown(absl::Seconds(1));
  averager_.reset();
  memory_.reset();  // waits for (or leaks) the snapshot's lent chunks
  // The parameters belong to the trainer; gRPC may still hold slices
  // pointing into them for a moment after the shutdown.
  if (state_ && !state_->AwaitReturned(ModelState::Buffer::kParameters, kLentChunksTimeout)) {
    SHOAL_LOG(ERROR) << "gRPC still holds model memory lent to peers; leaking the model instead "
                        "of freeing memory it may read";
    (void)trainer_.release();
    (void)state_.release();
  }
}

bool Worker::StopRequested() const { return stop_token_.cancelled(); }

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
  if (event->kind == Event::kMessage && WorkerProtocol::Interrupts(event->message)) {
    --unhandled_interrupts_;
  }
  return true;
}

absl::Status Worker::BuildModel(const shoal::v1::JoinResponse& joined) {
  TrainerOptions topts;
  topts.config = joined.config();
  topts.data_rank = joined.data_rank();
  topts.threads = options_.torch_threads;
  topts.eval_limit = options_.eval_limit;
  if (joined.config().model().name() == "torchscript") {
    absl::StatusOr<std::string> file = FetchRunModelFile(joined);
    if (!file.ok()) return file.status();
    topts.model_file = std::move(*file);
  }
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(topts, &data_);
  if (!trainer.ok()) return trainer.status();
  const shoal::v1::RunConfig& config = joined.config();
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(config.exchange().codec());
  if (!codec.ok()) return codec.status();
  absl::StatusOr<OuterOptimizer> outer_kind =
      ParseOuterOptimizer(config.exchange().outer_optimizer().kind());
  if (!outer_kind.ok()) return outer_kind.status();
  absl::StatusOr<DataSplit> split = ParseDataSplit(config.training().data_split());
  if (!split.ok()) return split.status();
  absl::StatusOr<AggregationSpec> aggregation = ParseAggregation(config.exchange().aggregation());
  if (!aggregation.ok()) return aggregation.status();
  trainer_ = std::move(*trainer);
  codec_ = std::move(*codec);
  gossip_board_.SetCodec(codec_.get());
  if (!topts.model_file.empty()) {
    // Workers joining later read it from here rather than the coordinator.
    peer_service_->SetModelFile(std::move(topts.model_file), joined.config().model().file_sha256());
  }
  const uint64_t n = trainer_->num_elements();
  state_->Bind(trainer_->parameters(), n, joined.config().model().name());
  // Peers catching up pull (and verify) the model layer by layer.
  std::vector<LayerSpan> spans;
  for (const LayerInfo& l : trainer_->layers()) spans.push_back({l.name, l.offset, l.elements});
  if (absl::Status ls = state_->SetLayers(std::move(spans)); !ls.ok()) {
    SHOAL_LOG(WARNING) << "layer table refused: " << ls.message();
  }
  const std::string hash = HashParameters(trainer_->parameters(), n);
  memory_ = std::make_unique<ModelMemory>(state_.get(), trainer_->parameters(), n, hash);
  OuterOptions oopts;
  oopts.kind = *outer_kind;
  oopts.lr = static_cast<float>(config.exchange().outer_optimizer().lr());
  oopts.momentum = static_cast<float>(config.exchange().outer_optimizer().momentum());
  outer_ = std::make_unique<OuterStep>(oopts, n);
  // What travels (exchanger.h): the round's change when the run has a codec
  // or an outer optimizer, else the model itself.
  const bool encoded = !codec_->raw() || *outer_kind != OuterOptimizer::kNone;
  ExchangeParts parts;
  parts.codec = codec_.get();
  parts.store = encoded_store_.get();
  parts.outer = outer_.get();
  parts.base = memory_->snapshot();
  if (encoded) {
    encoded_parts_ = parts;
    PublishOuterState(0);
  }
  ExchangeOptions exchange = options_.exchange;
  exchange.aggregation = *aggregation;
  // Pushes from behind NAT: at most the current and the next round's, each
  // at most the whole model (8 bytes an element for encodings).
  push_box_->SetMaxBytes(2 * 8 * n + (uint64_t{16} << 20));
  exchange.push_box = push_box_.get();
  // One pipeline for every plan: flat or hierarchical, any codec.
  averager_ = std::make_unique<Exchanger>(peers_.get(), state_.get(), exchange, parts);
  protocol_.SetInitialModel(hash);
  SHOAL_LOG(INFO) << "joined run " << joined.run_id() << " as " << joined.worker_id()
                  << " data_rank=" << joined.data_rank() << " shard=" << trainer_->shard_size()
                  << " images, model=" << joined.config().model().name() << " (" << n
                  << " parameters, hash " << hash.substr(0, 12) << "), averaging "
                  << (config.topology().hierarchy() ? "hierarchical" : averager_->name()) << "/"
                  << codec_->name() << " by " << AggregationName(*aggregation)
                  << (encoded ? absl::StrCat(" encoded, outer optimizer ",
                                             config.exchange().outer_optimizer().kind().empty()
                                                 ? "none"
                                                 : config.exchange().outer_optimizer().kind())
                              : std::string());
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

std::optional<absl::Status> Worker::JoinWithRetry(const Action& first) {
  // The coordinator may be restarting: keep trying (capped, jittered
  // backoff) for as long as the worker runs; the first join gives up after
  // --connect_timeout (the client's own retry window).
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(200);
  policy.max_backoff = absl::Seconds(5);
  policy.clock = clock_;
  const bool rejoin = protocol_.joined();
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
          const shoal::v1::JoinRequest request =
              first_attempt ? first.join : protocol_.Start().front().join;
          first_attempt = false;
          absl::StatusOr<shoal::v1::JoinResponse> joined = coordinator_->Join(request);
          if (!joined.ok()) {
            return absl::Status(
                joined.status().code(),
                absl::StrCat("cannot join the run at coordinator ", options_.coordinator, ": ",
                             joined.status().message()));
          }
          const bool first_join = trainer_ == nullptr;
          SetLogTag(absl::StrCat("worker ", joined->worker_id()));
          outbound_only_ = joined->outbound_only();
          if (outbound_only_) {
            SHOAL_LOG(INFO) << "outbound connections only (" << joined->outbound_reason()
                            << "): this worker pushes its contributions";
          }
          if (!joined->member_credential().empty()) {
            // The run checks members: send this credential to peers, and
            // serve only current members from now on.
            credential_.Set(joined->worker_id(), joined->member_credential());
            members_.Enable();
          }
          // The RelayHello of the stream it opens if members use it.
          relay_frontend_->SetRelayId(joined->worker_id());
          state_->SetWorkerId(joined->worker_id());
          if (first_join) {
            RETURN_IF_ERROR(BuildModel(*joined));
            joined_checkpoint_id_ = joined->checkpoint_id();
          }
          if (!first_join)
            SHOAL_LOG(INFO) << "re-joined run " << joined->run_id() << " as "
                            << joined->worker_id();
          if (store_ == nullptr && !joined->config().checkpoints().store().empty()) {
            store_ = std::make_unique<checkpoint::GrpcCheckpointClient>(
                joined->config().checkpoints().store());
          }
          Actions next = protocol_.OnJoined(*joined);
          for (Action& a : next) {
            if (a.kind == Action::kOpenSession) {
              absl::Status opened = OpenSession();
              if (opened.ok()) {
                const uint64_t carried = protocol_.carried_round();
                absl::StatusOr<uint64_t> admitted =
                    coordinator_->JoinRound(protocol_.worker_id(), 0, carried);
                if (admitted.ok()) {
                  SHOAL_LOG(INFO) << "admitted to round " << *admitted
                                  << (carried != 0
                                          ? absl::StrCat(" (carrying the trained work of round ",
                                                         carried, ")")
                                          : std::string());
                } else {
                  opened = admitted.status();
                }
              }
              if (!opened.ok()) {
                coordinator_->CloseSession();
                session_lost_to_build = first_join && absl::IsNotFound(opened);
                return opened;
              }
              continue;
            }
            Actions more;
            exit = ExecuteOne(a, &more);
            if (exit.has_value()) return absl::OkStatus();
            if (!more.empty()) exit = Execute(std::move(more));
            if (exit.has_value()) return absl::OkStatus();
          }
          return absl::OkStatus();
        },
        [&](const absl::Status& failed, int) {
          if (clock_->Now() >= next_log) {
            SHOAL_LOG(WARNING) << "re-join failed, retrying: " << failed.message();
            next_log = clock_->Now() + absl::Seconds(10);
          }
          coordinator_->CloseSession();
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

absl::Status Worker::OpenSession() {
  return coordinator_->OpenSession(
      protocol_.worker_id(),
      absl::Milliseconds(
          std::max<uint32_t>(100, protocol_.config().timeouts().heartbeat_interval_ms())),
      [this](const shoal::v1::CoordinatorMessage& msg) {
        if (msg.has_checkpoint_request() && !msg.checkpoint_request().upload_grant().empty() &&
            store_ != nullptr) {
          // The store asks for it with the upload (common/upload_grant.h).
          store_->SetUploadGrant(msg.checkpoint_request().upload_grant());
        }
        if (msg.has_use_relay()) {
          // Moved by the client's router thread, never this reader's.
          coordinator_->UseRelay(msg.use_relay().relay_id(), msg.use_relay().address());
          return;
        }
        if (msg.has_member_update()) {
          // Applied on the session's thread, not queued: a member that just
          // joined may read from this worker right away.
          members_.Apply(msg.member_update());
          return;
        }
        absl::MutexLock lock(&mu_);
        if (WorkerProtocol::Interrupts(msg)) {
          // A running exchange hears it at once, not when Run() pops it.
          ++unhandled_interrupts_;
          if (exchange_token_ != nullptr) exchange_token_->Cancel();
        }
        events_.push_back({Event::kMessage, msg, absl::OkStatus()});
      },
      [this](const absl::Status& status) {
        Push({Event::kSessionClosed, {}, status});
      },
      [this](shoal::v1::Heartbeat* hb) {
        {
          absl::MutexLock lock(&gossip_mu_);
          if (gossip_report_.has_value()) {
            const int64_t sent = hb->sent_unix_ms();
            *hb = *gossip_report_;
            hb->set_sent_unix_ms(sent);
          }
        }
        if (!sync_progress_.syncing.load()) return;
        hb->set_syncing(true);
        hb->set_sync_bytes_done(sync_progress_.bytes_done.load());
        hb->set_sync_bytes_total(sync_progress_.bytes_total.load());
        hb->set_sync_sources(sync_progress_.sources.load());
      });
}

std::optional<absl::Status> Worker::Execute(Actions actions) {
  std::deque<Action> queue(std::make_move_iterator(actions.begin()),
                           std::make_move_iterator(actions.end()));
  while (!queue.empty()) {
    Action action = std::move(queue.front());
    queue.pop_front();
    Actions next;
    std::optional<absl::Status> exit = ExecuteOne(action, &next);
    if (exit.has_value()) return exit;
    // A result's follow-ups come before what was queued after the action.
    queue.insert(queue.begin(), std::make_move_iterator(next.begin()),
                 std::make_move_iterator(next.end()));
  }
  return std::nullopt;
}

std::optional<absl::Status> Worker::ExecuteOne(Action& a, Actions* next) {
  SHOAL_VLOG(2) << "action " << ActionName(a.kind) << " round " << a.round;
  if (metrics_ != nullptr) {  // bytes served since the last action
    const PeerSentBytes& sent = peer_service_->sent();
    const uint64_t now[3] = {sent.exchange.load(std::memory_order_relaxed),
                             sent.snapshot.load(std::memory_order_relaxed),
                             sent.model_file.load(std::memory_order_relaxed)};
    const MetricCounter* counters[3] = {&M().sent_exchange, &M().sent_snapshot,
                                        &M().sent_model_file};
    for (int i = 0; i < 3; ++i) {
      counters[i]->Add(static_cast<double>(now[i] - sent_reported_[i]));
      sent_reported_[i] = now[i];
    }
  }
  switch (a.kind) {
    case Action::kJoin:
      return JoinWithRetry(a);
    case Action::kOpenSession:
      // Only inside JoinWithRetry (it belongs to one join attempt).
      return std::nullopt;
    case Action::kRejoin:
      coordinator_->CloseSession();
      return std::nullopt;
    case Action::kCatchUp: {
      const absl::Time t0 = clock_->Now();
      uint64_t pulled = 0;
      absl::Status s = memory_->CatchUp(a.round, a.hash, protocol_.model_round(),
                                        [&](float* dst, uint64_t total) {
                                          pulled = total * sizeof(float);
                                          RETURN_IF_ERROR(PullModel(a, dst, total));
                                          return PullOuterState(a);
                                        });
      if (pulled > 0) {
        (s.ok() ? M().catchups_ok : M().catchups_failed).Add();
        if (s.ok()) {
          M().catchup_bytes.Add(static_cast<double>(pulled));
          M().catchup_seconds.Observe(absl::ToDoubleSeconds(clock_->Now() - t0));
        }
      }
      if (s.ok()) {
        SHOAL_LOG(INFO) << absl::StrFormat("caught up to round %d in %.2fs (%d MiB)", a.round,
                                           absl::ToDoubleSeconds(clock_->Now() - t0),
                                           memory_->total() * sizeof(float) >> 20);
      }
      *next = protocol_.OnCaughtUp(a.round, a.hash, s);
      return std::nullopt;
    }
    case Action::kTrain: {
      const absl::Time t0 = clock_->Now();
      const double loss = memory_->Train(a.round, [&](float* params) {
        const double l = trainer_->TrainSteps(protocol_.config().training().local_steps());
        if (options_.contribution_transform) {
          options_.contribution_transform(a.round, params, trainer_->num_elements());
        }
        return l;
      });
      M().train_seconds.Observe(absl::ToDoubleSeconds(clock_->Now() - t0));
      M().train_loss.Set(loss);
      *next = protocol_.OnTrained(a.round, loss, trainer_->num_elements());
      return std::nullopt;
    }
    case Action::kReportReady: {
      absl::Status s = coordinator_->ReportReady(a.ready);
      if (s.ok()) SHOAL_VLOG(1) << "round " << a.round << " ready, loss " << a.ready.train_loss();
      if (s.ok() && a.resumed) {
        SHOAL_LOG(INFO) << "round " << a.round
                        << ": ready report accepted for the work trained before the coordinator "
                           "session was lost (round not trained again)";
      }
      *next = protocol_.OnReadyReported(a.round, s);
      return std::nullopt;
    }
    case Action::kKeepContribution:
      memory_->KeepContribution(a.round);
      return std::nullopt;
    case Action::kRestoreContribution:
      memory_->RestoreContribution(a.round);
      return std::nullopt;
    case Action::kServePlan:
      for (const auto& s : a.plan.slices()) {
        if (s.worker_id() == protocol_.worker_id()) {
          memory_->ServePlan(a.round, a.attempt, s.begin(), s.end());
        }
      }
      return std::nullopt;
    case Action::kProbe: {
      shoal::v1::ConnectionsReadyRequest req;
      req.set_worker_id(protocol_.worker_id());
      req.set_round(a.round);
      req.set_attempt(a.attempt);
      for (std::string& id : UnreachablePeers(a.plan, a.retry)) req.add_unreachable(std::move(id));
      absl::Status s = coordinator_->ConnectionsReady(req);
      if (!s.ok()) SHOAL_LOG(WARNING) << "connections-ready refused: " << s.message();
      return std::nullopt;
    }
    case Action::kExchange: {
      std::string hash;
      const absl::Time t0 = clock_->Now();
      absl::Status s = Exchange(a, &hash);
      if (s.ok()) {
        M().exchanges_ok.Add();
        M().exchange_seconds.Observe(absl::ToDoubleSeconds(clock_->Now() - t0));
      } else {
        M().exchanges_failed.Add();
      }
      M().received_bytes.Add(static_cast<double>(last_stats_.bytes_received));
      M().retries.Add(last_stats_.retries);
      *next = protocol_.OnExchanged(a.round, a.attempt, s, hash);
      return std::nullopt;
    }
    case Action::kHoldPending:
      memory_->HoldPending(a.round, a.hash);
      return std::nullopt;
    case Action::kCommit:
      memory_->CommitPending(a.round);
      outer_->Commit(a.round);
      if (encoded_parts_.store != nullptr) PublishOuterState(a.round);
      return std::nullopt;
    case Action::kVoid:
      memory_->VoidPending(a.round, a.hash);
      return std::nullopt;
    case Action::kDropWork:
      memory_->DropWork(a.round);
      return std::nullopt;
    case Action::kKeepLateWork:
      memory_->KeepLateWork(a.round);
      return std::nullopt;
    case Action::kFoldLateWork:
      memory_->FoldLateWork(a.round, a.weight);
      return std::nullopt;
    case Action::kDropLateWork:
      memory_->DropLateWork();
      return std::nullopt;
    case Action::kReportDone: {
      shoal::v1::ReportRoundDoneRequest done = a.done;
      if (a.evaluate) *done.mutable_metrics() = trainer_->Evaluate();
      if (done.metrics().evaluated()) {
        M().test_accuracy.Set(done.metrics().test_accuracy());
        M().test_loss.Set(done.metrics().test_loss());
      }
      M().model_round.Set(static_cast<double>(a.round));
      const double ratio =
          last_stats_.raw_bytes_received > 0
              ? static_cast<double>(last_stats_.bytes_received) / last_stats_.raw_bytes_received
              : 1.0;
      done.set_bytes_received(last_stats_.bytes_received);
      done.set_bytes_sent(last_stats_.bytes_published);
      done.set_compression_ratio(ratio);
      zone_measurements_.AddTraining(done.train_seconds(),
                                     protocol_.config().training().local_steps());
      zone_measurements_.AddTransfer(last_stats_.reduce_bytes, last_stats_.reduce_seconds);
      done.set_step_seconds(zone_measurements_.step_seconds());
      done.set_bandwidth_bytes_per_second(zone_measurements_.bandwidth_bytes_per_second());
      SHOAL_LOG(INFO) << absl::StrFormat(
          "round %d: train_loss=%.4f%s train=%.2fs exchange=%.3fs (%d KiB in, %d retries) "
          "wire_in=%d wire_out=%d ratio=%.4f codec=%s%s hash=%s",
          a.round, protocol_.train_loss(),
          done.metrics().evaluated()
              ? absl::StrFormat(" test_accuracy=%.4f test_loss=%.4f",
                                done.metrics().test_accuracy(), done.metrics().test_loss())
              : "",
          done.train_seconds(), done.exchange_seconds(), last_stats_.bytes_received / 1024,
          last_stats_.retries, last_stats_.bytes_received, last_stats_.bytes_published, ratio,
          codec_->name(),
          last_stats_.stage_bytes_received.empty()
              ? std::string()
              : absl::StrCat(" stage_in=", absl::StrJoin(last_stats_.stage_bytes_received, "/"),
                             last_stats_.stages_carried > 0
                                 ? absl::StrCat(" carried=", last_stats_.stages_carried)
                                 : ""),
          a.hash.substr(0, 12));
      absl::Status r = coordinator_->ReportRoundDone(done);
      if (!r.ok())
        SHOAL_LOG(WARNING) << "report of round " << a.round << " refused: " << r.message();
      return std::nullopt;
    }
    case Action::kUpload:
      Upload(a);
      return std::nullopt;
    case Action::kLeave:
      state_->SetShuttingDown();
      coordinator_->Leave(protocol_.worker_id(), a.reason).IgnoreError();
      coordinator_->CloseSession();
      return std::nullopt;
    case Action::kExit:
      coordinator_->CloseSession();
      return a.status;
  }
  return std::nullopt;
}

std::vector<std::string> Worker::UnreachablePeers(const shoal::v1::RoundPlan& plan,
                                                  uint32_t retry) {
  // Report within the coordinator's connection timeout.
  absl::Duration budget = options_.probe_timeout;
  const uint32_t connection_timeout_ms = protocol_.config().timeouts().connection_timeout_ms();
  if (connection_timeout_ms > 0) {
    budget = std::min(budget, absl::Milliseconds(connection_timeout_ms) / 2);
  }
  std::vector<std::thread> probes;
  std::vector<absl::Status> results(plan.slices_size());
  for (int k = 0; k < plan.slices_size(); ++k) {
    // Nobody connects to a participant behind NAT: it pushes to the owners.
    if (plan.slices(k).worker_id() == protocol_.worker_id() || plan.slices(k).outbound_only()) {
      continue;
    }
    probes.emplace_back(
        [&, k] { results[k] = peers_->Probe(plan.slices(k).peer_address(), budget).status(); });
  }
  for (auto& t : probes) t.join();
  std::vector<std::string> unreachable;
  for (int k = 0; k < plan.slices_size(); ++k) {
    if (results[k].ok()) continue;
    SHOAL_LOG(WARNING) << "round " << plan.round() << ": cannot reach "
                       << plan.slices(k).worker_id() << " (" << results[k].message() << ")"
                       << (retry ? absl::StrCat(", retry ", retry) : "");
    unreachable.push_back(plan.slices(k).worker_id());
  }
  return unreachable;
}

absl::Status Worker::Exchange(const Action& a, std::string* hash) {
  CancellationToken token(&stop_token_);
  {
    absl::MutexLock lock(&mu_);
    // A directive that interrupts this exchange may already be queued.
    if (unhandled_interrupts_ > 0) token.Cancel();
    exchange_token_ = &token;
  }
  last_stats_ = {};
  absl::Status s = averager_->Average(a.plan, protocol_.worker_id(), memory_->exchange_target(),
                                      &token, &last_stats_);
  {
    absl::MutexLock lock(&mu_);
    exchange_token_ = nullptr;
  }
  if (s.ok()) *hash = HashParameters(memory_->parameters(), memory_->total());
  return s;
}

void Worker::PublishOuterState(uint64_t round) {
  const std::vector<float>& m = outer_->momentum();
  encoded_store_->SetState(
      round, std::make_shared<const std::string>(reinterpret_cast<const char*>(m.data()),
                                                 m.size() * sizeof(float)));
}

absl::Status Worker::PullOuterState(const Action& a) {
  if (!outer_->has_state()) return absl::OkStatus();
  if (a.round == 0) {
    // The initial model's momentum is zero.
    RETURN_IF_ERROR(outer_->SetMomentum(0, std::vector<float>(memory_->total(), 0.0f)));
    PublishOuterState(0);
    return absl::OkStatus();
  }
  const uint64_t bytes = memory_->total() * sizeof(float);
  absl::Status last =
      absl::UnavailableError(absl::StrCat("no peer holds the outer momentum of round ", a.round));
  for (const std::string& holder : a.holders) {
    EncodedAssembly blob(a.round, bytes, bytes,
                         absl::StrCat("outer momentum of round ", a.round, " from ", holder));
    absl::Status s;
    while (s.ok() && !blob.done()) {
      shoal::v1::ReadEncodedRequest request;
      request.set_round(a.round);
      request.set_kind(shoal::v1::SNAPSHOT);
      request.set_begin(0);
      request.set_end(memory_->total());
      request.set_offset(blob.offset());
      request.set_reader_id(protocol_.worker_id());
      absl::StatusOr<shoal::v1::EncodedPiece> piece =
          peers_->ReadEncoded(holder, request, options_.sync.piece_timeout, &stop_token_);
      s = piece.ok() ? blob.Add(*piece) : piece.status();
    }
    if (!s.ok()) {
      SHOAL_LOG(WARNING) << "outer momentum of round " << a.round << " from " << holder << ": "
                         << s.message();
      last = s;
      continue;
    }
    std::vector<float> m(memory_->total());
    std::memcpy(m.data(), blob.bytes().data(), bytes);
    RETURN_IF_ERROR(outer_->SetMomentum(a.round, m));
    PublishOuterState(a.round);
    SHOAL_LOG(INFO) << "outer momentum of round " << a.round << " pulled from " << holder;
    return absl::OkStatus();
  }
  // Like the model: the checkpoint store serves what no peer can (a restart
  // of the whole run from the store).
  if (store_ != nullptr && !a.checkpoint_id.empty()) {
    absl::Status s = LoadOuterStateFromCheckpoint(a);
    if (s.ok() || a.holders.empty()) return s;
    SHOAL_LOG(WARNING) << "outer momentum of round " << a.round << " from checkpoint "
                       << a.checkpoint_id << ": " << s.message();
  }
  return last;
}

absl::Status Worker::LoadOuterStateFromCheckpoint(const Action& a) {
  absl::StatusOr<shoal::v1::Manifest> manifest = store_->GetManifest(a.checkpoint_id);
  if (!manifest.ok()) return Annotate(manifest.status(), "checkpoint store");
  if (manifest->round() != a.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", a.checkpoint_id, " is of round ", manifest->round(), ", not ", a.round));
  }
  const int layer = checkpoint::FindStateLayer(*manifest, kMomentumLayer);
  if (layer < 0) {
    // Only a checkpoint of a run without a stateful outer optimizer lacks
    // it (a nesterov worker does not upload without it): the momentum of
    // a model reached without momentum is zero, the same on every worker.
    SHOAL_LOG(WARNING) << "checkpoint " << a.checkpoint_id
                       << " carries no outer momentum (its run had no nesterov): starting from "
                          "zero momentum at round "
                       << a.round;
    RETURN_IF_ERROR(outer_->SetMomentum(a.round, std::vector<float>(memory_->total(), 0.0f)));
    PublishOuterState(a.round);
    return absl::OkStatus();
  }
  const shoal::v1::LayerEntry& entry = manifest->layers(layer);
  if (entry.dtype() != "float32" || entry.bytes() != memory_->total() * sizeof(float)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", a.checkpoint_id, ": outer momentum of ", entry.bytes(), " bytes of ",
        entry.dtype(), ", the model has ", memory_->total(), " float32 parameters"));
  }
  std::vector<uint8_t> got;
  RETURN_IF_ERROR(checkpoint::ReadWholeLayer(store_.get(), a.checkpoint_id, *manifest,
                                             static_cast<uint32_t>(layer), &got));
  std::vector<float> m(memory_->total());
  std::memcpy(m.data(), got.data(), got.size());
  RETURN_IF_ERROR(outer_->SetMomentum(a.round, m));
  PublishOuterState(a.round);
  // The digest of what the optimizer now holds (equal to the layer's, which
  // ReadWholeLayer checked): tests compare it with the manifest's.
  const std::vector<float>& held = outer_->momentum();
  SHOAL_LOG(INFO) << "outer momentum of round " << a.round << " loaded from checkpoint "
                  << a.checkpoint_id << " (sha256 "
                  << Sha256Hex(held.data(), held.size() * sizeof(float)) << ")";
  return absl::OkStatus();
}

absl::Status Worker::PullModel(const Action& a, float* dst, uint64_t total) {
  SHOAL_LOG(INFO) << "catching up: pulling the model of round " << a.round << " from "
                  << a.holders.size() << " peers";
  // Peers first; the checkpoint store serves what no peer can.
  CheckpointFallback fallback;
  if (store_ != nullptr && !a.checkpoint_id.empty()) {
    fallback.client = store_.get();
    fallback.checkpoint_id = a.checkpoint_id;
    if (a.holders.empty()) {
      SHOAL_LOG(INFO) << "no peer holds round " << a.round << "; loading checkpoint "
                      << a.checkpoint_id << " from the store";
    }
  }
  ModelSyncer syncer(peers_.get(), options_.sync);
  return syncer.Sync(a.round, a.hash, a.holders, dst, total, protocol_.worker_id(), &sync_progress_,
                     fallback);
}

void Worker::Upload(const Action& a) {
  const shoal::v1::CheckpointRequest& request = a.checkpoint;
  shoal::v1::ReportCheckpointRequest report;
  report.set_worker_id(protocol_.worker_id());
  report.set_round(request.round());
  if (store_ == nullptr) {
    report.set_error("this worker has no checkpoint store configured");
  } else if (!a.reason.empty()) {
    report.set_error(a.reason);
  } else {
    const shoal::v1::RunConfig& config = protocol_.config();
    shoal::v1::Manifest manifest;
    manifest.set_run_id(request.run_id());
    manifest.set_round(request.round());
    manifest.set_model(config.model().name());
    manifest.set_model_sha256(request.model_hash());
    const uint64_t seen =
        request.round() * config.training().local_steps() * config.training().batch_size();
    manifest.set_epoch(trainer_->shard_size() ? seen / trainer_->shard_size() : 0);
    std::vector<checkpoint::ByteSpan> spans;
    AppendModelLayers(trainer_->layers(), memory_->snapshot(), &manifest, &spans);
    absl::Status s;
    if (outer_->has_state()) {
      // The outer momentum of this model travels with it (a restart from
      // the store resumes it): one flat float32 layer after the model's.
      const std::vector<float>& m = outer_->momentum();
      if (outer_->momentum_round() != request.round()) {
        s = absl::FailedPreconditionError(
            absl::StrCat("the outer momentum held is of round ", outer_->momentum_round(),
                         ", the checkpoint is of round ", request.round()));
      }
      auto* entry = manifest.add_layers();
      entry->set_name(kMomentumLayer);
      entry->set_dtype("float32");
      entry->add_shape(static_cast<int64_t>(m.size()));
      entry->set_optimizer_state(true);
      spans.push_back({reinterpret_cast<const uint8_t*>(m.data()), m.size() * sizeof(float)});
    }
    const absl::Time t0 = clock_->Now();
    if (s.ok()) s = checkpoint::CompleteManifest(&manifest, spans);
    absl::StatusOr<shoal::v1::CheckpointInfo> info =
        s.ok() ? store_->Upload(manifest, spans) : absl::StatusOr<shoal::v1::CheckpointInfo>(s);
    (info.ok() ? M().uploads_ok : M().uploads_failed).Add();
    if (info.ok()) {
      M().upload_seconds.Observe(absl::ToDoubleSeconds(clock_->Now() - t0));
      report.set_checkpoint_id(info->id());
      const int state = checkpoint::FindStateLayer(manifest, kMomentumLayer);
      SHOAL_LOG(INFO) << absl::StrFormat(
          "checkpoint %s of round %d uploaded in %.2fs%s", info->id(), request.round(),
          absl::ToDoubleSeconds(clock_->Now() - t0),
          state < 0 ? ""
                    : absl::StrCat(" with the outer momentum (sha256 ",
                                   manifest.layers(state).sha256(), ")"));
    } else {
      report.set_error(info.status().ToString());
      SHOAL_LOG(WARNING) << "checkpoint upload of round " << request.round()
                         << " failed: " << info.status();
    }
  }
  absl::Status s = coordinator_->ReportCheckpoint(report);
  if (!s.ok()) SHOAL_LOG(WARNING) << "checkpoint report refused: " << s.message();
}

absl::Status Worker::WritePredictions(const std::string& path, int64_t n) {
  if (trainer_ == nullptr) return absl::FailedPreconditionError("no model was built");
  const std::vector<Trainer::Prediction> predictions = trainer_->Predict(n);
  std::string text = absl::StrCat(
      "# shoal-worker predictions: model round ", protocol_.model_round(), " hash ",
      HashParameters(memory_->parameters(), memory_->total()), "\n# index label predicted\n");
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

absl::Status Worker::Run() {
  SHOAL_LOG(INFO) << "peer service on " << server_->address() << ", advertised as " << advertise_
                  << "; joining coordinator " << options_.coordinator;
  if (std::optional<absl::Status> exit = Execute(protocol_.Start())) return *exit;
  if (IsGossipMode(protocol_.config())) return RunGossip();
  while (true) {
    if (StopRequested()) {
      stop_token_.Cancel();
      if (std::optional<absl::Status> exit = Execute(protocol_.OnStopRequested())) return *exit;
      return absl::OkStatus();
    }
    Event event;
    if (!Pop(&event, absl::Seconds(1))) continue;
    Actions actions;
    if (event.kind == Event::kStop) continue;
    if (event.kind == Event::kSessionClosed) {
      if (StopRequested()) continue;
      actions = protocol_.OnSessionClosed(event.status);
    } else {
      actions = protocol_.OnDirective(event.message);
    }
    if (std::optional<absl::Status> exit = Execute(std::move(actions))) return *exit;
  }
}

absl::Status Worker::RunGossip() {
  const shoal::v1::RunConfig config = protocol_.config();
  absl::StatusOr<GossipConfig> parsed = ParseGossipConfig(config);
  if (!parsed.ok()) {
    coordinator_->Leave(protocol_.worker_id(), parsed.status().ToString()).IgnoreError();
    coordinator_->CloseSession();
    return parsed.status();
  }
  const GossipConfig g = *parsed;
  const uint64_t n = trainer_->num_elements();
  float* const params = trainer_->parameters();
  const std::string self = protocol_.worker_id();
  const uint64_t seed = config.training().seed() * 1000003ULL + std::hash<std::string>()(self);
  PeerChooser chooser(clock_, seed);
  GossipFetcher fetcher(peers_.get(), self, clock_, &stop_token_);
  fetcher.set_push_own(outbound_only_);
  // Pulls travel in the run's codec (docs/GOSSIP.md, "Compressed pulls").
  fetcher.set_codec(codec_.get());
  // Checkpoints (docs/GOSSIP.md, "Checkpoints"): while the coordinator has
  // made this worker the checkpointer, ckpt_sequence is the sequence number
  // of its next upload (0 = not the checkpointer) and ckpt_due the local
  // step at or past which it is due.
  std::unique_ptr<GossipCheckpointer> checkpointer;
  if (store_ != nullptr) {
    checkpointer = std::make_unique<GossipCheckpointer>(store_.get(), coordinator_.get(),
                                                        trainer_->layers(), clock_);
  }
  uint64_t ckpt_sequence = 0;
  uint64_t ckpt_due = 0;
  std::string ckpt_run_id;
  std::mt19937_64 rng(seed ^ 0x90551bULL);
  std::bernoulli_distribution fetch_now(g.fetch_probability);
  const double batch = std::max<uint32_t>(1, config.training().batch_size());
  const uint32_t eval_every = std::max<uint32_t>(1, config.training().eval_every());
  SHOAL_LOG(INFO) << "gossip mode: publish every " << g.gossip_every
                  << " steps, fetch p=" << g.fetch_probability << ", timeout "
                  << absl::FormatDuration(g.timeout) << ", interpolation "
                  << config.gossip().interpolation() << ", divergence threshold "
                  << g.divergence_threshold << ", pulls " << codec_->name()
                  << (g.steps ? absl::StrCat(", ", g.steps, " steps") : std::string());

  double clock = 0;
  double loss_sum = 0;
  uint32_t loss_count = 0;
  double last_loss = 0;
  uint64_t steps = 0;
  uint64_t publications = 0;
  shoal::v1::Heartbeat report;
  report.set_gossip(true);
  std::map<std::string, std::string> peers;
  bool have_peer_list = false;
  const absl::Duration heartbeat_period =
      absl::Milliseconds(std::max<uint32_t>(100, config.timeouts().heartbeat_interval_ms()));
  absl::Time next_projection = absl::InfinitePast();

  auto publish = [&]() -> std::shared_ptr<const GossipCopy> {
    std::shared_ptr<const GossipCopy> copy = gossip_board_.Publish(params, n, clock, last_loss);
    ++publications;
    report.set_gossip_clock(clock);
    report.set_gossip_loss(last_loss);
    report.set_gossip_steps(steps);
    // The projection costs O(n x 32): at most once per heartbeat period.
    if (clock_->Now() >= next_projection) {
      const std::vector<float> projection = ProjectModel(params, n, config.training().seed());
      report.clear_projection();
      for (float v : projection) report.add_projection(v);
      next_projection = clock_->Now() + heartbeat_period;
    }
    absl::MutexLock lock(&gossip_mu_);
    gossip_report_ = report;
    return copy;
  };
  auto evaluate = [&] {
    const shoal::v1::Metrics m = trainer_->Evaluate();
    report.set_test_accuracy(m.test_accuracy());
    report.set_test_loss(m.test_loss());
    report.set_eval_clock(clock);
    M().test_accuracy.Set(m.test_accuracy());
    M().test_loss.Set(m.test_loss());
    SHOAL_LOG(INFO) << absl::StrFormat(
        "gossip step %d clock=%.0f train_loss=%.4f test_accuracy=%.4f test_loss=%.4f fetches "
        "done=%d timed_out=%d failed=%d",
        steps, clock, last_loss, m.test_accuracy(), m.test_loss(), report.fetches_done(),
        report.fetches_timed_out(), report.fetches_failed());
  };
  auto on_uploaded = [&](const GossipUploadResult& r) {
    // The same metrics as synchronous uploads (OPERATIONS.md's alerts).
    (r.upload.ok() ? M().uploads_ok : M().uploads_failed).Add();
    if (r.upload.ok()) M().upload_seconds.Observe(absl::ToDoubleSeconds(r.took));
    if (r.upload.ok() && ckpt_sequence == r.sequence) ckpt_sequence = r.sequence + 1;
    if (absl::IsFailedPrecondition(r.report) || absl::IsNotFound(r.report)) {
      // Another worker is the checkpointer now (this one lost its session
      // meanwhile), or the coordinator no longer knows this worker.
      SHOAL_LOG(WARNING) << "gossip checkpoint report refused (" << r.report.message()
                         << "); no longer the checkpointer";
      ckpt_sequence = 0;
    } else if (!r.report.ok()) {
      SHOAL_LOG(WARNING) << "gossip checkpoint report failed: " << r.report.message();
    }
  };
  auto upload_job = [&](std::shared_ptr<const GossipCopy> copy) {
    GossipUploadJob job;
    job.run_id = ckpt_run_id;
    job.worker_id = self;
    job.model = config.model().name();
    job.sequence = ckpt_sequence;
    job.steps = steps;
    job.copy = std::move(copy);
    return job;
  };
  auto leave = [&](const std::string& reason) {
    state_->SetShuttingDown();
    coordinator_->Leave(self, reason).IgnoreError();
    coordinator_->CloseSession();
  };
  // The consensus evaluation (docs/GOSSIP.md, "Consensus accuracy"), by the
  // member the coordinator names (the most trained): its own fetcher, so
  // that a background fetch in flight is not disturbed.
  bool consensus_evaluator = false;
  GossipFetcher consensus_fetcher(peers_.get(), self, clock_, &stop_token_);
  consensus_fetcher.set_codec(codec_.get());
  auto evaluate_consensus = [&] {
    if (!consensus_evaluator) return;
    const absl::Time t0 = clock_->Now();
    std::vector<double> sum(params, params + n);
    double clocks = clock;
    uint32_t models = 1;
    for (const auto& [id, address] : peers) {
      GossipFetchResult r = consensus_fetcher.FetchNow(id, address, n, g.timeout);
      if (!r.status.ok()) {
        SHOAL_VLOG(1) << "consensus evaluation without " << id << ": " << r.status.message();
        continue;
      }
      for (uint64_t i = 0; i < n; ++i) sum[i] += r.peer_params[i];
      clocks += r.peer_clock;
      ++models;
    }
    // Evaluated in place: the own model is put back before training goes on.
    const std::vector<float> own(params, params + n);
    for (uint64_t i = 0; i < n; ++i) params[i] = static_cast<float>(sum[i] / models);
    const shoal::v1::Metrics m = trainer_->Evaluate();
    std::copy(own.begin(), own.end(), params);
    report.set_consensus_accuracy(m.test_accuracy());
    report.set_consensus_loss(m.test_loss());
    report.set_consensus_models(models);
    report.set_consensus_clock(clocks);
    SHOAL_LOG(INFO) << absl::StrFormat(
        "gossip step %d consensus of %d models (clocks %.0f): test_accuracy=%.4f test_loss=%.4f "
        "(%.2fs)",
        steps, models, clocks, m.test_accuracy(), m.test_loss(),
        absl::ToDoubleSeconds(clock_->Now() - t0));
  };
  // The final average's list of sources, once the coordinator sent it.
  std::optional<shoal::v1::GossipFinal> final_list;
  // Directives from the session; returns an exit status when the run ends
  // for this worker.
  auto handle_events = [&](absl::Duration wait) -> std::optional<absl::Status> {
    Event e;
    while (Pop(&e, wait)) {
      wait = absl::ZeroDuration();
      if (e.kind == Event::kStop) continue;
      if (e.kind == Event::kSessionClosed) {
        if (StopRequested()) continue;
        SHOAL_LOG(WARNING) << "session lost (" << e.status.message() << "); re-joining";
        // The coordinator names the checkpointer again after the re-join.
        ckpt_sequence = 0;
        if (std::optional<absl::Status> exit = Execute(protocol_.OnSessionClosed(e.status))) {
          return exit;
        }
        continue;
      }
      const shoal::v1::CoordinatorMessage& msg = e.message;
      if (msg.has_peer_update()) {
        peers.clear();
        for (const auto& p : msg.peer_update().peers()) {
          if (p.worker_id() != self) peers[p.worker_id()] = p.peer_address();
        }
        chooser.SetPeers(peers);
        have_peer_list = true;
        consensus_evaluator = msg.peer_update().consensus_evaluator() == self;
        SHOAL_LOG(INFO) << "gossip peers (version " << msg.peer_update().version()
                        << "): " << peers.size();
      } else if (msg.has_checkpoint_request() && msg.checkpoint_request().gossip()) {
        const shoal::v1::CheckpointRequest& request = msg.checkpoint_request();
        if (checkpointer == nullptr) {
          shoal::v1::ReportCheckpointRequest refused;
          refused.set_worker_id(self);
          refused.set_round(request.round());
          refused.set_error("this worker has no checkpoint store configured");
          coordinator_->ReportCheckpoint(refused).IgnoreError();
          continue;
        }
        ckpt_sequence = std::max<uint64_t>(1, request.round());
        ckpt_run_id = request.run_id();
        ckpt_due = NextCheckpointStep(steps, config.gossip().checkpoint_every());
        SHOAL_LOG(INFO) << "this worker is the checkpointer: uploads every "
                        << config.gossip().checkpoint_every() << " local steps (next at step "
                        << ckpt_due << "), from sequence " << ckpt_sequence;
      } else if (msg.has_gossip_final()) {
        final_list = msg.gossip_final();
      } else if (msg.has_run_finished()) {
        SHOAL_LOG(INFO) << "run finished: " << msg.run_finished().reason();
        coordinator_->CloseSession();
        return absl::OkStatus();
      } else if (msg.has_leave_requested()) {
        leave(msg.leave_requested().reason());
        return absl::FailedPreconditionError(
            absl::StrCat("asked to leave: ", msg.leave_requested().reason()));
      }
    }
    return std::nullopt;
  };

  // The first peer list comes right after JoinRound; a worker that finds
  // peers with a trained model starts from one of them (late join).
  const absl::Time list_deadline = clock_->Now() + absl::Seconds(2);
  while (!have_peer_list && clock_->Now() < list_deadline && !StopRequested()) {
    if (std::optional<absl::Status> exit = handle_events(absl::Milliseconds(100))) return *exit;
  }
  for (int attempt = 0; attempt < 3 && chooser.size() > 0 && !StopRequested(); ++attempt) {
    const std::optional<std::string> id = chooser.Choose();
    GossipFetchResult r = fetcher.FetchNow(*id, chooser.Address(*id), n, g.timeout);
    if (!r.status.ok()) {
      SHOAL_LOG(WARNING) << "late join: " << r.status.message();
      if (r.not_answering) chooser.OnTimeout(*id);
      continue;
    }
    if (r.peer_clock > 0) {
      std::copy(r.peer_params, r.peer_params + n, params);
      clock = r.peer_clock;
      last_loss = r.peer_loss;
      SHOAL_LOG(INFO) << absl::StrFormat("late join: started from %s's model (clock %.0f) in %.2fs",
                                         r.peer_id, r.peer_clock, absl::ToDoubleSeconds(r.took));
    }
    break;
  }
  if (clock == 0 && !joined_checkpoint_id_.empty() && !StopRequested()) {
    // A resumed run (docs/GOSSIP.md, "Checkpoints"): no peer has trained
    // yet, so start from the run's latest checkpoint, not the seed's model.
    absl::Status loaded = LoadGossipCheckpoint(joined_checkpoint_id_, params, n, &clock);
    if (!loaded.ok()) {
      leave(absl::StrCat("cannot load checkpoint ", joined_checkpoint_id_, ": ", loaded.message()));
      return loaded;
    }
  }
  publish();

  // The final average (docs/GOSSIP.md): serve `own`, this worker's final
  // model, unchanged until the run ends; when the coordinator's GossipFinal
  // names the sources, average their final models in that order (every
  // worker adds the same floats in the same order: the same bits), report
  // the hash, and wait for the run's end. Every wait is bounded by
  // timeouts.round_timeout_ms.
  auto final_average = [&](std::shared_ptr<const GossipCopy> own) -> absl::Status {
    const absl::Duration wait =
        absl::Milliseconds(std::max<uint32_t>(1000, config.timeouts().round_timeout_ms()));
    report.set_gossip_done(true);
    {
      absl::MutexLock lock(&gossip_mu_);
      gossip_report_ = report;
    }
    SHOAL_LOG(INFO) << "gossip: trained " << steps << " steps; serving the final model, waiting "
                    << "(at most " << absl::FormatDuration(wait) << ") for the others";
    // Waits for `ready` or the run's end; nullopt = go on.
    auto wait_for = [&](const std::function<bool()>& ready,
                        const std::string& what) -> std::optional<absl::Status> {
      const absl::Time until = clock_->Now() + wait;
      while (!ready()) {
        if (StopRequested()) {
          stop_token_.Cancel();
          leave("worker stopped");
          return absl::OkStatus();
        }
        if (clock_->Now() >= until) {
          SHOAL_LOG(WARNING) << "gossip: " << what << " did not come within "
                             << absl::FormatDuration(wait) << "; leaving";
          leave(absl::StrCat("finished ", steps, " gossip steps (", what, " did not come)"));
          return absl::OkStatus();
        }
        if (std::optional<absl::Status> exit = handle_events(absl::Milliseconds(100))) return exit;
      }
      return std::nullopt;
    };
    if (std::optional<absl::Status> exit =
            wait_for([&] { return final_list.has_value(); }, "the final average's list")) {
      return *exit;
    }
    std::vector<double> sum(n, 0.0);
    std::vector<float> own_decoded;
    uint32_t models = 0;
    std::string error;
    const absl::Time t0 = clock_->Now();
    for (const shoal::v1::GossipPeer& source : final_list->sources()) {
      const float* p = nullptr;
      GossipFetchResult r;
      if (source.worker_id() == self) {
        p = own->params.data();
        if (own->encoded != nullptr) {
          // Our own final model as the others decode it: every worker adds
          // the same floats.
          own_decoded.resize(n);
          absl::Status d = codec_->DecodeSlice(
              absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(own->encoded->data()),
                                  own->encoded->size()),
              n, own_decoded.data());
          if (!d.ok()) {
            error = std::string(d.message());
            break;
          }
          p = own_decoded.data();
        }
      } else {
        r.status = absl::CancelledError("worker stopped");
        for (int attempt = 0; attempt < 3 && !StopRequested(); ++attempt) {
          r = fetcher.FetchNow(source.worker_id(), source.peer_address(), n, g.timeout);
          if (r.status.ok()) break;
        }
        if (!r.status.ok()) {
          error = std::string(r.status.message());
          break;
        }
        p = r.peer_params;
      }
      for (uint64_t i = 0; i < n; ++i) sum[i] += p[i];
      ++models;
    }
    std::shared_ptr<const GossipCopy> upload = own;
    if (error.empty() && models > 0) {
      for (uint64_t i = 0; i < n; ++i) params[i] = static_cast<float>(sum[i] / models);
      const std::string hash = HashParameters(params, n);
      evaluate();
      report.set_final_hash(hash);
      report.set_final_models(models);
      SHOAL_LOG(INFO) << absl::StrFormat(
          "gossip: final average of %d models in %.2fs: hash %s test_accuracy=%.4f", models,
          absl::ToDoubleSeconds(clock_->Now() - t0), hash.substr(0, 16), report.test_accuracy());
      auto averaged = std::make_shared<GossipCopy>();
      averaged->publication = own->publication;
      averaged->clock = clock;
      averaged->loss = last_loss;
      averaged->params.assign(params, params + n);
      upload = std::move(averaged);
    } else {
      if (error.empty()) error = "no model to average";
      report.set_final_error(error);
      SHOAL_LOG(WARNING) << "gossip: final average failed (" << error
                         << "); this worker keeps its own model";
    }
    {
      absl::MutexLock lock(&gossip_mu_);
      gossip_report_ = report;
    }
    if (checkpointer != nullptr && ckpt_sequence > 0) {
      checkpointer->Wait();
      if (std::optional<GossipUploadResult> r = checkpointer->Take()) on_uploaded(*r);
      if (ckpt_sequence > 0) on_uploaded(checkpointer->UploadNow(upload_job(upload)));
    }
    // Others may still be fetching our final model: serve it until the
    // coordinator ends the run (handle_events returns at RunFinished).
    if (std::optional<absl::Status> exit = wait_for([] { return false; }, "the run's end")) {
      return *exit;
    }
    return absl::OkStatus();
  };

  while (true) {
    if (StopRequested()) {
      stop_token_.Cancel();
      leave("worker stopped");
      return absl::OkStatus();
    }
    if (std::optional<absl::Status> exit = handle_events(absl::ZeroDuration())) return *exit;
    if (g.steps > 0 && steps >= g.steps) {
      if (config.gossip().final_average()) {
        // A fetch in flight ends within its timeout; its result is dropped:
        // the final model is what this worker had when it finished.
        while (!fetcher.idle()) {
          fetcher.Take();
          absl::SleepFor(absl::Milliseconds(2));
        }
      }
      evaluate();
      next_projection = absl::InfinitePast();
      std::shared_ptr<const GossipCopy> last = publish();
      if (config.gossip().final_average()) {
        return final_average(last != nullptr ? std::move(last) : gossip_board_.Current());
      }
      if (checkpointer != nullptr && ckpt_sequence > 0) {
        // The checkpointer's final model goes to the store too, as a
        // synchronous run's last round does.
        checkpointer->Wait();
        if (std::optional<GossipUploadResult> r = checkpointer->Take()) on_uploaded(*r);
        if (ckpt_sequence > 0) {
          on_uploaded(checkpointer->UploadNow(
              upload_job(last != nullptr ? std::move(last) : gossip_board_.Current())));
        }
      }
      {
        absl::MutexLock lock(&gossip_mu_);
        gossip_report_ = report;
      }
      // Let one heartbeat carry the final figures before leaving.
      absl::SleepFor(absl::Milliseconds(std::min<uint32_t>(
          2000, std::max<uint32_t>(100, config.timeouts().heartbeat_interval_ms()) * 3 / 2)));
      SHOAL_LOG(INFO) << "gossip: finished " << steps << " steps";
      leave(absl::StrCat("finished ", steps, " gossip steps"));
      return absl::OkStatus();
    }
    const absl::Time t0 = clock_->Now();
    loss_sum += trainer_->TrainSteps(1);
    ++loss_count;
    ++steps;
    clock += batch;
    M().train_seconds.Observe(absl::ToDoubleSeconds(clock_->Now() - t0));
    if (std::optional<GossipFetchResult> r = fetcher.Take()) {
      if (r->status.ok() && r->base != nullptr) {
        const GossipState own{r->base->clock, r->base->loss > 0 ? r->base->loss : last_loss};
        const double a = InterpolationFactor(g, own, {r->peer_clock, r->peer_loss});
        ApplyInterpolation(params, r->base->params.data(), r->peer_params, n, a);
        clock = InterpolateClock(clock, r->base->clock, r->peer_clock, a);
        chooser.OnSuccess(r->peer_id);
        report.set_fetches_done(report.fetches_done() + 1);
        report.set_last_partner(r->peer_id);
        report.set_last_factor(a);
        M().received_bytes.Add(static_cast<double>(r->wire_bytes));
        SHOAL_VLOG(1) << absl::StrFormat("gossip: merged %s's model (clock %.0f) a=%.3f in %.3fs",
                                         r->peer_id, r->peer_clock, a,
                                         absl::ToDoubleSeconds(r->took));
        if (outbound_only_ && !r->pushed) {
          SHOAL_LOG(WARNING) << "gossip: pushing our model to " << r->peer_id
                             << " failed: " << r->push_status.message();
        }
      } else {
        if (r->not_answering) {
          chooser.OnTimeout(r->peer_id);
          report.set_fetches_timed_out(report.fetches_timed_out() + 1);
        } else {
          report.set_fetches_failed(report.fetches_failed() + 1);
        }
        SHOAL_LOG(WARNING) << r->status.message() << " (dropped whole)";
      }
    }
    // A partner behind NAT pushed us its model (it cannot be fetched):
    // merged like a fetched one, against our current parameters.
    if (std::optional<GossipPush> p = push_box_->TakeGossip()) {
      if (p->bytes.size() == n * sizeof(float)) {
        const double a = InterpolationFactor(g, {clock, last_loss}, {p->clock, p->loss});
        ApplyInterpolation(params, params, reinterpret_cast<const float*>(p->bytes.data()), n, a);
        clock = InterpolateClock(clock, clock, p->clock, a);
        report.set_last_partner(p->pusher);
        report.set_last_factor(a);
        report.set_pushes_merged(report.pushes_merged() + 1);
        M().received_bytes.Add(static_cast<double>(p->bytes.size()));
        SHOAL_VLOG(1) << absl::StrFormat("gossip: merged %s's pushed model (clock %.0f) a=%.3f",
                                         p->pusher, p->clock, a);
      } else {
        SHOAL_LOG(WARNING) << "gossip: dropped a model of " << p->bytes.size()
                           << " bytes pushed by " << p->pusher << " (the model has "
                           << n * sizeof(float) << ")";
      }
    }
    if (checkpointer != nullptr) {
      if (std::optional<GossipUploadResult> r = checkpointer->Take()) on_uploaded(*r);
    }
    if (steps % g.gossip_every != 0) continue;
    last_loss = loss_sum / std::max<uint32_t>(1, loss_count);
    loss_sum = 0;
    loss_count = 0;
    M().train_loss.Set(last_loss);
    if ((steps / g.gossip_every) % eval_every == 0) evaluate();
    if (config.gossip().consensus_eval_every() > 0 &&
        (steps / g.gossip_every) % config.gossip().consensus_eval_every() == 0) {
      evaluate_consensus();
    }
    std::shared_ptr<const GossipCopy> base = publish();
    if (ckpt_sequence > 0 && CheckpointDue(steps, ckpt_due) && base != nullptr &&
        checkpointer->idle()) {
      // The published copy is held for the whole upload: training goes on
      // in the parameters, peers keep reading the same bytes.
      checkpointer->Start(upload_job(base));
      ckpt_due = NextCheckpointStep(steps, config.gossip().checkpoint_every());
    }
    if (base != nullptr && fetcher.idle() && chooser.size() > 0 && fetch_now(rng)) {
      const std::optional<std::string> id = chooser.Choose();
      fetcher.Start(*id, chooser.Address(*id), n, g.timeout, std::move(base));
    }
  }
}

absl::Status Worker::LoadGossipCheckpoint(const std::string& id, float* params, uint64_t n,
                                          double* clock) {
  if (store_ == nullptr) {
    return absl::FailedPreconditionError("the run names a checkpoint but no checkpoint store");
  }
  absl::StatusOr<shoal::v1::Manifest> manifest = store_->GetManifest(id);
  if (!manifest.ok()) return Annotate(manifest.status(), "checkpoint store");
  const std::vector<LayerInfo>& layers = trainer_->layers();
  const int count = checkpoint::ModelLayerCount(*manifest);
  if (count != static_cast<int>(layers.size())) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", id, " has ", count,
                                                      " model layers, this model ", layers.size()));
  }
  std::vector<uint8_t> bytes;
  for (int i = 0; i < count; ++i) {
    const shoal::v1::LayerEntry& entry = manifest->layers(i);
    const LayerInfo& l = layers[i];
    if (entry.name() != l.name || entry.bytes() != l.elements * sizeof(float) ||
        l.offset + l.elements > n) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", id, " layer ", i, " is ", entry.name(), " of ", entry.bytes(),
                       " bytes; this model has ", l.name, " of ", l.elements * sizeof(float)));
    }
    RETURN_IF_ERROR(checkpoint::ReadWholeLayer(store_.get(), id, *manifest, i, &bytes));
    std::memcpy(params + l.offset, bytes.data(), bytes.size());
  }
  const std::string hash = HashParameters(params, n);
  if (!manifest->model_sha256().empty() && hash != manifest->model_sha256()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", id, ": the model hashes to ", hash,
                                            ", the manifest says ", manifest->model_sha256()));
  }
  *clock = manifest->gossip_clock();
  SHOAL_LOG(INFO) << absl::StrFormat(
      "started from checkpoint %s (model sha256 %s, clock %.0f; %s)", id, hash, *clock,
      manifest->gossip() ? absl::StrCat("uploaded by ", manifest->worker_id(), " at ",
                                        manifest->gossip_steps(), " steps")
                         : absl::StrCat("round ", manifest->round(), " of a synchronous run"));
  return absl::OkStatus();
}

}  // namespace shoal::worker
