// The codecs of the encoded exchange (services/worker/core/codec.h): each
// round-trips within its stated error, error feedback conserves what was
// sent plus what was kept, encodings are deterministic, and malformed
// input is refused with INVALID_ARGUMENT and writes nothing.
#include "services/worker/core/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/run_options.h"
#include "services/worker/core/sparse_codec.h"

namespace shoal::worker {
namespace {

std::vector<float> Change(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 0.01f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::unique_ptr<Codec> Make(const std::string& name) {
  auto c = MakeCodec(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

TEST(CodecSpecTest, ParsesAndRefuses) {
  EXPECT_TRUE(ParseCodecSpec("").ok());
  EXPECT_EQ(ParseCodecSpec("topk:0.01")->fraction, 0.01);
  EXPECT_EQ(ParseCodecSpec("randomk:0.5")->kind, CodecSpec::Kind::kRandomK);
  EXPECT_EQ(ParseCodecSpec("sparse:0.06")->kind, CodecSpec::Kind::kSparse);
  EXPECT_EQ(ParseCodecSpec("sparse:0.06")->fraction, 0.06);
  for (const char* bad : {"int4", "topk", "topk:", "topk:0", "topk:1.5", "topk:nan", "randomk:-1",
                          "fp32 ", "sparse", "sparse:", "sparse:0", "sparse:2"}) {
    EXPECT_EQ(ParseCodecSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(*ParseOuterOptimizer("nesterov"), OuterOptimizer::kNesterov);
  EXPECT_FALSE(ParseOuterOptimizer("adam").ok());
  EXPECT_TRUE(ParseDataSplit("label_skew:0.3")->label_skew);
  EXPECT_FALSE(ParseDataSplit("label_skew:0").ok());
  EXPECT_FALSE(ParseDataSplit("noniid").ok());
}

TEST(CodecTest, Fp32IsExact) {
  auto c = Make("fp32");
  const auto x = Change(1000, 1);
  const std::string s = c->EncodeSlice(x.data(), x.size(), 0);
  EXPECT_EQ(s.size(), 4000u);
  std::vector<float> y(x.size());
  ASSERT_TRUE(c->DecodeSlice(Bytes(s), y.size(), y.data()).ok());
  EXPECT_EQ(x, y);
  EXPECT_FALSE(c->lossy());
}

TEST(CodecTest, HalfAndBf16WithinTheirPrecision) {
  for (const char* name : {"fp16", "bf16"}) {
    auto c = Make(name);
    // fp16: 11 significant bits; bf16: 8.
    const float rel = std::string(name) == "fp16" ? 1.0f / 2048 : 1.0f / 256;
    const auto x = Change(5000, 2);
    const std::string s = c->EncodeSlice(x.data(), x.size(), 0);
    EXPECT_EQ(s.size(), 2 * x.size());
    std::vector<float> y(x.size());
    ASSERT_TRUE(c->DecodeSlice(Bytes(s), y.size(), y.data()).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      // fp16 subnormals (below 6.1e-5) have an absolute step of 6e-8.
      EXPECT_LE(std::fabs(x[i] - y[i]), std::fabs(x[i]) * rel + 6e-8f) << name << " " << x[i];
    }
  }
}

TEST(CodecTest, HalfConversionsOfSpecialValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  // Every half round-trips through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // NaNs
    EXPECT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
}

TEST(CodecTest, Int8WithinHalfAStepPerBlock) {
  auto c = Make("int8");
  const auto x = Change(1000, 3);  // 3 full blocks and a short one
  const std::string s = c->EncodeSlice(x.data(), x.size(), 0);
  EXPECT_EQ(s.size(), 1000u + 4 * 4);
  EXPECT_LE(static_cast<double>(s.size()) / (4.0 * x.size()), 0.26);
  std::vector<float> y(x.size());
  ASSERT_TRUE(c->DecodeSlice(Bytes(s), y.size(), y.data()).ok());
  for (size_t b = 0; b < x.size(); b += kInt8Block) {
    float max_abs = 0;
    for (size_t i = b; i < std::min(x.size(), b + kInt8Block); ++i) {
      max_abs = std::max(max_abs, std::fabs(x[i]));
    }
    for (size_t i = b; i < std::min(x.size(), b + kInt8Block); ++i) {
      EXPECT_LE(std::fabs(x[i] - y[i]), max_abs / 127 / 2 * 1.001f) << i;
    }
  }
}

TEST(CodecTest, TopKKeepsTheLargestExactly) {
  auto c = Make("topk:0.01");
  auto x = Change(10000, 4);
  const std::string s = c->EncodeSlice(x.data(), x.size(), 0);
  EXPECT_LE(static_cast<double>(s.size()) / (4.0 * x.size()), 0.03);
  std::vector<float> y(x.size());
  ASSERT_TRUE(c->DecodeSlice(Bytes(s), y.size(), y.data()).ok());
  std::vector<float> mags;
  for (float v : x) mags.push_back(std::fabs(v));
  std::sort(mags.rbegin(), mags.rend());
  const float threshold = mags[99];
  size_t kept = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] != 0) {
      ++kept;
      EXPECT_EQ(y[i], x[i]);
      EXPECT_GE(std::fabs(x[i]), threshold);
    }
  }
  EXPECT_EQ(kept, 100u);
}

TEST(CodecTest, RandomKPicksTheSameElementsForTheSameSeed) {
  auto c = Make("randomk:0.1");
  const auto a = Change(1000, 5);
  const auto b = Change(1000, 6);
  std::vector<float> ya(1000), yb(1000), yc(1000);
  ASSERT_TRUE(c->DecodeSlice(Bytes(c->EncodeSlice(a.data(), 1000, 42)), 1000, ya.data()).ok());
  ASSERT_TRUE(c->DecodeSlice(Bytes(c->EncodeSlice(b.data(), 1000, 42)), 1000, yb.data()).ok());
  ASSERT_TRUE(c->DecodeSlice(Bytes(c->EncodeSlice(a.data(), 1000, 43)), 1000, yc.data()).ok());
  size_t same = 0, differ = 0, kept = 0;
  for (size_t i = 0; i < 1000; ++i) {
    if (ya[i] != 0) ++kept;
    if ((ya[i] != 0) == (yb[i] != 0)) ++same;
    if ((ya[i] != 0) != (yc[i] != 0)) ++differ;
    if (ya[i] != 0) {
      EXPECT_EQ(ya[i], a[i]);
    }
  }
  EXPECT_EQ(kept, 100u);
  EXPECT_EQ(same, 1000u);
  EXPECT_GT(differ, 0u);
}

TEST(CodecTest, EncodingIsDeterministic) {
  for (const char* name : {"fp16", "bf16", "int8", "topk:0.05", "randomk:0.05", "sparse:0.06"}) {
    auto c = Make(name);
    const auto x = Change(3000, 7);
    EXPECT_EQ(c->EncodeSlice(x.data(), x.size(), 9), c->EncodeSlice(x.data(), x.size(), 9)) << name;
    // The owner's round trip is what everyone decodes from its bytes.
    std::vector<float> mine = x;
    c->RoundTripAverage(mine.data(), mine.size());
    std::vector<float> theirs(x.size());
    ASSERT_TRUE(
        c->DecodeSlice(Bytes(c->EncodeSlice(x.data(), x.size(), 0)), x.size(), theirs.data()).ok());
    EXPECT_EQ(0, std::memcmp(mine.data(), theirs.data(), 4 * x.size())) << name;
  }
}

TEST(CodecTest, ErrorFeedbackConservesSentPlusKept) {
  for (const char* name : {"fp32", "fp16", "int8", "topk:0.01", "randomk:0.02", "sparse:0.06"}) {
    auto c = Make(name);
    const size_t n = 2000;
    std::vector<float> residual(n, 0.0f);
    std::vector<double> total_change(n, 0.0), total_sent(n, 0.0);
    for (int round = 0; round < 20; ++round) {
      const auto change = Change(n, 100 + round);
      const std::string s = EncodeWithFeedback(*c, change.data(), n, round, residual.data());
      std::vector<float> sent(n);
      ASSERT_TRUE(c->DecodeSlice(Bytes(s), n, sent.data()).ok());
      for (size_t i = 0; i < n; ++i) {
        total_change[i] += change[i];
        total_sent[i] += sent[i];
      }
    }
    for (size_t i = 0; i < n; ++i) {
      // What was sent plus what is kept is what changed (float rounding only).
      EXPECT_NEAR(total_sent[i] + residual[i], total_change[i], 1e-5) << name << " " << i;
    }
  }
}

TEST(CodecTest, MalformedInputIsRefusedAndNothingWritten) {
  const size_t n = 300;
  const auto x = Change(n, 8);
  auto refused = [&](const Codec& c, const std::string& bytes) {
    std::vector<float> out(n, 7.0f);
    absl::Status s = c.DecodeSlice(Bytes(bytes), n, out.data());
    for (float v : out) EXPECT_EQ(v, 7.0f) << c.name() << ": written on error";
    return s.code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  for (const char* name :
       {"fp32", "fp16", "bf16", "int8", "topk:0.1", "randomk:0.1", "sparse:0.1"}) {
    auto c = Make(name);
    const std::string good = c->EncodeSlice(x.data(), n, 1);
    EXPECT_EQ(refused(*c, good.substr(0, good.size() - 1)), kInvalid) << name;
    EXPECT_EQ(refused(*c, good + "x"), kInvalid) << name;
    EXPECT_EQ(refused(*c, ""), kInvalid) << name;
  }
  auto int8 = Make("int8");
  std::string bad = int8->EncodeSlice(x.data(), n, 0);
  for (float scale :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1.0f}) {
    std::string b = bad;
    std::memcpy(b.data() + 4 + kInt8Block, &scale, 4);  // the second block's scale
    EXPECT_EQ(refused(*int8, b), kInvalid) << scale;
  }
  auto topk = Make("topk:0.1");  // k = 30
  std::string sparse = topk->EncodeSlice(x.data(), n, 0);
  {
    std::string b = sparse;
    b[0] = 31;  // a count that does not match
    EXPECT_EQ(refused(*topk, b), kInvalid);
  }
  {
    // First index out of range: varint 300 = 0xAC 0x02 (one byte more).
    std::string b = sparse.substr(0, 4) + "\xAC\x02" + sparse.substr(5);
    EXPECT_EQ(refused(*topk, b), kInvalid);
  }
  {
    // A varint longer than 32 bits.
    std::string b = sparse.substr(0, 4) + std::string(5, '\xFF') + "\x01" + sparse.substr(5);
    EXPECT_EQ(refused(*topk, b), kInvalid);
  }
  {
    // A NaN value.
    std::string b = sparse;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(b.data() + b.size() - 4, &nan, 4);
    EXPECT_EQ(refused(*topk, b), kInvalid);
  }
}

// ---- sparse:F (services/worker/core/sparse_codec.h).

// A deterministic input of kSparseChunk-element rows that are smooth, as a
// round's change of a layer over image pixels is: a few cosines per row
// plus a little noise (splitmix, not <random>'s distributions, whose
// numbers differ between standard libraries).
std::vector<float> SmoothChange(size_t n, uint64_t seed) {
  uint64_t state = seed;
  auto uniform = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) / 9007199254740992.0 - 0.5;
  };
  std::vector<float> v(n);
  for (size_t b = 0; b < n; b += kSparseChunk) {
    const double a1 = uniform(), a2 = uniform(), f1 = 1 + 8 * (uniform() + 0.5),
                 f2 = 10 + 30 * (uniform() + 0.5);
    for (size_t i = b; i < std::min(n, b + kSparseChunk); ++i) {
      const double t = static_cast<double>(i - b) / kSparseChunk;
      v[i] = static_cast<float>(0.01 * (a1 * std::cos(3.14159265 * f1 * t) +
                                        a2 * std::sin(3.14159265 * f2 * t) + 0.05 * uniform()));
    }
  }
  return v;
}

TEST(SparseCodecTest, DctIsOrthonormalAndMatchesTheDefinition) {
  const size_t c = kSparseChunk;
  std::vector<float> x(c);
  for (size_t i = 0; i < c; ++i) x[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  std::vector<float> y = x;
  SparseDct(y.data(), false);
  double ex = 0, ey = 0;
  for (size_t k = 0; k < c; ++k) {
    double ref = 0;
    for (size_t i = 0; i < c; ++i) {
      ref += x[i] * std::cos(M_PI * static_cast<double>((2 * i + 1) * k) / (2.0 * c));
    }
    ref *= std::sqrt((k == 0 ? 1.0 : 2.0) / c);
    EXPECT_NEAR(y[k], ref, 2e-5) << k;
    ex += x[k] * static_cast<double>(x[k]);
    ey += y[k] * static_cast<double>(y[k]);
  }
  EXPECT_NEAR(ey, ex, 1e-4 * ex);
  SparseDct(y.data(), true);
  for (size_t i = 0; i < c; ++i) EXPECT_NEAR(y[i], x[i], 2e-6) << i;
}

TEST(SparseCodecTest, TheSameBitsOnEveryMachine) {
  // A fixed input's coefficients and the decoded bytes of its encoding,
  // hashed: a compiler, flag or library that changes one bit of the DCT
  // or the coder (and so would split workers) fails here.
  const auto x = SmoothChange(3 * kSparseChunk + 100, 42);
  std::vector<float> y(x.begin(), x.begin() + kSparseChunk);
  SparseDct(y.data(), false);
  auto c = Make("sparse:0.06");
  const std::string s = c->EncodeSlice(x.data(), x.size(), 0);
  std::vector<float> d(x.size());
  ASSERT_TRUE(c->DecodeSlice(Bytes(s), d.size(), d.data()).ok());
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&h](const void* p, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) {
      h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
    }
  };
  mix(y.data(), 4 * y.size());
  mix(s.data(), s.size());
  mix(d.data(), 4 * d.size());
  // Measured on x86-64 (gcc 12, -O2); a change of the encoding on purpose
  // updates them.
  EXPECT_EQ(s.size(), 84u);
  EXPECT_EQ(h, 2463311419129735687ull);
}

TEST(SparseCodecTest, SendsLittleAndKeepsWhatMatters) {
  auto c = Make("sparse:0.06");
  const size_t n = 40 * kSparseChunk + 300;  // and a tail chunk
  const auto x = SmoothChange(n, 1);
  const std::string s = c->EncodeSlice(x.data(), n, 0);
  // Smooth rows: well under a 75th of fp32.
  EXPECT_LE(static_cast<double>(s.size()) / (4.0 * n), 0.0133);
  EXPECT_LE(s.size(), c->MaxEncodedBytes(n));
  std::vector<float> y(n);
  ASSERT_TRUE(c->DecodeSlice(Bytes(s), n, y.data()).ok());
  double err = 0, total = 0;
  for (size_t i = 0; i < n; ++i) {
    err += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
    total += x[i] * static_cast<double>(x[i]);
  }
  // 6% of the coefficients at 2 bits hold most of a smooth change (on real
  // changes of the MLP the error is about 0.4 of the change too).
  EXPECT_LT(err, 0.5 * total);
}

TEST(SparseCodecTest, ErrorFeedbackDeliversARepeatedChange) {
  // The same change every round: what was sent catches up with it, and
  // the residual stays bounded.
  auto c = Make("sparse:0.05");
  const size_t n = 4 * kSparseChunk;
  const auto change = SmoothChange(n, 3);
  std::vector<float> residual(n, 0.0f);
  std::vector<double> sent_total(n, 0.0);
  const int rounds = 60;
  for (int r = 0; r < rounds; ++r) {
    const std::string s = EncodeWithFeedback(*c, change.data(), n, r, residual.data());
    std::vector<float> sent(n);
    ASSERT_TRUE(c->DecodeSlice(Bytes(s), n, sent.data()).ok());
    for (size_t i = 0; i < n; ++i) sent_total[i] += sent[i];
  }
  double err = 0, total = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = rounds * static_cast<double>(change[i]);
    err += (sent_total[i] - want) * (sent_total[i] - want);
    total += want * want;
  }
  EXPECT_LT(err, 0.01 * total);
}

