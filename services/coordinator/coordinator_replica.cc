// CoordinatorServer as a replica on etcd (--etcd; docs/REPLICAS.md): the
// replica loop, promotion to leader (the run record is loaded from etcd and a
// fresh engine resumes it, as after a restart on --state_dir) and demotion.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "services/coordinator/coordinator_endpoint.h"
#include "services/coordinator/coordinator_server.h"
#include "services/coordinator/core/request_limits.h"
#include "services/coordinator/core/run_settings.h"

namespace shoal::coordinator {

absl::Status CoordinatorServer::StartReplica(CoordinatorOptions options) {
  if (options.lease_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--lease_ttl must be at least 1s (etcd counts in seconds)");
  }
  if (options.etcd_prefix.empty()) {
    return absl::InvalidArgumentError("--etcd_prefix must not be empty");
  }
  options_ = options;
  EtcdClientOptions eopts;
  eopts.endpoints = options.etcd;
  // A renewal must fit well inside the lease.
  eopts.call_timeout = std::min(absl::Seconds(1), options.lease_ttl / 4);
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = MakeGrpcEtcdClient(eopts);
  if (!etcd.ok()) return etcd.status();
  etcd_ = std::move(*etcd);
  // A standby until elected: no active service.
  endpoint_ = MakeEndpoint(options, /*replica=*/true);
  auto grpc_server = GrpcServer::Start(options.listen, {endpoint_.get()});
  if (!grpc_server.ok()) return grpc_server.status();
  server_ = std::move(*grpc_server);
  server_->SetServing(kCoordinatorHealthName, false);
  ReplicaOptions ropts;
  ropts.prefix = options.etcd_prefix;
  ropts.self = options.advertise.empty() ? server_->address() : options.advertise;
  ropts.lease_ttl = absl::Seconds(absl::ToInt64Seconds(options.lease_ttl));
  options_.advertise = ropts.self;
  {
    absl::MutexLock lock(&replica_mu_);
    replica_ = std::make_unique<Replica>(etcd_.get(), ropts, clock_);
  }
  SHOAL_LOG(INFO) << "replica " << ropts.self << " on etcd " << absl::StrJoin(options.etcd, ",")
                  << " prefix " << ropts.prefix << " lease ttl " << ropts.lease_ttl;
  const absl::Duration period = std::max(absl::Milliseconds(100), ropts.lease_ttl / 4);
  replica_thread_ = std::thread([this, period] { ReplicaLoop(period); });
  return absl::OkStatus();
}

void CoordinatorServer::ReplicaLoop(absl::Duration period) {
  do {
    ReplicaEvent event;
    ReplicaState state;
    {
      absl::MutexLock lock(&replica_mu_);
      if (deposed_) {
        // A refused record write stepped the replica down already.
        event = ReplicaEvent::kDeposed;
        deposed_ = false;
      } else {
        event = replica_->Step();
      }
      state = replica_->state();
    }
    if (event == ReplicaEvent::kElected) Promote();
    if (event == ReplicaEvent::kDeposed) Demote();
    RoundEngine* engine = active_engine();
    CoordinatorService* service = active_service();
    if (engine != nullptr && service != nullptr) {
      // Rounds start only while the lease is certainly alive and the record
      // in etcd is current (a completed round is written before the next).
      const bool current = PersistToEtcd(engine);
      const bool can = current && [&] {
        absl::MutexLock lock(&replica_mu_);
        return replica_->CanStartRounds();
      }();
      service->Deliver(engine->HoldRounds(!can));
    } else {
      // A standby's view of the run, for GetRunStatus.
      absl::StatusOr<std::optional<shoal::v1::RunRecord>> record;
      {
        absl::MutexLock lock(&replica_mu_);
        record = replica_->LoadRecord();
      }
      absl::MutexLock lock(&view_mu_);
      leader_hint_ = state.leader;
      shoal::v1::RunStatus& v = standby_view_;
      v.set_replica_role("standby");
      v.set_leader(state.leader);
      if (record.ok() && record->has_value() && CheckRunRecordText(**record).ok()) {
        const shoal::v1::RunRecord& r = **record;
        v.set_run_id(r.run_id());
        *v.mutable_config() = r.config();
        v.set_min_participants(r.config().sync().min_participants());
        v.set_last_completed_round(r.last_completed_round());
        v.set_round(r.last_completed_round() + 1);
        v.set_model_hash(r.model_hash());
        v.set_checkpoint_id(r.checkpoint_id());
        v.set_checkpoint_round(r.checkpoint_round());
      }
      if (!state.etcd_error.empty()) {
        v.set_detail(absl::StrCat("standby; etcd unreachable: ", state.etcd_error));
      } else {
        v.set_detail(state.leader.empty() ? "standby; no leader elected"
                                          : absl::StrCat("standby; the leader is ", state.leader));
      }
    }
  } while (!WaitForNextStep(period));
}

bool CoordinatorServer::WaitForNextStep(absl::Duration period) {
  // A standby campaigns as soon as the leader key is gone, instead of up
  // to a whole period after the old leader's lease expired: that wait is
  // part of every failover. It watches the key (one etcd stream per step,
  // at most a second each so that a stop is not held up) from the revision
  // its last step read; without one, it looks every `poll` (a local read).
  const absl::Duration poll = std::clamp(period / 5, absl::Milliseconds(50), period);
  const absl::Time step_at = clock_->Now() + period;
  while (true) {
    const absl::Duration left = step_at - clock_->Now();
    if (left <= absl::ZeroDuration()) return stop_.HasBeenNotified();
    if (stop_.HasBeenNotified()) return true;
    if (active_engine() == nullptr) {
      int64_t revision = 0;
      {
        absl::MutexLock lock(&replica_mu_);
        revision = replica_->leader_watch_revision();
      }
      if (revision > 0) {
        // Not under replica_mu_: the wait is up to a second.
        if (replica_->AwaitLeaderGone(revision, std::min(left, absl::Seconds(1)))) return false;
      } else {
        absl::MutexLock lock(&replica_mu_);
        if (replica_->LeaderGone()) return false;
      }
    }
    // A leader steps on its period; a watch that ended early (etcd not
    // reached) or a look waits out its poll.
    const absl::Duration rest = step_at - clock_->Now();
    if (rest > absl::ZeroDuration() &&
        stop_.WaitForNotificationWithTimeout(active_engine() != nullptr ? rest
                                                                        : std::min(poll, rest))) {
      return true;
    }
  }
}

void CoordinatorServer::Promote() {
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> record;
  {
    absl::MutexLock lock(&replica_mu_);
    record = replica_->LoadRecord();
    if (!record.ok()) {
      SHOAL_LOG(ERROR) << "elected but cannot read the run record (" << record.status()
                       << "); resigning";
      replica_->Resign();
      return;
    }
  }
  // The same limits as at the edge (core/request_limits.h).
  if (record->has_value()) {
    if (absl::Status s = CheckRunRecordText(**record); !s.ok()) {
      SHOAL_LOG(ERROR) << "the run record in etcd breaks the request limits (" << s
                       << "); resigning";
      absl::MutexLock lock(&replica_mu_);
      replica_->Resign();
      return;
    }
  }
  EngineOptions eo = options_.engine;
  if (record->has_value()) {
    const shoal::v1::RunRecord& r = **record;
    if (options_.run_id_from_flag && r.run_id() != eo.run_id) {
      SHOAL_LOG(ERROR) << "etcd prefix " << options_.etcd_prefix << " holds run " << r.run_id()
                       << ", not --run_id=" << eo.run_id
                       << "; use another --etcd_prefix for a new run. Resigning.";
      absl::MutexLock lock(&replica_mu_);
      replica_->Resign();
      return;
    }
    eo.run_id = r.run_id();
    std::string note;
    eo.config = ResumedRunConfig(r.config(), eo.config, &note);
    if (!note.empty()) SHOAL_LOG(WARNING) << note;
    eo.resume = r;
    SHOAL_LOG(INFO) << "leader: resuming run " << r.run_id() << " after round "
                    << r.last_completed_round();
  } else if (options_.run_id_from_flag && !eo.config.checkpoints().store().empty()) {
    absl::StatusOr<std::optional<shoal::v1::RunRecord>> from_store =
        ResumeFromStore(eo.config.checkpoints().store(), eo.run_id);
    if (from_store.ok() && from_store->has_value()) {
      shoal::v1::RunRecord r = **from_store;
      *r.mutable_config() = eo.config;
      eo.resume = r;
    }
    SHOAL_LOG(INFO) << "leader: starting run " << eo.run_id;
  } else {
    SHOAL_LOG(INFO) << "leader: starting run " << eo.run_id;
  }
  // A round starts only once the record as it stands (the previous round's
  // completion included) is in etcd under this term, and while the lease is
  // certainly alive. Runs under the engine's lock: lock order engine, then
  // replica_mu_.
  eo.before_round_start = [this](const shoal::v1::RunRecord& record, uint64_t version) {
    absl::MutexLock lock(&replica_mu_);
    if (!replica_->CanStartRounds()) return false;
    absl::Status s = replica_->SaveRecord(record, version);
    if (absl::IsFailedPrecondition(s)) deposed_ = true;
    if (!s.ok()) NoteRecordWrite(s);
    return s.ok();
  };
  owned_engines_.push_back(std::make_unique<RoundEngine>(eo, clock_));
  RoundEngine* engine = owned_engines_.back().get();
  // Nothing starts before the record is written under this term.
  (void)engine->HoldRounds(true);
  owned_services_.push_back(std::make_unique<CoordinatorService>(
      engine, clock_, SinkFor(engine, [this, engine] { (void)PersistToEtcd(engine); }),
      prober_.get()));
  CoordinatorService* service = owned_services_.back().get();
  // A TorchScript run: this replica serves the file it was started with;
  // workers check every byte against the run's digest.
  service->SetModelFile(options_.model_file, eo.config.model().file_sha256());
  service->set_relay_limits(options_.relay);
  shoal::v1::RunStatus extra;
  extra.set_replica_role("leader");
  extra.set_leader(options_.advertise);
  service->set_status_extra(extra);
  {
    absl::MutexLock lock(&persist_mu_);
    persisted_version_ = 0;
    tried_version_ = 0;
  }
  {
    absl::MutexLock lock(&active_mu_);
    engine_ = engine;
    service_ = service;
  }
  // Rounds may start at once when the record is written under this term
  // (else the replica loop releases them later).
  const bool current = PersistToEtcd(engine);
  const bool can = current && [&] {
    absl::MutexLock lock(&replica_mu_);
    return replica_->CanStartRounds();
  }();
  (void)engine->HoldRounds(!can);  // no member yet: nothing to deliver
  endpoint_->SetActive(service);
  {
    absl::MutexLock lock(&view_mu_);
    leader_hint_ = options_.advertise;
  }
  server_->SetServing(kCoordinatorHealthName, true);
}

void CoordinatorServer::Demote() {
  endpoint_->SetActive(nullptr);
  server_->SetServing(kCoordinatorHealthName, false);
  CoordinatorService* service;
  {
    absl::MutexLock lock(&active_mu_);
    service = service_;
    service_ = nullptr;
    engine_ = nullptr;
  }
  {
    absl::MutexLock lock(&view_mu_);
    leader_hint_.clear();
  }
  // Workers re-join and are sent to the new leader.
  if (service != nullptr) service->CloseAllSessions();
}

bool CoordinatorServer::PersistToEtcd(RoundEngine* engine) {
  absl::MutexLock plock(&persist_mu_);
  // The version first: the record read after it is at least as new.
  const uint64_t version = engine->record_version();
  if (version == persisted_version_) {
    tried_version_ = version;
    return true;
  }
  const shoal::v1::RunRecord record = engine->Record();
  absl::Status s;
  {
    absl::MutexLock lock(&replica_mu_);
    if (engine != active_engine()) return false;  // a retired engine
    s = replica_->SaveRecord(record, version);
    if (absl::IsFailedPrecondition(s)) deposed_ = true;
    NoteRecordWrite(s);
  }
  // Tried: what waited for this write goes out (a failed one is tried
  // again at the next change, by the replica loop and before a round).
  tried_version_ = version;
  if (!s.ok()) return false;
  persisted_version_ = version;
  return true;
}

void CoordinatorServer::NoteRecordWrite(const absl::Status& s) {
  // Logs changes, not every failed write while etcd is away.
  if (s.ok() == record_write_ok_) return;
  record_write_ok_ = s.ok();
  if (s.ok()) {
    SHOAL_LOG(INFO) << "the run record is written to etcd again";
  } else {
    SHOAL_LOG(ERROR) << "cannot write the run record to etcd: " << s
                     << " (no round starts until it is written)";
  }
}

shoal::v1::RunStatus CoordinatorServer::StandbyStatus() {
  absl::MutexLock lock(&view_mu_);
  return standby_view_;
}

std::string CoordinatorServer::LeaderHint() {
  absl::MutexLock lock(&view_mu_);
  return leader_hint_;
}

}  // namespace shoal::coordinator
