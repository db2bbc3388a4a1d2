#include "common/member_credentials_grpc.h"

#include <optional>
#include <string>

#include "common/status_util.h"

namespace shoal {

void AddMemberCredential(const MemberCredentialHolder& holder, grpc::ClientContext* ctx) {
  const std::string value = holder.Value();
  if (!value.empty()) ctx->AddMetadata(kMemberMetadataKey, value);
}

grpc::Status CheckMember(const MemberSet& members, const grpc::CallbackServerContext* ctx) {
  if (!members.enabled()) return grpc::Status::OK;
  std::optional<absl::string_view> value;
  const auto& metadata = ctx->client_metadata();
  if (auto it = metadata.find(kMemberMetadataKey); it != metadata.end()) {
    value = absl::string_view(it->second.data(), it->second.size());
  }
  return ToGrpcStatus(members.CheckHeader(value));
}

}  // namespace shoal
