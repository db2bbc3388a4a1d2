#include "services/checkpoint/checkpoint_server.h"

#include "common/logging.h"

namespace shoal::checkpoint {

absl::StatusOr<std::unique_ptr<CheckpointServer>> CheckpointServer::Start(
    CheckpointServerOptions options) {
  std::unique_ptr<CheckpointServer> server(new CheckpointServer());
  auto store = CheckpointStore::Open(std::move(options.store));
  if (!store.ok()) return store.status();
  server->store_ = std::move(*store);
  server->service_ =
      std::make_unique<CheckpointService>(server->store_.get(), options.gate, options.upload_key);
  auto grpc_server = GrpcServer::Start(options.listen, {server->service_.get()});
  if (!grpc_server.ok()) return grpc_server.status();
  server->server_ = std::move(*grpc_server);
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Start(options.metrics_listen);
    if (!metrics.ok()) return metrics.status();
    server->metrics_ = std::move(*metrics);
    SHOAL_LOG(INFO) << "metrics on " << server->metrics_->address();
    // What the store holds at start; the service updates both on each
    // commit and delete (same names and help as there).
    double bytes = 0;
    const std::vector<shoal::v1::CheckpointInfo> all = server->store_->List();
    for (const auto& info : all) bytes += static_cast<double>(info.bytes());
    Metrics::Gauge("shoal_checkpoint_store_checkpoints", "Committed checkpoints in the store.")
        .Set(static_cast<double>(all.size()));
    Metrics::Gauge("shoal_checkpoint_store_bytes",
                   "Bytes of the committed checkpoints (sum of their sizes; identical layers are "
                   "stored once on disk).")
        .Set(bytes);
  }
  return server;
}

CheckpointServer::~CheckpointServer() { Shutdown(absl::Seconds(1)); }

void CheckpointServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  // Running uploads and reads get `grace` to finish while new calls are
  // refused; then the server stops, cancelling what is left (a cancelled
  // upload commits nothing), before the store goes away.
  if (service_) {
    service_->StartDraining();
    if (!service_->WaitUntilIdle(grace)) {
      SHOAL_LOG(WARNING) << "streams still running after " << grace << "; cancelling them";
    }
  }
  if (server_) server_->Shutdown(absl::ZeroDuration());
  metrics_.reset();
  // Releases the data directory (its lock), e.g. for a restart in-process.
  store_.reset();
}

}  // namespace shoal::checkpoint
