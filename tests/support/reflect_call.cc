// shoal-reflect-call: the two grpcurl commands the tests and operators need,
// for hosts without grpcurl (it is not packaged in Debian bookworm).
//
//   shoal-reflect-call ADDR list
//       prints the server's service names, one per line (sorted).
//   shoal-reflect-call ADDR pkg.Service/Method [JSON_REQUEST]
//       calls a unary method and prints the response as JSON.
//
// Everything it knows about the server's types comes from gRPC server
// reflection (grpc.reflection.v1alpha.ServerReflection); no Shoal proto is
// compiled in. Plaintext only. Exits non-zero with the gRPC status code name
// and message when a call fails.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <future>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace {

namespace refl = grpc::reflection::v1alpha;
namespace pb = google::protobuf;

constexpr std::chrono::seconds kTimeout(5);
constexpr int kMaxMessageBytes = 64 << 20;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

// Prints "ERROR: CODE: message" and returns the exit code for it.
int Fail(const grpc::Status& status, const std::string& context) {
  std::cerr << "ERROR: " << context << ": " << CodeName(status.error_code()) << ": "
            << status.error_message() << "\n";
  return 1;
}

int Usage() {
  std::cerr << "usage: shoal-reflect-call ADDR list\n"
               "       shoal-reflect-call ADDR pkg.Service/Method [JSON_REQUEST]\n";
  return 2;
}

// One reflection stream, used for a sequence of request/response pairs.
class ReflectionClient {
 public:
  explicit ReflectionClient(const std::shared_ptr<grpc::Channel>& channel)
      : stub_(refl::ServerReflection::NewStub(channel)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + kTimeout);
    stream_ = stub_->ServerReflectionInfo(&ctx_);
  }

  // Sends `request` and reads its answer. A broken stream ends it for good.
  grpc::Status Ask(const refl::ServerReflectionRequest& request,
                   refl::ServerReflectionResponse* response) {
    if (!stream_->Write(request) || !stream_->Read(response)) return Close();
    if (response->has_error_response()) {
      return grpc::Status(static_cast<grpc::StatusCode>(response->error_response().error_code()),
                          response->error_response().error_message());
    }
    return grpc::Status::OK;
  }

  grpc::Status Close() {
    if (closed_) return final_;
    closed_ = true;
    stream_->WritesDone();
    refl::ServerReflectionResponse ignored;
    while (stream_->Read(&ignored)) {
    }
    final_ = stream_->Finish();
    if (final_.ok()) final_ = grpc::Status(grpc::StatusCode::INTERNAL, "reflection stream ended");
    return final_;
  }

  ~ReflectionClient() {
    if (!closed_) {
      ctx_.TryCancel();
      (void)Close();
    }
  }

 private:
  std::unique_ptr<refl::ServerReflection::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<refl::ServerReflectionRequest, refl::ServerReflectionResponse>>
      stream_;
  bool closed_ = false;
  grpc::Status final_;
};

grpc::Status ListServices(ReflectionClient* client, std::vector<std::string>* names) {
  refl::ServerReflectionRequest request;
  request.set_list_services("");
  refl::ServerReflectionResponse response;
  grpc::Status s = client->Ask(request, &response);
  if (!s.ok()) return s;
  for (const auto& service : response.list_services_response().service()) {
    names->push_back(service.name());
  }
  std::sort(names->begin(), names->end());
  return grpc::Status::OK;
}

// Adds the files of `response` to `db`; queues the dependencies not seen yet.
grpc::Status AddFiles(const refl::ServerReflectionResponse& response,
                      pb::SimpleDescriptorDatabase* db, std::set<std::string>* have,
                      std::deque<std::string>* missing) {
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    pb::FileDescriptorProto file;
    if (!file.ParseFromString(bytes)) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "server sent an unparsable descriptor");
    }
    if (!have->insert(file.name()).second) continue;
    for (const std::string& dep : file.dependency()) missing->push_back(dep);
    if (!db->Add(file)) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "conflicting descriptor " + file.name());
    }
  }
  return grpc::Status::OK;
}

