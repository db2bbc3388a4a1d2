// Unit tests of the catch-up read planner: a pure function, called directly.
#include "services/worker/core/layer_planner.h"

#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shoal::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr uint64_t kMiB = 1 << 20;

std::vector<PlannerPiece> Pieces(size_t n, uint64_t bytes = 4 * kMiB, uint32_t layer = 0) {
  std::vector<PlannerPiece> pieces;
  for (size_t i = 0; i < n; ++i) pieces.push_back({i, layer, bytes, {}});
  return pieces;
}

std::map<size_t, int> CountByPeer(const ReadPlan& plan) {
  std::map<size_t, int> n;
  for (const Assignment& a : plan.assignments) n[a.peer]++;
  return n;
}

TEST(LayerPlannerTest, UnknownPeersAllGetWorkUpToTheCap) {
  std::vector<PlannerPeer> peers(3);
  const ReadPlan plan = PlanReads(peers, Pieces(20), {}, PlannerOptions{});
  EXPECT_EQ(plan.assignments.size(), 6u);
  EXPECT_THAT(CountByPeer(plan), (std::map<size_t, int>{{0, 2}, {1, 2}, {2, 2}}));
  EXPECT_EQ(plan.deferred, 14u);
  EXPECT_THAT(plan.unservable, IsEmpty());
  // Pieces go out in the caller's order.
  for (size_t i = 0; i < plan.assignments.size(); ++i) EXPECT_EQ(plan.assignments[i].piece, i);
}

TEST(LayerPlannerTest, PerPeerCapCountsReadsInFlight) {
  std::vector<PlannerPeer> peers(2);
  peers[0].in_flight = 2;
  peers[0].backlog_bytes = 8 * kMiB;
  peers[1].in_flight = 1;
  peers[1].backlog_bytes = 4 * kMiB;
  PlannerOptions options;
  options.per_peer = 2;
  const ReadPlan plan = PlanReads(peers, Pieces(5), {}, options);
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0].peer, 1u);
}

TEST(LayerPlannerTest, FastestFreePeerFirst) {
  std::vector<PlannerPeer> peers(3);
  peers[0].rate = 10 * kMiB;
  peers[1].rate = 40 * kMiB;
  peers[2].rate = 20 * kMiB;
  PlannerOptions options;
  options.per_peer = 1;
  const ReadPlan plan = PlanReads(peers, Pieces(30), {}, options);
  ASSERT_EQ(plan.assignments.size(), 3u);
  EXPECT_EQ(plan.assignments[0].peer, 1u);
  EXPECT_EQ(plan.assignments[1].peer, 2u);
  EXPECT_EQ(plan.assignments[2].peer, 0u);
  EXPECT_THAT(RankPeers(peers, options), ElementsAre(1, 2, 0));
}

TEST(LayerPlannerTest, SlowPeerIsNotStarvedWhileMuchIsLeft) {
  // 10x faster peer busy: the slow one still adds its throughput.
  std::vector<PlannerPeer> peers(2);
  peers[0].rate = 100 * kMiB;
  peers[0].in_flight = 2;
  peers[0].backlog_bytes = 8 * kMiB;
  peers[1].rate = 10 * kMiB;
  const ReadPlan plan = PlanReads(peers, Pieces(40), {}, PlannerOptions{});
  EXPECT_EQ(CountByPeer(plan)[1], 2);
}

TEST(LayerPlannerTest, SlowPeerLeftOutAtTheTail) {
  // One piece left: the slow peer would take 0.4 s, the busy fast one
  // finishes it (after its backlog) in 0.12 s.
  std::vector<PlannerPeer> peers(2);
  peers[0].rate = 100 * kMiB;
  peers[0].in_flight = 2;
  peers[0].backlog_bytes = 8 * kMiB;
  peers[1].rate = 10 * kMiB;
  PlannerOptions options;
  options.per_peer = 2;
  const ReadPlan plan = PlanReads(peers, Pieces(1), {}, options);
  EXPECT_THAT(plan.assignments, IsEmpty());
  EXPECT_EQ(plan.deferred, 1u);
}

TEST(LayerPlannerTest, EqualPeersShareTheTail) {
  // Three capped peers of equal rate (the benchmark case): the last pieces
  // still go to whoever is free.
  std::vector<PlannerPeer> peers(3);
  for (auto& p : peers) p.rate = 12 * kMiB;
  peers[0].in_flight = 1;
  peers[0].backlog_bytes = 2 * kMiB;
  peers[1].in_flight = 2;
  peers[1].backlog_bytes = 6 * kMiB;
  peers[2].in_flight = 2;
  peers[2].backlog_bytes = 6 * kMiB;
  const ReadPlan plan = PlanReads(peers, Pieces(1), {}, PlannerOptions{});
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0].peer, 0u);
}

TEST(LayerPlannerTest, NothingInFlightAlwaysStartsSomething) {
  std::vector<PlannerPeer> peers(2);
  peers[0].rate = 1000 * kMiB;
  peers[1].rate = 1 * kMiB;
  PlannerOptions options;
  options.per_peer = 1;
  const ReadPlan plan = PlanReads(peers, Pieces(1), {}, options);
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0].peer, 0u);
}

TEST(LayerPlannerTest, FailedLayerPeerPairsAreSkipped) {
  std::vector<PlannerPeer> peers(3);
  peers[0].rate = 100 * kMiB;  // fastest, but served a bad copy of layer 1
  std::vector<PlannerPiece> pieces = {{0, 1, 4 * kMiB, {}}, {1, 0, 4 * kMiB, {}}};
  PlannerOptions options;
  options.per_peer = 1;
  options.default_rate = 10 * kMiB;
  const ReadPlan plan = PlanReads(peers, pieces, {{1, 0}}, options);
  ASSERT_EQ(plan.assignments.size(), 2u);
  EXPECT_NE(plan.assignments[0].peer, 0u);
  EXPECT_EQ(plan.assignments[0].piece, 0u);
  EXPECT_EQ(plan.assignments[1].peer, 0u);  // layer 0 is fine there
}

TEST(LayerPlannerTest, ExcludedPeersOfAPieceAreSkipped) {
  std::vector<PlannerPeer> peers(2);
  std::vector<PlannerPiece> pieces = {{7, 0, 4 * kMiB, {0}}};
  const ReadPlan plan = PlanReads(peers, pieces, {}, PlannerOptions{});
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0].piece, 7u);
  EXPECT_EQ(plan.assignments[0].peer, 1u);
}

TEST(LayerPlannerTest, NoUsablePeerLeftIsUnservable) {
  std::vector<PlannerPeer> peers(2);
  peers[0].usable = false;
  std::vector<PlannerPiece> pieces = {{0, 0, kMiB, {}}, {1, 1, kMiB, {1}}, {2, 2, kMiB, {}}};
  const ReadPlan plan = PlanReads(peers, pieces, {{2, 1}}, PlannerOptions{});
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0].piece, 0u);
  EXPECT_THAT(plan.unservable, ElementsAre(1, 2));
  EXPECT_THAT(PlanReads({}, pieces, {}, PlannerOptions{}).unservable, ElementsAre(0, 1, 2));
}

TEST(LayerPlannerTest, DroppedPeersRankLast) {
  std::vector<PlannerPeer> peers(3);
  peers[0].rate = 100 * kMiB;
  peers[0].usable = false;
  peers[1].rate = 5 * kMiB;
  peers[2].rate = 50 * kMiB;
  EXPECT_THAT(RankPeers(peers, PlannerOptions{}), ElementsAre(2, 1, 0));
}

}  // namespace
}  // namespace shoal::worker
