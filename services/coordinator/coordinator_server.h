// Owns a running coordinator: the round engine, the gRPC service and server,
// and the ticker thread that expires leases.
#ifndef SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_
#define SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/auth.h"
#include "common/etcd_client.h"
#include "common/grpc_util.h"
#include "common/metrics.h"
#include "common/tcp_prober.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/core/replica.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/run_record.h"
#include "services/coordinator/web_page.h"

namespace shoal::coordinator {

struct CoordinatorOptions {
  std::string listen = "127.0.0.1:50051";
  // Directory of the durable run record; empty = nothing persisted.
  std::string state_dir;
  // The run id was given explicitly (a record of another run is an error).
  bool run_id_from_flag = false;
  EngineOptions engine;
  absl::Duration tick_interval = absl::Milliseconds(250);
  // Serves Prometheus metrics on this "host:port" (port 0 = any); empty = off.
  std::string metrics_listen;
  // Serves the web page (/, /api/status, /api/history) and /metrics on this
  // "host:port" (port 0 = any); empty = off. The same string as
  // metrics_listen = one server for both.
  std::string http_listen;
  // config.model().name() == "torchscript": the file's bytes (their SHA-256 is
  // config.model().file_sha256(), checked by Start), served by GetModelFile.
  std::string model_file;
  // Replicas (docs/REPLICAS.md): etcd members ("host:port"); empty = a
  // single coordinator (--state_dir). Exclusive with state_dir.
  std::vector<std::string> etcd;
  // Key prefix of this run's keys in etcd.
  std::string etcd_prefix = "/shoal/";
  // Leader lease TTL (whole seconds).
  absl::Duration lease_ttl = absl::Seconds(3);
  // Address workers dial to reach this replica (the leader hint); empty =
  // the bound address.
  std::string advertise;
  // Who may call (--token_file, common/auth.h); open by default.
  TokenGate gate;
  // Joins per caller host and minute (--max_joins_per_minute); 0 = no limit.
  uint32_t max_joins_per_minute = 0;
  // Limits of each supernode's Relay stream (--relay_max_members,
  // --relay_max_batch).
  RelayLimits relay;
  // Tests only: runs on the record's writer thread before each write of the
  // run record (a test holds it there to see that no call waits on it but
  // the ones whose answer needs the write).
  std::function<void()> before_record_write;
};

// The named health service that reports SERVING only on a leader (always on
// a single coordinator).
inline constexpr char kCoordinatorHealthName[] = "shoal.v1.Coordinator";

class CoordinatorEndpoint;
class JoinLimiter;

// The newest undamaged checkpoint of `run_id` in the store at `store` as a
// run record to resume from (nullopt when there is none). UNAVAILABLE when
// the store cannot be reached.
absl::StatusOr<std::optional<shoal::v1::RunRecord>> ResumeFromStore(const std::string& store,
                                                                    const std::string& run_id);

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(CoordinatorOptions options,
                                                                  const Clock* clock);
  ~CoordinatorServer();

  int port() const { return server_->port(); }
  // Joiners' addresses being probed now (tests).
  int probes_in_flight() const { return prober_ ? prober_->in_flight() : 0; }
  const std::string& address() const { return server_->address(); }
  // The engine of the run (single coordinator, or a replica that leads).
  RoundEngine& engine() { return *active_engine(); }
  // The leading engine; nullptr on a standby replica.
  RoundEngine* active_engine() {
    absl::MutexLock lock(&active_mu_);
    return engine_;
  }
  // The metrics port, 0 when --metrics_listen is off.
  int metrics_port() const {
    return metrics_ ? metrics_->port() : metrics_merged_ && http_ ? http_->port() : 0;
  }
  // The web page's port, 0 when --http_listen is off.
  int http_port() const { return http_ ? http_->port() : 0; }
  // The status /api/status shows: the leading engine's, or a standby's view
  // (version 0).
  shoal::v1::RunStatus CurrentStatus(uint64_t* version);

  void Shutdown(absl::Duration grace);

