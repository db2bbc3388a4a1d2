// --data_split (issue 16): the IID split is the one Shoal always had; the
// Dirichlet label-skew split is disjoint, covers every image once, depends on
// the seed alone, and skews more the smaller alpha is.
#include "services/worker/core/data_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace shoal::worker {
namespace {

// 10 labels x 1000 images, interleaved like a real training set.
std::vector<uint8_t> Labels(int per_label = 1000, int num_labels = 10) {
  std::vector<uint8_t> labels(per_label * num_labels);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>(i % num_labels);
  std::mt19937_64 rng(7);
  std::shuffle(labels.begin(), labels.end(), rng);
  return labels;
}

std::vector<std::vector<int64_t>> Split(const std::vector<uint8_t>& labels, uint32_t shards,
                                        double alpha, uint64_t seed) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> s =
      LabelSkewShards(labels, shards, alpha, seed);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : std::vector<std::vector<int64_t>>(shards);
}

TEST(DataSplitTest, IidIsEveryKthImageAsBefore) {
  EXPECT_EQ(IidShardRows(10, 3, 1), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(IidShardRows(10, 3, 0), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(IidShardRows(4, 0, 0), (std::vector<int64_t>{0, 1, 2, 3}));  // 0 shards = 1
  const std::vector<uint8_t> labels = Labels();
  absl::StatusOr<std::vector<int64_t>> rows = ShardRows(DataSplit{}, labels, 4, 2, 1);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, IidShardRows(static_cast<int64_t>(labels.size()), 4, 2));
  // The seed plays no part in the IID shard (the trainer shuffles it).
  EXPECT_EQ(*ShardRows(DataSplit{}, labels, 4, 2, 99), *rows);
}

TEST(DataSplitTest, LabelSkewIsDisjointAndCoversEveryImageOnce) {
  const std::vector<uint8_t> labels = Labels();
  for (double alpha : {0.01, 0.3, 1.0, 100.0}) {
    for (uint32_t shards : {1u, 4u, 7u}) {
      const auto split = Split(labels, shards, alpha, 42);
      ASSERT_EQ(split.size(), shards);
      std::vector<int> seen(labels.size(), 0);
      for (const std::vector<int64_t>& rows : split) {
        EXPECT_FALSE(rows.empty()) << "alpha " << alpha << " shards " << shards;
        EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
        for (int64_t r : rows) {
          ASSERT_GE(r, 0);
          ASSERT_LT(r, static_cast<int64_t>(labels.size()));
          ++seen[r];
        }
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }))
          << "alpha " << alpha << " shards " << shards;
    }
  }
}

TEST(DataSplitTest, LabelSkewIsReproducibleForASeedAndDiffersForAnother) {
  const std::vector<uint8_t> labels = Labels();
  const auto a = Split(labels, 4, 0.3, 1);
  EXPECT_EQ(Split(labels, 4, 0.3, 1), a);
  EXPECT_NE(Split(labels, 4, 0.3, 2), a);
  // A worker computes the whole split and keeps its own part.
  DataSplit split;
  split.label_skew = true;
  split.alpha = 0.3;
  for (uint32_t shard = 0; shard < 4; ++shard) {
    absl::StatusOr<std::vector<int64_t>> rows = ShardRows(split, labels, 4, shard, 1);
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(*rows, a[shard]);
  }
}

// Mean over labels of the largest share of that label any one shard holds:
// 1/K for a perfectly even split, 1 when each label lives on one shard.
double MeanTopShare(const std::vector<uint8_t>& labels,
                    const std::vector<std::vector<int64_t>>& split) {
  double sum = 0;
  int present = 0;
  std::vector<std::vector<uint64_t>> counts;
  for (const auto& rows : split) counts.push_back(LabelCounts(labels, rows));
  for (size_t l = 0; l < 256; ++l) {
    uint64_t total = 0, top = 0;
    for (const auto& c : counts) {
      const uint64_t n = l < c.size() ? c[l] : 0;
      total += n;
      top = std::max(top, n);
    }
    if (total == 0) continue;
    sum += static_cast<double>(top) / static_cast<double>(total);
    ++present;
  }
  return sum / present;
}

TEST(DataSplitTest, SmallAlphaSkewsLargeAlphaIsNearUniform) {
  const std::vector<uint8_t> labels = Labels();
  for (uint64_t seed : {1, 2, 3}) {
    EXPECT_GT(MeanTopShare(labels, Split(labels, 4, 0.05, seed)), 0.85) << seed;
    const double mid = MeanTopShare(labels, Split(labels, 4, 0.3, seed));
    EXPECT_GT(mid, 0.45) << seed;
    EXPECT_LT(mid, 0.95) << seed;
    // alpha = 1000: every shard holds close to a quarter of every label
    // (the Dirichlet's spread is about 0.007 around 0.25).
    const auto even = Split(labels, 4, 1000, seed);
    for (const auto& rows : even) {
      const std::vector<uint64_t> c = LabelCounts(labels, rows);
      ASSERT_EQ(c.size(), 10u);
      for (uint64_t n : c) {
        EXPECT_GT(n, 200u) << seed;
        EXPECT_LT(n, 300u) << seed;
      }
    }
  }
}

TEST(DataSplitTest, RefusesBadInputs) {
  const std::vector<uint8_t> labels = Labels(2, 2);
  EXPECT_EQ(LabelSkewShards(labels, 4, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LabelSkewShards(labels, 4, NAN, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LabelSkewShards(labels, 0, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LabelSkewShards(labels, 5, 1, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // One label of 8 images over 4 shards at alpha 0.001: every draw puts
  // (nearly) all of it on one shard, so no draw fills every shard.
  const absl::Status s = LabelSkewShards(std::vector<uint8_t>(8, 3), 4, 0.001, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("larger alpha"), std::string::npos) << s;
}

TEST(DataSplitTest, GammaAndDirichletSamplersHaveTheRightMoments) {
  std::mt19937_64 rng(5);
  for (double shape : {0.05, 0.3, 1.0, 2.5, 30.0}) {
    double sum = 0;
    const int n = 40000;
    for (int i = 0; i < n; ++i) {
      const double g = SampleGamma(shape, rng);
      ASSERT_TRUE(std::isfinite(g) && g >= 0) << shape;
      sum += g;
    }
    // Mean = shape; the standard error of the mean is sqrt(shape / n).
    EXPECT_NEAR(sum / n, shape, 5 * std::sqrt(shape / n)) << shape;
  }
  for (double alpha : {1e-4, 0.3, 50.0}) {
    const std::vector<double> p = SampleDirichlet(alpha, 6, rng);
    double total = 0;
    for (double x : p) {
      ASSERT_TRUE(std::isfinite(x) && x >= 0) << alpha;
      total += x;
    }
    EXPECT_NEAR(total, 1.0, 1e-12) << alpha;
  }
}

TEST(DataSplitTest, SummaryNamesCountsAndTopLabel) {
  EXPECT_EQ(LabelCountsSummary({10, 0, 30}), "n=40 labels 0:10 1:0 2:30, top label 2 holds 75.0%");
  EXPECT_EQ(LabelCountsSummary({}), "n=0");
}

}  // namespace
}  // namespace shoal::worker
