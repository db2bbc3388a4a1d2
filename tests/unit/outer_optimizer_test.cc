// The outer optimizer (services/worker/core/outer_optimizer.h) against a
// hand-computed reference over a few rounds: none and sgd are stateless,
// nesterov keeps m = mu m + g with g = -(averaged change) and steps
// new = base - lr (g + mu m); a round's momentum counts only once the round
// is committed, a void round leaves the committed one; a slice at a time is
// the same as the whole vector. The values are exact in float, so the
// comparisons are exact.
#include "services/worker/core/outer_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <vector>

namespace shoal::worker {
namespace {

OuterStep Make(OuterOptimizer kind, float lr, float mu, uint64_t total) {
  OuterOptions o;
  o.kind = kind;
  o.lr = lr;
  o.momentum = mu;
  return OuterStep(o, total);
}

// The changes handed to Apply: OuterStep reads a round's change again at
// Commit, so it must outlive the call (the exchanger keeps its change
// buffer for the round).
std::deque<std::vector<float>>& KeptChanges() {
  static auto* kept = new std::deque<std::vector<float>>();
  return *kept;
}

std::vector<float> Step(OuterStep* s, uint64_t round, const std::vector<float>& base,
                        const std::vector<float>& change) {
  std::vector<float> out(base.size(), -99.0f);
  const std::vector<float>& kept = KeptChanges().emplace_back(change);
  s->Apply(round, 0, base.size(), base.data(), kept.data(), out.data());
  return out;
}

TEST(OuterStepTest, NoneAddsTheAveragedChange) {
  OuterStep s = Make(OuterOptimizer::kNone, 0.7f, 0.9f, 2);
  EXPECT_FALSE(s.has_state());
  EXPECT_TRUE(s.momentum().empty());
  EXPECT_EQ(Step(&s, 1, {1.0f, -2.0f}, {-0.5f, 1.0f}), (std::vector<float>{0.5f, -1.0f}));
  s.Commit(1);
  EXPECT_EQ(Step(&s, 2, {0.5f, -1.0f}, {0.25f, 0.5f}), (std::vector<float>{0.75f, -0.5f}));
  // Stateless: a momentum handed to it is ignored.
  EXPECT_TRUE(s.SetMomentum(3, {1.0f}).ok());
  EXPECT_TRUE(s.momentum().empty());
}

TEST(OuterStepTest, SgdScalesTheStep) {
  OuterStep s = Make(OuterOptimizer::kSgd, 0.5f, 0.9f, 2);
  EXPECT_FALSE(s.has_state());
  // g = -change = [0.5, -1]; new = base - 0.5 g.
  EXPECT_EQ(Step(&s, 1, {1.0f, -2.0f}, {-0.5f, 1.0f}), (std::vector<float>{0.75f, -1.5f}));
  s.Commit(1);
  // No memory of round 1: the same change gives the same step.
  EXPECT_EQ(Step(&s, 2, {0.75f, -1.5f}, {-0.5f, 1.0f}), (std::vector<float>{0.5f, -1.0f}));
}

TEST(OuterStepTest, NesterovMatchesTheHandComputedReference) {
  const float lr = 0.5f, mu = 0.5f;
  OuterStep s = Make(OuterOptimizer::kNesterov, lr, mu, 2);
  ASSERT_TRUE(s.has_state());
  EXPECT_EQ(s.momentum(), (std::vector<float>{0.0f, 0.0f}));

  // Round 1: g = [0.5, -1]; m = [0.5, -1];
  // new = [1, -2] - 0.5 ([0.5, -1] + 0.5 [0.5, -1]) = [0.625, -1.25].
  std::vector<float> base = {1.0f, -2.0f};
  base = Step(&s, 1, base, {-0.5f, 1.0f});
  EXPECT_EQ(base, (std::vector<float>{0.625f, -1.25f}));
  // Pending until agreed.
  EXPECT_EQ(s.momentum(), (std::vector<float>{0.0f, 0.0f}));
  s.Commit(1);
  EXPECT_EQ(s.momentum(), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(s.momentum_round(), 1u);

  // Round 2, one slice at a time, written in place over the base:
  // g = [-0.25, -0.5]; m = 0.5 [0.5, -1] + g = [0, -1];
  // new = [0.625, -1.25] - 0.5 ([-0.25, -0.5] + 0.5 [0, -1]) = [0.75, -0.75].
  const std::vector<float> change2 = {0.25f, 0.5f};
  s.Apply(2, 0, 1, base.data(), change2.data(), base.data());
  s.Apply(2, 1, 1, base.data() + 1, change2.data() + 1, base.data() + 1);
  EXPECT_EQ(base, (std::vector<float>{0.75f, -0.75f}));
  s.Commit(2);
  EXPECT_EQ(s.momentum(), (std::vector<float>{0.0f, -1.0f}));

  // Round 3 is void (never committed): its momentum is dropped.
  Step(&s, 3, base, {4.0f, 4.0f});
  s.Commit(2);  // a stale commit changes nothing either
  EXPECT_EQ(s.momentum(), (std::vector<float>{0.0f, -1.0f}));
  EXPECT_EQ(s.momentum_round(), 2u);

  // Round 4 starts from round 2's momentum: g = [1, -2];
  // m = 0.5 [0, -1] + g = [1, -2.5];
  // new = [0.75, -0.75] - 0.5 ([1, -2] + 0.5 [1, -2.5]) = [0, 0.875].
  EXPECT_EQ(Step(&s, 4, base, {-1.0f, 2.0f}), (std::vector<float>{0.0f, 0.875f}));
  s.Commit(3);  // not the pending round
  EXPECT_EQ(s.momentum_round(), 2u);
  s.Commit(4);
  EXPECT_EQ(s.momentum(), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(s.momentum_round(), 4u);
}

TEST(OuterStepTest, NesterovResumesFromAMomentumHandedToIt) {
  // A worker that takes round 2's momentum (from a peer or a checkpoint)
  // steps exactly as the one that computed it.
  OuterStep a = Make(OuterOptimizer::kNesterov, 0.5f, 0.5f, 2);
  Step(&a, 1, {1.0f, -2.0f}, {-0.5f, 1.0f});
  a.Commit(1);
  OuterStep b = Make(OuterOptimizer::kNesterov, 0.5f, 0.5f, 2);
  ASSERT_TRUE(b.SetMomentum(1, a.momentum()).ok());
  EXPECT_EQ(b.momentum_round(), 1u);
  EXPECT_EQ(Step(&a, 2, {0.625f, -1.25f}, {0.25f, 0.5f}),
            Step(&b, 2, {0.625f, -1.25f}, {0.25f, 0.5f}));
  // A zero momentum would have stepped differently.
  OuterStep zero = Make(OuterOptimizer::kNesterov, 0.5f, 0.5f, 2);
  EXPECT_NE(Step(&zero, 2, {0.625f, -1.25f}, {0.25f, 0.5f}),
            Step(&b, 2, {0.625f, -1.25f}, {0.25f, 0.5f}));
}

TEST(OuterStepTest, MalformedMomentumIsRefusedAndNothingChanges) {
  OuterStep s = Make(OuterOptimizer::kNesterov, 0.5f, 0.5f, 2);
  ASSERT_TRUE(s.SetMomentum(3, {1.0f, 2.0f}).ok());
  EXPECT_EQ(s.SetMomentum(4, {1.0f}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.SetMomentum(4, {1.0f, NAN}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.SetMomentum(4, {INFINITY, 1.0f}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.momentum(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(s.momentum_round(), 3u);
}

TEST(OuterStepTest, NesterovOnAFragmentKeepsTheOtherMomentum) {
  // Streaming fragments: a round averages one part of the model; the
  // momentum of the rest is neither decayed nor dropped by its commit.
  OuterStep s = Make(OuterOptimizer::kNesterov, 0.5f, 0.5f, 2);
  ASSERT_TRUE(s.SetMomentum(4, {1.0f, -2.0f}).ok());
  // Round 5 averages element 1 only: g = [-, 1]; m1 = 0.5 (-2) + 1 = 0.
  const std::vector<float> base = {3.0f, 3.0f};
  const std::vector<float> change = {0.0f, -1.0f};
  std::vector<float> out = base;
  s.Apply(5, 1, 1, base.data() + 1, change.data() + 1, out.data() + 1);
  // new1 = 3 - 0.5 (1 + 0.5 * 0) = 2.5; element 0 is not touched.
  EXPECT_EQ(out, (std::vector<float>{3.0f, 2.5f}));
  s.Commit(5);
  EXPECT_EQ(s.momentum(), (std::vector<float>{1.0f, 0.0f}));
  // The next round averages element 0 from its own committed momentum.
  const std::vector<float> change6 = {-2.0f, 0.0f};
  s.Apply(6, 0, 1, out.data(), change6.data(), out.data());
  s.Commit(6);
  // m0 = 0.5 * 1 + 2 = 2.5; element 1's momentum is still round 5's.
  EXPECT_EQ(s.momentum(), (std::vector<float>{2.5f, 0.0f}));
}

}  // namespace
}  // namespace shoal::worker
