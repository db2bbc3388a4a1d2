// The run-config strings of issue 16 (docs/COMPRESSION.md): how a round's
// change travels (--codec), what the averaged change does to the model
// (--outer_optimizer) and how the training data is split (--data_split);
// of issue 14 (docs/SECURITY.md): how a slice's owner combines the
// contributions it receives (--aggregation); and gossip's interpolation.
// Parsed in one place so that the coordinator refuses a bad flag at start
// and every worker reads the run config the same way.
#ifndef SHOAL_COMMON_RUN_OPTIONS_H_
#define SHOAL_COMMON_RUN_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal {

struct CodecSpec {
  enum class Kind { kFp32, kFp16, kBf16, kInt8, kTopK, kRandomK, kSparse };
  Kind kind = Kind::kFp32;
  // topk / randomk / sparse: the fraction of the elements sent, in (0, 1].
  double fraction = 1.0;
};
// "fp32" (or empty), "fp16", "bf16", "int8", "topk:F", "randomk:F", "sparse:F"
// with F in (0, 1]. INVALID_ARGUMENT otherwise, naming what is accepted.
absl::StatusOr<CodecSpec> ParseCodecSpec(const std::string& text);

enum class OuterOptimizer { kNone, kSgd, kNesterov };
// "none" (or empty), "sgd", "nesterov".
absl::StatusOr<OuterOptimizer> ParseOuterOptimizer(const std::string& text);

struct DataSplit {
  // IID: every data_shards-th image from (data_rank % data_shards), shuffled.
  // Label skew: for every label, the shares of its images the data shards
  // get are drawn from Dirichlet(alpha) (services/worker/core/data_split.h).
  bool label_skew = false;
  double alpha = 0;
};
// "iid" (or empty), "label_skew:ALPHA" with ALPHA > 0.
absl::StatusOr<DataSplit> ParseDataSplit(const std::string& text);

// How the owner of a slice combines the N contributions of its slice, per
// element (services/worker/core/aggregation.h; docs/SECURITY.md).
struct AggregationSpec {
  enum class Kind { kMean, kTrimmedMean, kMedian };
  Kind kind = Kind::kMean;
  // kTrimmedMean: the number of values dropped at each end, >= 1.
  uint32_t trim = 0;
};
// "mean" (or empty), "trimmed_mean:K" with K an integer in [1, 1000],
// "median". INVALID_ARGUMENT otherwise, naming what is accepted.
absl::StatusOr<AggregationSpec> ParseAggregation(const std::string& text);
// The canonical text of `spec` ("mean", "trimmed_mean:2", "median").
std::string AggregationName(const AggregationSpec& spec);
// The fewest contributions a round needs for `spec` to run as asked: 2K + 1
// for trimmed_mean:K, 1 otherwise. With fewer the owner falls back to the
// median (docs/SECURITY.md).
uint32_t MinContributions(const AggregationSpec& spec);

// Gossip's interpolation factor (docs/GOSSIP.md): "constant:A" with
// 0 < A <= 1 ("constant" or empty: 0.5), "clock", "loss".
struct InterpolationSpec {
  enum class Kind { kConstant, kClock, kLoss };
  Kind kind = Kind::kConstant;
  double constant = 0.5;  // kConstant
};
// INVALID_ARGUMENT otherwise, naming what is accepted.
absl::StatusOr<InterpolationSpec> ParseInterpolationSpec(const std::string& text);

// Overlapped rounds (docs/OVERLAP.md, "Where the steps ahead start"):
// where the steps trained ahead of their round start on the round's
// fragment. "contribution" (or empty): from this worker's own
// contribution, as reported (extrapolate = 0). "extrapolate" or
// "extrapolate:B" with 0 < B <= 2: from the agreed model moved once more
// by B times its last move, G + B (G - G_prev), a prediction of the
// average that comes (B = 1 without a number).
struct OverlapStart {
  double extrapolate = 0;
};
// INVALID_ARGUMENT otherwise, naming what is accepted.
absl::StatusOr<OverlapStart> ParseOverlapStart(const std::string& text);

// The coordinator's --input_shape for a TorchScript model: "C,H,W", three
// integers in [1, kMaxInputDim]. INVALID_ARGUMENT otherwise.
inline constexpr int64_t kMaxInputDim = 65536;
absl::StatusOr<std::vector<int64_t>> ParseInputShape(const std::string& text);

}  // namespace shoal

#endif  // SHOAL_COMMON_RUN_OPTIONS_H_
