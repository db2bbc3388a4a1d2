// The worker's malloc settings take effect (they once compiled to nothing
// because the glibc check came before any header defined __GLIBC__).
#include "services/worker/malloc_tuning.h"

#include <cstdlib>

#include "gtest/gtest.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace shoal::worker {
namespace {

#if defined(__GLIBC__)
TEST(MallocTuningTest, MessageSizedBuffersComeFromTheHeap) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer has its own allocator: glibc's malloc settings do not apply";
#endif
  TuneMallocForTensorStreams();
  const size_t mmapped_before = mallinfo2().hblks;
  // A gRPC message buffer (1-8 MiB): below the 32 MiB threshold, so from
  // the heap, not from a fresh mmap (the default threshold starts at 128 KiB).
  void* p = std::malloc(4 << 20);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(mallinfo2().hblks, mmapped_before) << "a 4 MiB block was mmap'ed";
  std::free(p);
  // The model itself (larger) is still mmap'ed.
  void* model = std::malloc(64 << 20);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(mallinfo2().hblks, mmapped_before + 1);
  std::free(model);
}
#endif

}  // namespace
}  // namespace shoal::worker
