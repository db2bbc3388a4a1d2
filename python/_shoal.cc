// The C++ side of the Python module `shoal` (python/shoal/__init__.py,
// docs/PYTHON.md): a shoal-worker in the Python process. The worker host
// (services/worker/worker.h) runs on a thread of its own with the Peer
// server, the coordinator session and the exchange; the training loop runs
// on the Python thread and takes turns with the host through an
// ExternalTrainer (services/worker/core/external_trainer.h).
//
// No Torch here: the module stands behind one flat float32 tensor that
// Python allocates (views of it, or master values of its bf16 / CUDA
// tensors that Python syncs at the turns' edges); this side gets its
// address. Every call that may wait releases the GIL, and no C++ thread
// ever calls into Python: log lines wait in a queue that a Python thread
// drains (NextLogLines).
#include <google/protobuf/util/json_util.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/cancellation.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/model_layout.h"
#include "common/status_util.h"
#include "common/tls.h"
#include "common/version.h"
#include "services/worker/core/external_trainer.h"
#include "services/worker/core/trainer.h"
#include "services/worker/malloc_tuning.h"
#include "services/worker/uplink_pacer.h"
#include "services/worker/worker.h"
#include "shoal/v1/coordinator.grpc.pb.h"

namespace py = pybind11;

namespace shoal::python {
namespace {

using worker::ExternalTrainer;
using worker::ExternalTrainerOptions;
using worker::LayerInfo;

// (name, shape, dtype, offset, elements) of one state_dict entry.
using LayerTuple = std::tuple<std::string, std::vector<int64_t>, std::string, uint64_t, uint64_t>;
// A turn for the loop (ExternalTrainer::Turn): (kind, steps, round, pull,
// push, local, ledger, samples, batch), kind "train", "sync", "replay" or
// "closed"; in a ledger run's training turn and in a replay, `samples`
// (indices into the loop's training set) are the turn's, `batch` a step.
using TurnTuple = std::tuple<std::string, uint32_t, uint64_t, bool, bool, bool, bool,
                             std::vector<int64_t>, uint32_t>;

// Log lines of every worker of the process, for Python's `logging`.
class LogQueue {
 public:
  static LogQueue& Get() {
    static LogQueue* queue = new LogQueue();
    return *queue;
  }
  void Push(LogLevel level, std::string message) {
    absl::MutexLock lock(&mu_);
    if (lines_.size() >= kMaxLines) {
      lines_.pop_front();
      ++dropped_;
    }
    lines_.emplace_back(static_cast<int>(level), std::move(message));
  }
  // The lines queued, waiting up to `timeout` for one.
  std::vector<std::pair<int, std::string>> Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !lines_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&any), timeout);
    std::vector<std::pair<int, std::string>> out(std::make_move_iterator(lines_.begin()),
                                                 std::make_move_iterator(lines_.end()));
    lines_.clear();
    if (dropped_ > 0) {
      out.emplace_back(static_cast<int>(LogLevel::kWarning),
                       absl::StrCat(dropped_, " log lines dropped (the queue was full)"));
      dropped_ = 0;
    }
    return out;
  }

 private:
  static constexpr size_t kMaxLines = 10000;
  absl::Mutex mu_;
  std::deque<std::pair<int, std::string>> lines_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// (code, name, message): python/shoal raises shoal.Error from it.
py::tuple StatusTuple(const absl::Status& s) {
  return py::make_tuple(static_cast<int>(s.code()), absl::StatusCodeToString(s.code()),
                        std::string(s.message()));
}

// Thrown by this module's calls; Python sees _shoal.StatusError(code, name,
// message), which python/shoal turns into shoal.Error.
struct StatusError : std::exception {
  explicit StatusError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "shoal status error"; }
  absl::Status status;
};

[[noreturn]] void Raise(const absl::Status& s) { throw StatusError(s); }

