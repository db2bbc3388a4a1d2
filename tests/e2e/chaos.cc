// The chaos scenario (issue #3), runnable by itself: `make chaos` or
//   build/bin/shoal-chaos [--workers=6] [--seconds=180] [--seed=1]
// Runs a coordinator and N workers on 127.0.0.1 and, at random, kills
// workers (kill -9), stops and continues them (SIGSTOP/SIGCONT), starts new
// ones and kill -9s and restarts the coordinator on its state dir. Reports
// the rounds completed, the longest stall between two completed rounds, and
// whether the participants' models agreed after every round (no hash
// mismatch evictions, and a final check of every live worker).
// Exit 0 when no disagreement and no stall longer than the bound.
#include <signal.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_util.h"
#include "common/worker_state.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tests/support/test_support.h"

ABSL_FLAG(int, workers, 6, "Workers to keep around.");
ABSL_FLAG(int, seconds, 180, "How long to run the chaos.");
ABSL_FLAG(uint64_t, seed, 1, "Random seed of the fault schedule.");
ABSL_FLAG(std::string, bin_dir, "",
          "Directory of the binaries (default: $SHOAL_BIN_DIR or build/bin).");
ABSL_FLAG(std::string, data_dir, "", "Fashion-MNIST directory (default: Debian's).");
ABSL_FLAG(absl::Duration, round_timeout, absl::Seconds(5), "--round_timeout of the coordinator.");
ABSL_FLAG(absl::Duration, connection_timeout, absl::Seconds(2),
          "--connection_timeout of the coordinator.");
ABSL_FLAG(int, max_connection_retry, 2, "--max_connection_retry of the coordinator.");

namespace {

using shoal::testing::Process;

struct Cluster {
  std::string bin, data, dir, state, addr;
  std::vector<std::string> coordinator_flags;
  std::unique_ptr<Process> coordinator;
  std::vector<std::unique_ptr<Process>> workers;
  std::vector<bool> stopped;
  int started = 0, coordinator_starts = 0;

