#include "services/coordinator/token_gate.h"

#include "common/grpc_util.h"
#include "common/reactor_handoff.h"
#include "common/status_util.h"

namespace shoal::coordinator {
namespace {

// A session stream refused at once (no or a wrong token).
class RefusedStream : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedStream(grpc::Status status) {
    ReactionScope reaction(this);
    Finish(std::move(status));
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }
};

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, grpc::Status status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* GatedCoordinator::Session(
    grpc::CallbackServerContext* ctx) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return new RefusedStream(std::move(allowed));
  return inner_->Session(ctx);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* GatedCoordinator::Relay(
    grpc::CallbackServerContext* ctx) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return new RefusedStream(std::move(allowed));
  return inner_->Relay(ctx);
}

grpc::ServerUnaryReactor* GatedCoordinator::Join(grpc::CallbackServerContext* ctx,
                                                 const shoal::v1::JoinRequest* request,
                                                 shoal::v1::JoinResponse* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  if (joins_ != nullptr) {
    if (absl::Status s = joins_->Admit(CallerHost(ctx->peer())); !s.ok()) {
      return Refuse(ctx, ToGrpcStatus(s));
    }
  }
  return inner_->Join(ctx, request, response);
}

grpc::ServerUnaryReactor* GatedCoordinator::JoinRound(grpc::CallbackServerContext* ctx,
                                                      const shoal::v1::JoinRoundRequest* request,
                                                      shoal::v1::JoinRoundResponse* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  return inner_->JoinRound(ctx, request, response);
}

grpc::ServerUnaryReactor* GatedCoordinator::ReportReady(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReportReadyRequest* request,
    shoal::v1::ReportReadyResponse* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  return inner_->ReportReady(ctx, request, response);
}

grpc::ServerUnaryReactor* GatedCoordinator::ConnectionsReady(
    grpc::CallbackServerContext* ctx, const shoal::v1::ConnectionsReadyRequest* request,
    shoal::v1::ConnectionsReadyResponse* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  return inner_->ConnectionsReady(ctx, request, response);
}

grpc::ServerUnaryReactor* GatedCoordinator::ReportRoundDone(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReportRoundDoneRequest* request,
    shoal::v1::ReportRoundDoneResponse* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  return inner_->ReportRoundDone(ctx, request, response);
}

grpc::ServerUnaryReactor* GatedCoordinator::ReportCheckpoint(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReportCheckpointRequest* request,
    shoal::v1::ReportCheckpointResponse* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  return inner_->ReportCheckpoint(ctx, request, response);
}

grpc::ServerUnaryReactor* GatedCoordinator::Leave(grpc::CallbackServerContext* ctx,
                                                  const shoal::v1::LeaveRequest* request,
                                                  shoal::v1::LeaveResponse* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  return inner_->Leave(ctx, request, response);
}

grpc::ServerUnaryReactor* GatedCoordinator::GetRunStatus(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  return inner_->GetRunStatus(ctx, request, response);
}

grpc::ServerUnaryReactor* GatedCoordinator::GetModelFile(
    grpc::CallbackServerContext* ctx, const shoal::v1::GetModelFileRequest* request,
    shoal::v1::ModelFileChunk* response) {
  grpc::Status allowed = gate_.Check(ctx, Access::kMember);
  if (!allowed.ok()) return Refuse(ctx, std::move(allowed));
  return inner_->GetModelFile(ctx, request, response);
}

}  // namespace shoal::coordinator