class Worker {
 public:
  Worker(py::dict options, uintptr_t parameters, uint64_t elements,
         const std::vector<LayerTuple>& layers, uint64_t shard_size)
      : coordinator_(py::str(options["coordinator"])) {
    worker::WorkerOptions o;
    o.coordinator = coordinator_;
    o.listen = py::str(options["listen"]);
    o.advertise = py::str(options["advertise"]);
    o.name = py::str(options["name"]);
    o.zone = py::str(options["zone"]);
    o.outbound_only = options["outbound_only"].cast<bool>();
    o.metrics_listen = py::str(options["metrics_listen"]);
    o.connect_timeout = absl::Seconds(options["connect_timeout"].cast<double>());
    o.rpc_timeout = absl::Seconds(options["rpc_timeout"].cast<double>());
    if (const double uplink = options["uplink_mbps"].cast<double>(); uplink != 0) {
      if (!(uplink > 0) || !std::isfinite(uplink)) {
        Raise(absl::InvalidArgumentError(
            absl::StrCat("uplink_mbps must be a rate above 0 (0 = unpaced), got ", uplink)));
      }
      pacer_ = std::make_unique<worker::UplinkPacer>(uplink);
      o.exchange.pacer = pacer_.get();
    }
    rpc_timeout_ = o.rpc_timeout;
    TlsFiles files;
    files.cert = py::str(options["tls_cert"]);
    files.key = py::str(options["tls_key"]);
    files.ca = py::str(options["tls_ca"]);
    files.server_name = py::str(options["tls_server_name"]);
    absl::StatusOr<TlsConfig> tls = LoadTls(files);
    if (!tls.ok()) Raise(tls.status());
    SetProcessTls(*std::move(tls));
    const std::string token_file = py::str(options["token_file"]);
    if (!token_file.empty()) {
      absl::StatusOr<std::string> token = ReadTokenFile(token_file);
      if (!token.ok()) Raise(token.status());
      SetProcessToken(*token);
      o.gate = TokenGate(*token, "");
    }
    ExternalTrainerOptions t;
    t.parameters = reinterpret_cast<float*>(parameters);
    t.elements = elements;
    t.shard_size = shard_size;
    t.train_samples = options["train_samples"].cast<uint64_t>();
    o.train_samples = t.train_samples;
    // The step and optimizer the loop handed Shoal (their digest), or ""
    // (none: this worker cannot replay or be replayed).
    o.replay_step = std::string(py::str(options["replay_step"]));
    t.replayable = !o.replay_step->empty();
    o.build = absl::StrCat(ShoalVersion(), " ", ShoalCommit());
    uint64_t next = 0;
    for (const auto& [name, shape, dtype, offset, n] : layers) {
      if (offset != next || offset + n > elements) {
        Raise(absl::InvalidArgumentError(
            absl::StrCat("layer '", name, "' is not where the flat buffer has room for it")));
      }
      next = offset + n;
      t.layers.push_back(LayerInfo{name, shape, offset, n, dtype});
    }
    if (next != elements) {
      Raise(absl::InvalidArgumentError("the layers do not cover the flat buffer"));
    }
    o.layout = worker::LayoutOf(t.layers);
    if (absl::Status s = SealLayout(&*o.layout); !s.ok()) Raise(s);
    o.initial_model_hash = worker::HashParameters(t.parameters, elements);
    trainer_ = std::make_shared<ExternalTrainer>(std::move(t));
    std::shared_ptr<ExternalTrainer> trainer = trainer_;
    o.make_trainer = [this, trainer](const worker::TrainerOptions& topts)
        -> absl::StatusOr<std::unique_ptr<worker::Trainer>> {
      {
        absl::MutexLock lock(&mu_);
        config_ = topts.config;
        data_rank_ = topts.data_rank;
      }
      trainer->Configure(topts.config);
      // The host owns a Trainer; this one stays the module's.
      return std::unique_ptr<worker::Trainer>(new SharedTrainer(trainer));
    };
    o.stop = &stop_;
    options_ = std::move(o);
  }

  ~Worker() { Close("the Python worker was deleted"); }

  // Binds the Peer service and starts joining on the host's thread; the
  // address it serves.
  std::string Start() {
    absl::StatusOr<std::unique_ptr<worker::Worker>> w = worker::Worker::Start(options_);
    if (!w.ok()) Raise(w.status());
    host_ = std::move(*w);
    address_ = host_->address();
    thread_ = std::thread([this] {
      absl::Status s = host_->Run();
      {
        // Before the trainer wakes the loop: a loop told that the run is
        // over asks for the result at once.
        absl::MutexLock lock(&mu_);
        result_ = s;
      }
      trainer_->Close();
    });
    return address_;
  }

  // The next turn (the model is the loop's until EndTurn; "closed" when
  // the worker's run is over), None after `timeout` seconds.
  std::optional<TurnTuple> AwaitTurn(double timeout) {
    std::optional<ExternalTrainer::Turn> t = trainer_->AwaitTurn(absl::Seconds(timeout));
    if (!t.has_value()) return std::nullopt;
    const char* kind = t->kind == ExternalTrainer::Turn::kTrain    ? "train"
                       : t->kind == ExternalTrainer::Turn::kSync   ? "sync"
                       : t->kind == ExternalTrainer::Turn::kReplay ? "replay"
                                                                   : "closed";
    return TurnTuple(kind, t->steps, t->round, t->pull, t->push, t->local, t->ledger,
                     std::move(t->samples), t->batch);
  }
  void EndTurn(double loss) { trainer_->EndTurn(loss); }
  // The open replay turn's base into `dst` (a float32 buffer of the
  // model's elements).
  void CopyReplayBase(uintptr_t dst, uint64_t elements) {
    absl::Status s = trainer_->CopyReplayBase(reinterpret_cast<float*>(dst), elements);
    if (!s.ok()) Raise(s);
  }
  void EndReplay(const std::string& hash, const std::string& error) {
    trainer_->EndReplay(hash, error);
  }
  void Report(double accuracy, double loss) {
    shoal::v1::Metrics m;
    m.set_test_accuracy(accuracy);
    m.set_test_loss(loss);
    trainer_->ReportMetrics(m);
  }

