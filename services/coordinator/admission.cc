#include "services/coordinator/admission.h"

#include "common/grpc_util.h"
#include "common/status_util.h"

namespace shoal::coordinator {

absl::Status Admission::Admit(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                              const std::string& peer, bool join) const {
  if (absl::Status s = gate_.Check(metadata, Access::kMember); !s.ok()) return s;
  if (join && joins_ != nullptr) return joins_->Admit(CallerHost(peer));
  return absl::OkStatus();
}

grpc::Status Admission::Admit(const grpc::CallbackServerContext* ctx, bool join) const {
  if (gate_.open() && (!join || joins_ == nullptr)) return grpc::Status::OK;
  return ToGrpcStatus(Admit(ctx->client_metadata(), ctx->peer(), join));
}

}  // namespace shoal::coordinator
