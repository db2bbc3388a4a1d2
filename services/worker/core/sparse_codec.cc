#include "services/worker/core/sparse_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shoal::worker {
namespace {

constexpr size_t kN = kSparseChunk;
static_assert(kN >= 4 && (kN & (kN - 1)) == 0, "the FFT needs a power of two");

// 2^(-j/8), j = 0..7, rounded to float once and written out exactly.
constexpr float kEighthOctave[8] = {0x1.000000p+0f, 0x1.d5818ep-1f, 0x1.ae89fap-1f, 0x1.8ace54p-1f,
                                    0x1.6a09e6p-1f, 0x1.4bfdaep-1f, 0x1.306fe0p-1f, 0x1.172b84p-1f};
// A chunk's scale is about this many times the mean |kept coefficient|, so
// the two magnitudes s / 2 and s sit at 0.85 and 1.7 times the mean (1.3,
// 1.5 and 2 gave a larger error on real changes).
constexpr float kScaleOverMean = 1.7f;
// Inputs are clamped to +-2^100: coefficients stay below 2^105 and what
// decodes from them below 2^120, far from float's 2^128.
constexpr float kMaxInput = 0x1p100f;

// ---- The DCT: Makhoul's N-point FFT form of the DCT-II, in float.

// Taylor series in double: the same operations in the same order on every
// machine (no libm, whose last bit may differ).
double CosSeries(double x) {
  double term = 1, sum = 1;
  for (int i = 1; i < 30; ++i) {
    term = -term * x * x / static_cast<double>((2 * i - 1) * (2 * i));
    sum += term;
  }
  return sum;
}
double SinSeries(double x) {
  double term = x, sum = x;
  for (int i = 1; i < 30; ++i) {
    term = -term * x * x / static_cast<double>((2 * i) * (2 * i + 1));
    sum += term;
  }
  return sum;
}

struct DctTables {
  float quarter[kN + 1];  // cos(pi m / 2N), m = 0..N
  float wr[kN / 2];       // FFT twiddles: exp(-2 pi i j / N)
  float wi[kN / 2];
  float scale[kN];    // the orthonormal s_k: sqrt(1/N), then sqrt(2/N)
  float unscale[kN];  // 1 / s_k
  uint32_t reversed[kN];
};

DctTables MakeTables() {
  DctTables t;
  constexpr double kPi = 3.14159265358979323846;
  for (size_t m = 0; m <= kN; ++m) {
    // Arguments up to pi/4, where the series converge fastest.
    const double v = 2 * m <= kN ? CosSeries(kPi * static_cast<double>(m) / (2.0 * kN))
                                 : SinSeries(kPi * static_cast<double>(kN - m) / (2.0 * kN));
    t.quarter[m] = static_cast<float>(v);
  }
  // cos(pi m / 2N) for any m >= 0.
  auto cosine = [&t](size_t m) {
    m %= 4 * kN;
    if (m > 2 * kN) m = 4 * kN - m;
    return m > kN ? -t.quarter[2 * kN - m] : t.quarter[m];
  };
  for (size_t j = 0; j < kN / 2; ++j) {
    t.wr[j] = cosine(4 * j);                 // cos(2 pi j / N)
    t.wi[j] = -cosine(4 * kN + kN - 4 * j);  // -sin(2 pi j / N)
  }
  for (size_t k = 0; k < kN; ++k) {
    // sqrt is correctly rounded (IEEE 754): the same bits everywhere.
    const float ratio = static_cast<float>(k == 0 ? kN : kN / 2);
    t.scale[k] = std::sqrt(1.0f / ratio);
    t.unscale[k] = std::sqrt(ratio);
  }
  for (size_t i = 0; i < kN; ++i) {
    uint32_t r = 0;
    for (size_t bit = 1, j = i; bit < kN; bit <<= 1, j >>= 1) r = (r << 1) | (j & 1);
    t.reversed[i] = r;
  }
  return t;
}

const DctTables& Tables() {
  static const DctTables t = MakeTables();
  return t;
}

// In-place radix-2 FFT of kN complex values (`inverse`: conjugate twiddles,
// no 1/N).
void Fft(const DctTables& t, float* re, float* im, bool inverse) {
  for (size_t i = 0; i < kN; ++i) {
    if (t.reversed[i] > i) {
      std::swap(re[i], re[t.reversed[i]]);
      std::swap(im[i], im[t.reversed[i]]);
    }
  }
  for (size_t len = 2; len <= kN; len <<= 1) {
    const size_t half = len / 2, step = kN / len;
    for (size_t i = 0; i < kN; i += len) {
      for (size_t j = 0; j < half; ++j) {
        const float wr = t.wr[j * step];
        const float wi = inverse ? -t.wi[j * step] : t.wi[j * step];
        const float xr = re[i + j + half], xi = im[i + j + half];
        const float tr = xr * wr - xi * wi, ti = xr * wi + xi * wr;
        const float ur = re[i + j], ui = im[i + j];
        re[i + j] = ur + tr;
        im[i + j] = ui + ti;
        re[i + j + half] = ur - tr;
        im[i + j + half] = ui - ti;
      }
    }
  }
}

// ---- The range coder.

// LZMA's binary range coder with the probability of a 0 (15 bits) from
// the counts of 0s and 1s seen in the bit's context (Krichevsky-Trofimov):
// integer arithmetic only.
constexpr int kProbBits = 15;
constexpr uint32_t kTop = 1u << 24;

struct BitModel {
  uint32_t zeros = 0, ones = 0;
  uint32_t P0() const {
    const uint64_t p =
        ((uint64_t{2} * zeros + 1) << kProbBits) / (uint64_t{2} * (zeros + ones) + 2);
    return static_cast<uint32_t>(std::clamp<uint64_t>(p, 1, (1u << kProbBits) - 1));
  }
  void Update(uint32_t bit) {
    (bit ? ones : zeros) += 1;
    if (zeros + ones > (1u << 16)) {  // keep the counts bounded
      zeros = (zeros + 1) / 2;
      ones = (ones + 1) / 2;
    }
  }
};

class RangeEncoder {
 public:
  explicit RangeEncoder(std::string* out) : out_(out) {}
  // A bit whose probability of being 0 is p0 / 2^kProbBits.
  void Encode(uint32_t p0, uint32_t bit) {
    const uint32_t bound = (range_ >> kProbBits) * p0;
    if (bit == 0) {
      range_ = bound;
    } else {
      low_ += bound;
      range_ -= bound;
    }
    Normalize();
  }
  void Bit(BitModel* m, uint32_t bit) {
    Encode(m->P0(), bit);
    m->Update(bit);
  }
  // A bit at probability 1/2.
  void Direct(uint32_t bit) {
    range_ >>= 1;
    if (bit) low_ += range_;
    Normalize();
  }
  void Finish() {
    for (int i = 0; i < 5; ++i) ShiftLow();
  }

