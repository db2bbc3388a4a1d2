// Owns a running checkpoint server: the store (opened, cleaned and verified
// before the port is bound), the gRPC service and the server.
#ifndef SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_SERVER_H_
#define SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/metrics.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/checkpoint/core/checkpoint_store.h"

namespace shoal::checkpoint {

struct CheckpointServerOptions {
  // "host:port"; port 0 picks a free port.
  std::string listen = "127.0.0.1:50052";
  StoreOptions store;
  // Serves Prometheus metrics on this "host:port" (port 0 = any); empty = off.
  std::string metrics_listen;
  // Who may call (--token_file, --admin_token_file; common/auth.h): the run
  // token lists, reads and uploads, the admin token also deletes. Open by
  // default.
  TokenGate gate;
  // Secret shared with the coordinator (--upload_key_file; empty = off):
  // every upload then needs the coordinator's grant for its run and round
  // (common/upload_grant.h), PERMISSION_DENIED otherwise.
  std::string upload_key;
};

// Not thread-safe itself (start, then shut down from one thread); the store
// and service it owns are.
class CheckpointServer {
 public:
  // Opens the store, then serves. The store's errors keep their codes
  // (FAILED_PRECONDITION: directory in use or of another format);
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<CheckpointServer>> Start(CheckpointServerOptions options);
  ~CheckpointServer();

  int port() const { return server_->port(); }
  const std::string& address() const { return server_->address(); }
  // The metrics port, 0 when metrics_listen is off.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // Valid until Shutdown().
  CheckpointStore& store() { return *store_; }

  // Stops accepting calls, cancels those still running after `grace` (an
  // upload cut short commits nothing), then closes the store.
  void Shutdown(absl::Duration grace);

 private:
  CheckpointServer() = default;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<CheckpointService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<Metrics> metrics_;  // when metrics_listen is set
  bool shut_down_ = false;
};

}  // namespace shoal::checkpoint

#endif  // SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_SERVER_H_
