// Bandwidth-proportional slices (--slice_sizing=bandwidth, issue 49) with
// the real binaries on 127.0.0.1: one worker's uplink paced to 20 Mbit/s
// (--uplink_mbps, its connections paced in the kernel), the others
// unpaced. Within a few rounds its measured rate is the lowest and its
// slice shrinks well below an even third, the others' grow; every worker
// holds the same model after every round; the status and shoalctl show the
// rates and shares. No assertion on time.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

class SliceSizingTest : public ClusterTest {};

TEST_F(SliceSizingTest, ASlowUplinkOwnsASmallSliceAndTheHashesAgree) {
  constexpr int kRounds = 10;
  const std::string addr = StartCoordinator({"--min_participants=3", "--local_steps=20",
                                             absl::StrCat("--rounds=", kRounds),
                                             "--learning_rate=0.05", "--slice_sizing=bandwidth",
                                             "--adaptive_deadline=false"});
  Process* slow = StartWorker(addr, {"--uplink_mbps=20"});
  StartWorker(addr);
  StartWorker(addr);
  // A few rounds in: the slow worker's slice has shrunk.
  const v1::RunStatus mid = WaitForStatus(
      [](const v1::RunStatus& s) {
        return s.last_completed_round() >= 5 || s.phase() == v1::FINISHED;
      },
      absl::Minutes(5));
  const std::string slow_id = WorkerId(slow);
  ASSERT_FALSE(slow_id.empty()) << Logs();
  double slow_rate = 0, slow_share = 0, fast_rate = 0;
  for (const auto& w : mid.workers()) {
    std::cout << w.id() << ": rate " << w.exchange_rate_bytes_per_second() << " B/s, slice "
              << w.slice_share() << std::endl;
    if (w.id() == slow_id) {
      slow_rate = w.exchange_rate_bytes_per_second();
      slow_share = w.slice_share();
    } else {
      EXPECT_GT(w.slice_share(), 1.0 / 3) << w.id() << mid.DebugString();
      fast_rate = fast_rate == 0 ? w.exchange_rate_bytes_per_second()
                                 : std::min(fast_rate, w.exchange_rate_bytes_per_second());
    }
  }
  EXPECT_GT(slow_rate, 0) << mid.DebugString();
  EXPECT_LT(slow_rate, fast_rate) << mid.DebugString();
  // At least 1/(8N) = 1/24 of the model, well below an even third.
  EXPECT_LT(slow_share, 1.0 / 6) << mid.DebugString();
  EXPECT_GE(slow_share, 1.0 / 24 - 1e-3) << mid.DebugString();
  // shoalctl shows the table of rates and shares.
  int code = -1;
  const std::string table =
      Run(absl::StrCat(BinDir(), "/shoalctl status --coordinator=", addr, " 2>&1"), &code);
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find("slices (--slice_sizing=bandwidth"), std::string::npos) << table;
  EXPECT_NE(table.find("SLICE_SHARE"), std::string::npos) << table;

  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(8));
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  EXPECT_EQ(status.last_completed_round(), static_cast<uint64_t>(kRounds));
  for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(30)), 0) << w->Log();
  // Every round, every worker the same model.
  std::map<uint64_t, std::set<std::string>> hashes;
  for (auto& w : workers_) {
    const std::map<uint64_t, std::string> mine = RoundHashes(w->Log());
    EXPECT_EQ(mine.size(), static_cast<size_t>(kRounds)) << w->Log();
    for (const auto& [round, hash] : mine) hashes[round].insert(hash);
  }
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round;
  // The slices changed between rounds: the list was sent again with shares.
  EXPECT_NE(coordinator_->Log().find("plan attempt"), std::string::npos);
}

}  // namespace
}  // namespace shoal
