#include "services/worker/core/aggregation.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shoal::worker {
namespace {

// A float's bits as a signed integer ordered like IEEE 754 totalOrder:
// negative floats have their magnitude bits flipped so that larger
// magnitudes compare lower. A bijection, so sorting keys sorts the values
// and every bit pattern (-0 and +0, each NaN payload) has one place.
inline int32_t OrderKey(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof(i));
  return i ^ ((i >> 31) & 0x7FFFFFFF);
}

inline float FromKey(int32_t key) {
  const int32_t i = key ^ ((key >> 31) & 0x7FFFFFFF);
  float f;
  std::memcpy(&f, &i, sizeof(f));
  return f;
}

// Sorts a handful of keys: insertion sort beats std::sort's set-up for the
// few contributions of a slice (one per participant).
inline void SortKeys(int32_t* keys, size_t n) {
  if (n > 32) {
    std::sort(keys, keys + n);
    return;
  }
  for (size_t i = 1; i < n; ++i) {
    const int32_t v = keys[i];
    size_t j = i;
    for (; j > 0 && keys[j - 1] > v; --j) keys[j] = keys[j - 1];
    keys[j] = v;
  }
}

}  // namespace

AggregationSpec EffectiveAggregation(const AggregationSpec& spec, size_t n) {
  if (spec.kind == AggregationSpec::Kind::kTrimmedMean && n < 2 * size_t{spec.trim} + 1) {
    return AggregationSpec{AggregationSpec::Kind::kMedian, 0};
  }
  return spec;
}

absl::StatusOr<AggregationSpec> CombineContributions(const AggregationSpec& spec,
                                                     absl::Span<const float* const> inputs,
                                                     size_t count, float* out) {
  const size_t n = inputs.size();
  if (n == 0) return absl::InvalidArgumentError("no contribution to combine");
  for (size_t k = 0; k < n; ++k) {
    if (inputs[k] == nullptr && count > 0) {
      return absl::InvalidArgumentError(absl::StrCat("contribution ", k, " is missing"));
    }
  }
  const AggregationSpec rule = EffectiveAggregation(spec, n);
  if (rule.kind == AggregationSpec::Kind::kMean) {
    const float divisor = static_cast<float>(n);
    for (size_t i = 0; i < count; ++i) {
      float sum = inputs[0][i];
      for (size_t k = 1; k < n; ++k) sum += inputs[k][i];
      out[i] = sum / divisor;
    }
    return rule;
  }
  // Kept values: [lo, hi) of the sorted keys.
  size_t lo = 0, hi = n;
  if (rule.kind == AggregationSpec::Kind::kTrimmedMean) {
    lo = rule.trim;
    hi = n - rule.trim;
  } else {  // median
    lo = (n - 1) / 2;
    hi = n / 2 + 1;
  }
  const double kept = static_cast<double>(hi - lo);
  std::vector<int32_t> keys(n);
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < n; ++k) keys[k] = OrderKey(inputs[k][i]);
    SortKeys(keys.data(), n);
    if (hi - lo == 1) {
      out[i] = FromKey(keys[lo]);  // the middle value itself, bit for bit
      continue;
    }
    double sum = 0;
    for (size_t k = lo; k < hi; ++k) sum += FromKey(keys[k]);
    out[i] = static_cast<float>(sum / kept);
  }
  return rule;
}

absl::StatusOr<AggregationSpec> CombineWeighted(const AggregationSpec& spec,
                                                absl::Span<const float* const> inputs,
                                                absl::Span<const uint32_t> weights, size_t count,
                                                float* out) {
  const size_t n = inputs.size();
  if (n == 0) return absl::InvalidArgumentError("no contribution to combine");
  if (weights.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights.size(), " weights for ", n, " contributions"));
  }
  uint64_t total = 0;
  bool unit = true;
  for (size_t k = 0; k < n; ++k) {
    if (weights[k] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("contribution ", k, " has weight 0"));
    }
    if (inputs[k] == nullptr && count > 0) {
      return absl::InvalidArgumentError(absl::StrCat("contribution ", k, " is missing"));
    }
    total += weights[k];
    unit = unit && weights[k] == 1;
  }
  if (unit) return CombineContributions(spec, inputs, count, out);
  const AggregationSpec rule = EffectiveAggregation(spec, total);
  if (rule.kind == AggregationSpec::Kind::kMean) {
    const float divisor = static_cast<float>(total);
    for (size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (size_t k = 0; k < n; ++k) sum += static_cast<float>(weights[k]) * inputs[k][i];
      out[i] = sum / divisor;
    }
    return rule;
  }
  // Kept units of weight: [lo, hi) of the expanded, sorted values.
  uint64_t lo = 0, hi = total;
  if (rule.kind == AggregationSpec::Kind::kTrimmedMean) {
    lo = rule.trim;
    hi = total - rule.trim;
  } else {  // median
    lo = (total - 1) / 2;
    hi = total / 2 + 1;
  }
  const double kept = static_cast<double>(hi - lo);
  // (key, weight) pairs sorted by key; small n: insertion sort.
  std::vector<std::pair<int32_t, uint32_t>> values(n);
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < n; ++k) values[k] = {OrderKey(inputs[k][i]), weights[k]};
    for (size_t a = 1; a < n; ++a) {
      const auto v = values[a];
      size_t b = a;
      for (; b > 0 && values[b - 1].first > v.first; --b) values[b] = values[b - 1];
      values[b] = v;
    }
    double sum = 0;
    uint64_t at = 0;  // units before values[k]
    int32_t single = 0;
    for (size_t k = 0; k < n && at < hi; ++k) {
      const uint64_t from = std::max(at, lo);
      const uint64_t to = std::min<uint64_t>(at + values[k].second, hi);
      if (from < to) {
        single = values[k].first;
        sum += static_cast<double>(to - from) * FromKey(values[k].first);
      }
      at += values[k].second;
    }
    // One kept unit: the value itself, bit for bit.
    out[i] = hi - lo == 1 ? FromKey(single) : static_cast<float>(sum / kept);
  }
  return rule;
}

}  // namespace shoal::worker
