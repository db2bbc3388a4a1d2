// Supernodes over a real slow link (issue 12): two sites of three workers in
// network namespaces (tests/support/two_sites.sh), joined by one veth pair
// shaped with `tc tbf` to 20 Mbit/s each way. The coordinator runs in site
// A; status is read with `shoalctl status --json` inside its namespace (the
// test process stays in the host namespace, where those addresses do not
// exist). Skipped with a message where namespaces cannot be created.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "shoal/v1/coordinator.pb.h"
#include "tests/support/test_support.h"

#ifndef SHOAL_SOURCE_DIR
#error "SHOAL_SOURCE_DIR must be defined"
#endif

namespace shoal {
namespace {

using ::shoal::testing::BinDir;
using ::shoal::testing::DataDir;
using ::shoal::testing::Process;
using ::shoal::testing::TempDir;
using ::shoal::testing::WaitUntil;

constexpr int kPerSite = 3;
// The built-in mlp: 784*256 + 256 + 256*128 + 128 + 128*10 + 10 floats.
constexpr double kModelBytes = 4.0 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);

std::string Script() { return std::string(SHOAL_SOURCE_DIR) + "/tests/support/two_sites.sh"; }

// Runs a shell command; returns its stdout, `*code` its exit code.
std::string Shell(const std::string& command, int* code) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *code = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class TwoSitesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access((DataDir() + "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
      GTEST_SKIP() << "Fashion-MNIST not installed at " << DataDir();
    }
    int code = 0;
    Shell("bash " + Script() + " check", &code);
    if (code != 0) {
      GTEST_SKIP() << "cannot create network namespaces here (needs root or CAP_NET_ADMIN, "
                      "and iproute2): the two-site supernode tests do not run";
    }
    prefix_ = absl::StrCat("shoalsn", getpid());
  }

  void TearDown() override {
    // Processes first (by PID, in the Process destructors), then the
    // namespaces they ran in.
    workers_.clear();
    coordinator_.reset();
    if (!prefix_.empty()) {
      int code = 0;
      Shell("bash " + Script() + " down " + prefix_, &code);
      EXPECT_EQ(code, 0);
    }
  }

  void Up(const std::string& options) {
    int code = 0;
    const std::string out =
        Shell("bash " + Script() + " up " + prefix_ + " " + options + " 2>&1", &code);
    ASSERT_EQ(code, 0) << out;
  }

  std::vector<std::string> InNs(const std::string& ns, std::vector<std::string> argv) {
    std::vector<std::string> full = {"/usr/bin/env", "ip", "netns", "exec", prefix_ + "-" + ns};
    full.insert(full.end(), argv.begin(), argv.end());
    return full;
  }

  void StartCoordinator(std::vector<std::string> flags) {
    std::vector<std::string> argv = {BinDir() + "/shoal-coordinator",
                                     "--listen=10.78.0.1:0",
                                     absl::StrCat("--min_participants=", 2 * kPerSite),
                                     "--local_steps=30",
                                     "--round_timeout=120s",
                                     "--seed=1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    coordinator_ = Process::Start(InNs("c", argv), dir_.path() + "/coordinator.log");
    address_ = coordinator_->WaitForListenAddress(absl::Seconds(60));
    ASSERT_FALSE(address_.empty()) << coordinator_->Log();
  }

  // Worker `name` in namespace PREFIX-<name> at `ip`.
  void StartWorker(const std::string& name, const std::string& ip, std::vector<std::string> flags) {
    std::vector<std::string> argv = {BinDir() + "/shoal-worker", "--coordinator=" + address_,
                                     "--listen=" + ip + ":0",    "--data_dir=" + DataDir(),
                                     "--eval_limit=1000",        "--name=" + name};
    argv.insert(argv.end(), flags.begin(), flags.end());
    workers_.push_back(Process::Start(InNs(name, argv), dir_.path() + "/worker-" + name + ".log"));
  }

  bool Status(v1::RunStatus* status) {
    int code = 0;
    const std::string json = Shell(absl::StrCat("ip netns exec ", prefix_, "-c ", BinDir(),
                                                "/shoalctl status --json --rpc_timeout=5s "
                                                "--coordinator=",
                                                address_, " 2>/dev/null"),
                                   &code);
    if (code != 0) return false;
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    status->Clear();
    return google::protobuf::util::JsonStringToMessage(json, status, options).ok();
  }

  uint64_t LinkBytes() {
    int code = 0;
    const std::string out = Shell("bash " + Script() + " bytes " + prefix_, &code);
    uint64_t n = 0;
    EXPECT_EQ(code, 0);
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(out), &n)) << out;
    return n;
  }

  v1::RunStatus WaitForRound(uint64_t round, absl::Duration timeout) {
    v1::RunStatus status;
    const bool ok = WaitUntil(
        [&] { return Status(&status) && status.last_completed_round() >= round; }, timeout);
    EXPECT_TRUE(ok) << "round " << round << " not reached; last status:\n"
                    << status.DebugString() << Logs();
    return status;
  }

  // Waits until `round` is complete and a later one trains (its exchange
  // has not started).
  v1::RunStatus WaitForTraining(uint64_t round, absl::Duration timeout) {
    v1::RunStatus status;
    const bool ok = WaitUntil(
        [&] {
          return Status(&status) && status.last_completed_round() >= round &&
                 status.phase() == v1::TRAINING && status.round() > status.last_completed_round();
        },
        timeout);
    EXPECT_TRUE(ok) << "no round after " << round << " training; last status:\n"
                    << status.DebugString() << Logs();
    return status;
  }

  std::string Logs() {
    std::string out = "\n--- coordinator ---\n" + (coordinator_ ? coordinator_->Log() : "");
    for (auto& w : workers_) out += "\n--- " + w->log_path() + " ---\n" + w->Log();
    return out;
  }

  void ExpectHashesAgree(const v1::RunStatus& s) {
    int agreeing = 0;
    for (const v1::WorkerStatus& w : s.workers()) {
      if (w.model_round() != s.last_completed_round()) continue;
      EXPECT_EQ(w.model_hash(), s.model_hash()) << w.id() << " in round " << w.model_round();
      ++agreeing;
    }
    EXPECT_GE(agreeing, 2 * kPerSite - 1) << s.DebugString();
  }

  std::string prefix_;
  std::string address_;
  TempDir dir_;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
};

