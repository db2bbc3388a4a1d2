// Owns a running coordinator: the round engine, the gRPC service and server,
// and the ticker thread that expires leases.
#ifndef SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_
#define SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_util.h"
#include "common/metrics.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/run_record.h"

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
  // config.model() == "torchscript": the file's bytes (their SHA-256 is
  // config.model_file_sha256(), checked by Start), served by GetModelFile.
  std::string model_file;
};

// The newest undamaged checkpoint of `run_id` in the store at `store` as a
// run record to resume from (nullopt when there is none). UNAVAILABLE when
// the store cannot be reached.
absl::StatusOr<std::optional<shoal::v1::RunRecord>> ResumeFromStore(const std::string& store,
                                                                    const std::string& run_id);

// Checks a run configuration; INVALID_ARGUMENT with the offending flag.
absl::Status ValidateConfig(const shoal::v1::RunConfig& config);

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(CoordinatorOptions options,
                                                                  const Clock* clock);
  ~CoordinatorServer();

  int port() const { return server_->port(); }
  const std::string& address() const { return server_->address(); }
  RoundEngine& engine() { return *engine_; }
  // The metrics port, 0 when --metrics_listen is off.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }

  void Shutdown(absl::Duration grace);

 private:
  CoordinatorServer() = default;
  // Writes the run record when it changed since the last write.
  void Persist();
  std::unique_ptr<RunRecordStore> records_;
  absl::Mutex persist_mu_;
  uint64_t persisted_version_ ABSL_GUARDED_BY(persist_mu_) = 0;
  std::unique_ptr<RoundEngine> engine_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<Metrics> metrics_;  // when --metrics_listen is set
  absl::Notification stop_;
  std::thread ticker_;
  bool shut_down_ = false;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVER_H_