 private:
  void Normalize() {
    while (range_ < kTop) {
      range_ <<= 8;
      ShiftLow();
    }
  }
  void ShiftLow() {
    if (static_cast<uint32_t>(low_) < 0xFF000000u || (low_ >> 32) != 0) {
      const uint8_t carry = static_cast<uint8_t>(low_ >> 32);
      uint8_t byte = cache_;
      do {
        out_->push_back(static_cast<char>(static_cast<uint8_t>(byte + carry)));
        byte = 0xFF;
      } while (--pending_ != 0);
      cache_ = static_cast<uint8_t>(low_ >> 24);
    }
    ++pending_;
    low_ = (low_ & 0x00FFFFFFu) << 8;
  }

  std::string* out_;
  uint64_t low_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
  uint8_t cache_ = 0;
  uint64_t pending_ = 1;
};

class RangeDecoder {
 public:
  RangeDecoder(const uint8_t* p, size_t size) : p_(p), size_(size) {
    first_ = Next();
    for (int i = 0; i < 4; ++i) code_ = (code_ << 8) | Next();
  }
  uint32_t Decode(uint32_t p0) {
    const uint32_t bound = (range_ >> kProbBits) * p0;
    uint32_t bit = 0;
    if (code_ < bound) {
      range_ = bound;
    } else {
      code_ -= bound;
      range_ -= bound;
      bit = 1;
    }
    Normalize();
    return bit;
  }
  uint32_t Bit(BitModel* m) {
    const uint32_t bit = Decode(m->P0());
    m->Update(bit);
    return bit;
  }
  uint32_t Direct() {
    range_ >>= 1;
    uint32_t bit = 0;
    if (code_ >= range_) {
      code_ -= range_;
      bit = 1;
    }
    Normalize();
    return bit;
  }
  // The encoder's first byte is always 0; a whole encoding is read to its
  // last byte and not past it.
  bool Complete() const { return first_ == 0 && pos_ == size_ && !overrun_; }

