#include "services/worker/core/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/worker/core/sparse_codec.h"

namespace shoal::worker {
namespace {

void PutU32(uint32_t v, std::string* out) {
  char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
               static_cast<char>(v >> 24)};
  out->append(b, 4);
}
uint32_t GetU32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
void PutFloat(float f, std::string* out) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  PutU32(v, out);
}
float GetFloat(const uint8_t* p) {
  const uint32_t v = GetU32(p);
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}
void PutVarint(uint32_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// True when every q * scale (|q| <= 127) is a finite float: the scale is
// >= 0 and 127 x scale, rounded to float, does not overflow.
bool UsableInt8Scale(float scale) { return scale >= 0 && std::isfinite(127.0f * scale); }

absl::Status SizeMismatch(const char* codec, size_t got, size_t want, size_t n) {
  return absl::InvalidArgumentError(
      absl::StrCat(codec, " slice of ", n, " elements has ", got, " bytes, expected ", want));
}

// Encoded codecs do not travel chunk by chunk from model memory.
class EncodedCodec : public Codec {
 public:
  bool raw() const override { return false; }
  void Encode(const float* src, size_t n, uint8_t* out) const override {
    const std::string s = EncodeSlice(src, n, 0);
    std::memcpy(out, s.data(), std::min(s.size(), EncodedBytes(n)));
  }
  absl::Status AccumulateContribution(const ChunkView&, float*) const override {
    return absl::FailedPreconditionError(
        absl::StrCat("codec ", name(), " travels encoded (ReadEncoded), not as raw chunks"));
  }
  absl::Status ApplyAverage(const ChunkView&, float*) const override {
    return absl::FailedPreconditionError(
        absl::StrCat("codec ", name(), " travels encoded (ReadEncoded), not as raw chunks"));
  }
  void RoundTripAverage(float* slice, size_t n) const override {
    const std::string s = EncodeSlice(slice, n, 0);
    DecodeSlice(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size()), n,
                slice)
        .IgnoreError();  // our own encoding always decodes
  }
  bool lossy() const override { return true; }
  size_t MaxEncodedBytes(size_t n) const override { return EncodedBytes(n); }
};

class HalfCodec final : public EncodedCodec {
 public:
  explicit HalfCodec(bool bf16) : bf16_(bf16) {}
  const char* name() const override { return bf16_ ? "bf16" : "fp16"; }
  size_t EncodedBytes(size_t n) const override { return 2 * n; }
  std::string EncodeSlice(const float* src, size_t n, uint64_t) const override {
    std::string out(2 * n, '\0');
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = bf16_ ? FloatToBf16(src[i]) : FloatToHalf(src[i]);
      out[2 * i] = static_cast<char>(h);
      out[2 * i + 1] = static_cast<char>(h >> 8);
    }
    return out;
  }
  absl::Status DecodeSlice(absl::Span<const uint8_t> b, size_t n, float* out) const override {
    if (b.size() != 2 * n) return SizeMismatch(name(), b.size(), 2 * n, n);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = static_cast<uint16_t>(b[2 * i] | b[2 * i + 1] << 8);
      out[i] = bf16_ ? Bf16ToFloat(h) : HalfToFloat(h);
    }
    return absl::OkStatus();
  }

 private:
  const bool bf16_;
};

class Int8Codec final : public EncodedCodec {
 public:
  const char* name() const override { return "int8"; }
  size_t EncodedBytes(size_t n) const override {
    return n + 4 * ((n + kInt8Block - 1) / kInt8Block);
  }
  std::string EncodeSlice(const float* src, size_t n, uint64_t) const override {
    std::string out;
    out.reserve(EncodedBytes(n));
    for (size_t b = 0; b < n; b += kInt8Block) {
      const size_t m = std::min(kInt8Block, n - b);
      float max_abs = 0;
      for (size_t i = 0; i < m; ++i) {
        const float a = std::fabs(src[b + i]);
        if (std::isfinite(a)) max_abs = std::max(max_abs, a);
      }
      float scale = max_abs / 127.0f;
      // max |x| near FLT_MAX: max_abs / 127 may round up so far that 127 x
      // scale overflows; the next float down does not.
      if (!UsableInt8Scale(scale)) scale = std::nextafter(scale, 0.0f);
      PutFloat(scale, &out);
      for (size_t i = 0; i < m; ++i) {
        const float x = src[b + i];
        long q = 0;
        if (scale > 0 && std::isfinite(x)) q = std::lrintf(x / scale);
        q = std::clamp(q, -127L, 127L);
        out.push_back(static_cast<char>(static_cast<int8_t>(q)));
      }
    }
    return out;
  }
  absl::Status DecodeSlice(absl::Span<const uint8_t> b, size_t n, float* out) const override {
    if (b.size() != EncodedBytes(n)) return SizeMismatch(name(), b.size(), EncodedBytes(n), n);
    // Every scale first: nothing is written when one is bad.
    for (size_t blk = 0, pos = 0; blk < n; blk += kInt8Block) {
      const float scale = GetFloat(b.data() + pos);
      // A finite scale above about FLT_MAX / 127 decodes 127 to inf.
      if (!UsableInt8Scale(scale)) {
        return absl::InvalidArgumentError(absl::StrCat("int8 block at element ", blk, " has scale ",
                                                       scale,
                                                       " (must be >= 0 with 127 x scale finite)"));
      }
      pos += 4 + std::min(kInt8Block, n - blk);
    }
    for (size_t blk = 0, pos = 0; blk < n; blk += kInt8Block) {
      const size_t m = std::min(kInt8Block, n - blk);
      const float scale = GetFloat(b.data() + pos);
      pos += 4;
      for (size_t i = 0; i < m; ++i) {
        out[blk + i] = static_cast<float>(static_cast<int8_t>(b[pos + i])) * scale;
      }
      pos += m;
    }
    return absl::OkStatus();
  }
};

