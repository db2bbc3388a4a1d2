// Unit tests of the worker's participant-list cache: plans that name a list
// by version are expanded with the shard formula; unknown lists are refused.
#include "services/worker/core/plan_list.h"

#include "gtest/gtest.h"

namespace shoal::worker {
namespace {

v1::RoundPlan FullPlan(uint64_t version) {
  v1::RoundPlan plan;
  plan.set_round(1);
  plan.set_attempt(1);
  plan.set_total_elements(10);
  plan.set_participants_version(version);
  const uint64_t bounds[] = {0, 3, 6, 10};
  for (int k = 0; k < 3; ++k) {
    auto* s = plan.add_slices();
    s->set_worker_id("w" + std::to_string(k + 1));
    s->set_peer_address("127.0.0.1:" + std::to_string(9001 + k));
    s->set_begin(bounds[k]);
    s->set_end(bounds[k + 1]);
  }
  return plan;
}

v1::RoundPlan CompactPlan(uint64_t version, uint64_t total) {
  v1::RoundPlan plan;
  plan.set_round(2);
  plan.set_attempt(1);
  plan.set_total_elements(total);
  plan.set_participants_version(version);
  return plan;
}

TEST(PlanListTest, FullPlanIsKeptAndLeftAsItIs) {
  PlanList list;
  v1::RoundPlan plan = FullPlan(7);
  const std::string before = plan.SerializeAsString();
  ASSERT_TRUE(list.Expand(&plan).ok());
  EXPECT_EQ(plan.SerializeAsString(), before);
  EXPECT_EQ(list.Addresses(),
            (std::vector<std::string>{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"}));
}

TEST(PlanListTest, CompactPlanGetsTheSlicesOfTheKeptList) {
  PlanList list;
  v1::RoundPlan full = FullPlan(7);
  ASSERT_TRUE(list.Expand(&full).ok());
  v1::RoundPlan plan = CompactPlan(7, 10);
  ASSERT_TRUE(list.Expand(&plan).ok());
  // The same list and the coordinator's formula: the full plan's slices.
  ASSERT_EQ(plan.slices_size(), 3);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(plan.slices(k).SerializeAsString(), full.slices(k).SerializeAsString()) << k;
  }
  EXPECT_EQ(plan.round(), 2u);
  // Another model size: the same owners, slices cut anew.
  v1::RoundPlan bigger = CompactPlan(7, 1000);
  ASSERT_TRUE(list.Expand(&bigger).ok());
  EXPECT_EQ(bigger.slices(1).worker_id(), "w2");
  EXPECT_EQ(bigger.slices(1).begin(), 333u);
  EXPECT_EQ(bigger.slices(2).end(), 1000u);
}

TEST(PlanListTest, ACompactPlanOfAFragmentCutsItsSlicesInsideIt) {
  PlanList list;
  v1::RoundPlan full = FullPlan(7);
  ASSERT_TRUE(list.Expand(&full).ok());
  v1::RoundPlan plan = CompactPlan(7, 1000);
  plan.set_fragment_begin(250);
  plan.set_fragment_end(550);
  ASSERT_TRUE(list.Expand(&plan).ok());
  ASSERT_EQ(plan.slices_size(), 3);
  EXPECT_EQ(plan.slices(0).begin(), 250u);
  EXPECT_EQ(plan.slices(0).end(), 350u);
  EXPECT_EQ(plan.slices(1).begin(), 350u);
  EXPECT_EQ(plan.slices(2).end(), 550u);
}

TEST(PlanListTest, OutboundOnlyParticipantsKeepEmptySlicesInCompactPlans) {
  PlanList list;
  v1::RoundPlan full = FullPlan(8);
  // w2 is behind NAT: the coordinator cut [0, 10) between w1 and w3.
  full.mutable_slices(0)->set_end(5);
  full.mutable_slices(1)->set_begin(5);
  full.mutable_slices(1)->set_end(5);
  full.mutable_slices(1)->set_outbound_only(true);
  full.mutable_slices(2)->set_begin(5);
  ASSERT_TRUE(list.Expand(&full).ok());
  v1::RoundPlan plan = CompactPlan(8, 10);
  ASSERT_TRUE(list.Expand(&plan).ok());
  ASSERT_EQ(plan.slices_size(), 3);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(plan.slices(k).SerializeAsString(), full.slices(k).SerializeAsString()) << k;
  }
}

TEST(PlanListTest, UnknownListIsFailedPrecondition) {
  PlanList list;
  v1::RoundPlan none = CompactPlan(7, 10);
  absl::Status s = list.Expand(&none);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(none.slices_size(), 0);

  v1::RoundPlan full = FullPlan(7);
  ASSERT_TRUE(list.Expand(&full).ok());
  v1::RoundPlan other = CompactPlan(8, 10);
  s = list.Expand(&other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("list 8"), std::string::npos) << s;
  // Version 0 (no list named) without slices cannot be expanded either.
  v1::RoundPlan zero = CompactPlan(0, 10);
  EXPECT_EQ(list.Expand(&zero).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PlanListTest, FullPlanWithoutVersionKeepsTheOldList) {
  PlanList list;
  v1::RoundPlan full = FullPlan(7);
  ASSERT_TRUE(list.Expand(&full).ok());
  v1::RoundPlan unversioned = FullPlan(0);  // from a coordinator before versions
  unversioned.mutable_slices(0)->set_peer_address("127.0.0.1:1");
  ASSERT_TRUE(list.Expand(&unversioned).ok());
  EXPECT_EQ(list.Addresses().front(), "127.0.0.1:9001");
}

// Bandwidth-proportional slices: the shares travel with the list and a
// compact plan is cut by them, exactly as the coordinator cut the full one.
TEST(PlanListTest, ACompactPlanIsCutByTheKeptShares) {
  PlanList list;
  v1::RoundPlan full = FullPlan(8);
  full.set_total_elements(1000);
  const uint32_t shares[] = {1, 8, 1};
  const uint64_t bounds[] = {0, 100, 900, 1000};
  for (int k = 0; k < 3; ++k) {
    full.mutable_slices(k)->set_share(shares[k]);
    full.mutable_slices(k)->set_begin(bounds[k]);
    full.mutable_slices(k)->set_end(bounds[k + 1]);
  }
  ASSERT_TRUE(list.Expand(&full).ok());
  v1::RoundPlan plan = CompactPlan(8, 1000);
  ASSERT_TRUE(list.Expand(&plan).ok());
  ASSERT_EQ(plan.slices_size(), 3);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(plan.slices(k).SerializeAsString(), full.slices(k).SerializeAsString()) << k;
  }
  // A new list without shares: even slices again.
  v1::RoundPlan even = FullPlan(9);
  ASSERT_TRUE(list.Expand(&even).ok());
  v1::RoundPlan next = CompactPlan(9, 10);
  ASSERT_TRUE(list.Expand(&next).ok());
  EXPECT_EQ(next.slices(1).begin(), 3u);
  EXPECT_EQ(next.slices(1).end(), 6u);
  EXPECT_EQ(next.slices(1).share(), 0u);
}

}  // namespace
}  // namespace shoal::worker
