// The sparse codec `sparse:F` (issue 27, docs/COMPRESSION.md "sparse:F"):
// a slice is transformed chunk by chunk with an orthonormal DCT-II (DeMo's
// idea: a round's change is smooth along a weight row, so a few cosine
// coefficients hold most of it), the F n largest coefficients of the slice
// are kept, their positions are arithmetic-coded with one adaptive
// probability per frequency (most of what is kept sits at a few
// frequencies, so a position costs about 3.5 bits instead of 5.5), and
// each value travels as a sign and one magnitude bit against a per-chunk
// scale (SparseLoCo's 2-bit values). What the encoding leaves out (the
// other coefficients and the rounding of the values) goes to error
// feedback like every lossy codec's.
//
// Encoding of a slice of n elements (k = max(1, round(F n)); chunks of
// kSparseChunk elements; the last n mod kSparseChunk elements form a tail
// chunk that is not transformed):
//   float32 G (little-endian): the largest |coefficient|, finite, >= 0
//   then one range-coded stream (LZMA's binary range coder; the
//   probability of each adaptive bit is (2 zeros + 1) / (2 seen + 2) of the
//   bits seen before in its context, in 15-bit fixed point):
//     support: for coefficients 0, 1, ... one adaptive bit "kept", context
//       = its frequency (position in its chunk; the tail: one more
//       context), whose counts lean on the estimate over all frequencies
//       as a prior worth 4 bits, until k are kept; when as many
//       coefficients remain as are still to keep, they are all kept
//       without a bit
//     scales: per chunk holding a kept coefficient, in order, an 8-bit
//       code c (adaptive bit tree, high bit first): the chunk's scale is
//       s = 0 for c = 0, else G x 2^(-(255 - c) / 8)
//     values: per kept coefficient, in order, its sign (a bit at
//       probability 1/2; 1 = negative) and an adaptive magnitude bit m:
//       the coefficient is s (m + 1) / 2
// Decoding runs the inverse DCT (DCT-III) of every full chunk.
//
// Decoders check everything: a size below 9 bytes or above
// MaxEncodedBytes, a non-finite or negative G, a stream that ends early,
// has bytes left over or does not start with the coder's zero byte, or a
// decoded value that is not finite is INVALID_ARGUMENT, and nothing is
// written on error. Any stream of the right form decodes to exactly k
// kept coefficients.
//
// Determinism (all workers apply the decoded bytes and must hold the same
// bits): the coder is integer arithmetic; the DCT is a radix-2 FFT in
// float in a fixed order, with constants computed at start by Taylor
// series in double (no libm), and this file is compiled without
// floating-point contraction (services/worker/CMakeLists.txt), so an FMA
// machine computes the same bits as one without.
#ifndef SHOAL_SERVICES_WORKER_CORE_SPARSE_CODEC_H_
#define SHOAL_SERVICES_WORKER_CORE_SPARSE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "services/worker/core/codec.h"

namespace shoal::worker {

// Elements per DCT chunk (a power of two for the FFT). 512 spans more than
// half a row of the MLP's first layer (784 inputs); 256 kept about 0.2
// point less of fp32's accuracy in the compress benchmark, 1024 no more.
inline constexpr size_t kSparseChunk = 512;

// Stateless and thread-safe, like every Codec.
class SparseDctCodec final : public Codec {
 public:
  // `fraction` in (0, 1]: the share of a slice's coefficients sent.
  explicit SparseDctCodec(double fraction);

  const char* name() const override { return name_.c_str(); }
  bool raw() const override { return false; }
  // Typical (about 6 bits per kept coefficient); the figure status and
  // benchmarks show is the measured one.
  size_t EncodedBytes(size_t n) const override;
  void Encode(const float* src, size_t n, uint8_t* out) const override;
  absl::Status AccumulateContribution(const ChunkView& chunk, float* sum) const override;
  absl::Status ApplyAverage(const ChunkView& chunk, float* dst) const override;
  void RoundTripAverage(float* slice, size_t n) const override;
  bool lossy() const override { return true; }
  // `seed` is unused: what is kept depends on the values alone.
  std::string EncodeSlice(const float* src, size_t n, uint64_t seed) const override;
  absl::Status DecodeSlice(absl::Span<const uint8_t> bytes, size_t n, float* out) const override;
  size_t MaxEncodedBytes(size_t n) const override;

  // Coefficients kept of a slice of n elements.
  size_t KeptOf(size_t n) const;

 private:
  const double fraction_;
  std::string name_;
};

// The orthonormal DCT-II of kSparseChunk elements in place (`inverse`:
// DCT-III, its inverse), exposed for tests.
void SparseDct(float* x, bool inverse);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_SPARSE_CODEC_H_