// splitmix64: a tiny, fully specified generator (the same numbers on every
// platform, unlike the standard distributions).
uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SparseCodec final : public EncodedCodec {
 public:
  SparseCodec(bool random, double fraction) : random_(random), fraction_(fraction) {
    name_ = absl::StrCat(random ? "randomk:" : "topk:", fraction);
  }
  const char* name() const override { return name_.c_str(); }
  size_t K(size_t n) const {
    if (n == 0) return 0;
    const double k = std::llround(fraction_ * static_cast<double>(n));
    return std::clamp<size_t>(static_cast<size_t>(k), 1, n);
  }
  // Typical size (gaps of one varint byte and a bit); the figure status
  // and benchmarks show is the measured one.
  size_t EncodedBytes(size_t n) const override { return 4 + K(n) * 5; }
  size_t MaxEncodedBytes(size_t n) const override { return 4 + K(n) * 9; }

  std::string EncodeSlice(const float* src, size_t n, uint64_t seed) const override {
    const size_t k = K(n);
    std::vector<uint32_t> idx;
    if (random_) {
      // Floyd's sampling: k distinct indices from the seed.
      std::vector<bool> taken(n, false);
      uint64_t state = seed;
      idx.reserve(k);
      for (size_t j = n - k; j < n; ++j) {
        const size_t t = static_cast<size_t>(SplitMix(&state) % (j + 1));
        const size_t pick = taken[t] ? j : t;
        taken[pick] = true;
        idx.push_back(static_cast<uint32_t>(pick));
      }
    } else {
      idx.resize(n);
      for (size_t i = 0; i < n; ++i) idx[i] = static_cast<uint32_t>(i);
      // Largest magnitude first, ties to the lower index: deterministic.
      auto larger = [src](uint32_t a, uint32_t b) {
        const float fa = std::isfinite(src[a]) ? std::fabs(src[a]) : 0.0f;
        const float fb = std::isfinite(src[b]) ? std::fabs(src[b]) : 0.0f;
        return fa != fb ? fa > fb : a < b;
      };
      if (k < n)
        std::nth_element(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(), larger);
      idx.resize(k);
    }
    std::sort(idx.begin(), idx.end());
    std::string out;
    out.reserve(4 + k * 6);
    PutU32(static_cast<uint32_t>(k), &out);
    for (size_t j = 0; j < k; ++j) PutVarint(j == 0 ? idx[0] : idx[j] - idx[j - 1] - 1, &out);
    for (size_t j = 0; j < k; ++j) {
      const float v = src[idx[j]];
      PutFloat(std::isfinite(v) ? v : 0.0f, &out);
    }
    return out;
  }

  absl::Status DecodeSlice(absl::Span<const uint8_t> b, size_t n, float* out) const override {
    if (b.size() < 4) return SizeMismatch(name(), b.size(), 4, n);
    const uint64_t k = GetU32(b.data());
    if (k != K(n)) {
      return absl::InvalidArgumentError(absl::StrCat(name(), " slice of ", n, " elements carries ",
                                                     k, " elements, expected ", K(n)));
    }
    if (b.size() > MaxEncodedBytes(n)) return SizeMismatch(name(), b.size(), MaxEncodedBytes(n), n);
    std::vector<uint32_t> idx(k);
    size_t pos = 4;
    uint64_t next = 0;  // smallest index allowed next
    for (uint64_t j = 0; j < k; ++j) {
      uint64_t v = 0;
      int shift = 0;
      while (true) {
        if (pos >= b.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat(name(), ": index ", j, " of ", k, " runs past the end"));
        }
        const uint8_t byte = b[pos++];
        if (shift == 28 && (byte & 0xF0) != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(name(), ": index ", j, " is not a 32-bit varint"));
        }
        v |= uint64_t{byte & 0x7Fu} << shift;
        if ((byte & 0x80) == 0) break;
        shift += 7;
      }
      const uint64_t index = next + v;
      if (index >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat(name(), ": index ", index, " out of range of a slice of ", n));
      }
      idx[j] = static_cast<uint32_t>(index);
      next = index + 1;
    }
    if (b.size() - pos != k * 4) return SizeMismatch(name(), b.size(), pos + k * 4, n);
    for (uint64_t j = 0; j < k; ++j) {
      if (!std::isfinite(GetFloat(b.data() + pos + 4 * j))) {
        return absl::InvalidArgumentError(
            absl::StrCat(name(), ": value of element ", idx[j], " is not finite"));
      }
    }
    std::fill(out, out + n, 0.0f);
    for (uint64_t j = 0; j < k; ++j) out[idx[j]] = GetFloat(b.data() + pos + 4 * j);
    return absl::OkStatus();
  }

 private:
  const bool random_;
  const double fraction_;
  std::string name_;
};

}  // namespace

