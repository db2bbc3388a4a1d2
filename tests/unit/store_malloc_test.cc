// The checkpoint store's malloc settings take effect: its 1 MiB chunks are
// mapped for each call and unmapped when freed, also after a larger block
// was freed (which, by glibc's default, raises the threshold for good).
#include <cstdlib>

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
#endif

}  // namespace
}  // namespace shoal::checkpoint
