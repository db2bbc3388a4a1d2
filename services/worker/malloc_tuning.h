// glibc malloc settings for a process that streams tensors with gRPC.
#ifndef SHOAL_SERVICES_WORKER_MALLOC_TUNING_H_
#define SHOAL_SERVICES_WORKER_MALLOC_TUNING_H_

namespace shoal::worker {

// Keeps the memory gRPC's message buffers come from inside the process.
// By default glibc serves every allocation above a dynamic threshold
// (128 KiB at first) from fresh mmap'ed pages and returns freed heap tops
// to the kernel, and gives threads their own arenas; each exchange runs its
// reads on new threads, so gRPC's 1 MiB receive buffers came from fresh
// pages that fault on first touch (about 76,000 faults per round of the
// 64 MiB exchange benchmark). With
//   M_MMAP_THRESHOLD 32 MiB: 1-8 MiB message buffers come from the heap
//                            (the model, larger, is still mmap'ed);
//   M_TRIM_THRESHOLD 128 MiB: freed heap is kept for the next chunk;
//   M_ARENA_MAX 1: a buffer freed by one gRPC thread is reused by the next,
//                  and the heap stays bounded (without it, RSS reached
//                  7 x the model in the benchmark);
// the exchange benchmark measured -31 % CPU, -28 % time and a lower peak
// RSS (bench/RESULTS.md). Call first thing in main(), before any thread
// starts (arenas are created per thread).
void TuneMallocForTensorStreams();

// For a process Shoal does not own (the Python module inside a user's
// program): M_ARENA_MAX 1 only, unless the user set MALLOC_ARENA_MAX. The
// exchange's readers run on gRPC's threads; with an arena per thread their
// freed 1 MiB windows stayed in arenas no other thread reused (about 60 MB
// at 10 M parameters in bench "scale"). The mmap and trim thresholds stay
// the user's. Threads that already have an arena keep it.
void LimitMallocArenas();

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_MALLOC_TUNING_H_
