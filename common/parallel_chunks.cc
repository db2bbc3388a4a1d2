#include "common/parallel_chunks.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace shoal {

int PassThreads() {
  static const int threads =
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
  return threads;
}

bool ForEachChunk(uint64_t begin, uint64_t end, uint64_t chunk, int threads,
                  absl::FunctionRef<bool(uint64_t, uint64_t)> fn) {
  if (begin >= end) return true;
  chunk = std::max<uint64_t>(chunk, 1);
  const uint64_t chunks = (end - begin + chunk - 1) / chunk;
  threads = static_cast<int>(std::clamp<uint64_t>(threads, 1, chunks));
  std::atomic<uint64_t> next{0};
  std::atomic<bool> ok{true};
  auto work = [&] {
    while (ok.load(std::memory_order_relaxed)) {
      const uint64_t k = next.fetch_add(1, std::memory_order_relaxed);
      if (k >= chunks) return;
      const uint64_t b = begin + k * chunk;
      if (!fn(b, std::min(end, b + chunk))) ok.store(false, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> others;
  others.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) others.emplace_back(work);
  work();
  for (std::thread& t : others) t.join();
  return ok.load();
}

}  // namespace shoal
