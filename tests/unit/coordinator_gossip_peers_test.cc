// GossipPeers on its own (services/coordinator/core/gossip_peers.h): the
// peer list and its updates, each member's gossip figures (kept with gossip,
// not with the member), the consensus evaluator, the checkpointer hand-off to
// CheckpointPlanner and the end of a run whose workers finished their steps.
// Real Membership and CheckpointPlanner parts; the harness removes members
// and carries out the mode's intents as RoundEngine does. (tests/integration/
// gossip_peers_test.cc is the workers' PeerService, not this.)
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/core/gossip_peers.h"

namespace shoal::coordinator {
namespace {

using ::shoal::v1::CoordinatorMessage;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr auto kPeers = CoordinatorMessage::kPeerUpdate;

std::vector<std::string> To(const Directives& ds, CoordinatorMessage::KindCase kind) {
  std::vector<std::string> ids;
  for (const Directive& d : ds) {
    if (d.message->kind_case() == kind) ids.push_back(d.worker_id);
  }
  return ids;
}

std::vector<std::string> PeersIn(const Directives& ds) {
  std::vector<std::string> ids;
  for (const Directive& d : ds) {
    if (d.message->kind_case() != kPeers) continue;
    for (const auto& p : d.message->peer_update().peers()) ids.push_back(p.worker_id());
    break;
  }
  return ids;
}

class Harness {
 public:
  explicit Harness(EngineOptions options)
      : options_(std::move(options)),
        members_(options_, &clock_, &versions_, clock_.Now()),
        checkpoints_(options_, &clock_, &versions_, &members_),
        gossip_(options_, &versions_, &members_, &checkpoints_) {}

  // As RoundEngine removes a member: every part forgets it, then the mode
  // draws the consequences.
  void Remove(const std::string& worker_id, MemberState why, const std::string& reason,
              Directives* out) {
    if (!members_.Contains(worker_id)) return;
    why = gossip_.DepartureState(why, reason);
    const bool was_gossiping = gossip_.Forget(worker_id, clock_.Now());
    members_.Remove(worker_id, why, reason, v1::WorkerStatus(), 1, out);
    ModeOutput mode;
    gossip_.OnDeparted(worker_id, why, reason, was_gossiping, clock_.Now(), &mode);
    Apply(std::move(mode), out);
  }
  // The mode's intents (gossip only ever ends the run).
  void Apply(ModeOutput mode, Directives* out) {
    out->insert(out->end(), mode.directives.begin(), mode.directives.end());
    for (const auto& [at, intent] : mode.intents) {
      EXPECT_EQ(intent.kind, EngineIntent::Kind::kFinishRun);
      finished_ = intent.reason;
    }
  }

  std::string Add(int port, bool outbound_only = false) {
    v1::JoinRequest request;
    request.set_peer_address(absl::StrCat("127.0.0.1:", port));
    request.set_outbound_only(outbound_only);
    absl::StatusOr<Member*> added = members_.Add(request, 1);
    EXPECT_TRUE(added.ok()) << added.status();
    members_.Refresh(**added, request, "");
    gossip_.OnJoined(**added, request, clock_.Now());
    members_.Connect(**added);
    gossip_.OnConnected(**added, clock_.Now());
    return (*added)->id;
  }
  // Joins the peer list; the directives it caused.
  Directives Gossip(const std::string& id) {
    ModeOutput mode;
    absl::StatusOr<uint64_t> admitted =
        gossip_.JoinRound(members_.At(id), 0, 0, clock_.Now(), &mode);
    EXPECT_TRUE(admitted.ok()) << admitted.status();
    Directives out;
    Apply(std::move(mode), &out);
    return out;
  }
  bool Heartbeat(const std::string& id, const v1::Heartbeat& h) {
    return gossip_.OnHeartbeat(members_.At(id), h, clock_.Now());
  }

