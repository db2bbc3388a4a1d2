// End-to-end tests of checkpoints in a run (issue #4): the real store,
// coordinator and workers on 127.0.0.1.
#include <fstream>
#include <regex>

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
  KillCoordinatorAndWorkers();
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

// The defect of issue 28: the checkpoint a full restart resumes from is
// damaged on the store's disk after the store verified it, so the workers
// find it as they load it. The run goes back to the older intact
// checkpoint; no round completes on another model (the seed's).
TEST_F(CheckpointRunTest, DamagedCheckpointAtResumeGoesBackToTheOlderIntactOne) {
  const std::string store = StartStore();
  const std::vector<std::string> flags = {"--min_participants=2", "--local_steps=20",
                                          "--checkpoint_store=" + store, "--checkpoint_every=2",
                                          "--run_id=ckpt-d"};
  std::string addr = StartCoordinator(flags);
  StartWorker(addr);
  StartWorker(addr);
  WaitForStatus([](const v1::RunStatus& s) { return s.checkpoint_round() >= 4; },
                absl::Seconds(90));
  KillCoordinatorAndWorkers();
  workers_.clear();

  // The newest checkpoint (a checkpoint may have landed after the status).
  int code = -1;
  const std::string list =
      Run(BinDir() + "/shoalctl checkpoints list -o json --store=" + store, &code);
  ASSERT_EQ(code, 0) << list;
  uint64_t newest = 0;
  static const std::regex kId("\"ckpt-d-r([0-9]+)\"");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), kId); it != std::sregex_iterator();
       ++it) {
    newest = std::max<uint64_t>(newest, std::stoull((*it)[1]));
  }
  ASSERT_GE(newest, 4u) << list;
  const std::string damaged = absl::StrCat("ckpt-d-r", newest);
  const std::string older = absl::StrCat("ckpt-d-r", newest - 2);
  // One byte of its fc1.weight blob flips on disk.
  const std::string show = Run(
      BinDir() + "/shoalctl checkpoints show -o json --id=" + damaged + " --store=" + store, &code);
  ASSERT_EQ(code, 0) << show;
  std::smatch m;
  static const std::regex kLayer("\"fc1\\.weight\"[^}]*\"sha256\": \"([0-9a-f]{64})\"");
  ASSERT_TRUE(std::regex_search(show, m, kLayer)) << show;
  const std::string sha = m[1];
  const std::string blob = absl::StrCat(dir_.path(), "/store/blobs/", sha.substr(0, 2), "/", sha);
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << blob;
    f.seekg(100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(100);
    f.write(&c, 1);
  }

  addr = StartCoordinator(flags);
  WaitForStatus([&](const v1::RunStatus& s) { return s.checkpoint_id() == damaged; },
                absl::Seconds(20));
  StartWorker(addr);
  StartWorker(addr);
  const v1::RunStatus back = WaitForStatus(
      [](const v1::RunStatus& s) { return !s.base_fallback().empty(); }, absl::Seconds(120));
  EXPECT_NE(back.base_fallback().find("checkpoint " + damaged + " is damaged"), std::string::npos)
      << back.base_fallback();
  EXPECT_NE(back.base_fallback().find("went back to checkpoint " + older), std::string::npos)
      << back.base_fallback();
  // The rounds after the older checkpoint are trained again, past the
  // damaged one.
  const v1::RunStatus after =
      WaitForStatus([&](const v1::RunStatus& s) { return s.last_completed_round() > newest; },
                    absl::Seconds(120));
  ASSERT_GT(after.recent_rounds_size(), 0);
  // The first round this coordinator completed is the one after the older
  // checkpoint: nothing completed on the seed's model under later numbers.
  EXPECT_EQ(after.recent_rounds(0).round(), newest - 1);
  EXPECT_TRUE(after.error().empty()) << after.error();
  // Every worker loaded the older checkpoint; the first to find the damage
  // said so (another's read may have been cut short by the round's abort).
  int found = 0;
  for (auto& w : workers_) {
    const std::string log = w->Log();
    EXPECT_NE(log.find("loading checkpoint " + older), std::string::npos) << log;
    if (log.find("checkpoint " + damaged + " is damaged") != std::string::npos) ++found;
  }
  EXPECT_GE(found, 1);
  // The store marked the blob damaged as it served it, and the redone
  // round's upload replaced the checkpoint.
  EXPECT_NE(store_->Log().find("blob " + sha + " is damaged"), std::string::npos) << store_->Log();
}

}  // namespace
}  // namespace shoal
