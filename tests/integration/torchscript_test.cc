// TorchScript models (--model=torchscript:PATH): the loader's checks and
// their messages, the trainer on a scripted CNN with BatchNorm (names, flat
// buffer with the BatchNorm statistics, optimizers), and the coordinator
// refusing bad files at start. The .pt files are written by Debian's
// python3-torch (tests/support/make_torchscript_models.py); without it the
// tests skip and say so.
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/worker/core/torchscript_model.h"
#include "services/worker/core/trainer.h"
#include "tests/support/test_support.h"

#ifndef SHOAL_SOURCE_DIR
#error "SHOAL_SOURCE_DIR must be defined"
#endif

namespace shoal::worker {
namespace {

// Written once for the whole suite; empty when python3-torch is missing.
class TorchScriptTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
      skip_ = "python3-torch (Debian) is not installed: scripts/install-deps.sh installs it";
      return;
    }
    const std::string cmd =
        absl::StrCat("/usr/bin/python3 ", SHOAL_SOURCE_DIR,
                     "/tests/support/make_torchscript_models.py ", dir_->path(), " 2>&1");
    generated_ = std::system(cmd.c_str()) == 0;  // a failure, not a skip
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(generated_) << "make_torchscript_models.py failed";
  }
  static std::string File(const std::string& name) {
    absl::StatusOr<std::string> bytes = ReadModelFile(dir_->path() + "/" + name);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : "";
  }
  static testing::TempDir* dir_;
  static std::string skip_;
  static bool generated_;
};
testing::TempDir* TorchScriptTest::dir_ = nullptr;
std::string TorchScriptTest::skip_;
bool TorchScriptTest::generated_ = false;

const std::vector<int64_t> kImage = {1, 28, 28};

TEST_F(TorchScriptTest, AcceptsTheExampleCnnWithBatchNorm) {
  auto summary = CheckTorchScriptModel(File("good.pt"), kImage, "good.pt");
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->parameter_tensors, 10u);  // conv1, bn1, conv2, bn2, fc: weight + bias
  EXPECT_EQ(summary->float_buffers, 4u);       // running_mean / running_var of bn1, bn2
  EXPECT_EQ(summary->integer_buffers, 2u);     // num_batches_tracked
  EXPECT_EQ(summary->output_shape, (std::vector<int64_t>{kCheckBatch, 10}));
}

TEST_F(TorchScriptTest, EachBadFileFailsWithItsOwnMessage) {
  auto text = CheckTorchScriptModel(File("text.pt"), kImage, "text.pt");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(text.status().message(), "text.pt is not a TorchScript module"))
      << text.status();
  auto empty = CheckTorchScriptModel("", kImage, "empty.pt");
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "is not a TorchScript module"))
      << empty.status();
  auto none = CheckTorchScriptModel(File("noparams.pt"), kImage, "noparams.pt");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "has no trainable parameters"))
      << none.status();
  auto shape = CheckTorchScriptModel(File("wrongshape.pt"), kImage, "wrongshape.pt");
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(shape.status().message(),
                                "its forward does not take an image batch [2, 1, 28, 28]"))
      << shape.status();
  // The good model with images of another shape fails the same way.
  auto other = CheckTorchScriptModel(File("good.pt"), {3, 32, 32}, "good.pt");
  EXPECT_TRUE(absl::StrContains(other.status().message(), "[2, 3, 32, 32]")) << other.status();
}

ImageSet Synthetic(uint32_t count, uint32_t seed) {
  ImageSet set;
  set.count = count;
  set.rows = 28;
  set.cols = 28;
  set.pixels.resize(size_t{count} * 28 * 28);
  set.labels.resize(count);
  std::mt19937 rng(seed);
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t label = static_cast<uint8_t>(rng() % 10);
    set.labels[i] = label;
    uint8_t* img = set.pixels.data() + size_t{i} * 28 * 28;
    for (int p = 0; p < 28 * 28; ++p) img[p] = static_cast<uint8_t>(rng() % 60);
    for (int r = 2 + 2 * label; r < 4 + 2 * label; ++r) {
      for (int c = 4; c < 24; ++c) img[r * 28 + c] = 255;
    }
  }
  return set;
}

TrainerOptions Options(const std::string& file, const std::string& optimizer) {
  TrainerOptions o;
  o.config.mutable_model()->set_name("torchscript");
  o.config.mutable_training()->set_optimizer(optimizer);
  o.config.mutable_training()->set_learning_rate(optimizer == "sgd" ? 0.05 : 0.002);
  o.config.mutable_training()->set_momentum(0.9);
  o.config.mutable_training()->set_batch_size(32);
  o.config.mutable_training()->set_seed(1);
  o.config.mutable_training()->set_data_shards(1);
  for (uint32_t d : {1, 28, 28}) o.config.mutable_model()->add_input_shape(d);
  o.model_file = file;
  return o;
}

