#include "services/checkpoint/malloc_tuning.h"

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

}  // namespace shoal::checkpoint
