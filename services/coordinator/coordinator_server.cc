#include "services/coordinator/coordinator_server.h"

#include <unordered_set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/run_options.h"
#include "common/sha256.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/coordinator/replica_front.h"
#include "services/coordinator/token_gate.h"

namespace shoal::coordinator {
namespace {

// The coordinator's Prometheus series, refreshed from RoundEngine::Status()
// on the ticker thread when the status changed since the last look (the
// engine itself knows nothing of metrics; no lock is added to it).
class StatusMetrics {
 public:
  StatusMetrics()
      : round_(Metrics::Gauge("shoal_round", "Current (or next) round number.")),
        last_completed_(Metrics::Gauge("shoal_last_completed_round",
                                       "Last round every participant finished with agreeing "
                                       "hashes (0 = none).")),
        members_(Metrics::Gauge("shoal_members", "Active members (joined, not removed).")),
        participants_(Metrics::Gauge("shoal_participants", "Participants of the current round.")),
        queued_(Metrics::Gauge("shoal_queued_workers", "Workers queued for the next round.")),
        evictions_(Metrics::Counter("shoal_evictions_total",
                                    "Workers evicted (minority hash, unreachable, missed rounds "
                                    "are counted when the status shows them evicted).")),
        rounds_(Metrics::Counter("shoal_rounds_completed_total",
                                 "Rounds completed with agreeing hashes.")),
        round_seconds_(Metrics::Histogram("shoal_round_duration_seconds",
                                          "Wall time of a completed round, from its start to the "
                                          "last hash report.",
                                          Metrics::SecondsBuckets())),
        train_loss_(Metrics::Gauge("shoal_run_train_loss",
                                   "Mean training loss of the participants of the last completed "
                                   "round.")),
        test_accuracy_(Metrics::Gauge("shoal_run_test_accuracy",
                                      "Test accuracy (0..1) of the averaged model, latest known.")),
        checkpoint_round_(Metrics::Gauge("shoal_checkpoint_round",
                                         "Round of the latest checkpoint (0 = none).")) {
    for (int p = shoal::v1::Phase_MIN; p <= shoal::v1::Phase_MAX; ++p) {
      if (!shoal::v1::Phase_IsValid(p) || p == shoal::v1::PHASE_UNSPECIFIED) continue;
      phases_.push_back(
          Metrics::Gauge("shoal_phase", "1 for the run's current phase, 0 for the others.",
                         {{"phase", absl::AsciiStrToLower(shoal::v1::Phase_Name(p))}}));
      phase_values_.push_back(p);
    }
  }

  // O(members) when the status changed, O(1) otherwise.
  void Update(const RoundEngine& engine) {
    if (engine.status_version() == version_ && version_ != 0) return;
    const shoal::v1::RunStatus s = engine.Status(&version_);
    round_.Set(static_cast<double>(s.round()));
    last_completed_.Set(static_cast<double>(s.last_completed_round()));
    members_.Set(s.members());
    participants_.Set(s.participants_size());
    queued_.Set(s.queued());
    checkpoint_round_.Set(static_cast<double>(s.checkpoint_round()));
    for (size_t i = 0; i < phases_.size(); ++i) phases_[i].Set(phase_values_[i] == s.phase());
    for (const auto& w : s.workers()) {
      if (w.state() == "evicted" && evicted_.insert(w.id()).second) evictions_.Add();
    }
    for (const auto& r : s.recent_rounds()) {
      if (r.round() <= last_round_seen_) continue;
      last_round_seen_ = r.round();
      rounds_.Add();
      round_seconds_.Observe(r.seconds());
      train_loss_.Set(r.train_loss());
      if (r.evaluated()) test_accuracy_.Set(r.test_accuracy());
    }
  }

