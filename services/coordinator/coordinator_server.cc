#include "services/coordinator/coordinator_server.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace shoal::coordinator {

absl::Status ValidateConfig(const shoal::v1::RunConfig& c) {
  if (c.model() != "mlp" && c.model() != "cnn") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model must be 'mlp' or 'cnn', got '", c.model(), "'"));
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
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorOptions options, const Clock* clock) {
  if (absl::Status s = ValidateConfig(options.engine.config); !s.ok()) return s;
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->engine_ = std::make_unique<RoundEngine>(options.engine, clock);
  server->service_ = std::make_unique<CoordinatorService>(server->engine_.get());
  auto grpc_server = GrpcServer::Start(options.listen, {server->service_.get()});
  if (!grpc_server.ok()) return grpc_server.status();
  server->server_ = std::move(*grpc_server);
  CoordinatorService* service = server->service_.get();
  absl::Notification* stop = &server->stop_;
  const absl::Duration tick = options.tick_interval;
  server->ticker_ = std::thread([service, stop, tick] {
    while (!stop->WaitForNotificationWithTimeout(tick)) service->Tick();
  });
  return server;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::Seconds(1)); }

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  // Start() may have failed before everything existed.
  if (service_) service_->CloseAllSessions();
  if (server_) server_->Shutdown(grace);
}

}  // namespace shoal::coordinator