// Two sites of three, hierarchy on: rounds complete, every worker holds the
// same bits, and the link between the sites carries about 2 models per
// round (each site's supernode sends half its site's average and reads half
// of the other's: one model each way) instead of 6 for the flat round.
TEST_F(TwoSitesTest, HierarchicalRoundsCrossTheSlowLinkOncePerSite) {
  ASSERT_NO_FATAL_FAILURE(Up("--per_site=3 --rate=20mbit"));
  // Every worker in every round: a worker the adaptive deadline leaves out
  // on a busy machine catches up over the link, which is not what this
  // counts.
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({"--hierarchy=on", "--adaptive_deadline=false"}));
  for (int i = 1; i <= kPerSite; ++i) {
    StartWorker(absl::StrCat("a", i), absl::StrCat("10.78.0.1", i), {"--zone=site-a"});
    StartWorker(absl::StrCat("b", i), absl::StrCat("10.78.0.2", i), {"--zone=site-b"});
  }
  // Round 1 also moves connection set-up; count from the end of round 2.
  // Both counts are read while a round trains (no exchange on the link), so
  // that no part of a round's exchange falls in or out of the window: read
  // at any moment, up to a third of a round's bytes did (2.40 models per
  // round in one of four runs, 1.95 in another).
  const v1::RunStatus first = WaitForTraining(2, absl::Seconds(180));
  ASSERT_GE(first.last_completed_round(), 2u);
  const uint64_t bytes0 = LinkBytes();
  const uint64_t round0 = first.last_completed_round();
  const v1::RunStatus last = WaitForTraining(round0 + 4, absl::Seconds(180));
  const uint64_t bytes1 = LinkBytes();
  const uint64_t rounds = last.last_completed_round() - round0;
  ASSERT_GE(rounds, 4u);
  ExpectHashesAgree(last);
  const double per_round = static_cast<double>(bytes1 - bytes0) / static_cast<double>(rounds);
  std::printf("inter-site link: %.0f bytes per round = %.3f models (model %.0f bytes)\n", per_round,
              per_round / kModelBytes, kModelBytes);
  // 2 models of payload; the rest is TCP/IP, HTTP/2 and gRPC framing and
  // site B's control plane (about 5% together): 2.12-2.16 models alone. In
  // a full `make test` (other tests beside it) a read retried over the link
  // once made it 2.27. The bound tells crossing once per site from crossing
  // twice (4 models) or the flat round (6).
  EXPECT_LE(per_round, 2.5 * kModelBytes) << Logs();
}

