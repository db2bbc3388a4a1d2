// The Coordinator service a replica (--etcd) registers with its gRPC server:
// while this replica leads, every call goes to the active CoordinatorService
// (the leader's engine); otherwise the worker protocol is refused with
// UNAVAILABLE and the leader's address in the trailing metadata key
// `shoal-leader` (docs/REPLICAS.md), and GetRunStatus is answered here from
// the replica's own view (replica_role "standby").
#ifndef SHOAL_SERVICES_COORDINATOR_REPLICA_FRONT_H_
#define SHOAL_SERVICES_COORDINATOR_REPLICA_FRONT_H_

#include <atomic>
#include <functional>
#include <string>

#include "services/coordinator/coordinator_service.h"

namespace shoal::coordinator {

// Trailing-metadata key of the leader hint on a standby's UNAVAILABLE.
inline constexpr char kLeaderMetadataKey[] = "shoal-leader";

// Thread-safe. The active service is swapped atomically; services that were
// active once must outlive this object (the server keeps them).
class ReplicaFront final : public CoordinatorServiceBase {
 public:
  // `standby_status` builds a standby's answer to GetRunStatus (it must not
  // block: it reads a cached view); `leader` gives the current leader hint.
  ReplicaFront(std::function<shoal::v1::RunStatus()> standby_status,
               std::function<std::string()> leader)
      : standby_status_(std::move(standby_status)), leader_(std::move(leader)) {}

  // nullptr: not the leader.
  void SetActive(CoordinatorService* service) { active_.store(service); }
  CoordinatorService* active() const { return active_.load(); }

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx,
                                 const shoal::v1::JoinRequest* request,
                                 shoal::v1::JoinResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Relay(
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
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

 private:
  // UNAVAILABLE with the leader hint.
  grpc::Status NotLeader(grpc::CallbackServerContext* ctx) const;
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx) const;

  const std::function<shoal::v1::RunStatus()> standby_status_;
  const std::function<std::string()> leader_;
  std::atomic<CoordinatorService*> active_{nullptr};
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_REPLICA_FRONT_H_
