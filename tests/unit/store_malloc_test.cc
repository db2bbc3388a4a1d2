// The checkpoint store's malloc settings take effect: its 1 MiB chunks are
// mapped for each call and unmapped when freed, also after a larger block
// was freed (which, by glibc's default, raises the threshold for good); and
// the periodic trim gives back the pages a burst freed between live blocks.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/checkpoint/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace shoal::checkpoint {
namespace {

#if defined(__GLIBC__)
TEST(StoreMallocTest, ChunkBuffersAreMappedAfterALargerBlockWasFreed) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer has its own allocator: glibc's malloc settings do not apply";
#endif
  ReturnChunkBuffersToTheKernel();
  const size_t mmapped_before = mallinfo2().hblks;
  // A freed 4 MiB block: by default the threshold would rise to 4 MiB here.
  void* big = std::malloc(4 << 20);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(mallinfo2().hblks, mmapped_before + 1);
  std::free(big);
  EXPECT_EQ(mallinfo2().hblks, mmapped_before) << "a freed mapped block stayed mapped";
  // A layer chunk after it is still its own mapping, given back on free.
  void* chunk = std::malloc(1 << 20);
  ASSERT_NE(chunk, nullptr);
  EXPECT_EQ(mallinfo2().hblks, mmapped_before + 1) << "a 1 MiB chunk came from the heap";
  std::free(chunk);
  EXPECT_EQ(mallinfo2().hblks, mmapped_before);
}

// Resident anonymous memory of this process, KiB (/proc/self/status).
long RssAnonKib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  long kib = -1;
  while (status >> key) {
    if (key == "RssAnon:") status >> kib;
    status.ignore(1 << 12, '\n');
  }
  return kib;
}

// What the soak's store kept after its stops: a burst's read buffers (below
// the mmap threshold, so from the heap) freed between blocks that stay
// live, which the heap's top-only trim cannot give back.
TEST(StoreMallocTest, TrimGivesBackPagesABurstFreedBetweenLiveBlocks) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer has its own allocator: glibc's malloc settings do not apply";
#endif
  ReturnChunkBuffersToTheKernel();
  constexpr int kBlocks = 256;
  constexpr size_t kBlockBytes = 64 << 10;  // 16 MiB in all
  std::vector<void*> burst, live;
  for (int i = 0; i < kBlocks; ++i) {
    burst.push_back(std::malloc(kBlockBytes));
    ASSERT_NE(burst.back(), nullptr);
    std::memset(burst.back(), 1, kBlockBytes);  // resident
    live.push_back(std::malloc(64));            // stays, between the freed blocks
    ASSERT_NE(live.back(), nullptr);
  }
  for (void* p : burst) std::free(p);
  const long before = RssAnonKib();
  ASSERT_GT(before, 0);
  const size_t free_bytes = ReturnFreedHeapPages();
  const long after = RssAnonKib();
  for (void* p : live) std::free(p);
  EXPECT_GE(free_bytes, kBlocks * kBlockBytes) << "the freed blocks were not in the heap";
  // Each freed block keeps at most its first and last page: at least 12 of
  // its 16 pages go back, 12 MiB of the 16.
  EXPECT_GE(before - after, 12 << 10) << "RssAnon " << before << " -> " << after << " KiB";
}
#endif

}  // namespace
}  // namespace shoal::checkpoint
