// End-to-end tests: shoal-coordinator, shoal-worker and shoalctl as real
// processes on 127.0.0.1, training on Debian's Fashion-MNIST.
#include <signal.h>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

TEST_F(ClusterTest, ThreeWorkersTrainAndAgreeOnTheModel) {
  const std::string addr = StartCoordinator(
      {"--min_participants=3", "--local_steps=40", "--rounds=4", "--learning_rate=0.05",
       // Every round has all three (checked below), however loaded the
       // machine: no adaptive deadline leaves a slow one out.
       "--adaptive_deadline=false"});
  for (int i = 0; i < 3; ++i) StartWorker(addr);

  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(4));
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  EXPECT_EQ(status.last_completed_round(), 4u);
  ASSERT_EQ(status.recent_rounds_size(), 4);
  ASSERT_EQ(status.model_hash().size(), 64u);

  // Every worker holds the same model after the last round.
  int reported = 0;
  for (const auto& w : status.workers()) {
    EXPECT_EQ(w.model_round(), 4u) << w.id();
    EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
    reported += w.model_round() == 4;
  }
  EXPECT_EQ(reported, 3);
  for (const auto& r : status.recent_rounds()) {
    EXPECT_EQ(r.participants(), 3u);
    EXPECT_TRUE(r.evaluated());
  }
  // Accuracy well above chance (0.1) and rising with training.
  const double first = status.recent_rounds(0).test_accuracy();
  const double last = status.recent_rounds(3).test_accuracy();
  EXPECT_GT(last, 0.6) << Logs();
  EXPECT_GE(last, first - 0.02);

  // Workers leave by themselves when the run is finished, and the status
  // says so: "finished", not "left" or "lost".
  for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(20)), 0) << w->Log();
  const v1::RunStatus ended = WaitForStatus(
      [](const v1::RunStatus& s) {
        for (const auto& w : s.workers()) {
          if (w.state() != "finished") return false;
        }
        return s.workers_size() == 3;
      },
      absl::Seconds(30));
  for (const auto& w : ended.workers()) EXPECT_EQ(w.state(), "finished") << w.id() << w.reason();

  // shoalctl shows the same, as a table and as JSON.
  int code = -1;
  const std::string table = Run(BinDir() + "/shoalctl status --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(table.find("FINISHED"), std::string::npos) << table;
  for (const auto& w : status.workers()) EXPECT_NE(table.find(w.id()), std::string::npos);
  const std::string json = Run(BinDir() + "/shoalctl status --json --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(json.find("\"last_completed_round\": \"4\""), std::string::npos) << json;
}

TEST_F(ClusterTest, WatchPrintsRoundsAndASummaryLine) {
  const std::string addr =
      StartCoordinator({"--min_participants=2", "--local_steps=20", "--rounds=2"});
  StartWorker(addr);
  StartWorker(addr);
  int code = -1;
  const std::string out =
      Run(BinDir() + "/shoalctl watch --timeout=3m --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0) << out << Logs();
  EXPECT_NE(out.find("round 1/2"), std::string::npos) << out;
  EXPECT_NE(out.find("round 2/2"), std::string::npos) << out;
  const size_t summary = out.rfind("summary:");
  ASSERT_NE(summary, std::string::npos) << out;
  EXPECT_NE(out.find("test_accuracy=", summary), std::string::npos);
  EXPECT_NE(out.find("hashes_agree=true", summary), std::string::npos) << out;
}

TEST_F(ClusterTest, RoundsGoOnAfterAWorkerIsKilled) {
  const std::string addr = StartCoordinator(
      // The kill breaks the session (noticed at once, no lease needed);
      // both survivors must hold the last round's model however loaded the
      // machine: no adaptive deadline leaves one out.
      {"--min_participants=2", "--local_steps=20", "--rounds=6", "--adaptive_deadline=false"});
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  WaitForStatus([](const v1::RunStatus& s) { return s.last_completed_round() >= 2; },
                absl::Minutes(2));
  workers_[2]->Signal(SIGKILL);
  EXPECT_EQ(workers_[2]->Wait(absl::Seconds(10)), 128 + SIGKILL);

  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(3));
  EXPECT_EQ(status.last_completed_round(), 6u);
  EXPECT_EQ(status.recent_rounds(status.recent_rounds_size() - 1).participants(), 2u);
  int agreeing = 0;
  for (const auto& w : status.workers()) {
    if (w.model_round() == 6) {
      EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
      ++agreeing;
    }
  }
  EXPECT_EQ(agreeing, 2) << Logs();
}

TEST_F(ClusterTest, SigtermIsAGracefulLeave) {
  const std::string addr = StartCoordinator({"--min_participants=2", "--local_steps=20"});
  StartWorker(addr);
  Process* leaver = StartWorker(addr);
  WaitForStatus([](const v1::RunStatus& s) { return s.last_completed_round() >= 1; },
                absl::Minutes(2));
  leaver->Signal(SIGTERM);
  EXPECT_EQ(leaver->Wait(absl::Seconds(20)), 0) << leaver->Log();
  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) {
        for (const auto& w : s.workers()) {
          if (w.state() == "left") return true;
        }
        return false;
      },
      absl::Seconds(30));
  bool found = false;
  for (const auto& w : status.workers()) {
    if (w.state() == "left") {
      found = true;
      EXPECT_NE(w.reason().find("shut down"), std::string::npos) << w.reason();
    }
  }
  EXPECT_TRUE(found);
  // One member is left, below min_participants: the run waits.
  WaitForStatus([](const v1::RunStatus& s) { return s.phase() == v1::WAITING_FOR_MEMBERS; },
                absl::Seconds(30));
}

