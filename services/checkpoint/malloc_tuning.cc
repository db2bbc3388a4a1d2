#include "services/checkpoint/malloc_tuning.h"

#include <cstddef>
#include <cstdlib>  // defines __GLIBC__ (through <features.h>) on glibc systems

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace shoal::checkpoint {

void ReturnChunkBuffersToTheKernel() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  mallopt(M_ARENA_MAX, 1);
#endif
}

size_t ReturnFreedHeapPages() {
#if defined(__GLIBC__)
  const size_t free_bytes = mallinfo2().fordblks;
  malloc_trim(0);
  return free_bytes;
#else
  return 0;
#endif
}

}  // namespace shoal::checkpoint