 private:
  MetricGauge round_, last_completed_, members_, participants_, queued_;
  MetricCounter evictions_, rounds_;
  MetricHistogram round_seconds_;
  MetricGauge train_loss_, test_accuracy_, checkpoint_round_;
  std::vector<MetricGauge> phases_;
  std::vector<int> phase_values_;
  uint64_t version_ = 0;
  // Worker ids are never reused within a run, so a set of the evicted ones
  // counts each eviction once (evictions are rare; the set stays small).
  std::unordered_set<std::string> evicted_;
  // Rounds already observed: a resumed run starts past them.
  uint64_t last_round_seen_ = 0;
};

// Beyond this many rounds a late update's weight (1 / (1 + s)) is noise.
constexpr uint32_t kMaxStalenessLimit = 1000;

}  // namespace

absl::Status ValidateConfig(const shoal::v1::RunConfig& c) {
  if (c.model() != "mlp" && c.model() != "cnn" && c.model() != "torchscript") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model must be 'mlp', 'cnn' or 'torchscript:PATH', got '", c.model(), "'"));
  }
  if ((c.model() == "torchscript") != !c.model_file_sha256().empty()) {
    return absl::InvalidArgumentError(
        "a TorchScript model needs its file's SHA-256, and only a TorchScript model has one");
  }
  if (!c.optimizer().empty() && c.optimizer() != "sgd" && c.optimizer() != "adam" &&
      c.optimizer() != "adamw") {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer must be 'sgd', 'adam' or 'adamw', got '", c.optimizer(), "'"));
  }
  if (!(c.learning_rate() > 0)) return absl::InvalidArgumentError("--learning_rate must be > 0");
  if (c.momentum() < 0 || c.momentum() >= 1) {
    return absl::InvalidArgumentError("--momentum must be in [0, 1)");
  }
  if (c.batch_size() == 0) return absl::InvalidArgumentError("--batch_size must be > 0");
  if (c.local_steps() == 0) return absl::InvalidArgumentError("--local_steps must be > 0");
  if (c.min_participants() == 0) {
    return absl::InvalidArgumentError("--min_participants must be > 0");
  }
  if (c.data_shards() == 0) return absl::InvalidArgumentError("--data_shards must be > 0");
  if (c.eval_every() == 0) return absl::InvalidArgumentError("--eval_every must be > 0");
  absl::StatusOr<CodecSpec> codec = ParseCodecSpec(c.codec());
  if (!codec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--codec: ", codec.status().message()));
  }
  absl::StatusOr<OuterOptimizer> outer = ParseOuterOptimizer(c.outer_optimizer());
  if (!outer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--outer_optimizer: ", outer.status().message()));
  }
  if (*outer != OuterOptimizer::kNone && !(c.outer_lr() > 0 && c.outer_lr() <= 10)) {
    return absl::InvalidArgumentError("--outer_lr must be in (0, 10]");
  }
  if (c.outer_momentum() < 0 || c.outer_momentum() >= 1) {
    return absl::InvalidArgumentError("--outer_momentum must be in [0, 1)");
  }
  absl::StatusOr<DataSplit> split = ParseDataSplit(c.data_split());
  if (!split.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--data_split: ", split.status().message()));
  }
  absl::StatusOr<AggregationSpec> aggregation = ParseAggregation(c.aggregation());
  if (!aggregation.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--aggregation: ", aggregation.status().message()));
  }
  if (MinContributions(*aggregation) > c.min_participants()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--aggregation=", c.aggregation(), " drops ", aggregation->trim,
                     " values at each end, so it needs at least ", MinContributions(*aggregation),
                     " participants per round; --min_participants is ", c.min_participants()));
  }
  if (c.mode() == "gossip" && aggregation->kind != AggregationSpec::Kind::kMean) {
    return absl::InvalidArgumentError(
        "--aggregation shapes the synchronous exchange's slice owners; --mode=gossip has none "
        "(use --aggregation=mean)");
  }
  if (c.hierarchy() && c.mode() == "gossip") {
    return absl::InvalidArgumentError(
        "--hierarchy=on shapes the rounds of --mode=sync; gossip has no rounds");
  }
  if (c.mode() == "gossip" && *outer != OuterOptimizer::kNone) {
    return absl::InvalidArgumentError(
        "--outer_optimizer steps from a round's agreed base; --mode=gossip has no rounds and "
        "no agreed base (use --outer_optimizer=none)");
  }
  if (c.max_staleness() > kMaxStalenessLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_staleness must be at most ", kMaxStalenessLimit));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<shoal::v1::RunRecord>> ResumeFromStore(const std::string& store,
                                                                    const std::string& run_id) {
  checkpoint::CheckpointClientOptions copts;
  copts.call_timeout = absl::Seconds(20);  // the store may be starting too
  checkpoint::GrpcCheckpointClient client(store, copts);
  absl::StatusOr<std::vector<shoal::v1::CheckpointInfo>> list = client.List(run_id);
  if (!list.ok()) {
    return absl::Status(list.status().code(), absl::StrCat("cannot look for checkpoints of run ",
                                                           run_id, " in --checkpoint_store ", store,
                                                           ": ", list.status().message()));
  }
  const shoal::v1::CheckpointInfo* newest = nullptr;
  for (const auto& info : *list) {
    if (info.run_id() != run_id || !info.damage().empty()) continue;
    if (newest == nullptr || info.round() > newest->round()) newest = &info;
  }
  if (newest == nullptr) {
    SHOAL_LOG(INFO) << "no checkpoint of run " << run_id << " in " << store << "; starting fresh";
    return std::optional<shoal::v1::RunRecord>();
  }
  absl::StatusOr<shoal::v1::Manifest> manifest = client.GetManifest(newest->id());
  if (!manifest.ok()) return manifest.status();
  shoal::v1::RunRecord r;
  r.set_run_id(run_id);
  r.set_last_completed_round(manifest->round());
  r.set_model_hash(manifest->model_sha256());
  r.set_checkpoint_id(manifest->id());
  r.set_checkpoint_round(manifest->round());
  r.set_next_worker_number(1);
  SHOAL_LOG(INFO) << "resuming run " << run_id << " from checkpoint " << manifest->id()
                  << " (round " << manifest->round() << ")";
  return std::optional<shoal::v1::RunRecord>(r);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorOptions options, const Clock* clock) {
  if (absl::Status s = ValidateConfig(options.engine.config); !s.ok()) return s;

  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->clock_ = clock;
  if (!options.etcd.empty()) {
    if (!options.state_dir.empty()) {
      return absl::InvalidArgumentError(
          "--etcd and --state_dir are exclusive: with --etcd the run record lives in etcd");
    }
    if (absl::Status s = server->StartReplica(options); !s.ok()) return s;
  } else {
    if (absl::Status s = server->StartSingle(options); !s.ok()) return s;
  }
  CoordinatorServer* raw = server.get();
  std::shared_ptr<StatusMetrics> status_metrics;
  // One server for both when they name the same address (port 0 included):
  // the web server serves /metrics anyway.
  server->metrics_merged_ =
      !options.http_listen.empty() && options.http_listen == options.metrics_listen;
  if (!options.metrics_listen.empty() && !server->metrics_merged_) {
    absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Start(options.metrics_listen);
    if (!metrics.ok()) return metrics.status();
    server->metrics_ = std::move(*metrics);
    SHOAL_LOG(INFO) << "metrics on " << server->metrics_->address();
  }
  if (!options.http_listen.empty()) {
    server->web_ = std::make_shared<WebPage>(
        WebPage::Source{[raw] {
                          RoundEngine* e = raw->active_engine();
                          return e != nullptr ? e->status_version() : 0;
                        },
                        [raw](uint64_t* version) { return raw->CurrentStatus(version); }});
    absl::StatusOr<std::unique_ptr<HttpServer>> http =
        HttpServer::Start(options.http_listen, "http_listen", server->web_->Routes(true));
    if (!http.ok()) return http.status();
    server->http_ = std::move(*http);
    SHOAL_LOG(INFO) << "web page on http://" << server->http_->address() << "/";
    if (server->metrics_merged_) SHOAL_LOG(INFO) << "metrics on " << server->http_->address();
    server->web_->Update();
  }
  if (!options.metrics_listen.empty() || !options.http_listen.empty()) {
    status_metrics = std::make_shared<StatusMetrics>();
    if (RoundEngine* e = server->active_engine()) status_metrics->Update(*e);
  }
  std::shared_ptr<WebPage> web = server->web_;
  absl::Notification* stop = &server->stop_;
  const absl::Duration tick = options.tick_interval;
  server->ticker_ = std::thread([raw, status_metrics, web, stop, tick] {
    while (!stop->WaitForNotificationWithTimeout(tick)) {
      CoordinatorService* service;
      RoundEngine* engine;
      {
        absl::MutexLock lock(&raw->active_mu_);
        service = raw->service_;
        engine = raw->engine_;
      }
      if (service == nullptr) continue;  // a standby replica
      service->Tick();
      if (status_metrics) status_metrics->Update(*engine);
      if (web) web->Update();
    }
  });
  return server;
}

