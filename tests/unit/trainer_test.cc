// Unit tests of the Torch trainer on a small synthetic, learnable data set
// (no Fashion-MNIST needed): deterministic initialisation, the flat
// parameter buffer, layers, data shards and that training learns.
#include "services/worker/core/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "services/worker/core/data_split.h"

namespace shoal::worker {
namespace {

// 28x28 images of noise with one bright horizontal bar; the label is which
// of 10 bands holds the bar. Learnable by both models in a few dozen steps.
ImageSet SyntheticSet(uint32_t count, uint32_t seed) {
  ImageSet set;
  set.count = count;
  set.rows = 28;
  set.cols = 28;
  set.pixels.resize(size_t{count} * 28 * 28);
  set.labels.resize(count);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(0, 60);
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t label = static_cast<uint8_t>(rng() % 10);
    set.labels[i] = label;
    uint8_t* img = set.pixels.data() + size_t{i} * 28 * 28;
    for (int p = 0; p < 28 * 28; ++p) img[p] = static_cast<uint8_t>(noise(rng));
    // Band `label` covers rows [2 + 2*label, 4 + 2*label).
    for (int r = 2 + 2 * label; r < 4 + 2 * label; ++r) {
      for (int c = 4; c < 24; ++c) img[r * 28 + c] = 255;
    }
  }
  return set;
}

FashionMnist SyntheticData(uint32_t train = 256, uint32_t test = 64) {
  FashionMnist d;
  d.train = SyntheticSet(train, 1);
  d.test = SyntheticSet(test, 2);
  return d;
}

TrainerOptions Options(const std::string& model, uint64_t seed = 42, uint32_t data_rank = 0,
                       uint32_t data_shards = 1) {
  TrainerOptions o;
  o.config.mutable_model()->set_name(model);
  o.config.mutable_training()->set_learning_rate(0.05);
  o.config.mutable_training()->set_momentum(0.9);
  o.config.mutable_training()->set_batch_size(32);
  o.config.mutable_training()->set_seed(seed);
  o.config.mutable_training()->set_data_shards(data_shards);
  o.data_rank = data_rank;
  o.threads = 1;
  return o;
}

std::unique_ptr<Trainer> MustCreate(const TrainerOptions& options, const FashionMnist* data) {
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(options, data);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::string Hash(Trainer& t) { return HashParameters(t.parameters(), t.num_elements()); }

class TrainerModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  FashionMnist data_ = SyntheticData();
};

TEST_P(TrainerModelTest, SameSeedGivesIdenticalParameters) {
  auto a = MustCreate(Options(GetParam(), 42), &data_);
  auto b = MustCreate(Options(GetParam(), 42), &data_);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->num_elements(), b->num_elements());
  EXPECT_EQ(Hash(*a), Hash(*b));
  EXPECT_EQ(std::memcmp(a->parameters(), b->parameters(), a->num_elements() * sizeof(float)), 0);
  // The data rank changes the data order, not the initial model.
  auto c = MustCreate(Options(GetParam(), 42, /*data_rank=*/1, /*data_shards=*/2), &data_);
  ASSERT_TRUE(c);
  EXPECT_EQ(Hash(*a), Hash(*c));
}

TEST_P(TrainerModelTest, DifferentSeedsGiveDifferentParameters) {
  auto a = MustCreate(Options(GetParam(), 42), &data_);
  auto b = MustCreate(Options(GetParam(), 43), &data_);
  ASSERT_TRUE(a && b);
  EXPECT_NE(Hash(*a), Hash(*b));
}

TEST_P(TrainerModelTest, SameSeedTrainsIdentically) {
  auto a = MustCreate(Options(GetParam(), 7), &data_);
  auto b = MustCreate(Options(GetParam(), 7), &data_);
  ASSERT_TRUE(a && b);
  const double la = a->TrainSteps(3);
  const double lb = b->TrainSteps(3);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(Hash(*a), Hash(*b));
}

