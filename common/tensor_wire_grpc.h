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
// Client end: ReadChunkStream reads each message as raw bytes through
// grpc::GenericStub (the async API on a completion queue of its own, driven
// by the calling thread), parses its fields across gRPC's receive slices,
// checks it (ChunkReceiver) and hands it over as a ChunkView of pieces: no
// protobuf parse into a string, no copy before the consumer's own.
//
// The method's path comes from the generated descriptor of shoal.v1.Peer,
// not from a string literal.
#ifndef SHOAL_COMMON_TENSOR_WIRE_GRPC_H_
#define SHOAL_COMMON_TENSOR_WIRE_GRPC_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
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

// Streams `request` (Peer.ReadSlice) through `stub`, a GenericStub on the
// peer's channel. Each chunk is checked (ChunkReceiver) before `on_chunk`
// sees it; the view and the receive buffers it points into are valid during
// the callback only. `ctx` carries the deadline; another thread may
// TryCancel it. Returns the first bad chunk's error (annotated "from
// <source>"), CANCELLED when `on_chunk` returns false, the call's status
// (annotated "<source>"), or DATA_LOSS when the stream ended short.
absl::Status ReadChunkStream(grpc::GenericStub* stub, grpc::ClientContext* ctx,
                             const shoal::v1::ReadSliceRequest& request, const std::string& source,
                             const std::function<bool(const ChunkView&)>& on_chunk);

}  // namespace shoal

#endif  // SHOAL_COMMON_TENSOR_WIRE_GRPC_H_