absl::Status CoordinatorServer::StartSingle(CoordinatorOptions options) {
  records_ = std::make_unique<RunRecordStore>(options.state_dir);
  if (absl::Status s = records_->Open(); !s.ok()) return s;
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> record = records_->Load();
  if (!record.ok()) return record.status();
  if (record->has_value()) {
    const shoal::v1::RunRecord& r = **record;
    if (options.run_id_from_flag && r.run_id() != options.engine.run_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--state_dir ", options.state_dir, " holds run ", r.run_id(),
          ", not --run_id=", options.engine.run_id, "; use another --state_dir for a new run"));
    }
    if (r.config().SerializeAsString() != options.engine.config.SerializeAsString()) {
      SHOAL_LOG(WARNING) << "the run record's configuration differs from the flags; the run "
                            "continues with the recorded one";
    }
    options.engine.run_id = r.run_id();
    options.engine.config = r.config();
    options.engine.resume = r;
  } else if (options.run_id_from_flag && !options.engine.config.checkpoint_store().empty()) {
    // A full restart: no record here, but the store may hold the run.
    absl::StatusOr<std::optional<shoal::v1::RunRecord>> from_store =
        ResumeFromStore(options.engine.config.checkpoint_store(), options.engine.run_id);
    if (!from_store.ok()) return from_store.status();
    if (from_store->has_value()) {
      shoal::v1::RunRecord r = **from_store;
      *r.mutable_config() = options.engine.config;
      options.engine.resume = r;
    }
  }
  if (const auto& c = options.engine.config; c.model() == "torchscript") {
    const std::string got = Sha256Hex(options.model_file.data(), options.model_file.size());
    if (got != c.model_file_sha256() || options.model_file.size() != c.model_file_bytes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the model file (", options.model_file.size(), " bytes, SHA-256 ", got,
                       ") does not match the run's (SHA-256 ", c.model_file_sha256(),
                       "): a resumed run keeps its model file"));
    }
  }
  owned_engines_.push_back(std::make_unique<RoundEngine>(options.engine, clock_));
  RoundEngine* engine = owned_engines_.back().get();
  owned_services_.push_back(
      std::make_unique<CoordinatorService>(engine, clock_, [this] { Persist(); }));
  CoordinatorService* service = owned_services_.back().get();
  service->SetModelFile(options.model_file, options.engine.config.model_file_sha256());
  service->set_relay_limits(options.relay);
  {
    absl::MutexLock lock(&active_mu_);
    engine_ = engine;
    service_ = service;
  }
  Persist();
  grpc::Service* registered = service;
  if (!options.gate.open() || options.max_joins_per_minute > 0) {
    if (options.max_joins_per_minute > 0) {
      join_limiter_ = std::make_unique<JoinLimiter>(options.max_joins_per_minute, clock_);
    }
    gated_ = std::make_unique<GatedCoordinator>(service, options.gate, join_limiter_.get());
    registered = gated_.get();
  }
  auto grpc_server = GrpcServer::Start(options.listen, {registered});
  if (!grpc_server.ok()) return grpc_server.status();
  server_ = std::move(*grpc_server);
  server_->SetServing(kCoordinatorHealthName, true);
  return absl::OkStatus();
}

