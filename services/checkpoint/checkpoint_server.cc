#include "services/checkpoint/checkpoint_server.h"

#include "common/logging.h"

namespace shoal::checkpoint {

absl::StatusOr<std::unique_ptr<CheckpointServer>> CheckpointServer::Start(
    CheckpointServerOptions options) {
  std::unique_ptr<CheckpointServer> server(new CheckpointServer());
  auto store = CheckpointStore::Open(std::move(options.store));
  if (!store.ok()) return store.status();
  server->store_ = std::move(*store);
  server->service_ = std::make_unique<CheckpointService>(server->store_.get());
  auto grpc_server = GrpcServer::Start(options.listen, {server->service_.get()});
  if (!grpc_server.ok()) return grpc_server.status();
  server->server_ = std::move(*grpc_server);
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
  // Releases the data directory (its lock), e.g. for a restart in-process.
  store_.reset();
}

}  // namespace shoal::checkpoint