TEST(SparseCodecTest, EveryEncodingStaysWithinItsBound) {
  // Inputs that make the coder pay most: random positions, ties, zeros,
  // spikes, tiny slices and every short tail.
  for (const char* name : {"sparse:0.001", "sparse:0.06", "sparse:0.5", "sparse:1"}) {
    auto c = Make(name);
    std::vector<std::vector<float>> inputs;
    for (size_t n : {0, 1, 2, 7, 511, 512, 513, 1500, 5000}) {
      inputs.push_back(Change(n, static_cast<uint32_t>(n)));
      inputs.push_back(std::vector<float>(n, 0.0f));
      inputs.push_back(std::vector<float>(n, 1.0f));
      std::vector<float> spikes(n, 0.0f);
      for (size_t i = 0; i < n; i += 3) spikes[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i);
      inputs.push_back(spikes);
    }
    std::vector<float> odd(2000, 0.0f);
    odd[5] = std::numeric_limits<float>::infinity();
    odd[6] = std::numeric_limits<float>::quiet_NaN();
    odd[7] = std::numeric_limits<float>::max();
    odd[8] = -std::numeric_limits<float>::max();
    inputs.push_back(odd);
    for (const auto& x : inputs) {
      const std::string s = c->EncodeSlice(x.data(), x.size(), 0);
      EXPECT_LE(s.size(), c->MaxEncodedBytes(x.size())) << name << " n=" << x.size();
      std::vector<float> y(x.size());
      const absl::Status st = c->DecodeSlice(Bytes(s), y.size(), y.data());
      ASSERT_TRUE(st.ok()) << name << " n=" << x.size() << ": " << st;
      for (float v : y) EXPECT_TRUE(std::isfinite(v));
    }
  }
}

