// End-to-end: workers in zones (issue 12, docs/SUPERNODES.md). Three real
// workers in two zones train; the coordinator's status carries the zone
// tree with an elected supernode per zone and the workers' measurements,
// shoalctl prints the tree, and when the eu/paris supernode is killed -9
// its standby takes over.
#include <signal.h>

#include <map>
#include <string>

#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

std::map<std::string, v1::ZoneStatus> Zones(const v1::RunStatus& s) {
  std::map<std::string, v1::ZoneStatus> out;
  for (const auto& z : s.zones()) out[z.path()] = z;
  return out;
}

TEST_F(ClusterTest, ZoneTreeElectsSupernodesAndTheStandbyTakesOver) {
  // No challenger may move a head while the test looks (the hysteresis is
  // unit-tested): a loaded machine's step times differ by several times.
  const std::string addr =
      StartCoordinator({"--min_participants=3", "--local_steps=20", "--learning_rate=0.05",
                        "--eval_every=100", "--supernode_switch_factor=1000"});
  StartWorker(addr, {"--zone=eu/paris"});
  StartWorker(addr, {"--zone=eu/paris"});
  StartWorker(addr, {"--zone=us"});

  // Two rounds in, everyone has measured its step time and bandwidth.
  v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) {
        int measured = 0;
        for (const auto& w : s.workers()) {
          measured += w.role() != "" && w.step_seconds() > 0 && w.bandwidth_bytes_per_second() > 0;
        }
        return s.last_completed_round() >= 2 && measured == 3;
      },
      absl::Minutes(3));
  std::map<std::string, v1::ZoneStatus> zones = Zones(status);
  ASSERT_EQ(zones.size(), 4u) << status.DebugString();
  EXPECT_EQ(status.zones(0).path(), "");
  EXPECT_EQ(zones[""].supernode(), "");  // children only: their heads meet as peers
  EXPECT_EQ(zones[""].workers(), 3u);
  const std::string head = zones["eu/paris"].supernode();
  const std::string standby = zones["eu/paris"].standby();
  const uint64_t changes = zones["eu/paris"].changes();  // 1 if the first measurements moved it
  ASSERT_FALSE(head.empty());
  ASSERT_FALSE(standby.empty());
  EXPECT_NE(head, standby);
  EXPECT_EQ(zones["eu"].supernode(), head);
  EXPECT_EQ(zones["eu/paris"].direct_members(), 2u);
  EXPECT_FALSE(zones["us"].supernode().empty());
  EXPECT_EQ(zones["us"].standby(), "");
  EXPECT_FALSE(zones["eu/paris"].reason().empty());
  EXPECT_EQ(FindWorker(status, head)->role(), "supernode");
  EXPECT_EQ(FindWorker(status, standby)->role(), "standby");
  EXPECT_EQ(FindWorker(status, head)->zone(), "eu/paris");

  int code = -1;
  const std::string table = Run(BinDir() + "/shoalctl status --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(table.find("zones ("), std::string::npos) << table;
  EXPECT_NE(table.find("    eu  2 workers (0 direct)  supernode " + head), std::string::npos)
      << table;
  EXPECT_NE(
      table.find("      paris  2 workers (2 direct)  supernode " + head + "  standby " + standby),
      std::string::npos)
      << table;
  const std::string json = Run(BinDir() + "/shoalctl status --json --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(json.find("\"path\": \"eu/paris\""), std::string::npos) << json;

  // kill -9 the supernode: its standby heads eu/paris and eu.
  Process* victim = WorkerById(head);
  ASSERT_NE(victim, nullptr) << Logs();
  victim->Signal(SIGKILL);
  status = WaitForStatus(
      [&](const v1::RunStatus& s) { return Zones(s)["eu/paris"].supernode() == standby; },
      absl::Seconds(30));
  zones = Zones(status);
  EXPECT_EQ(zones["eu"].supernode(), standby);
  EXPECT_EQ(zones["eu/paris"].cause(), head + " left: standby " + standby + " took over")
      << status.DebugString();
  EXPECT_EQ(zones["eu/paris"].standby(), "");
  EXPECT_EQ(zones["eu/paris"].changes(), changes + 1);
}

}  // namespace
}  // namespace shoal