 private:
  CoordinatorServer() = default;
  // Writes the run record when it changed since the last write.
  void Persist();
  // Whether `engine`'s record as it stands was written or tried (a retired
  // engine's never waits).
  bool RecordTried(RoundEngine* engine);
  // The record sink of a term's service: writes on writer_.
  RecordSink SinkFor(RoundEngine* engine, std::function<void()> write);
  absl::Status StartSingle(CoordinatorOptions options);
  // The registered service, with the admission of `options`.
  std::unique_ptr<CoordinatorEndpoint> MakeEndpoint(const CoordinatorOptions& options,
                                                    bool replica);
  CoordinatorService* active_service() {
    absl::MutexLock lock(&active_mu_);
    return service_;
  }
  // --etcd: the replica's loop (renewal, campaign, hold/release of rounds).
  absl::Status StartReplica(CoordinatorOptions options);
  void ReplicaLoop(absl::Duration period);
  // Waits until the next replica step is due (`period`), or less while a
  // standby sees the leader key gone. True when the server is stopping.
  bool WaitForNextStep(absl::Duration period);
  void Promote();
  void Demote();
  // Writes `engine`'s record to etcd when it changed and `engine` leads;
  // true when the record in etcd is current.
  bool PersistToEtcd(RoundEngine* engine);
  shoal::v1::RunStatus StandbyStatus();
  std::string LeaderHint();

  std::unique_ptr<RunRecordStore> records_;
  absl::Mutex persist_mu_;
  uint64_t persisted_version_ ABSL_GUARDED_BY(persist_mu_) = 0;
  // The last version a write was tried for (it may have failed: logged,
  // tried again at the next change; what waited goes out anyway). Written
  // under persist_mu_, read without it: persist_mu_ is held during a write,
  // and the gRPC threads that ask must not wait for one.
  std::atomic<uint64_t> tried_version_{0};
  // The thread the record is written on (no gRPC thread waits on a write);
  // stopped after the prober, before the gRPC server.
  std::unique_ptr<RecordWriter> writer_;
  std::function<void()> before_record_write_;  // CoordinatorOptions::before_record_write
  // The active engine and service (a standby replica has none). Engines and
  // services that were active once are kept in owned_* until the server is
  // destroyed, so that pointers handed out stay valid.
  absl::Mutex active_mu_;
  RoundEngine* engine_ ABSL_GUARDED_BY(active_mu_) = nullptr;
  CoordinatorService* service_ ABSL_GUARDED_BY(active_mu_) = nullptr;
  std::vector<std::unique_ptr<RoundEngine>> owned_engines_;
  std::vector<std::unique_ptr<CoordinatorService>> owned_services_;
  // --etcd only.
  CoordinatorOptions options_;
  const Clock* clock_ = nullptr;
  std::unique_ptr<EtcdClient> etcd_;
  absl::Mutex replica_mu_;  // serialises the Replica's calls
  std::unique_ptr<Replica> replica_ ABSL_GUARDED_BY(replica_mu_);
  bool deposed_ ABSL_GUARDED_BY(replica_mu_) = false;
  bool record_write_ok_ ABSL_GUARDED_BY(replica_mu_) = true;
  void NoteRecordWrite(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(replica_mu_);
  // The registered service: admission, the slot of the active service
  // (endpoint_->SetActive), the standby's answers (coordinator_endpoint.h).
  std::unique_ptr<CoordinatorEndpoint> endpoint_;
  std::unique_ptr<JoinLimiter> join_limiter_;
  // Probes joiners' Peer addresses for every term's service (null when
  // --probe_joiners_timeout is 0); shut down before the gRPC server.
  std::unique_ptr<TcpProber> prober_;
  absl::Mutex view_mu_;
  shoal::v1::RunStatus standby_view_ ABSL_GUARDED_BY(view_mu_);
  std::string leader_hint_ ABSL_GUARDED_BY(view_mu_);
  std::thread replica_thread_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<Metrics> metrics_;  // when --metrics_listen is set (and not merged)
  std::shared_ptr<WebPage> web_;      // when --http_listen is set
  std::unique_ptr<HttpEndpoint> http_;
  bool metrics_merged_ = false;  // --metrics_listen == --http_listen
  absl::Notification stop_;
  std::thread ticker_;
  bool shut_down_ = false;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_
