// What the proto says about each method of shoal.v1.Coordinator that both
// sides of the relay need (docs/SUPERNODES.md "Relay"): whether a member may
// make it through its supernode (the `relayed` method option), and which
// member a request is for (its worker_id). Read from the descriptors, so
// that neither the supernode's RelayFrontend nor the coordinator names a
// method to relay it.
#ifndef SHOAL_COMMON_COORDINATOR_METHODS_H_
#define SHOAL_COMMON_COORDINATOR_METHODS_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shoal {

// shoal.v1.Coordinator's descriptor (its methods in the proto's order).
const google::protobuf::ServiceDescriptor& CoordinatorDescriptor();

// The `relayed` option of `method`.
bool IsRelayed(const google::protobuf::MethodDescriptor& method);

// The member `request` names: its string field `worker_id` (empty when the
// message has none).
std::string RequestMember(const google::protobuf::Message& request);

// Parses `bytes` as a request of `method` and returns RequestMember of it.
// INVALID_ARGUMENT when the bytes do not parse as that message.
absl::StatusOr<std::string> RequestMember(const google::protobuf::MethodDescriptor& method,
                                          const std::string& bytes);

// OK when every method of `service` with the `relayed` option can be
// relayed: unary, with a request that has a string worker_id; else
// FAILED_PRECONDITION naming the method (a proto mistake, found at start).
absl::Status CheckRelayedMethods(const google::protobuf::ServiceDescriptor& service);

}  // namespace shoal

#endif  // SHOAL_COMMON_COORDINATOR_METHODS_H_
