// How the owner of a slice combines the N contributions of its slice into
// the slice's average (issue 14, docs/SECURITY.md): `--aggregation` on the
// coordinator, carried to every worker in RunConfig.aggregation.
//
//  - mean: the sum of the N values divided by N. The exchanges keep their
//    own summation for it (services/worker/exchanger.cc), so a run with
//    --aggregation=mean computes the very bits it computed before this rule
//    existed; CombineContributions implements it too, in input order, for
//    completeness and tests.
//  - trimmed_mean:K: per element, the N values are sorted, the K lowest and
//    the K highest dropped and the N - 2K others averaged.
//  - median: per element, the middle value (N odd) or the mean of the two
//    middle values (N even).
//
// Unweighted, like the mean: every participant of a round trains the same
// local_steps x batch_size samples, so each contribution counts once.
//
// Too few contributions: trimmed_mean:K needs N >= 2K + 1. The coordinator
// refuses to start with 2K + 1 > --min_participants, but a round can still
// shrink below that (a participant lost after the plan, and the survivors
// re-plan). Such a round is not refused: the owner falls back to the median
// of the N values, the most trimming N values allow (the trimmed mean with
// K' = (N - 1) / 2 is the median). Every owner takes the same decision from
// the same plan, so the models stay bit-identical.
//
// Determinism: the result depends only on the multiset of the N values of
// an element, never on the order of the inputs (arrival order, plan order):
// values are sorted by IEEE 754 totalOrder, which orders every bit pattern,
// and the kept values are summed in that order (in double precision, then
// rounded once to float).
//
// Non-finite values (robust rules): totalOrder places them at the ends,
// -NaN < -inf < finite values < +inf < +NaN, so a NaN or an infinity is an
// extreme value like any other and is dropped with the K lowest or highest.
// Only when more than K of an element's values are non-finite on one side
// (or the median lands on one) does the result become inf or NaN. The mean
// propagates them, as it always did.
//
// Pure functions: no threads, no clock, no Torch.
#ifndef SHOAL_SERVICES_WORKER_CORE_AGGREGATION_H_
#define SHOAL_SERVICES_WORKER_CORE_AGGREGATION_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/run_options.h"

namespace shoal::worker {

// The rule an owner applies to `n` contributions under `spec`: `spec`
// itself, or the median when trimmed_mean:K has n < 2K + 1 (see above).
AggregationSpec EffectiveAggregation(const AggregationSpec& spec, size_t n);

// out[i] = the combination under `spec` of inputs[0][i], ...,
// inputs[n-1][i], for i in [0, count). `out` may be one of the inputs (each
// element's values are read before its result is written). Returns the
// rule applied (EffectiveAggregation); INVALID_ARGUMENT when there is no
// input or an input is null.
absl::StatusOr<AggregationSpec> CombineContributions(const AggregationSpec& spec,
                                                     absl::Span<const float* const> inputs,
                                                     size_t count, float* out);

// The same with a weight per input: input k stands for weights[k] equal
// values (a zone's result in a hierarchical round stands for the
// participants under it). The mean is sum(w_k x_k) / sum(w_k), summed in
// float in input order (starting from 0: with every weight 1 this is
// exactly the unweighted mean above); the robust rules expand each value
// into its weight's worth of copies: trimmed_mean:K drops K units of
// weight at each end and averages the rest (in double, in totalOrder,
// rounded once), the median is the middle unit (or the mean of the two
// middle units), and the effective rule uses the total weight in place of
// n. With every weight 1 the bits equal CombineContributions'. Weights are
// positive; INVALID_ARGUMENT otherwise or when the sizes differ.
absl::StatusOr<AggregationSpec> CombineWeighted(const AggregationSpec& spec,
                                                absl::Span<const float* const> inputs,
                                                absl::Span<const uint32_t> weights, size_t count,
                                                float* out);

// True for the rules that need every contribution kept apart until all are
// in (trimmed mean, median), false for the mean, which sums as they arrive.
inline bool NeedsAllContributions(const AggregationSpec& spec) {
  return spec.kind != AggregationSpec::Kind::kMean;
}

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_AGGREGATION_H_
