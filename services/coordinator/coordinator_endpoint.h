// The Coordinator service a coordinator registers with its gRPC server, and
// the one place every call of it enters (common/raw_service.h: every method
// is a raw callback method through two entry points). Each call passes, in
// this order:
//   1. Admission (admission.h): the run token, and a Join's rate per host.
//   2. The term: the CoordinatorService of the current term, set by the
//      server (a single coordinator: for good; a replica: while it leads,
//      a fresh one per term). With none (a standby replica) the call is
//      refused with UNAVAILABLE and the leader's address in the trailing
//      metadata key `shoal-leader` (docs/REPLICAS.md), except the methods
//      a standby answers from its own view of the run (GetRunStatus,
//      replica_role "standby").
//   3. The service's method table (coordinator_service.h).
// It names no method: adding an RPC touches the proto and
// CoordinatorService only.
#ifndef SHOAL_SERVICES_COORDINATOR_COORDINATOR_ENDPOINT_H_
#define SHOAL_SERVICES_COORDINATOR_COORDINATOR_ENDPOINT_H_

#include <atomic>
#include <functional>
#include <string>

#include "common/raw_service.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/coordinator_service.h"
#include "shoal/v1/coordinator.grpc.pb.h"

namespace shoal::coordinator {

// Trailing-metadata key of the leader hint on a standby's UNAVAILABLE.
inline constexpr char kLeaderMetadataKey[] = "shoal-leader";

// Thread-safe. The active service is swapped atomically; a call runs to its
// end on the service it entered (a term that ended closes its sessions,
// its unary calls finish on its retired engine). Services that were active
// once must outlive this object (the server keeps them).
class CoordinatorEndpoint final : public RawCallbackService<shoal::v1::Coordinator> {
 public:
  // What a standby replica answers with (unused by a single coordinator).
  struct Standby {
    // Its view of the run for GetRunStatus; must not block (a cached view).
    std::function<shoal::v1::RunStatus()> status;
    // The current leader's address; empty: none known.
    std::function<std::string()> leader;
  };

  CoordinatorEndpoint(Admission admission, Standby standby)
      : admission_(std::move(admission)), standby_(std::move(standby)) {}

  // nullptr: this replica does not lead (a standby).
  void SetActive(CoordinatorService* service) { active_.store(service); }
  CoordinatorService* active() const { return active_.load(); }

 private:
  grpc::ServerUnaryReactor* Unary(const MethodDescriptor& method, grpc::CallbackServerContext* ctx,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  BidiReactor* Stream(const MethodDescriptor& method, grpc::CallbackServerContext* ctx) override;

  // UNAVAILABLE with the leader hint.
  grpc::Status NotLeader(grpc::CallbackServerContext* ctx) const;

  const Admission admission_;
  const Standby standby_;
  std::atomic<CoordinatorService*> active_{nullptr};
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_COORDINATOR_ENDPOINT_H_
