// The hierarchical round (issue 12, docs/SUPERNODES.md) with the real
// binaries on 127.0.0.1:
//  - two zones (3 + 2 workers), --hierarchy=on: every round completes with
//    all five, the coordinator sends hierarchical plans, every worker logs
//    the same model hash every round, the non-heads read their zone's
//    model from their head (BROADCAST), and the final accuracy is within a
//    few points of the same run flat (--hierarchy=off);
//  - a zone's head killed mid-round: the round is re-planned among the
//    survivors, still hierarchical, and completes with agreeing hashes;
//  - --hierarchy=on with every worker in one zone: flat plans;
//  - hierarchical rounds with int8 and nesterov (the changes travel int8 at
//    every level): hashes agree every round, the heads' exchange across
//    zones carries about a quarter of the fp32 bytes, and the run trains;
//  - the coordinator refuses what has no meaning (--hierarchy with gossip,
//    a bad value).
// MLP, every worker in every round (--adaptive_deadline=false).
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

class HierarchyTest : public ClusterTest {
 public:
  // Runs `rounds` rounds with one worker per entry of `zones`; returns the
  // final status once every worker has exited.
  v1::RunStatus RunWith(const std::vector<std::string>& zones, const std::string& hierarchy,
                        int rounds, std::vector<std::string> extra = {}) {
    workers_.clear();
    std::vector<std::string> flags = {absl::StrCat("--min_participants=", zones.size()),
                                      "--local_steps=40",
                                      absl::StrCat("--rounds=", rounds),
                                      "--learning_rate=0.05",
                                      "--hierarchy=" + hierarchy,
                                      "--adaptive_deadline=false",
                                      "--round_timeout=300s"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    const std::string addr = StartCoordinator(flags);
    for (const std::string& zone : zones) StartWorker(addr, {"--zone=" + zone});
    const v1::RunStatus status = WaitForStatus(
        [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(8));
    EXPECT_EQ(status.phase(), v1::FINISHED) << Logs();
    EXPECT_EQ(status.last_completed_round(), static_cast<uint64_t>(rounds));
    for (const auto& r : status.recent_rounds()) {
      EXPECT_EQ(r.participants(), static_cast<uint32_t>(zones.size())) << "round " << r.round();
      if (r.evaluated()) {
        std::printf("hierarchy=%s round %d test_accuracy %.4f\n", hierarchy.c_str(),
                    static_cast<int>(r.round()), r.test_accuracy());
      }
    }
    for (const auto& w : status.workers()) EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
    // Every worker logged the same hash in every round.
    std::map<uint64_t, std::set<std::string>> hashes;
    for (auto& w : workers_) {
      EXPECT_EQ(w->Wait(absl::Seconds(60)), 0) << w->Log();
      const auto mine = RoundHashes(w->Log());
      EXPECT_EQ(mine.size(), static_cast<size_t>(rounds)) << w->log_path();
      for (const auto& [round, hash] : mine) hashes[round].insert(hash);
    }
    EXPECT_EQ(hashes.size(), static_cast<size_t>(rounds));
    for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round;
    return status;
  }

  static double LastAccuracy(const v1::RunStatus& s) {
    if (s.recent_rounds_size() == 0) return 0;
    const auto& last = s.recent_rounds(s.recent_rounds_size() - 1);
    EXPECT_TRUE(last.evaluated());
    return last.test_accuracy();
  }
};

TEST_F(HierarchyTest, TwoZonesAgreeEveryRoundAndTrainLikeFlat) {
  constexpr int kRounds = 4;
  const std::vector<std::string> zones = {"eu/paris", "us/east", "eu/paris", "us/east", "eu/paris"};
  const v1::RunStatus flat = RunWith(zones, "off", kRounds);
  EXPECT_EQ(coordinator_->Log().find("hierarchical stages"), std::string::npos);
  const double flat_accuracy = LastAccuracy(flat);
  coordinator_.reset();  // stopped by PID

  const v1::RunStatus hier = RunWith(zones, "on", kRounds);
  // eu/paris (3) and us/east (2) average inside, their heads across, the
  // heads broadcast back: 3 stages (eu and us have one candidate each).
  EXPECT_NE(coordinator_->Log().find("3 hierarchical stages"), std::string::npos)
      << coordinator_->Log();
  for (auto& w : workers_) {
    EXPECT_NE(w->Log().find("averaging hierarchical/fp32"), std::string::npos) << w->Log();
  }
  // The long links: only stage 2 (the heads' exchange, one per zone)
  // crosses zones, and it moves one model's worth per zone: each of the two
  // heads reads half the model from the other and half back averaged.
  uint64_t elements = 0;
  uint64_t cross_zone = 0;
  int heads = 0;
  for (auto& w : workers_) {
    const std::string log = w->Log();
    const size_t p = log.find(" parameters, hash");
    ASSERT_NE(p, std::string::npos) << log;
    const size_t open = log.rfind('(', p);
    ASSERT_TRUE(absl::SimpleAtoi(log.substr(open + 1, p - open - 1), &elements)) << log;
    const size_t at = log.rfind(" stage_in=");
    ASSERT_NE(at, std::string::npos) << log;
    const std::vector<std::string> stages =
        absl::StrSplit(log.substr(at + 10, log.find(' ', at + 10) - at - 10), '/');
    ASSERT_EQ(stages.size(), 3u) << log;
    uint64_t up = 0, across = 0, down = 0;
    ASSERT_TRUE(absl::SimpleAtoi(stages[0], &up));
    ASSERT_TRUE(absl::SimpleAtoi(stages[1], &across));
    ASSERT_TRUE(absl::SimpleAtoi(stages[2], &down));
    EXPECT_GT(up, 0u) << log;  // everyone averages inside its zone
    // A head takes part in the exchange across and reads nothing down; the
    // others the reverse, one whole model from their head.
    if (across > 0) {
      ++heads;
      EXPECT_EQ(down, 0u) << log;
    } else {
      EXPECT_EQ(down, elements * sizeof(float)) << log;
    }
    cross_zone += across;
  }
  EXPECT_EQ(heads, 2);
  EXPECT_EQ(cross_zone, 2 * elements * sizeof(float));
  const double hier_accuracy = LastAccuracy(hier);
  std::printf("final test_accuracy flat %.4f hierarchical %.4f\n", flat_accuracy, hier_accuracy);
  EXPECT_GE(hier_accuracy, 0.7);
  EXPECT_LT(std::fabs(hier_accuracy - flat_accuracy), 0.03);
}

// A zone's head is killed while the round shares: the coordinator re-plans
// the round (a new attempt, as in the flat exchange) among the survivors,
// and the zone's standby (its next smallest id) leads the zone; the round
// completes with three participants and the hashes agree. Zone b's group is
// the same in the new attempt, so its workers carry it instead of redoing
// it: its head at least, which finished it before averaging across zones.
TEST_F(HierarchyTest, HeadKilledMidRoundTheStandbyLeadsTheReplan) {
  const std::string addr = StartCoordinator(
      {"--min_participants=3", "--local_steps=20", "--hierarchy=on", "--heartbeat_lease=10s",
       "--connection_timeout=5s", "--max_connection_retry=2", "--round_timeout=30s",
       // The kill is noticed by the broken session, not by a timeout; these
       // only keep a loaded machine's live workers in the round that is
       // checked (its participants are counted).
       "--adaptive_deadline=false"});
  const std::vector<std::string> zones = {"a", "b", "a", "b"};
  // Upload caps stretch the exchange to about a second.
  for (const std::string& zone : zones) {
    StartWorker(addr, {"--zone=" + zone, "--upload_rate_mbps=6"});
  }
  for (auto& w : workers_) {
    ASSERT_TRUE(WaitUntil([&] { return !WorkerId(w.get()).empty(); }, absl::Seconds(30)))
        << w->Log();
  }
  const std::string id1 = WorkerId(workers_[0].get());
  const std::string id3 = WorkerId(workers_[2].get());
  Process* head = id1 < id3 ? workers_[0].get() : workers_[2].get();
  WaitForStatus(
      [](const v1::RunStatus& s) {
        return s.last_completed_round() >= 1 && s.participants_size() == 4;
      },
      absl::Seconds(90));
  const v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& s) {
        return s.phase() == v1::SHARING && s.participants_size() == 4 &&
               s.detail().find("done sharing") != std::string::npos;
      },
      absl::Seconds(60));
  head->Signal(SIGKILL);
  const v1::RunStatus after = ExpectRoundsGoOn(s.last_completed_round(), 2, 3);
  bool replanned = false;
  for (const auto& r : after.recent_rounds()) {
    if (r.round() == s.round()) replanned = r.participants() == 3;
  }
  EXPECT_TRUE(replanned) << after.DebugString() << Logs();
  // The re-plan is still hierarchical (zones a and b both have survivors).
  const std::string log = coordinator_->Log();
  const size_t replan = log.find(absl::StrCat("round ", s.round(), " plan attempt 2"));
  ASSERT_NE(replan, std::string::npos) << log;
  const std::string line = log.substr(replan, log.find('\n', replan) - replan);
  EXPECT_NE(line.find("3 participants"), std::string::npos) << line;
  EXPECT_NE(line.find("hierarchical stages"), std::string::npos) << line;
  bool carried = false;
  const std::string prefix = absl::StrCat("round ", s.round(), ": ");
  for (int k : {1, 3}) {
    const std::string wlog = workers_[k]->Log();
    for (size_t at = wlog.find(prefix); at != std::string::npos; at = wlog.find(prefix, at + 1)) {
      if (wlog.substr(at, wlog.find('\n', at) - at).find(" carried=") != std::string::npos) {
        carried = true;
      }
    }
  }
  EXPECT_TRUE(carried) << "no worker of zone b carried its zone's group\n" << Logs();
}

