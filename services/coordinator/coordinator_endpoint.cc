#include "services/coordinator/coordinator_endpoint.h"

#include "absl/strings/str_cat.h"
#include "services/coordinator/stream_wire.h"

namespace shoal::coordinator {

grpc::Status CoordinatorEndpoint::NotLeader(grpc::CallbackServerContext* ctx) const {
  const std::string leader = standby_.leader ? standby_.leader() : std::string();
  if (!leader.empty()) ctx->AddTrailingMetadata(kLeaderMetadataKey, leader);
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      leader.empty()
                          ? "this coordinator is a standby and no leader is elected yet; retry"
                          : absl::StrCat("this coordinator is a standby; the leader is ", leader,
                                         " (trailing metadata ", kLeaderMetadataKey, ")"));
}

grpc::ServerUnaryReactor* CoordinatorEndpoint::Unary(const MethodDescriptor& method,
                                                     grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  if (grpc::Status admitted = admission_.Admit(ctx, CoordinatorService::CountsAsJoin(method));
      !admitted.ok()) {
    return FinishUnary(ctx, admitted);
  }
  if (CoordinatorService* service = active()) return service->Call(method, ctx, request, response);
  if (CoordinatorService::StandbyAnswers(method) && standby_.status) {
    *response = SerializeMessage(standby_.status());
    return FinishUnary(ctx, grpc::Status::OK);
  }
  return FinishUnary(ctx, NotLeader(ctx));
}

CoordinatorEndpoint::BidiReactor* CoordinatorEndpoint::Stream(const MethodDescriptor& method,
                                                              grpc::CallbackServerContext* ctx) {
  if (grpc::Status admitted = admission_.Admit(ctx, CoordinatorService::CountsAsJoin(method));
      !admitted.ok()) {
    return new FinishedStream(admitted);
  }
  if (CoordinatorService* service = active()) return service->Open(method, ctx);
  return new FinishedStream(NotLeader(ctx));
}

}  // namespace shoal::coordinator