TEST(SparseCodecTest, MalformedInputIsRefusedAndNothingWritten) {
  auto c = Make("sparse:0.06");
  const size_t n = 3 * kSparseChunk + 17;
  const auto x = SmoothChange(n, 5);
  const std::string good = c->EncodeSlice(x.data(), n, 0);
  auto refused = [&](const std::string& bytes) {
    std::vector<float> out(n, 7.0f);
    absl::Status s = c->DecodeSlice(Bytes(bytes), n, out.data());
    for (float v : out) EXPECT_EQ(v, 7.0f) << "written on error";
    return s.code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  std::vector<float> decoded(n);
  ASSERT_TRUE(c->DecodeSlice(Bytes(good), n, decoded.data()).ok());
  for (float g : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                  -1.0f, std::numeric_limits<float>::max()}) {
    // NaN, inf and negative are refused as such; FLT_MAX decodes to inf.
    std::string b = good;
    std::memcpy(b.data(), &g, 4);
    EXPECT_EQ(refused(b), kInvalid) << g;
  }
  {
    std::string b = good;
    b[4] = 1;  // the coder's first byte is always 0
    EXPECT_EQ(refused(b), kInvalid);
  }
  EXPECT_EQ(refused(good.substr(0, 8)), kInvalid);
  EXPECT_EQ(refused(good + std::string(c->MaxEncodedBytes(n), '\0')), kInvalid);
  // Any bytes: refused (INVALID_ARGUMENT, nothing written) or decoded to
  // finite values.
  uint64_t state = 9;
  for (int t = 0; t < 2000; ++t) {
    std::string b = good;
    const size_t flips = 1 + t % 4;
    for (size_t f = 0; f < flips; ++f) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b[4 + (state >> 33) % (b.size() - 4)] ^= static_cast<char>(1 + (state >> 20) % 255);
    }
    std::vector<float> out(n, 7.0f);
    const absl::Status s = c->DecodeSlice(Bytes(b), n, out.data());
    if (s.ok()) {
      for (float v : out) EXPECT_TRUE(std::isfinite(v));
    } else {
      EXPECT_EQ(s.code(), kInvalid);
      for (float v : out) EXPECT_EQ(v, 7.0f);
    }
  }
}

}  // namespace
}  // namespace shoal::worker
