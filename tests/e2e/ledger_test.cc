// End-to-end test of the sample ledger (issue 28, docs/DATA.md): a 2-epoch
// run with churn (a worker killed while it trains, one frozen until the
// coordinator gives it up, late joiners) trains every sample of the
// training set exactly twice, once per epoch. The count comes from the
// workers' own logs of the samples of each round they completed.
#include <cstdint>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

using LedgerTest = ClusterTest;

// A participant still training (its work is lost if it goes now).
std::string Training(const v1::RunStatus& s) {
  if (s.phase() != v1::TRAINING) return "";
  for (const auto& w : s.workers()) {
    if (w.state() == "training") return w.id();
  }
  return "";
}

// Adds the positions of every "ledger: round R trained samples ..." line
// of `log` with R > after_round to `seen` (epoch -> count per position).
// Returns the number of lines.
int CountTrained(const std::string& log, uint64_t after_round, std::vector<std::vector<int>>* seen,
                 uint64_t up_to_round = UINT64_MAX) {
  static const std::regex kLine("ledger: round ([0-9]+) trained samples ([^\n]*)");
  static const std::regex kRange("e([0-9]+):\\[([0-9]+),([0-9]+)\\)");
  int lines = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kLine); it != std::sregex_iterator();
       ++it) {
    const uint64_t round = std::stoull((*it)[1]);
    if (round <= after_round || round > up_to_round) continue;
    ++lines;
    const std::string ranges = (*it)[2];
    for (auto r = std::sregex_iterator(ranges.begin(), ranges.end(), kRange);
         r != std::sregex_iterator(); ++r) {
      const uint64_t epoch = std::stoull((*r)[1]);
      const uint64_t begin = std::stoull((*r)[2]);
      const uint64_t end = std::stoull((*r)[3]);
      EXPECT_LT(epoch, seen->size()) << ranges;
      if (epoch >= seen->size()) continue;
      auto& counts = (*seen)[epoch];
      EXPECT_LE(end, counts.size()) << ranges;
      for (uint64_t p = begin; p < end && p < counts.size(); ++p) ++counts[p];
    }
  }
  return lines;
}

// The workers' logs once they have ended. The coordinator reports FINISHED
// as soon as the last round completes, before every worker has read that
// round's RoundComplete and written its ledger line; each worker exits
// after the RunFinished that follows it.
std::string LogsAfterExit(std::vector<std::unique_ptr<Process>>& workers) {
  std::string logs;
  for (auto& w : workers) {
    w->Wait(absl::Seconds(60));
    logs += w->Log();
  }
  return logs;
}

void ExpectEachOnce(const std::vector<std::vector<int>>& seen) {
  for (size_t epoch = 0; epoch < seen.size(); ++epoch) {
    uint64_t missing = 0, twice = 0, first_missing = 0, first_twice = 0;
    for (size_t p = 0; p < seen[epoch].size(); ++p) {
      const int c = seen[epoch][p];
      if (c == 0 && missing++ == 0) first_missing = p;
      if (c > 1 && twice++ == 0) first_twice = p;
    }
    EXPECT_EQ(missing, 0u) << "epoch " << epoch << ", first missing position " << first_missing;
    EXPECT_EQ(twice, 0u) << "epoch " << epoch << ", first position twice " << first_twice;
  }
}

