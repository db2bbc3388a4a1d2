// The participant list a worker keeps from the last full RoundPlan, so
// that plans naming the same list by version (RoundPlan.participants_version)
// can be expanded into slices here.
#ifndef SHOAL_SERVICES_WORKER_CORE_PLAN_LIST_H_
#define SHOAL_SERVICES_WORKER_CORE_PLAN_LIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

class PlanList {
 public:
  // A plan with slices: keeps its list (when it names a version) and leaves
  // the plan as it is. A plan without slices: fills them in from the kept
  // list with the shard formula (weighted by the kept shares:
  // common/shard_plan.h PlanSlicesWeighted). FAILED_PRECONDITION when it names a list
  // this worker was never given (the caller re-joins to get it again).
  absl::Status Expand(shoal::v1::RoundPlan* plan);

  // Peer addresses of the kept list, in plan order (empty before any).
  std::vector<std::string> Addresses() const;

 private:
  uint64_t version_ = 0;
  std::vector<std::pair<std::string, std::string>> members_;  // id, address
  std::vector<bool> outbound_;  // SliceAssignment.outbound_only, the same order
  std::vector<uint32_t> shares_;  // SliceAssignment.share, the same order
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_PLAN_LIST_H_
