// Unit tests of the slice sizing rule (bandwidth-proportional slices,
// issue 49): a round's rates from its reads, shares in proportion to the
// rates with a floor, a member not measured yet at the median, hysteresis,
// and the smoothing across rounds.
#include "services/coordinator/core/slice_sizing.h"

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

double Fraction(const std::vector<uint32_t>& shares, size_t k) {
  const double sum = std::accumulate(shares.begin(), shares.end(), 0.0);
  return shares[k] / sum;
}

// Every reader in `ids` reads `bytes` from every other at `rate[source]`.
std::vector<ReadSample> AllRead(const std::vector<std::string>& ids,
                                const std::vector<double>& rate, uint64_t bytes = 4000) {
  std::vector<ReadSample> reads;
  for (const std::string& reader : ids) {
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] == reader) continue;
      reads.push_back({reader, ids[k], bytes, static_cast<double>(bytes) / rate[k]});
    }
  }
  return reads;
}

TEST(SliceSizingTest, RoundRateIsTheMedianReadRateTimesTheReaders) {
  std::vector<ReadSample> reads = {
      {"a", "c", 1000, 1.0},  // 1000 B/s
      {"b", "c", 1000, 0.5},  // 2000 B/s
      {"d", "c", 1000, 0.1},  // 10000 B/s: one fast reader does not move the median
      {"a", "b", 500, 0.5},
      {"b", "b", 500, 0.001},  // its own: skipped
      {"c", "a", 0, 1.0},      // nothing read: skipped
      {"d", "a", 100, 0},      // no time: skipped
  };
  const auto rates = RoundRates(reads);
  ASSERT_EQ(rates.size(), 2u);
  EXPECT_DOUBLE_EQ(rates.at("c"), 2000.0 * 3);
  EXPECT_DOUBLE_EQ(rates.at("b"), 1000.0);
  EXPECT_FALSE(rates.contains("a"));
}

TEST(SliceSizingTest, SharesFollowTheRates) {
  const std::vector<uint32_t> shares = SizeSlices({100, 300, 600}, {false, false, false}, {});
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_NEAR(Fraction(shares, 0), 0.1, 1e-5);
  EXPECT_NEAR(Fraction(shares, 1), 0.3, 1e-5);
  EXPECT_NEAR(Fraction(shares, 2), 0.6, 1e-5);
}

TEST(SliceSizingTest, NothingMeasuredKeepsTheEvenSlices) {
  EXPECT_EQ(SizeSlices({0, 0, 0}, {false, false, false}, {}), std::vector<uint32_t>(3, 0));
  EXPECT_EQ(SizeSlices({}, {}, {}), std::vector<uint32_t>());
  // Only an outbound-only member measured: no owner is.
  EXPECT_EQ(SizeSlices({0, 5, 0}, {false, true, false}, {}), std::vector<uint32_t>(3, 0));
}

TEST(SliceSizingTest, AMemberNotMeasuredYetCountsAtTheMedian) {
  // Measured 100, 200, 900: median 200 for the newcomer.
  const std::vector<uint32_t> shares =
      SizeSlices({100, 200, 900, 0}, {false, false, false, false}, {});
  EXPECT_NEAR(Fraction(shares, 3), 200.0 / 1400, 1e-5);
  EXPECT_EQ(shares[1], shares[3]);
}

TEST(SliceSizingTest, EveryOwnerKeepsTheMinimumSlice) {
  // 1/(8N) of the model at least: 1/32 with 4 owners; the rest in
  // proportion among the others.
  const std::vector<uint32_t> shares =
      SizeSlices({1, 1000, 1000, 2000}, {false, false, false, false}, {});
  const double floor = 1.0 / 32;
  EXPECT_NEAR(Fraction(shares, 0), floor, 1e-5);
  EXPECT_NEAR(Fraction(shares, 1), (1 - floor) / 4, 1e-5);
  EXPECT_NEAR(Fraction(shares, 3), (1 - floor) / 2, 1e-5);
  // Several below the floor.
  const std::vector<uint32_t> two =
      SizeSlices({1, 2, 1000, 1000}, {false, false, false, false}, {});
  EXPECT_NEAR(Fraction(two, 0), floor, 1e-5);
  EXPECT_NEAR(Fraction(two, 1), floor, 1e-5);
  EXPECT_NEAR(Fraction(two, 2), (1 - 2 * floor) / 2, 1e-5);
  // Every share positive, within bounds, whatever the rates.
  for (const std::vector<double>& rates : std::vector<std::vector<double>>{
           {1e-300, 1e300}, {5, 5, 5, 5, 5, 5, 5, 5}, {1, 1e9, 1, 1e9, 1}}) {
    const std::vector<uint32_t> s = SizeSlices(rates, std::vector<bool>(rates.size(), false), {});
    for (size_t k = 0; k < s.size(); ++k) {
      EXPECT_GT(s[k], 0u);
      EXPECT_GE(Fraction(s, k), 1.0 / (8 * rates.size()) - 1e-5);
      EXPECT_LE(Fraction(s, k), 1.0);
    }
  }
}