TEST_F(TorchScriptTest, TrainerKeepsParametersAndBatchNormStatisticsInTheFlatBuffer) {
  FashionMnist data;
  data.train = Synthetic(256, 1);
  data.test = Synthetic(64, 2);
  const std::string file = File("good.pt");
  for (const std::string optimizer : {"sgd", "adam", "adamw"}) {
    SCOPED_TRACE(optimizer);
    auto a = Trainer::Create(Options(file, optimizer), &data);
    auto b = Trainer::Create(Options(file, optimizer), &data);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    Trainer& t = **a;
    std::map<std::string, LayerInfo> by_name;
    for (const LayerInfo& l : t.layers()) by_name[l.name] = l;
    // The module's own state_dict names: load_state_dict needs no renaming.
    for (const char* name :
         {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean",
          "bn1.running_var", "bn1.num_batches_tracked", "conv2.weight", "bn2.running_var",
          "bn2.num_batches_tracked", "fc.weight", "fc.bias"}) {
      EXPECT_TRUE(by_name.count(name)) << name;
    }
    EXPECT_EQ(by_name.size(), 16u);
    EXPECT_TRUE(by_name["bn1.num_batches_tracked"].shape.empty());
    const LayerInfo mean = by_name["bn1.running_mean"];
    const LayerInfo tracked = by_name["bn1.num_batches_tracked"];
    EXPECT_EQ(t.parameters()[mean.offset], 0.0f);
    EXPECT_EQ(t.parameters()[tracked.offset], 0.0f);
    // The same file: the same initial model, bit for bit.
    EXPECT_EQ(HashParameters(t.parameters(), t.num_elements()),
              HashParameters((*b)->parameters(), (*b)->num_elements()));
    const shoal::v1::Metrics before = t.Evaluate();
    double first = t.TrainSteps(5);
    double last = 0;
    for (int i = 0; i < 6; ++i) last = t.TrainSteps(5);
    EXPECT_LT(last, first);
    // Training updated the statistics in the flat buffer (what is averaged).
    EXPECT_NE(t.parameters()[mean.offset], 0.0f);
    EXPECT_EQ(t.parameters()[tracked.offset], 35.0f);
    // A value written into the buffer (an average) is what the module uses.
    t.parameters()[tracked.offset] = 100.0f;
    t.TrainSteps(1);
    EXPECT_EQ(t.parameters()[tracked.offset], 101.0f);
    const shoal::v1::Metrics after = t.Evaluate();
    EXPECT_GT(after.test_accuracy(), before.test_accuracy());
  }
}

TEST_F(TorchScriptTest, TrainerRefusesADatasetOfAnotherShapeAndUnknownOptimizers) {
  FashionMnist data;
  data.train = Synthetic(64, 1);
  data.test = Synthetic(16, 2);
  TrainerOptions o = Options(File("good.pt"), "sgd");
  o.config.mutable_model()->clear_input_shape();
  for (uint32_t d : {3, 32, 32}) o.config.mutable_model()->add_input_shape(d);
  auto shape = Trainer::Create(o, &data);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(shape.status().message(), "[3, 32, 32]")) << shape.status();
  auto opt = Trainer::Create(Options(File("good.pt"), "lbfgs"), &data);
  EXPECT_TRUE(absl::StrContains(opt.status().message(), "unknown optimizer 'lbfgs'"))
      << opt.status();
}

TEST_F(TorchScriptTest, CoordinatorRefusesBadFilesAtStart) {
  const std::map<std::string, std::string> expected = {
      {"text.pt", "is not a TorchScript module"},
      {"noparams.pt", "has no trainable parameters"},
      {"wrongshape.pt", "its forward does not take an image batch"},
      {"missing.pt", "cannot open model file"},
  };
  for (const auto& [name, message] : expected) {
    SCOPED_TRACE(name);
    auto p =
        testing::Process::Start({testing::BinDir() + "/shoal-coordinator", "--listen=127.0.0.1:0",
                                 "--model=torchscript:" + dir_->path() + "/" + name},
                                dir_->path() + "/coordinator-" + name + ".log");
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->Wait(absl::Seconds(120)), 2) << p->Log();
    EXPECT_TRUE(absl::StrContains(p->Log(), message)) << p->Log();
    EXPECT_FALSE(absl::StrContains(p->Log(), "listening on")) << p->Log();
  }
}

}  // namespace
}  // namespace shoal::worker