void CoordinatorServer::Persist() {
  if (!records_->enabled()) return;
  RoundEngine* engine = active_engine();
  absl::MutexLock lock(&persist_mu_);
  const uint64_t version = engine->record_version();
  if (version == persisted_version_) return;
  absl::Status s = records_->Save(engine->Record());
  if (!s.ok()) {
    SHOAL_LOG(ERROR) << "cannot persist the run record: " << s;
    return;
  }
  persisted_version_ = version;
}

shoal::v1::RunStatus CoordinatorServer::CurrentStatus(uint64_t* version) {
  RoundEngine* engine;
  CoordinatorService* service;
  {
    absl::MutexLock lock(&active_mu_);
    engine = engine_;
    service = service_;
  }
  if (engine == nullptr) {
    *version = 0;
    return StandbyStatus();
  }
  // What GetRunStatus answers (the replica's role merged in).
  shoal::v1::RunStatus status = engine->Status(version);
  if (service != nullptr) status.MergeFrom(service->status_extra());
  return status;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::Seconds(1)); }

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  if (replica_thread_.joinable()) replica_thread_.join();
  if (etcd_ != nullptr) {
    // Hand over at once instead of after a lease TTL.
    absl::MutexLock lock(&replica_mu_);
    if (replica_ != nullptr) replica_->Resign();
  }
  // Start() may have failed before everything existed.
  if (CoordinatorService* service = active_service()) service->CloseAllSessions();
  // The page's handlers read the engines: stop it before anything goes.
  http_.reset();
  if (server_) server_->Shutdown(grace);
  metrics_.reset();
}

}  // namespace shoal::coordinator
