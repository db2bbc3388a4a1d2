#include "common/coordinator_methods.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal {
namespace {

using google::protobuf::FieldDescriptor;

const FieldDescriptor* MemberField(const google::protobuf::Descriptor& message) {
  const FieldDescriptor* field = message.FindFieldByName("worker_id");
  if (field == nullptr || field->is_repeated() || field->type() != FieldDescriptor::TYPE_STRING) {
    return nullptr;
  }
  return field;
}

}  // namespace

const google::protobuf::ServiceDescriptor& CoordinatorDescriptor() {
  static const google::protobuf::ServiceDescriptor* const service =
      shoal::v1::JoinRequest::descriptor()->file()->FindServiceByName("Coordinator");
  return *service;
}

bool IsRelayed(const google::protobuf::MethodDescriptor& method) {
  return method.options().GetExtension(shoal::v1::relayed);
}

std::string RequestMember(const google::protobuf::Message& request) {
  const FieldDescriptor* field = MemberField(*request.GetDescriptor());
  if (field == nullptr) return "";
  return request.GetReflection()->GetString(request, field);
}

absl::StatusOr<std::string> RequestMember(const google::protobuf::MethodDescriptor& method,
                                          const std::string& bytes) {
  const google::protobuf::Message* prototype =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(method.input_type());
  if (prototype == nullptr) {
    return absl::InternalError(
        absl::StrCat("no message class for ", method.input_type()->full_name()));
  }
  std::unique_ptr<google::protobuf::Message> request(prototype->New());
  if (!request->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse the request as ", method.input_type()->full_name()));
  }
  return RequestMember(*request);
}

absl::Status CheckRelayedMethods(const google::protobuf::ServiceDescriptor& service) {
  for (int i = 0; i < service.method_count(); ++i) {
    const google::protobuf::MethodDescriptor& method = *service.method(i);
    if (!IsRelayed(method)) continue;
    if (method.client_streaming() || method.server_streaming()) {
      return absl::FailedPreconditionError(
          absl::StrCat(method.full_name(), " has the relayed option but is not unary"));
    }
    if (MemberField(*method.input_type()) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(method.full_name(), " has the relayed option but its request ",
                       method.input_type()->full_name(), " has no string worker_id"));
    }
  }
  return absl::OkStatus();
}

}  // namespace shoal
