// The e2e fixture: a coordinator and workers as real processes on
// 127.0.0.1, a status stub, and helpers to wait on the run's status.
#ifndef SHOAL_TESTS_E2E_CLUSTER_FIXTURE_H_
#define SHOAL_TESTS_E2E_CLUSTER_FIXTURE_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tests/support/test_support.h"

namespace shoal {

using ::shoal::testing::BinDir;
using ::shoal::testing::DataDir;
using ::shoal::testing::Process;
using ::shoal::testing::TempDir;
using ::shoal::testing::WaitUntil;

// round -> the round line of a worker log: "round N: ... wire_in=... hash=H"
// (the line every synchronous worker logs when a round completes). Complete
// lines only: a running worker may be writing the last one.
inline std::map<uint64_t, std::string> RoundLines(const std::string& log) {
  std::map<uint64_t, std::string> out;
  const absl::string_view complete(log.data(), log.rfind('\n') + 1);
  for (absl::string_view line : absl::StrSplit(complete, '\n')) {
    const size_t r = line.find("round ");
    if (r == absl::string_view::npos || line.find(" hash=") == absl::string_view::npos ||
        line.find("wire_in=") == absl::string_view::npos) {
      continue;
    }
    const size_t colon = line.find(':', r);
    uint64_t round = 0;
    if (colon == absl::string_view::npos ||
        !absl::SimpleAtoi(line.substr(r + 6, colon - r - 6), &round)) {
      continue;
    }
    out[round] = std::string(line);
  }
  return out;
}

// round -> hash prefix from a worker log's round lines.
inline std::map<uint64_t, std::string> RoundHashes(const std::string& log) {
  std::map<uint64_t, std::string> out;
  for (const auto& [round, line] : RoundLines(log)) {
    out[round] = line.substr(line.find(" hash=") + 6, 12);
  }
  return out;
}

class ClusterTest : public ::testing::Test {
 public:
  void SetUp() override {
    if (access((DataDir() + "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
      GTEST_SKIP() << "Fashion-MNIST not installed at " << DataDir();
    }
  }

  // Starts a checkpoint store on 127.0.0.1:0 (its data in the test's
  // directory) and returns its address.
  std::string StartStore(std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0",
                                     "--data_dir=" + dir_.path() + "/store"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    store_ = Process::Start(argv, dir_.path() + "/store.log");
    const std::string address = store_->WaitForListenAddress(absl::Seconds(60));
    EXPECT_FALSE(address.empty()) << store_->Log();
    return address;
  }

  // Starts a coordinator on 127.0.0.1:0 and returns its address.
  std::string StartCoordinator(std::vector<std::string> flags) {
    return StartCoordinatorAt("127.0.0.1:0", std::move(flags));
  }

  // Starts (or restarts) the coordinator on `listen`.
  std::string StartCoordinatorAt(const std::string& listen, std::vector<std::string> flags) {
    ++coordinator_starts_;
    std::vector<std::string> argv = {BinDir() + "/shoal-coordinator", "--listen=" + listen};
    argv.insert(argv.end(), flags.begin(), flags.end());
    coordinator_ = Process::Start(
        argv, absl::StrCat(dir_.path(), "/coordinator-", coordinator_starts_, ".log"));
    const std::string address = coordinator_->WaitForListenAddress(absl::Seconds(60));
    EXPECT_FALSE(address.empty()) << coordinator_->Log();
    stub_ = v1::Coordinator::NewStub(MakeChannel(address));
    return address;
  }

  Process* StartWorker(const std::string& coordinator, std::vector<std::string> flags = {}) {
    const int n = static_cast<int>(workers_.size()) + 1;
    std::vector<std::string> argv = {BinDir() + "/shoal-worker", "--coordinator=" + coordinator,
                                     "--listen=127.0.0.1:0",     "--data_dir=" + DataDir(),
                                     "--eval_limit=2000",        absl::StrCat("--name=e2e-", n)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    workers_.push_back(Process::Start(argv, absl::StrCat(dir_.path(), "/worker-", n, ".log")));
    return workers_.back().get();
  }

  bool Status(v1::RunStatus* status) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(5)));
    return stub_->GetRunStatus(&ctx, v1::GetRunStatusRequest(), status).ok();
  }

