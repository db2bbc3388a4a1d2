// The seam for how a slice travels between workers
// (../shared/DESIGN.md, "Growing the averaging"): the averager reads
// contributions and averages through a Codec and never touches the encoding
// itself. fp32 (raw little-endian float32, served zero-copy from model
// memory) is the first implementation; fp16/bf16, int8 with a scale per
// block and top-k / random-k with error feedback plug in here.
//
// The rule that keeps models bit-identical whatever the codec: the owner of
// a slice averages the decoded contributions in fp32, then makes its own
// copy of the average exactly what every other worker will decode from the
// bytes it serves (RoundTripAverage); every worker then holds the same bits
// and the hash check keeps its meaning.
//
// Decoders get checked chunks (ChunkReceiver: range, size, CRC) and check
// what is codec-specific themselves: INVALID_ARGUMENT / DATA_LOSS, and
// nothing is written on error. Implementations are stateless and
// thread-safe.
#ifndef SHOAL_SERVICES_WORKER_CORE_CODEC_H_
#define SHOAL_SERVICES_WORKER_CORE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chunk_codec.h"

namespace shoal::worker {

class Codec {
 public:
  virtual ~Codec() = default;
  // The name in the run config and in logs ("fp32").
  virtual const char* name() const = 0;
  // True when the wire bytes of a slice are its float32 bytes as they are in
  // memory, so the peer service serves model memory without encoding.
  virtual bool raw() const = 0;
  // Bytes on the wire for `elements` elements.
  virtual size_t EncodedBytes(size_t elements) const = 0;
  // Encodes `n` elements of `src` into `out` (EncodedBytes(n) bytes).
  virtual void Encode(const float* src, size_t n, uint8_t* out) const = 0;
  // sum[i] += decoded element (chunk.begin + i); `sum` points at element
  // chunk.begin. Reduce-scatter side.
  virtual absl::Status AccumulateContribution(const ChunkView& chunk, float* sum) const = 0;
  // dst[i] = decoded element (chunk.begin + i). All-gather side.
  virtual absl::Status ApplyAverage(const ChunkView& chunk, float* dst) const = 0;
  // The owner's averaged slice becomes what the others decode from it.
  virtual void RoundTripAverage(float* slice, size_t n) const = 0;
};

// The raw float32 codec (today's wire format).
class Fp32Codec final : public Codec {
 public:
  const char* name() const override { return "fp32"; }
  bool raw() const override { return true; }
  size_t EncodedBytes(size_t elements) const override { return elements * sizeof(float); }
  void Encode(const float* src, size_t n, uint8_t* out) const override;
  absl::Status AccumulateContribution(const ChunkView& chunk, float* sum) const override;
  absl::Status ApplyAverage(const ChunkView& chunk, float* dst) const override;
  // Nothing to do: fp32 bytes decode to themselves.
  void RoundTripAverage(float*, size_t) const override {}
};

// The codec named `name` (empty: fp32); INVALID_ARGUMENT for an unknown one.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& name);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_CODEC_H_
