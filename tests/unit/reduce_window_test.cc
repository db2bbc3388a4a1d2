// The owner's reduce window (services/worker/core/reduce_window.h): cells
// averaged once, in order, never a partial sum in the output, members paused
// when they run ahead and resumed when the window moves.
#include "services/worker/core/reduce_window.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "common/tensor_wire.h"

namespace shoal::worker {
namespace {

constexpr uint64_t kCell = kCellElements;

// Member k's contribution to element i: small integers, so that any order
// of additions gives the same bits.
float Value(int k, uint64_t i) { return static_cast<float>((i % 7) + 10 * k); }

ChunkView View(const std::vector<float>& data, uint64_t begin, uint64_t count,
               uint64_t data_begin) {
  ChunkView v;
  v.begin = begin;
  v.data = data.data() + (begin - data_begin);
  v.count = count;
  return v;
}

class CountingHandle : public ResumeHandle {
 public:
  void Resume() override { ++resumes; }
  std::atomic<int> resumes{0};
};

struct Slice {
  SliceRange own;
  std::vector<float> out;                        // our contribution, then the average
  std::vector<std::vector<float>> contribution;  // per member, over `own`
};

Slice Make(uint64_t begin, uint64_t end, int members) {
  Slice s;
  s.own = {begin, end};
  s.contribution.resize(members);
  for (int k = 0; k < members; ++k) {
    for (uint64_t i = begin; i < end; ++i) s.contribution[k].push_back(Value(k, i));
  }
  s.out = s.contribution[0];
  return s;
}

ReduceWindowOptions Options(Slice* s, int members, uint64_t window) {
  ReduceWindowOptions o;
  o.own = s->own;
  o.members = members;
  o.self = 0;
  o.own_input = s->out.data();
  o.out = s->out.data();
  o.window_cells = window;
  return o;
}

float Mean(int members, uint64_t i) {
  float sum = 0;
  for (int k = 0; k < members; ++k) sum += Value(k, i);
  return sum / members;
}

// Three members, chunks of odd sizes interleaved: every element ends as the
// mean, and before its cell is complete it is still our own contribution.
TEST(ReduceWindowTest, TheMeanOfInterleavedChunksNeverShowsAPartialSum) {
  const uint64_t begin = kCell / 2, end = 3 * kCell + 1000;  // partial cells at both ends
  Slice s = Make(begin, end, 3);
  std::vector<uint64_t> averaged;
  ReduceWindowOptions o = Options(&s, 3, /*window=*/64);
  o.on_prefix = [&](uint64_t until) { averaged.push_back(until); };
  ReduceWindow window(o);
  uint64_t next[3] = {begin, begin, begin};
  const uint64_t sizes[3] = {0, 100003, 77777};
  bool more = true;
  while (more) {
    more = false;
    for (int k = 1; k < 3; ++k) {
      if (next[k] >= end) continue;
      const uint64_t n = std::min(sizes[k], end - next[k]);
      ReduceNext step;
      ASSERT_TRUE(window.Accept(k, View(s.contribution[k], next[k], n, begin), &step).ok());
      next[k] += n;
      more = true;
      // Every element is ours or the mean: never anything in between.
      for (uint64_t i = begin; i < end; i += 4099) {
        const float v = s.out[i - begin];
        ASSERT_TRUE(v == Value(0, i) || v == Mean(3, i)) << i << ": " << v;
      }
    }
  }
  AggregationSpec applied;
  ASSERT_TRUE(window.Finish(&applied).ok());
  for (uint64_t i = begin; i < end; ++i) ASSERT_EQ(s.out[i - begin], Mean(3, i)) << i;
  // The averaged prefix grew cell by cell to the slice's end.
  ASSERT_FALSE(averaged.empty());
  EXPECT_TRUE(std::is_sorted(averaged.begin(), averaged.end()));
  EXPECT_EQ(averaged.back(), end);
  EXPECT_EQ(window.averaged_until(), end);
  EXPECT_EQ(window.slots_in_use(), 0u);
}

// A member that runs ahead by the window's width is paused; it is resumed
// once the slowest member completes the lowest cell. The slots in use stay
// within the window.
TEST(ReduceWindowTest, AMemberAheadIsPausedUntilTheWindowMoves) {
  const uint64_t begin = 0, end = 8 * kCell;
  Slice s = Make(begin, end, 3);
  ReduceWindow window(Options(&s, 3, /*window=*/2));
  auto fast = std::make_shared<CountingHandle>();
  auto slow = std::make_shared<CountingHandle>();
  window.SetHandle(1, fast);
  window.SetHandle(2, slow);
  ReduceNext step;
  // Member 1 sends cells 0 and 1: at cell 2 it is two ahead of cell 0.
  ASSERT_TRUE(window.Accept(1, View(s.contribution[1], 0, kCell, begin), &step).ok());
  EXPECT_EQ(step, ReduceNext::kRead);
  ASSERT_TRUE(window.Accept(1, View(s.contribution[1], kCell, kCell, begin), &step).ok());
  EXPECT_EQ(step, ReduceNext::kPause);
  EXPECT_EQ(fast->resumes.load(), 0);
  EXPECT_EQ(window.averaged_until(), 0u);
  // Member 2 completes cell 0: the window moves and member 1 goes on.
  ASSERT_TRUE(window.Accept(2, View(s.contribution[2], 0, kCell, begin), &step).ok());
  EXPECT_EQ(step, ReduceNext::kRead);
  EXPECT_EQ(fast->resumes.load(), 1);
  EXPECT_EQ(window.averaged_until(), kCell);
  for (uint64_t c = 2; c < 8; ++c) {
    ASSERT_TRUE(window.Accept(1, View(s.contribution[1], c * kCell, kCell, begin), &step).ok());
    ASSERT_TRUE(
        window.Accept(2, View(s.contribution[2], (c - 1) * kCell, kCell, begin), &step).ok());
  }
  ASSERT_TRUE(window.Accept(2, View(s.contribution[2], 7 * kCell, kCell, begin), &step).ok());
  ASSERT_TRUE(window.Finish(nullptr).ok());
  EXPECT_LE(window.peak_slots(), 3u);
  for (uint64_t i = begin; i < end; i += 997) ASSERT_EQ(s.out[i], Mean(3, i)) << i;
}

// A resume wanted before the member's handle is known is done when it is.
TEST(ReduceWindowTest, AResumeBeforeTheHandleIsDoneWhenTheHandleComes) {
  Slice s = Make(0, 4 * kCell, 3);
  ReduceWindow window(Options(&s, 3, /*window=*/1));
  ReduceNext step;
  ASSERT_TRUE(window.Accept(1, View(s.contribution[1], 0, kCell, 0), &step).ok());
  EXPECT_EQ(step, ReduceNext::kPause);
  ASSERT_TRUE(window.Accept(2, View(s.contribution[2], 0, kCell, 0), &step).ok());
  auto handle = std::make_shared<CountingHandle>();
  window.SetHandle(1, handle);
  EXPECT_EQ(handle->resumes.load(), 1);
}

// A robust rule combines each cell's values apart: the median of three.
TEST(ReduceWindowTest, TheMedianOfEachCellApart) {
  const uint64_t begin = 100, end = kCell + 5000;
  Slice s = Make(begin, end, 3);
  ReduceWindowOptions o = Options(&s, 3, /*window=*/4);
  o.apart = true;
  o.rule.kind = AggregationSpec::Kind::kMedian;
  o.weights = {1, 1, 1};
  ReduceWindow window(o);
  ReduceNext step;
  ASSERT_TRUE(window.Accept(2, View(s.contribution[2], begin, end - begin, begin), &step).ok());
  ASSERT_TRUE(window.Accept(1, View(s.contribution[1], begin, end - begin, begin), &step).ok());
  AggregationSpec applied;
  ASSERT_TRUE(window.Finish(&applied).ok());
  EXPECT_EQ(applied.kind, AggregationSpec::Kind::kMedian);
  for (uint64_t i = begin; i < end; ++i) ASSERT_EQ(s.out[i - begin], Value(1, i)) << i;
}

// Chunks out of order, outside the slice, or from ourselves are refused;
// a reduce that ends with a cell missing is DATA_LOSS.
TEST(ReduceWindowTest, BadChunksAndMissingCellsAreErrors) {
  Slice s = Make(0, 2 * kCell, 3);
  ReduceWindow window(Options(&s, 3, 8));
  ReduceNext step;
  EXPECT_EQ(window.Accept(1, View(s.contribution[1], 10, 10, 0), &step).code(),
            absl::StatusCode::kInvalidArgument);  // a gap
  EXPECT_EQ(window.Accept(0, View(s.contribution[0], 0, 10, 0), &step).code(),
            absl::StatusCode::kInvalidArgument);  // ourselves
  EXPECT_EQ(window.Accept(1, View(s.contribution[1], 0, 2 * kCell, 0), &step).code(),
            absl::StatusCode::kOk);
  EXPECT_EQ(window.Finish(nullptr).code(), absl::StatusCode::kDataLoss);
}

// Alone, the average is our own contribution.
TEST(ReduceWindowTest, AloneTheAverageIsOurs) {
  Slice s = Make(0, kCell + 3, 1);
  ReduceWindow window(Options(&s, 1, 4));
  ASSERT_TRUE(window.Finish(nullptr).ok());
  for (uint64_t i = 0; i < kCell + 3; i += 101) ASSERT_EQ(s.out[i], Value(0, i));
  EXPECT_EQ(window.averaged_until(), kCell + 3);
}

}  // namespace
}  // namespace shoal::worker
