// Which training images a data rank trains on (--data_split, issue 16).
// Pure computation on the label vector, no Torch, so it is unit-tested alone.
//
//   iid               shard s of K takes every K-th image starting at s (the
//                     split Shoal always had); the trainer shuffles it.
//   label_skew:ALPHA  Dirichlet label skew: for every label c, the
//                     proportions p_c = (p_c,0 .. p_c,K-1) ~ Dirichlet(ALPHA)
//                     over the K shards say which share of label c's images
//                     each shard gets. Small ALPHA: each label lives mostly
//                     on one or two shards; large ALPHA: close to IID.
//
// Shards are disjoint and together cover the training set exactly once: a
// label's images are shuffled (seeded) and cut into consecutive runs at
// round(count x cumulative proportion), the last cut at the end, so the
// rounding remainders go to whichever shard the cut falls in and every
// image lands in exactly one shard. A draw that leaves a shard with no image at all is
// drawn again from the same generator (deterministically); after
// kMaxLabelSkewDraws such draws the split fails with FAILED_PRECONDITION.
//
// Deterministic from the run seed alone, identical on every worker: the
// generator is std::mt19937_64 (fully specified by the standard) and the
// Gamma/normal/uniform samplers are written out here (Marsaglia-Tsang,
// Box-Muller, 53-bit uniforms) rather than taken from <random>, whose
// distributions are implementation-defined and differ across standard
// libraries. What remains is libm's log/exp/pow/cos/sqrt, correctly rounded
// in practice on glibc; workers of one run should run one build anyway.
#ifndef SHOAL_SERVICES_WORKER_CORE_DATA_SPLIT_H_
#define SHOAL_SERVICES_WORKER_CORE_DATA_SPLIT_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/run_options.h"

namespace shoal::worker {

inline constexpr int kMaxLabelSkewDraws = 1000;

// One Gamma(shape, 1) sample (shape > 0) from `rng`, portable (see above).
double SampleGamma(double shape, std::mt19937_64& rng);

// One Dirichlet(alpha, ..., alpha) sample of `k` components, summing to 1.
std::vector<double> SampleDirichlet(double alpha, uint32_t k, std::mt19937_64& rng);

// Every shard's rows (ascending image indices) of a label-skew split of
// `labels` into `shards` shards, from `seed`. INVALID_ARGUMENT for alpha <= 0
// or no shard; FAILED_PRECONDITION when fewer images than shards or no draw
// gives every shard an image.
absl::StatusOr<std::vector<std::vector<int64_t>>> LabelSkewShards(
    const std::vector<uint8_t>& labels, uint32_t shards, double alpha, uint64_t seed);

// Rows of shard `shard` (< shards) of an IID split of `count` images.
std::vector<int64_t> IidShardRows(int64_t count, uint32_t shards, uint32_t shard);

// Rows of shard `shard` of `split` (computing the whole label-skew split:
// every worker computes the same one and keeps its part).
absl::StatusOr<std::vector<int64_t>> ShardRows(const DataSplit& split,
                                               const std::vector<uint8_t>& labels,
                                               uint32_t shards, uint32_t shard, uint64_t seed);

// Images per label (index = label) among `rows`.
std::vector<uint64_t> LabelCounts(const std::vector<uint8_t>& labels,
                                  const std::vector<int64_t>& rows);

// "n=6012 labels 0:1203 1:0 ... top label 3 holds 41.2%" for a log line.
std::string LabelCountsSummary(const std::vector<uint64_t>& counts);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_DATA_SPLIT_H_
