// gRPC adapter of the coordinator: decodes requests, calls the RoundEngine
// and pushes the directives it returns onto the workers' session streams.
// Callback API only; no handler ever blocks a gRPC thread.
#ifndef SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_
#define SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_

#include <deque>
#include <functional>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "services/coordinator/core/round_engine.h"
#include "shoal/v1/coordinator.grpc.pb.h"

namespace shoal::coordinator {

class SessionReactor;

// Thread-safe. Owns the registry of open session streams.
class CoordinatorService final : public shoal::v1::Coordinator::CallbackService {
 public:
  // `on_change` runs after every engine call, before directives go out (the
  // server persists the run record there).
  CoordinatorService(RoundEngine* engine, std::function<void()> on_change)
      : engine_(engine), on_change_(std::move(on_change)) {}
  ~CoordinatorService() override;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx,
                                 const shoal::v1::JoinRequest* request,
                                 shoal::v1::JoinResponse* response) override;
  grpc::ServerBidiReactor<shoal::v1::WorkerMessage, shoal::v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* JoinRound(grpc::CallbackServerContext* ctx,
                                      const shoal::v1::JoinRoundRequest* request,
                                      shoal::v1::JoinRoundResponse* response) override;
  grpc::ServerUnaryReactor* ReportReady(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::ReportReadyRequest* request,
                                        shoal::v1::ReportReadyResponse* response) override;
  grpc::ServerUnaryReactor* ConnectionsReady(
      grpc::CallbackServerContext* ctx, const shoal::v1::ConnectionsReadyRequest* request,
      shoal::v1::ConnectionsReadyResponse* response) override;
  grpc::ServerUnaryReactor* ReportRoundDone(grpc::CallbackServerContext* ctx,
                                            const shoal::v1::ReportRoundDoneRequest* request,
                                            shoal::v1::ReportRoundDoneResponse* response) override;
  grpc::ServerUnaryReactor* ReportCheckpoint(
      grpc::CallbackServerContext* ctx, const shoal::v1::ReportCheckpointRequest* request,
      shoal::v1::ReportCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx,
                                  const shoal::v1::LeaveRequest* request,
                                  shoal::v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* GetRunStatus(grpc::CallbackServerContext* ctx,
                                         const shoal::v1::GetRunStatusRequest* request,
                                         shoal::v1::RunStatus* response) override;

  // Pushes directives to the sessions they are addressed to; a worker with
  // no open session misses them (it re-syncs through its unary calls).
  void Deliver(const Directives& directives);
  // Runs the engine's lease check and closes sessions of removed workers.
  void Tick();
  // Ends every session stream (server shutdown).
  void CloseAllSessions();

 private:
  friend class SessionReactor;
  void Register(const std::string& worker_id, SessionReactor* session);
  // True when `session` was the registered one.
  bool Unregister(const std::string& worker_id, SessionReactor* session);

  RoundEngine* const engine_;
  const std::function<void()> on_change_;
  absl::Mutex mu_;
  std::map<std::string, SessionReactor*> sessions_ ABSL_GUARDED_BY(mu_);
  // Directives for active workers whose session has not registered yet
  // (lock order: mu_, then the engine's).
  static constexpr size_t kMaxPending = 64;
  std::map<std::string, std::deque<shoal::v1::CoordinatorMessage>> pending_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_COORDINATOR_SERVICE_H_