 private:
  void Normalize() {
    while (range_ < kTop) {
      range_ <<= 8;
      code_ = (code_ << 8) | Next();
    }
  }
  uint32_t Next() {
    if (pos_ >= size_) {
      overrun_ = true;
      return 0;
    }
    return p_[pos_++];
  }

  const uint8_t* p_;
  const size_t size_;
  size_t pos_ = 0;
  bool overrun_ = false;
  uint32_t first_ = 0;
  uint32_t code_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
};

// Whether a coefficient is kept: counts per frequency, with the estimate
// from every frequency as a prior worth kPrior bits, so that a frequency
// seen a few times (a small slice, the first chunks) starts from the
// slice's density instead of 1/2 (3% fewer bytes on the MLP's slices; 1,
// 2, 8 and 16 did no better).
constexpr uint32_t kPrior = 4;
struct SupportModel {
  BitModel frequency[kN + 1];  // the tail chunk's: kN
  BitModel all;
  uint32_t P0(size_t f) const {
    const BitModel& m = frequency[f];
    const uint64_t p = ((uint64_t{m.zeros} << kProbBits) + uint64_t{kPrior} * all.P0()) /
                       (uint64_t{m.zeros} + m.ones + kPrior);
    return static_cast<uint32_t>(std::clamp<uint64_t>(p, 1, (1u << kProbBits) - 1));
  }
  void Update(size_t f, uint32_t bit) {
    frequency[f].Update(bit);
    all.Update(bit);
  }
};

// The adaptive contexts, the same on both sides.
struct Models {
  SupportModel support;
  BitModel scale[256];  // bit tree of the 8-bit scale code
  BitModel magnitude;
};
constexpr size_t kContexts = kN + 2 + 256 + 1;

float ScaleOf(float g, uint32_t code) {
  if (code == 0) return 0.0f;
  const uint32_t d = 255 - code;
  return std::ldexp(g * kEighthOctave[d & 7], -static_cast<int>(d >> 3));
}

// The code whose scale is nearest to `target` (0 <= target <= g).
uint32_t CodeFor(float g, float target) {
  if (!(target > 0.0f)) return 0;
  uint32_t lo = 1, hi = 255;  // scales grow with the code
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (ScaleOf(g, mid) >= target) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (lo > 1 && target - ScaleOf(g, lo - 1) < ScaleOf(g, lo) - target) --lo;
  return lo;
}

absl::Span<const uint8_t> AsBytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

}  // namespace

void SparseDct(float* x, bool inverse) {
  const DctTables& t = Tables();
  float re[kN], im[kN];
  if (!inverse) {
    // v = (x0, x2, x4, ..., x5, x3, x1); X_k = s_k Re(exp(-i pi k / 2N) FFT(v)_k).
    for (size_t n = 0; n < kN / 2; ++n) {
      re[n] = x[2 * n];
      re[kN - 1 - n] = x[2 * n + 1];
    }
    std::fill(im, im + kN, 0.0f);
    Fft(t, re, im, false);
    for (size_t k = 0; k < kN; ++k) {
      x[k] = t.scale[k] * (t.quarter[k] * re[k] + t.quarter[kN - k] * im[k]);
    }
    return;
  }
  // V_k = exp(i pi k / 2N) (Z_k - i Z_{N-k}) with Z = X / s (Z_N = 0),
  // v = IFFT(V), and x takes v's even and reversed odd halves.
  for (size_t k = 0; k < kN; ++k) {
    const float z = x[k] * t.unscale[k];
    const float zr = k == 0 ? 0.0f : x[kN - k] * t.unscale[kN - k];
    const float c = t.quarter[k], s = t.quarter[kN - k];
    re[k] = c * z + s * zr;
    im[k] = s * z - c * zr;
  }
  Fft(t, re, im, true);
  constexpr float kInvN = 1.0f / static_cast<float>(kN);  // a power of two: exact
  for (size_t n = 0; n < kN / 2; ++n) {
    x[2 * n] = re[n] * kInvN;
    x[2 * n + 1] = re[kN - 1 - n] * kInvN;
  }
}