// Fetches the file defining `symbol` and every file it depends on.
grpc::Status FetchDescriptors(ReflectionClient* client, const std::string& symbol,
                              pb::SimpleDescriptorDatabase* db) {
  std::set<std::string> have;
  std::deque<std::string> missing;
  refl::ServerReflectionRequest request;
  request.set_file_containing_symbol(symbol);
  refl::ServerReflectionResponse response;
  grpc::Status s = client->Ask(request, &response);
  if (!s.ok()) return s;
  s = AddFiles(response, db, &have, &missing);
  if (!s.ok()) return s;
  while (!missing.empty()) {
    const std::string name = missing.front();
    missing.pop_front();
    if (have.count(name)) continue;
    request.set_file_by_filename(name);
    s = client->Ask(request, &response);
    if (!s.ok()) return s;
    s = AddFiles(response, db, &have, &missing);
    if (!s.ok()) return s;
  }
  return grpc::Status::OK;
}

grpc::Status CallUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const std::string& request, std::string* response) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kTimeout);
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request_buffer, &response_buffer,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  if (!status.ok()) return status;
  std::vector<grpc::Slice> slices;
  status = response_buffer.Dump(&slices);
  if (!status.ok()) return status;
  response->clear();
  for (const grpc::Slice& s : slices) {
    response->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return grpc::Status::OK;
}

int Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& full_method,
         const std::string& json_request) {
  const size_t slash = full_method.rfind('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == full_method.size()) return Usage();
  const std::string service_name = full_method.substr(0, slash);
  const std::string method_name = full_method.substr(slash + 1);

  pb::SimpleDescriptorDatabase db;
  {
    ReflectionClient client(channel);
    grpc::Status s = FetchDescriptors(&client, service_name, &db);
    if (!s.ok()) return Fail(s, "reflection of " + service_name);
    (void)client.Close();
  }
  pb::DescriptorPool pool(&db);
  const pb::ServiceDescriptor* service = pool.FindServiceByName(service_name);
  if (service == nullptr) {
    return Fail(grpc::Status(grpc::StatusCode::NOT_FOUND, "no such service"), service_name);
  }
  const pb::MethodDescriptor* method = service->FindMethodByName(method_name);
  if (method == nullptr) {
    return Fail(grpc::Status(grpc::StatusCode::NOT_FOUND, "no such method"), full_method);
  }
  if (method->client_streaming() || method->server_streaming()) {
    return Fail(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "only unary methods are supported"),
                full_method);
  }
  pb::DynamicMessageFactory factory(&pool);
  std::unique_ptr<pb::Message> request(factory.GetPrototype(method->input_type())->New());
  std::unique_ptr<pb::Message> response(factory.GetPrototype(method->output_type())->New());

  const auto parsed = pb::util::JsonStringToMessage(json_request, request.get());
  if (!parsed.ok()) {
    return Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, parsed.ToString()),
                "request JSON for " + method->input_type()->full_name());
  }
  std::string request_bytes;
  if (!request->SerializeToString(&request_bytes)) {
    return Fail(grpc::Status(grpc::StatusCode::INTERNAL, "cannot serialize"), "request");
  }
  std::string response_bytes;
  grpc::Status s = CallUnary(channel, "/" + service->full_name() + "/" + method->name(),
                             request_bytes, &response_bytes);
  if (!s.ok()) return Fail(s, full_method);
  if (!response->ParseFromString(response_bytes)) {
    return Fail(grpc::Status(grpc::StatusCode::INTERNAL, "unparsable response"), full_method);
  }
  pb::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = false;  // lowerCamelCase, like grpcurl
  std::string json;
  const auto printed = pb::util::MessageToJsonString(*response, &json, options);
  if (!printed.ok()) {
    return Fail(grpc::Status(grpc::StatusCode::INTERNAL, printed.ToString()), "response JSON");
  }
  std::cout << json;
  if (json.empty() || json.back() != '\n') std::cout << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) return Usage();
  const std::string address = argv[1];
  const std::string what = argv[2];
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);

  if (what == "list") {
    if (argc != 3) return Usage();
    ReflectionClient client(channel);
    std::vector<std::string> names;
    grpc::Status s = ListServices(&client, &names);
    if (!s.ok()) return Fail(s, "list");
    (void)client.Close();
    for (const std::string& name : names) std::cout << name << "\n";
    return 0;
  }
  return Call(channel, what, argc == 4 ? argv[3] : "{}");
}
