// Gossip mode end to end (issue 11): real coordinator and worker processes
// on 127.0.0.1 training the MLP on Fashion-MNIST without rounds.
//  - 4 gossiping workers reach 0.85 test accuracy (mean of their latest
//    evaluations), every one of them fetches and merges peers' models, and
//    the status reports the consensus distance;
//  - a worker killed with -9 costs each survivor at most one failed fetch,
//    and a late joiner starts from a peer's trained model, then gossips;
//  - --codec=int8: pulls travel int8, and a finite run still ends with one
//    final model, the same bits on every worker, and its accuracy.
// Waits are hang guards that scale with the step times the run measures;
// nothing asserts a speed.
#include <signal.h>

#include <map>
#include <string>

#include "common/worker_state.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

std::vector<std::string> GossipFlags(std::vector<std::string> more = {}) {
  std::vector<std::string> flags = {"--mode=gossip",
                                    "--gossip_every=10",
                                    "--eval_every=5",
                                    "--fetch_probability=1",
                                    "--interpolation=constant:0.5",
                                    "--gossip_timeout=10s",
                                    "--heartbeat_interval=500ms",
                                    "--learning_rate=0.05",
                                    "--min_participants=4"};
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

double MeanAccuracy(const v1::RunStatus& s, int* evaluated) {
  double sum = 0;
  *evaluated = 0;
  for (const auto& w : s.workers()) {
    if (DepartedState(w.state()) || w.eval_clock() <= 0) continue;
    sum += w.test_accuracy();
    ++*evaluated;
  }
  return *evaluated ? sum / *evaluated : 0;
}

class GossipTest : public ClusterTest {
 protected:
  // Seconds per local step the workers measure so far (from the status),
  // to scale the waits; at least 5 ms.
  double StepSeconds(const v1::RunStatus& s, absl::Time since) {
    uint64_t steps = 0;
    for (const auto& w : s.workers()) steps = std::max<uint64_t>(steps, w.gossip_steps());
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - since);
    return steps > 0 ? std::max(0.005, elapsed / steps) : 0.05;
  }
};

TEST_F(GossipTest, FourWorkersReach85PercentWithoutRounds) {
  const std::string addr = StartCoordinator(GossipFlags());
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 4; ++i) StartWorker(addr);
  // Everyone trains and gossips: a hang guard first, then a wait in
  // proportion to the measured step time (0.85 takes well under 3,000
  // steps per worker here).
  v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& st) {
        int gossiping = 0;
        for (const auto& w : st.workers()) gossiping += w.gossip() && w.gossip_steps() >= 50;
        return gossiping == 4;
      },
      absl::Minutes(3));
  const double step = StepSeconds(s, t0);
  const absl::Duration budget = absl::Seconds(std::max(60.0, 3000 * step * 3));
  int evaluated = 0;
  s = WaitForStatus(
      [&](const v1::RunStatus& st) {
        int n = 0;
        return MeanAccuracy(st, &n) >= 0.85 && n == 4;
      },
      budget);
  const double accuracy = MeanAccuracy(s, &evaluated);
  EXPECT_GE(accuracy, 0.85) << s.DebugString() << Logs();
  EXPECT_EQ(evaluated, 4);
  EXPECT_EQ(s.phase(), v1::TRAINING);
  EXPECT_EQ(s.last_completed_round(), 0u);  // no rounds at all
  for (const auto& w : s.workers()) {
    EXPECT_TRUE(w.gossip()) << w.id();
    EXPECT_GT(w.fetches_done(), 0u) << w.id() << Logs();
    EXPECT_FALSE(w.last_partner().empty()) << w.id();
    EXPECT_NE(w.last_partner(), w.id());
    EXPECT_GT(w.last_factor(), 0.0);
    EXPECT_GT(w.gossip_clock(), 0.0);
  }
  EXPECT_EQ(s.consensus_workers(), 4u);
  EXPECT_GE(s.consensus_distance(), 0.0);
  printf("gossip e2e: mean test accuracy %.4f after %.1fs, consensus distance %.5f\n", accuracy,
         absl::ToDoubleSeconds(absl::Now() - t0), s.consensus_distance());

  // shoalctl shows the gossip table.
  int code = -1;
  const std::string table = Run(BinDir() + "/shoalctl status --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(table.find("consensus_distance"), std::string::npos) << table;
  EXPECT_NE(table.find("FETCH_OK/TO/X"), std::string::npos) << table;
  for (auto& w : workers_) EXPECT_EQ(w->Stop(), 0) << w->Log();
}

