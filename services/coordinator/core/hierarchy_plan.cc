#include "services/coordinator/core/hierarchy_plan.h"

#include <algorithm>
#include <set>
#include <utility>

#include "common/zone.h"

namespace shoal::coordinator {
namespace {

size_t Depth(const std::string& zone) {
  return zone.empty() ? 0 : 1 + static_cast<size_t>(std::count(zone.begin(), zone.end(), '/'));
}

struct ZoneNode {
  // Candidates: (participant index, weight), sorted by index.
  std::vector<std::pair<uint32_t, uint32_t>> candidates;
  std::vector<std::string> children;
  uint32_t size = 0;
  uint32_t head = 0;
};

}  // namespace

HierarchyPlan BuildHierarchyPlan(const std::vector<HierarchyParticipant>& participants,
                                 const ZoneHeads& heads) {
  HierarchyPlan plan;
  std::set<std::string> leaf_zones;
  for (const HierarchyParticipant& p : participants) leaf_zones.insert(p.zone);
  if (leaf_zones.size() < 2) return plan;

  // The tree: every participant's zone and its ancestors.
  std::map<std::string, ZoneNode> tree;
  for (uint32_t i = 0; i < participants.size(); ++i) {
    std::string z = participants[i].zone;
    tree[z].candidates.emplace_back(i, 1);
    while (!z.empty()) {
      const std::string parent = ParentZone(z);
      ZoneNode& up = tree[parent];
      if (std::find(up.children.begin(), up.children.end(), z) == up.children.end()) {
        up.children.push_back(z);
      }
      z = parent;
    }
  }
  size_t max_depth = 0;
  std::vector<std::vector<std::string>> levels;
  for (const auto& [zone, node] : tree) max_depth = std::max(max_depth, Depth(zone));
  levels.resize(max_depth + 1);
  for (const auto& [zone, node] : tree) levels[Depth(zone)].push_back(zone);

  // Bottom-up: sizes, candidates and heads.
  for (size_t d = max_depth + 1; d-- > 0;) {
    for (const std::string& zone : levels[d]) {
      ZoneNode& node = tree[zone];
      node.size = static_cast<uint32_t>(node.candidates.size());
      for (const std::string& child : node.children) {
        const ZoneNode& c = tree[child];
        node.candidates.emplace_back(c.head, c.size);
        node.size += c.size;
      }
      std::sort(node.candidates.begin(), node.candidates.end());
      node.head = node.candidates.front().first;  // the smallest id, below
      for (const auto& [index, weight] : node.candidates) {
        if (participants[index].id < participants[node.head].id) node.head = index;
      }
      if (auto it = heads.find(zone); it != heads.end()) {
        for (const auto& [index, weight] : node.candidates) {
          if (participants[index].id == it->second) node.head = index;
        }
      }
      plan.heads[zone] = participants[node.head].id;
      plan.sizes[zone] = node.size;
    }
  }

  auto add_stage = [&plan](shoal::v1::HierarchyStage stage) {
    if (stage.groups_size() > 0) *plan.hierarchy.add_stages() = std::move(stage);
  };
  // Up: AVERAGE, deepest level first.
  for (size_t d = max_depth + 1; d-- > 0;) {
    shoal::v1::HierarchyStage stage;
    stage.set_kind(shoal::v1::HierarchyStage::AVERAGE);
    for (const std::string& zone : levels[d]) {
      const ZoneNode& node = tree[zone];
      if (node.candidates.size() < 2) continue;
      shoal::v1::HierarchyGroup* g = stage.add_groups();
      g->set_zone(zone);
      g->set_head(node.head);
      for (const auto& [index, weight] : node.candidates) {
        g->add_members(index);
        g->add_weights(weight);
      }
    }
    add_stage(std::move(stage));
  }
  // Down: BROADCAST from each zone's head, level 1 first (the root's
  // AVERAGE already left all its members with the final model).
  for (size_t d = 1; d <= max_depth; ++d) {
    shoal::v1::HierarchyStage stage;
    stage.set_kind(shoal::v1::HierarchyStage::BROADCAST);
    for (const std::string& zone : levels[d]) {
      const ZoneNode& node = tree[zone];
      if (node.candidates.size() < 2) continue;
      shoal::v1::HierarchyGroup* g = stage.add_groups();
      g->set_zone(zone);
      g->set_head(node.head);
      for (const auto& [index, weight] : node.candidates) g->add_members(index);
    }
    add_stage(std::move(stage));
  }
  return plan;
}

}  // namespace shoal::coordinator
