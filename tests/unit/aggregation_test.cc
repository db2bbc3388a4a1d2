// The owner's aggregation rules (services/worker/core/aggregation.h) with
// hand-computed values: mean, trimmed mean, median; the fall-back to the
// median when a round has too few contributions; non-finite values; and
// independence from the order of the inputs, bit for bit. Also the
// --aggregation parser (common/run_options.h).
#include "services/worker/core/aggregation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/run_options.h"

namespace shoal::worker {
namespace {

using Kind = AggregationSpec::Kind;

const AggregationSpec kMean{Kind::kMean, 0};
const AggregationSpec kMedian{Kind::kMedian, 0};
AggregationSpec Trimmed(uint32_t k) { return {Kind::kTrimmedMean, k}; }

// Combines columns: values[k] is contribution k (all of the same length).
std::vector<float> Combine(const AggregationSpec& spec,
                           const std::vector<std::vector<float>>& values,
                           AggregationSpec* applied = nullptr) {
  std::vector<const float*> inputs;
  for (const auto& v : values) inputs.push_back(v.data());
  std::vector<float> out(values.empty() ? 0 : values[0].size(), -12345.0f);
  absl::StatusOr<AggregationSpec> r = CombineContributions(spec, inputs, out.size(), out.data());
  EXPECT_TRUE(r.ok()) << r.status();
  if (applied != nullptr && r.ok()) *applied = *r;
  return out;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(AggregationSpecTest, ParsesAndRefuses) {
  EXPECT_EQ(ParseAggregation("")->kind, Kind::kMean);
  EXPECT_EQ(ParseAggregation("mean")->kind, Kind::kMean);
  EXPECT_EQ(ParseAggregation("median")->kind, Kind::kMedian);
  EXPECT_EQ(ParseAggregation("trimmed_mean:1")->kind, Kind::kTrimmedMean);
  EXPECT_EQ(ParseAggregation("trimmed_mean:3")->trim, 3u);
  for (const char* bad :
       {"trimmed_mean", "trimmed_mean:", "trimmed_mean:0", "trimmed_mean:-1", "trimmed_mean:1.5",
        "trimmed_mean:x", "trimmed_mean:1001", "Median", "mean ", "krum"}) {
    EXPECT_EQ(ParseAggregation(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(AggregationName(*ParseAggregation("trimmed_mean:2")), "trimmed_mean:2");
  EXPECT_EQ(AggregationName(*ParseAggregation("")), "mean");
  EXPECT_EQ(MinContributions(Trimmed(2)), 5u);
  EXPECT_EQ(MinContributions(kMedian), 1u);
}

TEST(AggregationTest, MeanAveragesInInputOrder) {
  const auto out = Combine(kMean, {{1, 2, -3}, {3, 4, 3}, {5, 9, 0}, {7, 1, 4}});
  EXPECT_EQ(out, (std::vector<float>{4, 4, 1}));
}

TEST(AggregationTest, TrimmedMeanDropsTheKLowestAndHighestPerElement) {
  // Element 0: 1 2 3 4 100 -> drop 1 and 100 -> (2 + 3 + 4) / 3 = 3.
  // Element 1: -50 -1 0 1 2 -> drop -50 and 2 -> 0.
  // Element 2: 10 10 10 10 10 -> 10.
  // Element 3: 0.5 1.5 2.5 -7 8 -> drop -7 and 8 -> 1.5.
  const std::vector<std::vector<float>> in = {
      {100, -1, 10, 2.5f}, {2, 2, 10, -7}, {3, -50, 10, 0.5f}, {1, 1, 10, 8}, {4, 0, 10, 1.5f}};
  AggregationSpec applied;
  const auto out = Combine(Trimmed(1), in, &applied);
  EXPECT_EQ(out, (std::vector<float>{3, 0, 10, 1.5f}));
  EXPECT_EQ(applied.kind, Kind::kTrimmedMean);
  // K = 2 of 5 keeps the middle value only.
  EXPECT_EQ(Combine(Trimmed(2), in), (std::vector<float>{3, 0, 10, 1.5f}));
  // K = 1 of 6: drop -1000 and 5, (1 + 2 + 3 + 4) / 4; then drop 1 and 1000.
  EXPECT_EQ(Combine(Trimmed(1), {{1}, {2}, {3}, {4}, {5}, {-1000}}), (std::vector<float>{2.5f}));
  EXPECT_EQ(Combine(Trimmed(1), {{1}, {2}, {3}, {4}, {5}, {1000}}), (std::vector<float>{3.5f}));
}

TEST(AggregationTest, MedianIsTheMiddleOrTheMeanOfTheTwoMiddleValues) {
  EXPECT_EQ(Combine(kMedian, {{5, -1}, {1, 7}, {3, 0}}), (std::vector<float>{3, 0}));
  // Even N: (2 + 3) / 2 and (-1 + 0) / 2.
  EXPECT_EQ(Combine(kMedian, {{1, -1}, {3, 0}, {2, -4}, {1000, 9}}),
            (std::vector<float>{2.5f, -0.5f}));
  EXPECT_EQ(Combine(kMedian, {{7}}), (std::vector<float>{7}));
  // An odd median is one of the values, bit for bit (no arithmetic).
  const float third = 1.0f / 3.0f;
  EXPECT_EQ(Bits(Combine(kMedian, {{third}, {-2}, {9}})[0]), Bits(third));
}

TEST(AggregationTest, TooFewContributionsFallBackToTheMedian) {
  // trimmed_mean:2 needs 5; with 4 the owner takes the median.
  AggregationSpec applied;
  const auto out = Combine(Trimmed(2), {{1}, {3}, {2}, {1000}}, &applied);
  EXPECT_EQ(applied.kind, Kind::kMedian);
  EXPECT_EQ(out, (std::vector<float>{2.5f}));
  EXPECT_EQ(EffectiveAggregation(Trimmed(2), 5).kind, Kind::kTrimmedMean);
  EXPECT_EQ(EffectiveAggregation(Trimmed(2), 4).kind, Kind::kMedian);
  EXPECT_EQ(EffectiveAggregation(Trimmed(1), 2).kind, Kind::kMedian);
  // One contribution: itself, whatever the rule.
  EXPECT_EQ(Combine(Trimmed(3), {{4, -2}}), (std::vector<float>{4, -2}));
  EXPECT_EQ(EffectiveAggregation(kMean, 1).kind, Kind::kMean);
}

TEST(AggregationTest, RefusesNoInputs) {
  float out = 0;
  EXPECT_EQ(CombineContributions(kMedian, {}, 1, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
  const float* missing[2] = {&out, nullptr};
  EXPECT_EQ(CombineContributions(kMedian, missing, 1, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AggregationTest, NonFiniteValuesAreExtremesTheTrimDrops) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // One NaN, one +inf, one -inf among 5: trimmed_mean:1 drops one at each end.
  // Element 0: NaN sorts above everything: drop NaN and 1 -> (2 + 3 + 4) / 3.
  // Element 1: -inf and +inf are the ends: (1 + 2 + 3) / 3.
  const std::vector<std::vector<float>> in = {{nan, -inf}, {1, 1}, {2, 2}, {3, 3}, {4, inf}};
  EXPECT_EQ(Combine(Trimmed(1), in), (std::vector<float>{3, 2}));
  EXPECT_EQ(Combine(kMedian, in), (std::vector<float>{3, 2}));
  // Two NaNs on top are more than K = 1 can drop: the result is not finite.
  EXPECT_TRUE(std::isnan(Combine(Trimmed(1), {{nan}, {nan}, {1}, {2}, {3}})[0]));
  // ... and the median still holds with 2 of 5 bad values.
  EXPECT_EQ(Combine(kMedian, {{nan}, {inf}, {1}, {2}, {3}}), (std::vector<float>{3}));
  // A NaN with its sign bit set sorts below -inf.
  EXPECT_EQ(Combine(Trimmed(1), {{-nan}, {5}, {6}, {7}, {inf}}), (std::vector<float>{6}));
  // The mean propagates them, as it always did.
  EXPECT_TRUE(std::isnan(Combine(kMean, in)[0]));
}

TEST(AggregationTest, ResultDoesNotDependOnInputOrderBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0, 1);
  const size_t n = 7, count = 4096;
  std::vector<std::vector<float>> in(n, std::vector<float>(count));
  for (auto& v : in) {
    for (float& x : v) x = dist(rng) * 1e-3f;
  }
  in[2][5] = -0.0f;  // signed zeros order deterministically too
  in[4][5] = 0.0f;
  for (const AggregationSpec& spec : {Trimmed(1), Trimmed(2), Trimmed(3), kMedian}) {
    const auto reference = Combine(spec, in);
    std::vector<size_t> order(n);
    for (size_t k = 0; k < n; ++k) order[k] = k;
    for (int trial = 0; trial < 20; ++trial) {
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<std::vector<float>> shuffled;
      for (size_t k : order) shuffled.push_back(in[k]);
      const auto out = Combine(spec, shuffled);
      ASSERT_EQ(out.size(), reference.size());
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(Bits(out[i]), Bits(reference[i])) << AggregationName(spec) << " element " << i;
      }
    }
  }
}

TEST(AggregationTest, OutputMayBeOneOfTheInputs) {
  std::vector<std::vector<float>> in = {{9, 1}, {1, 2}, {2, 3}, {3, 4}, {-9, 5}};
  const auto expected = Combine(Trimmed(1), in);
  std::vector<const float*> inputs;
  for (const auto& v : in) inputs.push_back(v.data());
  ASSERT_TRUE(CombineContributions(Trimmed(1), inputs, 2, in[0].data()).ok());
  EXPECT_EQ(in[0], expected);
}

TEST(AggregationTest, ScaledPoisonIsTrimmedAwayAndWrecksTheMean) {
  // Four honest contributions near w, one 1000 w.
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0, 0.1f);
  const size_t count = 1000;
  std::vector<float> w(count);
  for (float& x : w) x = dist(rng);
  std::vector<std::vector<float>> in;
  for (int k = 0; k < 4; ++k) {
    std::vector<float> v = w;
    for (float& x : v) x += dist(rng) * 0.01f;
    in.push_back(v);
  }
  std::vector<float> poison = w;
  for (float& x : poison) x *= 1000;
  in.push_back(poison);
  double err_trimmed = 0, err_mean = 0, norm = 0;
  const auto trimmed = Combine(Trimmed(1), in);
  const auto mean = Combine(kMean, in);
  for (size_t i = 0; i < count; ++i) {
    err_trimmed += (trimmed[i] - w[i]) * (trimmed[i] - w[i]);
    err_mean += (mean[i] - w[i]) * (mean[i] - w[i]);
    norm += w[i] * w[i];
  }
  EXPECT_LT(err_trimmed / norm, 1e-3);
  EXPECT_GT(err_mean / norm, 1e4);
}

// CombineWeighted: input k stands for weights[k] equal values.
std::vector<float> CombineW(const AggregationSpec& spec, const std::vector<std::vector<float>>& in,
                            const std::vector<uint32_t>& weights,
                            AggregationSpec* applied = nullptr) {
  std::vector<const float*> inputs;
  for (const auto& v : in) inputs.push_back(v.data());
  std::vector<float> out(in[0].size());
  absl::StatusOr<AggregationSpec> r =
      CombineWeighted(spec, inputs, weights, out.size(), out.data());
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok() && applied != nullptr) *applied = *r;
  return out;
}

// The same values repeated `weights` times, combined unweighted.
std::vector<float> Expanded(const AggregationSpec& spec, const std::vector<std::vector<float>>& in,
                            const std::vector<uint32_t>& weights) {
  std::vector<std::vector<float>> copies;
  for (size_t k = 0; k < in.size(); ++k) {
    for (uint32_t c = 0; c < weights[k]; ++c) copies.push_back(in[k]);
  }
  return Combine(spec, copies);
}

TEST(AggregationWeightedTest, UnitWeightsGiveTheUnweightedBits) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0, 1);
  std::vector<std::vector<float>> in(5, std::vector<float>(257));
  for (auto& v : in) {
    for (float& x : v) x = dist(rng);
  }
  const std::vector<uint32_t> ones(5, 1);
  for (const AggregationSpec& spec : {kMean, Trimmed(1), Trimmed(2), kMedian}) {
    EXPECT_EQ(CombineW(spec, in, ones), Combine(spec, in)) << AggregationName(spec);
  }
}

TEST(AggregationWeightedTest, EachInputCountsItsWeight) {
  std::mt19937 rng(10);
  std::normal_distribution<float> dist(0, 1);
  std::vector<std::vector<float>> in(3, std::vector<float>(129));
  for (auto& v : in) {
    for (float& x : v) x = dist(rng);
  }
  const std::vector<uint32_t> weights = {3, 1, 2};
  for (const AggregationSpec& spec : {kMean, Trimmed(1), Trimmed(2), kMedian}) {
    const std::vector<float> got = CombineW(spec, in, weights);
    const std::vector<float> want = Expanded(spec, in, weights);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i])))
          << AggregationName(spec) << " element " << i;
    }
  }
}