  // Leaves the run (if it still runs) and stops the host.
  void Close(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    if (!reason.empty()) SHOAL_LOG(INFO) << "stopping: " << reason;
    // The run's status gives it as this worker's reason for leaving.
    if (host_) host_->SetStopReason(reason);
    stop_.Cancel();
    trainer_->Close();
    if (thread_.joinable()) thread_.join();
    std::unique_ptr<worker::Worker> host;
    {
      absl::MutexLock lock(&host_mu_);
      if (host_) {
        last_model_ = host_->model_info();
        worker_id_ = host_->worker_id();
      }
      host = std::move(host_);
    }
    host.reset();
  }

  // (round, SHA-256) of the averaged model the worker holds: the hash the
  // members vote on (the last one held once closed).
  std::pair<uint64_t, std::string> Agreed() const {
    absl::MutexLock lock(&host_mu_);
    const shoal::v1::PeerInfo info = host_ ? host_->model_info() : last_model_;
    return {info.model_round(), info.model_hash()};
  }

  // None while the host runs; its exit status's (code, name, message).
  py::object Result() {
    absl::MutexLock lock(&mu_);
    if (!result_.has_value()) return py::none();
    return StatusTuple(*result_);
  }

  py::dict Info() {
    absl::MutexLock lock(&mu_);
    py::dict d;
    std::string json;
    google::protobuf::util::JsonPrintOptions opts;
    opts.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(config_, &json, opts);
    d["config"] = json;
    d["data_rank"] = data_rank_;
    d["address"] = address_;
    return d;
  }

  // The coordinator's GetRunStatus as JSON (proto field names): the
  // leader's when the addresses are replicas.
  std::pair<absl::Status, std::string> RunStatus() {
    absl::Status last = absl::UnavailableError("no coordinator address");
    for (absl::string_view address : absl::StrSplit(coordinator_, ',', absl::SkipWhitespace())) {
      auto stub = shoal::v1::Coordinator::NewStub(MakeChannel(std::string(address)));
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(rpc_timeout_));
      shoal::v1::RunStatus status;
      grpc::Status s = stub->GetRunStatus(&ctx, shoal::v1::GetRunStatusRequest(), &status);
      if (!s.ok()) {
        last = FromGrpcStatus(s);
        continue;
      }
      if (status.replica_role() == "standby") {
        last = absl::UnavailableError(absl::StrCat(address, " is a standby"));
        continue;
      }
      std::string json;
      google::protobuf::util::JsonPrintOptions opts;
      opts.preserve_proto_field_names = true;
      opts.always_print_primitive_fields = true;
      (void)google::protobuf::util::MessageToJsonString(status, &json, opts);
      return {absl::OkStatus(), json};
    }
    return {last, ""};
  }

  std::string worker_id() const {
    absl::MutexLock lock(&host_mu_);
    return host_ ? host_->worker_id() : worker_id_;
  }

  uint64_t turns() const { return trainer_->turns(); }
  uint64_t round() const { return trainer_->round(); }

 private:
  // The host's Trainer: forwards to the module's ExternalTrainer, which
  // outlives the host.
  class SharedTrainer final : public worker::Trainer {
   public:
    explicit SharedTrainer(std::shared_ptr<ExternalTrainer> t) : t_(std::move(t)) {}
    double TrainSteps(uint32_t steps) override { return t_->TrainSteps(steps); }
    void SyncOnRequest() override { t_->SyncOnRequest(); }
    void SyncParameters() override { t_->SyncParameters(); }
    bool ComputesOnCallingThread() const override { return t_->ComputesOnCallingThread(); }
    shoal::v1::Metrics Evaluate() override { return t_->Evaluate(); }
    absl::StatusOr<shoal::v1::Metrics> EvaluateParams(const float* p) override {
      return t_->EvaluateParams(p);
    }
    void SetRound(uint64_t round) override { t_->SetRound(round); }
    absl::StatusOr<std::string> Replay(const float* base,
                                       absl::Span<const shoal::v1::SampleRange> samples,
                                       uint64_t round) override {
      return t_->Replay(base, samples, round);
    }
    absl::Status SetSamples(absl::Span<const shoal::v1::SampleRange> ranges) override {
      return t_->SetSamples(ranges);
    }
    uint64_t train_samples() const override { return t_->train_samples(); }
    std::vector<Prediction> Predict(int64_t n) override { return t_->Predict(n); }
    float* parameters() override { return t_->parameters(); }
    uint64_t num_elements() const override { return t_->num_elements(); }
    const std::vector<LayerInfo>& layers() const override { return t_->layers(); }
    size_t shard_size() const override { return t_->shard_size(); }
    const std::vector<uint64_t>& shard_label_counts() const override {
      return t_->shard_label_counts();
    }

   private:
    std::shared_ptr<ExternalTrainer> t_;
  };

  const std::string coordinator_;
  absl::Duration rpc_timeout_ = absl::Seconds(10);
  worker::WorkerOptions options_;
  // --uplink_mbps (null: unpaced); outlives host_.
  std::unique_ptr<worker::UplinkPacer> pacer_;
  CancellationToken stop_;
  std::shared_ptr<ExternalTrainer> trainer_;
  std::unique_ptr<worker::Worker> host_;
  std::thread thread_;
  std::string address_;
  bool closed_ = false;
  // host_ is reset by Close (the GIL released) while other Python threads
  // may ask for what it knew.
  mutable absl::Mutex host_mu_;
  shoal::v1::PeerInfo last_model_ ABSL_GUARDED_BY(host_mu_);
  std::string worker_id_ ABSL_GUARDED_BY(host_mu_);
  absl::Mutex mu_;
  std::optional<absl::Status> result_ ABSL_GUARDED_BY(mu_);
  shoal::v1::RunConfig config_ ABSL_GUARDED_BY(mu_);
  uint32_t data_rank_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace
}  // namespace shoal::python

