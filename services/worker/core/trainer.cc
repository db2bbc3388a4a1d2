#include "services/worker/core/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/model_layout.h"
#include "common/run_options.h"
#include "common/sha256.h"
#include "common/status_util.h"
#include "services/worker/core/data_split.h"
#include "services/worker/core/sample_order.h"
#include "services/worker/core/torchscript_module.h"

namespace shoal::worker {
namespace {

// Fashion-MNIST pixel mean and standard deviation (over the training set).
constexpr float kMean = 0.2860f;
constexpr float kStd = 0.3530f;

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 128))),
        fc3(register_module("fc3", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x.view({x.size(0), 784});
    x = torch::relu(fc1->forward(x));
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }
  torch::nn::Linear fc1, fc2, fc3;
};

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module("conv1",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).padding(2)))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    x = torch::relu(fc1->forward(x.view({x.size(0), 32 * 7 * 7})));
    return fc2->forward(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};

torch::Tensor ToTensor(const ImageSet& set, const std::vector<int64_t>& rows) {
  const int64_t pixels = int64_t{set.rows} * set.cols;
  torch::Tensor out = torch::empty({static_cast<int64_t>(rows.size()), 1, set.rows, set.cols});
  float* dst = out.data_ptr<float>();
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint8_t* src = set.pixels.data() + rows[i] * pixels;
    for (int64_t p = 0; p < pixels; ++p) dst[i * pixels + p] = (src[p] / 255.0f - kMean) / kStd;
  }
  return out;
}

torch::Tensor Labels(const ImageSet& set, const std::vector<int64_t>& rows) {
  torch::Tensor out = torch::empty({static_cast<int64_t>(rows.size())}, torch::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  for (size_t i = 0; i < rows.size(); ++i) dst[i] = set.labels[rows[i]];
  return out;
}

}  // namespace

// The built-in trainer (Trainer::Create).
class BuiltinTrainer final : public Trainer {
 public:
  struct Impl;
  explicit BuiltinTrainer(std::unique_ptr<Impl> impl);
  ~BuiltinTrainer() override;

  double TrainSteps(uint32_t steps) override;
  void SetRound(uint64_t round) override;
  absl::StatusOr<std::string> Replay(const float* base,
                                     absl::Span<const shoal::v1::SampleRange> samples,
                                     uint64_t round) override;
  absl::Status SetSamples(absl::Span<const shoal::v1::SampleRange> ranges) override;
  uint64_t train_samples() const override;
  shoal::v1::Metrics Evaluate() override;
  absl::StatusOr<shoal::v1::Metrics> EvaluateParams(const float* params) override;
  std::vector<Prediction> Predict(int64_t n) override;
  float* parameters() override;
  uint64_t num_elements() const override;
  const std::vector<LayerInfo>& layers() const override;
  size_t shard_size() const override;
  const std::vector<uint64_t>& shard_label_counts() const override;

 private:
  std::unique_ptr<Impl> impl_;
};

// An integer buffer of a TorchScript module mirrored as float32 elements of
// the flat buffer.
struct MirroredBuffer {
  torch::Tensor tensor;
  int64_t offset = 0;
};

namespace {

// One instance of the run's model with its flat buffer: the trainer's, and
// (lazily) a second one that evaluates other parameters (EvaluateParams)
// without touching the trained ones.
struct ModelInstance {
  std::shared_ptr<torch::nn::Module> module;  // mlp, cnn
  std::optional<torch::jit::Module> script;   // torchscript
  std::function<torch::Tensor(torch::Tensor)> forward;
  std::function<void(bool)> set_training;
  torch::Tensor flat;
  std::vector<LayerInfo> layers;
  std::vector<MirroredBuffer> mirrored;
  std::vector<torch::Tensor> trainable;
};

// The dtype as Python names it (str(tensor.dtype) without "torch.").
std::string DtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return "float32";
    case torch::kFloat64:
      return "float64";
    case torch::kFloat16:
      return "float16";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kInt64:
      return "int64";
    case torch::kInt32:
      return "int32";
    case torch::kInt16:
      return "int16";
    case torch::kInt8:
      return "int8";
    case torch::kUInt8:
      return "uint8";
    case torch::kBool:
      return "bool";
    default:
      return c10::toString(t);
  }
}

