// Every binary's --help lists its own flags (they live in its main.cc, which
// Abseil would not count as the program's file on its own; see
// common/flags_usage.h). Runs the built binaries as processes.
#include <unistd.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace shoal {
namespace {

using ::shoal::testing::BinDir;
using ::shoal::testing::Process;
using ::shoal::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

struct HelpCase {
  std::string binary;
  std::vector<std::string> flags;  // some flags of the binary's main.cc
};

void PrintTo(const HelpCase& c, std::ostream* os) { *os << c.binary; }

class HelpTest : public ::testing::TestWithParam<HelpCase> {};

TEST_P(HelpTest, ListsTheBinarysOwnFlags) {
  const HelpCase& c = GetParam();
  const std::string path = BinDir() + "/" + c.binary;
  ASSERT_EQ(access(path.c_str(), X_OK), 0) << path << " missing (set SHOAL_BIN_DIR)";
  TempDir dir;
  // The destructor stops it by PID if it is still running.
  std::unique_ptr<Process> p = Process::Start({path, "--help"}, dir.path() + "/help.log");
  const int code = p->Wait(absl::Seconds(30));
  const std::string out = p->Log();
  // Abseil exits with 1 after printing the help; shoalctl's own parser
  // (tools/shoalctl/cli.h) with 0.
  EXPECT_EQ(code, c.binary == "shoalctl" ? 0 : 1) << out;
  EXPECT_THAT(out, Not(HasSubstr("No flags matched"))) << out;
  // The usage message.
  EXPECT_THAT(out, HasSubstr(c.binary == "shoalctl" ? "Usage: shoalctl" : c.binary + ": ")) << out;
  for (const std::string& flag : c.flags) EXPECT_THAT(out, HasSubstr(flag)) << out;
}

// --version names the version and the commit (common/version.h); exit 0.
TEST_P(HelpTest, VersionNamesTheCommit) {
  const HelpCase& c = GetParam();
  TempDir dir;
  std::unique_ptr<Process> p =
      Process::Start({BinDir() + "/" + c.binary, "--version"}, dir.path() + "/version.log");
  EXPECT_EQ(p->Wait(absl::Seconds(30)), 0);
  EXPECT_THAT(p->Log(), ::testing::ContainsRegex(c.binary + " [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit "
                                                            "([0-9a-f]{12}(-dirty)?|unknown), "))
      << p->Log();
  EXPECT_THAT(p->Log(), Not(HasSubstr("NDEBUG")));
}

// A mistyped flag ends the program with exit code 2 and the nearest flag.
TEST_P(HelpTest, UnknownFlagNamesTheNearest) {
  const HelpCase& c = GetParam();
  TempDir dir;
  const std::string typo = c.binary == "shoal-checkpoint" ? "--data_dri=/tmp" : "--listne=x";
  const std::string meant = c.binary == "shoal-checkpoint" ? "--data_dir" : "--listen";
  std::vector<std::string> args = {BinDir() + "/" + c.binary};
  if (c.binary == "shoalctl") {
    args.push_back("status");
    args.push_back("--coordinater=127.0.0.1:1");
  } else {
    args.push_back(typo);
  }
  std::unique_ptr<Process> p = Process::Start(args, dir.path() + "/typo.log");
  EXPECT_EQ(p->Wait(absl::Seconds(30)), 2);
  EXPECT_THAT(p->Log(), HasSubstr(c.binary == "shoalctl" ? "(did you mean --coordinator?)"
                                                         : "(did you mean " + meant + "?)"))
      << p->Log();
}

// A worker given an uplink rate that is no rate stops at once (exit 2) and
// says which flag.
TEST(WorkerFlagsTest, AnUplinkRateThatIsNoRateIsRefused) {
  for (const std::string& value : {"-5", "nan"}) {
    TempDir dir;
    std::unique_ptr<Process> p = Process::Start(
        {BinDir() + "/shoal-worker", "--coordinator=127.0.0.1:1", "--uplink_mbps=" + value},
        dir.path() + "/worker.log");
    EXPECT_EQ(p->Wait(absl::Seconds(30)), 2) << p->Log();
    EXPECT_THAT(p->Log(), HasSubstr("--uplink_mbps must be a rate above 0")) << p->Log();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Binaries, HelpTest,
    ::testing::Values(
        HelpCase{"shoal-coordinator",
                 {"--listen", "--min_participants", "--checkpoint_store", "--tls_cert",
                  "--http_listen", "--aggregation"}},
        HelpCase{"shoal-worker",
                 {"--coordinator", "--listen", "--data_dir", "--tls_ca", "--uplink_mbps"}},
        HelpCase{"shoal-checkpoint", {"--listen", "--data_dir", "--retain", "--tls_key"}},
        HelpCase{"shoalctl",
                 {"--coordinator", "--store", "--output", "--json", "--tls_server_name",
                  "SHOAL_COORDINATOR", "checkpoints export"}}),
    [](const ::testing::TestParamInfo<HelpCase>& info) {
      std::string name;
      for (char ch : info.param.binary) {
        if (ch != '-') name += ch;
      }
      return name;
    });

}  // namespace
}  // namespace shoal
