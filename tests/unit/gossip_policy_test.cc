// Gossip mode's pure decisions: interpolation factors, the divergence
// threshold, the clock update, the interpolation that keeps in-flight steps,
// the flow-control choice (fake clock, seeded randomness), the publication
// board, the projection and the consensus distance.
#include "services/worker/core/gossip_policy.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/gossip_status.h"
#include "services/worker/core/gossip_board.h"

namespace shoal::worker {
namespace {

GossipConfig Config(const std::string& interpolation, double threshold = 0) {
  GossipConfig g;
  EXPECT_TRUE(ParseInterpolation(interpolation, &g).ok()) << interpolation;
  g.divergence_threshold = threshold;
  return g;
}

TEST(GossipFactor, Constant) {
  EXPECT_DOUBLE_EQ(InterpolationFactor(Config("constant:0.3"), {100, 1}, {5, 2}), 0.3);
  EXPECT_DOUBLE_EQ(InterpolationFactor(Config("constant"), {100, 1}, {5, 2}), 0.5);
}

TEST(GossipFactor, ClockWeighsTheMoreTrainedModel) {
  const GossipConfig g = Config("clock");
  EXPECT_DOUBLE_EQ(InterpolationFactor(g, {100, 1}, {300, 1}), 0.75);
  EXPECT_DOUBLE_EQ(InterpolationFactor(g, {300, 1}, {100, 1}), 0.25);
  // A fresh worker (clock 0) takes the peer's model whole.
  EXPECT_DOUBLE_EQ(InterpolationFactor(g, {0, 1}, {640, 1}), 1.0);
  EXPECT_DOUBLE_EQ(InterpolationFactor(g, {0, 1}, {0, 1}), 0.5);
}

TEST(GossipFactor, LossAsDpwaDefinesIt) {
  const GossipConfig g = Config("loss");
  // loss / (loss + peer_loss): a peer with a lower loss weighs more.
  EXPECT_DOUBLE_EQ(InterpolationFactor(g, {0, 0.6}, {0, 0.2}), 0.75);
  EXPECT_DOUBLE_EQ(InterpolationFactor(g, {0, 0.2}, {0, 0.6}), 0.25);
  EXPECT_DOUBLE_EQ(InterpolationFactor(g, {0, 0}, {0, 0}), 0.5);
}

TEST(GossipFactor, DivergenceThresholdScalesDownBelowIt) {
  // Below the threshold: a *= loss / threshold.
  EXPECT_DOUBLE_EQ(InterpolationFactor(Config("constant:0.5", 0.4), {0, 0.1}, {0, 1}), 0.125);
  // At or above it: unchanged.
  EXPECT_DOUBLE_EQ(InterpolationFactor(Config("constant:0.5", 0.4), {0, 0.4}, {0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(InterpolationFactor(Config("constant:0.5", 0.4), {0, 2.0}, {0, 1}), 0.5);
  // Off at 0.
  EXPECT_DOUBLE_EQ(InterpolationFactor(Config("constant:0.5", 0), {0, 0.01}, {0, 1}), 0.5);
  // Applies to clock too.
  EXPECT_DOUBLE_EQ(InterpolationFactor(Config("clock", 0.2), {100, 0.1}, {100, 1}), 0.25);
}

TEST(GossipFactor, HostilePeerStateStaysInRange) {
  const GossipConfig g = Config("clock");
  const double a = InterpolationFactor(g, {100, 1}, {NAN, 1});
  EXPECT_GE(a, 0.0);
  EXPECT_LE(a, 1.0);
  EXPECT_LE(InterpolationFactor(Config("loss"), {0, 1}, {0, -5}), 1.0);
}

TEST(GossipClock, InterpolatedWithTheSameFactorKeepingNewSamples) {
  // Fetch started at clock 1000; 640 samples trained meanwhile; peer at 3000.
  EXPECT_DOUBLE_EQ(InterpolateClock(1640, 1000, 3000, 0.5), 2640);
  // a = 1 adopts the peer's clock plus the samples trained since.
  EXPECT_DOUBLE_EQ(InterpolateClock(1640, 1000, 3000, 1.0), 3640);
  EXPECT_DOUBLE_EQ(InterpolateClock(1640, 1000, 3000, 0.0), 1640);
}

TEST(GossipInterpolation, KeepsTheStepsTakenDuringTheFetch) {
  // base = the model when the fetch started; params = base + the steps
  // trained while it was in flight.
  std::vector<float> base = {1, 2, 3, 4};
  std::vector<float> peer = {3, 2, 1, 0};
  std::vector<float> params = {1.5f, 2.5f, 3.5f, 4.5f};  // +0.5 each since base
  ApplyInterpolation(params.data(), base.data(), peer.data(), params.size(), 0.5);
  // (1 - a) * base + a * peer, plus the in-flight delta 0.5.
  EXPECT_EQ(params, (std::vector<float>{2.5f, 2.5f, 2.5f, 2.5f}));
  // With no in-flight steps it is dpwa's params = a * peer + (1 - a) * params.
  std::vector<float> p2 = base;
  ApplyInterpolation(p2.data(), base.data(), peer.data(), p2.size(), 0.25);
  EXPECT_FLOAT_EQ(p2[0], 0.75f * 1 + 0.25f * 3);
}

TEST(GossipConfigParse, RejectsBadKnobs) {
  shoal::v1::RunConfig c;
  c.mutable_gossip()->set_fetch_probability(0.5);
  c.mutable_gossip()->set_interpolation("clock");
  EXPECT_TRUE(ParseGossipConfig(c).ok());
  c.mutable_gossip()->set_fetch_probability(1.5);
  EXPECT_EQ(ParseGossipConfig(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.mutable_gossip()->set_fetch_probability(1);
  for (const char* bad : {"constant:0", "constant:1.5", "constant:x", "nearest"}) {
    c.mutable_gossip()->set_interpolation(bad);
    EXPECT_EQ(ParseGossipConfig(c).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  c.mutable_gossip()->set_interpolation("constant:1");
  c.mutable_gossip()->set_divergence_threshold(-1);
  EXPECT_EQ(ParseGossipConfig(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.mutable_gossip()->set_divergence_threshold(0.2);
  EXPECT_TRUE(ParseGossipConfig(c).ok());
}

TEST(GossipCheckpointPeriod, NextMultipleOfTheLocalSteps) {
  EXPECT_EQ(NextCheckpointStep(0, 100), 100u);
  EXPECT_EQ(NextCheckpointStep(99, 100), 100u);
  EXPECT_EQ(NextCheckpointStep(100, 100), 200u);
  // A checkpointer named at step 250 first uploads at step 300, not 350.
  EXPECT_EQ(NextCheckpointStep(250, 100), 300u);
  EXPECT_EQ(NextCheckpointStep(7, 0), 0u);  // 0 = never
}

TEST(GossipCheckpointPeriod, DueAtTheFirstPublicationAtOrPastTheStep) {
  // gossip_every = 30 does not divide every = 100: publications at 90, 120.
  const uint64_t due = NextCheckpointStep(0, 100);
  EXPECT_FALSE(CheckpointDue(90, due));
  EXPECT_TRUE(CheckpointDue(120, due));
  EXPECT_EQ(NextCheckpointStep(120, 100), 200u);  // the period does not drift
  EXPECT_FALSE(CheckpointDue(1000000, 0));        // never
}

TEST(GossipCheckpointer, StaysWhileItGossipsElseTheFirstGossipingMemberTakesOver) {
  using coordinator::DecideGossipCheckpointer;
  using C = coordinator::GossipCheckpointerCandidate;
  // No checkpointer yet: the first gossiping member by id.
  auto d = DecideGossipCheckpointer("", {C{"w1", false}, C{"w2", true}, C{"w3", true}});
  EXPECT_TRUE(d.changed);
  EXPECT_EQ(d.worker_id, "w2");
  // Sticky: a smaller id joining does not move it.
  d = DecideGossipCheckpointer("w3", {C{"w1", true}, C{"w3", true}});
  EXPECT_FALSE(d.changed);
  EXPECT_EQ(d.worker_id, "w3");
  // It left (or is not gossiping any more): the next takes over.
  d = DecideGossipCheckpointer("w3", {C{"w1", true}, C{"w2", true}});
  EXPECT_TRUE(d.changed);
  EXPECT_EQ(d.worker_id, "w1");
  d = DecideGossipCheckpointer("w1", {C{"w1", false}, C{"w2", true}});
  EXPECT_EQ(d.worker_id, "w2");
  // Nobody gossips: none, and that is a change only when there was one.
  d = DecideGossipCheckpointer("w2", {C{"w1", false}});
  EXPECT_TRUE(d.changed);
  EXPECT_TRUE(d.worker_id.empty());
  d = DecideGossipCheckpointer("", {});
  EXPECT_FALSE(d.changed);
}

TEST(ConsensusEvaluator, TheMostTrainedTakesOverOnlyWellAhead) {
  using coordinator::DecideConsensusEvaluator;
  using C = coordinator::ConsensusCandidate;
  // None yet: the most trained (the first among equals).
  auto d = DecideConsensusEvaluator("", {C{"w1", 100}, C{"w2", 300}, C{"w3", 300}});
  EXPECT_TRUE(d.changed);
  EXPECT_EQ(d.worker_id, "w2");
  EXPECT_EQ(d.reason, "300 steps, the most trained");
  // Sticky: 1.5 x 100 + 10 = 160 steps are not enough to move it...
  d = DecideConsensusEvaluator("w1", {C{"w1", 100}, C{"w2", 160}});
  EXPECT_FALSE(d.changed);
  EXPECT_EQ(d.worker_id, "w1");
  // ...161 are.
  d = DecideConsensusEvaluator("w1", {C{"w1", 100}, C{"w2", 161}});
  EXPECT_TRUE(d.changed);
  EXPECT_EQ(d.worker_id, "w2");
  // It left: the most trained of the rest; nobody left: none.
  d = DecideConsensusEvaluator("w2", {C{"w1", 5}});
  EXPECT_EQ(d.worker_id, "w1");
  d = DecideConsensusEvaluator("w1", {});
  EXPECT_TRUE(d.changed);
  EXPECT_TRUE(d.worker_id.empty());
}

TEST(PeerChooser, TimeoutsMakeAPeerRareButNeverExcluded) {
  FakeClock clock;
  PeerChooser chooser(&clock, /*seed=*/42, /*recovery_half_life=*/absl::Seconds(60));
  chooser.SetPeers({{"w1", "a:1"}, {"w2", "a:2"}, {"w3", "a:3"}});
  for (int i = 0; i < 10; ++i) chooser.OnTimeout("w2");
  EXPECT_DOUBLE_EQ(chooser.Score("w2"), PeerChooser::kMinScore);
  std::map<std::string, int> picks;
  for (int i = 0; i < 4000; ++i) ++picks[*chooser.Choose()];
  // w2: 0.05 / 2.05 of the picks (about 98 of 4000); never zero.
  EXPECT_GT(picks["w2"], 20);
  EXPECT_LT(picks["w2"], 250);
  EXPECT_GT(picks["w1"], 1700);
  EXPECT_GT(picks["w3"], 1700);
}

TEST(PeerChooser, SuccessRaisesAndTimeRecovers) {
  FakeClock clock;
  PeerChooser chooser(&clock, 7, absl::Seconds(60));
  chooser.SetPeers({{"w1", "a:1"}, {"w2", "a:2"}});
  chooser.OnTimeout("w1");
  EXPECT_DOUBLE_EQ(chooser.Score("w1"), 0.5);
  chooser.OnTimeout("w1");
  EXPECT_DOUBLE_EQ(chooser.Score("w1"), 0.25);
  // One half-life later it has recovered half of the way to 1.
  clock.Advance(absl::Seconds(60));
  EXPECT_NEAR(chooser.Score("w1"), 0.625, 1e-9);
  chooser.OnSuccess("w1");
  EXPECT_NEAR(chooser.Score("w1"), 0.875, 1e-9);
  chooser.OnSuccess("w1");
  EXPECT_DOUBLE_EQ(chooser.Score("w1"), 1.0);
}

TEST(PeerChooser, SeededAndKeepsScoresAcrossPeerUpdates) {
  FakeClock clock;
  PeerChooser a(&clock, 5), b(&clock, 5);
  const std::map<std::string, std::string> peers = {{"w1", "x:1"}, {"w2", "x:2"}, {"w3", "x:3"}};
  a.SetPeers(peers);
  b.SetPeers(peers);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(*a.Choose(), *b.Choose());
  a.OnTimeout("w3");
  a.SetPeers({{"w3", "x:3"}, {"w4", "x:4"}});  // w1, w2 left; w4 joined
  EXPECT_DOUBLE_EQ(a.Score("w3"), 0.5);
  EXPECT_DOUBLE_EQ(a.Score("w4"), 1.0);
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(a.Address("w4"), "x:4");
  a.SetPeers({});
  EXPECT_FALSE(a.Choose().has_value());
}

TEST(GossipBoard, ReadersKeepTheirCopyWhilePublishingGoesOn) {
  GossipBoard board;
  EXPECT_EQ(board.Find(1).status().code(), absl::StatusCode::kNotFound);
  std::vector<float> m = {1, 2, 3};
  auto first = board.Publish(m.data(), m.size(), 64, 2.0);
  ASSERT_NE(first, nullptr);
  auto held = board.Find(first->publication);
  ASSERT_TRUE(held.ok());
  // Many later publications never touch the held copy.
  for (int i = 0; i < 20; ++i) {
    m[0] = 100 + i;
    ASSERT_NE(board.Publish(m.data(), m.size(), 64 * (i + 2), 1.0), nullptr);
  }
  EXPECT_EQ((*held)->params, (std::vector<float>{1, 2, 3}));
  EXPECT_DOUBLE_EQ((*held)->clock, 64);
  EXPECT_EQ(board.Current()->params[0], 119);
  first.reset();
  held->reset();
  // Old publications not held are eventually rewritten: FAILED_PRECONDITION.
  for (int i = 0; i < 5; ++i) board.Publish(m.data(), m.size(), 1, 1);
  EXPECT_EQ(board.Find(1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GossipBoard, SkipsAPublicationWhenEveryCopyIsHeld) {
  GossipBoard board;
  std::vector<float> m = {1};
  std::vector<std::shared_ptr<const GossipCopy>> held;
  for (size_t i = 0; i < GossipBoard::kMaxCopies; ++i) {
    held.push_back(board.Publish(m.data(), 1, i, 0));
    ASSERT_NE(held.back(), nullptr);
  }
  EXPECT_EQ(board.Publish(m.data(), 1, 99, 0), nullptr);
  EXPECT_EQ(board.skipped(), 1u);
  held.erase(held.begin());
  EXPECT_NE(board.Publish(m.data(), 1, 99, 0), nullptr);
}

TEST(GossipProjection, SameSeedSameMatrixAndDistancesPreserved) {
  std::vector<float> x(5000), y(5000);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(i * 0.1);
    y[i] = x[i] + 0.01f * std::cos(i * 0.7);
  }
  const auto px = ProjectModel(x.data(), x.size(), 11);
  EXPECT_EQ(px, ProjectModel(x.data(), x.size(), 11));
  EXPECT_NE(px, ProjectModel(x.data(), x.size(), 12));
  const auto py = ProjectModel(y.data(), y.size(), 11);
  double true_d = 0, proj_d = 0;
  for (size_t i = 0; i < x.size(); ++i) true_d += (x[i] - y[i]) * (x[i] - y[i]);
  for (size_t j = 0; j < px.size(); ++j) proj_d += (px[j] - py[j]) * (px[j] - py[j]);
  // 32 dims: within a factor of 2 of the true distance.
  EXPECT_GT(std::sqrt(proj_d), 0.5 * std::sqrt(true_d));
  EXPECT_LT(std::sqrt(proj_d), 2.0 * std::sqrt(true_d));
}

TEST(ConsensusDistance, RmsToTheMean) {
  google::protobuf::RepeatedField<float> a, b, c, odd;
  for (float v : {0.f, 0.f}) a.Add(v);
  for (float v : {2.f, 0.f}) b.Add(v);
  for (float v : {2.f, 0.f}) c.Add(v);
  odd.Add(1);
  uint32_t used = 0;
  EXPECT_DOUBLE_EQ(coordinator::ConsensusDistance({&a}, &used), -1);
  EXPECT_EQ(used, 1u);
  EXPECT_DOUBLE_EQ(coordinator::ConsensusDistance({&b, &c}, &used), 0);
  // mean (1, 0): distances 1 and 1.
  EXPECT_DOUBLE_EQ(coordinator::ConsensusDistance({&a, &b, &odd}, &used), 1);
  EXPECT_EQ(used, 2u);
}

}  // namespace
}  // namespace shoal::worker
