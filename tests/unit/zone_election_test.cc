// Unit tests of the supernode election (services/coordinator/core/
// zone_election.h): scoring, reasons, the bottom-up tree, hysteresis and
// takeover, with a fake clock and made-up measurements.
#include "services/coordinator/core/zone_election.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr double kMB = 1e6;

ElectionMember M(std::string id, std::string zone, double step = 0, double bw = 0) {
  ElectionMember m;
  m.id = std::move(id);
  m.zone = std::move(zone);
  m.step_seconds = step;
  m.bandwidth_bps = bw;
  return m;
}

std::vector<std::string> Paths(const ElectionResult& r) {
  std::vector<std::string> out;
  for (const auto& z : r.zones) out.push_back(z.path);
  return out;
}

class ZoneElectionTest : public ::testing::Test {
 protected:
  ElectionResult Elect(const std::vector<ElectionMember>& members,
                       ElectionTrigger trigger = ElectionTrigger::kMembership) {
    result_ = ElectZones(members, result_, options_, trigger, clock_);
    return result_;
  }
  const ZoneElection& Z(const std::string& path) {
    const ZoneElection* z = result_.Find(path);
    EXPECT_NE(z, nullptr) << path;
    static const ZoneElection kNone;
    return z != nullptr ? *z : kNone;
  }

  FakeClock clock_;
  ElectionOptions options_;
  ElectionResult result_;
};

TEST(ZoneElectionScoreTest, WeighsBandwidthTwiceAsMuchAsCompute) {
  ElectionOptions options;
  const ZoneMedians med{0.010, 100 * kMB};
  // At the medians: 1.
  EXPECT_DOUBLE_EQ(ElectionScore(M("w1", "", 0.010, 100 * kMB), med, options), 1.0);
  // 8x the bandwidth: 8^(2/3) = 4; half the step time: 2^(1/3).
  EXPECT_NEAR(ElectionScore(M("w1", "", 0.010, 800 * kMB), med, options), 4.0, 1e-9);
  EXPECT_NEAR(ElectionScore(M("w1", "", 0.005, 100 * kMB), med, options), std::cbrt(2.0), 1e-9);
  // A missing measurement counts as the median.
  EXPECT_NEAR(ElectionScore(M("w1", "", 0, 800 * kMB), med, options), 4.0, 1e-9);
  EXPECT_DOUBLE_EQ(ElectionScore(M("w1", ""), med, options), 1.0);
}

TEST(ZoneElectionScoreTest, IdsInNaturalOrder) {
  EXPECT_TRUE(IdLess("w2", "w10"));
  EXPECT_FALSE(IdLess("w10", "w2"));
  EXPECT_TRUE(IdLess("w10", "w11"));
  EXPECT_FALSE(IdLess("w3", "w3"));
}

TEST_F(ZoneElectionTest, BuildsTheTreeInPreOrderWithCounts) {
  Elect({M("w1", "eu/paris"), M("w2", "eu/paris"), M("w3", "eu-west"), M("w4", "eu/london"),
         M("w5", "eu"), M("w6", "us/nyc/rack1")});
  EXPECT_THAT(Paths(result_), ElementsAre("", "eu", "eu/london", "eu/paris", "eu-west", "us",
                                          "us/nyc", "us/nyc/rack1"));
  EXPECT_EQ(Z("").workers, 6u);
  EXPECT_EQ(Z("").direct_members, 0u);
  EXPECT_EQ(Z("eu").workers, 4u);
  EXPECT_EQ(Z("eu").direct_members, 1u);
  EXPECT_EQ(Z("eu/paris").direct_members, 2u);
  EXPECT_EQ(Z("us").workers, 1u);
  EXPECT_EQ(Z("us").direct_members, 0u);
}

TEST_F(ZoneElectionTest, NoMeasurementsMeansSmallestId) {
  Elect({M("w10", "eu"), M("w2", "eu"), M("w3", "eu")});
  EXPECT_EQ(Z("eu").supernode, "w2");
  EXPECT_EQ(Z("eu").standby, "w3");
  EXPECT_THAT(Z("eu").reason, HasSubstr("no measurements yet"));
  EXPECT_EQ(Z("eu").cause, "first election");
  EXPECT_EQ(Z("eu").elected_at, clock_.Now());
}