void Fp32Codec::Encode(const float* src, size_t n, uint8_t* out) const {
  // Little-endian hosts only (x86-64, arm64): the bytes are the floats.
  std::memcpy(out, src, n * sizeof(float));
}

absl::Status Fp32Codec::AccumulateContribution(const ChunkView& chunk, float* sum) const {
  chunk.AddTo(sum);
  return absl::OkStatus();
}

absl::Status Fp32Codec::ApplyAverage(const ChunkView& chunk, float* dst) const {
  chunk.CopyTo(dst);
  return absl::OkStatus();
}

std::string Fp32Codec::EncodeSlice(const float* src, size_t n, uint64_t) const {
  return std::string(reinterpret_cast<const char*>(src), n * sizeof(float));
}

absl::Status Fp32Codec::DecodeSlice(absl::Span<const uint8_t> bytes, size_t n, float* out) const {
  if (bytes.size() != n * sizeof(float)) return SizeMismatch("fp32", bytes.size(), 4 * n, n);
  // An empty slice may come with null pointers, which memcpy must not get.
  if (n > 0) std::memcpy(out, bytes.data(), bytes.size());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& name) {
  absl::StatusOr<CodecSpec> spec = ParseCodecSpec(name);
  if (!spec.ok()) return spec.status();
  switch (spec->kind) {
    case CodecSpec::Kind::kFp32:
      return std::make_unique<Fp32Codec>();
    case CodecSpec::Kind::kFp16:
      return std::make_unique<HalfCodec>(false);
    case CodecSpec::Kind::kBf16:
      return std::make_unique<HalfCodec>(true);
    case CodecSpec::Kind::kInt8:
      return std::make_unique<Int8Codec>();
    case CodecSpec::Kind::kTopK:
      return std::make_unique<SparseCodec>(false, spec->fraction);
    case CodecSpec::Kind::kRandomK:
      return std::make_unique<SparseCodec>(true, spec->fraction);
    case CodecSpec::Kind::kSparse:
      return std::make_unique<SparseDctCodec>(spec->fraction);
  }
  return absl::InternalError("unreachable");
}

std::string EncodeWithFeedback(const Codec& codec, const float* change, size_t n, uint64_t seed,
                               float* residual) {
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) sum[i] = change[i] + residual[i];
  std::string bytes = codec.EncodeSlice(sum.data(), n, seed);
  std::vector<float> sent(n);
  codec
      .DecodeSlice(
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), n,
          sent.data())
      .IgnoreError();  // our own encoding always decodes
  for (size_t i = 0; i < n; ++i) residual[i] = sum[i] - sent[i];
  return bytes;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs >= 0x7F800000) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7C00 | (abs > 0x7F800000 ? 0x200 : 0));
  }
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds past 65504
  if (abs < 0x38800000) {
    // Subnormal half (or zero): value / 2^-24, rounded to nearest even.
    if (abs < 0x33000000) return sign;  // below half of the smallest subnormal
    const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24+
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits.
  const uint32_t rebased = abs - 0x38000000;  // exponent bias 127 -> 15
  const uint32_t q = rebased >> 13;
  const uint32_t rem = rebased & 0x1FFF;
  const uint32_t r = q + ((rem > 0x1000 || (rem == 0x1000 && (q & 1))) ? 1 : 0);
  return static_cast<uint16_t>(sign | r);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    if (sign) f = -f;
    return f;
  }
  uint32_t x;
  if (exp == 31) {
    x = sign | 0x7F800000 | (mant << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (mant << 13);
  }
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  const uint32_t r = x + 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(r >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t x = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace shoal::worker