PYBIND11_MODULE(_shoal, m) {
  using shoal::python::Worker;
  m.doc() = "The C++ side of the shoal module (docs/PYTHON.md).";
  // Before the first worker starts gRPC's threads (docs/PYTHON.md, memory).
  shoal::worker::LimitMallocArenas();
  py::class_<Worker>(m, "Worker")
      .def(py::init<py::dict, uintptr_t, uint64_t, const std::vector<shoal::python::LayerTuple>&,
                    uint64_t>())
      .def("start", &Worker::Start, py::call_guard<py::gil_scoped_release>())
      .def("await_turn", &Worker::AwaitTurn, py::call_guard<py::gil_scoped_release>())
      .def("end_turn", &Worker::EndTurn, py::call_guard<py::gil_scoped_release>())
      .def("copy_replay_base", &Worker::CopyReplayBase, py::call_guard<py::gil_scoped_release>())
      .def("end_replay", &Worker::EndReplay, py::call_guard<py::gil_scoped_release>())
      .def("report", &Worker::Report, py::call_guard<py::gil_scoped_release>())
      .def("close", &Worker::Close, py::call_guard<py::gil_scoped_release>())
      .def("result", &Worker::Result)
      .def("info", &Worker::Info)
      .def("run_status",
           [](Worker& w) {
             std::pair<absl::Status, std::string> r;
             {
               py::gil_scoped_release release;  // waits on the network
               r = w.RunStatus();
             }
             if (!r.first.ok()) shoal::python::Raise(r.first);
             return r.second;
           })
      .def("worker_id", &Worker::worker_id)
      .def("turns", &Worker::turns)
      .def("round", &Worker::round)
      .def("agreed", &Worker::Agreed);
  static py::exception<shoal::python::StatusError> status_error(m, "StatusError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const shoal::python::StatusError& e) {
      py::tuple args = shoal::python::StatusTuple(e.status);
      PyErr_SetObject(status_error.ptr(), args.ptr());
    }
  });
  m.def("layout_hash", [](const std::vector<shoal::python::LayerTuple>& layers) {
    shoal::v1::ModelLayout layout;
    for (const auto& [name, shape, dtype, offset, n] : layers) {
      auto* t = layout.add_tensors();
      t->set_name(name);
      for (int64_t d : shape) t->add_shape(d);
      t->set_dtype(dtype);
    }
    return shoal::LayoutHash(layout);
  });
  m.def("install_log_queue", [] {
    shoal::SetLogSink([](shoal::LogLevel level, const std::string& message) {
      shoal::python::LogQueue::Get().Push(level, message);
    });
  });
  m.def("remove_log_queue", [] { shoal::SetLogSink(nullptr); });
  m.def(
      "next_log_lines",
      [](double timeout) { return shoal::python::LogQueue::Get().Take(absl::Seconds(timeout)); },
      py::call_guard<py::gil_scoped_release>());
}
