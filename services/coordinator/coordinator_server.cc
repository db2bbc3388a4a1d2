#include "services/coordinator/coordinator_server.h"

#include <algorithm>
#include <string>
#include <utility>
#include <unordered_set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/run_config.h"
#include "common/sha256.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/coordinator/coordinator_endpoint.h"
#include "services/coordinator/core/base_recovery.h"
#include "services/coordinator/core/request_limits.h"
#include "services/coordinator/core/run_settings.h"

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
        checkpoint_round_(
            Metrics::Gauge("shoal_checkpoint_round", "Round of the latest checkpoint (0 = none).")),
        bans_(Metrics::Gauge("shoal_bans", "Members banned from the run now (--ban_below).")) {
    // Audits by replay (--audit_rate), by result.
    for (const char* result : {"performed", "failed", "dropped"}) {
      audits_.push_back(Metrics::Counter("shoal_audits_total",
                                         "Audits by replay, by result (docs/SECURITY.md).",
                                         {{"result", result}}));
    }
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
    if (!s.run_id().empty()) Metrics::SetRunInfo(s.run_id());
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
    // Bandwidth-proportional slices (issue 49): each member's measured
    // exchange rate and slice share, by worker id (0 once it left).
    for (const auto& w : s.workers()) {
      auto [it, fresh] = slices_.try_emplace(w.id());
      if (fresh) {
        it->second.first = Metrics::Gauge(
            "shoal_worker_exchange_rate_bytes_per_second",
            "A member's measured exchange rate, smoothed: what its peers read from it per "
            "second (0 = not measured).",
            {{"worker", w.id()}});
        it->second.second = Metrics::Gauge(
            "shoal_worker_slice_share",
            "The fraction of the model a member's slice held in the latest plan.",
            {{"worker", w.id()}});
      }
      const bool active = w.state() != "left" && w.state() != "lost" &&
                          w.state() != "finished" && w.state() != "evicted";
      it->second.first.Set(active ? w.exchange_rate_bytes_per_second() : 0);
      it->second.second.Set(active ? w.slice_share() : 0);
    }
    bans_.Set(s.bans_size());
    const uint64_t audits[3] = {s.audits_performed(), s.audits_failed(), s.audits_dropped()};
    for (size_t i = 0; i < 3; ++i) {
      // A new leader counts from 0 again: its counts add from there.
      if (audits[i] < audits_seen_[i]) audits_seen_[i] = 0;
      if (audits[i] > audits_seen_[i])
        audits_[i].Add(static_cast<double>(audits[i] - audits_seen_[i]));
      audits_seen_[i] = audits[i];
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
  MetricGauge train_loss_, test_accuracy_, checkpoint_round_, bans_;
  std::vector<MetricCounter> audits_;
  uint64_t audits_seen_[3] = {0, 0, 0};
  std::vector<MetricGauge> phases_;
  std::vector<int> phase_values_;
  // Per worker id: its exchange rate and slice share gauges.
  absl::flat_hash_map<std::string, std::pair<MetricGauge, MetricGauge>> slices_;
  uint64_t version_ = 0;
  // Worker ids are never reused within a run, so a set of the evicted ones
  // counts each eviction once (evictions are rare; the set stays small).
  std::unordered_set<std::string> evicted_;
  // Rounds already observed: a resumed run starts past them.
  uint64_t last_round_seen_ = 0;
};

}  // namespace

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
  // The intact checkpoints, newest first: the newest is where the run
  // resumes, the others where it goes back to should that one turn out
  // damaged as the workers load it (core/base_recovery.h).
  std::vector<const shoal::v1::CheckpointInfo*> intact;
  for (const auto& info : *list) {
    if (info.run_id() == run_id && info.damage().empty()) intact.push_back(&info);
  }
  std::sort(intact.begin(), intact.end(),
            [](const auto* a, const auto* b) { return a->round() > b->round(); });
  if (intact.empty()) {
    SHOAL_LOG(INFO) << "no checkpoint of run " << run_id << " in " << store << "; starting fresh";
    return std::optional<shoal::v1::RunRecord>();
  }
  shoal::v1::RunRecord r;
  r.set_run_id(run_id);
  r.set_next_worker_number(1);
  for (const shoal::v1::CheckpointInfo* info : intact) {
    if (static_cast<size_t>(r.checkpoints_size()) == coordinator::kKnownCheckpoints) break;
    absl::StatusOr<shoal::v1::Manifest> manifest = client.GetManifest(info->id());
    if (!manifest.ok()) {
      if (r.checkpoints_size() == 0) return manifest.status();
      SHOAL_LOG(WARNING) << "checkpoint " << info->id()
                         << " left out of those to go back to: " << manifest.status();
      continue;
    }
    shoal::v1::CheckpointRef* ref = r.add_checkpoints();
    ref->set_id(manifest->id());
    ref->set_round(manifest->round());
    ref->set_model_hash(manifest->model_sha256());
    if (manifest->has_ledger()) *ref->mutable_ledger() = manifest->ledger();
  }
  const shoal::v1::CheckpointRef& newest = r.checkpoints(0);
  r.set_last_completed_round(newest.round());
  r.set_model_hash(newest.model_hash());
  r.set_checkpoint_id(newest.id());
  r.set_checkpoint_round(newest.round());
  if (newest.has_ledger()) *r.mutable_ledger() = newest.ledger();
  SHOAL_LOG(INFO) << "resuming run " << run_id << " from checkpoint " << newest.id() << " (round "
                  << newest.round() << ")";
  return std::optional<shoal::v1::RunRecord>(r);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorOptions options, const Clock* clock) {
  // The config the run shows and records is what its engine uses.
  RecordRunSettings(options.engine, &options.engine.config);
  NormalizeRunConfig(&options.engine.config);
  if (absl::Status s = ValidateRunConfig(options.engine.config); !s.ok()) return s;
  if (absl::Status s = CheckRunId(options.engine.run_id); !s.ok()) return s;
  // Every method of the proto has its entry in the service's table.
  if (absl::Status s = CoordinatorService::CheckMethods(); !s.ok()) return s;

  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->clock_ = clock;
  server->writer_ = std::make_unique<RecordWriter>();
  server->before_record_write_ = options.before_record_write;
  if (options.engine.join_probe_timeout > absl::ZeroDuration()) {
    absl::StatusOr<std::unique_ptr<TcpProber>> prober = TcpProber::Start(clock);
    if (!prober.ok()) return prober.status();
    server->prober_ = std::move(*prober);
  }
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
                        [raw](uint64_t* version) { return raw->CurrentStatus(version); }},
        clock);
    absl::StatusOr<std::unique_ptr<HttpEndpoint>> http =
        HttpEndpoint::Start(options.http_listen, "http_listen", server->web_->Routes(true));
    if (!http.ok()) return http.status();
    server->http_ = std::move(*http);
    SHOAL_LOG(INFO) << "web page on " << server->http_->scheme() << "://"
                    << server->http_->address() << "/";
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
    std::string note;
    options.engine.config = ResumedRunConfig(r.config(), options.engine.config, &note);
    if (!note.empty()) SHOAL_LOG(WARNING) << note;
    options.engine.run_id = r.run_id();
    options.engine.resume = r;
  } else if (options.run_id_from_flag && !options.engine.config.checkpoints().store().empty()) {
    // A full restart: no record here, but the store may hold the run.
    absl::StatusOr<std::optional<shoal::v1::RunRecord>> from_store =
        ResumeFromStore(options.engine.config.checkpoints().store(), options.engine.run_id);
    if (!from_store.ok()) return from_store.status();
    if (from_store->has_value()) {
      shoal::v1::RunRecord r = **from_store;
      *r.mutable_config() = options.engine.config;
      options.engine.resume = r;
    }
  }
  // The record read back holds what strangers sent once (names, reasons):
  // the same limits as at the edge (core/request_limits.h).
  if (options.engine.resume.has_value()) {
    if (absl::Status s = CheckRunRecordText(*options.engine.resume); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the run record read back breaks the request limits: ", s.message()));
    }
  }
  if (const auto& c = options.engine.config; c.model().name() == "torchscript") {
    const std::string got = Sha256Hex(options.model_file.data(), options.model_file.size());
    if (got != c.model().file_sha256() || options.model_file.size() != c.model().file_bytes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the model file (", options.model_file.size(), " bytes, SHA-256 ", got,
                       ") does not match the run's (SHA-256 ", c.model().file_sha256(),
                       "): a resumed run keeps its model file"));
    }
  }
  owned_engines_.push_back(std::make_unique<RoundEngine>(options.engine, clock_));
  RoundEngine* engine = owned_engines_.back().get();
  owned_services_.push_back(std::make_unique<CoordinatorService>(
      engine, clock_, SinkFor(engine, [this] { Persist(); }), prober_.get()));
  CoordinatorService* service = owned_services_.back().get();
  service->SetModelFile(options.model_file, options.engine.config.model().file_sha256());
  service->set_relay_limits(options.relay);
  {
    absl::MutexLock lock(&active_mu_);
    engine_ = engine;
    service_ = service;
  }
  Persist();
  endpoint_ = MakeEndpoint(options, /*replica=*/false);
  endpoint_->SetActive(service);
  auto grpc_server = GrpcServer::Start(options.listen, {endpoint_.get()});
  if (!grpc_server.ok()) return grpc_server.status();
  server_ = std::move(*grpc_server);
  server_->SetServing(kCoordinatorHealthName, true);
  return absl::OkStatus();
}