TEST(SliceSizingTest, OutboundOnlyMembersOwnNothingAndDoNotCountForTheFloor) {
  const std::vector<uint32_t> shares = SizeSlices({100, 1e9, 300}, {false, true, false}, {});
  EXPECT_EQ(shares[1], 0u);
  EXPECT_NEAR(static_cast<double>(shares[0]) / (shares[0] + shares[2]), 0.25, 1e-5);
}

TEST(SliceSizingTest, SmallChangesKeepTheCurrentShares) {
  const std::vector<uint32_t> current = SizeSlices({100, 300, 600}, {false, false, false}, {});
  // Within 15 % of each fraction: the same shares, bit for bit.
  EXPECT_EQ(SizeSlices({110, 290, 600}, {false, false, false}, current), current);
  // One fraction moved by more: new shares.
  EXPECT_NE(SizeSlices({200, 300, 600}, {false, false, false}, current), current);
  // Near-equal rates keep the even slices (all-zero shares: the list of an
  // equal run, so a homogeneous cluster never resends it).
  EXPECT_EQ(SizeSlices({100, 105, 95}, {false, false, false}, {0, 0, 0}),
            std::vector<uint32_t>(3, 0));
  EXPECT_NE(SizeSlices({100, 100, 10}, {false, false, false}, {0, 0, 0}),
            std::vector<uint32_t>(3, 0));
  // A new member (no current share): decided anew.
  std::vector<uint32_t> with_new = current;
  with_new.push_back(0);
  EXPECT_GT(SizeSlices({100, 300, 600, 0}, std::vector<bool>(4, false), with_new)[3], 0u);
}

TEST(SliceSizingTest, TheSizerSmoothsAndDecidesFromTheRatesItKept) {
  const std::vector<std::string> ids = {"w1", "w2", "w3", "w4"};
  const std::vector<bool> owners(4, false);
  SliceSizer sizer;
  // Before any round: even slices.
  EXPECT_EQ(sizer.Decide(ids, owners), std::vector<uint32_t>(4, 0));
  // w4's uplink is a tenth of the others'.
  sizer.AddRound(AllRead(ids, {1e6, 1e6, 1e6, 1e5}));
  EXPECT_DOUBLE_EQ(sizer.Rate("w4"), 3e5);
  EXPECT_DOUBLE_EQ(sizer.Rate("w1"), 3e6);
  std::vector<uint32_t> shares = sizer.Decide(ids, owners);
  EXPECT_NEAR(Fraction(shares, 3), 1.0 / 31, 1e-5);
  // The same rates again: the same shares (hysteresis, nothing moved).
  sizer.AddRound(AllRead(ids, {1e6, 1e6, 1e6, 1e5}));
  EXPECT_EQ(sizer.Decide(ids, owners), shares);
  // Its link recovers: the smoothed rate moves half way each round.
  sizer.AddRound(AllRead(ids, {1e6, 1e6, 1e6, 1e6}));
  EXPECT_DOUBLE_EQ(sizer.Rate("w4"), 0.5 * 3e6 + 0.5 * 3e5);
  const std::vector<uint32_t> next = sizer.Decide(ids, owners);
  EXPECT_GT(Fraction(next, 3), Fraction(shares, 3));
  // A member that left is forgotten; a new one counts at the median.
  sizer.Forget("w4");
  EXPECT_EQ(sizer.Rate("w4"), 0);
  const std::vector<uint32_t> fresh = sizer.Decide({"w1", "w2", "w3", "w5"}, owners);
  EXPECT_EQ(fresh[3], fresh[0]);
}

}  // namespace
}  // namespace shoal::coordinator
