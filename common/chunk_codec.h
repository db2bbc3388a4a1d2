// Encoding and checking of TensorChunk messages: raw little-endian float32
// bytes of a range of the flat parameter vector, with CRC-32C.
//
// Two encodings of the same wire format:
//  - the protobuf message (EncodeChunk / ChunkReceiver::Accept(TensorChunk)):
//    tests, fakes and any standard gRPC client or server;
//  - the zero-copy form the worker uses (EncodeChunkHeader / ParseChunk /
//    ChunkReceiver::Accept(RawChunk)): the sender writes a few header bytes,
//    the data bytes straight from model memory and the CRC field; the
//    receiver walks the fields across gRPC's receive buffers and applies
//    the data from there (ChunkView::CopyTo / AddTo) without gathering it.
// Either side may use either form: the bytes on the wire are the same.
// The receiver checks each chunk (ChunkReceiver) before its bytes touch
// tensor memory.
#ifndef SHOAL_COMMON_CHUNK_CODEC_H_
#define SHOAL_COMMON_CHUNK_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/v1/common.pb.h"

namespace shoal {

// Elements per chunk for a chunk size in bytes.
inline constexpr size_t kBytesPerElement = sizeof(float);

// Fills `chunk` with elements [begin, begin + count) taken from `data`
// (which points at element `begin`).
void EncodeChunk(uint64_t round, uint64_t begin, const float* data, size_t count,
                 shoal::v1::TensorChunk* chunk);

// A run of bytes, e.g. one of the slices gRPC received a message in.
struct BytePiece {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// A view of a checked chunk's elements [begin, begin + count). The bytes
// are either contiguous (`data`) or, when they arrived in several receive
// buffers, in `pieces` (in order, count * 4 bytes in total, cut anywhere,
// even inside an element) with `data` null. CopyTo and AddTo handle both,
// so consumers should use them rather than `data`.
struct ChunkView {
  uint64_t begin = 0;  // first element in the flat vector
  const float* data = nullptr;
  size_t count = 0;
  const BytePiece* pieces = nullptr;
  size_t num_pieces = 0;

  // dst[i] = element begin + i. `dst` points at element `begin`.
  void CopyTo(float* dst) const;
  // dst[i] += element begin + i (one float addition per element, in order).
  void AddTo(float* dst) const;
};

// dst[i] += src[i] for i < n. `src` holds little-endian float32 bytes at any
// alignment; the two must not overlap (so the loop vectorizes).
void AddFloats(float* __restrict dst, const uint8_t* __restrict src, size_t n);
// dst[i] /= divisor for i < n. A division, not a multiplication by the
// inverse: the same bits as the scalar loop it replaces, on every worker.
void DivideFloats(float* __restrict dst, size_t n, float divisor);

// ---- The zero-copy form of TensorChunk (shoal/v1/common.proto):
// field 1 round (varint), 2 begin (varint), 3 data (bytes), 4 crc32c
// (fixed32). The header is fields 1-3 up to the data bytes, the trailer
// field 4. Header + data + trailer are exactly what protobuf serializes for
// the same values when round, begin and crc are non-zero; a zero is written
// explicitly, which every protobuf parser accepts.
inline constexpr size_t kChunkHeaderMaxBytes = 3 + 3 * 10;
inline constexpr size_t kChunkTrailerBytes = 5;
// Writes the header into `out` (at least kChunkHeaderMaxBytes); returns its
// length.
size_t EncodeChunkHeader(uint64_t round, uint64_t begin, size_t data_bytes, uint8_t* out);
void EncodeChunkTrailer(uint32_t crc, uint8_t* out);

// A TensorChunk as received, its data bytes left in the receive buffers.
struct RawChunk {
  uint64_t round = 0;
  uint64_t begin = 0;
  uint32_t crc32c = 0;
  bool has_data = false;
  size_t data_size = 0;
  std::vector<BytePiece> data;  // the data field's bytes, in order
};

// Parses a TensorChunk's protobuf encoding spread over `pieces` into `out`
// (reused by the caller across messages: no allocation once warm). Unknown
// fields are skipped and a repeated field keeps its last value, as protobuf
// does. DATA_LOSS when the bytes are not a well-formed message.
absl::Status ParseChunk(const BytePiece* pieces, size_t num_pieces, RawChunk* out);

// Checks the chunks of one stream of the range [begin, end) of `round`, in
// order, without gaps or overlaps. Not thread-safe (one per stream).
class ChunkReceiver {
 public:
  ChunkReceiver(uint64_t round, uint64_t begin, uint64_t end)
      : round_(round), end_(end), next_(begin) {}

  // FAILED_PRECONDITION: wrong round. INVALID_ARGUMENT: size not a multiple
  // of 4, empty, gap or overlap, past the end of the range.
  // RESOURCE_EXHAUSTED: bigger than kMaxChunkBytes. DATA_LOSS: bad CRC.
  // The view points into `chunk`, valid while it lives.
  absl::StatusOr<ChunkView> Accept(const shoal::v1::TensorChunk& chunk);
  // The same checks on a parsed zero-copy chunk; the view's pieces point
  // into `chunk.data` (and so into the receive buffers).
  absl::StatusOr<ChunkView> Accept(const RawChunk& chunk);

  // DATA_LOSS when the stream ended before the whole range arrived.
  absl::Status Finish() const;

  uint64_t received_until() const { return next_; }

 private:
  // Every check but the CRC; returns the element count.
  absl::StatusOr<uint64_t> CheckHeader(uint64_t round, uint64_t begin, size_t bytes) const;

  uint64_t round_;
  uint64_t end_;
  uint64_t next_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_CHUNK_CODEC_H_