// The same two sites with the codec and the outer optimizer on top of the
// hierarchy (issue 25): the round's change travels int8 at every level, so
// the slow link carries about a quarter of the hierarchical fp32 round's
// bytes (2 x 0.254 models of payload), and every worker still holds the
// same bits every round.
TEST_F(TwoSitesTest, HierarchicalInt8NesterovCrossesTheSlowLinkAtAQuarter) {
  ASSERT_NO_FATAL_FAILURE(Up("--per_site=3 --rate=20mbit"));
  ASSERT_NO_FATAL_FAILURE(
      StartCoordinator({"--hierarchy=on", "--adaptive_deadline=false", "--codec=int8",
                        "--outer_optimizer=nesterov", "--outer_lr=0.7", "--outer_momentum=0.9"}));
  for (int i = 1; i <= kPerSite; ++i) {
    StartWorker(absl::StrCat("a", i), absl::StrCat("10.78.0.1", i), {"--zone=site-a"});
    StartWorker(absl::StrCat("b", i), absl::StrCat("10.78.0.2", i), {"--zone=site-b"});
  }
  const v1::RunStatus first = WaitForTraining(2, absl::Seconds(180));
  ASSERT_GE(first.last_completed_round(), 2u);
  const uint64_t bytes0 = LinkBytes();
  const uint64_t round0 = first.last_completed_round();
  const v1::RunStatus last = WaitForTraining(round0 + 4, absl::Seconds(180));
  const uint64_t bytes1 = LinkBytes();
  const uint64_t rounds = last.last_completed_round() - round0;
  ASSERT_GE(rounds, 4u);
  ExpectHashesAgree(last);
  // Every round of the window completed with all six.
  for (const v1::RoundSummary& r : last.recent_rounds()) {
    if (r.round() > round0) EXPECT_EQ(r.participants(), 2u * kPerSite) << r.DebugString();
  }
  const double per_round = static_cast<double>(bytes1 - bytes0) / static_cast<double>(rounds);
  std::printf("inter-site link, hierarchy + int8 + nesterov: %.0f bytes per round = %.3f models\n",
              per_round, per_round / kModelBytes);
  // 2 x 0.254 models of payload plus framing and site B's control plane;
  // the hierarchical fp32 round measures 2.14 (bound 2.25 above): a third
  // of that bound leaves room for the control plane, which does not shrink.
  EXPECT_LE(per_round, 0.75 * kModelBytes) << Logs();
  EXPECT_GE(per_round, 0.4 * kModelBytes) << "less than the int8 payload crossed the link";
}

// A worker behind a real NAT (tests/support/two_sites.sh --nat: MASQUERADE
// in a router namespace, no inbound path) trains in synchronous rounds: the
// coordinator's probe of its address fails, so it owns no slice and pushes
// its contributions; every worker holds the same bits.
TEST_F(TwoSitesTest, WorkerBehindNatTakesPartInRounds) {
  ASSERT_NO_FATAL_FAILURE(Up("--per_site=1 --rate=100mbit --nat"));
  // The adaptive deadline off: the test counts participants, and on a
  // loaded machine a worker missed a 2.7 s deadline and sat a round out
  // (found beside the soak).
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({"--min_participants=3", "--adaptive_deadline=false"}));
  StartWorker("a1", "10.78.0.11", {});
  StartWorker("b1", "10.78.0.21", {});
  StartWorker("n1", "192.168.78.2", {});
  const v1::RunStatus status = WaitForRound(3, absl::Seconds(180));
  ASSERT_GE(status.last_completed_round(), 3u);
  int natted = 0;
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.outbound_only()) {
      ++natted;
      EXPECT_NE(w.outbound_reason().find("probe"), std::string::npos) << w.outbound_reason();
      EXPECT_NE(w.address().find("192.168.78.2"), std::string::npos) << w.address();
    }
  }
  EXPECT_EQ(natted, 1) << status.DebugString();
  for (const v1::RoundSummary& r : status.recent_rounds()) {
    if (r.round() >= 2) EXPECT_EQ(r.participants(), 3u) << r.DebugString();
  }
  int agreeing = 0;
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.model_round() != status.last_completed_round()) continue;
    EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
    ++agreeing;
  }
  EXPECT_EQ(agreeing, 3) << status.DebugString() << Logs();
}

// The same NAT'd worker in gossip mode: the others are never told to fetch
// from it; it fetches from them and pushes them its model in the same
// outbound exchange, which they merge.
TEST_F(TwoSitesTest, WorkerBehindNatGossips) {
  ASSERT_NO_FATAL_FAILURE(Up("--per_site=1 --rate=100mbit --nat"));
  ASSERT_NO_FATAL_FAILURE(StartCoordinator({"--mode=gossip", "--min_participants=1"}));
  StartWorker("a1", "10.78.0.11", {});
  StartWorker("b1", "10.78.0.21", {});
  StartWorker("n1", "192.168.78.2", {"--outbound_only"});
  v1::RunStatus status;
  const bool fetched = WaitUntil(
      [&] {
        if (!Status(&status)) return false;
        int natted_fetching = 0, others_fetching = 0;
        uint64_t merged = 0;
        for (const v1::WorkerStatus& w : status.workers()) {
          if (w.outbound_only() && w.fetches_done() >= 3) ++natted_fetching;
          if (!w.outbound_only() && w.fetches_done() >= 3) ++others_fetching;
          merged += w.pushes_merged();
        }
        return natted_fetching == 1 && others_fetching == 2 && merged >= 2;
      },
      absl::Seconds(180));
  ASSERT_TRUE(fetched) << status.DebugString() << Logs();
  std::string nat_id;
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.outbound_only()) {
      nat_id = w.id();
      EXPECT_NE(w.outbound_reason().find("declared"), std::string::npos) << w.outbound_reason();
    }
  }
  // Only pushes reached the others from it: nobody fetched from it.
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.outbound_only()) EXPECT_EQ(w.pushes_merged(), 0u) << w.id();
  }
  EXPECT_FALSE(nat_id.empty());
}

}  // namespace
}  // namespace shoal
