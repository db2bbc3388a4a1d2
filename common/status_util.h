// One place that converts between absl::Status and grpc::Status, and the
// RETURN_IF_ERROR / ASSIGN_OR_RETURN macros this Abseil version lacks.
#ifndef SHOAL_COMMON_STATUS_UTIL_H_
#define SHOAL_COMMON_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal {

// absl and gRPC use the same canonical code numbering (checked in the .cc).
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Prefixes the message with `context` and keeps the code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Retry only on transient failures.
inline bool IsRetryable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

}  // namespace shoal

#define SHOAL_STATUS_CONCAT_INNER_(a, b) a##b
#define SHOAL_STATUS_CONCAT_(a, b) SHOAL_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status _shoal_status = (expr);         \
    if (!_shoal_status.ok()) return _shoal_status; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  SHOAL_ASSIGN_OR_RETURN_IMPL_(SHOAL_STATUS_CONCAT_(_shoal_statusor_, __LINE__), lhs, expr)

#define SHOAL_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // SHOAL_COMMON_STATUS_UTIL_H_