TEST(AggregationWeightedTest, AZoneOfThreeOutweighsALoneExtremeValue) {
  // A zone's result (weight 3) against a lone poisoner (weight 1) under
  // trimmed_mean:1: the poisoner's unit is trimmed, the zone's value is kept.
  const std::vector<std::vector<float>> in = {{1.0f}, {1000.0f}, {2.0f}};
  const std::vector<uint32_t> weights = {3, 1, 3};
  EXPECT_EQ(CombineW(Trimmed(1), in, weights), std::vector<float>{(2 * 1.0f + 3 * 2.0f) / 5});
  // The weighted median of {1 x3, 2 x3, 1000}: the fourth unit of seven.
  EXPECT_EQ(CombineW(kMedian, in, weights), std::vector<float>{2.0f});
  // The mean counts every unit.
  EXPECT_EQ(CombineW(kMean, in, weights), std::vector<float>{(3.0f + 1000.0f + 6.0f) / 7});
}

TEST(AggregationWeightedTest, TooLittleWeightFallsBackToTheMedianOfTheUnits) {
  const std::vector<std::vector<float>> in = {{1.0f}, {5.0f}};
  AggregationSpec applied;
  // trimmed_mean:2 needs 5 units; 2 + 1 = 3 is too few: the median unit.
  EXPECT_EQ(CombineW(Trimmed(2), in, {2, 1}, &applied), std::vector<float>{1.0f});
  EXPECT_EQ(applied.kind, AggregationSpec::Kind::kMedian);
  // With 3 + 2 = 5 units it runs as asked: the middle unit is kept.
  EXPECT_EQ(CombineW(Trimmed(2), in, {3, 2}, &applied), std::vector<float>{1.0f});
  EXPECT_EQ(applied.kind, AggregationSpec::Kind::kTrimmedMean);
}

TEST(AggregationWeightedTest, RefusesZeroWeightsAndMismatchedSizes) {
  std::vector<float> a = {1}, b = {2};
  std::vector<const float*> inputs = {a.data(), b.data()};
  float out = 0;
  const std::vector<uint32_t> zero = {1, 0};
  const std::vector<uint32_t> one = {1};
  EXPECT_EQ(CombineWeighted(kMean, inputs, zero, 1, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CombineWeighted(kMean, inputs, one, 1, &out).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::worker
