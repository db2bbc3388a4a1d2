// Who may call the coordinator (docs/SECURITY.md): with --token_file every
// call must carry the run token (common/auth.h), or it is refused with
// UNAUTHENTICATED; with --max_joins_per_minute a Join past its caller host's
// rate is refused with RESOURCE_EXHAUSTED (core/join_limiter.h).
// CoordinatorEndpoint asks it once per call, before anything else sees the
// call (a standby's refusal included).
#ifndef SHOAL_SERVICES_COORDINATOR_ADMISSION_H_
#define SHOAL_SERVICES_COORDINATOR_ADMISSION_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <string>

#include "absl/status/status.h"
#include "common/auth.h"
#include "services/coordinator/core/join_limiter.h"

namespace shoal::coordinator {

// Thread-safe (TokenGate is immutable, JoinLimiter thread-safe).
class Admission {
 public:
  // Everybody, at any rate.
  Admission() = default;
  // `joins` (may be null: no limit) must outlive this.
  Admission(TokenGate gate, JoinLimiter* joins) : gate_(std::move(gate)), joins_(joins) {}

  // The token first; then, for a join (`join`), the rate of the caller's
  // host (`peer` as ServerContext::peer() gives it), counted only for a
  // call that carries the token.
  absl::Status Admit(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                     const std::string& peer, bool join) const;
  grpc::Status Admit(const grpc::CallbackServerContext* ctx, bool join) const;

 private:
  TokenGate gate_;
  JoinLimiter* joins_ = nullptr;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_ADMISSION_H_