TEST_P(TrainerModelTest, LayersCoverTheFlatBufferContiguously) {
  auto t = MustCreate(Options(GetParam()), &data_);
  ASSERT_TRUE(t);
  const auto& layers = t->layers();
  ASSERT_FALSE(layers.empty());
  uint64_t next = 0;
  for (const LayerInfo& l : layers) {
    EXPECT_EQ(l.offset, next) << l.name;
    int64_t product = 1;
    for (int64_t d : l.shape) product *= d;
    EXPECT_EQ(static_cast<uint64_t>(product), l.elements) << l.name;
    EXPECT_GT(l.elements, 0u) << l.name;
    next = l.offset + l.elements;
  }
  EXPECT_EQ(next, t->num_elements());
}

TEST_P(TrainerModelTest, ParametersAreTheLiveModel) {
  auto t = MustCreate(Options(GetParam()), &data_);
  ASSERT_TRUE(t);
  const shoal::v1::Metrics before = t->Evaluate();
  const std::string hash_before = Hash(*t);
  // All-zero weights: every logit is 0, the loss is exactly ln(10).
  std::fill(t->parameters(), t->parameters() + t->num_elements(), 0.0f);
  EXPECT_NE(Hash(*t), hash_before);
  const shoal::v1::Metrics zeros = t->Evaluate();
  EXPECT_NEAR(zeros.test_loss(), std::log(10.0), 1e-5);
  EXPECT_NE(zeros.test_loss(), before.test_loss());
  // Training moves the same memory: the buffer no longer holds zeros.
  t->TrainSteps(1);
  bool nonzero = false;
  for (uint64_t i = 0; i < t->num_elements() && !nonzero; ++i) nonzero = t->parameters()[i] != 0;
  EXPECT_TRUE(nonzero);
}

TEST_P(TrainerModelTest, EvaluatingOtherParametersLeavesTheModelAlone) {
  auto t = MustCreate(Options(GetParam(), 5), &data_);
  auto untouched = MustCreate(Options(GetParam(), 5), &data_);
  ASSERT_TRUE(t && untouched);
  t->TrainSteps(3);
  untouched->TrainSteps(3);
  const std::string hash = Hash(*t);
  const shoal::v1::Metrics live = t->Evaluate();
  // The same parameters, evaluated on the second instance: the same figures.
  const std::vector<float> copy(t->parameters(), t->parameters() + t->num_elements());
  absl::StatusOr<shoal::v1::Metrics> same = t->EvaluateParams(copy.data());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->test_accuracy(), live.test_accuracy());
  EXPECT_EQ(same->test_loss(), live.test_loss());
  // Other parameters: their own figures, and the live model is not touched.
  const std::vector<float> zeros(t->num_elements(), 0.0f);
  absl::StatusOr<shoal::v1::Metrics> zero = t->EvaluateParams(zeros.data());
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_NEAR(zero->test_loss(), std::log(10.0), 1e-5);
  EXPECT_EQ(Hash(*t), hash);
  EXPECT_EQ(t->Evaluate().test_loss(), live.test_loss());
  // Training goes on exactly as without the evaluations.
  t->TrainSteps(3);
  untouched->TrainSteps(3);
  EXPECT_EQ(Hash(*t), Hash(*untouched));
}

TEST_P(TrainerModelTest, TrainingReducesTheLoss) {
  auto t = MustCreate(Options(GetParam()), &data_);
  ASSERT_TRUE(t);
  const shoal::v1::Metrics before = t->Evaluate();
  const double first = t->TrainSteps(5);
  t->TrainSteps(30);
  const double last = t->TrainSteps(5);
  const shoal::v1::Metrics after = t->Evaluate();
  EXPECT_LT(last, first * 0.7) << "first " << first << ", last " << last;
  EXPECT_LT(after.test_loss(), before.test_loss());
  EXPECT_GT(after.test_accuracy(), 0.5) << "before: " << before.test_accuracy();
  EXPECT_TRUE(after.evaluated());
}

