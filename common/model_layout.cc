#include "common/model_layout.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"

namespace shoal {

std::string DescribeTensor(const shoal::v1::TensorSpec& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "] ",
                      t.dtype().empty() ? "float32" : t.dtype());
}

std::string LayoutHash(const shoal::v1::ModelLayout& layout) {
  Sha256 sha;
  for (const shoal::v1::TensorSpec& t : layout.tensors()) {
    // Length-prefixed name, then dtype and shape: no two layouts share a text.
    const std::string line =
        absl::StrCat(t.name().size(), ":", t.name(), " ", DescribeTensor(t), "\n");
    sha.Update(line.data(), line.size());
  }
  return sha.HexDigest();
}

absl::Status SealLayout(shoal::v1::ModelLayout* layout) {
  if (layout->tensors().empty()) {
    return absl::InvalidArgumentError("a model layout needs at least one tensor");
  }
  std::set<std::string> names;
  for (const shoal::v1::TensorSpec& t : layout->tensors()) {
    if (t.name().empty()) return absl::InvalidArgumentError("a tensor of the layout has no name");
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name(), "' appears twice in the layout"));
    }
    for (int64_t d : t.shape()) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name(), "' has a negative dimension"));
      }
    }
  }
  layout->set_hash(LayoutHash(*layout));
  return absl::OkStatus();
}

absl::Status CompareLayouts(const shoal::v1::ModelLayout& run, const shoal::v1::ModelLayout& mine,
                            const std::string& run_what) {
  if (LayoutHash(run) == LayoutHash(mine)) return absl::OkStatus();
  const std::string intro =
      absl::StrCat("this worker's model does not match the run's (", run_what, "): ");
  const int n = std::min(run.tensors_size(), mine.tensors_size());
  for (int i = 0; i < n; ++i) {
    const shoal::v1::TensorSpec& a = run.tensors(i);
    const shoal::v1::TensorSpec& b = mine.tensors(i);
    if (a.name() != b.name()) {
      return absl::FailedPreconditionError(
          absl::StrCat(intro, "tensor ", i + 1, " is '", b.name(), "' ", DescribeTensor(b),
                       " here, '", a.name(), "' ", DescribeTensor(a), " in the run"));
    }
    if (DescribeTensor(a) != DescribeTensor(b)) {
      return absl::FailedPreconditionError(absl::StrCat(intro, "tensor '", a.name(), "' is ",
                                                        DescribeTensor(b), " here, ",
                                                        DescribeTensor(a), " in the run"));
    }
  }
  if (run.tensors_size() > n) {
    const shoal::v1::TensorSpec& a = run.tensors(n);
    return absl::FailedPreconditionError(absl::StrCat(
        intro, "tensor '", a.name(), "' ", DescribeTensor(a), " of the run is missing here"));
  }
  const shoal::v1::TensorSpec& b = mine.tensors(n);
  return absl::FailedPreconditionError(absl::StrCat(intro, "tensor '", b.name(), "' ",
                                                    DescribeTensor(b), " here is not in the run"));
}

}  // namespace shoal
