// The run config file (issue 25, docs/CONFIG.md) with the real binaries: a
// coordinator started with --config (and one flag over it) runs a real run,
// GetRunStatus shows the effective config, `--check_config` prints the same
// config and refuses a broken file, and `shoalctl config` prints it back.
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

using ::testing::HasSubstr;

class ConfigE2eTest : public ClusterTest {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
};

constexpr char kRun[] = R"(# a small run
model: {name: mlp}
training:
  batch_size: 32
  local_steps: 5
  seed: 7
sync: {min_participants: 2, rounds: 2}
exchange: {codec: fp16}
timeouts: {heartbeat_interval_ms: 500}
checkpoints: {every: 0}
)";

TEST_F(ConfigE2eTest, ARunFromTheFileWithAFlagOverItShowsTheEffectiveConfig) {
  const std::string run = Write("run.yaml", kRun);
  const std::string addr = StartCoordinator({"--config=" + run, "--rounds=3"});
  ASSERT_FALSE(addr.empty());
  StartWorker(addr, {"--torch_threads=1"});
  StartWorker(addr, {"--torch_threads=1"});
  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Seconds(180));
  const v1::RunConfig& c = status.config();
  // The flag given on the command line wins over the file.
  EXPECT_EQ(c.sync().rounds(), 3u);
  EXPECT_EQ(status.last_completed_round(), 3u) << Logs();
  // The file's keys.
  EXPECT_EQ(c.model().name(), "mlp");
  EXPECT_EQ(c.training().batch_size(), 32u);
  EXPECT_EQ(c.training().local_steps(), 5u);
  EXPECT_EQ(c.training().seed(), 7u);
  EXPECT_EQ(c.sync().min_participants(), 2u);
  EXPECT_EQ(c.exchange().codec(), "fp16");
  EXPECT_EQ(c.timeouts().heartbeat_interval_ms(), 500u);
  EXPECT_EQ(c.checkpoints().every(), 0u);
  // Keys the file leaves out keep the flags' defaults, and what the
  // coordinator derives.
  EXPECT_DOUBLE_EQ(c.training().learning_rate(), 0.05);
  EXPECT_EQ(c.timeouts().round_timeout_ms(), 120000u);
  EXPECT_EQ(c.training().data_shards(), 2u);
  EXPECT_TRUE(c.sync().fold_late_work());
  // The start log names the groups. Its main thread writes these lines
  // after the "listening on" line StartCoordinator waited for, while the
  // run is already served: nothing orders them before the run's end.
  EXPECT_TRUE(WaitUntil(
      [&] {
        return coordinator_->Log().find("config exchange: {\"codec\":\"fp16\"") !=
               std::string::npos;
      },
      absl::Seconds(30)))
      << coordinator_->Log();

  // --check_config with the same file and flag prints exactly this config.
  int code = -1;
  const std::string printed = Run(absl::StrCat(BinDir(), "/shoal-coordinator --config=", run,
                                               " --rounds=3 --check_config 2>/dev/null"),
                                  &code);
  EXPECT_EQ(code, 0) << printed;
  v1::RunConfig checked;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(printed, &checked).ok()) << printed;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(checked, c))
      << checked.DebugString() << " vs " << c.DebugString();

  // shoalctl config prints it too, as a file the coordinator reads back.
  const std::string from_ctl =
      Run(absl::StrCat(BinDir(), "/shoalctl config --coordinator=", addr, " 2>/dev/null"), &code);
  EXPECT_EQ(code, 0) << from_ctl;
  const std::string again = Write("again.json", from_ctl);
  const std::string reread = Run(
      absl::StrCat(BinDir(), "/shoal-coordinator --config=", again, " --check_config 2>/dev/null"),
      &code);
  EXPECT_EQ(code, 0) << reread;
  v1::RunConfig round_trip;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(reread, &round_trip).ok()) << reread;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(round_trip, c));
}

TEST_F(ConfigE2eTest, ABrokenFileStopsTheCoordinatorWithItsKeyAndLine) {
  const std::string bad = Write("bad.yaml", "model: {name: mlp}\nexchange:\n  codecc: int8\n");
  int code = -1;
  std::string out = Run(
      absl::StrCat(BinDir(), "/shoal-coordinator --config=", bad, " --check_config 2>&1"), &code);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("bad.yaml:3: unknown key 'exchange.codecc'"));
  // Started for real, it exits 2 with the same message.
  out =
      Run(absl::StrCat(BinDir(), "/shoal-coordinator --listen=127.0.0.1:0 --config=", bad, " 2>&1"),
          &code);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("unknown key 'exchange.codecc'"));
  // A refused combination names the key and the flag.
  const std::string hier = Write("hier.json", R"({"gossip": {}, "topology": {"hierarchy": true}})");
  out = Run(absl::StrCat(BinDir(), "/shoal-coordinator --config=", hier, " --check_config 2>&1"),
            &code);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("topology.hierarchy (--hierarchy=on) shapes the rounds of sync mode"));
  // The same file with the flag that undoes it passes.
  out = Run(absl::StrCat(BinDir(), "/shoal-coordinator --config=", hier,
                         " --hierarchy=off --check_config 2>&1"),
            &code);
  EXPECT_EQ(code, 0) << out;
}

}  // namespace
}  // namespace shoal
