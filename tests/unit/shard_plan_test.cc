// Unit tests of the shard planner: one contiguous, balanced slice per
// participant covering the flat parameter vector exactly.
#include "common/shard_plan.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace shoal {
namespace {

// Checks the documented invariants of a plan of `total` over `n`.
void ExpectValidPlan(const std::vector<SliceRange>& slices, uint64_t total, size_t n) {
  SCOPED_TRACE(::testing::Message() << "T=" << total << " N=" << n);
  ASSERT_EQ(slices.size(), n);
  uint64_t next = 0;
  uint64_t smallest = std::numeric_limits<uint64_t>::max();
  uint64_t largest = 0;
  for (const SliceRange& s : slices) {
    EXPECT_EQ(s.begin, next);
    ASSERT_LE(s.begin, s.end);
    smallest = std::min(smallest, s.end - s.begin);
    largest = std::max(largest, s.end - s.begin);
    next = s.end;
  }
  EXPECT_EQ(slices.front().begin, 0u);
  EXPECT_EQ(next, total);
  EXPECT_LE(largest - smallest, 1u);
}

TEST(ShardPlannerTest, CoversRangeExactlyAndBalanced) {
  for (uint64_t total :
       {0ull, 1ull, 2ull, 3ull, 7ull, 10ull, 100ull, 1000ull, 1001ull, 12345ull, 101770ull}) {
    for (size_t n : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 10u, 16u, 33u}) {
      const std::vector<SliceRange> slices = PlanSlices(total, n);
      ExpectValidPlan(slices, total, n);
      // The documented formula: slice k = [floor(k*T/N), floor((k+1)*T/N)).
      for (size_t k = 0; k < n; ++k) {
        EXPECT_EQ(slices[k].begin, k * total / n);
        EXPECT_EQ(slices[k].end, (k + 1) * total / n);
      }
    }
  }
}

TEST(ShardPlannerTest, SingleParticipantOwnsEverything) {
  const std::vector<SliceRange> slices = PlanSlices(101770, 1);
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0].begin, 0u);
  EXPECT_EQ(slices[0].end, 101770u);
}

TEST(ShardPlannerTest, KnownSplit) {
  const std::vector<SliceRange> slices = PlanSlices(10, 3);
  ASSERT_EQ(slices.size(), 3u);
  EXPECT_EQ(slices[0].begin, 0u);
  EXPECT_EQ(slices[0].end, 3u);
  EXPECT_EQ(slices[1].begin, 3u);
  EXPECT_EQ(slices[1].end, 6u);
  EXPECT_EQ(slices[2].begin, 6u);
  EXPECT_EQ(slices[2].end, 10u);
}

TEST(ShardPlannerTest, FewerElementsThanParticipantsLeavesSomeSlicesEmpty) {
  const std::vector<SliceRange> slices = PlanSlices(3, 5);
  ExpectValidPlan(slices, 3, 5);
  int non_empty = 0;
  for (const SliceRange& s : slices) {
    EXPECT_LE(s.end - s.begin, 1u);
    non_empty += s.end > s.begin;
  }
  EXPECT_EQ(non_empty, 3);

  const std::vector<SliceRange> none = PlanSlices(0, 4);
  ExpectValidPlan(none, 0, 4);
  for (const SliceRange& s : none) EXPECT_EQ(s.begin, s.end);
}

