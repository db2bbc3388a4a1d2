// Topology on its own (services/coordinator/core/topology.h): when the
// supernode election runs, the roles it gives, a supernode's loss, and with
// relay on the UseRelay of every route that changed. The members come from a
// real Membership; time from a FakeClock.
#include "services/coordinator/core/topology.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::coordinator {
namespace {

using ::shoal::v1::CoordinatorMessage;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

class TopologyTest : public ::testing::Test {
 protected:
  TopologyTest() { Make(/*relay=*/false); }

  void Make(bool relay) {
    options_.config.mutable_topology()->set_relay(relay);
    members_ = std::make_unique<Membership>(options_, &clock_, &versions_, clock_.Now());
    topology_ = std::make_unique<Topology>(options_, &clock_, &versions_, members_.get());
  }

  std::string Add(int port, const std::string& zone) {
    v1::JoinRequest r;
    r.set_peer_address(absl::StrCat("127.0.0.1:", port));
    r.set_zone(zone);
    absl::StatusOr<Member*> added = members_->Add(r, 1);
    EXPECT_TRUE(added.ok()) << added.status();
    members_->Refresh(**added, r, "");
    topology_->MarkStale();  // what a join does
    return (*added)->id;
  }

  // Removes the member as RoundEngine::DepartMember does: from the members,
  // then from the topology.
  void Depart(const std::string& id) {
    Directives out;
    members_->Remove(id, MemberState::kLeft, "test", v1::WorkerStatus(), 1, &out);
    topology_->Forget(id, 1);
  }

  std::string Role(const std::string& id) {
    v1::WorkerStatus w;
    topology_->FillWorker(id, /*active=*/true, &w);
    return w.role();
  }

  const ZoneElection* Zone(const std::string& path) { return topology_->election().Find(path); }

