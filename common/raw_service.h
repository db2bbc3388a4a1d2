// A gRPC service whose methods are not overridden one by one: every method of
// a generated service (its proto descriptor lists them) is registered as a
// raw callback method (grpc::ByteBuffer in and out, the same wire format)
// that goes through one of two entry points, Unary and Stream, with the
// method's descriptor. A service built on it looks up what to do per method
// in its own table, and what applies to every call (the run token, the
// leader check of a replica, a relay that forwards calls as bytes) sits once
// at those two entry points instead of in a class that re-declares every RPC.
//
// Why not gRPC's other hooks (gRPC 1.51): a server interceptor cannot fail a
// call (Hijack is client-side only; ModifySendStatus rewrites the status of a
// call whose handler has run), and an AuthMetadataProcessor cannot be set on
// insecure server credentials (it aborts), which tests and demos use with a
// token. A CallbackGenericService would serve the methods, but reflection
// would no longer list the service.
#ifndef SHOAL_COMMON_RAW_SERVICE_H_
#define SHOAL_COMMON_RAW_SERVICE_H_

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
// The callback handler templates (clang needs their definitions here).
#include <grpcpp/impl/codegen/server_callback_handlers.h>
#include <grpcpp/support/byte_buffer.h>

#include <string>
#include <utility>

#include "common/reactor_handoff.h"

namespace shoal {

// A bidirectional stream that ends at once with a status (a refused call).
// Deletes itself in OnDone.
class FinishedStream : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit FinishedStream(grpc::Status status) {
    ReactionScope reaction(this);
    Finish(std::move(status));
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }
};

// A message's bytes as one string (a relayed call carries them in a bytes
// field), and back (one slice).
std::string ByteBufferToString(const grpc::ByteBuffer& bytes);
grpc::ByteBuffer StringToByteBuffer(const std::string& bytes);

// A unary call finished at once with `status`.
inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                             const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// `Grpc` is the class protoc's gRPC plugin generates for a service (e.g.
// shoal::v1::Coordinator). Thread-safety is the subclass's: the entry points
// run on gRPC's callback threads, concurrently.
template <typename Grpc>
class RawCallbackService : public Grpc::Service {
 public:
  using MethodDescriptor = google::protobuf::MethodDescriptor;
  using BidiReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

  // The service's descriptor, from the generated descriptor pool.
  static const google::protobuf::ServiceDescriptor& Descriptor() {
    static const google::protobuf::ServiceDescriptor* const descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            Grpc::service_full_name());
    return *descriptor;
  }

 protected:
  RawCallbackService() {
    const google::protobuf::ServiceDescriptor& service = Descriptor();
    // The generated Service adds the methods in the descriptor's order, so
    // the descriptor's index is the registration index.
    for (int i = 0; i < service.method_count(); ++i) {
      const MethodDescriptor* method = service.method(i);
      if (!method->client_streaming() && !method->server_streaming()) {
        this->MarkMethodRawCallback(
            i, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                   [this, method](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) {
                     return Unary(*method, ctx, request, response);
                   }));
      } else if (method->client_streaming() && method->server_streaming()) {
        this->MarkMethodRawCallback(
            i,
            new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                [this, method](grpc::CallbackServerContext* ctx) { return Stream(*method, ctx); }));
      } else if (method->server_streaming()) {
        // No service built on this streams one way; such a method answers
        // UNIMPLEMENTED (gRPC's answer to a null reactor) until it gets an
        // entry point of its own.
        this->MarkMethodRawCallback(
            i,
            new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                [](grpc::CallbackServerContext*, const grpc::ByteBuffer*) {
                  return static_cast<grpc::ServerWriteReactor<grpc::ByteBuffer>*>(nullptr);
                }));
      } else {
        this->MarkMethodRawCallback(
            i,
            new grpc::internal::CallbackClientStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                [](grpc::CallbackServerContext*, grpc::ByteBuffer*) {
                  return static_cast<grpc::ServerReadReactor<grpc::ByteBuffer>*>(nullptr);
                }));
      }
    }
  }

  // Every unary call of the service. `request` and `response` live until
  // the returned reactor finishes.
  virtual grpc::ServerUnaryReactor* Unary(const MethodDescriptor& method,
                                          grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) = 0;
  // Every bidirectional stream of the service.
  virtual BidiReactor* Stream(const MethodDescriptor& method, grpc::CallbackServerContext* ctx) = 0;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_RAW_SERVICE_H_
