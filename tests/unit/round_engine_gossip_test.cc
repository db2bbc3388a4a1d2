// RoundEngine in gossip mode: no rounds; JoinRound puts a member in the
// peer list, every change of the list (join, leave, lease loss) goes to
// every gossiping member as a PeerUpdate; the status shows each worker's
// gossip figures and the consensus distance.
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/round_engine.h"
#include "tests/unit/round_engine_test_util.h"

namespace shoal::coordinator {
namespace {

using namespace test_util;  // NOLINT
using ::testing::HasSubstr;
constexpr auto kPeers = CoordinatorMessage::kPeerUpdate;

class GossipEngineTest : public ::testing::Test {
 protected:
  GossipEngineTest() : engine_(Options(), &clock_) {}
  static EngineOptions Options() {
    EngineOptions o;
    o.config.mutable_gossip();
    o.config.mutable_training()->set_local_steps(5);
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
  EXPECT_EQ(m.peer_update().consensus_evaluator(), "");  // --consensus_eval_every off
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

// Members joined at these ports, gossiping (their ids in *ids, in order).
void JoinGossipers(RoundEngine* engine, const std::vector<int>& ports,
                   std::vector<std::string>* ids, Directives* out) {
  for (int port : ports) {
    shoal::v1::JoinRequest r;
    r.set_peer_address(Address(port));
    auto joined = engine->Join(r);
    ASSERT_TRUE(joined.ok()) << joined.status();
    ids->push_back(joined->response.worker_id());
    ASSERT_TRUE(engine->Connect(ids->back()).ok());
    ASSERT_TRUE(engine->JoinRound(ids->back(), 0, out).ok());
  }
}

// --gossip_steps with the final average: the list goes out once every
// member is done, the run finishes once every recipient reported, and the
// phase stays FINISHED when the workers' sessions close afterwards.
TEST(GossipFinalAverageEngineTest, ListWhenAllAreDoneThenFinishedWhenAllReported) {
  FakeClock clock;
  EngineOptions o;
  o.config.mutable_gossip()->set_steps(100);
  o.config.mutable_gossip()->set_final_average(true);
  o.run_id = "gossip-final";
  o.heartbeat_lease = absl::Seconds(10);
  RoundEngine engine(o, &clock);
  Directives out;
  std::vector<std::string> ids;
  ASSERT_NO_FATAL_FAILURE(JoinGossipers(&engine, {1003, 1001, 1002}, &ids, &out));
  constexpr auto kFinal = CoordinatorMessage::kGossipFinal;
  shoal::v1::Heartbeat done;
  done.set_gossip(true);
  done.set_gossip_done(true);
  ASSERT_TRUE(engine.Heartbeat(ids[0], done).ok());
  ASSERT_TRUE(engine.Heartbeat(ids[1], done).ok());
  out = engine.Tick();
  EXPECT_TRUE(To(out, kFinal).empty());
  EXPECT_THAT(engine.Status().final_average(), HasSubstr("still training: " + ids[2]));

  ASSERT_TRUE(engine.Heartbeat(ids[2], done).ok());
  out = engine.Tick();
  EXPECT_EQ(To(out, kFinal).size(), 3u);
  const CoordinatorMessage list = MessageFor(out, ids[0], kFinal);
  ASSERT_EQ(list.gossip_final().sources_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(list.gossip_final().sources(i).worker_id(), ids[i]);  // w1, w2, w3
  }
  EXPECT_EQ(list.gossip_final().sources(0).peer_address(), Address(1003));
  EXPECT_TRUE(To(engine.Tick(), kFinal).empty()) << "sent once";

  shoal::v1::Heartbeat reported = done;
  reported.set_final_hash(std::string(64, 'd'));
  reported.set_final_models(3);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(engine.Heartbeat(ids[i], reported).ok());
  EXPECT_TRUE(To(engine.Tick(), kFinished).empty());
  ASSERT_TRUE(engine.Heartbeat(ids[2], reported).ok());
  out = engine.Tick();
  EXPECT_EQ(To(out, kFinished).size(), 3u);
  shoal::v1::RunStatus s = engine.Status();
  EXPECT_EQ(s.phase(), shoal::v1::FINISHED);
  EXPECT_EQ(s.final_average(), "3 final models averaged by 3 workers; hashes agree (dddddddddddd)");
  const auto w = FindWorker(s, ids[1]);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->model_hash(), std::string(64, 'd'));
  EXPECT_EQ(w->final_models(), 3u);
  for (const std::string& id : ids) engine.Disconnect(id, "session stream closed");
  EXPECT_EQ(engine.Status().phase(), shoal::v1::FINISHED);
}

// --consensus_eval_every: the coordinator names the most trained member
// the consensus evaluator, keeps it until another trained 1.5 x its steps
// (or it left), and tells everyone with a PeerUpdate; without the flag
// nobody is named.
TEST(GossipConsensusEvaluatorTest, TheMostTrainedMemberEvaluatesStickily) {
  FakeClock clock;
  EngineOptions o;
  o.config.mutable_gossip()->set_consensus_eval_every(50);
  o.run_id = "gossip-consensus";
  o.heartbeat_lease = absl::Seconds(10);
  RoundEngine engine(o, &clock);
  Directives out;
  std::vector<std::string> ids;
  ASSERT_NO_FATAL_FAILURE(JoinGossipers(&engine, {1001, 1002, 1003}, &ids, &out));
  auto steps = [&](int i, uint64_t n) {
    shoal::v1::Heartbeat hb;
    hb.set_gossip(true);
    hb.set_gossip_steps(n);
    ASSERT_TRUE(engine.Heartbeat(ids[i], hb).ok());
  };
  auto evaluator_in = [&](const Directives& d, const std::string& id) {
    return MessageFor(d, id, kPeers).peer_update().consensus_evaluator();
  };
  // Nobody trained yet: the first eligible member, told to everyone.
  out = engine.Tick();
  ASSERT_EQ(To(out, kPeers).size(), 3u);
  EXPECT_EQ(evaluator_in(out, ids[2]), ids[0]);
  EXPECT_TRUE(To(engine.Tick(), kPeers).empty()) << "no change, no update";
  // w2 ahead, but not by 1.5 x: w1 stays.
  steps(0, 100);
  steps(1, 150);
  EXPECT_TRUE(To(engine.Tick(), kPeers).empty());
  // w3 far ahead (w1 is the slow one): it takes over.
  steps(2, 400);
  out = engine.Tick();
  EXPECT_EQ(evaluator_in(out, ids[0]), ids[2]);
  // It leaves: the most trained of the others.
  out = engine.Disconnect(ids[2], "stream broken");
  out = engine.Tick();
  EXPECT_EQ(evaluator_in(out, ids[0]), ids[1]);
}

class GossipCheckpointEngineTest : public GossipEngineTest {
 protected:
  static EngineOptions WithStore(std::optional<shoal::v1::RunRecord> resume = std::nullopt) {
    EngineOptions o = Options();
    o.config.mutable_checkpoints()->set_store("127.0.0.1:50052");
    o.config.mutable_gossip()->set_checkpoint_every(100);
    o.resume = std::move(resume);
    return o;
  }
  static shoal::v1::ReportCheckpointRequest Report(const std::string& worker, uint64_t sequence) {
    shoal::v1::ReportCheckpointRequest r;
    r.set_worker_id(worker);
    r.set_round(sequence);
    r.set_checkpoint_id(absl::StrCat("gossip-run-r", sequence));
    r.set_gossip_clock(3200.0 * sequence);
    r.set_gossip_steps(100 * sequence);
    return r;
  }
};

TEST_F(GossipCheckpointEngineTest, OneCheckpointerPickedToldAndReplacedWhenItDies) {
  RoundEngine engine(WithStore(), &clock_);
  auto join = [&](int port, Directives* out) {
    shoal::v1::JoinRequest r;
    r.set_peer_address(Address(port));
    auto joined = engine.Join(r);
    EXPECT_TRUE(joined.ok()) << joined.status();
    const std::string id = joined->response.worker_id();
    EXPECT_TRUE(engine.Connect(id).ok());
    EXPECT_TRUE(engine.JoinRound(id, 0, out).ok());
    return id;
  };
  Directives out;
  const std::string w1 = join(1001, &out);
  ASSERT_EQ(To(out, kCheckpoint), std::vector<std::string>{w1});
  const CoordinatorMessage told = MessageFor(out, w1, kCheckpoint);
  const auto& request = told.checkpoint_request();
  EXPECT_TRUE(request.gossip());
  EXPECT_EQ(request.round(), 1u);
  EXPECT_EQ(request.run_id(), "gossip-run");
  out.clear();
  const std::string w2 = join(1002, &out);
  const std::string w3 = join(1003, &out);
  EXPECT_TRUE(To(out, kCheckpoint).empty());  // sticky
  EXPECT_EQ(engine.Status().checkpointer(), w1);

  // Only the checkpointer's reports count, and only past the latest.
  EXPECT_EQ(engine.ReportCheckpoint(Report(w2, 1), &out).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine.ReportCheckpoint(Report(w1, 1), &out).ok());
  ASSERT_TRUE(engine.ReportCheckpoint(Report(w1, 2), &out).ok());
  EXPECT_EQ(engine.ReportCheckpoint(Report(w1, 2), &out).code(),
            absl::StatusCode::kFailedPrecondition);
  shoal::v1::ReportCheckpointRequest failed = Report(w1, 3);
  failed.clear_checkpoint_id();
  failed.set_error("store unavailable");
  ASSERT_TRUE(engine.ReportCheckpoint(failed, &out).ok());  // kept; it tries again
  shoal::v1::RunStatus s = engine.Status();
  EXPECT_EQ(s.checkpoint_id(), "gossip-run-r2");
  EXPECT_EQ(s.checkpoint_round(), 2u);
  EXPECT_DOUBLE_EQ(s.checkpoint_clock(), 6400);
  EXPECT_EQ(s.checkpoint_steps(), 200u);
  EXPECT_EQ(s.checkpoint_worker(), w1);
  EXPECT_GT(s.checkpoint_unix_ms(), 0);
  EXPECT_EQ(engine.Record().checkpoint_id(), "gossip-run-r2");

  // The checkpointer is killed: the next gossiping member takes over and
  // numbers its uploads after the latest.
  out = engine.Disconnect(w1, "stream broken");
  ASSERT_EQ(To(out, kCheckpoint), std::vector<std::string>{w2});
  EXPECT_EQ(MessageFor(out, w2, kCheckpoint).checkpoint_request().round(), 3u);
  EXPECT_EQ(engine.Status().checkpointer(), w2);
  EXPECT_EQ(engine.ReportCheckpoint(Report(w1, 3), &out).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(engine.ReportCheckpoint(Report(w2, 3), &out).ok());
  EXPECT_EQ(engine.Status().checkpoint_worker(), w2);

  // Heartbeats stop (a frozen process): the lease moves the role too.
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(engine.Heartbeat(w3).ok());
  clock_.Advance(absl::Seconds(6));
  out = engine.Tick();
  EXPECT_EQ(To(out, kCheckpoint), std::vector<std::string>{w3});
}

TEST_F(GossipCheckpointEngineTest, NoCheckpointerWithoutAStoreOrAPeriod) {
  Directives out;
  Join(1001, &out);  // the fixture's engine has no store
  EXPECT_TRUE(To(out, kCheckpoint).empty());
  EXPECT_TRUE(engine_.Status().checkpointer().empty());
  EngineOptions o = WithStore();
  o.config.mutable_gossip()->set_checkpoint_every(0);
  RoundEngine never(o, &clock_);
  shoal::v1::JoinRequest r;
  r.set_peer_address(Address(1001));
  auto joined = never.Join(r);
  ASSERT_TRUE(joined.ok());
  ASSERT_TRUE(never.Connect(joined->response.worker_id()).ok());
  out.clear();
  ASSERT_TRUE(never.JoinRound(joined->response.worker_id(), 0, &out).ok());
  EXPECT_TRUE(To(out, kCheckpoint).empty());
}

TEST_F(GossipCheckpointEngineTest, AResumedRunNamesItsCheckpointAndNoModelToCatchUpOn) {
  shoal::v1::RunRecord record;
  record.set_run_id("gossip-run");
  record.set_last_completed_round(7);  // as ResumeFromStore sets it
  record.set_model_hash("abc");
  record.set_checkpoint_id("gossip-run-r7");
  record.set_checkpoint_round(7);
  RoundEngine engine(WithStore(record), &clock_);
  shoal::v1::JoinRequest r;
  r.set_peer_address(Address(1001));
  auto joined = engine.Join(r);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->response.checkpoint_id(), "gossip-run-r7");
  EXPECT_EQ(joined->response.model_round(), 0u);
  EXPECT_TRUE(joined->response.model_hash().empty());
  EXPECT_EQ(joined->response.holders_size(), 0);
  const std::string id = joined->response.worker_id();
  ASSERT_TRUE(engine.Connect(id).ok());
  Directives out;
  ASSERT_TRUE(engine.JoinRound(id, 0, &out).ok());
  // Uploads continue the numbering.
  EXPECT_EQ(MessageFor(out, id, kCheckpoint).checkpoint_request().round(), 8u);
}

}  // namespace
}  // namespace shoal::coordinator