TEST(ShardPlannerTest, LargeTotalsDoNotOverflow) {
  const uint64_t trillion = 1'000'000'000'000ull;
  std::vector<SliceRange> slices = PlanSlices(trillion, 7);
  ExpectValidPlan(slices, trillion, 7);
  EXPECT_EQ(slices[1].begin, 142'857'142'857ull);  // floor(1e12 / 7)
  EXPECT_EQ(slices[6].begin, 857'142'857'142ull);  // floor(6e12 / 7)

  // k * T needs more than 64 bits here.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  slices = PlanSlices(max, 7);
  ExpectValidPlan(slices, max, 7);
  for (size_t k = 0; k < 7; ++k) {
    EXPECT_EQ(slices[k].begin, static_cast<uint64_t>(static_cast<unsigned __int128>(max) * k / 7));
  }
  slices = PlanSlices(max - 3, 1000);
  ExpectValidPlan(slices, max - 3, 1000);
}

TEST(ShardPlannerTest, OutboundOnlyParticipantsOwnEmptySlicesInOrder) {
  const std::vector<SliceRange> s = PlanSlicesAmong(10, {false, true, false, true});
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].begin, 0u);
  EXPECT_EQ(s[0].end, 5u);
  EXPECT_EQ(s[1].begin, 5u);  // empty, where the next owner begins
  EXPECT_EQ(s[1].end, 5u);
  EXPECT_EQ(s[2].begin, 5u);
  EXPECT_EQ(s[2].end, 10u);
  EXPECT_EQ(s[3].begin, 10u);  // after the last owner: at T
  EXPECT_EQ(s[3].end, 10u);
  // Without outbound-only participants it is PlanSlices.
  const std::vector<SliceRange> flat = PlanSlicesAmong(1001, {false, false, false});
  const std::vector<SliceRange> ref = PlanSlices(1001, 3);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(flat[k].begin, ref[k].begin);
    EXPECT_EQ(flat[k].end, ref[k].end);
  }
  for (const SliceRange& r : PlanSlicesAmong(7, {true, true})) EXPECT_EQ(r.begin, r.end);
}

TEST(ShardPlannerTest, FragmentsCoverTheModelRoundByRound) {
  // K = 4 over 10 elements: [0, 2), [2, 5), [5, 7), [7, 10), round r
  // takes fragment r mod 4.
  const std::vector<SliceRange> ref = PlanSlices(10, 4);
  std::vector<int> covered(10, 0);
  for (uint64_t round = 1; round <= 8; ++round) {
    const SliceRange f = FragmentOf(10, 4, round);
    EXPECT_EQ(f.begin, ref[round % 4].begin) << round;
    EXPECT_EQ(f.end, ref[round % 4].end) << round;
    for (uint64_t i = f.begin; i < f.end; ++i) ++covered[i];
  }
  // Two turns: every element twice.
  EXPECT_EQ(covered, std::vector<int>(10, 2));
  // No fragments: the whole model every round.
  for (uint32_t k : {0u, 1u}) {
    const SliceRange f = FragmentOf(10, k, 7);
    EXPECT_EQ(f.begin, 0u);
    EXPECT_EQ(f.end, 10u);
  }
  // Huge models do not overflow.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  const SliceRange last = FragmentOf(max, 7, 6);
  EXPECT_EQ(last.end, max);
}

TEST(ShardPlannerTest, SlicesAmongTheParticipantsInsideAFragment) {
  const std::vector<SliceRange> s = PlanSlicesAmong(SliceRange{100, 110}, {false, true, false});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].begin, 100u);
  EXPECT_EQ(s[0].end, 105u);
  EXPECT_EQ(s[1].begin, 105u);  // behind NAT: empty, where the next owner begins
  EXPECT_EQ(s[1].end, 105u);
  EXPECT_EQ(s[2].begin, 105u);
  EXPECT_EQ(s[2].end, 110u);
}

// ---- Bandwidth-proportional slices (PlanSlicesWeighted).

