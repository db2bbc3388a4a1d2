// Encoding and checking of TensorChunk messages: raw little-endian float32
// bytes of a range of the flat parameter vector, with CRC-32C.
// The sender copies straight from tensor memory into the message; the
// receiver checks each chunk before its bytes touch tensor memory.
#ifndef SHOAL_COMMON_CHUNK_CODEC_H_
#define SHOAL_COMMON_CHUNK_CODEC_H_

#include <cstddef>
#include <cstdint>

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

// A view of a checked chunk's elements.
struct ChunkView {
  uint64_t begin = 0;  // first element in the flat vector
  const float* data = nullptr;
  size_t count = 0;
};

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

  // DATA_LOSS when the stream ended before the whole range arrived.
  absl::Status Finish() const;

  uint64_t received_until() const { return next_; }

 private:
  uint64_t round_;
  uint64_t end_;
  uint64_t next_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_CHUNK_CODEC_H_
