#include "services/worker/core/plan_list.h"

#include "absl/strings/str_cat.h"
#include "common/shard_plan.h"
#include "services/worker/core/averaging_steps.h"

namespace shoal::worker {

absl::Status PlanList::Expand(shoal::v1::RoundPlan* plan) {
  if (plan->slices_size() > 0) {
    if (plan->participants_version() != 0) {
      version_ = plan->participants_version();
      members_.clear();
      outbound_.clear();
      shares_.clear();
      for (const auto& s : plan->slices()) {
        members_.emplace_back(s.worker_id(), s.peer_address());
        outbound_.push_back(s.outbound_only());
        shares_.push_back(s.share());
      }
    }
    return absl::OkStatus();
  }
  if (plan->participants_version() == 0 || plan->participants_version() != version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the plan of round ", plan->round(), " uses participant list ",
                     plan->participants_version(), ", this worker holds list ", version_));
  }
  const std::vector<SliceRange> ranges =
      PlanSlicesWeighted(FragmentRange(*plan), outbound_, shares_);
  plan->mutable_slices()->Reserve(static_cast<int>(members_.size()));
  for (size_t k = 0; k < members_.size(); ++k) {
    auto* s = plan->add_slices();
    s->set_worker_id(members_[k].first);
    s->set_peer_address(members_[k].second);
    s->set_begin(ranges[k].begin);
    s->set_end(ranges[k].end);
    s->set_outbound_only(outbound_[k]);
    s->set_share(shares_[k]);
  }
  return absl::OkStatus();
}

std::vector<std::string> PlanList::Addresses() const {
  std::vector<std::string> out;
  out.reserve(members_.size());
  for (const auto& [id, address] : members_) out.push_back(address);
  return out;
}

}  // namespace shoal::worker