TEST_F(HierarchyTest, OneZoneIsFlat) {
  RunWith({"eu/paris", "eu/paris", "eu/paris"}, "on", 2);
  EXPECT_EQ(coordinator_->Log().find("hierarchical stages"), std::string::npos)
      << coordinator_->Log();
}

// Bytes each worker read in each stage, from its last "stage_in=A/B/C".
std::vector<uint64_t> LastStageBytes(const std::string& log) {
  std::vector<uint64_t> out;
  const size_t at = log.rfind(" stage_in=");
  if (at == std::string::npos) return out;
  for (absl::string_view part :
       absl::StrSplit(log.substr(at + 10, log.find(' ', at + 10) - at - 10), '/')) {
    uint64_t v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

uint64_t ModelElements(const std::string& log) {
  const size_t p = log.find(" parameters, hash");
  if (p == std::string::npos) return 0;
  const size_t open = log.rfind('(', p);
  uint64_t elements = 0;
  if (!absl::SimpleAtoi(log.substr(open + 1, p - open - 1), &elements)) return 0;
  return elements;
}

// Hierarchy, int8 and nesterov at once (issue 25): the slow links' users
// want all three. RunWith checks that every worker logged the same hash in
// every round.
TEST_F(HierarchyTest, Int8AndNesterovComposeWithTheHierarchy) {
  constexpr int kRounds = 4;
  const std::vector<std::string> zones = {"eu/paris", "us/east", "eu/paris", "us/east", "eu/paris"};
  const v1::RunStatus hier = RunWith(
      zones, "on", kRounds,
      {"--codec=int8", "--outer_optimizer=nesterov", "--outer_lr=0.7", "--outer_momentum=0.9"});
  EXPECT_NE(coordinator_->Log().find("3 hierarchical stages"), std::string::npos)
      << coordinator_->Log();
  uint64_t cross_zone = 0, elements = 0;
  for (auto& w : workers_) {
    const std::string log = w->Log();
    EXPECT_NE(log.find("averaging hierarchical/int8"), std::string::npos) << log;
    elements = ModelElements(log);
    const std::vector<uint64_t> stages = LastStageBytes(log);
    ASSERT_EQ(stages.size(), 3u) << log;
    cross_zone += stages[1];
  }
  ASSERT_GT(elements, 0u);
  // The heads' exchange across zones moves one model's worth per zone, in
  // int8: a quarter of fp32 and a scale per 256 elements.
  const double fp32_bytes = 2.0 * elements * sizeof(float);
  std::printf("bytes across zones per round: %llu (fp32: %.0f, ratio %.3f)\n",
              static_cast<unsigned long long>(cross_zone), fp32_bytes, cross_zone / fp32_bytes);
  EXPECT_GT(cross_zone, 0u);
  EXPECT_LT(cross_zone / fp32_bytes, 0.3);
  EXPECT_GE(LastAccuracy(hier), 0.7) << Logs();
}

TEST_F(HierarchyTest, CoordinatorRefusesWhatHasNoMeaning) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--hierarchy=on", "--mode=gossip"},
        std::vector<std::string>{"--hierarchy=maybe"}}) {
    std::vector<std::string> argv = {BinDir() + "/shoal-coordinator", "--listen=127.0.0.1:0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto p = Process::Start(argv, absl::StrCat(dir_.path(), "/refused-", flags.back(), ".log"));
    EXPECT_EQ(p->Wait(absl::Seconds(20)), 2) << p->Log();
    EXPECT_NE(p->Log().find("hierarchy"), std::string::npos) << p->Log();
  }
}

}  // namespace
}  // namespace shoal
