// The sample ledger (services/coordinator/core/sample_ledger.h) and the
// epoch order the workers compute (services/worker/core/sample_order.h).
#include "services/coordinator/core/sample_ledger.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/core/sample_order.h"

namespace shoal {
namespace {

using coordinator::SampleLedger;
using ::testing::HasSubstr;

uint64_t Count(const std::vector<v1::SampleRange>& ranges) {
  uint64_t n = 0;
  for (const auto& r : ranges) n += r.count();
  return n;
}

TEST(SampleLedgerTest, HandsOutFreshRangesAcrossEpochsUpToTheLimit) {
  SampleLedger ledger(/*per_round=*/40, /*epochs=*/2);
  ASSERT_TRUE(ledger.CheckDataset(100).ok());
  std::vector<v1::SampleRange> a = ledger.Assign("w1");
  std::vector<v1::SampleRange> b = ledger.Assign("w2");
  std::vector<v1::SampleRange> c = ledger.Assign("w3");  // 80..100 of epoch 0, 0..20 of 1
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(worker::FormatRanges(c), "e0:[80,100) e1:[0,20)");
  for (const char* w : {"w1", "w2", "w3"}) ledger.Trained(w);
  EXPECT_EQ(ledger.epochs_done(), 1u);
  EXPECT_EQ(ledger.Status().samples_trained(), 120u);
  // The rest of epoch 1, then nothing: the limit is 2 epochs.
  EXPECT_EQ(Count(ledger.Assign("w1")), 40u);
  EXPECT_EQ(Count(ledger.Assign("w2")), 40u);
  EXPECT_TRUE(ledger.Assign("w3").empty());
  ledger.Trained("w1");
  ledger.Trained("w2");
  EXPECT_TRUE(ledger.Finished());
  // Both epochs are done: no per-epoch count is left to keep.
  EXPECT_EQ(ledger.Status().trained_from_epoch(), 2u);
  EXPECT_EQ(ledger.Status().trained_per_epoch_size(), 0);
}

// The durable ledger is written into the run record every round: it keeps
// counts only for the epochs still open, however long the run (a soak's
// record grew by one count per epoch, 5 copies of 300 epochs: 4.5 KB a
// round into etcd's in-memory raft log).
TEST(SampleLedgerTest, TheDurableLedgerStaysSmallOverManyEpochs) {
  SampleLedger ledger(/*per_round=*/30, /*epochs=*/0);
  ASSERT_TRUE(ledger.CheckDataset(100).ok());
  size_t largest = 0;
  for (int round = 0; round < 2000; ++round) {  // 3 workers x 30: ~1,800 epochs
    for (const char* w : {"a", "b", "c"}) ledger.Assign(w);
    ledger.Lost("c");  // some of every round comes back through the pool
    ledger.Trained("a");
    ledger.Trained("b");
    largest = std::max(largest, ledger.Durable().ByteSizeLong());
  }
  const v1::SampleLedger d = ledger.Durable();
  EXPECT_GT(d.epochs_done(), 1000u);
  EXPECT_LE(d.trained_per_epoch_size(), 3);
  EXPECT_GE(d.trained_from_epoch(), d.epochs_done());
  EXPECT_LT(largest, 200u);
}

// A ledger saved before trained_from_epoch existed counts every epoch from
// 0: it resumes, drops the finished epochs' counts and goes on counting.
TEST(SampleLedgerTest, ALedgerThatListsEveryEpochResumesAndIsTrimmed) {
  v1::SampleLedger old;
  old.set_dataset_samples(50);
  old.set_epoch(3);
  old.set_offset(20);
  old.set_epochs_done(3);
  old.set_samples_trained(170);
  for (int e = 0; e < 3; ++e) old.add_trained_per_epoch(50);
  old.add_trained_per_epoch(20);
  SampleLedger ledger(30, 4);
  ledger.Resume(old);
  v1::SampleLedger d = ledger.Durable();
  EXPECT_EQ(d.trained_from_epoch(), 3u);
  ASSERT_EQ(d.trained_per_epoch_size(), 1);
  EXPECT_EQ(d.trained_per_epoch(0), 20u);
  EXPECT_EQ(worker::FormatRanges(ledger.Assign("w1")), "e3:[20,50)");
  ledger.Trained("w1");
  EXPECT_TRUE(ledger.Finished());
  EXPECT_EQ(ledger.Durable().trained_from_epoch(), 4u);
  // And the trimmed form resumes to the same ledger.
  SampleLedger again(30, 4);
  again.Resume(ledger.Durable());
  EXPECT_EQ(again.Durable().SerializeAsString(), ledger.Durable().SerializeAsString());
  EXPECT_TRUE(again.Finished());
}

TEST(SampleLedgerTest, LostWorkGoesBackToThePoolAndIsTrainedOnceAgain) {
  SampleLedger ledger(30, 1);
  ASSERT_TRUE(ledger.CheckDataset(90).ok());
  const auto a = ledger.Assign("w1");  // e0 [0,30)
  ledger.Assign("w2");                 // e0 [30,60)
  ledger.Lost("w1");                   // killed
  ledger.Trained("w2");
  v1::SampleLedger s = ledger.Status();
  EXPECT_EQ(s.samples_lost(), 30u);
  ASSERT_EQ(s.pool_size(), 1);
  EXPECT_EQ(worker::FormatRanges({s.pool(0)}), "e0:[0,30)");
  // The pool first: w3 gets what w1 lost; w2 the fresh rest.
  EXPECT_EQ(worker::FormatRanges(ledger.Assign("w3")), "e0:[0,30)");
  EXPECT_EQ(worker::FormatRanges(ledger.Assign("w2")), "e0:[60,90)");
  ledger.Trained("w3");
  ledger.Trained("w2");
  s = ledger.Status();
  EXPECT_EQ(s.samples_trained(), 90u);
  EXPECT_EQ(s.samples_redone(), 30u);
  EXPECT_EQ(s.epochs_done(), 1u);
  EXPECT_TRUE(ledger.Finished());
}

TEST(SampleLedgerTest, APoolRangeLargerThanARoundIsSplit) {
  SampleLedger big(25, 0);
  ASSERT_TRUE(big.CheckDataset(1000).ok());
  big.Assign("w1");
  big.Lost("w1");  // e0 [0,25) in the pool
  EXPECT_EQ(worker::FormatRanges(big.Assign("w9")), "e0:[0,25)");
  v1::SampleLedger saved = big.Durable();  // in flight: back in the pool
  ASSERT_EQ(saved.pool_size(), 1);
  SampleLedger resumed(10, 0);
  resumed.Resume(saved);
  EXPECT_EQ(worker::FormatRanges(resumed.Assign("w1")), "e0:[0,10)");
  EXPECT_EQ(worker::FormatRanges(resumed.Assign("w2")), "e0:[10,20)");
  EXPECT_EQ(worker::FormatRanges(resumed.Assign("w3")), "e0:[20,25) e0:[25,30)");
}

TEST(SampleLedgerTest, DatasetsMustMatchAndBeDeclared) {
  SampleLedger ledger(10, 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(ledger.CheckDataset(0)));
  EXPECT_THAT(std::string(ledger.CheckDataset(0).message()), HasSubstr("cannot follow"));
  ASSERT_TRUE(ledger.CheckDataset(60000).ok());
  const absl::Status other = ledger.CheckDataset(50000);
  EXPECT_TRUE(absl::IsFailedPrecondition(other));
  EXPECT_THAT(std::string(other.message()), HasSubstr("50000 samples, the run's has 60000"));
}

// Random churn: whatever is lost, every position of every epoch ends up
// trained exactly once.
TEST(SampleLedgerTest, ChurnTrainsEverySampleExactlyOncePerEpoch) {
  constexpr uint64_t kN = 997;
  SampleLedger ledger(64, 3);
  ASSERT_TRUE(ledger.CheckDataset(kN).ok());
  std::map<uint64_t, std::vector<int>> seen;  // epoch -> count per position
  std::mt19937_64 rng(7);
  int rounds = 0;
  while (!ledger.Finished() && rounds < 10000) {
    ++rounds;
    std::map<std::string, std::vector<v1::SampleRange>> held;
    for (const char* w : {"a", "b", "c", "d"}) held[w] = ledger.Assign(w);
    for (auto& [w, ranges] : held) {
      if (rng() % 5 == 0) {
        ledger.Lost(w);
        continue;
      }
      ledger.Trained(w);
      for (const auto& r : ranges) {
        auto& counts = seen[r.epoch()];
        counts.resize(kN, 0);
        for (uint64_t p = r.begin(); p < r.begin() + r.count(); ++p) ++counts[p];
      }
    }
  }
  ASSERT_TRUE(ledger.Finished()) << rounds;
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& [epoch, counts] : seen) {
    for (uint64_t p = 0; p < kN; ++p) EXPECT_EQ(counts[p], 1) << "epoch " << epoch << " " << p;
  }
  EXPECT_GT(ledger.Status().samples_redone(), 0u);
}

TEST(SampleOrderTest, PermutationsAreFixedByTheSeedAndDifferPerEpoch) {
  const std::vector<int64_t> a = worker::EpochPermutation(42, 0, 1000);
  EXPECT_EQ(a, worker::EpochPermutation(42, 0, 1000));
  EXPECT_NE(a, worker::EpochPermutation(42, 1, 1000));
  EXPECT_NE(a, worker::EpochPermutation(43, 0, 1000));
  std::set<int64_t> all(a.begin(), a.end());
  EXPECT_EQ(all.size(), 1000u);
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 999);
  // Pinned: the order must not change between builds (an auditor replays
  // another worker's samples).
  EXPECT_THAT(worker::EpochPermutation(1, 0, 8), ::testing::ElementsAre(2, 3, 7, 0, 6, 1, 5, 4));
  worker::SampleOrder order(42, 1000);
  v1::SampleRange r;
  r.set_epoch(1);
  r.set_begin(10);
  r.set_count(5);
  absl::StatusOr<std::vector<int64_t>> rows = order.Rows({r});
  ASSERT_TRUE(rows.ok());
  const std::vector<int64_t> e1 = worker::EpochPermutation(42, 1, 1000);
  EXPECT_EQ(*rows, std::vector<int64_t>(e1.begin() + 10, e1.begin() + 15));
  r.set_begin(998);
  EXPECT_TRUE(absl::IsInvalidArgument(order.Rows({r}).status()));
}

}  // namespace
}  // namespace shoal