SparseDctCodec::SparseDctCodec(double fraction)
    : fraction_(fraction), name_(absl::StrCat("sparse:", fraction)) {}

size_t SparseDctCodec::KeptOf(size_t n) const {
  if (n == 0) return 0;
  const long long k = std::llround(fraction_ * static_cast<double>(n));
  return std::clamp<size_t>(k < 1 ? 1 : static_cast<size_t>(k), 1, n);
}

size_t SparseDctCodec::EncodedBytes(size_t n) const { return 9 + (KeptOf(n) * 6 + 7) / 8; }

size_t SparseDctCodec::MaxEncodedBytes(size_t n) const {
  // Adaptive bits: the support (at most n), the scale codes (8 per chunk)
  // and the magnitudes (k). Against the best fixed probability of each
  // context, the counts (with the prior of at least 4 x 2^-15 for either
  // value) cost at most about log2(2^13) + 4.5 log2(T) + 2 < 100 bits more
  // for T <= 2^17 bits, and the coder's rounding at most 1/64 of a bit per
  // bit; a context's best fixed probability costs at most its T bits. The
  // signs are 1 bit each; the stream adds its 5 bytes, the header 4.
  const size_t k = KeptOf(n);
  const size_t adaptive = n + 8 * ((n + kN - 1) / kN) + k;
  const size_t bits = adaptive + adaptive / 64 + 100 * std::min(adaptive, kContexts) + k + 64;
  return 4 + 5 + (bits + 7) / 8;
}

void SparseDctCodec::Encode(const float* src, size_t n, uint8_t* out) const {
  const std::string s = EncodeSlice(src, n, 0);
  std::memcpy(out, s.data(), std::min(s.size(), EncodedBytes(n)));
}

absl::Status SparseDctCodec::AccumulateContribution(const ChunkView&, float*) const {
  return absl::FailedPreconditionError(
      absl::StrCat("codec ", name(), " travels encoded (ReadEncoded), not as raw chunks"));
}

absl::Status SparseDctCodec::ApplyAverage(const ChunkView&, float*) const {
  return absl::FailedPreconditionError(
      absl::StrCat("codec ", name(), " travels encoded (ReadEncoded), not as raw chunks"));
}

void SparseDctCodec::RoundTripAverage(float* slice, size_t n) const {
  const std::string s = EncodeSlice(slice, n, 0);
  DecodeSlice(AsBytes(s), n, slice).IgnoreError();  // our own encoding always decodes
}

