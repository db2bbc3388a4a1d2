// Robust aggregation at slice owners (issue 14, docs/SECURITY.md) with the
// real binaries on 127.0.0.1: five workers, one of them the misbehaving peer
// shoal-poison-worker (tests/support/poison_worker.cc: a real worker whose
// every contribution is its trained model times 1000).
//  - --aggregation=mean: the poison goes into every average and the test
//    accuracy collapses far below 0.85;
//  - --aggregation=trimmed_mean:1: the owners drop the largest and smallest
//    value of every element, the run reaches 0.85 test accuracy and every
//    worker, the poisoner included, agrees on the model hash every round;
//  - the same with --codec=int8 (the encoded exchange's owners);
//  - the same in hierarchical rounds (zones a and b, the poisoner in a):
//    the rule runs inside each zone and across the zones' heads, each
//    zone's result counting with its number of members;
//  - the coordinator refuses a trimmed mean its rounds are too small for.
// MLP, every worker in every round (--adaptive_deadline=false).
#include <gtest/gtest.h>

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

constexpr int kWorkers = 5;

class RobustTest : public ClusterTest {
 public:
  // Four honest shoal-workers and one shoal-poison-worker (the third to
  // start, so that it owns a slice in the middle of the model). With
  // `zones`, workers sit in zones a, b, a, b, a (the poisoner in a).
  void StartWorkersWithPoisoner(const std::string& coordinator, bool zones = false) {
    for (int i = 0; i < kWorkers; ++i) {
      std::vector<std::string> zone;
      if (zones) zone.push_back(i % 2 == 0 ? "--zone=a" : "--zone=b");
      if (i != 2) {
        StartWorker(coordinator, zone);
        continue;
      }
      const int n = static_cast<int>(workers_.size()) + 1;
      std::vector<std::string> argv = {BinDir() + "/shoal-poison-worker",
                                       "--coordinator=" + coordinator,
                                       "--listen=127.0.0.1:0",
                                       "--data_dir=" + DataDir(),
                                       "--eval_limit=2000",
                                       absl::StrCat("--name=poisoner-", n),
                                       "--scale=1000"};
      argv.insert(argv.end(), zone.begin(), zone.end());
      workers_.push_back(
          Process::Start(argv, absl::StrCat(dir_.path(), "/worker-", n, "-poisoner.log")));
      poisoner_ = workers_.back().get();
    }
  }

