// EpochPermutation and SampleOrder: the ledger's positions as samples.
#include "services/worker/core/sample_order.h"

#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shoal::worker {
namespace {

// Uniform in [0, bound) (bound > 0): Lemire's multiply-shift with its
// rejection step, so that every value is equally likely.
uint64_t Below(uint64_t bound, std::mt19937_64& rng) {
  unsigned __int128 m = static_cast<unsigned __int128>(rng()) * bound;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = -bound % bound;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(rng()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace

std::vector<int64_t> EpochPermutation(uint64_t seed, uint64_t epoch, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(0, n)));
  std::iota(p.begin(), p.end(), 0);
  // A stream of its own per epoch, apart from the model's seed use.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 0x5851F42D4C957F2DULL * (epoch + 1));
  for (size_t i = p.size(); i > 1; --i) {
    const uint64_t j = Below(i, rng);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

std::string FormatRanges(absl::Span<const shoal::v1::SampleRange> ranges) {
  return absl::StrJoin(ranges, " ", [](std::string* out, const shoal::v1::SampleRange& r) {
    absl::StrAppend(out, "e", r.epoch(), ":[", r.begin(), ",", r.begin() + r.count(), ")");
  });
}

const std::vector<int64_t>& SampleOrder::Permutation(uint64_t epoch) {
  auto it = cache_.find(epoch);
  if (it != cache_.end()) return it->second;
  while (cache_.size() >= 2) cache_.erase(cache_.begin());
  return cache_.emplace(epoch, EpochPermutation(seed_, epoch, n_)).first->second;
}

absl::StatusOr<std::vector<int64_t>> SampleOrder::Rows(
    absl::Span<const shoal::v1::SampleRange> ranges) {
  std::vector<int64_t> rows;
  for (const shoal::v1::SampleRange& r : ranges) {
    if (r.begin() > static_cast<uint64_t>(n_) ||
        r.count() > static_cast<uint64_t>(n_) - r.begin()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample range ", FormatRanges({r}), " is past the training set's ", n_, " samples"));
    }
    const std::vector<int64_t>& p = Permutation(r.epoch());
    rows.insert(rows.end(), p.begin() + static_cast<int64_t>(r.begin()),
                p.begin() + static_cast<int64_t>(r.begin() + r.count()));
  }
  return rows;
}

}  // namespace shoal::worker
