// The hierarchical round's plan (docs/SUPERNODES.md, "The hierarchical
// round"): a pure function from the round's participants (in plan order,
// with their zones) and the zones' heads to the stages of
// RoundPlan.hierarchy. No clock, no threads, no gRPC.
//
// The zone tree holds every participant's zone and all its ancestors, up to
// the root "". Bottom-up, each zone Z with participants below it has a
// group of candidates: its direct members (participants whose zone is Z,
// weight 1) and the heads of its child zones (weight: the number of
// participants under that child). The head of Z is one of its candidates.
//  - AVERAGE stages, deepest level first: at each level, one group per zone
//    of that level with at least two candidates; the members end with the
//    weighted mean of their inputs, so the head of Z holds the plain mean
//    of every participant under Z.
//  - BROADCAST stages, from level 1 down to the deepest: every member of
//    Z's group (below the root) copies the whole model from the head of Z,
//    which holds the final model by then (it is a member of the parent's
//    group, averaged or broadcast one stage earlier).
// Groups of one member do nothing and are left out, and so are stages left
// empty. With fewer than two distinct zones among the participants the
// hierarchy is empty: the round is flat.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_HIERARCHY_PLAN_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_HIERARCHY_PLAN_H_

#include <map>
#include <string>
#include <vector>

#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

struct HierarchyParticipant {
  std::string id;
  // A valid zone path (common/zone.h); "" = the root.
  std::string zone;
};

// Who leads each zone: zone path -> participant id. The supernode election
// (zone_election.*) fills it; a zone that is missing, or whose named head is
// not one of the zone's candidates (it left, or is not a candidate by the
// bottom-up rule), gets the default: the smallest id (in string order: "w10" < "w2") among its
// candidates.
using ZoneHeads = std::map<std::string, std::string>;

struct HierarchyPlan {
  // Empty (no stages) when the round is flat.
  shoal::v1::RoundHierarchy hierarchy;
  // The head chosen for every zone of the tree (the root included).
  ZoneHeads heads;
  // The number of participants under every zone of the tree.
  std::map<std::string, uint32_t> sizes;
};

// `participants` in plan order (the indices of the groups refer to it);
// ids are distinct.
HierarchyPlan BuildHierarchyPlan(const std::vector<HierarchyParticipant>& participants,
                                 const ZoneHeads& heads);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_HIERARCHY_PLAN_H_