  // Runs `rounds` rounds with `aggregation`; returns the final status.
  v1::RunStatus RunWith(const std::string& aggregation, int rounds,
                        std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {absl::StrCat("--min_participants=", kWorkers),
                                      "--local_steps=60",
                                      absl::StrCat("--rounds=", rounds),
                                      "--learning_rate=0.05",
                                      "--aggregation=" + aggregation,
                                      "--adaptive_deadline=false",
                                      "--round_timeout=300s"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    const std::string addr = StartCoordinator(flags);
    address_ = addr;
    bool zones = false;
    for (const std::string& f : extra) zones = zones || f == "--hierarchy=on";
    StartWorkersWithPoisoner(addr, zones);
    const v1::RunStatus status = WaitForStatus(
        [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(8));
    EXPECT_EQ(status.phase(), v1::FINISHED) << Logs();
    EXPECT_EQ(status.last_completed_round(), static_cast<uint64_t>(rounds));
    for (const auto& r : status.recent_rounds()) {
      EXPECT_EQ(r.participants(), static_cast<uint32_t>(kWorkers)) << "round " << r.round();
    }
    // The curve, for the record (docs/SECURITY.md quotes it).
    for (const auto& r : status.recent_rounds()) {
      if (r.evaluated()) {
        std::printf("%s round %d test_accuracy %.4f\n", aggregation.c_str(),
                    static_cast<int>(r.round()), r.test_accuracy());
      }
    }
    // The poisoner did poison.
    EXPECT_NE(poisoner_->Log().find("contribution scaled by 1000"), std::string::npos)
        << poisoner_->Log();
    return status;
  }

  static double LastAccuracy(const v1::RunStatus& s) {
    const auto& last = s.recent_rounds(s.recent_rounds_size() - 1);
    EXPECT_TRUE(last.evaluated());
    return last.test_accuracy();
  }

  // Every worker logged the same hash in every round.
  void ExpectHashesAgreeEveryRound(int rounds) {
    std::map<uint64_t, std::set<std::string>> hashes;
    for (auto& w : workers_) {
      EXPECT_EQ(w->Wait(absl::Seconds(30)), 0) << w->Log();
      const auto mine = RoundHashes(w->Log());
      EXPECT_EQ(mine.size(), static_cast<size_t>(rounds)) << w->log_path();
      for (const auto& [round, hash] : mine) hashes[round].insert(hash);
    }
    EXPECT_EQ(hashes.size(), static_cast<size_t>(rounds));
    for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round;
  }

  Process* poisoner_ = nullptr;
  std::string address_;
};

TEST_F(RobustTest, MeanCollapsesUnderAScaledContribution) {
  constexpr int kRounds = 3;
  const v1::RunStatus status = RunWith("mean", kRounds);
  ASSERT_GT(status.recent_rounds_size(), 0) << Logs();
  const double accuracy = LastAccuracy(status);
  // Ten classes: a collapsed model is near chance (0.1); the same run with
  // trimmed_mean:1 below is above 0.85.
  EXPECT_LT(accuracy, 0.5) << Logs();
  // Collapsed, but consistently: the hash check still holds (it checks that
  // workers agree on the result, not that the result is any good).
  for (const auto& w : status.workers()) EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
}

TEST_F(RobustTest, TrimmedMeanReachesTheTargetAndHashesAgree) {
  constexpr int kRounds = 10;
  const v1::RunStatus status = RunWith("trimmed_mean:1", kRounds);
  ASSERT_GT(status.recent_rounds_size(), 0) << Logs();
  EXPECT_GE(LastAccuracy(status), 0.85) << Logs();
  for (const auto& w : status.workers()) EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
  EXPECT_EQ(status.config().exchange().aggregation(), "trimmed_mean:1");
  int code = -1;
  const std::string table = Run(BinDir() + "/shoalctl status --coordinator=" + address_, &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(table.find("aggregation trimmed_mean:1"), std::string::npos) << table;
  ExpectHashesAgreeEveryRound(kRounds);
}

// The encoded exchange (int8): the owners combine the decoded changes by
// the same rule; the poisoner's change (its model x 1000 minus the base) is
// trimmed away just the same.
TEST_F(RobustTest, TrimmedMeanHoldsInTheEncodedExchange) {
  constexpr int kRounds = 10;
  const v1::RunStatus status = RunWith("trimmed_mean:1", kRounds, {"--codec=int8"});
  ASSERT_GT(status.recent_rounds_size(), 0) << Logs();
  EXPECT_GE(LastAccuracy(status), 0.85) << Logs();
  for (const auto& w : status.workers()) EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
  ExpectHashesAgreeEveryRound(kRounds);
}

// Hierarchical rounds (docs/SECURITY.md, "Robust aggregation in zones"):
// zone a (the poisoner and two honest workers) trims inside the zone, and
// the heads combine the zones' results by the weighted rule (zone a counts
// three times, zone b twice), so the poison never reaches the model.
TEST_F(RobustTest, TrimmedMeanHoldsInHierarchicalRounds) {
  constexpr int kRounds = 10;
  const v1::RunStatus status = RunWith("trimmed_mean:1", kRounds, {"--hierarchy=on"});
  ASSERT_GT(status.recent_rounds_size(), 0) << Logs();
  EXPECT_NE(coordinator_->Log().find("hierarchical stages"), std::string::npos)
      << coordinator_->Log();
  EXPECT_GE(LastAccuracy(status), 0.85) << Logs();
  for (const auto& w : status.workers()) EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
  ExpectHashesAgreeEveryRound(kRounds);
}

// 2K + 1 > --min_participants: refused at start, naming the flag.
TEST_F(RobustTest, CoordinatorRefusesATrimTooLargeForItsRounds) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--min_participants=4", "--aggregation=trimmed_mean:2"},
        std::vector<std::string>{"--aggregation=trimmed_mean:0"},
        std::vector<std::string>{"--aggregation=krum"},
        std::vector<std::string>{"--mode=gossip", "--aggregation=median"}}) {
    std::vector<std::string> argv = {BinDir() + "/shoal-coordinator", "--listen=127.0.0.1:0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto p = Process::Start(argv, absl::StrCat(dir_.path(), "/refused-", flags.back(), ".log"));
    EXPECT_EQ(p->Wait(absl::Seconds(20)), 2) << p->Log();
    EXPECT_NE(p->Log().find("--aggregation"), std::string::npos) << p->Log();
  }
}

}  // namespace
}  // namespace shoal