// Builds the model and moves every parameter and float buffer into one
// flat buffer (each becomes a view of it); integer buffers get float32
// mirrors at the end. Initialised from torch's generator as it stands.
absl::Status BuildInstance(const TrainerOptions& options, const std::vector<int64_t>& input_shape,
                           ModelInstance* out) {
  const auto& config = options.config;
  // (name, tensor) of everything the flat buffer holds, in order; trainable
  // ones first.
  std::vector<std::pair<std::string, torch::Tensor>> params, float_buffers, int_buffers;
  if (config.model().name() == "mlp" || config.model().name() == "cnn") {
    if (config.model().name() == "mlp") {
      auto m = std::make_shared<MlpImpl>();
      out->forward = [m](torch::Tensor x) { return m->forward(x); };
      out->module = m;
    } else {
      auto m = std::make_shared<CnnImpl>();
      out->forward = [m](torch::Tensor x) { return m->forward(x); };
      out->module = m;
    }
    torch::nn::Module* m = out->module.get();
    out->set_training = [m](bool on) { m->train(on); };
    for (const auto& item : out->module->named_parameters()) {
      params.emplace_back(item.key(), item.value());
    }
  } else if (config.model().name() == "torchscript") {
    TorchScriptSummary summary;
    absl::StatusOr<torch::jit::Module> script = LoadTorchScriptModule(
        options.model_file, input_shape, "the run's TorchScript model", &summary);
    if (!script.ok()) return script.status();
    out->script = std::move(*script);
    torch::jit::Module* m = &*out->script;
    out->forward = [m](torch::Tensor x) { return m->forward({x}).toTensor(); };
    out->set_training = [m](bool on) { m->train(on); };
    for (const auto& p : m->named_parameters(/*recurse=*/true)) {
      if (p.value.requires_grad()) params.emplace_back(p.name, p.value);
    }
    // Frozen parameters travel like buffers (averaged, never stepped).
    for (const auto& p : m->named_parameters(/*recurse=*/true)) {
      if (!p.value.requires_grad()) float_buffers.emplace_back(p.name, p.value);
    }
    for (const auto& b : m->named_buffers(/*recurse=*/true)) {
      if (b.value.scalar_type() == torch::kFloat32) {
        float_buffers.emplace_back(b.name, b.value);
      } else {
        int_buffers.emplace_back(b.name, b.value);
      }
    }
  } else if (config.model().name() == "module") {
    return absl::InvalidArgumentError(
        "this run trains the model its Python workers declare (--model=module, "
        "docs/PYTHON.md); shoal-worker builds mlp, cnn or torchscript models");
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown model '", config.model().name(), "'"));
  }

  int64_t total = 0;
  for (const auto* list : {&params, &float_buffers, &int_buffers}) {
    for (const auto& [name, t] : *list) total += t.numel();
  }
  out->flat = torch::empty({total}, torch::kFloat32);
  int64_t offset = 0;
  for (const auto* list : {&params, &float_buffers, &int_buffers}) {
    const bool mirror = list == &int_buffers;
    for (const auto& [name, t] : *list) {
      torch::Tensor p = t;
      const int64_t n = p.numel();
      torch::Tensor view = out->flat.narrow(0, offset, n);
      torch::NoGradGuard no_grad;
      view.copy_(p.detach().reshape({n}).to(torch::kFloat32));
      if (mirror) {
        out->mirrored.push_back({p, offset});
      } else {
        p.set_data(view.view(p.sizes()));
      }
      LayerInfo layer{name, p.sizes().vec(), static_cast<uint64_t>(offset),
                      static_cast<uint64_t>(n)};
      if (mirror) layer.dtype = DtypeName(p.scalar_type());
      out->layers.push_back(std::move(layer));
      offset += n;
    }
  }
  for (const auto& [name, t] : params) out->trainable.push_back(t);
  return absl::OkStatus();
}

// The mirrored integer buffers take the flat buffer's values (rounded).
void CopyInMirrored(ModelInstance& m) {
  for (MirroredBuffer& b : m.mirrored) {
    torch::Tensor v = m.flat.narrow(0, b.offset, b.tensor.numel()).round();
    b.tensor.copy_(v.view(b.tensor.sizes()));
  }
}

}  // namespace