TEST_F(LedgerTest, ChurnTrainsEverySampleExactlyOncePerEpoch) {
  const std::string addr = StartCoordinator(
      {"--min_participants=2", "--local_steps=20", "--sample_ledger", "--epochs=2",
       "--heartbeat_lease=10s", "--connection_timeout=5s", "--max_connection_retry=2",
       "--round_timeout=120s", "--adaptive_deadline=false"});
  for (int i = 0; i < 3; ++i) StartWorker(addr);

  // A kill while the victim trains: its samples go back to the pool. The
  // status says "training" as soon as the coordinator has sent the round's
  // start, possibly before the victim has read the completion of the round
  // it averaged and written that round's ledger line; a kill in that window
  // would lose the line though the samples are in the agreed model. So the
  // victim is one whose log already holds the last completed round's line
  // (it has read its RoundStart since), picked again if it has none.
  std::string id;
  v1::RunStatus s;
  Process* killed = nullptr;
  const absl::Time pick_deadline = absl::Now() + absl::Seconds(180);
  while (killed == nullptr && absl::Now() < pick_deadline) {
    uint64_t last = 0;
    s = WaitForStatus(
        [&](const v1::RunStatus& s) {
          id = Training(s);
          last = s.last_completed_round();
          return last >= 2 && !id.empty();
        },
        absl::Seconds(180));
    Process* victim = WorkerById(id);
    ASSERT_NE(victim, nullptr);
    const std::string line = absl::StrCat("ledger: round ", last, " trained");
    if (WaitUntil([&] { return victim->Log().find(line) != std::string::npos; },
                  absl::Seconds(3))) {
      killed = victim;
    }
  }
  ASSERT_NE(killed, nullptr) << "no training worker had written its last round's ledger line";
  killed->Signal(SIGKILL);
  StartWorker(addr);  // a late joiner

  // A worker frozen while it trains, until the coordinator gives it up.
  s = WaitForStatus(
      [&](const v1::RunStatus& s) {
        id = Training(s);
        return s.last_completed_round() >= 8 && !id.empty();
      },
      absl::Seconds(180));
  Process* frozen = WorkerById(id);
  ASSERT_NE(frozen, nullptr);
  frozen->Signal(SIGSTOP);
  const std::string frozen_id = id;
  WaitForStatus(
      [&](const v1::RunStatus& s) {
        for (const auto& w : s.workers()) {
          if (w.id() == frozen_id) return w.state() == "lost" || w.state() == "evicted";
        }
        return false;
      },
      absl::Seconds(120));
  frozen->Signal(SIGCONT);
  StartWorker(addr);

  const v1::RunStatus done = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Seconds(600));
  ASSERT_TRUE(done.has_ledger());
  const v1::SampleLedger& ledger = done.ledger();
  const uint64_t n = ledger.dataset_samples();
  ASSERT_EQ(n, 60000u);
  EXPECT_EQ(ledger.epochs_done(), 2u);
  EXPECT_EQ(ledger.samples_trained(), 2 * n);
  EXPECT_GT(ledger.samples_lost(), 0u);
  EXPECT_EQ(ledger.samples_redone(), ledger.samples_lost());
  EXPECT_NE(done.detail().find("finished"), std::string::npos) << done.detail();
  std::cout << "ledger after " << done.last_completed_round() << " rounds: trained "
            << ledger.samples_trained() << ", lost " << ledger.samples_lost() << ", redone "
            << ledger.samples_redone() << "\n";

  // The workers' own account: every position of each epoch exactly once.
  std::vector<std::vector<int>> seen(2, std::vector<int>(n, 0));
  const std::string logs = LogsAfterExit(workers_);
  EXPECT_GT(CountTrained(logs, 0, &seen), 0);
  ExpectEachOnce(seen);
  if (HasFailure()) {
    // What the workers said about rounds, sessions and ledgers.
    std::istringstream lines(logs);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("ledger") != std::string::npos || line.find("session") != std::string::npos ||
          line.find("void") != std::string::npos || line.find("join") != std::string::npos) {
        std::cout << line << "\n";
      }
    }
  }
}

// A full restart from the store continues the checkpoint's ledger: the
// rounds after the checkpoint are trained again, and the epoch still ends
// with every sample trained once.
TEST_F(LedgerTest, FullRestartContinuesTheCheckpointsLedger) {
  const std::string store = StartStore();
  const std::vector<std::string> flags = {"--min_participants=2",
                                          "--local_steps=20",
                                          "--sample_ledger",
                                          "--epochs=1",
                                          "--checkpoint_store=" + store,
                                          "--checkpoint_every=3",
                                          "--run_id=ledger-r",
                                          "--adaptive_deadline=false"};
  std::string addr = StartCoordinator(flags);
  StartWorker(addr);
  StartWorker(addr);
  const v1::RunStatus saved = WaitForStatus(
      [](const v1::RunStatus& s) { return s.checkpoint_round() >= 6; }, absl::Seconds(180));
  // The checkpoint is reported once its uploader has read the round's
  // RoundComplete, which the other worker may not have read yet: its ledger
  // line of that round must be in its log before it dies.
  const std::string saved_line =
      absl::StrCat("ledger: round ", saved.checkpoint_round(), " trained samples");
  for (auto& w : workers_) {
    EXPECT_TRUE(WaitUntil([&] { return w->Log().find(saved_line) != std::string::npos; },
                          absl::Seconds(60)))
        << w->Log();
  }
  KillCoordinatorAndWorkers();
  std::string first_logs;
  for (auto& w : workers_) first_logs += w->Log();
  workers_.clear();

  addr = StartCoordinator(flags);
  const v1::RunStatus resumed = WaitForStatus(
      [](const v1::RunStatus& s) { return s.last_completed_round() > 0; }, absl::Seconds(20));
  const uint64_t from = resumed.checkpoint_round();
  ASSERT_TRUE(resumed.has_ledger());
  const v1::SampleLedger& at = resumed.ledger();
  // The checkpoint's ledger: what its rounds trained, nothing in flight.
  EXPECT_EQ(at.dataset_samples(), 60000u);
  EXPECT_GT(at.samples_trained(), 0u);
  uint64_t pool = 0;
  for (const auto& r : at.pool()) pool += r.count();
  EXPECT_EQ(at.samples_trained() + pool, at.epoch() * 60000 + at.offset());
  StartWorker(addr);
  StartWorker(addr);
  const v1::RunStatus done = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Seconds(300));
  EXPECT_EQ(done.ledger().epochs_done(), 1u);
  EXPECT_EQ(done.ledger().samples_trained(), 60000u);
  // The first workers' rounds up to the checkpoint, then the new ones'.
  std::vector<std::vector<int>> seen(1, std::vector<int>(60000, 0));
  EXPECT_GT(CountTrained(first_logs, 0, &seen, from), 0);
  EXPECT_GT(CountTrained(LogsAfterExit(workers_), from, &seen), 0);
  ExpectEachOnce(seen);
}

}  // namespace
}  // namespace shoal
