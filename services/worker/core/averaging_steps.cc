#include "services/worker/core/averaging_steps.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace shoal::worker {
namespace {

using shoal::v1::HierarchyGroup;
using shoal::v1::HierarchyStage;

// The position of plan index `participant` in `group`, or -1.
int PositionIn(const HierarchyGroup& group, int participant) {
  for (int k = 0; k < group.members_size(); ++k) {
    if (static_cast<int>(group.members(k)) == participant) return k;
  }
  return -1;
}

// Length-prefixed, so that no two field lists hash alike.
void HashField(Sha256* h, const std::string& field) {
  const uint64_t size = field.size();
  h->Update(&size, sizeof(size));
  h->Update(field.data(), field.size());
}

GroupMember MemberOf(const shoal::v1::RoundPlan& plan, int participant) {
  const shoal::v1::SliceAssignment& s = plan.slices(participant);
  return {s.worker_id(), s.peer_address(), s.outbound_only()};
}

}  // namespace

absl::Status CheckHierarchy(const shoal::v1::RoundHierarchy& hierarchy, int n) {
  for (int s = 0; s < hierarchy.stages_size(); ++s) {
    const HierarchyStage& stage = hierarchy.stages(s);
    const std::string where = absl::StrCat("hierarchy stage ", s + 1);
    if (stage.kind() != HierarchyStage::AVERAGE && stage.kind() != HierarchyStage::BROADCAST) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": kind must be AVERAGE or BROADCAST"));
    }
    std::vector<bool> seen(static_cast<size_t>(n), false);
    for (const HierarchyGroup& g : stage.groups()) {
      if (g.members_size() < 2) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a group of ", g.members_size(),
                                                       " members (zone '", g.zone(), "')"));
      }
      for (uint32_t m : g.members()) {
        if (m >= static_cast<uint32_t>(n)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": member ", m, " is not one of the ", n, " participants"));
        }
        if (seen[m]) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": participant ", m, " sits in two groups or twice in one"));
        }
        seen[m] = true;
      }
      if (stage.kind() == HierarchyStage::AVERAGE) {
        if (g.weights_size() != g.members_size()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": ", g.weights_size(),
                                                         " weights for ", g.members_size(),
                                                         " members (zone '", g.zone(), "')"));
        }
        for (uint32_t w : g.weights()) {
          if (w == 0) return absl::InvalidArgumentError(absl::StrCat(where, ": a zero weight"));
        }
      } else if (PositionIn(g, static_cast<int>(g.head())) < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": head ", g.head(), " is not a member of its group"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::vector<std::string>> GroupIdentities(const shoal::v1::RoundPlan& plan) {
  const int n = plan.slices_size();
  // What participant k brings to the next group it sits in.
  std::vector<std::string> brings(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) brings[k] = "trained model of " + plan.slices(k).worker_id();
  std::vector<std::vector<std::string>> out;
  for (const HierarchyStage& stage : plan.hierarchy().stages()) {
    std::vector<std::string>& ids = out.emplace_back();
    for (const HierarchyGroup& g : stage.groups()) {
      Sha256 h;
      const SliceRange fragment = FragmentRange(plan);
      HashField(&h, absl::StrCat("round ", plan.round(), " of ", plan.total_elements(), " [",
                                 fragment.begin, ", ", fragment.end, ")"));
      HashField(&h, HierarchyStage::Kind_Name(stage.kind()));
      HashField(&h, g.zone());
      for (int k = 0; k < g.members_size(); ++k) {
        const int m = static_cast<int>(g.members(k));
        HashField(&h, plan.slices(m).worker_id());
        HashField(&h, stage.kind() == HierarchyStage::AVERAGE ? absl::StrCat(g.weights(k)) : "");
        HashField(&h, brings[m]);
      }
      if (stage.kind() == HierarchyStage::BROADCAST) {
        HashField(&h, plan.slices(static_cast<int>(g.head())).worker_id());
      }
      ids.push_back(h.HexDigest());
      for (uint32_t m : g.members()) brings[m] = ids.back();
    }
  }
  return out;
}

SliceRange FragmentRange(const shoal::v1::RoundPlan& plan) {
  if (plan.fragment_begin() == 0 && plan.fragment_end() == 0) return {0, plan.total_elements()};
  return {plan.fragment_begin(), plan.fragment_end()};
}

absl::StatusOr<std::vector<GroupStep>> PlanSteps(const shoal::v1::RoundPlan& plan,
                                                 const std::string& self_id, uint64_t total) {
  const int n = plan.slices_size();
  int self = -1;
  for (int k = 0; k < n; ++k) {
    if (plan.slices(k).worker_id() == self_id) self = k;
  }
  if (self < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan of round ", plan.round(), " has no slice for ", self_id));
  }
  if (plan.total_elements() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan is for ", plan.total_elements(), " elements, the model has ", total));
  }
  const SliceRange fragment = FragmentRange(plan);
  if (fragment.begin >= fragment.end || fragment.end > total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the fragment [", fragment.begin, ", ", fragment.end, ") of the plan of round ",
        plan.round(), " is not a part of the model of ", total, " elements"));
  }
  std::vector<GroupStep> steps;
  if (!plan.has_hierarchy() || plan.hierarchy().stages_size() == 0) {
    GroupStep& step = steps.emplace_back();
    step.self = self;
    for (int k = 0; k < n; ++k) {
      const shoal::v1::SliceAssignment& s = plan.slices(k);
      if (s.begin() > s.end() || s.begin() < fragment.begin || s.end() > fragment.end) {
        return absl::InvalidArgumentError(
            absl::StrCat("slice [", s.begin(), ", ", s.end(), ") of ", s.worker_id(),
                         " is outside the part [", fragment.begin, ", ", fragment.end,
                         ") of the model of ", total, " elements the round averages"));
      }
      step.members.push_back(MemberOf(plan, k));
      step.weights.push_back(1);
      step.slices.push_back({s.begin(), s.end()});
    }
    return steps;
  }
  if (absl::Status s = CheckHierarchy(plan.hierarchy(), n); !s.ok()) return s;
  const std::vector<std::vector<std::string>> identities = GroupIdentities(plan);
  // The ranges each participant holds its model as, so far: its own
  // trained model is one whole range until a group averages it.
  std::vector<std::vector<SliceRange>> pieces(static_cast<size_t>(n),
                                              std::vector<SliceRange>{fragment});
  const auto& stages = plan.hierarchy().stages();
  for (int s = 0; s < stages.size(); ++s) {
    const HierarchyStage& stage = stages[s];
    // Broadcast members take the head's pieces as they were before this
    // stage: gather the updates, apply them after the stage's groups.
    std::vector<std::pair<int, std::vector<SliceRange>>> updates;
    for (int g = 0; g < stage.groups_size(); ++g) {
      const HierarchyGroup& group = stage.groups(g);
      const int m = group.members_size();
      if (stage.kind() == HierarchyStage::AVERAGE) {
        const std::vector<SliceRange> slices =
            PlanSlicesAmong(fragment, std::vector<bool>(static_cast<size_t>(m), false));
        for (uint32_t p : group.members()) updates.emplace_back(static_cast<int>(p), slices);
      } else {
        for (uint32_t p : group.members()) {
          updates.emplace_back(static_cast<int>(p), pieces[group.head()]);
        }
      }
      const int position = PositionIn(group, self);
      if (position < 0) continue;
      GroupStep& step = steps.emplace_back();
      step.kind = stage.kind() == HierarchyStage::AVERAGE ? GroupStep::Kind::kAverage
                                                          : GroupStep::Kind::kBroadcast;
      step.stage = static_cast<uint32_t>(s) + 1;
      step.zone = group.zone();
      step.self = position;
      step.identity = identities[s][g];
      for (uint32_t p : group.members())
        step.members.push_back(MemberOf(plan, static_cast<int>(p)));
      if (step.kind == GroupStep::Kind::kAverage) {
        step.weights.assign(group.weights().begin(), group.weights().end());
        step.slices = PlanSlicesAmong(fragment, std::vector<bool>(static_cast<size_t>(m), false));
      } else {
        step.head = PositionIn(group, static_cast<int>(group.head()));
        step.pieces = pieces[group.head()];
      }
    }
    for (auto& [p, ranges] : updates) pieces[p] = std::move(ranges);
  }
  return steps;
}

}  // namespace shoal::worker
