// Streaming fragments (--fragments=K, issue 27, docs/OVERLAP.md) with the
// real binaries on 127.0.0.1: round r averages fragment r mod K only, so
// from one round to the next the agreed model changes in that fragment and
// nowhere else, every worker agrees on every fragment's bits every round,
// with and without overlapped rounds and in hierarchical rounds across
// zones; a late joiner takes the agreed model and its momentum and syncs
// with the others from its first round.
#include <gtest/gtest.h>

#include <iostream>
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

constexpr uint32_t kFragments = 4;

struct RoundParts {
  uint32_t fragment = 0;
  std::vector<std::string> parts;  // a short hash of each fragment
};

// round -> the fragment it averaged and the fragments' hashes after it,
// from a worker's round lines ("... fragment=k/K ... parts=a/b/c/d ...").
std::map<uint64_t, RoundParts> FragmentLines(const std::string& log) {
  std::map<uint64_t, RoundParts> out;
  for (const auto& [round, text] : RoundLines(log)) {
    const absl::string_view line(text);
    const size_t f = line.find(" fragment=");
    const size_t p = line.find(" parts=");
    if (f == absl::string_view::npos || p == absl::string_view::npos) continue;
    RoundParts rp;
    if (!absl::SimpleAtoi(line.substr(f + 10, line.find('/', f) - f - 10), &rp.fragment)) continue;
    const size_t end = line.find(' ', p + 1);
    rp.parts =
        absl::StrSplit(line.substr(p + 7, end == absl::string_view::npos ? end : end - p - 7), '/');
    out[round] = std::move(rp);
  }
  return out;
}

class FragmentsTest : public ClusterTest {
 protected:
  // Checks every worker's round lines: the fragment of round r is
  // r mod K, the workers agree on every fragment's hash, and from a round
  // to the next only the next round's fragment changed. Returns the number
  // of consecutive round pairs checked.
  int ExpectFragmentsOnSchedule() {
    std::map<uint64_t, std::set<std::vector<std::string>>> parts;
    std::map<uint64_t, std::set<std::string>> hashes;
    int pairs = 0;
    for (auto& w : workers_) {
      const std::map<uint64_t, RoundParts> lines = FragmentLines(w->Log());
      for (const auto& [round, hash] : RoundHashes(w->Log())) hashes[round].insert(hash);
      for (const auto& [round, rp] : lines) {
        EXPECT_EQ(rp.fragment, round % kFragments) << "round " << round;
        EXPECT_EQ(rp.parts.size(), kFragments) << "round " << round;
        parts[round].insert(rp.parts);
        auto before = lines.find(round - 1);
        if (before == lines.end() || rp.parts.size() != kFragments ||
            before->second.parts.size() != kFragments) {
          continue;
        }
        ++pairs;
        for (uint32_t k = 0; k < kFragments; ++k) {
          if (k == rp.fragment) {
            EXPECT_NE(rp.parts[k], before->second.parts[k])
                << "round " << round << " did not move its fragment " << k;
          } else {
            EXPECT_EQ(rp.parts[k], before->second.parts[k])
                << "round " << round << " moved fragment " << k << ", not its own";
          }
        }
      }
    }
    for (const auto& [round, set] : parts) EXPECT_EQ(set.size(), 1u) << "round " << round;
    for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round;
    return pairs;
  }

  // A finished run of `rounds` rounds with one worker per zone of `zones`,
  // int8 + Nesterov, 4 fragments; `extra` adds coordinator flags,
  // `worker_extra` worker flags.
  v1::RunStatus Run(const std::vector<std::string>& zones, int rounds,
                    std::vector<std::string> extra, std::vector<std::string> worker_extra = {}) {
    std::vector<std::string> flags = {absl::StrCat("--min_participants=", zones.size()),
                                      "--local_steps=25",
                                      absl::StrCat("--rounds=", rounds),
                                      "--learning_rate=0.05",
                                      "--codec=int8",
                                      "--outer_optimizer=nesterov",
                                      "--outer_lr=0.7",
                                      "--outer_momentum=0.9",
                                      absl::StrCat("--fragments=", kFragments),
                                      "--adaptive_deadline=false"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    const std::string addr = StartCoordinator(flags);
    for (const std::string& zone : zones) {
      std::vector<std::string> worker_flags = worker_extra;
      if (!zone.empty()) worker_flags.push_back("--zone=" + zone);
      StartWorker(addr, worker_flags);
    }
    const v1::RunStatus status = WaitForStatus(
        [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(8));
    for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(30)), 0) << w->Log();
    return status;
  }
};