TEST_F(GossipTest, KilledPeerCostsAtMostOneFetchAndALateJoinerStartsFromAPeer) {
  const std::string addr = StartCoordinator(GossipFlags({"--min_participants=3"}));
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& st) {
        int n = 0;
        for (const auto& w : st.workers()) n += w.fetches_done() >= 3 && w.eval_clock() > 0;
        return n == 3;
      },
      absl::Minutes(3));
  const double step = StepSeconds(s, t0);
  std::map<std::string, uint64_t> failures_before;
  for (const auto& w : s.workers()) {
    failures_before[w.id()] = w.fetches_timed_out() + w.fetches_failed();
  }
  Process* victim = workers_[2].get();
  const std::string victim_id = WorkerId(victim);
  ASSERT_FALSE(victim_id.empty());
  victim->Signal(SIGKILL);
  victim->Wait(absl::Seconds(10));
  // The others go on fetching (from each other): wait for 5 more merges each.
  std::map<std::string, uint64_t> done_before;
  for (const auto& w : s.workers()) done_before[w.id()] = w.fetches_done();
  s = WaitForStatus(
      [&](const v1::RunStatus& st) {
        int n = 0;
        for (const auto& w : st.workers()) {
          if (w.id() == victim_id || DepartedState(w.state())) continue;
          n += w.fetches_done() >= done_before[w.id()] + 5;
        }
        return n == 2;
      },
      absl::Seconds(std::max(60.0, 200 * step * 4)));
  const v1::WorkerStatus* gone = FindWorker(s, victim_id);
  ASSERT_NE(gone, nullptr);
  EXPECT_TRUE(DepartedState(gone->state())) << gone->state();
  for (const auto& w : s.workers()) {
    if (w.id() == victim_id) continue;
    EXPECT_LE(w.fetches_timed_out() + w.fetches_failed(), failures_before[w.id()] + 1)
        << w.id() << Logs();
  }

  // A late joiner starts from a trained peer's model.
  Process* late = StartWorker(addr);
  ASSERT_TRUE(
      WaitUntil([&] { return late->Log().find("late join: started from") != std::string::npos; },
                absl::Seconds(60)))
      << late->Log();
  const std::string late_id = WorkerId(late);
  s = WaitForStatus(
      [&](const v1::RunStatus& st) {
        const v1::WorkerStatus* w = FindWorker(st, late_id);
        return w != nullptr && w->eval_clock() > 0 && w->fetches_done() > 0;
      },
      absl::Seconds(std::max(60.0, 200 * step * 4)));
  const v1::WorkerStatus* joiner = FindWorker(s, late_id);
  ASSERT_NE(joiner, nullptr);
  // Its model is a trained one from its first evaluation on (a fresh MLP
  // after 50 steps is far below this).
  EXPECT_GT(joiner->test_accuracy(), 0.7) << Logs();
  EXPECT_GT(joiner->gossip_clock(), 64.0 * joiner->gossip_steps()) << "clock adopted from a peer";
  for (auto& w : workers_) {
    if (w.get() != victim) {
      EXPECT_EQ(w->Stop(), 0) << w->Log();
    }
  }
}

// Compressed pulls (issue 25): each publication is encoded once, peers
// fetch the int8 encoding and decode it; the final average adds every
// worker's decoded final model, its own included, so the hashes agree.
TEST_F(GossipTest, Int8PullsEndWithOneFinalModel) {
  const std::string addr = StartCoordinator(GossipFlags(
      {"--codec=int8", "--gossip_steps=500", "--min_participants=3", "--eval_every=10"}));
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  const v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& st) { return st.phase() == v1::FINISHED; }, absl::Minutes(5));
  ASSERT_EQ(s.phase(), v1::FINISHED) << s.DebugString() << Logs();
  EXPECT_NE(s.final_average().find("3 final models averaged by 3 workers; hashes agree"),
            std::string::npos)
      << s.final_average() << Logs();
  ASSERT_EQ(s.workers_size(), 3);
  const std::string hash = s.workers(0).model_hash();
  EXPECT_EQ(hash.size(), 64u);
  for (const auto& w : s.workers()) {
    EXPECT_EQ(w.model_hash(), hash) << w.id();
    EXPECT_GT(w.fetches_done(), 0u) << w.id();
    EXPECT_GE(w.test_accuracy(), 0.75) << w.id() << Logs();
    printf("gossip int8: %s final test accuracy %.4f\n", w.id().c_str(), w.test_accuracy());
  }
  for (auto& w : workers_) {
    EXPECT_EQ(w->Wait(absl::Seconds(30)), 0) << w->Log();
    EXPECT_NE(w->Log().find("pulls int8"), std::string::npos) << w->Log();
  }
}

}  // namespace
}  // namespace shoal
