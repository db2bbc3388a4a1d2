// The control-plane relay's worker side (issue 12 item 5, docs/SUPERNODES.md
// "Relay") with the real binaries on 127.0.0.1:
//  - two zones (3 + 2 workers), --relay=on: the members' sessions go
//    through their zone's supernode (the status says so), every round
//    completes with all five, the hashes agree, and only supernodes open
//    Relay streams;
//  - a supernode killed (SIGKILL) during training: its members go back to
//    the coordinator (or to the new supernode), the rounds go on and the
//    hashes agree;
//  - overlapped rounds of streaming fragments (int8 + Nesterov, hierarchical
//    rounds) through the relay: every round with everyone, one hash;
//  - --relay=off (the default): nobody is relayed.
// MLP, every worker in every round (--adaptive_deadline=false).
#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

// zone path -> its supernode.
std::map<std::string, std::string> Supernodes(const v1::RunStatus& s) {
  std::map<std::string, std::string> out;
  for (const auto& z : s.zones()) {
    if (!z.supernode().empty()) out[z.path()] = z.supernode();
  }
  return out;
}

// True when every worker of a zone with a supernode, other than the
// supernode, has its session through that supernode.
bool AllRelayedThroughTheirHead(const v1::RunStatus& s, size_t workers) {
  if (static_cast<size_t>(s.workers_size()) < workers) return false;
  const auto heads = Supernodes(s);
  size_t relayed = 0;
  for (const auto& w : s.workers()) {
    auto it = heads.find(w.zone());
    if (it == heads.end()) return false;
    if (it->second == w.id()) {
      if (!w.relayed_by().empty()) return false;  // a supernode is direct
    } else if (w.relayed_by() != it->second) {
      return false;
    } else {
      ++relayed;
    }
  }
  return relayed > 0;
}

class RelayE2eTest : public ClusterTest {
 protected:
  // A run of `rounds` rounds with one worker per entry of `zones` and
  // --relay=on (plus `flags`): every member relayed through its zone's
  // supernode, then the run finishes with every worker in every round, one
  // model hash, and every worker exits 0.
  void RunRelayedToTheEnd(const std::vector<std::string>& zones, int rounds,
                          const std::vector<std::string>& flags) {
    std::vector<std::string> all = {absl::StrCat("--min_participants=", zones.size()),
                                    absl::StrCat("--rounds=", rounds),
                                    "--learning_rate=0.05",
                                    "--relay=on",
                                    "--adaptive_deadline=false",
                                    "--round_timeout=300s"};
    all.insert(all.end(), flags.begin(), flags.end());
    const std::string addr = StartCoordinator(all);
    for (const std::string& zone : zones) StartWorker(addr, {"--zone=" + zone});
    const v1::RunStatus relayed = WaitForStatus(
        [&](const v1::RunStatus& s) { return AllRelayedThroughTheirHead(s, zones.size()); },
        absl::Minutes(3));
    ASSERT_TRUE(AllRelayedThroughTheirHead(relayed, zones.size()))
        << relayed.DebugString() << Logs();
    const v1::RunStatus status = WaitForStatus(
        [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(8));
    ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
    EXPECT_EQ(status.last_completed_round(), static_cast<uint64_t>(rounds));
    for (const auto& r : status.recent_rounds()) {
      EXPECT_EQ(r.participants(), zones.size()) << "round " << r.round() << Logs();
    }
    for (const auto& w : status.workers()) {
      EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
    }
    for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(60)), 0) << w->Log();
  }
};

TEST_F(RelayE2eTest, MembersGoThroughTheirSupernodeAndRoundsAgree) {
  // Enough rounds (about 0.4 s each) for the status to show the settled
  // routes before the run ends.
  RunRelayedToTheEnd({"eu", "us", "eu", "us", "eu"}, 20, {"--local_steps=40"});
  if (HasFatalFailure()) return;
  // Only supernodes opened Relay streams: at least one per zone, at most
  // one more per zone when the first measurements re-elect it (the first
  // head is chosen by id).
  const std::string log = coordinator_->Log();
  size_t streams = 0;
  const std::string opened = "relay opened by ";
  for (size_t at = log.find(opened); at != std::string::npos; at = log.find(opened, at + 1)) {
    ++streams;
    const std::string relay =
        log.substr(at + opened.size(), log.find(' ', at + opened.size()) - at - opened.size());
    EXPECT_NE(log.find(absl::StrCat(": supernode ", relay, " ")), std::string::npos)
        << relay << " relayed but was never a supernode\n"
        << log;
  }
  // Re-elections while the first measurements come in may hand a zone to
  // another head more than once, each opening its own stream: no upper
  // bound here (seen: 5 in one run), only that each opener was a supernode.
  EXPECT_GE(streams, 2u) << log;
}

