#include "common/run_options.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace shoal {
namespace {

// Far more than any run's participants; keeps 2K + 1 well inside uint32.
constexpr uint32_t kMaxTrim = 1000;

// The number after "name:" in `text`, in (0, max].
absl::StatusOr<double> ParseParameter(const std::string& text, size_t prefix, double max,
                                      const char* what) {
  double v = 0;
  if (!absl::SimpleAtod(text.substr(prefix), &v) || !std::isfinite(v) || !(v > 0) || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': ", what, " must be a number in (0, ",
                     std::isinf(max) ? "inf" : absl::StrCat(max), ")"));
  }
  return v;
}

}  // namespace

absl::StatusOr<CodecSpec> ParseCodecSpec(const std::string& text) {
  CodecSpec spec;
  if (text.empty() || text == "fp32") return spec;
  if (text == "fp16") {
    spec.kind = CodecSpec::Kind::kFp16;
    return spec;
  }
  if (text == "bf16") {
    spec.kind = CodecSpec::Kind::kBf16;
    return spec;
  }
  if (text == "int8") {
    spec.kind = CodecSpec::Kind::kInt8;
    return spec;
  }
  for (auto [name, kind] : {std::pair{"topk:", CodecSpec::Kind::kTopK},
                            std::pair{"randomk:", CodecSpec::Kind::kRandomK},
                            std::pair{"sparse:", CodecSpec::Kind::kSparse}}) {
    if (absl::StartsWith(text, name)) {
      absl::StatusOr<double> f =
          ParseParameter(text, std::string(name).size(), 1.0, "the fraction");
      if (!f.ok()) return f.status();
      spec.kind = kind;
      spec.fraction = *f;
      return spec;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown codec '", text,
                   "' (fp32, fp16, bf16, int8, topk:F, randomk:F or sparse:F with F in (0, 1])"));
}

absl::StatusOr<OuterOptimizer> ParseOuterOptimizer(const std::string& text) {
  if (text.empty() || text == "none") return OuterOptimizer::kNone;
  if (text == "sgd") return OuterOptimizer::kSgd;
  if (text == "nesterov") return OuterOptimizer::kNesterov;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown outer optimizer '", text, "' (none, sgd or nesterov)"));
}

absl::StatusOr<DataSplit> ParseDataSplit(const std::string& text) {
  DataSplit split;
  if (text.empty() || text == "iid") return split;
  if (absl::StartsWith(text, "label_skew:")) {
    absl::StatusOr<double> a =
        ParseParameter(text, sizeof("label_skew:") - 1, INFINITY, "the Dirichlet alpha");
    if (!a.ok()) return a.status();
    split.label_skew = true;
    split.alpha = *a;
    return split;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data split '", text, "' (iid or label_skew:ALPHA with ALPHA > 0)"));
}

absl::StatusOr<AggregationSpec> ParseAggregation(const std::string& text) {
  AggregationSpec spec;
  if (text.empty() || text == "mean") return spec;
  if (text == "median") {
    spec.kind = AggregationSpec::Kind::kMedian;
    return spec;
  }
  constexpr absl::string_view kTrimmed = "trimmed_mean:";
  if (absl::StartsWith(text, kTrimmed)) {
    uint32_t k = 0;
    if (!absl::SimpleAtoi(absl::string_view(text).substr(kTrimmed.size()), &k) || k < 1 ||
        k > kMaxTrim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", text, "': K of trimmed_mean:K must be an integer in [1, ", kMaxTrim, "]"));
    }
    spec.kind = AggregationSpec::Kind::kTrimmedMean;
    spec.trim = k;
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown aggregation '", text, "' (mean, trimmed_mean:K or median)"));
}

std::string AggregationName(const AggregationSpec& spec) {
  switch (spec.kind) {
    case AggregationSpec::Kind::kMean:
      return "mean";
    case AggregationSpec::Kind::kTrimmedMean:
      return absl::StrCat("trimmed_mean:", spec.trim);
    case AggregationSpec::Kind::kMedian:
      return "median";
  }
  return "mean";
}

uint32_t MinContributions(const AggregationSpec& spec) {
  return spec.kind == AggregationSpec::Kind::kTrimmedMean ? 2 * spec.trim + 1 : 1;
}

absl::StatusOr<InterpolationSpec> ParseInterpolationSpec(const std::string& text) {
  InterpolationSpec spec;
  if (text.empty() || text == "constant") return spec;
  if (text == "clock") {
    spec.kind = InterpolationSpec::Kind::kClock;
    return spec;
  }
  if (text == "loss") {
    spec.kind = InterpolationSpec::Kind::kLoss;
    return spec;
  }
  constexpr absl::string_view kConstant = "constant:";
  if (absl::StartsWith(text, kConstant)) {
    double a = 0;
    if (!absl::SimpleAtod(absl::string_view(text).substr(kConstant.size()), &a) || !(a > 0) ||
        a > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("interpolation '", text,
                       "': the constant must be a number in (0, 1], e.g. constant:0.5"));
    }
    spec.constant = a;
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("interpolation '", text, "' is not one of constant:A, clock, loss"));
}

absl::StatusOr<OverlapStart> ParseOverlapStart(const std::string& text) {
  OverlapStart start;
  if (text.empty() || text == "contribution") return start;
  if (text == "extrapolate") {
    start.extrapolate = 1;
    return start;
  }
  constexpr absl::string_view kExtrapolate = "extrapolate:";
  if (absl::StartsWith(text, kExtrapolate)) {
    double b = 0;
    if (!absl::SimpleAtod(absl::string_view(text).substr(kExtrapolate.size()), &b) || !(b > 0) ||
        b > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "overlap start '", text, "': B of extrapolate:B must be a number in (0, 2]"));
    }
    start.extrapolate = b;
    return start;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "overlap start '", text, "' is not one of contribution, extrapolate, extrapolate:B"));
}

absl::StatusOr<std::vector<int64_t>> ParseInputShape(const std::string& text) {
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0 || v > kMaxInputDim) {
      return absl::InvalidArgumentError(
          absl::StrCat("--input_shape must be channels,height,width (integers in [1, ",
                       kMaxInputDim, "]), got '", text, "'"));
    }
    shape.push_back(v);
  }
  if (shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--input_shape must have 3 numbers (channels,height,width), got '", text, "'"));
  }
  return shape;
}

}  // namespace shoal
