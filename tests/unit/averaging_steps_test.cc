// The steps a plan asks of one worker (core/averaging_steps.h): a flat plan
// is one step of every participant with the plan's slices; a hierarchical
// plan gives the worker's groups in stage order, with sharded slices over
// each AVERAGE group and, for a broadcast, the pieces the head holds its
// model as (the slices of the last group it averaged in, or what it copied
// in an earlier broadcast).
#include "services/worker/core/averaging_steps.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shoal::worker {
namespace {

constexpr uint64_t kTotal = 1000;

shoal::v1::RoundPlan Plan(int n) {
  shoal::v1::RoundPlan plan;
  plan.set_round(3);
  plan.set_attempt(1);
  plan.set_total_elements(kTotal);
  const std::vector<SliceRange> slices = PlanSlices(kTotal, n);
  for (int k = 0; k < n; ++k) {
    auto* s = plan.add_slices();
    s->set_worker_id(absl::StrCat("w", k + 1));
    s->set_peer_address(absl::StrCat("10.0.0.", k + 1, ":1"));
    s->set_begin(slices[k].begin);
    s->set_end(slices[k].end);
  }
  return plan;
}

void AddGroup(shoal::v1::HierarchyStage* stage, std::vector<uint32_t> members,
              std::vector<uint32_t> weights, uint32_t head = 0, std::string zone = "") {
  auto* g = stage->add_groups();
  for (uint32_t m : members) g->add_members(m);
  for (uint32_t w : weights) g->add_weights(w);
  g->set_head(head);
  g->set_zone(zone);
}

shoal::v1::HierarchyStage* AddStage(shoal::v1::RoundPlan* plan,
                                    shoal::v1::HierarchyStage::Kind kind) {
  auto* s = plan->mutable_hierarchy()->add_stages();
  s->set_kind(kind);
  return s;
}

TEST(AveragingStepsTest, AFlatPlanIsOneStepWithThePlansSlices) {
  shoal::v1::RoundPlan plan = Plan(3);
  plan.mutable_slices(2)->set_outbound_only(true);
  absl::StatusOr<std::vector<GroupStep>> steps = PlanSteps(plan, "w2", kTotal);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 1u);
  const GroupStep& step = steps->front();
  EXPECT_EQ(step.kind, GroupStep::Kind::kAverage);
  EXPECT_EQ(step.stage, 0u);
  EXPECT_EQ(step.self, 1);
  ASSERT_EQ(step.members.size(), 3u);
  EXPECT_TRUE(step.members[2].outbound_only);
  EXPECT_EQ(step.weights, (std::vector<uint32_t>{1, 1, 1}));
  EXPECT_EQ(step.own().begin, plan.slices(1).begin());
  EXPECT_EQ(step.own().end, plan.slices(1).end());
  EXPECT_TRUE(step.identity.empty());
}

TEST(AveragingStepsTest, RefusesAStrangerAnotherModelAndSlicesOutside) {
  shoal::v1::RoundPlan plan = Plan(2);
  EXPECT_EQ(PlanSteps(plan, "w9", kTotal).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanSteps(plan, "w1", kTotal + 1).status().code(), absl::StatusCode::kInvalidArgument);
  plan.mutable_slices(1)->set_end(kTotal + 5);
  EXPECT_EQ(PlanSteps(plan, "w1", kTotal).status().code(), absl::StatusCode::kInvalidArgument);
}

// Three levels: zones eu/paris {0, 1}, eu/berlin {2, 3} under eu, and us {4, 5}.
// Heads: 0 (paris, and eu), 2 (berlin), 4 (us).
shoal::v1::RoundPlan ThreeLevels() {
  shoal::v1::RoundPlan plan = Plan(6);
  using K = shoal::v1::HierarchyStage;
  auto* leaf = AddStage(&plan, K::AVERAGE);
  AddGroup(leaf, {0, 1}, {1, 1}, 0, "eu/paris");
  AddGroup(leaf, {2, 3}, {1, 1}, 0, "eu/berlin");
  AddGroup(leaf, {4, 5}, {1, 1}, 0, "us");
  AddGroup(AddStage(&plan, K::AVERAGE), {0, 2}, {2, 2}, 0, "eu");
  AddGroup(AddStage(&plan, K::AVERAGE), {0, 4}, {4, 2}, 0, "");
  auto* down1 = AddStage(&plan, K::BROADCAST);
  AddGroup(down1, {0, 2}, {}, 0, "eu");
  AddGroup(down1, {4, 5}, {}, 4, "us");
  auto* down2 = AddStage(&plan, K::BROADCAST);
  AddGroup(down2, {0, 1}, {}, 0, "eu/paris");
  AddGroup(down2, {2, 3}, {}, 2, "eu/berlin");
  return plan;
}

