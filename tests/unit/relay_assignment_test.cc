// Unit tests of the relay assignment (services/coordinator/core/
// relay_assignment.h): who goes through which supernode, who goes direct and
// why, and which assignments changed between two elections.
#include "services/coordinator/core/relay_assignment.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr double kMB = 1e6;

class RelayAssignmentTest : public ::testing::Test {
 protected:
  void Add(std::string id, std::string zone, double bw, bool outbound_only = false) {
    ElectionMember e;
    e.id = id;
    e.zone = zone;
    e.step_seconds = 0.01;
    e.bandwidth_bps = bw;
    election_members_.push_back(e);
    candidates_.push_back(
        {id, zone, "127.0.0.1:" + std::to_string(40000 + candidates_.size()), outbound_only});
  }
  std::vector<RelayAssignment> Assign() {
    election_ = ElectZones(election_members_, election_, ElectionOptions(),
                           ElectionTrigger::kMeasurements, clock_);
    return AssignRelays(election_, candidates_);
  }
  static const RelayAssignment& Of(const std::vector<RelayAssignment>& all, const std::string& id) {
    for (const RelayAssignment& a : all) {
      if (a.worker_id == id) return a;
    }
    static const RelayAssignment kNone;
    ADD_FAILURE() << "no assignment for " << id;
    return kNone;
  }

  FakeClock clock_;
  ElectionResult election_;
  std::vector<ElectionMember> election_members_;
  std::vector<RelayCandidate> candidates_;
};

TEST_F(RelayAssignmentTest, MembersGoThroughTheirZonesSupernodeWhichGoesDirect) {
  Add("w1", "eu", 100 * kMB);
  Add("w2", "eu", 300 * kMB);  // eu's supernode (best bandwidth)
  Add("w3", "eu", 100 * kMB);
  Add("w4", "us", 500 * kMB);  // us's supernode
  Add("w5", "us", 100 * kMB);
  const auto all = Assign();
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0].worker_id, "w1");  // the members' order
  EXPECT_EQ(Of(all, "w1").relay_id, "w2");
  EXPECT_EQ(Of(all, "w1").relay_address, candidates_[1].peer_address);
  EXPECT_THAT(Of(all, "w1").reason, HasSubstr("through w2, the supernode of \"eu\""));
  EXPECT_EQ(Of(all, "w3").relay_id, "w2");
  EXPECT_EQ(Of(all, "w2").relay_id, "");
  EXPECT_EQ(Of(all, "w2").relay_address, "");
  EXPECT_THAT(Of(all, "w2").reason, HasSubstr("w2 is the supernode"));
  EXPECT_EQ(Of(all, "w5").relay_id, "w4");
  EXPECT_EQ(Of(all, "w4").relay_id, "");
}

TEST_F(RelayAssignmentTest, AFlatRunGoesDirect) {
  Add("w1", "", 100 * kMB);
  Add("w2", "", 300 * kMB);
  for (const RelayAssignment& a : Assign()) {
    EXPECT_EQ(a.relay_id, "") << a.worker_id;
    EXPECT_THAT(a.reason, HasSubstr("has no supernode")) << a.worker_id;
  }
}

TEST_F(RelayAssignmentTest, ASupernodeThatAcceptsNoConnectionsRelaysNobody) {
  Add("w1", "eu", 100 * kMB);
  Add("w2", "eu", 300 * kMB, /*outbound_only=*/true);
  Add("w3", "us", 100 * kMB);
  const auto all = Assign();
  ASSERT_EQ(election_.Find("eu")->supernode, "w2");
  EXPECT_EQ(Of(all, "w1").relay_id, "");
  EXPECT_THAT(Of(all, "w1").reason, HasSubstr("accepts no connections"));
}

TEST_F(RelayAssignmentTest, ASupernodeWithoutAnAddressRelaysNobody) {
  Add("w1", "eu", 100 * kMB);
  Add("w2", "eu", 300 * kMB);
  Add("w3", "us", 100 * kMB);
  candidates_[1].peer_address.clear();
  EXPECT_EQ(Of(Assign(), "w1").relay_id, "");
}

TEST_F(RelayAssignmentTest, ANestedZoneUsesItsOwnSupernodeNotItsParents) {
  Add("w1", "eu/paris", 100 * kMB);
  Add("w2", "eu/paris", 300 * kMB);
  Add("w3", "eu/berlin", 900 * kMB);
  Add("w4", "eu/berlin", 100 * kMB);
  const auto all = Assign();
  ASSERT_EQ(election_.Find("eu/paris")->supernode, "w2");
  EXPECT_EQ(Of(all, "w1").relay_id, "w2");
  EXPECT_EQ(Of(all, "w4").relay_id, "w3");
}

TEST_F(RelayAssignmentTest, WhenTheSupernodeDiesItsMembersMoveToTheStandby) {
  Add("w1", "eu", 100 * kMB);
  Add("w2", "eu", 300 * kMB);
  Add("w3", "eu", 200 * kMB);  // the standby
  Add("w4", "us", 100 * kMB);
  const auto before = Assign();
  ASSERT_EQ(Of(before, "w1").relay_id, "w2");
  election_members_[1].alive = false;
  candidates_.erase(candidates_.begin() + 1);
  const auto after = Assign();
  EXPECT_EQ(Of(after, "w1").relay_id, "w3");
  EXPECT_EQ(Of(after, "w3").relay_id, "");
  // Both changed: w1 moves to w3, w3 (relayed before) now goes direct.
  const auto changed = ChangedRelays(before, after);
  ASSERT_EQ(changed.size(), 2u);
  EXPECT_EQ(changed[0].worker_id, "w1");
  EXPECT_EQ(changed[1].worker_id, "w3");
}

TEST(ChangedRelaysTest, ListsOnlyWhatChangedAndNewRelayedMembers) {
  const std::vector<RelayAssignment> before = {
      {"w1", "w2", "a:1", "x"}, {"w2", "", "", "y"}, {"w3", "w2", "a:1", "z"}};
  const std::vector<RelayAssignment> next = {
      {"w1", "w2", "a:1", "another reason"},  // same route: not listed
      {"w2", "", "", "y"},
      {"w3", "w2", "a:2", "z"},  // the supernode moved its address
      {"w4", "", "", "new, direct"},
      {"w5", "w2", "a:1", "new, relayed"}};
  const auto changed = ChangedRelays(before, next);
  ASSERT_EQ(changed.size(), 2u);
  EXPECT_EQ(changed[0].worker_id, "w3");
  EXPECT_EQ(changed[1].worker_id, "w5");
}

}  // namespace
}  // namespace shoal::coordinator