TEST_F(ZoneElectionTest, RootHasASupernodeOnlyWithDirectMembersAndChildren) {
  Elect({M("w1", ""), M("w2", "")});  // flat run
  EXPECT_THAT(Paths(result_), ElementsAre(""));
  EXPECT_EQ(Z("").supernode, "");
  EXPECT_THAT(Z("").reason, HasSubstr("flat"));

  result_ = {};
  Elect({M("w1", "eu"), M("w2", "us")});  // children only
  EXPECT_EQ(Z("").supernode, "");
  EXPECT_EQ(Z("eu").supernode, "w1");
  EXPECT_EQ(Z("eu").standby, "");  // alone
  EXPECT_THAT(Z("eu").reason, HasSubstr("only candidate"));

  result_ = {};
  Elect({M("w1", "eu"), M("w2", "us"), M("w3", "")});  // both
  EXPECT_EQ(Z("").supernode, "w1");
  EXPECT_EQ(Z("").standby, "w2");
}

TEST_F(ZoneElectionTest, ScoresPickTheBestAndSayWhy) {
  Elect({M("w1", "eu", 0.010, 100 * kMB), M("w2", "eu", 0.010, 50 * kMB),
         M("w3", "eu", 0.009, 210 * kMB)});
  EXPECT_EQ(Z("eu").supernode, "w3");
  EXPECT_EQ(Z("eu").standby, "w1");
  EXPECT_THAT(Z("eu").reason,
              HasSubstr("w3: 2.1x the zone's median bandwidth, 0.9x its median step time"));
  EXPECT_THAT(Z("eu").standby_reason, HasSubstr("w1: 1x the zone's median bandwidth"));
  EXPECT_DOUBLE_EQ(Z("eu").medians.bandwidth_bps, 100 * kMB);
  // Measured candidates rank before unmeasured ones, whatever their ids.
  result_ = {};
  Elect({M("w1", "us"), M("w9", "us", 0.02, 1 * kMB)});
  EXPECT_EQ(Z("us").supernode, "w9");
}

TEST_F(ZoneElectionTest, BottomUpHeadsAreHeadsOfAChildOrDirectMembers) {
  std::vector<ElectionMember> members = {
      M("w1", "eu/paris", 0.01, 100 * kMB),  M("w2", "eu/paris", 0.01, 300 * kMB),
      M("w3", "eu/london", 0.01, 200 * kMB), M("w4", "eu/london", 0.01, 100 * kMB),
      M("w5", "eu", 0.01, 150 * kMB),        M("w6", "us", 0.01, 900 * kMB)};
  Elect(members);
  EXPECT_EQ(Z("eu/paris").supernode, "w2");
  EXPECT_EQ(Z("eu/london").supernode, "w3");
  // eu: best of {w5, w2, w3}; w1 (paris) and w4 (london) cannot be.
  EXPECT_EQ(Z("eu").supernode, "w2");
  EXPECT_THAT(Z("eu").reason, HasSubstr("supernode of eu/paris"));
  EXPECT_EQ(Z("eu").standby, "w3");
  EXPECT_EQ(Z("").supernode, "");
  // Every zone's supernode heads one of its children or is a direct member.
  for (const ZoneElection& z : result_.zones) {
    if (z.supernode.empty()) continue;
    bool ok = false;
    for (const auto& m : members) ok |= m.id == z.supernode && m.zone == z.path;
    for (const ZoneElection& c : result_.zones) {
      if (!c.path.empty() && c.path.rfind(z.path + (z.path.empty() ? "" : "/"), 0) == 0 &&
          c.path.find('/', z.path.size() + 1) == std::string::npos && c.path != z.path) {
        ok |= c.supernode == z.supernode;
      }
    }
    EXPECT_TRUE(ok) << z.path << " " << z.supernode;
  }
}

TEST_F(ZoneElectionTest, SingleChildZoneTakesTheChildsStandby) {
  Elect({M("w1", "eu/paris"), M("w2", "eu/paris"), M("w3", "eu/paris")});
  EXPECT_EQ(Z("eu").supernode, "w1");
  EXPECT_EQ(Z("eu/paris").standby, "w2");
  // eu's only candidate is paris's head; its heir stands by for eu too.
  EXPECT_EQ(Z("eu").standby, "w2");
  EXPECT_THAT(Z("eu").standby_reason, HasSubstr("standby of eu/paris"));
}