namespace {

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(
    const shoal::v1::TrainingConfig& t, const std::vector<torch::Tensor>& trainable) {
  const std::string& opt = t.optimizer();
  if (opt.empty() || opt == "sgd") {
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::SGD>(
        trainable, torch::optim::SGDOptions(t.learning_rate()).momentum(t.momentum())));
  }
  if (opt == "adam") {
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::Adam>(
        trainable, torch::optim::AdamOptions(t.learning_rate())));
  }
  if (opt == "adamw") {
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::AdamW>(
        trainable, torch::optim::AdamWOptions(t.learning_rate())));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", opt, "' (sgd, adam or adamw)"));
}

// The local steps of one round on `m`: a batch of rows per step from
// `next` (an undefined tensor: no more samples), the mirrored buffers in
// from the flat buffer first and out after. The trained round and an
// audit's replay of it run this same code.
double RunSteps(ModelInstance& m, torch::optim::Optimizer& optimizer, const torch::Tensor& train_x,
                const torch::Tensor& train_y, uint32_t steps, const CancellationToken* stop,
                const std::function<torch::Tensor()>& next) {
  m.set_training(true);
  float* flat = m.flat.data_ptr<float>();
  CopyInMirrored(m);  // the averaged values, rounded
  double loss_sum = 0;
  uint32_t done = 0;
  for (uint32_t step = 0; step < steps; ++step) {
    if (stop != nullptr && stop->cancelled()) break;  // shutting down
    torch::Tensor idx = next();
    if (!idx.defined()) break;
    torch::Tensor x = train_x.index_select(0, idx);
    torch::Tensor y = train_y.index_select(0, idx);
    optimizer.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(m.forward(x), y);
    loss.backward();
    optimizer.step();
    loss_sum += loss.item<double>();
    ++done;
  }
  for (MirroredBuffer& b : m.mirrored) {
    torch::Tensor v = b.tensor.reshape({b.tensor.numel()}).to(torch::kFloat32);
    std::copy_n(v.data_ptr<float>(), v.numel(), flat + b.offset);
  }
  return done == 0 ? 0 : loss_sum / done;
}

// Torch's generator seed for an audited round (the same on the participant
// and on its auditor).
uint64_t RoundSeed(uint64_t run_seed, uint64_t round) {
  return run_seed * 0x9E3779B97F4A7C15ULL + round * 0xBF58476D1CE4E5B9ULL + 1;
}

// Builds a second instance of the model without moving torch's generator
// (what training draws stays as it would have been without it).
absl::Status BuildSideInstance(const TrainerOptions& options, const std::vector<int64_t>& shape,
                               ModelInstance* out) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
  }
  absl::Status built = BuildInstance(options, shape, out);
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved);
  }
  return built;
}

}  // namespace

struct BuiltinTrainer::Impl {
  TrainerOptions options;
  std::vector<int64_t> input_shape;
  ModelInstance model;
  // EvaluateParams' instance, built at its first call.
  std::unique_ptr<ModelInstance> eval;
  // Replay's instance (audits), built at its first call.
  std::unique_ptr<ModelInstance> replay;
  // RunConfig.trust.audit_rate > 0: every round trains with a fresh
  // optimizer and a generator seeded from the round, so that another
  // member can replay it.
  bool audited = false;
  std::vector<uint64_t> shard_label_counts;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  torch::Tensor train_x, train_y, test_x, test_y;
  std::vector<int64_t> order;
  size_t cursor = 0;
  std::mt19937_64 rng;
  // The sample ledger: the whole training set is train_x, and each round
  // trains the rows SetSamples named (ledger_cursor: the next one).
  std::optional<SampleOrder> ledger;
  std::vector<int64_t> ledger_rows;
  size_t ledger_cursor = 0;
};

