// Audits by replay, scores and bans (issue 28, docs/SECURITY.md "Audits,
// scores and bans"), with real processes: honest runs never fail an audit,
// and a worker that trains on shuffled labels (a real shoal-worker given a
// copy of Fashion-MNIST whose training labels are permuted: its
// contributions are real trained models, plausible in size and loss, and
// it reports their true hashes) is caught by a replay, its contribution
// taken out of the round, banned, and refused when it comes back.
#include <algorithm>
#include <fstream>
#include <random>
#include <regex>
#include <string>

#include "tests/e2e/cluster_fixture.h"
#include "tests/support/http_get.h"

namespace shoal {
namespace {

using AuditTest = ClusterTest;

// A copy of the dataset in `dir` whose training labels are shuffled (the
// images and the test set are the originals).
void WriteShuffledLabels(const std::string& dir) {
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  for (const char* f :
       {"train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    ASSERT_EQ(system(("ln -sf " + DataDir() + "/" + f + " " + dir + "/" + f).c_str()), 0);
  }
  int code = 0;
  std::string labels = ClusterTest::Run("zcat " + DataDir() + "/train-labels-idx1-ubyte.gz", &code);
  ASSERT_EQ(code, 0);
  ASSERT_GT(labels.size(), 8u);
  std::mt19937 rng(7);
  std::shuffle(labels.begin() + 8, labels.end(), rng);
  // The reader takes plain IDX under the .gz name (zlib reads both).
  std::ofstream(dir + "/train-labels-idx1-ubyte.gz", std::ios::binary) << labels;
}

const v1::WorkerStatus* ByName(const v1::RunStatus& s, const std::string& name) {
  for (const auto& w : s.workers()) {
    if (w.name() == name) return &w;
  }
  return nullptr;
}

TEST_F(AuditTest, HonestRunsFailNoAuditOver200) {
  const std::string addr =
      StartCoordinator({"--min_participants=3", "--local_steps=4", "--batch_size=32",
                        "--audit_rate=1", "--eval_every=50", "--round_timeout=120s",
                        "--adaptive_deadline=false", "--heartbeat_lease=20s"});
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  const v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& s) { return s.audits_performed() >= 200; }, absl::Minutes(15));
  EXPECT_GE(s.audits_performed(), 200u);
  EXPECT_EQ(s.audits_failed(), 0u) << Logs();
  EXPECT_EQ(s.bans_size(), 0);
  uint64_t replayed = 0;
  for (const auto& w : s.workers()) {
    EXPECT_EQ(w.audits_failed(), 0u) << w.id();
    EXPECT_GT(w.audits_passed(), 0u) << w.id();
    EXPECT_GE(w.score(), 0.99) << w.id();
    replayed += w.audits_replayed();
  }
  EXPECT_EQ(replayed, s.audits_performed());
  ExpectRoundsGoOn(s.last_completed_round(), 1, 3);
  // The workers trained with one thread each, as the audited run fixes.
  EXPECT_NE(Logs().find("replayed the work of"), std::string::npos);
}

// Audits compose with the encoded exchange and the outer optimizer: the
// contribution hash is of the trained model, before any encoding, and the
// replay starts from the global model every worker holds.
TEST_F(AuditTest, Int8WithNesterovReplaysAgreeAndHashesAgree) {
  const std::string addr = StartCoordinator(
      {"--min_participants=3", "--local_steps=5", "--audit_rate=1", "--codec=int8",
       "--outer_optimizer=nesterov", "--outer_lr=0.7", "--outer_momentum=0.9", "--eval_every=5",
       "--round_timeout=120s", "--adaptive_deadline=false", "--heartbeat_lease=20s"});
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  const v1::RunStatus s = ExpectRoundsGoOn(0, 10, 3, absl::Minutes(10));
  EXPECT_GE(s.audits_performed(), 20u) << Logs();
  EXPECT_EQ(s.audits_failed(), 0u) << Logs();
  EXPECT_EQ(s.bans_size(), 0);
}

TEST_F(AuditTest, ShuffledLabelsAreCaughtBannedAndRefused) {
  const std::string shuffled = dir_.path() + "/shuffled";
  WriteShuffledLabels(shuffled);
  const std::string addr = StartCoordinator(
      {"--min_participants=3", "--local_steps=10", "--audit_rate=0.2", "--audit_seed=e2e-audits",
       "--eval_every=1", "--round_timeout=120s", "--adaptive_deadline=false",
       "--heartbeat_lease=20s", "--rounds=40", "--metrics_listen=127.0.0.1:0"});
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  Process* cheater = StartWorker(addr, {"--data_dir=" + shuffled, "--name=cheater"});

  // Banned within 20 rounds of its first.
  v1::RunStatus s =
      WaitForStatus([](const v1::RunStatus& s) { return s.bans_size() > 0; }, absl::Minutes(10));
  ASSERT_EQ(s.bans_size(), 1) << s.DebugString();
  EXPECT_EQ(s.bans(0).name(), "cheater");
  EXPECT_NE(s.bans(0).reason().find("failed audit"), std::string::npos) << s.bans(0).reason();
  EXPECT_LE(s.last_completed_round(), 20u) << Logs();
  // Caught as a participant (its replay fails) or as an auditor (its
  // replay of an honest member's work is outvoted by a second opinion):
  // either is a failed audit.
  EXPECT_GE(s.audits_failed(), 1u);
  // Its process was told to leave.
  cheater->Wait(absl::Seconds(60));
  EXPECT_FALSE(cheater->Running()) << cheater->Log();
  EXPECT_NE(cheater->Log().find("banned"), std::string::npos) << cheater->Log();

  // The operator sees it: the trust block of `shoalctl status` and a
  // PROBLEM from `shoalctl doctor`.
  int code = 0;
  const std::string table = Run(BinDir() + "/shoalctl status --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find("trust (--audit_rate=0.2, --ban_below=0.5)"), std::string::npos) << table;
  EXPECT_NE(table.find("BANNED " + s.bans(0).worker_id() + " (cheater)"), std::string::npos)
      << table;
  const std::string doctor = Run(BinDir() + "/shoalctl doctor --coordinator=" + addr, &code);
  EXPECT_NE(doctor.find("banned from the run"), std::string::npos) << doctor;

  // Prometheus: the ban and the failed audit (docs/OPERATIONS.md alerts).
  static const std::regex kMetrics("metrics on [0-9.]+:([0-9]+)");
  std::smatch m;
  const std::string coordinator_log = coordinator_->Log();
  ASSERT_TRUE(std::regex_search(coordinator_log, m, kMetrics)) << coordinator_log;
  const std::string metrics = testing::HttpGet(std::stoi(m[1]), "/metrics");
  EXPECT_NE(metrics.find("shoal_bans 1"), std::string::npos) << metrics;
  static const std::regex kFailed(
      "shoal_audits_total\\{[^}]*result=\"failed\"[^}]*\\} ([0-9.e+]+)");
  ASSERT_TRUE(std::regex_search(metrics, m, kFailed)) << metrics;
  EXPECT_GE(std::stod(m[1]), 1.0) << metrics;

  // Coming back under its name is refused with the reason.
  Process* again = StartWorker(addr, {"--data_dir=" + shuffled, "--name=cheater"});
  again->Wait(absl::Seconds(60));
  EXPECT_FALSE(again->Running()) << again->Log();
  EXPECT_NE(again->Log().find("PERMISSION_DENIED"), std::string::npos) << again->Log();
  EXPECT_NE(again->Log().find("banned from this run"), std::string::npos) << again->Log();

  // The honest three go on and the model learns; nobody honest failed.
  s = WaitForStatus(
      [](const v1::RunStatus& s) {
        return s.phase() == v1::FINISHED || s.last_completed_round() >= 40;
      },
      absl::Minutes(10));
  ASSERT_FALSE(s.recent_rounds().empty());
  EXPECT_GE(s.recent_rounds().rbegin()->test_accuracy(), 0.80) << s.DebugString();
  for (const auto& w : s.workers()) {
    if (w.name() == "cheater") continue;
    EXPECT_EQ(w.audits_failed(), 0u) << w.id();
  }
  const v1::WorkerStatus* gone = ByName(s, "cheater");
  EXPECT_TRUE(gone == nullptr || gone->state() == "evicted") << s.DebugString();
}

}  // namespace
}  // namespace shoal
