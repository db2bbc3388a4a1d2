#include "services/coordinator/core/hierarchy_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using Stage = shoal::v1::HierarchyStage;

std::vector<uint32_t> Members(const shoal::v1::HierarchyGroup& g) {
  return {g.members().begin(), g.members().end()};
}
std::vector<uint32_t> Weights(const shoal::v1::HierarchyGroup& g) {
  return {g.weights().begin(), g.weights().end()};
}

TEST(HierarchyPlanTest, OneZoneIsFlat) {
  HierarchyPlan p =
      BuildHierarchyPlan({{"a", "eu/paris"}, {"b", "eu/paris"}, {"c", "eu/paris"}}, {});
  EXPECT_EQ(p.hierarchy.stages_size(), 0);
  EXPECT_EQ(BuildHierarchyPlan({{"a", ""}, {"b", ""}}, {}).hierarchy.stages_size(), 0);
  EXPECT_EQ(BuildHierarchyPlan({}, {}).hierarchy.stages_size(), 0);
}

TEST(HierarchyPlanTest, TwoSites) {
  // Plan order mixes the sites; groups name plan indices.
  HierarchyPlan p = BuildHierarchyPlan(
      {{"w3", "paris"}, {"w1", "berlin"}, {"w2", "paris"}, {"w4", "berlin"}, {"w5", "berlin"}}, {});
  ASSERT_EQ(p.hierarchy.stages_size(), 3);
  const Stage& leaf = p.hierarchy.stages(0);
  EXPECT_EQ(leaf.kind(), Stage::AVERAGE);
  ASSERT_EQ(leaf.groups_size(), 2);
  EXPECT_EQ(leaf.groups(0).zone(), "berlin");
  EXPECT_THAT(Members(leaf.groups(0)), ElementsAre(1, 3, 4));
  EXPECT_THAT(Weights(leaf.groups(0)), ElementsAre(1, 1, 1));  // a plain mean
  EXPECT_EQ(leaf.groups(1).zone(), "paris");
  EXPECT_THAT(Members(leaf.groups(1)), ElementsAre(0, 2));
  // Heads: the smallest id of each site; the root averages them by size.
  EXPECT_EQ(p.heads.at("berlin"), "w1");
  EXPECT_EQ(p.heads.at("paris"), "w2");
  EXPECT_EQ(p.heads.at(""), "w1");
  const Stage& root = p.hierarchy.stages(1);
  EXPECT_EQ(root.kind(), Stage::AVERAGE);
  ASSERT_EQ(root.groups_size(), 1);
  EXPECT_EQ(root.groups(0).zone(), "");
  EXPECT_THAT(Members(root.groups(0)), ElementsAre(1, 2));
  EXPECT_THAT(Weights(root.groups(0)), ElementsAre(3, 2));
  const Stage& down = p.hierarchy.stages(2);
  EXPECT_EQ(down.kind(), Stage::BROADCAST);
  ASSERT_EQ(down.groups_size(), 2);
  EXPECT_EQ(down.groups(0).head(), 1u);
  EXPECT_THAT(Members(down.groups(0)), ElementsAre(1, 3, 4));
  EXPECT_EQ(down.groups(1).head(), 2u);
  EXPECT_EQ(p.sizes.at(""), 5u);
}

TEST(HierarchyPlanTest, NestedZonesAndDirectMembers) {
  // eu has two racks and one direct member; us has one worker.
  HierarchyPlan p = BuildHierarchyPlan(
      {{"a", "eu/r1"}, {"b", "eu/r1"}, {"c", "eu/r2"}, {"d", "eu/r2"}, {"e", "eu"}, {"f", "us"}},
      {});
  ASSERT_EQ(p.hierarchy.stages_size(), 5);
  // Level 2: the racks.
  EXPECT_EQ(p.hierarchy.stages(0).kind(), Stage::AVERAGE);
  ASSERT_EQ(p.hierarchy.stages(0).groups_size(), 2);
  EXPECT_THAT(Members(p.hierarchy.stages(0).groups(0)), ElementsAre(0, 1));
  EXPECT_THAT(Members(p.hierarchy.stages(0).groups(1)), ElementsAre(2, 3));
  // Level 1: eu = its direct member and the racks' heads; us is alone.
  ASSERT_EQ(p.hierarchy.stages(1).groups_size(), 1);
  const auto& eu = p.hierarchy.stages(1).groups(0);
  EXPECT_EQ(eu.zone(), "eu");
  EXPECT_THAT(Members(eu), ElementsAre(0, 2, 4));
  EXPECT_THAT(Weights(eu), ElementsAre(2, 2, 1));
  // Root: the heads of eu and us, weighted 5 and 1.
  const auto& root = p.hierarchy.stages(2).groups(0);
  EXPECT_THAT(Members(root), ElementsAre(0, 5));
  EXPECT_THAT(Weights(root), ElementsAre(5, 1));
  // Down: eu first, then the racks.
  EXPECT_EQ(p.hierarchy.stages(3).kind(), Stage::BROADCAST);
  ASSERT_EQ(p.hierarchy.stages(3).groups_size(), 1);
  EXPECT_EQ(p.hierarchy.stages(3).groups(0).zone(), "eu");
  EXPECT_EQ(p.hierarchy.stages(3).groups(0).head(), 0u);
  EXPECT_EQ(p.hierarchy.stages(4).kind(), Stage::BROADCAST);
  EXPECT_EQ(p.hierarchy.stages(4).groups_size(), 2);
}