BuiltinTrainer::BuiltinTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BuiltinTrainer::~BuiltinTrainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options,
                                                         const FashionMnist* data) {
  auto impl = std::make_unique<BuiltinTrainer::Impl>();
  impl->options = options;
  const auto& config = options.config;
  impl->audited = config.trust().audit_rate() > 0 && config.has_sync();
  // An audited run fixes the threads: a replay must reduce in the same order.
  torch::set_num_threads(impl->audited ? std::max<int>(1, config.trust().audit_threads())
                                       : std::max(1, options.threads));
  if (impl->audited) {
    SHOAL_LOG(INFO) << "audited run: training and replays use " << torch::get_num_threads()
                    << " torch thread(s) (the run's --audit_threads), a fresh optimizer each "
                       "round";
  }
  impl->input_shape = {1, data->train.rows, data->train.cols};
  if (config.model().name() == "mlp" || config.model().name() == "cnn") {
    if (data->train.rows != 28 || data->train.cols != 28) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the built-in models take 28 x 28 images, the dataset has ", data->train.rows, " x ",
          data->train.cols, "; bring a model for them with --model=torchscript:PATH"));
    }
    for (const ImageSet* set : {&data->train, &data->test}) {
      for (uint8_t l : set->labels) {
        if (l > 9) {
          return absl::InvalidArgumentError(
              absl::StrCat("the built-in models have 10 classes, the dataset has label ", int{l},
                           "; bring a model for it with --model=torchscript:PATH"));
        }
      }
    }
  } else if (config.model().name() == "torchscript" && config.model().input_shape_size() > 0) {
    std::vector<int64_t> want(config.model().input_shape().begin(),
                              config.model().input_shape().end());
    if (want != impl->input_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the run's model takes images of shape [", absl::StrJoin(want, ", "),
          "] but this worker's dataset has [", absl::StrJoin(impl->input_shape, ", "), "]"));
    }
  }
  // Same seed, same module construction order: identical initial models on
  // every worker of the run, with no transfer.
  torch::manual_seed(config.training().seed());
  RETURN_IF_ERROR(BuildInstance(options, impl->input_shape, &impl->model));
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
      MakeOptimizer(config.training(), impl->model.trainable);
  if (!optimizer.ok()) return optimizer.status();
  impl->optimizer = *std::move(optimizer);
  if (config.model().name() == "torchscript") {
    int64_t max_label = 0;
    for (const ImageSet* set : {&data->train, &data->test}) {
      for (uint8_t l : set->labels) max_label = std::max<int64_t>(max_label, l);
    }
    torch::NoGradGuard no_grad;
    impl->model.set_training(false);
    const int64_t classes =
        impl->model.forward(torch::zeros({1, 1, data->train.rows, data->train.cols})).size(1);
    if (max_label >= classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the run's model returns ", classes, " logits but the dataset has label ", max_label));
    }
  }

  // This worker's disjoint shard (data_split.h): every data_shards-th image
  // (iid) or its part of the run's Dirichlet label-skew split.
  absl::StatusOr<DataSplit> split = ParseDataSplit(config.training().data_split());
  if (!split.ok()) return split.status();
  const uint32_t shards = std::max<uint32_t>(1, config.training().data_shards());
  std::vector<int64_t> rows;
  if (config.training().sample_ledger()) {
    // The coordinator names every round's samples from the whole set.
    rows.resize(data->train.count);
    std::iota(rows.begin(), rows.end(), 0);
    impl->ledger.emplace(config.training().seed(), static_cast<int64_t>(rows.size()));
  } else {
    absl::StatusOr<std::vector<int64_t>> shard_rows = ShardRows(
        *split, data->train.labels, shards, options.data_rank % shards, config.training().seed());
    if (!shard_rows.ok()) return shard_rows.status();
    rows = std::move(*shard_rows);
  }
  impl->shard_label_counts = LabelCounts(data->train.labels, rows);
  impl->train_x = ToTensor(data->train, rows);
  impl->train_y = Labels(data->train, rows);
  std::vector<int64_t> test_rows(data->test.count);
  std::iota(test_rows.begin(), test_rows.end(), 0);
  if (options.eval_limit > 0 && options.eval_limit < test_rows.size()) {
    test_rows.resize(options.eval_limit);
  }
  impl->test_x = ToTensor(data->test, test_rows);
  impl->test_y = Labels(data->test, test_rows);
  impl->order.resize(rows.size());
  std::iota(impl->order.begin(), impl->order.end(), 0);
  impl->rng.seed(config.training().seed() * 1000003 + options.data_rank);
  std::shuffle(impl->order.begin(), impl->order.end(), impl->rng);
  return std::unique_ptr<Trainer>(new BuiltinTrainer(std::move(impl)));
}

