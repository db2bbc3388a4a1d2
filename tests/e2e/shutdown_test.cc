// SIGTERM ends every binary, in every state it can be in: a worker joining a
// coordinator that is not there, waiting at the barrier for members,
// training, pulling the model as a late joiner, uploading a checkpoint; the
// coordinator with members;
// the store; shoalctl watch. Each must exit by itself with a clean code (the
// test waits for the exit, not for a duration: 60 s is only a hang guard).
// The time from the signal to the exit is printed as `sigterm: ...` lines:
// `bash bench/run.sh sigterm` collects them (the goal, 5 s, is a benchmark
// figure, bench/RESULTS.md).
#include <signal.h>

#include <iostream>

#include "absl/strings/str_format.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

class ShutdownTest : public ClusterTest {
 protected:
  // Sends SIGTERM and waits for the exit; the exit code (-1: still running
  // after the guard), printing how long it took.
  int Terminate(Process* p, const std::string& state) {
    const absl::Time start = absl::Now();
    p->Signal(SIGTERM);
    const int code = p->Wait(absl::Seconds(60));
    std::cout << absl::StrFormat("sigterm: %s exited %d after %.2fs\n", state, code,
                                 absl::ToDoubleSeconds(absl::Now() - start));
    return code;
  }

  bool WorkerIs(const std::string& name, const std::string& state) {
    v1::RunStatus s;
    if (!Status(&s)) return false;
    for (const auto& w : s.workers()) {
      if (w.name() == name) return w.state() == state;
    }
    return false;
  }
};

TEST_F(ShutdownTest, WorkerJoiningACoordinatorThatIsNotThere) {
  const std::string addr = StartCoordinator({"--min_participants=1"});
  ASSERT_EQ(coordinator_->Stop(), 0);
  Process* w = StartWorker(addr, {"--connect_timeout=10m"});
  ASSERT_TRUE(
      WaitUntil([&] { return w->Log().find("waiting for the coordinator") != std::string::npos; },
                absl::Seconds(60)))
      << w->Log();
  EXPECT_EQ(Terminate(w, "worker-joining"), 0) << w->Log();
}

TEST_F(ShutdownTest, WorkerWaitingAtTheBarrier) {
  const std::string addr = StartCoordinator({"--min_participants=2", "--local_steps=5"});
  Process* w = StartWorker(addr, {"--name=alone"});
  ASSERT_TRUE(WaitUntil([&] { return WorkerIs("alone", "waiting"); }, absl::Seconds(60))) << Logs();
  EXPECT_EQ(Terminate(w, "worker-waiting"), 0) << w->Log();
  // It said goodbye: "left", not "lost".
  EXPECT_TRUE(WaitUntil([&] { return WorkerIs("alone", "left"); }, absl::Seconds(30))) << Logs();
}

TEST_F(ShutdownTest, WorkerTrainingAndTheCoordinatorWithMembers) {
  // Long local steps: the worker is inside TrainSteps when the signal comes.
  const std::string addr = StartCoordinator({"--min_participants=1", "--local_steps=1000000"});
  Process* w = StartWorker(addr, {"--name=busy"});
  ASSERT_TRUE(WaitUntil([&] { return WorkerIs("busy", "training"); }, absl::Seconds(60))) << Logs();
  EXPECT_EQ(Terminate(w, "worker-training"), 0) << w->Log();
  StartWorker(addr, {"--name=second"});
  ASSERT_TRUE(WaitUntil([&] { return WorkerIs("second", "training"); }, absl::Seconds(60)))
      << Logs();
  EXPECT_EQ(Terminate(coordinator_.get(), "coordinator-with-members"), 0) << coordinator_->Log();
}

TEST_F(ShutdownTest, LateJoinerPullingTheModel) {
  // Holders that send at 0.2 Mbit/s: the 0.94 MB model takes tens of
  // seconds to pull, so the joiner is caught pulling.
  const std::string addr = StartCoordinator({"--min_participants=1", "--local_steps=5"});
  StartWorker(addr, {"--upload_rate_mbps=0.2"});
  WaitForStatus([](const v1::RunStatus& s) { return s.last_completed_round() >= 1; },
                absl::Minutes(2));
  Process* late = StartWorker(addr, {"--name=late"});
  ASSERT_TRUE(WaitUntil([&] { return WorkerIs("late", "syncing"); }, absl::Seconds(60))) << Logs();
  EXPECT_EQ(Terminate(late, "worker-pulling"), 0) << late->Log();
  if (getenv("SHOAL_SHUTDOWN_LOG")) std::cout << late->Log();
}

TEST_F(ShutdownTest, WorkerUploadingACheckpoint) {
  // A store that stops reading (SIGSTOP) after the first checkpoint: the
  // next upload hangs in flight, and the worker is signalled during it.
  const std::string store = StartStore();
  const std::string addr =
      StartCoordinator({"--min_participants=1", "--local_steps=5", "--checkpoint_every=1",
                        "--checkpoint_store=" + store, "--run_id=sigterm-upload"});
  Process* w = StartWorker(addr, {"--name=uploader"});
  WaitForStatus([](const v1::RunStatus& s) { return s.checkpoint_round() >= 1; }, absl::Minutes(2));
  store_->Signal(SIGSTOP);
  const v1::RunStatus pending = WaitForStatus(
      [](const v1::RunStatus& s) { return !s.checkpoint_pending().empty(); }, absl::Minutes(1));
  ASSERT_FALSE(pending.checkpoint_pending().empty()) << Logs();
  EXPECT_EQ(Terminate(w, "worker-uploading"), 0) << w->Log();
  store_->Signal(SIGCONT);
}

TEST_F(ShutdownTest, StoreAndWatch) {
  auto store = Process::Start({BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0",
                               "--data_dir=" + dir_.path() + "/store"},
                              dir_.path() + "/store.log");
  ASSERT_FALSE(store->WaitForListenAddress(absl::Seconds(60)).empty()) << store->Log();
  EXPECT_EQ(Terminate(store.get(), "checkpoint-store"), 0) << store->Log();

  const std::string addr = StartCoordinator({"--min_participants=2"});
  auto watch = Process::Start({BinDir() + "/shoalctl", "watch", "--coordinator=" + addr},
                              dir_.path() + "/watch.log");
  ASSERT_TRUE(WaitUntil([&] { return watch->Log().find("waiting:") != std::string::npos; },
                        absl::Seconds(30)))
      << watch->Log();
  // shoalctl's code for an interrupted watch.
  EXPECT_EQ(Terminate(watch.get(), "shoalctl-watch"), 130) << watch->Log();
}

}  // namespace
}  // namespace shoal