  std::string StartCoordinator(const std::string& listen) {
    std::vector<std::string> argv = {bin + "/shoal-coordinator", "--listen=" + listen};
    argv.insert(argv.end(), coordinator_flags.begin(), coordinator_flags.end());
    coordinator =
        Process::Start(argv, absl::StrCat(dir, "/coordinator-", ++coordinator_starts, ".log"));
    return coordinator->WaitForListenAddress(absl::Seconds(60));
  }
  void StartWorker() {
    ++started;
    workers.push_back(Process::Start(
        {bin + "/shoal-worker", "--coordinator=" + addr, "--listen=127.0.0.1:0",
         "--data_dir=" + data, "--eval_limit=1000", absl::StrCat("--name=chaos-", started)},
        absl::StrCat(dir, "/worker-", started, ".log")));
    stopped.push_back(false);
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  Cluster c;
  c.bin = absl::GetFlag(FLAGS_bin_dir).empty() ? shoal::testing::BinDir()
                                               : absl::GetFlag(FLAGS_bin_dir);
  c.data = absl::GetFlag(FLAGS_data_dir).empty() ? shoal::testing::DataDir()
                                                 : absl::GetFlag(FLAGS_data_dir);
  shoal::testing::TempDir tmp;
  c.dir = tmp.path();
  c.state = c.dir + "/state";
  const absl::Duration round_timeout = absl::GetFlag(FLAGS_round_timeout);
  const absl::Duration connection_timeout = absl::GetFlag(FLAGS_connection_timeout);
  const int retries = absl::GetFlag(FLAGS_max_connection_retry);
  c.coordinator_flags = {
      "--min_participants=2",
      "--local_steps=30",
      "--heartbeat_lease=3s",
      absl::StrCat("--round_timeout=", absl::FormatDuration(round_timeout)),
      absl::StrCat("--connection_timeout=", absl::FormatDuration(connection_timeout)),
      absl::StrCat("--max_connection_retry=", retries),
      "--max_missed_rounds=0",
      "--state_dir=" + c.state};
  c.addr = c.StartCoordinator("127.0.0.1:0");
  if (c.addr.empty()) {
    std::cerr << "chaos: coordinator did not start\n" << c.coordinator->Log();
    return 2;
  }
  const int n = absl::GetFlag(FLAGS_workers);
  for (int i = 0; i < n; ++i) c.StartWorker();
  auto stub = shoal::v1::Coordinator::NewStub(shoal::MakeChannel(c.addr));
  auto status = [&](shoal::v1::RunStatus* s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(shoal::DeadlineIn(absl::Seconds(2)));
    return stub->GetRunStatus(&ctx, shoal::v1::GetRunStatusRequest(), s).ok();
  };

  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  absl::Time next_fault = start + absl::Seconds(5);
  absl::Time last_progress = start;
  absl::Duration longest_stall = absl::ZeroDuration();
  uint64_t last_round = 0, first_round = 0;
  int mismatches = 0, faults = 0;
  std::map<std::string, int> fault_counts;

  while (absl::Now() < end) {
    shoal::v1::RunStatus s;
    if (status(&s)) {
      if (first_round == 0 && s.last_completed_round() > 0) first_round = s.last_completed_round();
      if (s.last_completed_round() > last_round) {
        last_round = s.last_completed_round();
        last_progress = absl::Now();
      }
      for (const auto& w : s.workers()) {
        if (w.reason().find("hash mismatch") != std::string::npos) ++mismatches;
      }
    }
    longest_stall = std::max(longest_stall, absl::Now() - last_progress);
    if (absl::Now() >= next_fault) {
      ++faults;
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      std::vector<size_t> alive;
      for (size_t i = 0; i < c.workers.size(); ++i) {
        if (c.workers[i]->Running()) alive.push_back(i);
      }
      const size_t pick = alive.empty() ? 0 : alive[rng() % alive.size()];
      if (kind <= 2 && alive.size() > 2) {
        c.workers[pick]->Signal(SIGKILL);
        fault_counts["kill -9 worker"]++;
      } else if (kind <= 4 && !alive.empty()) {
        if (c.stopped[pick]) {
          c.workers[pick]->Signal(SIGCONT);
          c.stopped[pick] = false;
          fault_counts["SIGCONT worker"]++;
        } else {
          c.workers[pick]->Signal(SIGSTOP);
          c.stopped[pick] = true;
          fault_counts["SIGSTOP worker"]++;
        }
      } else if (kind <= 7 || alive.size() < 3) {
        c.StartWorker();
        fault_counts["start worker"]++;
      } else {
        c.coordinator->Signal(SIGKILL);
        c.coordinator->Wait(absl::Seconds(10));
        if (c.StartCoordinator(c.addr).empty()) {
          std::cerr << "chaos: coordinator did not restart\n" << c.coordinator->Log();
          return 2;
        }
        fault_counts["kill -9 + restart coordinator"]++;
      }
      // Let stopped workers go on after a while.
      for (size_t i = 0; i < c.workers.size(); ++i) {
        if (c.stopped[i] && std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
          c.workers[i]->Signal(SIGCONT);
          c.stopped[i] = false;
        }
      }
      next_fault = absl::Now() + absl::Seconds(std::uniform_real_distribution<double>(3, 8)(rng));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  // Resume everything and let the cluster settle for a few rounds.
  for (size_t i = 0; i < c.workers.size(); ++i) {
    if (c.stopped[i]) c.workers[i]->Signal(SIGCONT);
  }
  shoal::v1::RunStatus final_status;
  const uint64_t target = last_round + 3;
  shoal::testing::WaitUntil(
      [&] { return status(&final_status) && final_status.last_completed_round() >= target; },
      absl::Seconds(60));
  int agreeing = 0, disagreeing = 0;
  for (const auto& w : final_status.workers()) {
    if (shoal::DepartedState(w.state())) continue;
    if (w.model_round() != final_status.last_completed_round()) continue;
    (w.model_hash() == final_status.model_hash() ? agreeing : disagreeing)++;
  }
  const absl::Duration bound =
      round_timeout + connection_timeout * (retries + 1) + absl::Seconds(5);
  std::cout << absl::StrFormat("chaos: %d workers, %ds, %d faults:", n,
                               absl::GetFlag(FLAGS_seconds), faults);
  for (const auto& [k, v] : fault_counts) std::cout << " " << k << "=" << v;
  std::cout << "\n";
  const bool ok = mismatches == 0 && disagreeing == 0 && agreeing > 0 && longest_stall <= bound &&
                  final_status.last_completed_round() >= target;
  std::cout << absl::StrFormat(
      "chaos: rounds_completed=%d longest_stall=%.1fs stall_bound=%.1fs hash_mismatch_evictions=%d "
      "final_agreeing=%d final_disagreeing=%d result=%s\n",
      final_status.last_completed_round() - first_round, absl::ToDoubleSeconds(longest_stall),
      absl::ToDoubleSeconds(bound), mismatches, agreeing, disagreeing, ok ? "PASS" : "FAIL");
  if (!ok)
    std::cout << "chaos: logs kept in " << c.dir << " until exit\n" << final_status.DebugString();
  return ok ? 0 : 1;
}
