// The run's model layout (common/model_layout.h): the first layout a
// joining worker declares becomes the run's and goes into the run record;
// every later declaration must match it. The coordinator never learns more
// about the model than this (docs/PYTHON.md "Any model").
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_LAYOUT_BOOK_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_LAYOUT_BOOK_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// Not thread-safe (the engine's lock).
class LayoutBook {
 public:
  // The layout of a resumed run, or the record a new leader took over.
  void Resume(const shoal::v1::RunRecord& record);
  void FillRecord(shoal::v1::RunRecord* record) const;

  // A join's layout: INVALID_ARGUMENT when it is malformed (no tensors, a
  // repeated name, a hash that is not its own), FAILED_PRECONDITION naming
  // the first tensor that differs from the run's.
  absl::Status Check(const shoal::v1::ModelLayout& layout) const;
  // Makes `layout` (checked) the run's when the run has none; true then.
  bool Record(const std::string& worker_id, const shoal::v1::ModelLayout& layout);

  const shoal::v1::ModelLayout* layout() const { return layout_ ? &*layout_ : nullptr; }

 private:
  std::optional<shoal::v1::ModelLayout> layout_;
  std::string declared_by_;  // "declared by w1", or "from the run record"
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_LAYOUT_BOOK_H_