  FakeClock clock_;
  const EngineOptions options_;
  EngineVersions versions_;
  Membership members_;
  CheckpointPlanner checkpoints_;
  GossipPeers gossip_;
  std::string finished_;
};

EngineOptions Options() {
  EngineOptions o;
  o.run_id = "run-g";
  o.config.mutable_gossip();
  return o;
}

v1::Heartbeat Figures(uint64_t steps, double loss) {
  v1::Heartbeat h;
  h.set_gossip(true);
  h.set_gossip_steps(steps);
  h.set_gossip_loss(loss);
  h.set_fetches_done(steps / 10);
  return h;
}

TEST(CoordinatorGossipPeersTest, EveryListChangeGoesToEveryGossipingMember) {
  Harness h(Options());
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  Directives out = h.Gossip(w1);
  EXPECT_THAT(To(out, kPeers), ElementsAre(w1));
  const uint64_t v1 = out[0].message->peer_update().version();
  out = h.Gossip(w2);
  EXPECT_THAT(To(out, kPeers), ElementsAre(w1, w2));
  EXPECT_THAT(PeersIn(out), ElementsAre(w1, w2));
  // One shared message for every recipient, with a newer version.
  EXPECT_EQ(out[0].message.get(), out[1].message.get());
  EXPECT_GT(out[0].message->peer_update().version(), v1);
  EXPECT_EQ(h.gossip_.phase(), v1::TRAINING);
  EXPECT_EQ(h.members_.At(w1).state, MemberState::kTraining);
  EXPECT_TRUE(h.gossip_.ConsistentForTesting());
}

TEST(CoordinatorGossipPeersTest, AMemberBehindNatHearsTheListButIsNotInIt) {
  Harness h(Options());
  const std::string w1 = h.Add(9001);
  const std::string nat = h.Add(9002, /*outbound_only=*/true);
  h.Gossip(w1);
  const Directives out = h.Gossip(nat);
  EXPECT_THAT(To(out, kPeers), ElementsAre(w1, nat));
  EXPECT_THAT(PeersIn(out), ElementsAre(w1));
}

TEST(CoordinatorGossipPeersTest, AGossipingMembersDepartureUpdatesTheRest) {
  Harness h(Options());
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  const std::string idle = h.Add(9003);  // never gossips
  h.Gossip(w1);
  h.Gossip(w2);
  Directives out;
  h.Remove(idle, MemberState::kLeft, "bye", &out);
  EXPECT_THAT(To(out, kPeers), IsEmpty());  // the list did not change
  h.Remove(w2, MemberState::kEvicted, "lease", &out);
  EXPECT_THAT(To(out, kPeers), ElementsAre(w1));
  EXPECT_THAT(PeersIn(out), ElementsAre(w1));
  EXPECT_FALSE(h.members_.Contains(w2));
  EXPECT_TRUE(h.gossip_.ConsistentForTesting());
}

TEST(CoordinatorGossipPeersTest, FiguresAreKeptWithGossipAndAPlainHeartbeatLeavesThem) {
  Harness h(Options());
  const std::string w1 = h.Add(9001);
  h.Gossip(w1);
  h.versions_.Commit();
  const uint64_t before = h.versions_.status_version();
  EXPECT_TRUE(h.Heartbeat(w1, Figures(200, 0.75)));
  h.versions_.Commit();
  EXPECT_EQ(h.versions_.status_version(), before + 1);
  // The plain heartbeat Leave sends is not taken: the figures stay shown.
  EXPECT_FALSE(h.Heartbeat(w1, v1::Heartbeat()));
  v1::WorkerStatus w;
  h.gossip_.FillWorker(w1, &w);
  EXPECT_TRUE(w.gossip());
  EXPECT_EQ(w.gossip_steps(), 200u);
  EXPECT_DOUBLE_EQ(w.gossip_loss(), 0.75);
  EXPECT_EQ(w.fetches_done(), 20u);
  // Forgotten with the member.
  Directives out;
  h.Remove(w1, MemberState::kLeft, "bye", &out);
  v1::WorkerStatus gone;
  h.gossip_.FillWorker(w1, &gone);
  EXPECT_FALSE(gone.gossip());
}

TEST(CoordinatorGossipPeersTest, RoundReportsAreRefused) {
  Harness h(Options());
  const std::string w1 = h.Add(9001);
  Member& m = h.members_.At(w1);
  ModeOutput out;
  const absl::Time now = h.clock_.Now();
  v1::ReportReadyRequest ready;
  ready.set_round(1);
  const absl::Status s = h.gossip_.ReportReady(m, ready, now, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("no rounds"));
  EXPECT_EQ(h.gossip_.ConnectionsReady(m, v1::ConnectionsReadyRequest(), now, &out).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.gossip_.ReportRoundDone(m, v1::ReportRoundDoneRequest(), now, &out).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.directives, IsEmpty());
}

TEST(CoordinatorGossipPeersTest, TheMostTrainedDirectMemberEvaluatesConsensus) {
  EngineOptions o = Options();
  o.config.mutable_gossip()->set_consensus_eval_every(100);
  Harness h(std::move(o));
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  const std::string nat = h.Add(9003, /*outbound_only=*/true);
  for (const std::string& id : {w1, w2, nat}) h.Gossip(id);
  h.Heartbeat(w1, Figures(100, 1));
  h.Heartbeat(w2, Figures(300, 1));
  h.Heartbeat(nat, Figures(900, 1));  // nobody can fetch from it
  ModeOutput out;
  h.gossip_.Tick(h.clock_.Now(), &out);
  ASSERT_THAT(To(out.directives, kPeers), ElementsAre(w1, w2, nat));
  EXPECT_EQ(out.directives[0].message->peer_update().consensus_evaluator(), w2);
  // Unchanged: no new list.
  out = ModeOutput();
  h.gossip_.Tick(h.clock_.Now(), &out);
  EXPECT_THAT(out.directives, IsEmpty());
}

TEST(CoordinatorGossipPeersTest, TheCheckpointerIsPickedOnAPeerListChange) {
  EngineOptions o = Options();
  o.config.mutable_gossip()->set_checkpoint_every(50);
  o.config.mutable_checkpoints()->set_store("127.0.0.1:7000");
  Harness h(std::move(o));
  const std::string w1 = h.Add(9001);
  const Directives out = h.Gossip(w1);
  EXPECT_THAT(To(out, CoordinatorMessage::kCheckpointRequest), ElementsAre(w1));
  // Its reports go to the planner.
  v1::ReportCheckpointRequest report;
  report.set_worker_id(w1);
  report.set_round(1);
  report.set_checkpoint_id("g-1");
  ModeOutput none;
  ASSERT_TRUE(h.gossip_.ReportCheckpoint(report, h.clock_.Now(), &none).ok());
  EXPECT_EQ(h.checkpoints_.checkpoint_id(), "g-1");
}

TEST(CoordinatorGossipPeersTest, TheRunEndsWhenItsLastMemberLeftAfterItsSteps) {
  Harness h(Options());
  const std::string w1 = h.Add(9001);
  const std::string w2 = h.Add(9002);
  h.Gossip(w1);
  h.Gossip(w2);
  Directives out;
  h.Remove(w1, MemberState::kLeft, "finished 100 gossip steps", &out);
  EXPECT_TRUE(h.finished_.empty());
  h.Remove(w2, MemberState::kLeft, "finished 100 gossip steps", &out);
  EXPECT_THAT(h.finished_, HasSubstr("2 workers finished their gossip steps"));
  EXPECT_EQ(h.gossip_.phase(), v1::FINISHED);
}

TEST(CoordinatorGossipPeersTest, ARunWhoseMembersLeftEarlyWaitsForMembers) {
  Harness h(Options());
  const std::string w1 = h.Add(9001);
  h.Gossip(w1);
  Directives out;
  h.Remove(w1, MemberState::kEvicted, "lease", &out);
  EXPECT_TRUE(h.finished_.empty());
  EXPECT_EQ(h.gossip_.phase(), v1::WAITING_FOR_MEMBERS);
}

}  // namespace
}  // namespace shoal::coordinator
