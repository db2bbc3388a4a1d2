#include "common/parallel_chunks.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"

namespace shoal {
namespace {

TEST(ForEachChunkTest, EveryElementOnceWhateverTheThreads) {
  for (int threads : {1, 2, 3, 8}) {
    std::vector<int> seen(1000, 0);
    EXPECT_TRUE(ForEachChunk(3, 1000, 64, threads, [&](uint64_t b, uint64_t e) {
      EXPECT_LE(e - b, 64u);
      for (uint64_t i = b; i < e; ++i) ++seen[i];  // chunks never overlap
      return true;
    }));
    for (uint64_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i < 3 ? 0 : 1) << i;
  }
}

TEST(ForEachChunkTest, AFalseStopsTheChunksNotYetStarted) {
  std::atomic<int> ran{0};
  EXPECT_FALSE(ForEachChunk(0, 100, 1, 1, [&](uint64_t b, uint64_t) {
    ++ran;
    return b < 9;
  }));
  EXPECT_EQ(ran.load(), 10);  // one thread: in order, none after the false
  std::mutex mu;
  std::vector<uint64_t> starts;
  // Several threads: the false is the call's result (how many chunks the
  // others started meanwhile depends on the scheduler).
  EXPECT_FALSE(ForEachChunk(0, 1000, 1, 2, [&](uint64_t b, uint64_t) {
    std::lock_guard<std::mutex> lock(mu);
    starts.push_back(b);
    return b != 0;
  }));
  EXPECT_FALSE(starts.empty());
}

TEST(ForEachChunkTest, AnEmptyRangeRunsNothing) {
  int ran = 0;
  EXPECT_TRUE(ForEachChunk(5, 5, 16, 4, [&](uint64_t, uint64_t) { return ++ran > 0; }));
  EXPECT_EQ(ran, 0);
  EXPECT_GE(PassThreads(), 1);
  EXPECT_LE(PassThreads(), 4);
}

}  // namespace
}  // namespace shoal