  v1::RunStatus WaitForStatus(const std::function<bool(const v1::RunStatus&)>& pred,
                              absl::Duration timeout) {
    v1::RunStatus status;
    const bool ok = WaitUntil([&] { return Status(&status) && pred(status); }, timeout);
    EXPECT_TRUE(ok) << "timed out; last status:\n" << status.DebugString() << Logs();
    return status;
  }

  std::string Logs() {
    std::string out = "\n--- coordinator ---\n" + (coordinator_ ? coordinator_->Log() : "");
    for (auto& w : workers_) out += "\n--- " + w->log_path() + " ---\n" + w->Log();
    return out;
  }

  // Runs a command, returns its stdout; `code` gets the exit code.
  static std::string Run(const std::string& command, int* code) {
    std::string out;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
    const int status = pclose(pipe);
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
  }

  // Waits until `more` rounds completed after round `after`, then checks that
  // every worker that reported the last completed round holds the agreed
  // model, and that at least `min_agreeing` do. Returns the status.
  // `timeout` is a hang guard: under a CPU hog a round of 300 local steps
  // took over 20 s.
  v1::RunStatus ExpectRoundsGoOn(uint64_t after, uint64_t more, size_t min_agreeing,
                                 absl::Duration timeout = absl::Seconds(240)) {
    // Under load a worker may sit a round out now and then, so wait for a
    // round that `min_agreeing` workers completed together.
    auto agreeing = [](const v1::RunStatus& s) {
      size_t n = 0;
      for (const auto& w : s.workers()) {
        n += w.state() != "evicted" && w.model_round() == s.last_completed_round() &&
             w.model_hash() == s.model_hash();
      }
      return n;
    };
    const v1::RunStatus status = WaitForStatus(
        [&](const v1::RunStatus& s) {
          return s.last_completed_round() >= after + more && agreeing(s) >= min_agreeing;
        },
        timeout);
    for (const auto& w : status.workers()) {
      if (w.state() == "evicted" || w.model_round() != status.last_completed_round()) continue;
      EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id() << Logs();
    }
    EXPECT_GE(agreeing(status), min_agreeing) << status.DebugString() << Logs();
    return status;
  }

  static const v1::WorkerStatus* FindWorker(const v1::RunStatus& s, const std::string& id) {
    for (const auto& w : s.workers()) {
      if (w.id() == id) return &w;
    }
    return nullptr;
  }

  // The id the coordinator gave a worker process (from its log), or "".
  static std::string WorkerId(Process* p) {
    const std::string log = p->Log();
    const size_t at = log.find(" as w");
    if (at == std::string::npos) return "";
    size_t end = at + 5;
    while (end < log.size() && std::isdigit(static_cast<unsigned char>(log[end]))) ++end;
    return log.substr(at + 4, end - at - 4);
  }

  // Everything but the store dies (kill -9), as in a full restart; the
  // workers stay in workers_ (their logs) until the caller clears them.
  void KillCoordinatorAndWorkers() {
    coordinator_->Signal(SIGKILL);
    for (auto& w : workers_) w->Signal(SIGKILL);
    coordinator_->Wait(absl::Seconds(10));
    for (auto& w : workers_) w->Wait(absl::Seconds(10));
  }

  Process* WorkerById(const std::string& id) {
    for (auto& w : workers_) {
      if (WorkerId(w.get()) == id) return w.get();
    }
    return nullptr;
  }

  int coordinator_starts_ = 0;
  TempDir dir_;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::unique_ptr<Process> store_;  // StartStore's
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace shoal

#endif  // SHOAL_TESTS_E2E_CLUSTER_FIXTURE_H_
