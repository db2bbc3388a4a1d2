// The seam for how a slice travels between workers
// (../shared/DESIGN.md, "Growing the averaging"; docs/COMPRESSION.md): the
// averager reads contributions and averages through a Codec and never
// touches the encoding itself.
//
// Two ways a codec travels:
//  - raw (fp32 only): the wire bytes of a slice are its float32 bytes in
//    model memory, served zero-copy (ReadSlice) and decoded chunk by chunk
//    (AccumulateContribution / ApplyAverage / RoundTripAverage);
//  - encoded (every codec, fp32 included when an outer optimizer runs): a
//    slice of the round's change is encoded once into a blob
//    (EncodeSlice) that the peer service serves (ReadEncoded), and decoded
//    whole (DecodeSlice). The owner of a slice decodes every contribution,
//    averages in fp32, encodes the average once and applies the decoded
//    bytes of that encoding like every other worker: every worker holds the
//    same bits and the hash check keeps its meaning.
//
// Encodings (little-endian, n elements of one slice):
//   fp32     n x float32
//   fp16     n x IEEE binary16 (round to nearest even; overflow to inf)
//   bf16     n x bfloat16 (round to nearest even)
//   int8     per block of kInt8Block elements: float32 scale (>= 0 and
//            127 x scale finite, so that every q * scale is), then one
//            int8 per element; x = q * scale
//   topk:F / randomk:F (sparse): u32 k, then k indices as varints of the
//            gap to the previous index (the first: the index itself; then
//            index - previous - 1, so indices strictly increase), then k x
//            float32 values; the others are 0. k = max(1, round(F n)).
//   sparse:F a DCT per 512-element chunk, the F n largest coefficients,
//            range-coded positions and 2-bit values (sparse_codec.h has
//            the layout).
//
// Decoders check everything (DecodeSlice): a size or count that does not
// match n -> INVALID_ARGUMENT, an index out of range or a malformed varint
// -> INVALID_ARGUMENT, a NaN/inf/negative/too large scale or a non-finite sparse
// value -> INVALID_ARGUMENT, and nothing is written on error.
// Implementations are stateless and thread-safe.
#ifndef SHOAL_SERVICES_WORKER_CORE_CODEC_H_
#define SHOAL_SERVICES_WORKER_CORE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/chunk_codec.h"
#include "common/run_options.h"

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

  // ---- The encoded path (every codec).
  // True when decode(encode(x)) may differ from x (error feedback keeps
  // the difference for the next round).
  virtual bool lossy() const = 0;
  // Encodes `n` elements of `src`. `seed` picks randomk's elements (the
  // same seed on every worker picks the same ones); the others ignore it.
  virtual std::string EncodeSlice(const float* src, size_t n, uint64_t seed) const = 0;
  // Decodes `bytes` into out[0, n); checks it first (see the file comment)
  // and writes nothing on error.
  virtual absl::Status DecodeSlice(absl::Span<const uint8_t> bytes, size_t n, float* out) const = 0;
  // Largest encoding of `n` elements: a peer announcing more is refused.
  virtual size_t MaxEncodedBytes(size_t n) const = 0;
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
  bool lossy() const override { return false; }
  std::string EncodeSlice(const float* src, size_t n, uint64_t seed) const override;
  absl::Status DecodeSlice(absl::Span<const uint8_t> bytes, size_t n, float* out) const override;
  size_t MaxEncodedBytes(size_t n) const override { return n * sizeof(float); }
};

// Elements per int8 block (one float32 scale each): 4 bytes per 256
// elements keep the encoding at 0.254 of fp32.
inline constexpr size_t kInt8Block = 256;

// The codec `name` (see ParseCodecSpec; empty: fp32); INVALID_ARGUMENT for
// an unknown one. Only fp32 is raw(); the others travel encoded.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& name);

// Error feedback (docs/COMPRESSION.md): `change` (n elements) plus what
// was not sent before (`residual`) is encoded; the residual becomes what
// this encoding leaves out: residual = (change + residual) - decoded. So
// sent + kept = change + old residual, element by element (up to one
// float rounding). Returns the encoding.
std::string EncodeWithFeedback(const Codec& codec, const float* change, size_t n, uint64_t seed,
                               float* residual);

// float <-> IEEE binary16 / bfloat16 (round to nearest even), exposed for
// tests.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_CODEC_H_
