// A run of a TorchScript model brought by the user (issue 15): the example
// CNN with BatchNorm (examples/torchscript/small_cnn.py, Debian's
// python3-torch) trained by 3 workers on Fashion-MNIST; the file travels
// from the coordinator to the first worker and from peers to the others;
// hashes agree every round; a checkpoint export loads into the Python class
// with load_state_dict, scores, on the test images the workers evaluated
// on, the accuracy the workers reported, and predicts every one of the first
// 100 test images as a worker's final model did (--predictions_out).
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "tests/e2e/cluster_fixture.h"

#ifndef SHOAL_SOURCE_DIR
#error "SHOAL_SOURCE_DIR must be defined"
#endif

namespace shoal {
namespace {

class TorchScriptRunTest : public ClusterTest {
 protected:
  void SetUp() override {
    ClusterTest::SetUp();
    if (IsSkipped()) return;
    if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "python3-torch (Debian) is not installed: scripts/install-deps.sh "
                      "installs it";
    }
  }
  std::unique_ptr<Process> store_;
};

TEST_F(TorchScriptRunTest, ThreeWorkersTrainTheExampleCnnAndTheExportLoadsInPython) {
  const std::string script = std::string(SHOAL_SOURCE_DIR) + "/examples/torchscript/small_cnn.py";
  const std::string model = dir_.path() + "/small_cnn.pt";
  int code = -1;
  const std::string wrote = Run("/usr/bin/python3 " + script + " write " + model + " 2>&1", &code);
  ASSERT_EQ(code, 0) << wrote;

  store_ = Process::Start({BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0",
                           "--data_dir=" + dir_.path() + "/store"},
                          dir_.path() + "/store.log");
  const std::string store = store_->WaitForListenAddress(absl::Seconds(60));
  ASSERT_FALSE(store.empty()) << store_->Log();
  const uint64_t rounds = 8;
  const std::string addr =
      StartCoordinator({"--model=torchscript:" + model, "--min_participants=3", "--local_steps=50",
                        "--learning_rate=0.05", absl::StrCat("--rounds=", rounds), "--eval_every=4",
                        "--checkpoint_store=" + store, "--checkpoint_every=8", "--run_id=ts",
                        // Every worker in every round (the last one is
                        // checked): on a loaded machine the adaptive
                        // deadline may leave one out, which this test does
                        // not study.
                        "--adaptive_deadline=false"});
  ASSERT_FALSE(addr.empty());
  // The first worker gets the file from the coordinator; the next two from
  // a peer that holds it.
  Process* first = StartWorker(addr, {"--eval_limit=1000"});
  ASSERT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains(first->Log(), "SHA-256 verified") &&
               absl::StrContains(first->Log(), "admitted");
      },
      absl::Seconds(120)))
      << Logs();
  EXPECT_TRUE(absl::StrContains(first->Log(), "from coordinator")) << first->Log();
  Process* second = StartWorker(addr, {"--eval_limit=1000"});
  const std::string predictions = dir_.path() + "/predictions.txt";
  Process* third = StartWorker(addr, {"--eval_limit=1000", "--predictions_out=" + predictions});

  // Rounds take as long as the machine makes them: the waits are hang
  // guards, not targets.
  WaitForStatus([](const v1::RunStatus& s) { return s.last_completed_round() >= 1; },
                absl::Seconds(180));
  const v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED && s.checkpoint_round() > 0; },
      absl::Seconds(300));
  ASSERT_EQ(s.last_completed_round(), rounds) << Logs();
  for (Process* p : {second, third}) {
    EXPECT_TRUE(absl::StrContains(p->Log(), "from peer 127.0.0.1:")) << p->Log();
  }
  size_t agreeing = 0;
  for (const auto& w : s.workers()) {
    if (w.model_round() != rounds) continue;
    EXPECT_EQ(w.model_hash(), s.model_hash()) << w.id() << Logs();
    ++agreeing;
  }
  EXPECT_EQ(agreeing, 3u) << s.DebugString();
  double accuracy = -1;
  for (const auto& r : s.recent_rounds()) {
    if (r.round() == rounds && r.evaluated()) accuracy = r.test_accuracy();
  }
  EXPECT_GE(accuracy, 0.85) << s.DebugString();

  // The export loads into the Python class (strict load_state_dict) and
  // scores the same on the same 1000 test images.
  const std::string pt = dir_.path() + "/export.pt";
  const std::string exported =
      Run(absl::StrCat(BinDir(), "/shoalctl checkpoints export --store=", store,
                       " --id=", s.checkpoint_id(), " --out=", pt, " 2>&1"),
          &code);
  ASSERT_EQ(code, 0) << exported;
  // The third worker writes its final model's predictions when it leaves.
  ASSERT_TRUE(WaitUntil([&] { return access(predictions.c_str(), R_OK) == 0; }, absl::Seconds(60)))
      << third->Log();
  std::string header;
  std::getline(std::ifstream(predictions) >> std::ws, header);
  EXPECT_TRUE(
      absl::StrContains(header, absl::StrCat("model round ", rounds, " hash ", s.model_hash())))
      << header;
  const std::string checked = Run(absl::StrCat("/usr/bin/python3 ", script, " check ", pt,
                                               " --images=1000 --data_dir=", DataDir(),
                                               " --predictions=", predictions, " 2>&1"),
                                  &code);
  ASSERT_EQ(code, 0) << checked;
  // Every one of the worker's 100 predictions is the Python model's.
  EXPECT_TRUE(absl::StrContains(checked, "predictions: 100 of 100 agree with the worker"))
      << checked;
  EXPECT_TRUE(absl::StrContains(checked, "loaded 16 tensors with load_state_dict")) << checked;
  const size_t at = checked.find("accuracy=");
  ASSERT_NE(at, std::string::npos) << checked;
  double python_accuracy = -1;
  ASSERT_TRUE(absl::SimpleAtod(checked.substr(at + 9, 6), &python_accuracy)) << checked;
  // The same predictions up to float rounding: at most one image of 1000.
  EXPECT_NEAR(python_accuracy, accuracy, 0.0011) << checked;
}

}  // namespace
}  // namespace shoal
