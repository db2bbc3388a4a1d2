#include "services/worker/core/data_split.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::worker {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

// Uniform in (0, 1]: 53 random bits, never 0 (so log() is finite).
double UniformOpenClosed(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
}

// Standard normal, Box-Muller (one of the pair; simplicity over speed).
double Normal(std::mt19937_64& rng) {
  const double u1 = UniformOpenClosed(rng);
  const double u2 = UniformOpenClosed(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// log of a Gamma(shape, 1) sample. Marsaglia-Tsang for shape >= 1; for
// shape < 1 the boost Gamma(shape + 1) * U^(1/shape), kept in log space
// because U^(1/shape) underflows to 0 for small shapes (alpha = 0.01 gives
// exponents of 100), which would make a whole Dirichlet draw 0/0.
double LogGamma(double shape, std::mt19937_64& rng) {
  if (shape < 1) {
    return LogGamma(shape + 1, rng) + std::log(UniformOpenClosed(rng)) / shape;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = Normal(rng);
    double v = 1.0 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = UniformOpenClosed(rng);
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d * v);
  }
}

// The generator of a run's label-skew split: the run seed, mixed so that it
// is not the stream the trainer's shuffles or the model's init use.
std::mt19937_64 SplitRng(uint64_t seed) {
  return std::mt19937_64(seed * 0x9E3779B97F4A7C15ull ^ 0x6C6162656C736B65ull);  // "labelske"
}

// Splits `n` into `p.size()` counts proportional to `p` (summing to 1 up
// to rounding): cuts at round(n x cumulative proportion), the last cut at n
// itself, so the counts are >= 0 and sum to n exactly whatever the rounding.
std::vector<int64_t> Apportion(int64_t n, const std::vector<double>& p) {
  std::vector<int64_t> counts(p.size());
  double cumulative = 0;
  int64_t prev = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    cumulative += p[i];
    int64_t cut = i + 1 == p.size()
                      ? n
                      : std::clamp<int64_t>(std::llround(cumulative * static_cast<double>(n)),
                                            prev, n);
    counts[i] = cut - prev;
    prev = cut;
  }
  return counts;
}

}  // namespace

double SampleGamma(double shape, std::mt19937_64& rng) { return std::exp(LogGamma(shape, rng)); }

std::vector<double> SampleDirichlet(double alpha, uint32_t k, std::mt19937_64& rng) {
  std::vector<double> logs(k);
  for (double& l : logs) l = LogGamma(alpha, rng);
  const double top = *std::max_element(logs.begin(), logs.end());
  double sum = 0;
  for (double& l : logs) {
    l = std::exp(l - top);  // the largest is 1: the sum is >= 1, never 0
    sum += l;
  }
  for (double& l : logs) l /= sum;
  return logs;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> LabelSkewShards(
    const std::vector<uint8_t>& labels, uint32_t shards, double alpha, uint64_t seed) {
  if (!(alpha > 0) || !std::isfinite(alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_skew needs a finite Dirichlet alpha > 0, got ", alpha));
  }
  if (shards == 0) return absl::InvalidArgumentError("label_skew needs at least one shard");
  if (labels.size() < shards) {
    return absl::FailedPreconditionError(absl::StrCat("label_skew: ", labels.size(),
                                                      " training images cannot fill ", shards,
                                                      " shards"));
  }
  // Images of each label, in index order, then shuffled once by the seed.
  std::vector<std::vector<int64_t>> by_label(256);
  for (size_t i = 0; i < labels.size(); ++i) by_label[labels[i]].push_back(static_cast<int64_t>(i));
  std::mt19937_64 rng = SplitRng(seed);
  for (std::vector<int64_t>& rows : by_label) {
    // Fisher-Yates by hand: std::shuffle's use of the generator is
    // implementation-defined too.
    for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[rng() % i]);
  }
  for (int draw = 0; draw < kMaxLabelSkewDraws; ++draw) {
    std::vector<std::vector<int64_t>> out(shards);
    for (const std::vector<int64_t>& rows : by_label) {
      if (rows.empty()) continue;  // absent labels draw nothing
      const std::vector<int64_t> counts =
          Apportion(static_cast<int64_t>(rows.size()), SampleDirichlet(alpha, shards, rng));
      size_t next = 0;
      for (uint32_t s = 0; s < shards; ++s) {
        out[s].insert(out[s].end(), rows.begin() + next, rows.begin() + next + counts[s]);
        next += counts[s];
      }
    }
    if (std::none_of(out.begin(), out.end(), [](const auto& r) { return r.empty(); })) {
      for (std::vector<int64_t>& r : out) std::sort(r.begin(), r.end());
      return out;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "label_skew:", alpha, " left a shard of ", shards, " without any image in ",
      kMaxLabelSkewDraws, " draws; use a larger alpha or fewer data shards"));
}

std::vector<int64_t> IidShardRows(int64_t count, uint32_t shards, uint32_t shard) {
  std::vector<int64_t> rows;
  shards = std::max<uint32_t>(1, shards);
  for (int64_t i = shard % shards; i < count; i += shards) rows.push_back(i);
  return rows;
}

absl::StatusOr<std::vector<int64_t>> ShardRows(const DataSplit& split,
                                               const std::vector<uint8_t>& labels,
                                               uint32_t shards, uint32_t shard, uint64_t seed) {
  shards = std::max<uint32_t>(1, shards);
  if (!split.label_skew) return IidShardRows(static_cast<int64_t>(labels.size()), shards, shard);
  absl::StatusOr<std::vector<std::vector<int64_t>>> all =
      LabelSkewShards(labels, shards, split.alpha, seed);
  if (!all.ok()) return all.status();
  return std::move((*all)[shard % shards]);
}

std::vector<uint64_t> LabelCounts(const std::vector<uint8_t>& labels,
                                  const std::vector<int64_t>& rows) {
  std::vector<uint64_t> counts;
  for (int64_t r : rows) {
    const uint8_t l = labels[static_cast<size_t>(r)];
    if (l >= counts.size()) counts.resize(l + 1, 0);
    ++counts[l];
  }
  return counts;
}

std::string LabelCountsSummary(const std::vector<uint64_t>& counts) {
  uint64_t n = 0;
  size_t top = 0;
  std::string per_label;
  for (size_t l = 0; l < counts.size(); ++l) {
    n += counts[l];
    if (counts[l] > counts[top]) top = l;
    absl::StrAppend(&per_label, l == 0 ? "" : " ", l, ":", counts[l]);
  }
  if (n == 0) return "n=0";
  return absl::StrFormat("n=%d labels %s, top label %d holds %.1f%%", n, per_label, top,
                         100.0 * static_cast<double>(counts[top]) / static_cast<double>(n));
}

}  // namespace shoal::worker