TEST_F(ClusterTest, MissingDataDirIsAClearStartupError) {
  const std::string addr = StartCoordinator({"--min_participants=1"});
  Process* w = StartWorker(addr, {"--data_dir=" + dir_.path() + "/no-such-dir"});
  EXPECT_EQ(w->Wait(absl::Seconds(30)), 2);
  const std::string log = w->Log();
  EXPECT_NE(log.find("--data_dir"), std::string::npos) << log;
  EXPECT_NE(log.find("does not exist"), std::string::npos) << log;
  EXPECT_NE(log.find("dataset-fashion-mnist"), std::string::npos) << log;
}

// A worker told to stop while it is re-joining (its coordinator gone) stops
// then, not after its --connect_timeout window: the hang guard (30 s) is a
// quarter of that window.
TEST_F(ClusterTest, SigtermWhileRejoiningEndsTheWorker) {
  const std::string addr = StartCoordinator({"--min_participants=1", "--local_steps=20"});
  Process* w = StartWorker(addr, {"--connect_timeout=120s"});
  WaitForStatus([](const v1::RunStatus& s) { return s.last_completed_round() >= 1; },
                absl::Minutes(2));
  ASSERT_EQ(coordinator_->Stop(), 0);
  // Wait for the worker to notice and start re-joining.
  ASSERT_TRUE(WaitUntil(
      [&] {
        return w->Log().find("re-join") != std::string::npos ||
               w->Log().find("waiting for the coordinator") != std::string::npos;
      },
      absl::Seconds(60)))
      << w->Log();
  w->Signal(SIGTERM);
  const int code = w->Wait(absl::Seconds(30));
  EXPECT_NE(code, -1) << "still running 30 s after SIGTERM\n" << w->Log();
}

TEST_F(ClusterTest, UnreachableCoordinatorIsAClearError) {
  // A coordinator that ran and stopped: nothing listens on its port now.
  const std::string addr = StartCoordinator({"--min_participants=1"});
  ASSERT_EQ(coordinator_->Stop(), 0);
  // Long enough for the waiting note (every 5 s) to be printed once.
  Process* w = StartWorker(addr, {"--connect_timeout=7s"});
  EXPECT_EQ(w->Wait(absl::Seconds(60)), 1);
  const std::string log = w->Log();
  EXPECT_NE(log.find("waiting for the coordinator at " + addr), std::string::npos) << log;
  EXPECT_NE(log.find("cannot join the run at coordinator " + addr), std::string::npos) << log;
  EXPECT_NE(log.find("UNAVAILABLE"), std::string::npos) << log;
  EXPECT_NE(log.find("is --coordinator its address"), std::string::npos) << log;
}

TEST_F(ClusterTest, CoordinatorRejectsBadFlagsAndBusyPorts) {
  auto bad = Process::Start(
      {BinDir() + "/shoal-coordinator", "--listen=127.0.0.1:0", "--min_participants=0"},
      dir_.path() + "/bad.log");
  EXPECT_EQ(bad->Wait(absl::Seconds(20)), 2);
  EXPECT_NE(bad->Log().find("sync.min_participants (--min_participants) must be > 0"),
            std::string::npos)
      << bad->Log();

  auto bad_model =
      Process::Start({BinDir() + "/shoal-coordinator", "--listen=127.0.0.1:0", "--model=resnet"},
                     dir_.path() + "/bad-model.log");
  EXPECT_EQ(bad_model->Wait(absl::Seconds(20)), 2);
  EXPECT_NE(bad_model->Log().find("model.name (--model) must be"), std::string::npos)
      << bad_model->Log();

  const std::string addr = StartCoordinator({"--min_participants=1"});
  auto busy = Process::Start({BinDir() + "/shoal-coordinator", "--listen=" + addr},
                             dir_.path() + "/busy.log");
  EXPECT_EQ(busy->Wait(absl::Seconds(20)), 2);
  EXPECT_NE(busy->Log().find("cannot listen on " + addr), std::string::npos) << busy->Log();
  // The errno, named, with what to do: not a guess.
  EXPECT_NE(busy->Log().find("(errno 98): another process listens on port"), std::string::npos)
      << busy->Log();
  // An address that is not this machine's says so.
  auto foreign = Process::Start({BinDir() + "/shoal-coordinator", "--listen=192.0.2.1:0"},
                                dir_.path() + "/foreign.log");
  EXPECT_EQ(foreign->Wait(absl::Seconds(20)), 2);
  EXPECT_NE(foreign->Log().find("192.0.2.1 is not an address of this machine"), std::string::npos)
      << foreign->Log();
  // The first coordinator still serves.
  v1::RunStatus status;
  EXPECT_TRUE(Status(&status));
}

TEST_F(ClusterTest, HelpExplainsEveryFlag) {
  int code = -1;
  const std::string coord = Run(BinDir() + "/shoal-coordinator --helpfull 2>&1", &code);
  for (const char* flag : {"--listen", "--min_participants", "--local_steps", "--rounds", "--model",
                           "--learning_rate", "--batch_size", "--seed"}) {
    EXPECT_NE(coord.find(std::string(flag) + " ("), std::string::npos) << flag << "\n" << coord;
  }
  const std::string worker = Run(BinDir() + "/shoal-worker --helpfull 2>&1", &code);
  for (const char* flag : {"coordinator", "listen", "data_dir", "advertise"}) {
    EXPECT_NE(worker.find(std::string("--") + flag + " ("), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace shoal
