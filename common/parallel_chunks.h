// Element-wise passes over a model-sized buffer, chunk by chunk, on a few
// threads: the calling thread and up to threads - 1 others started for the
// call. Chunks are handed out in order from a shared counter; `fn(b, e)`
// works on [b, e) and returns false to stop: no chunk is started after a
// false (chunks already started end). For passes whose result per element
// does not depend on the order (so any split gives the same bits).
//
// Used where a loop waits for the pass (the merge of an average into the
// local model between two steps, local_training.h): on a machine with idle
// cores the pass takes a fraction of one core's time.
#ifndef SHOAL_COMMON_PARALLEL_CHUNKS_H_
#define SHOAL_COMMON_PARALLEL_CHUNKS_H_

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace shoal {

// The threads a pass uses by default: the machine's cores, at most 4 (a
// pass is bound by memory bandwidth beyond that).
int PassThreads();

// Runs fn over [begin, end) in chunks of `chunk` elements on `threads`
// threads (1: on the calling thread only). True when every chunk was run
// and returned true.
bool ForEachChunk(uint64_t begin, uint64_t end, uint64_t chunk, int threads,
                  absl::FunctionRef<bool(uint64_t, uint64_t)> fn);

}  // namespace shoal

#endif  // SHOAL_COMMON_PARALLEL_CHUNKS_H_
