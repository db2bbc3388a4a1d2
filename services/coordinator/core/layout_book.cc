#include "services/coordinator/core/layout_book.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/model_layout.h"

namespace shoal::coordinator {

void LayoutBook::Resume(const shoal::v1::RunRecord& record) {
  if (!record.has_layout() || record.layout().tensors().empty()) return;
  layout_ = record.layout();
  declared_by_ = "from the run record";
}

void LayoutBook::FillRecord(shoal::v1::RunRecord* record) const {
  if (layout_) *record->mutable_layout() = *layout_;
}

absl::Status LayoutBook::Check(const shoal::v1::ModelLayout& layout) const {
  shoal::v1::ModelLayout sealed = layout;
  if (absl::Status s = SealLayout(&sealed); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("JoinRequest.layout: ", s.message()));
  }
  if (!layout.hash().empty() && layout.hash() != sealed.hash()) {
    return absl::InvalidArgumentError(
        absl::StrCat("JoinRequest.layout: its hash ", layout.hash().substr(0, 12),
                     " is not the hash of its tensors (", sealed.hash().substr(0, 12), ")"));
  }
  if (!layout_) return absl::OkStatus();
  return CompareLayouts(*layout_, sealed, declared_by_);
}

bool LayoutBook::Record(const std::string& worker_id, const shoal::v1::ModelLayout& layout) {
  if (layout_) return false;
  layout_ = layout;
  layout_->set_hash(LayoutHash(layout));
  declared_by_ = absl::StrCat("declared by ", worker_id);
  SHOAL_LOG(INFO) << "the run's model layout: " << layout_->tensors_size() << " tensors, hash "
                  << layout_->hash().substr(0, 12) << " (" << declared_by_ << ")";
  return true;
}

}  // namespace shoal::coordinator