// The supernode of "eu" is killed with -9 once rounds go through it. Its
// members go direct (and then to the zone's next head); directives the
// dead relay had in flight come again on their new session (once failed
// in a full `ctest -j2` run when a replanned RoundPlan was lost with it).
TEST_F(RelayE2eTest, SupernodeKilledItsMembersGoOnWithoutLosingTheRun) {
  const std::vector<std::string> zones = {"eu", "us", "eu", "us", "eu"};
  const std::string addr = StartCoordinator({"--min_participants=4", "--local_steps=20",
                                             "--relay=on", "--heartbeat_lease=4s",
                                             "--connection_timeout=2s", "--max_connection_retry=2",
                                             "--round_timeout=20s", "--adaptive_deadline=false"});
  for (const std::string& zone : zones) StartWorker(addr, {"--zone=" + zone});
  const v1::RunStatus before = WaitForStatus(
      [&](const v1::RunStatus& s) {
        return s.last_completed_round() >= 1 && AllRelayedThroughTheirHead(s, zones.size());
      },
      absl::Minutes(3));
  ASSERT_TRUE(AllRelayedThroughTheirHead(before, zones.size())) << before.DebugString() << Logs();
  const std::string head = Supernodes(before).at("eu");
  Process* victim = WorkerById(head);
  ASSERT_NE(victim, nullptr);
  victim->Signal(SIGKILL);
  // The four others go on together; none is relayed through the dead one.
  const v1::RunStatus after =
      ExpectRoundsGoOn(before.last_completed_round(), 3, 4, absl::Seconds(180));
  for (const auto& w : after.workers()) {
    if (w.id() == head) continue;
    EXPECT_NE(w.relayed_by(), head) << w.id() << after.DebugString();
  }
}

// Issue 27's modes through the relay: the ready report of the round trained
// ahead, the plans and the round-done reports of overlapped fragment rounds
// all go through the zones' supernodes, and the run ends as one model.
TEST_F(RelayE2eTest, OverlappedFragmentRoundsGoThroughTheRelay) {
  constexpr int kRounds = 16;
  RunRelayedToTheEnd({"eu", "us", "eu", "us"}, kRounds,
                     {"--local_steps=25", "--hierarchy=on", "--overlap=on", "--fragments=4",
                      "--codec=int8", "--outer_optimizer=nesterov", "--outer_lr=0.7"});
  if (HasFatalFailure()) return;
  for (auto& w : workers_) {
    // Every worker trained ahead and carried it.
    EXPECT_NE(w->Log().find("overlapped rounds: "), std::string::npos) << w->Log();
    EXPECT_EQ(w->Log().find("overlapped rounds: 0 carried"), std::string::npos) << w->Log();
  }
  // Every worker agreed on every round it logged.
  std::map<uint64_t, std::set<std::string>> hashes;
  for (auto& w : workers_) {
    for (const auto& [round, hash] : RoundHashes(w->Log())) hashes[round].insert(hash);
  }
  EXPECT_GE(hashes.size(), static_cast<size_t>(kRounds - 1));
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round;
}

TEST_F(RelayE2eTest, OffByDefault) {
  const std::string addr = StartCoordinator(
      {"--min_participants=3", "--local_steps=10", "--rounds=2", "--adaptive_deadline=false"});
  for (const std::string& zone : {"eu", "eu", "eu"}) StartWorker(addr, {"--zone=" + zone});
  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(3));
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  for (const auto& w : status.workers()) EXPECT_EQ(w.relayed_by(), "") << w.id();
  EXPECT_EQ(coordinator_->Log().find("relay opened by"), std::string::npos);
}

}  // namespace
}  // namespace shoal
