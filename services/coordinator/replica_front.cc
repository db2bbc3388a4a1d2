#include "services/coordinator/replica_front.h"

#include <grpcpp/support/proto_buffer_writer.h>

#include "absl/strings/str_cat.h"
#include "common/reactor_handoff.h"

namespace shoal::coordinator {
namespace {

// A session stream refused at once (this replica does not lead).
class RefusedSession : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedSession(grpc::Status status) {
    ReactionScope reaction(this);
    Finish(std::move(status));
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }
};

}  // namespace

grpc::Status ReplicaFront::NotLeader(grpc::CallbackServerContext* ctx) const {
  const std::string leader = leader_();
  if (!leader.empty()) ctx->AddTrailingMetadata(kLeaderMetadataKey, leader);
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      leader.empty()
                          ? "this coordinator is a standby and no leader is elected yet; retry"
                          : absl::StrCat("this coordinator is a standby; the leader is ", leader,
                                         " (trailing metadata ", kLeaderMetadataKey, ")"));
}

grpc::ServerUnaryReactor* ReplicaFront::Refuse(grpc::CallbackServerContext* ctx) const {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(NotLeader(ctx));
  return reactor;
}

grpc::ServerUnaryReactor* ReplicaFront::Join(grpc::CallbackServerContext* ctx,
                                             const shoal::v1::JoinRequest* request,
                                             shoal::v1::JoinResponse* response) {
  if (CoordinatorService* s = active()) return s->Join(ctx, request, response);
  return Refuse(ctx);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ReplicaFront::Session(
    grpc::CallbackServerContext* ctx) {
  if (CoordinatorService* s = active()) return s->Session(ctx);
  return new RefusedSession(NotLeader(ctx));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ReplicaFront::Relay(
    grpc::CallbackServerContext* ctx) {
  if (CoordinatorService* s = active()) return s->Relay(ctx);
  return new RefusedSession(NotLeader(ctx));
}

grpc::ServerUnaryReactor* ReplicaFront::JoinRound(grpc::CallbackServerContext* ctx,
                                                  const shoal::v1::JoinRoundRequest* request,
                                                  shoal::v1::JoinRoundResponse* response) {
  if (CoordinatorService* s = active()) return s->JoinRound(ctx, request, response);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* ReplicaFront::ReportReady(grpc::CallbackServerContext* ctx,
                                                    const shoal::v1::ReportReadyRequest* request,
                                                    shoal::v1::ReportReadyResponse* response) {
  if (CoordinatorService* s = active()) return s->ReportReady(ctx, request, response);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* ReplicaFront::ConnectionsReady(
    grpc::CallbackServerContext* ctx, const shoal::v1::ConnectionsReadyRequest* request,
    shoal::v1::ConnectionsReadyResponse* response) {
  if (CoordinatorService* s = active()) return s->ConnectionsReady(ctx, request, response);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* ReplicaFront::ReportRoundDone(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReportRoundDoneRequest* request,
    shoal::v1::ReportRoundDoneResponse* response) {
  if (CoordinatorService* s = active()) return s->ReportRoundDone(ctx, request, response);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* ReplicaFront::ReportCheckpoint(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReportCheckpointRequest* request,
    shoal::v1::ReportCheckpointResponse* response) {
  if (CoordinatorService* s = active()) return s->ReportCheckpoint(ctx, request, response);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* ReplicaFront::Leave(grpc::CallbackServerContext* ctx,
                                              const shoal::v1::LeaveRequest* request,
                                              shoal::v1::LeaveResponse* response) {
  if (CoordinatorService* s = active()) return s->Leave(ctx, request, response);
  return Refuse(ctx);
}

grpc::ServerUnaryReactor* ReplicaFront::GetRunStatus(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  if (CoordinatorService* s = active()) return s->GetRunStatus(ctx, request, response);
  auto* reactor = ctx->DefaultReactor();
  const shoal::v1::RunStatus status = standby_status_();
  bool own = false;
  reactor->Finish(grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::MessageLite>(
      status, response, &own));
  return reactor;
}

}  // namespace shoal::coordinator
