// The gRPC ends of member credentials (common/member_credentials.h): the
// x-shoal-member metadata a worker's clients send and its Peer service checks.
#ifndef SHOAL_COMMON_MEMBER_CREDENTIALS_GRPC_H_
#define SHOAL_COMMON_MEMBER_CREDENTIALS_GRPC_H_

#include <grpcpp/grpcpp.h>

#include "common/member_credentials.h"

namespace shoal {

// Adds `holder`'s credential to `ctx` as x-shoal-member, when it has one.
void AddMemberCredential(const MemberCredentialHolder& holder, grpc::ClientContext* ctx);

// `members`' check of the call's x-shoal-member (MemberSet::CheckHeader), as
// a gRPC status.
grpc::Status CheckMember(const MemberSet& members, const grpc::CallbackServerContext* ctx);

}  // namespace shoal

#endif  // SHOAL_COMMON_MEMBER_CREDENTIALS_GRPC_H_
