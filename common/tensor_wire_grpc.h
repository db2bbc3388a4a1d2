// The gRPC half of the tensor wire format (common/tensor_wire.h): the raw
// Peer.ReadSlice method on both ends, so that no other file builds or takes
// apart a TensorChunk's ByteBuffer.
//
// Server end: a chunk is a grpc::ByteBuffer of three slices, the header
// bytes (round, begin, the data field's tag and length), a slice that points
// into lent model memory (no copy: gRPC reads it when it writes the socket)
// and the crc32c field. These are the bytes protobuf serializes for the same
// TensorChunk, so any protobuf client reads them.
//
// Client end: StartChunkStream reads each message as raw bytes through
// grpc::GenericStub with the callback API (a reactor per call, no thread
// per read), parses its fields across gRPC's receive slices, checks it
// (ChunkReceiver) and hands it over as a ChunkView of pieces: no protobuf
// parse into a string, no copy before the consumer's own. The consumer
// paces the stream (ChunkNext::kPause, then Resume): gRPC's flow control
// then holds the sender.
//
// The method's path comes from the generated descriptor of shoal.v1.Peer,
// not from a string literal.
#ifndef SHOAL_COMMON_TENSOR_WIRE_GRPC_H_
#define SHOAL_COMMON_TENSOR_WIRE_GRPC_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/cancellation.h"
#include "common/tensor_wire.h"
#include "shoal/v1/peer.pb.h"

namespace shoal {

// "/shoal.v1.Peer/ReadSlice": the server-streaming method of shoal.v1.Peer
// from ReadSliceRequest to TensorChunk, found in the generated descriptor
// pool (the process aborts, at first use, if peer.proto ever lacks it).
const std::string& ReadSliceMethodPath();

// ---- Server end.

// Parses a raw ReadSliceRequest; INVALID_ARGUMENT when it is not one.
absl::Status DecodeReadSliceRequest(const grpc::ByteBuffer& raw,
                                    shoal::v1::ReadSliceRequest* request);

// Called when gRPC drops its last reference to a lent chunk's bytes (it
// will not read them again), on any thread, possibly inside gRPC.
using ReturnLentChunk = void (*)(void* arg);

// The TensorChunk of elements [begin, begin + count) of `round` whose data
// bytes are `data` itself (lent, not copied; gRPC never writes through it)
// and whose CRC-32C is `crc`. `returned(arg)` runs once gRPC is done with
// `data`.
grpc::ByteBuffer LentChunkBuffer(uint64_t round, uint64_t begin, const float* data, uint64_t count,
                                 uint32_t crc, ReturnLentChunk returned, void* arg);
// The same with a copy of `bytes` (a multiple of 4) as the data (tests'
// fault injection: bytes that are not the model's).
grpc::ByteBuffer CopiedChunkBuffer(uint64_t round, uint64_t begin, const std::string& bytes,
                                   uint32_t crc);

// ---- Client end.

// What a reader does after a chunk.
enum class ChunkNext {
  kRead,   // read the next chunk
  kPause,  // no read until ChunkStreamCall::Resume() (flow control)
  kStop,   // cancel the call (it ends CANCELLED)
};

struct ChunkStreamCallbacks {
  // Each checked chunk, on a gRPC thread, one at a time per call. The view
  // and the receive buffers it points into are valid during the call only.
  std::function<ChunkNext(const ChunkView&)> on_chunk;
  // Exactly once, after the last on_chunk, on a gRPC thread: the first bad
  // chunk's error (annotated "from <source>"), CANCELLED (kStop, Cancel()),
  // the call's own status (annotated "<source>"), DATA_LOSS when the stream
  // ended short, or OK. `received_until`: the first element not received.
  std::function<void(absl::Status status, uint64_t received_until)> on_done;
};

// A Peer.ReadSlice call in flight, driven by gRPC's callback API (no thread
// of its own). Thread-safe; valid after the call ended (then a no-op).
class ChunkStreamCall {
 public:
  virtual ~ChunkStreamCall() = default;
  // After on_chunk returned kPause: reads on.
  virtual void Resume() = 0;
  // Ends the call (on_done hears CANCELLED unless it ended already).
  virtual void Cancel() = 0;
};

// Starts `request` (Peer.ReadSlice) through `stub`, a GenericStub on the
// peer's channel; `ctx` carries the deadline and metadata and is kept by
// the call. Each chunk is checked (ChunkReceiver) before on_chunk sees it:
// every byte is parsed where gRPC received it, no copy before the
// consumer's own.
std::shared_ptr<ChunkStreamCall> StartChunkStream(grpc::GenericStub* stub,
                                                  std::unique_ptr<grpc::ClientContext> ctx,
                                                  const shoal::v1::ReadSliceRequest& request,
                                                  std::string source,
                                                  ChunkStreamCallbacks callbacks);

// The same call, waited for on the calling thread: `on_chunk` returning
// false cancels, and so does `canceller` (may be null). Returns what
// on_done would hear. `ctx` carries the deadline.
absl::Status ReadChunkStream(grpc::GenericStub* stub, std::unique_ptr<grpc::ClientContext> ctx,
                             const shoal::v1::ReadSliceRequest& request, const std::string& source,
                             CancellationToken* canceller,
                             const std::function<bool(const ChunkView&)>& on_chunk);

}  // namespace shoal

#endif  // SHOAL_COMMON_TENSOR_WIRE_GRPC_H_