TEST_F(ZoneElectionTest, HysteresisNeedsSeveralEvaluationsAboveTheFactor) {
  std::vector<ElectionMember> members = {M("w1", "eu", 0.01, 100 * kMB),
                                         M("w2", "eu", 0.01, 100 * kMB)};
  Elect(members);
  ASSERT_EQ(Z("eu").supernode, "w1");
  const absl::Time first = clock_.Now();
  // w2 gets 8x the bandwidth: score 4x w1's... after 3 measurement evaluations.
  members[1].bandwidth_bps = 800 * kMB;
  for (int i = 1; i <= 2; ++i) {
    clock_.Advance(absl::Seconds(10));
    Elect(members, ElectionTrigger::kMeasurements);
    EXPECT_EQ(Z("eu").supernode, "w1") << i;
    EXPECT_EQ(Z("eu").challenger, "w2");
    EXPECT_EQ(Z("eu").challenger_streak, static_cast<uint32_t>(i));
  }
  // Membership evaluations neither count nor break the streak.
  Elect(members, ElectionTrigger::kMembership);
  EXPECT_EQ(Z("eu").supernode, "w1");
  EXPECT_EQ(Z("eu").challenger_streak, 2u);
  EXPECT_EQ(Z("eu").elected_at, first);
  clock_.Advance(absl::Seconds(10));
  Elect(members, ElectionTrigger::kMeasurements);
  EXPECT_EQ(Z("eu").supernode, "w2");
  EXPECT_EQ(Z("eu").standby, "w1");
  EXPECT_THAT(Z("eu").cause, HasSubstr("w2 beat w1 by"));
  EXPECT_THAT(Z("eu").cause, HasSubstr("in 3 evaluations"));
  EXPECT_EQ(Z("eu").elected_at, clock_.Now());
  EXPECT_EQ(Z("eu").changes, 1u);
  EXPECT_EQ(Z("eu").challenger, "");
}

TEST_F(ZoneElectionTest, AChallengerWaitsForTheMinimumTenure) {
  options_.min_tenure = absl::Seconds(30);
  std::vector<ElectionMember> members = {M("w1", "eu", 0.01, 100 * kMB),
                                         M("w2", "eu", 0.01, 100 * kMB)};
  Elect(members);
  ASSERT_EQ(Z("eu").supernode, "w1");
  members[1].bandwidth_bps = 800 * kMB;
  // Short rounds: 5 evaluations within the tenure keep w1, the streak grows.
  for (int i = 1; i <= 5; ++i) {
    clock_.Advance(absl::Seconds(5));
    Elect(members, ElectionTrigger::kMeasurements);
    EXPECT_EQ(Z("eu").supernode, "w1") << i;
    EXPECT_EQ(Z("eu").challenger_streak, static_cast<uint32_t>(i));
  }
  // Past it, the next measurement evaluation switches.
  clock_.Advance(absl::Seconds(5));
  Elect(members, ElectionTrigger::kMeasurements);
  EXPECT_EQ(Z("eu").supernode, "w2");
  EXPECT_THAT(Z("eu").cause, HasSubstr("in 6 evaluations"));
  // A head that dies is replaced at once, tenure or not.
  members[1].alive = false;
  clock_.Advance(absl::Seconds(1));
  Elect(members);
  EXPECT_EQ(Z("eu").supernode, "w1");
}

TEST_F(ZoneElectionTest, SmallOrInterruptedAdvantagesDoNotSwitch) {
  std::vector<ElectionMember> members = {M("w1", "eu", 0.01, 100 * kMB),
                                         M("w2", "eu", 0.01, 100 * kMB)};
  Elect(members);
  // 1.8x the bandwidth = 1.48x the score: under the 1.5 factor, forever.
  members[1].bandwidth_bps = 180 * kMB;
  for (int i = 0; i < 10; ++i) Elect(members, ElectionTrigger::kMeasurements);
  EXPECT_EQ(Z("eu").supernode, "w1");
  EXPECT_EQ(Z("eu").challenger, "");
  // Above the factor twice, then not: the streak starts over.
  members[1].bandwidth_bps = 800 * kMB;
  Elect(members, ElectionTrigger::kMeasurements);
  Elect(members, ElectionTrigger::kMeasurements);
  members[1].bandwidth_bps = 100 * kMB;
  Elect(members, ElectionTrigger::kMeasurements);
  EXPECT_EQ(Z("eu").challenger_streak, 0u);
  members[1].bandwidth_bps = 800 * kMB;
  Elect(members, ElectionTrigger::kMeasurements);
  Elect(members, ElectionTrigger::kMeasurements);
  EXPECT_EQ(Z("eu").supernode, "w1");
  EXPECT_EQ(Z("eu").changes, 0u);
}

TEST_F(ZoneElectionTest, UnmeasuredHeadKeepsItsSeat) {
  std::vector<ElectionMember> members = {M("w1", "eu"), M("w2", "eu")};
  Elect(members);
  members[1] = M("w2", "eu", 0.001, 900 * kMB);
  for (int i = 0; i < 5; ++i) Elect(members, ElectionTrigger::kMeasurements);
  EXPECT_EQ(Z("eu").supernode, "w1");
  EXPECT_EQ(Z("eu").standby, "w2");
}