TEST(AveragingStepsTest, BroadcastsForwardThePiecesOfTheRootGroup) {
  const shoal::v1::RoundPlan plan = ThreeLevels();
  const std::vector<SliceRange> root = PlanSlices(kTotal, 2);
  // w4 (index 3, eu/berlin): averages in berlin, then copies from its head
  // w3 in the last broadcast, as w3 holds it: the root group's pieces, which
  // w3 itself copied from eu's head in the first broadcast.
  absl::StatusOr<std::vector<GroupStep>> steps = PlanSteps(plan, "w4", kTotal);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].kind, GroupStep::Kind::kAverage);
  EXPECT_EQ((*steps)[0].stage, 1u);
  EXPECT_EQ((*steps)[0].zone, "eu/berlin");
  EXPECT_EQ((*steps)[0].self, 1);
  const GroupStep& last = (*steps)[1];
  EXPECT_EQ(last.kind, GroupStep::Kind::kBroadcast);
  EXPECT_EQ(last.stage, 5u);
  EXPECT_EQ(last.members[last.head].id, "w3");
  ASSERT_EQ(last.pieces.size(), root.size());
  for (size_t i = 0; i < root.size(); ++i) {
    EXPECT_EQ(last.pieces[i].begin, root[i].begin);
    EXPECT_EQ(last.pieces[i].end, root[i].end);
  }
  // w3 (index 2) in eu's broadcast: reads the root pieces from w1.
  steps = PlanSteps(plan, "w3", kTotal);
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 4u);
  EXPECT_EQ((*steps)[1].weights, (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ((*steps)[2].kind, GroupStep::Kind::kBroadcast);
  EXPECT_EQ((*steps)[2].pieces.size(), 2u);
  EXPECT_EQ((*steps)[3].self, (*steps)[3].head) << "w3 serves berlin";
  // Every step of a hierarchical plan has an identity.
  for (const GroupStep& s : *steps) EXPECT_FALSE(s.identity.empty());
  // The root's members: w1 and w5 with weights 4 and 2.
  steps = PlanSteps(plan, "w5", kTotal);
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 3u);
  EXPECT_EQ((*steps)[1].weights, (std::vector<uint32_t>{4, 2}));
  EXPECT_EQ((*steps)[1].own().begin, root[1].begin);
}

TEST(AveragingStepsTest, AFragmentPlanCutsItsGroupsInsideTheFragment) {
  // Streaming fragments: round 3 of K = 4 averages [750, 1000).
  shoal::v1::RoundPlan plan = ThreeLevels();
  const SliceRange fragment = FragmentOf(kTotal, 4, plan.round());
  plan.set_fragment_begin(fragment.begin);
  plan.set_fragment_end(fragment.end);
  EXPECT_EQ(FragmentRange(plan).begin, 750u);
  absl::StatusOr<std::vector<GroupStep>> steps = PlanSteps(plan, "w4", kTotal);
  ASSERT_TRUE(steps.ok()) << steps.status();
  // Berlin's two members split the fragment, not the model.
  EXPECT_EQ((*steps)[0].slices[0].begin, 750u);
  EXPECT_EQ((*steps)[0].slices[0].end, 875u);
  EXPECT_EQ((*steps)[0].slices[1].end, 1000u);
  // The broadcast forwards the root group's pieces of the fragment.
  const GroupStep& last = (*steps)[1];
  ASSERT_EQ(last.pieces.size(), 2u);
  EXPECT_EQ(last.pieces[0].begin, 750u);
  EXPECT_EQ(last.pieces[1].end, 1000u);
  // Another fragment is another group result (an attempt never carries a
  // stage of another fragment).
  shoal::v1::RoundPlan other = plan;
  other.set_fragment_begin(0);
  other.set_fragment_end(250);
  EXPECT_NE(GroupIdentities(plan)[0][0], GroupIdentities(other)[0][0]);
  // Without fragment fields: the whole model.
  EXPECT_EQ(FragmentRange(ThreeLevels()).end, kTotal);
}

TEST(AveragingStepsTest, RefusesAFragmentOutsideTheModelAndSlicesOutsideTheFragment) {
  shoal::v1::RoundPlan plan = Plan(2);  // slices [0, 500), [500, 1000)
  plan.set_fragment_begin(0);
  plan.set_fragment_end(500);
  // The second slice lies outside the fragment.
  EXPECT_EQ(PlanSteps(plan, "w1", kTotal).status().code(), absl::StatusCode::kInvalidArgument);
  plan.set_fragment_end(kTotal + 1);
  EXPECT_EQ(PlanSteps(plan, "w1", kTotal).status().code(), absl::StatusCode::kInvalidArgument);
  plan.set_fragment_begin(600);
  plan.set_fragment_end(600);  // empty
  EXPECT_EQ(PlanSteps(plan, "w1", kTotal).status().code(), absl::StatusCode::kInvalidArgument);
  plan.set_fragment_begin(0);
  plan.set_fragment_end(kTotal);  // the whole model, named
  EXPECT_TRUE(PlanSteps(plan, "w1", kTotal).ok());
}

}  // namespace
}  // namespace shoal::worker