std::unique_ptr<CoordinatorEndpoint> CoordinatorServer::MakeEndpoint(
    const CoordinatorOptions& options, bool replica) {
  if (options.max_joins_per_minute > 0) {
    join_limiter_ = std::make_unique<JoinLimiter>(options.max_joins_per_minute, clock_);
  }
  CoordinatorEndpoint::Standby standby;
  if (replica) {
    standby.status = [this] { return StandbyStatus(); };
    standby.leader = [this] { return LeaderHint(); };
  }
  return std::make_unique<CoordinatorEndpoint>(Admission(options.gate, join_limiter_.get()),
                                               std::move(standby));
}

RecordSink CoordinatorServer::SinkFor(RoundEngine* engine, std::function<void()> write) {
  RecordSink sink;
  sink.writer = writer_.get();
  sink.current = [this, engine] { return RecordTried(engine); };
  sink.write = [this, write = std::move(write)] {
    if (before_record_write_) before_record_write_();
    write();
  };
  return sink;
}

bool CoordinatorServer::RecordTried(RoundEngine* engine) {
  if (records_ != nullptr && !records_->enabled()) return true;
  if (engine != active_engine()) return true;  // a retired term
  return engine->record_version() == tried_version_.load();
}

void CoordinatorServer::Persist() {
  if (!records_->enabled()) return;
  RoundEngine* engine = active_engine();
  absl::MutexLock lock(&persist_mu_);
  const uint64_t version = engine->record_version();
  if (version == persisted_version_) {
    tried_version_ = version;
    return;
  }
  absl::Status s = records_->Save(engine->Record());
  // Tried: what waited for this write goes out (a failed one is logged and
  // tried again at the next change).
  tried_version_ = version;
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
  if (service != nullptr) {
    status.MergeFrom(service->status_extra());
    service->FillRelayedBy(&status);
  }
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
  // Joins still probing finish now (UNAVAILABLE), then calls waiting for
  // the record's write: the server's shutdown waits for every call.
  if (prober_) prober_->Shutdown();
  if (writer_) writer_->Stop();
  // The page's handlers read the engines: stop it before anything goes.
  http_.reset();
  if (server_) server_->Shutdown(grace);
  metrics_.reset();
}

}  // namespace shoal::coordinator