std::string SparseDctCodec::EncodeSlice(const float* src, size_t n, uint64_t) const {
  const size_t full_end = n / kN * kN;
  // Non-finite inputs count as 0 and larger ones as +-kMaxInput (error
  // feedback keeps the rest): then no coefficient, scale or decoded value
  // can overflow, and our own encoding always decodes.
  std::vector<float> x(src, src + n);
  for (float& v : x) v = std::isfinite(v) ? std::clamp(v, -kMaxInput, kMaxInput) : 0.0f;
  for (size_t b = 0; b < full_end; b += kN) SparseDct(x.data() + b, false);
  float g = 0.0f;
  for (float v : x) g = std::max(g, std::fabs(v));
  const size_t k = KeptOf(n);
  std::vector<uint32_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = static_cast<uint32_t>(i);
  // Largest magnitude first, ties to the lower index: deterministic.
  auto larger = [&x](uint32_t a, uint32_t b) {
    const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
    return fa != fb ? fa > fb : a < b;
  };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(), larger);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());

  std::string out;
  out.reserve(2 * EncodedBytes(n));
  uint32_t gb;
  std::memcpy(&gb, &g, 4);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(gb >> (8 * i)));
  RangeEncoder enc(&out);
  auto models = std::make_unique<Models>();
  for (size_t i = 0, j = 0; i < n && j < k && n - i > k - j; ++i) {
    const uint32_t kept = idx[j] == i ? 1 : 0;
    const size_t f = i < full_end ? i % kN : kN;
    enc.Encode(models->support.P0(f), kept);
    models->support.Update(f, kept);
    j += kept;
  }
  std::vector<float> scale(k);
  for (size_t j = 0; j < k;) {
    const size_t chunk = idx[j] / kN;
    size_t end = j;
    float sum = 0.0f;
    for (; end < k && idx[end] / kN == chunk; ++end) sum += std::fabs(x[idx[end]]);
    const float mean = sum / static_cast<float>(end - j);
    const uint32_t code = CodeFor(g, std::min(g, kScaleOverMean * mean));
    for (uint32_t node = 1, bit = 8; bit-- > 0;) {
      const uint32_t b = (code >> bit) & 1u;
      enc.Bit(&models->scale[node], b);
      node = 2 * node + b;
    }
    for (; j < end; ++j) scale[j] = ScaleOf(g, code);
  }
  for (size_t j = 0; j < k; ++j) {
    const float v = x[idx[j]];
    // The nearer of s / 2 and s.
    const uint32_t m = std::fabs(v) > 0.75f * scale[j] ? 1 : 0;
    enc.Direct(v < 0.0f ? 1 : 0);
    enc.Bit(&models->magnitude, m);
  }
  enc.Finish();
  return out;
}

absl::Status SparseDctCodec::DecodeSlice(absl::Span<const uint8_t> b, size_t n, float* out) const {
  if (b.size() < 9 || b.size() > MaxEncodedBytes(n)) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " slice of ", n, " elements has ",
                                                   b.size(), " bytes, expected 9 to ",
                                                   MaxEncodedBytes(n)));
  }
  float g;
  std::memcpy(&g, b.data(), 4);  // little-endian hosts only, like fp32's bytes
  if (!std::isfinite(g) || !(g >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": largest coefficient ", g, " (must be finite and >= 0)"));
  }
  const size_t full_end = n / kN * kN;
  const size_t k = KeptOf(n);
  RangeDecoder dec(b.data() + 4, b.size() - 4);
  auto models = std::make_unique<Models>();
  std::vector<uint32_t> idx;
  idx.reserve(k);
  for (size_t i = 0; i < n && idx.size() < k; ++i) {
    if (n - i == k - idx.size()) {
      idx.push_back(static_cast<uint32_t>(i));
      continue;
    }
    const size_t f = i < full_end ? i % kN : kN;
    const uint32_t kept = dec.Decode(models->support.P0(f));
    models->support.Update(f, kept);
    if (kept) idx.push_back(static_cast<uint32_t>(i));
  }
  std::vector<float> scale(k);
  for (size_t j = 0; j < k;) {
    const size_t chunk = idx[j] / kN;
    uint32_t node = 1;
    for (int bit = 0; bit < 8; ++bit) node = 2 * node + dec.Bit(&models->scale[node]);
    const float s = ScaleOf(g, node - 256);
    for (; j < k && idx[j] / kN == chunk; ++j) scale[j] = s;
  }
  std::vector<float> x(n, 0.0f);
  for (size_t j = 0; j < k; ++j) {
    const uint32_t negative = dec.Direct();
    // s / 2 or s: a power-of-two factor, exact.
    const float mag = dec.Bit(&models->magnitude) ? scale[j] : scale[j] * 0.5f;
    x[idx[j]] = negative ? -mag : mag;
  }
  if (!dec.Complete()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), ": ", b.size(), " bytes are not one whole encoding of ", n, " elements"));
  }
  for (size_t base = 0; base < full_end; base += kN) SparseDct(x.data() + base, true);
  for (float v : x) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(name(), ": decodes to a non-finite value"));
    }
  }
  if (n > 0) std::memcpy(out, x.data(), n * sizeof(float));
  return absl::OkStatus();
}

}  // namespace shoal::worker
