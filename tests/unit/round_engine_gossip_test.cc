// RoundEngine in gossip mode: no rounds; JoinRound puts a member in the
// peer list, every change of the list (join, leave, lease loss) goes to
// every gossiping member as a PeerUpdate; the status shows each worker's
// gossip figures and the consensus distance.
#include "common/clock.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/round_engine.h"
#include "tests/unit/round_engine_test_util.h"

namespace shoal::coordinator {
namespace {

using namespace test_util;  // NOLINT
constexpr auto kPeers = CoordinatorMessage::kPeerUpdate;

class GossipEngineTest : public ::testing::Test {
 protected:
  GossipEngineTest() : engine_(Options(), &clock_) {}
  static EngineOptions Options() {
    EngineOptions o;
    o.config.set_mode("gossip");
    o.config.set_min_participants(2);
    o.config.set_local_steps(5);
    o.run_id = "gossip-run";
    o.heartbeat_lease = absl::Seconds(10);
    return o;
  }
  std::string Join(int port, Directives* out) {
    shoal::v1::JoinRequest r;
    r.set_peer_address(Address(port));
    auto joined = engine_.Join(r);
    EXPECT_TRUE(joined.ok()) << joined.status();
    const std::string id = joined->response.worker_id();
    EXPECT_TRUE(engine_.Connect(id).ok());
    auto admitted = engine_.JoinRound(id, 0, out);
    EXPECT_TRUE(admitted.ok()) << admitted.status();
    return id;
  }
  std::vector<std::string> PeersIn(const CoordinatorMessage& m) {
    std::vector<std::string> ids;
    for (const auto& p : m.peer_update().peers()) ids.push_back(p.worker_id());
    return ids;
  }

  FakeClock clock_;
  RoundEngine engine_;
};

TEST_F(GossipEngineTest, PeerListGoesToEveryMemberOnEachChangeAndNoRoundStarts) {
  Directives out;
  const std::string w1 = Join(1001, &out);
  EXPECT_EQ(To(out, kPeers), std::vector<std::string>{w1});
  out.clear();
  const std::string w2 = Join(1002, &out);
  EXPECT_EQ(To(out, kPeers), (std::vector<std::string>{w1, w2}));
  const CoordinatorMessage m = MessageFor(out, w1, kPeers);
  EXPECT_EQ(PeersIn(m), (std::vector<std::string>{w1, w2}));
  EXPECT_EQ(m.peer_update().peers(1).peer_address(), Address(1002));
  const uint64_t v = m.peer_update().version();
  out.clear();
  const std::string w3 = Join(1003, &out);
  // No round in gossip mode, whatever min_participants says.
  EXPECT_TRUE(To(out, kStart).empty());
  EXPECT_GT(MessageFor(out, w3, kPeers).peer_update().version(), v);

  // A leave updates the others.
  out = engine_.Disconnect(w2, "stream broken");
  EXPECT_EQ(To(out, kPeers), (std::vector<std::string>{w1, w3}));
  EXPECT_EQ(PeersIn(MessageFor(out, w3, kPeers)), (std::vector<std::string>{w1, w3}));

  // A crash (heartbeats stop) too, within the lease.
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(engine_.Heartbeat(w1).ok());
  clock_.Advance(absl::Seconds(6));
  out = engine_.Tick();
  EXPECT_EQ(To(out, kPeers), std::vector<std::string>{w1});
  EXPECT_EQ(PeersIn(MessageFor(out, w1, kPeers)), std::vector<std::string>{w1});
  const shoal::v1::RunStatus s = engine_.Status();
  EXPECT_EQ(s.phase(), shoal::v1::TRAINING);
  EXPECT_EQ(s.last_completed_round(), 0u);
  EXPECT_NE(s.detail().find("gossip"), std::string::npos) << s.detail();
}

TEST_F(GossipEngineTest, StatusShowsGossipFiguresAndConsensusDistance) {
  Directives out;
  const std::string w1 = Join(1001, &out);
  const std::string w2 = Join(1002, &out);
  shoal::v1::Heartbeat hb;
  hb.set_gossip(true);
  hb.set_gossip_clock(6400);
  hb.set_gossip_loss(0.42);
  hb.set_test_accuracy(0.81);
  hb.set_eval_clock(6000);
  hb.set_fetches_done(7);
  hb.set_fetches_timed_out(1);
  hb.set_last_partner(w2);
  hb.set_last_factor(0.5);
  hb.add_projection(0);
  hb.add_projection(0);
  ASSERT_TRUE(engine_.Heartbeat(w1, hb).ok());
  shoal::v1::RunStatus s = engine_.Status();
  EXPECT_DOUBLE_EQ(s.consensus_distance(), -1);  // one report only
  hb.set_last_partner(w1);
  hb.set_projection(0, 2);
  ASSERT_TRUE(engine_.Heartbeat(w2, hb).ok());
  s = engine_.Status();
  EXPECT_DOUBLE_EQ(s.consensus_distance(), 1);
  EXPECT_EQ(s.consensus_workers(), 2u);
  const auto w = FindWorker(s, w1);
  ASSERT_TRUE(w.has_value());
  EXPECT_TRUE(w->gossip());
  EXPECT_DOUBLE_EQ(w->gossip_clock(), 6400);
  EXPECT_DOUBLE_EQ(w->test_accuracy(), 0.81);
  EXPECT_EQ(w->fetches_done(), 7u);
  EXPECT_EQ(w->fetches_timed_out(), 1u);
  EXPECT_EQ(w->last_partner(), w2);
  EXPECT_DOUBLE_EQ(w->last_factor(), 0.5);
}

}  // namespace
}  // namespace shoal::coordinator