  FakeClock clock_;
  EngineOptions options_;
  EngineVersions versions_;
  std::unique_ptr<Membership> members_;
  std::unique_ptr<Topology> topology_;
};

TEST_F(TopologyTest, AJoinMarksTheElectionStaleAndTheNextReelectIfStaleRuns) {
  const std::string w1 = Add(9001, "eu");
  // Nothing is elected until asked (a burst of joins costs one election).
  EXPECT_EQ(Zone("eu"), nullptr);
  topology_->ReelectIfStale(1);
  ASSERT_NE(Zone("eu"), nullptr);
  EXPECT_EQ(Zone("eu")->supernode, w1);
  // Not stale: a new member only shows after the next ReelectIfStale.
  const std::string w2 = Add(9002, "us");
  EXPECT_EQ(Zone("us"), nullptr);
  topology_->ReelectIfStale(1);
  ASSERT_NE(Zone("us"), nullptr);
  EXPECT_EQ(Zone("us")->supernode, w2);
}

TEST_F(TopologyTest, RolesAreSupernodeStandbyAndMember) {
  const std::string w1 = Add(9001, "eu");
  const std::string w2 = Add(9002, "eu");
  const std::string w3 = Add(9003, "eu");
  topology_->ReelectIfStale(1);
  // Unmeasured: by id.
  EXPECT_EQ(Role(w1), "supernode");
  EXPECT_EQ(Role(w2), "standby");
  EXPECT_EQ(Role(w3), "member");
  v1::RunStatus s;
  topology_->FillStatus(&s);
  bool found = false;
  for (const v1::ZoneStatus& z : s.zones()) {
    if (z.path() != "eu") continue;
    found = true;
    EXPECT_EQ(z.supernode(), w1);
    EXPECT_EQ(z.standby(), w2);
    EXPECT_EQ(z.workers(), 3u);
  }
  EXPECT_TRUE(found);
}

TEST_F(TopologyTest, LosingTheSupernodeReelectsAtOnceAndTheStandbyTakesOver) {
  const std::string w1 = Add(9001, "eu");
  const std::string w2 = Add(9002, "eu");
  const std::string w3 = Add(9003, "eu");
  topology_->ReelectIfStale(1);
  // A plain member's loss waits for the next ReelectIfStale.
  Depart(w3);
  EXPECT_EQ(Zone("eu")->workers, 3u);
  topology_->ReelectIfStale(1);
  EXPECT_EQ(Zone("eu")->workers, 2u);
  // The supernode's loss is re-elected in Forget itself.
  Depart(w1);
  EXPECT_EQ(Zone("eu")->supernode, w2);
  EXPECT_EQ(Role(w2), "supernode");
}

TEST_F(TopologyTest, MeasurementsAreShownAndKeptWhenAReportMeasuresNothing) {
  const std::string w1 = Add(9001, "");
  topology_->Measure(w1, 0.25, 1e6);
  topology_->Measure(w1, 0, 0);  // not measured this round: keeps the last
  v1::WorkerStatus w;
  topology_->FillWorker(w1, /*active=*/true, &w);
  EXPECT_DOUBLE_EQ(w.step_seconds(), 0.25);
  EXPECT_DOUBLE_EQ(w.bandwidth_bytes_per_second(), 1e6);
  topology_->Forget(w1, 1);
  v1::WorkerStatus after;
  topology_->FillWorker(w1, /*active=*/false, &after);
  EXPECT_DOUBLE_EQ(after.step_seconds(), 0);
  EXPECT_TRUE(after.role().empty());  // a removed member has no role
}

TEST_F(TopologyTest, TheStatusVersionMovesOnlyWhenTheElectionChanged) {
  Add(9001, "eu");
  topology_->ReelectIfStale(1);
  versions_.Commit();
  const uint64_t before = versions_.status_version();
  topology_->Reelect(ElectionTrigger::kMembership, 1);  // the same result
  versions_.Commit();
  EXPECT_EQ(versions_.status_version(), before);
  Add(9002, "us");
  topology_->ReelectIfStale(1);
  versions_.Commit();
  EXPECT_EQ(versions_.status_version(), before + 1);
}

TEST_F(TopologyTest, WithoutRelayThereAreNoRoutes) {
  const std::string w1 = Add(9001, "eu");
  Add(9002, "eu");
  topology_->ReelectIfStale(1);
  Directives out;
  topology_->TakeRelayChanges(&out);
  EXPECT_THAT(out, IsEmpty());
  EXPECT_EQ(topology_->RelayRoute(w1), nullptr);
}

TEST_F(TopologyTest, WithRelayAZonesMembersAreRoutedThroughItsSupernodeOnce) {
  Make(/*relay=*/true);
  const std::string w1 = Add(9001, "eu");
  const std::string w2 = Add(9002, "eu");
  const std::string w3 = Add(9003, "eu");
  // Before any election: direct, with the reason.
  ASSERT_NE(topology_->RelayRoute(w2), nullptr);
  EXPECT_TRUE(topology_->RelayRoute(w2)->use_relay().relay_id().empty());
  topology_->ReelectIfStale(1);
  Directives out;
  topology_->TakeRelayChanges(&out);
  std::vector<std::string> told;
  for (const Directive& d : out) {
    ASSERT_EQ(d.message->kind_case(), CoordinatorMessage::kUseRelay);
    EXPECT_EQ(d.message->use_relay().relay_id(), w1);
    EXPECT_EQ(d.message->use_relay().address(), "127.0.0.1:9001");
    told.push_back(d.worker_id);
  }
  // The supernode goes direct (as before: no change to tell).
  EXPECT_THAT(told, UnorderedElementsAre(w2, w3));
  EXPECT_EQ(topology_->RelayRoute(w3)->use_relay().relay_id(), w1);
  // Handed out once.
  out.clear();
  topology_->TakeRelayChanges(&out);
  EXPECT_THAT(out, IsEmpty());
  // The supernode goes: w2 takes over, w3 moves to it, w2 goes direct.
  Depart(w1);
  topology_->TakeRelayChanges(&out);
  ASSERT_EQ(out.size(), 2u);
  for (const Directive& d : out) {
    if (d.worker_id == w2) {
      EXPECT_TRUE(d.message->use_relay().relay_id().empty());
    } else {
      EXPECT_EQ(d.worker_id, w3);
      EXPECT_EQ(d.message->use_relay().relay_id(), w2);
    }
  }
}

}  // namespace
}  // namespace shoal::coordinator