// The workers pace their uplinks (--uplink_mbps, services/worker/
// uplink_pacer.h; fast enough for loopback): the same schedule and
// agreement, and each paces its connections for the two peers that read
// from it.
TEST_F(FragmentsTest, EachRoundSyncsItsFragmentAndTheWorkersAgree) {
  constexpr int kRounds = 10;
  const v1::RunStatus status = Run({"", "", ""}, kRounds, {}, {"--uplink_mbps=800"});
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  EXPECT_EQ(status.last_completed_round(), static_cast<uint64_t>(kRounds));
  for (const auto& w : status.workers()) EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
  // Every worker, every pair of rounds after the first.
  EXPECT_EQ(ExpectFragmentsOnSchedule(), 3 * (kRounds - 1)) << Logs();
  // The run trains: each fragment took two or three averages.
  const auto& last = status.recent_rounds(status.recent_rounds_size() - 1);
  ASSERT_TRUE(last.evaluated());
  EXPECT_GT(last.test_accuracy(), 0.6) << Logs();
  std::cout << "fragments=4 after " << kRounds << " rounds: accuracy " << last.test_accuracy()
            << std::endl;
  for (auto& w : workers_) {
    EXPECT_NE(w->Log().find("fragment rounds: " + std::to_string(kRounds - 1) + " carried"),
              std::string::npos)
        << w->Log();
    EXPECT_NE(w->Log().find("uplink 800 Mbit/s shared by 2 flows"), std::string::npos) << w->Log();
  }
}

// Fragments with overlapped rounds and a hierarchical round across two
// zones: the same schedule and agreement.
TEST_F(FragmentsTest, ComposeWithOverlapAndHierarchy) {
  constexpr int kRounds = 9;
  const v1::RunStatus status =
      Run({"eu", "eu", "us", "us"}, kRounds, {"--overlap=on", "--hierarchy=on"});
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  EXPECT_EQ(status.last_completed_round(), static_cast<uint64_t>(kRounds));
  EXPECT_EQ(ExpectFragmentsOnSchedule(), 4 * (kRounds - 1)) << Logs();
  bool staged = false;
  for (auto& w : workers_) {
    staged = staged || w->Log().find(" stage_in=") != std::string::npos;
    EXPECT_NE(w->Log().find("overlapped rounds: "), std::string::npos) << w->Log();
  }
  EXPECT_TRUE(staged) << "no hierarchical round: " << Logs();
}

TEST_F(FragmentsTest, ALateJoinerSyncsFragmentsWithTheOthers) {
  const std::string addr = StartCoordinator(
      {"--min_participants=2", "--local_steps=20", "--rounds=0", "--learning_rate=0.05",
       "--codec=int8", "--outer_optimizer=nesterov", absl::StrCat("--fragments=", kFragments)});
  StartWorker(addr);
  StartWorker(addr);
  const v1::RunStatus before = WaitForStatus(
      [](const v1::RunStatus& s) { return s.last_completed_round() >= 5; }, absl::Minutes(3));
  Process* late = StartWorker(addr);
  ExpectRoundsGoOn(before.last_completed_round(), 5, 3, absl::Minutes(4));
  // It took the momentum of every fragment with the model.
  EXPECT_NE(late->Log().find("outer momentum of round "), std::string::npos) << late->Log();
  // Its rounds follow the schedule and agree with the others'.
  EXPECT_FALSE(FragmentLines(late->Log()).empty()) << late->Log();
  ExpectFragmentsOnSchedule();
}

// Checkpoints hold the agreed model and its momentum: a full restart of an
// overlapped fragment run resumes from the store, and the fragments go on
// on their schedule.
TEST_F(FragmentsTest, AFullRestartResumesFromTheCheckpoint) {
  const std::string store = StartStore();
  const std::vector<std::string> flags = {"--min_participants=2",
                                          "--local_steps=20",
                                          "--learning_rate=0.05",
                                          "--codec=int8",
                                          "--outer_optimizer=nesterov",
                                          "--overlap=on",
                                          absl::StrCat("--fragments=", kFragments),
                                          "--checkpoint_store=" + store,
                                          "--checkpoint_every=2",
                                          "--run_id=fragments-ckpt"};
  std::string addr = StartCoordinator(flags);
  StartWorker(addr);
  StartWorker(addr);
  WaitForStatus([](const v1::RunStatus& s) { return s.checkpoint_round() >= 4; },
                absl::Seconds(120));
  KillCoordinatorAndWorkers();
  workers_.clear();
  addr = StartCoordinator(flags);
  const v1::RunStatus resumed = WaitForStatus(
      [](const v1::RunStatus& s) { return s.last_completed_round() > 0; }, absl::Seconds(30));
  const uint64_t from = resumed.checkpoint_round();
  EXPECT_GE(from, 4u);
  StartWorker(addr);
  StartWorker(addr);
  ExpectRoundsGoOn(from, kFragments + 1, 2);
  for (auto& w : workers_) {
    EXPECT_NE(w->Log().find("from the store"), std::string::npos) << w->Log();
  }
  EXPECT_GE(ExpectFragmentsOnSchedule(), static_cast<int>(kFragments)) << Logs();
}

TEST_F(FragmentsTest, CoordinatorRefusesFragmentsWhereTheyHaveNoMeaning) {
  int code = -1;
  const std::string audits = ClusterTest::Run(
      BinDir() + "/shoal-coordinator --listen=127.0.0.1:0 --fragments=4 --audit_rate=0.2 2>&1",
      &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(audits.find("exchange.fragments (--fragments)"), std::string::npos) << audits;
  const std::string many = ClusterTest::Run(
      BinDir() + "/shoal-coordinator --listen=127.0.0.1:0 --fragments=100000 2>&1", &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(many.find("must be at most 4096"), std::string::npos) << many;
}

}  // namespace
}  // namespace shoal
