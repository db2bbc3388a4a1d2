#include "services/worker/malloc_tuning.h"

#include <cstdlib>  // defines __GLIBC__ (through <features.h>) on glibc systems

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace shoal::worker {

void TuneMallocForTensorStreams() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
  mallopt(M_ARENA_MAX, 1);
#endif
}

void LimitMallocArenas() {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 1);
#endif
}

}  // namespace shoal::worker