TEST(HierarchyPlanTest, WeightsAreLeafCountsSummingToAll) {
  // A chain (x/y/z with one worker under x/y) and a root direct member.
  HierarchyPlan p = BuildHierarchyPlan(
      {{"a", "x/y/z"}, {"b", "x/y/z"}, {"c", "x/y/z"}, {"d", ""}, {"e", "x"}}, {});
  // x/y has a single candidate (z's head): no group of its own.
  const Stage& last_up = p.hierarchy.stages(2);
  ASSERT_EQ(last_up.kind(), Stage::AVERAGE);
  const auto& root = last_up.groups(0);
  EXPECT_EQ(root.zone(), "");
  EXPECT_THAT(Members(root), ElementsAre(0, 3));
  EXPECT_THAT(Weights(root), ElementsAre(4, 1));
  for (const Stage& s : p.hierarchy.stages()) {
    for (const auto& g : s.groups()) {
      EXPECT_NE(g.zone(), "x/y");
      EXPECT_GE(g.members_size(), 2);
    }
  }
  EXPECT_EQ(p.sizes.at("x/y"), 3u);
  EXPECT_EQ(p.sizes.at("x"), 4u);
}

TEST(HierarchyPlanTest, GivenHeadsAreUsedWhenTheyAreCandidates) {
  HierarchyPlan p = BuildHierarchyPlan({{"a", "p"}, {"b", "p"}, {"c", "q"}, {"d", "q"}},
                                       {{"p", "b"}, {"q", "zz-gone"}, {"", "a"}});
  EXPECT_EQ(p.heads.at("p"), "b");
  EXPECT_EQ(p.heads.at("q"), "c");  // zz-gone is no candidate: the default
  // "a" is not a candidate of the root (only the heads b and c are).
  EXPECT_EQ(p.heads.at(""), "b");
  EXPECT_THAT(Members(p.hierarchy.stages(1).groups(0)), ElementsAre(1, 2));
  EXPECT_EQ(p.hierarchy.stages(2).groups(0).head(), 1u);
}

TEST(HierarchyPlanTest, GroupsOfAStageAreDisjoint) {
  std::vector<HierarchyParticipant> ps;
  const char* zones[] = {"a/b", "a/c", "a", "", "d/e/f", "d", "a/b", "d/e/f", "d/e"};
  for (int i = 0; i < 9; ++i) ps.push_back({"w" + std::to_string(i), zones[i]});
  HierarchyPlan p = BuildHierarchyPlan(ps, {});
  for (const Stage& s : p.hierarchy.stages()) {
    std::vector<int> seen(ps.size(), 0);
    for (const auto& g : s.groups()) {
      if (s.kind() == Stage::AVERAGE) {
        EXPECT_EQ(g.weights_size(), g.members_size());
      }
      for (uint32_t m : g.members()) ++seen[m];
    }
    for (int c : seen) EXPECT_LE(c, 1);
  }
  // The root's weights cover every participant.
  uint32_t root_weight = 0;
  for (const Stage& s : p.hierarchy.stages()) {
    for (const auto& g : s.groups()) {
      if (g.zone().empty()) {
        for (uint32_t w : g.weights()) root_weight += w;
      }
    }
  }
  EXPECT_EQ(root_weight, 9u);
}

}  // namespace
}  // namespace shoal::coordinator
