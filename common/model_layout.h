// A model's layout: the names, shapes and dtypes of its tensors in the order
// of the flat parameter buffer (shoal.v1.ModelLayout). Every worker declares
// the layout of the model it trains; the run keeps the first one and refuses
// a join whose layout differs, naming the first tensor that differs
// (docs/PYTHON.md "Any model"). Used by the coordinator, the C++ worker and
// the Python module alike.
#ifndef SHOAL_COMMON_MODEL_LAYOUT_H_
#define SHOAL_COMMON_MODEL_LAYOUT_H_

#include <string>

#include "absl/status/status.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal {

// SHA-256 (hex) of the tensors' names, dtypes and shapes, in order.
std::string LayoutHash(const shoal::v1::ModelLayout& layout);

// Sets layout->hash. INVALID_ARGUMENT for an empty layout, an empty or
// repeated name, or a negative dimension.
absl::Status SealLayout(shoal::v1::ModelLayout* layout);

// OK when `mine` matches `run`; otherwise FAILED_PRECONDITION that names
// the first tensor that differs ("tensor 'fc2.weight' is [10, 64] float32
// here, [10, 128] float32 in the run"), a missing or an extra one. `run_what`
// names where the run's layout came from ("declared by w1").
absl::Status CompareLayouts(const shoal::v1::ModelLayout& run, const shoal::v1::ModelLayout& mine,
                            const std::string& run_what);

// "[10, 128] float32".
std::string DescribeTensor(const shoal::v1::TensorSpec& t);

}  // namespace shoal

#endif  // SHOAL_COMMON_MODEL_LAYOUT_H_
