#include "common/tensor_wire_grpc.h"

#include <google/protobuf/descriptor.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_util.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal {
namespace {

const std::string* FindReadSliceMethodPath() {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          shoal::v1::Peer::service_full_name());
  const google::protobuf::Descriptor* in = shoal::v1::ReadSliceRequest::descriptor();
  const google::protobuf::Descriptor* out = shoal::v1::TensorChunk::descriptor();
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* m = service->method(i);
    if (m->input_type() == in && m->output_type() == out && m->server_streaming() &&
        !m->client_streaming()) {
      return new std::string(absl::StrCat("/", service->full_name(), "/", m->name()));
    }
  }
  SHOAL_LOG(ERROR) << "shoal.v1.Peer has no server-streaming method from ReadSliceRequest to "
                      "TensorChunk; the tensor wire format cannot work";
  std::abort();
}

// Waits for the one operation in flight on `cq` (a queue of one call).
bool Await(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  if (!cq->Next(&tag, &ok)) return false;
  return ok;
}

}  // namespace

const std::string& ReadSliceMethodPath() {
  static const std::string* const path = FindReadSliceMethodPath();
  return *path;
}

absl::Status DecodeReadSliceRequest(const grpc::ByteBuffer& raw,
                                    shoal::v1::ReadSliceRequest* request) {
  grpc::ByteBuffer copy(raw);  // Deserialize consumes its input; this shares the slices
  if (!grpc::SerializationTraits<shoal::v1::ReadSliceRequest>::Deserialize(&copy, request).ok()) {
    return absl::InvalidArgumentError("the request is not a serialized shoal.v1.ReadSliceRequest");
  }
  return absl::OkStatus();
}

namespace {

grpc::ByteBuffer ChunkBuffer(uint64_t round, uint64_t begin, size_t bytes, grpc::Slice data,
                             uint32_t crc) {
  uint8_t head[kChunkHeaderMaxBytes];
  const size_t head_size = EncodeChunkHeader(round, begin, bytes, head);
  uint8_t tail[kChunkTrailerBytes];
  EncodeChunkTrailer(crc, tail);
  grpc::Slice slices[3] = {grpc::Slice(head, head_size), std::move(data),
                           grpc::Slice(tail, sizeof(tail))};
  return grpc::ByteBuffer(slices, 3);
}

}  // namespace

grpc::ByteBuffer LentChunkBuffer(uint64_t round, uint64_t begin, const float* data, uint64_t count,
                                 uint32_t crc, ReturnLentChunk returned, void* arg) {
  const size_t bytes = count * kBytesPerElement;
  // The slice points at the lender's memory; gRPC never writes through it.
  return ChunkBuffer(round, begin, bytes,
                     grpc::Slice(const_cast<float*>(data), bytes, returned, arg), crc);
}

grpc::ByteBuffer CopiedChunkBuffer(uint64_t round, uint64_t begin, const std::string& bytes,
                                   uint32_t crc) {
  return ChunkBuffer(round, begin, bytes.size(), grpc::Slice(bytes), crc);
}

absl::Status ReadChunkStream(grpc::GenericStub* stub, grpc::ClientContext* ctx,
                             const shoal::v1::ReadSliceRequest& request, const std::string& source,
                             const std::function<bool(const ChunkView&)>& on_chunk) {
  // One call, one queue, one operation in flight at a time: the calling
  // thread drives it as the synchronous API would, without grpc::internal.
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub->PrepareCall(ctx, ReadSliceMethodPath(), &cq);
  grpc::ByteBuffer raw_request;
  bool own_buffer = false;
  (void)grpc::SerializationTraits<shoal::v1::ReadSliceRequest>::Serialize(request, &raw_request,
                                                                          &own_buffer);
  ChunkReceiver receiver(request.round(), request.begin(), request.end());
  absl::Status bad;
  call->StartCall(nullptr);
  bool ok = Await(&cq);
  if (ok) {
    // The request is the only message: sent with the half-close.
    call->WriteLast(raw_request, grpc::WriteOptions(), nullptr);
    ok = Await(&cq);
  }
  // Reused across messages: after the first chunk nothing here allocates.
  grpc::ByteBuffer message;
  std::vector<grpc::Slice> slices;
  std::vector<BytePiece> pieces;
  RawChunk chunk;
  while (ok) {
    call->Read(&message, nullptr);
    if (!Await(&cq)) break;  // the stream ended (Finish says how)
    // References to gRPC's receive buffers (~17 per 1 MiB chunk), no copy.
    slices.clear();
    if (!message.Dump(&slices).ok()) {
      bad = absl::DataLossError(absl::StrCat("cannot read a chunk's bytes from ", source));
      break;
    }
    pieces.clear();
    for (const grpc::Slice& s : slices) pieces.push_back({s.begin(), s.size()});
    if (absl::Status parsed = ParseChunk(pieces.data(), pieces.size(), &chunk); !parsed.ok()) {
      bad = Annotate(parsed, absl::StrCat("from ", source));
      break;
    }
    absl::StatusOr<ChunkView> view = receiver.Accept(chunk);
    if (!view.ok()) {
      bad = Annotate(view.status(), absl::StrCat("from ", source));
      break;
    }
    if (!on_chunk(*view)) {
      bad = absl::CancelledError("read cancelled by the caller");
      break;
    }
  }
  if (!bad.ok()) ctx->TryCancel();
  grpc::Status status;
  call->Finish(&status, nullptr);
  Await(&cq);
  cq.Shutdown();
  void* tag = nullptr;
  while (cq.Next(&tag, &ok)) {
  }
  if (!bad.ok()) return bad;
  absl::Status s = FromGrpcStatus(status);
  if (!s.ok()) return Annotate(s, source);
  return Annotate(receiver.Finish(), absl::StrCat("from ", source));
}

}  // namespace shoal