INSTANTIATE_TEST_SUITE_P(Models, TrainerModelTest, ::testing::Values("mlp", "cnn"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// An audited run (RunConfig.trust.audit_rate, docs/SECURITY.md): another
// member's replay of a round from its base reproduces the trained model
// bit for bit, on a trainer that has trained other rounds of its own.
TEST_P(TrainerModelTest, AReplayReproducesTheAuditedRoundBitForBit) {
  TrainerOptions o = Options(GetParam());
  o.config.mutable_sync();
  o.config.mutable_training()->set_sample_ledger(true);
  o.config.mutable_training()->set_local_steps(3);
  o.config.mutable_trust()->set_audit_rate(0.5);
  o.config.mutable_trust()->set_audit_threads(1);
  std::unique_ptr<Trainer> participant = MustCreate(o, &data_);
  std::unique_ptr<Trainer> auditor = MustCreate(o, &data_);
  ASSERT_NE(participant, nullptr);
  ASSERT_NE(auditor, nullptr);
  shoal::v1::SampleRange mine, theirs;
  mine.set_epoch(0);
  mine.set_begin(0);
  mine.set_count(96);
  theirs.set_epoch(0);
  theirs.set_begin(96);
  theirs.set_count(96);
  // Round 1 on both (momentum state builds up); round 2's base is kept.
  for (Trainer* t : {participant.get(), auditor.get()}) {
    t->SetRound(1);
    ASSERT_TRUE(t->SetSamples({mine}).ok());
    t->TrainSteps(3);
  }
  std::vector<float> base(participant->parameters(),
                          participant->parameters() + participant->num_elements());
  std::copy(base.begin(), base.end(), auditor->parameters());
  participant->SetRound(2);
  ASSERT_TRUE(participant->SetSamples({theirs}).ok());
  participant->TrainSteps(3);
  const std::string trained = Hash(*participant);
  // The auditor trains a round of its own first.
  auditor->SetRound(2);
  ASSERT_TRUE(auditor->SetSamples({mine}).ok());
  auditor->TrainSteps(3);
  const std::string own = Hash(*auditor);
  absl::StatusOr<std::string> replayed = auditor->Replay(base.data(), {theirs}, 2);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(*replayed, trained);
  EXPECT_EQ(Hash(*auditor), own);  // its own model untouched
  // Other samples or another round's seed give another model.
  absl::StatusOr<std::string> other = auditor->Replay(base.data(), {mine}, 2);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, trained);
}

TEST(TrainerTest, ReplayNeedsAnAuditedRun) {
  FashionMnist data = SyntheticData();
  std::unique_ptr<Trainer> t = MustCreate(Options("mlp"), &data);
  std::vector<float> base(t->parameters(), t->parameters() + t->num_elements());
  EXPECT_EQ(t->Replay(base.data(), {}, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TrainerTest, MlpLayers) {
  const FashionMnist data = SyntheticData();
  auto t = MustCreate(Options("mlp"), &data);
  ASSERT_TRUE(t);
  const auto& layers = t->layers();
  ASSERT_EQ(layers.size(), 6u);
  const std::vector<std::string> names = {"fc1.weight", "fc1.bias",   "fc2.weight",
                                          "fc2.bias",   "fc3.weight", "fc3.bias"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(layers[i].name, names[i]);
  EXPECT_EQ(layers[0].shape, (std::vector<int64_t>{256, 784}));
  EXPECT_EQ(layers[1].shape, (std::vector<int64_t>{256}));
  EXPECT_EQ(layers[4].shape, (std::vector<int64_t>{10, 128}));
  EXPECT_EQ(t->num_elements(), 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
}

TEST(TrainerTest, CnnLayers) {
  const FashionMnist data = SyntheticData();
  auto t = MustCreate(Options("cnn"), &data);
  ASSERT_TRUE(t);
  const auto& layers = t->layers();
  ASSERT_EQ(layers.size(), 8u);
  const std::vector<std::string> names = {"conv1.weight", "conv1.bias", "conv2.weight",
                                          "conv2.bias",   "fc1.weight", "fc1.bias",
                                          "fc2.weight",   "fc2.bias"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(layers[i].name, names[i]);
  EXPECT_EQ(layers[0].shape, (std::vector<int64_t>{16, 1, 5, 5}));
  EXPECT_EQ(layers[2].shape, (std::vector<int64_t>{32, 16, 5, 5}));
  EXPECT_EQ(layers[4].shape, (std::vector<int64_t>{128, 32 * 7 * 7}));
  EXPECT_EQ(t->num_elements(),
            16u * 25 + 16 + 32 * 16 * 25 + 32 + 32 * 7 * 7 * 128 + 128 + 128 * 10 + 10);
}

TEST(TrainerTest, UnknownModelIsInvalidArgument) {
  const FashionMnist data = SyntheticData(16, 4);
  for (const char* model : {"resnet", "", "MLP"}) {
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(Options(model), &data);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << model;
  }
}

TEST(TrainerTest, DisjointShardsCoverTheTrainingSet) {
  const FashionMnist data = SyntheticData(257, 8);
  auto a = MustCreate(Options("mlp", 1, /*data_rank=*/0, /*data_shards=*/2), &data);
  auto b = MustCreate(Options("mlp", 1, /*data_rank=*/1, /*data_shards=*/2), &data);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->shard_size() + b->shard_size(), 257u);
  EXPECT_EQ(a->shard_size(), 129u);
  EXPECT_EQ(b->shard_size(), 128u);
  // data_rank wraps around the number of shards.
  auto c = MustCreate(Options("mlp", 1, /*data_rank=*/3, /*data_shards=*/2), &data);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->shard_size(), 128u);
  // One shard (or 0, treated as 1): the whole set.
  auto d = MustCreate(Options("mlp", 1, 0, 1), &data);
  auto e = MustCreate(Options("mlp", 1, 5, 0), &data);
  ASSERT_TRUE(d && e);
  EXPECT_EQ(d->shard_size(), 257u);
  EXPECT_EQ(e->shard_size(), 257u);
}

// --data_split=label_skew:ALPHA: the trainer takes its part of the split
// data_split.h computes (tested there); the parts still cover the set, their
// label counts are what the worker logs, and a bad alpha fails the start.
TEST(TrainerTest, LabelSkewShardsCoverTheTrainingSet) {
  const FashionMnist data = SyntheticData(257, 8);
  size_t total = 0;
  std::vector<uint64_t> per_label;
  for (uint32_t rank = 0; rank < 3; ++rank) {
    TrainerOptions o = Options("mlp", 1, rank, /*data_shards=*/3);
    o.config.mutable_training()->set_data_split("label_skew:0.3");
    auto t = MustCreate(o, &data);
    ASSERT_TRUE(t);
    total += t->shard_size();
    uint64_t counted = 0;
    for (size_t l = 0; l < t->shard_label_counts().size(); ++l) {
      if (per_label.size() <= l) per_label.resize(l + 1, 0);
      per_label[l] += t->shard_label_counts()[l];
      counted += t->shard_label_counts()[l];
    }
    EXPECT_EQ(counted, t->shard_size());
  }
  EXPECT_EQ(total, 257u);
  EXPECT_EQ(per_label, LabelCounts(data.train.labels, IidShardRows(257, 1, 0)));
  TrainerOptions bad = Options("mlp", 1, 0, 3);
  bad.config.mutable_training()->set_data_split("label_skew:-1");
  EXPECT_EQ(Trainer::Create(bad, &data).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrainerTest, EvalLimitAndHash) {
  const FashionMnist data = SyntheticData(64, 40);
  TrainerOptions o = Options("mlp");
  o.eval_limit = 10;
  auto t = MustCreate(o, &data);
  ASSERT_TRUE(t);
  const shoal::v1::Metrics m = t->Evaluate();
  // 10 images: the accuracy is a multiple of 1/10.
  EXPECT_NEAR(m.test_accuracy() * 10, std::round(m.test_accuracy() * 10), 1e-9);
  // SHA-256 of zero bytes.
  EXPECT_EQ(HashParameters(nullptr, 0),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hash(*t).size(), 64u);
}

}  // namespace
}  // namespace shoal::worker
