// glibc malloc settings for the checkpoint store.
#ifndef SHOAL_SERVICES_CHECKPOINT_MALLOC_TUNING_H_
#define SHOAL_SERVICES_CHECKPOINT_MALLOC_TUNING_H_

#include <cstddef>

namespace shoal::checkpoint {

// The store's large allocations are the 1 MiB layer chunks of uploads and
// reads (and gRPC's buffers for them), and it sits idle between
// checkpoints. By default glibc mmaps a block above 128 KiB, but the first
// free of such a block raises that threshold to the block's size, so from
// then on every chunk comes from the heap of whichever thread's arena
// allocated it (up to 8 per core), and an arena keeps what a burst left
// in it (a stopped store resumed, uploads of several workers at once).
// With
//   M_MMAP_THRESHOLD 128 KiB, set: the threshold stays (setting it turns
//                    the dynamic one off), so a chunk is mapped for its
//                    call and unmapped when it is freed;
//   M_ARENA_MAX 1:   small allocations of every gRPC thread share one heap;
// the store's RSS follows what it holds: under a checkpoint every round
// (20 times the soak's rate) with the store stopped for 10 s every 75 s,
// 22.2 MiB after 12 minutes against 27.8 MiB with glibc's defaults
// (bench/RESULTS.md, "The checkpoint store's memory"). Call first thing in
// main(), before any thread starts.
void ReturnChunkBuffersToTheKernel();

// Gives the kernel back the whole free pages inside the heap (glibc's
// malloc_trim(0)): what a burst of small allocations (gRPC's read buffers
// of uploads that queued while the store was stopped) freed but left
// between live ones, where the default trim, from the heap's top only,
// cannot reach. The store calls it every --trim_interval (1 s). It holds
// the heap's lock while it walks the free lists and madvises: about 60 us
// with nothing to give back, 1.5-5.5 ms after 16 MiB freed in 64 KiB
// pieces (on a loaded 2-core machine). Returns the bytes the heap had free
// before (mallinfo2's fordblks); 0 on other C libraries.
size_t ReturnFreedHeapPages();

}  // namespace shoal::checkpoint

#endif  // SHOAL_SERVICES_CHECKPOINT_MALLOC_TUNING_H_