double BuiltinTrainer::TrainSteps(uint32_t steps) {
  Impl& s = *impl_;
  const int64_t batch = s.options.config.training().batch_size();
  std::function<torch::Tensor()> next;
  if (s.ledger.has_value()) {
    // The ledger's samples of this round, a batch per step.
    next = [&s, batch]() -> torch::Tensor {
      if (s.ledger_cursor >= s.ledger_rows.size()) return torch::Tensor();
      const int64_t n =
          std::min<int64_t>(batch, static_cast<int64_t>(s.ledger_rows.size() - s.ledger_cursor));
      torch::Tensor idx =
          torch::from_blob(s.ledger_rows.data() + s.ledger_cursor, {n}, torch::kLong);
      s.ledger_cursor += static_cast<size_t>(n);
      return idx;
    };
  } else {
    next = [&s, batch]() -> torch::Tensor {
      if (s.cursor + batch > s.order.size()) {  // next epoch over the shard
        std::shuffle(s.order.begin(), s.order.end(), s.rng);
        s.cursor = 0;
      }
      torch::Tensor idx = torch::from_blob(
          s.order.data() + s.cursor, {std::min<int64_t>(batch, s.order.size())}, torch::kLong);
      s.cursor += batch;
      return idx;
    };
  }
  return RunSteps(s.model, *s.optimizer, s.train_x, s.train_y, steps, s.options.stop, next);
}

void BuiltinTrainer::SetRound(uint64_t round) {
  Impl& s = *impl_;
  if (!s.audited) return;
  // A fresh local optimizer each round (its state is not replayable) and
  // a generator seeded from the round.
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
      MakeOptimizer(s.options.config.training(), s.model.trainable);
  if (optimizer.ok()) s.optimizer = *std::move(optimizer);  // checked at Create
  torch::manual_seed(RoundSeed(s.options.config.training().seed(), round));
}

absl::StatusOr<std::string> BuiltinTrainer::Replay(const float* base,
                                                   absl::Span<const shoal::v1::SampleRange> samples,
                                                   uint64_t round) {
  Impl& s = *impl_;
  if (!s.audited || !s.ledger.has_value()) {
    return absl::FailedPreconditionError("the run is not audited (RunConfig.trust.audit_rate)");
  }
  absl::StatusOr<std::vector<int64_t>> rows = s.ledger->Rows(samples);
  if (!rows.ok()) return rows.status();
  if (s.replay == nullptr) {
    auto replay = std::make_unique<ModelInstance>();
    RETURN_IF_ERROR(BuildSideInstance(s.options, s.input_shape, replay.get()));
    if (replay->flat.numel() != s.model.flat.numel()) {
      return absl::InternalError("the replay instance of the model has another size");
    }
    s.replay = std::move(replay);
  }
  ModelInstance& m = *s.replay;
  std::copy_n(base, m.flat.numel(), m.flat.data_ptr<float>());
  absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> optimizer =
      MakeOptimizer(s.options.config.training(), m.trainable);
  if (!optimizer.ok()) return optimizer.status();
  torch::manual_seed(RoundSeed(s.options.config.training().seed(), round));
  const int64_t batch = s.options.config.training().batch_size();
  size_t cursor = 0;
  RunSteps(m, **optimizer, s.train_x, s.train_y, s.options.config.training().local_steps(),
           s.options.stop, [&]() -> torch::Tensor {
             if (cursor >= rows->size()) return torch::Tensor();
             const int64_t n =
                 std::min<int64_t>(batch, static_cast<int64_t>(rows->size() - cursor));
             torch::Tensor idx = torch::from_blob(rows->data() + cursor, {n}, torch::kLong);
             cursor += static_cast<size_t>(n);
             return idx;
           });
  if (s.options.stop != nullptr && s.options.stop->cancelled()) {
    return absl::CancelledError("the worker is shutting down");
  }
  return HashParameters(m.flat.data_ptr<float>(), static_cast<uint64_t>(m.flat.numel()));
}