TEST(ShardPlannerTest, EqualOrNoSharesGiveTheEvenFormulaExactly) {
  for (uint64_t total : {0ull, 1ull, 7ull, 1001ull, 101770ull}) {
    for (size_t n : {1u, 2u, 3u, 4u, 7u, 16u}) {
      for (const std::vector<bool>& outbound :
           {std::vector<bool>(n, false), [&] {
              std::vector<bool> o(n, false);
              o[0] = true;
              return o;
            }()}) {
        const SliceRange range{5, 5 + total};
        const std::vector<SliceRange> even = PlanSlicesAmong(range, outbound);
        for (const std::vector<uint32_t>& shares :
             {std::vector<uint32_t>(), std::vector<uint32_t>(n, 0u),
              std::vector<uint32_t>(n, 1u), std::vector<uint32_t>(n, 12345u)}) {
          const std::vector<SliceRange> w = PlanSlicesWeighted(range, outbound, shares);
          ASSERT_EQ(w.size(), even.size());
          for (size_t k = 0; k < n; ++k) {
            EXPECT_EQ(w[k].begin, even[k].begin) << "T=" << total << " N=" << n << " k=" << k;
            EXPECT_EQ(w[k].end, even[k].end) << "T=" << total << " N=" << n << " k=" << k;
          }
        }
      }
    }
  }
}

TEST(ShardPlannerTest, WeightedSlicesFollowThePrefixSums) {
  // Shares 1, 3, 6 of 10 over [100, 1100): 100, 300, 600 elements.
  const std::vector<SliceRange> s =
      PlanSlicesWeighted({100, 1100}, {false, false, false}, {1, 3, 6});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].begin, 100u);
  EXPECT_EQ(s[0].end, 200u);
  EXPECT_EQ(s[1].begin, 200u);
  EXPECT_EQ(s[1].end, 500u);
  EXPECT_EQ(s[2].begin, 500u);
  EXPECT_EQ(s[2].end, 1100u);
  // The documented formula with floors: T = 10, shares 1, 2, 4.
  const std::vector<SliceRange> f = PlanSlicesWeighted({0, 10}, {false, false, false}, {1, 2, 4});
  EXPECT_EQ(f[0].end, 10u * 1 / 7);
  EXPECT_EQ(f[1].end, 10u * 3 / 7);
  EXPECT_EQ(f[2].end, 10u);
}

TEST(ShardPlannerTest, WeightedSlicesCoverTheRangeAndSkipOutboundOnly) {
  const std::vector<uint32_t> shares = {50, 7, 999, 1, 400};
  const std::vector<bool> outbound = {false, true, false, false, true};
  for (uint64_t total : {0ull, 3ull, 1000ull, 123457ull}) {
    const std::vector<SliceRange> s = PlanSlicesWeighted({0, total}, outbound, shares);
    uint64_t next = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      EXPECT_EQ(s[k].begin, next);
      ASSERT_LE(s[k].begin, s[k].end);
      if (outbound[k]) {
        EXPECT_EQ(s[k].begin, s[k].end);
      }
      next = s[k].end;
    }
    EXPECT_EQ(next, total);
  }
  // The owners' slices are those of the owners' shares alone.
  const std::vector<SliceRange> s = PlanSlicesWeighted({0, 1050}, outbound, shares);
  const std::vector<SliceRange> owners =
      PlanSlicesWeighted({0, 1050}, {false, false, false}, {50, 999, 1});
  EXPECT_EQ(s[0].end - s[0].begin, owners[0].end - owners[0].begin);
  EXPECT_EQ(s[2].end - s[2].begin, owners[1].end - owners[1].begin);
  EXPECT_EQ(s[3].end - s[3].begin, owners[2].end - owners[2].begin);
  EXPECT_EQ(s[4].begin, 1050u);  // no owner after it: at the range's end
}

TEST(ShardPlannerTest, HugeModelsDoNotOverflow) {
  const uint64_t total = std::numeric_limits<uint64_t>::max() / 2;
  const uint32_t big = std::numeric_limits<uint32_t>::max();
  const std::vector<SliceRange> s = PlanSlicesWeighted({0, total}, {false, false}, {big, big});
  EXPECT_EQ(s[0].end, total / 2);
  EXPECT_EQ(s[1].end, total);
}

}  // namespace
}  // namespace shoal
