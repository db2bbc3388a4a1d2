// End-to-end tests of checkpoints in a run (issue #4): the real store,
// coordinator and workers on 127.0.0.1.
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

using CheckpointRunTest = ClusterTest;

TEST_F(CheckpointRunTest, CheckpointsAreUploadedAndRecorded) {
  const std::string store = StartStore();
  const std::string addr =
      StartCoordinator({"--min_participants=2", "--local_steps=20", "--rounds=4",
                        "--checkpoint_store=" + store, "--checkpoint_every=2", "--run_id=ckpt-a"});
  StartWorker(addr);
  StartWorker(addr);
  const v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED && s.checkpoint_round() == 4; },
      absl::Seconds(90));
  EXPECT_EQ(s.checkpoint_id(), "ckpt-a-r4");
  int code = -1;
  const std::string list =
      Run(BinDir() + "/shoalctl checkpoints list --json --store=" + store, &code);
  EXPECT_EQ(code, 0) << list;
  EXPECT_NE(list.find("ckpt-a-r2"), std::string::npos) << list;
  EXPECT_NE(list.find("ckpt-a-r4"), std::string::npos) << list;
  const std::string show =
      Run(BinDir() + "/shoalctl checkpoints show --json --id=ckpt-a-r4 --store=" + store, &code);
  EXPECT_EQ(code, 0) << show;
  // The stored model is the one the workers agreed on.
  EXPECT_NE(show.find(s.model_hash()), std::string::npos) << show;
  EXPECT_NE(show.find("fc1.weight"), std::string::npos) << show;
}

TEST_F(CheckpointRunTest, FullRestartResumesFromTheCheckpoint) {
  const std::string store = StartStore();
  const std::vector<std::string> flags = {"--min_participants=2", "--local_steps=20",
                                          "--checkpoint_store=" + store, "--checkpoint_every=2",
                                          "--run_id=ckpt-b"};
  std::string addr = StartCoordinator(flags);
  StartWorker(addr);
  StartWorker(addr);
  const v1::RunStatus before = WaitForStatus(
      [](const v1::RunStatus& s) { return s.checkpoint_round() >= 4; }, absl::Seconds(90));
  // Everything but the store dies.
  coordinator_->Signal(SIGKILL);
  for (auto& w : workers_) w->Signal(SIGKILL);
  coordinator_->Wait(absl::Seconds(10));
  for (auto& w : workers_) w->Wait(absl::Seconds(10));
  workers_.clear();

  // A new coordinator (no state dir) with the same run id and store.
  addr = StartCoordinator(flags);
  const v1::RunStatus resumed = WaitForStatus(
      [](const v1::RunStatus& s) { return s.last_completed_round() > 0; }, absl::Seconds(10));
  const uint64_t from = resumed.checkpoint_round();
  EXPECT_GE(from, 4u);
  EXPECT_EQ(resumed.last_completed_round(), from);
  EXPECT_EQ(resumed.run_id(), before.run_id());
  StartWorker(addr);
  StartWorker(addr);
  const v1::RunStatus after = ExpectRoundsGoOn(from, 2, 2);
  // Round numbering went on from the checkpoint.
  for (const auto& r : after.recent_rounds()) EXPECT_GT(r.round(), from);
  // The workers started from the stored model, not from scratch.
  for (auto& w : workers_) {
    EXPECT_NE(w->Log().find("from the store"), std::string::npos) << w->Log();
  }

  // A new run id starts fresh.
  coordinator_->Stop();
  for (auto& w : workers_) w->Stop();
  StartCoordinator({"--min_participants=1", "--checkpoint_store=" + store, "--run_id=ckpt-c"});
  v1::RunStatus fresh;
  ASSERT_TRUE(Status(&fresh));
  EXPECT_EQ(fresh.last_completed_round(), 0u);
  EXPECT_EQ(fresh.round(), 1u);
}

}  // namespace
}  // namespace shoal