namespace {

shoal::v1::Metrics EvaluateOn(const std::function<torch::Tensor(torch::Tensor)>& forward,
                              const torch::Tensor& test_x, const torch::Tensor& test_y) {
  torch::NoGradGuard no_grad;
  const int64_t n = test_x.size(0);
  int64_t correct = 0;
  double loss_sum = 0;
  for (int64_t begin = 0; begin < n; begin += 1000) {
    const int64_t len = std::min<int64_t>(1000, n - begin);
    torch::Tensor logits = forward(test_x.narrow(0, begin, len));
    torch::Tensor y = test_y.narrow(0, begin, len);
    loss_sum +=
        torch::nn::functional::cross_entropy(
            logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  }
  shoal::v1::Metrics m;
  m.set_evaluated(true);
  m.set_test_accuracy(n == 0 ? 0 : static_cast<double>(correct) / n);
  m.set_test_loss(n == 0 ? 0 : loss_sum / n);
  return m;
}

}  // namespace

shoal::v1::Metrics BuiltinTrainer::Evaluate() {
  Impl& s = *impl_;
  s.model.set_training(false);
  return EvaluateOn(s.model.forward, s.test_x, s.test_y);
}

absl::StatusOr<shoal::v1::Metrics> BuiltinTrainer::EvaluateParams(const float* params) {
  Impl& s = *impl_;
  if (s.eval == nullptr) {
    // A second instance of the model. Building it draws its (overwritten)
    // initial values from torch's generator: put the generator back, so
    // that training draws what it would have drawn without it.
    auto eval = std::make_unique<ModelInstance>();
    RETURN_IF_ERROR(BuildSideInstance(s.options, s.input_shape, eval.get()));
    if (eval->flat.numel() != s.model.flat.numel()) {
      return absl::InternalError("the evaluation instance of the model has another size");
    }
    s.eval = std::move(eval);
  }
  ModelInstance& m = *s.eval;
  std::copy_n(params, m.flat.numel(), m.flat.data_ptr<float>());
  CopyInMirrored(m);
  m.set_training(false);
  return EvaluateOn(m.forward, s.test_x, s.test_y);
}

std::vector<Trainer::Prediction> BuiltinTrainer::Predict(int64_t n) {
  Impl& s = *impl_;
  torch::NoGradGuard no_grad;
  s.model.set_training(false);
  n = std::min<int64_t>(n, s.test_x.size(0));
  std::vector<Prediction> out(static_cast<size_t>(std::max<int64_t>(0, n)));
  if (n <= 0) return out;
  torch::Tensor predicted = s.model.forward(s.test_x.narrow(0, 0, n)).argmax(1).to(torch::kInt64);
  torch::Tensor labels = s.test_y.narrow(0, 0, n).to(torch::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    out[i].label = labels[i].item<int64_t>();
    out[i].predicted = predicted[i].item<int64_t>();
  }
  return out;
}

float* BuiltinTrainer::parameters() { return impl_->model.flat.data_ptr<float>(); }
uint64_t BuiltinTrainer::num_elements() const { return impl_->model.flat.numel(); }
const std::vector<LayerInfo>& BuiltinTrainer::layers() const { return impl_->model.layers; }
absl::Status BuiltinTrainer::SetSamples(absl::Span<const shoal::v1::SampleRange> ranges) {
  Impl& s = *impl_;
  if (!s.ledger.has_value()) {
    return absl::FailedPreconditionError("the run keeps no sample ledger");
  }
  absl::StatusOr<std::vector<int64_t>> rows = s.ledger->Rows(ranges);
  if (!rows.ok()) return rows.status();
  s.ledger_rows = std::move(*rows);
  s.ledger_cursor = 0;
  return absl::OkStatus();
}

uint64_t BuiltinTrainer::train_samples() const {
  return impl_->ledger.has_value() ? static_cast<uint64_t>(impl_->train_x.size(0)) : 0;
}

size_t BuiltinTrainer::shard_size() const { return impl_->order.size(); }
const std::vector<uint64_t>& BuiltinTrainer::shard_label_counts() const {
  return impl_->shard_label_counts;
}

shoal::v1::ModelLayout LayoutOf(const std::vector<LayerInfo>& layers) {
  shoal::v1::ModelLayout layout;
  for (const LayerInfo& l : layers) {
    shoal::v1::TensorSpec* t = layout.add_tensors();
    t->set_name(l.name);
    for (int64_t d : l.shape) t->add_shape(d);
    t->set_dtype(l.dtype);
  }
  layout.set_hash(LayoutHash(layout));
  return layout;
}

std::string ReplayFingerprint(const std::string& build) {
  using BlasName = char* (*)();
  auto blas = reinterpret_cast<BlasName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  // The kernels ATen dispatches to: its ATEN_CPU_CAPABILITY override, else
  // the best the CPU has (its own rule; the function is not exported).
  std::string aten;
  if (const char* env = getenv("ATEN_CPU_CAPABILITY"); env != nullptr && *env != '\0') {
    aten = env;
  } else if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    aten = "avx512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    aten = "avx2";
  } else {
    aten = "default";
  }
  return absl::StrCat(build.empty() ? "build unknown" : build, "; torch ", TORCH_VERSION, "; aten ",
                      aten, "; blas ", blas != nullptr ? blas() : "not openblas");
}

std::string HashParameters(const float* data, uint64_t count) {
  return Sha256Hex(data, count * sizeof(float));
}

}  // namespace shoal::worker