TEST_F(ZoneElectionTest, FirstMeasurementsElectFreelyOnce) {
  std::vector<ElectionMember> members = {M("w1", "eu"), M("w2", "eu"), M("w3", "eu")};
  Elect(members);
  ASSERT_EQ(Z("eu").supernode, "w1");  // by id: nothing measured
  EXPECT_FALSE(Z("eu").measured_choice);
  // Membership evaluations do not re-choose.
  members = {M("w1", "eu", 0.01, 100 * kMB), M("w2", "eu", 0.01, 120 * kMB),
             M("w3", "eu", 0.01, 110 * kMB)};
  Elect(members, ElectionTrigger::kMembership);
  EXPECT_EQ(Z("eu").supernode, "w1");
  // The first measurement evaluation does, even for 1.2x (under the factor).
  clock_.Advance(absl::Seconds(1));
  Elect(members, ElectionTrigger::kMeasurements);
  EXPECT_EQ(Z("eu").supernode, "w2");
  EXPECT_EQ(Z("eu").standby, "w3");
  EXPECT_EQ(Z("eu").cause, "first measurements: w2 ranks first (w1 was chosen by id)");
  EXPECT_EQ(Z("eu").elected_at, clock_.Now());
  EXPECT_TRUE(Z("eu").measured_choice);
  // From then on, only the hysteresis moves it.
  members[2].bandwidth_bps = 160 * kMB;
  for (int i = 0; i < 5; ++i) Elect(members, ElectionTrigger::kMeasurements);
  EXPECT_EQ(Z("eu").supernode, "w2");
}

TEST_F(ZoneElectionTest, StandbyTakesOverAtOnceWhenTheHeadDies) {
  std::vector<ElectionMember> members = {M("w1", "eu", 0.01, 300 * kMB),
                                         M("w2", "eu", 0.01, 100 * kMB),
                                         M("w3", "eu", 0.01, 200 * kMB)};
  Elect(members);
  ASSERT_EQ(Z("eu").supernode, "w1");
  ASSERT_EQ(Z("eu").standby, "w3");
  clock_.Advance(absl::Seconds(5));
  members[0].alive = false;
  Elect(members);
  EXPECT_EQ(Z("eu").supernode, "w3");
  EXPECT_EQ(Z("eu").standby, "w2");
  EXPECT_EQ(Z("eu").cause, "w1 died: standby w3 took over");
  EXPECT_EQ(Z("eu").elected_at, clock_.Now());
  EXPECT_EQ(Z("eu").changes, 1u);
  // Gone from the list altogether: "left".
  members.erase(members.begin() + 2);  // w3
  Elect(members);
  EXPECT_EQ(Z("eu").supernode, "w2");
  EXPECT_EQ(Z("eu").standby, "");
  EXPECT_EQ(Z("eu").cause, "w3 left: standby w2 took over");
}

TEST_F(ZoneElectionTest, TakeoverPropagatesUpTheTree) {
  std::vector<ElectionMember> members = {
      M("w1", "eu/paris", 0.01, 300 * kMB), M("w2", "eu/paris", 0.01, 200 * kMB),
      M("w3", "eu/paris", 0.01, 100 * kMB), M("w4", "eu/london", 0.01, 100 * kMB),
      M("w5", "eu/london", 0.01, 100 * kMB)};
  Elect(members);
  ASSERT_EQ(Z("eu").supernode, "w1");
  ASSERT_EQ(Z("eu/paris").standby, "w2");
  members[0].alive = false;
  Elect(members);
  EXPECT_EQ(Z("eu/paris").supernode, "w2");
  // eu's standby was w2 (paris's heir, better than london's head w4).
  EXPECT_EQ(Z("eu").supernode, "w2");
  EXPECT_EQ(Z("eu").cause, "w1 died: standby w2 took over");
  EXPECT_EQ(Z("eu/paris").standby, "w3");
}

TEST_F(ZoneElectionTest, ANewZoneIsElectedWithoutDisturbingOthers) {
  std::vector<ElectionMember> members = {M("w1", "eu", 0.01, 100 * kMB),
                                         M("w2", "eu", 0.01, 100 * kMB)};
  Elect(members);
  const absl::Time first = clock_.Now();
  clock_.Advance(absl::Seconds(3));
  members.push_back(M("w3", "eu", 0.001, 900 * kMB));  // much better, but new
  members.push_back(M("w4", "us"));
  Elect(members);
  EXPECT_EQ(Z("eu").supernode, "w1");
  EXPECT_EQ(Z("eu").elected_at, first);
  EXPECT_EQ(Z("us").supernode, "w4");
  EXPECT_EQ(Z("us").elected_at, clock_.Now());
  // The standby is not sticky against a much better newcomer.
  EXPECT_EQ(Z("eu").standby, "w3");
}

}  // namespace
}  // namespace shoal::coordinator
