// The Coordinator service a coordinator run with --token_file or
// --max_joins_per_minute registers: every call must carry the run token
// (common/auth.h), or it is refused with UNAUTHENTICATED, and a Join past its
// host's rate is refused with RESOURCE_EXHAUSTED, before either reaches the
// service behind (a CoordinatorService, or a replica's ReplicaFront). Without
// either the server registers the service behind directly.
#ifndef SHOAL_SERVICES_COORDINATOR_TOKEN_GATE_H_
#define SHOAL_SERVICES_COORDINATOR_TOKEN_GATE_H_

#include "common/auth.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/core/join_limiter.h"

namespace shoal::coordinator {

// Thread-safe; `inner` must outlive it.
class GatedCoordinator final : public CoordinatorServiceBase {
 public:
  // `joins` (optional) limits joins per caller host; it must outlive this.
  GatedCoordinator(CoordinatorServiceBase* inner, TokenGate gate, JoinLimiter* joins = nullptr)
      : inner_(inner), gate_(std::move(gate)), joins_(joins) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Relay(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx,
                                 const shoal::v1::JoinRequest* request,
                                 shoal::v1::JoinResponse* response) override;
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
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelFile(grpc::CallbackServerContext* ctx,
                                         const shoal::v1::GetModelFileRequest* request,
                                         shoal::v1::ModelFileChunk* response) override;

 private:
  CoordinatorServiceBase* const inner_;
  const TokenGate gate_;
  JoinLimiter* const joins_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_TOKEN_GATE_H_
