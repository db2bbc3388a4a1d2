// Unit tests of the sharded average (reduce-scatter + all-gather) against a
// straightforward reference, with in-memory workers: a fake PeerClient routes
// each ReadSlice to the target worker's ModelState and streams its memory in
// checked chunks, as the gRPC peer service and client do. No sockets.
#include "services/worker/exchanger.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/chunk_codec.h"
#include "common/run_options.h"
#include "gtest/gtest.h"
#include "services/worker/core/aggregation.h"

namespace shoal::worker {
namespace {

using ::shoal::v1::AVERAGED;
using ::shoal::v1::CONTRIBUTION;
using ::shoal::v1::ReadSliceRequest;
using ::shoal::v1::RoundPlan;
using ::shoal::v1::TensorChunk;

constexpr uint64_t kRound = 5;
constexpr size_t kChunkElements = 64 * 1024;

struct FakeWorker {
  std::string id;
  std::string address;
  std::vector<float> params;
  std::vector<float> initial;
  ModelState state;
};

// Hooks run on the exchangers' threads; tests keep their own state atomic.
struct Faults {
  // Before CheckRead; a non-OK status is the call's result.
  std::function<absl::Status(const std::string& address, const ReadSliceRequest& r)> on_call;
  // Before chunk `index` of the call is checked; may alter it; a non-OK
  // status ends the call with that status (after the earlier chunks).
  std::function<absl::Status(const std::string& address, const ReadSliceRequest& r, int index,
                             TensorChunk* chunk)>
      on_chunk;
};

class FakePeerClient : public PeerClient {
 public:
  // `in_pieces`: chunks are handed over as byte pieces cut at odd offsets
  // (inside elements), as GrpcPeerClient hands over gRPC's receive slices.
  FakePeerClient(std::map<std::string, FakeWorker*> by_address, Faults faults,
                 bool in_pieces = false)
      : by_address_(std::move(by_address)), faults_(std::move(faults)), in_pieces_(in_pieces) {}

  absl::StatusOr<shoal::v1::PeerInfo> Probe(const std::string& address,
                                            absl::Duration timeout) override {
    if (!by_address_.count(address))
      return absl::UnavailableError(absl::StrCat("no peer ", address));
    return shoal::v1::PeerInfo();
  }

  absl::Status ReadSlice(const std::string& address, const ReadSliceRequest& request,
                         absl::Duration timeout,
                         const std::function<bool(const ChunkView&)>& on_chunk) override {
    calls_.fetch_add(1);
    if (timeout <= absl::ZeroDuration()) return absl::DeadlineExceededError("no time left");
    auto it = by_address_.find(address);
    if (it == by_address_.end()) return absl::UnavailableError(absl::StrCat("no peer ", address));
    if (faults_.on_call) {
      absl::Status s = faults_.on_call(address, request);
      if (!s.ok()) return s;
    }
    const FakeWorker& peer = *it->second;
    absl::Status s = peer.state.CheckRead(request);
    if (!s.ok()) return s;
    ChunkReceiver receiver(request.round(), request.begin(), request.end());
    // As PeerService: an AVERAGED read is served as far as its owner has
    // averaged (the reduce publishes cell by cell); the rest is refused
    // UNAVAILABLE (the real server parks it first), and the reader resumes.
    uint64_t end = request.end();
    if (request.kind() == shoal::v1::AVERAGED) {
      end = std::min(end, peer.state.AveragedLimit(request.round(), request.attempt()));
    }
    int index = 0;
    for (uint64_t b = request.begin(); b < end; b += kChunkElements, ++index) {
      const size_t count = std::min<uint64_t>(kChunkElements, end - b);
      TensorChunk chunk;
      EncodeChunk(request.round(), b, peer.state.parameters() + b, count, &chunk);
      if (faults_.on_chunk) {
        absl::Status f = faults_.on_chunk(address, request, index, &chunk);
        if (!f.ok()) return f;
      }
      absl::StatusOr<ChunkView> view = receiver.Accept(chunk);
      if (!view.ok()) return view.status();
      std::vector<BytePiece> pieces;
      if (in_pieces_) {
        const auto* bytes = reinterpret_cast<const uint8_t*>(view->data);
        const size_t total = view->count * sizeof(float);
        const size_t sizes[] = {5, 1, 4099, 2, 7, 65536};
        for (size_t at = 0, i = 0; at < total; ++i) {
          const size_t n = std::min(total - at, sizes[i % 6]);
          pieces.push_back({bytes + at, n});
          at += n;
        }
        view->data = nullptr;
        view->pieces = pieces.data();
        view->num_pieces = pieces.size();
      }
      if (!on_chunk(*view)) return absl::CancelledError("read cancelled by the caller");
    }
    if (end < request.end()) return absl::UnavailableError("slice not averaged yet");
    return receiver.Finish();
  }

  int calls() const { return calls_.load(); }

 private:
  const std::map<std::string, FakeWorker*> by_address_;
  const Faults faults_;
  const bool in_pieces_;
  std::atomic<int> calls_{0};
};

RoundPlan MakePlan(const std::vector<std::unique_ptr<FakeWorker>>& workers, uint64_t total) {
  RoundPlan plan;
  plan.set_round(kRound);
  plan.set_total_elements(total);
  const size_t n = workers.size();
  for (size_t k = 0; k < n; ++k) {
    auto* s = plan.add_slices();
    s->set_worker_id(workers[k]->id);
    s->set_peer_address(workers[k]->address);
    s->set_begin(static_cast<uint64_t>(static_cast<unsigned __int128>(total) * k / n));
    s->set_end(static_cast<uint64_t>(static_cast<unsigned __int128>(total) * (k + 1) / n));
  }
  return plan;
}

// N workers, each with its own random vector, trained and ready for kRound.
std::vector<std::unique_ptr<FakeWorker>> MakeWorkers(int n, uint64_t total, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<std::unique_ptr<FakeWorker>> workers;
  for (int k = 0; k < n; ++k) {
    auto w = std::make_unique<FakeWorker>();
    w->id = absl::StrCat("w", k + 1);
    w->address = absl::StrCat("10.0.0.", k + 1, ":7000");
    w->params.resize(total);
    for (float& x : w->params) x = dist(rng);
    w->initial = w->params;
    w->state.Bind(w->params.data(), total, "mlp");
    w->state.SetWorkerId(w->id);
    w->state.BeginTraining(kRound);
    w->state.SetReady(kRound);
    workers.push_back(std::move(w));
  }
  return workers;
}

std::map<std::string, FakeWorker*> ByAddress(const std::vector<std::unique_ptr<FakeWorker>>& ws) {
  std::map<std::string, FakeWorker*> m;
  for (const auto& w : ws) m[w->address] = w.get();
  return m;
}

ExchangeOptions TestOptions() {
  ExchangeOptions o;
  o.timeout = absl::Seconds(20);
  return o;
}

struct RunResult {
  std::vector<absl::Status> status;
  std::vector<ExchangeStats> stats;
};

// Runs every worker's exchange concurrently, as the participants of a round.
RunResult RunAll(const std::vector<std::unique_ptr<FakeWorker>>& workers, const RoundPlan& plan,
                 PeerClient* client, CancellationToken* abort = nullptr,
                 const ExchangeOptions& options = TestOptions()) {
  const size_t n = workers.size();
  RunResult r;
  r.status.resize(n);
  r.stats.resize(n);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      Exchanger ex(client, &workers[k]->state, options);
      r.status[k] = ex.Average(plan, workers[k]->id, workers[k]->params.data(), abort, &r.stats[k]);
    });
  }
  for (auto& t : threads) t.join();
  return r;
}

// Every worker holds the same bytes and each element is the mean of the
// initial vectors: |got - mean| <= 1e-6 * max(|mean|, mean(|x_i|)), the
// float32 summation error bound scaled to the magnitudes summed.
void ExpectAveraged(const std::vector<std::unique_ptr<FakeWorker>>& workers) {
  const size_t n = workers.size();
  const uint64_t total = workers[0]->params.size();
  for (size_t k = 1; k < n; ++k) {
    ASSERT_EQ(
        std::memcmp(workers[0]->params.data(), workers[k]->params.data(), total * sizeof(float)), 0)
        << workers[k]->id << " differs from " << workers[0]->id;
  }
  int bad = 0;
  for (uint64_t i = 0; i < total; ++i) {
    double sum = 0, abs_sum = 0;
    for (size_t k = 0; k < n; ++k) {
      sum += workers[k]->initial[i];
      abs_sum += std::fabs(workers[k]->initial[i]);
    }
    const double mean = sum / n;
    const double scale = std::max(std::fabs(mean), abs_sum / n);
    const double got = workers[0]->params[i];
    if (std::fabs(got - mean) > 1e-6 * scale) {
      if (++bad <= 5) {
        ADD_FAILURE() << "element " << i << ": got " << got << ", reference mean " << mean;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements off the reference mean";
}

// Bytes a participant receives: (N-1) copies of its own slice plus every
// other averaged slice, each exactly once.
uint64_t ExpectedBytes(const RoundPlan& plan, int self) {
  const uint64_t own = plan.slices(self).end() - plan.slices(self).begin();
  const uint64_t n = plan.slices_size();
  return ((n - 1) * own + (plan.total_elements() - own)) * sizeof(float);
}

struct Shape {
  int n;
  uint64_t total;
};

class ExchangerAverageTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ExchangerAverageTest, EveryWorkerEndsWithTheReferenceMean) {
  const Shape shape = GetParam();
  auto workers = MakeWorkers(shape.n, shape.total, 1000 + shape.n);
  const RoundPlan plan = MakePlan(workers, shape.total);
  FakePeerClient client(ByAddress(workers), {});
  RunResult r = RunAll(workers, plan, &client);
  for (int k = 0; k < shape.n; ++k) {
    ASSERT_TRUE(r.status[k].ok()) << workers[k]->id << ": " << r.status[k];
    EXPECT_EQ(r.stats[k].bytes_received, ExpectedBytes(plan, k)) << workers[k]->id;
    // The reduce-scatter's share (the supernode election's bandwidth): the
    // other participants' copies of its own slice.
    const uint64_t own = plan.slices(k).end() - plan.slices(k).begin();
    EXPECT_EQ(r.stats[k].reduce_bytes, (shape.n - 1) * own * sizeof(float)) << workers[k]->id;
    EXPECT_GE(r.stats[k].reduce_seconds, 0);
  }
  ExpectAveraged(workers);
  // Every worker now serves its averaged slice.
  for (int k = 0; k < shape.n; ++k) {
    const auto& s = plan.slices(k);
    if (s.begin() == s.end()) continue;
    ReadSliceRequest req;
    req.set_round(kRound);
    req.set_begin(s.begin());
    req.set_end(s.end());
    req.set_kind(AVERAGED);
    EXPECT_TRUE(workers[k]->state.CheckRead(req).ok()) << workers[k]->id;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ExchangerAverageTest,
                         ::testing::Values(Shape{2, 1}, Shape{2, 1001}, Shape{3, 2}, Shape{3, 1000},
                                           Shape{4, 3}, Shape{4, 600000}, Shape{7, 3}, Shape{7, 6},
                                           Shape{7, 100003}, Shape{7, 600000}, Shape{3, 600001}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("N", info.param.n, "_T", info.param.total);
                         });

// Chunks in pieces cut inside elements (as from gRPC's receive buffers):
// the same average.
TEST(ExchangerTest, ChunksInPiecesAverageTheSame) {
  for (Shape shape : {Shape{3, 1000}, Shape{4, 600000}, Shape{7, 100003}}) {
    SCOPED_TRACE(absl::StrCat("N", shape.n, "_T", shape.total));
    auto workers = MakeWorkers(shape.n, shape.total, 2000 + shape.n);
    const RoundPlan plan = MakePlan(workers, shape.total);
    FakePeerClient client(ByAddress(workers), {}, /*in_pieces=*/true);
    RunResult r = RunAll(workers, plan, &client);
    for (int k = 0; k < shape.n; ++k) {
      ASSERT_TRUE(r.status[k].ok()) << workers[k]->id << ": " << r.status[k];
      EXPECT_EQ(r.stats[k].bytes_received, ExpectedBytes(plan, k)) << workers[k]->id;
    }
    ExpectAveraged(workers);
  }
}

// Robust aggregation (issue 14): with one participant's contribution scaled
// by 1000 every worker ends with the same bits, and they are the rule applied
// to the participants' models element by element (the owner combines in its
// own order: the result must not depend on it). A contribution read that
// breaks half-way resumes into its own buffer without harm.
TEST(ExchangerTest, RobustRulesEndBitIdenticalOnTheRuleOfTheContributions) {
  struct Case {
    const char* rule;
    int n;
    AggregationSpec::Kind applied;
  };
  for (const Case& c : {Case{"trimmed_mean:1", 5, AggregationSpec::Kind::kTrimmedMean},
                        Case{"median", 4, AggregationSpec::Kind::kMedian},
                        // 2K + 1 > N: the owners fall back to the median.
                        Case{"trimmed_mean:2", 4, AggregationSpec::Kind::kMedian}}) {
    SCOPED_TRACE(absl::StrCat(c.rule, " N", c.n));
    constexpr uint64_t kTotal = 600001;  // several chunks per slice
    auto workers = MakeWorkers(c.n, kTotal, 31);
    for (float& x : workers[1]->params) x *= 1000;  // the poisoner
    workers[1]->initial = workers[1]->params;
    const RoundPlan plan = MakePlan(workers, kTotal);
    std::atomic<bool> failed{false};
    Faults faults;
    faults.on_chunk = [&](const std::string& address, const ReadSliceRequest& r, int index,
                          TensorChunk*) -> absl::Status {
      if (r.kind() == CONTRIBUTION && address == "10.0.0.3:7000" && r.reader_id() == "w1" &&
          index == 1 && !failed.exchange(true)) {
        return absl::UnavailableError("connection reset");
      }
      return absl::OkStatus();
    };
    FakePeerClient client(ByAddress(workers), faults);
    ExchangeOptions options = TestOptions();
    options.aggregation = *ParseAggregation(c.rule);
    RunResult r = RunAll(workers, plan, &client, nullptr, options);
    for (int k = 0; k < c.n; ++k) {
      ASSERT_TRUE(r.status[k].ok()) << workers[k]->id << ": " << r.status[k];
      EXPECT_EQ(r.stats[k].bytes_received, ExpectedBytes(plan, k)) << workers[k]->id;
    }
    EXPECT_TRUE(failed.load());
    std::vector<const float*> inputs;
    // Reverse order: the rule's result does not depend on it.
    for (int k = c.n - 1; k >= 0; --k) inputs.push_back(workers[k]->initial.data());
    std::vector<float> want(kTotal);
    absl::StatusOr<AggregationSpec> applied =
        CombineContributions(options.aggregation, inputs, kTotal, want.data());
    ASSERT_TRUE(applied.ok()) << applied.status();
    EXPECT_EQ(applied->kind, c.applied);
    for (int k = 0; k < c.n; ++k) {
      ASSERT_EQ(std::memcmp(workers[k]->params.data(), want.data(), kTotal * sizeof(float)), 0)
          << workers[k]->id << " does not hold the rule's result";
    }
    // The poison is gone: every element lies within the honest values' range.
    int outside = 0;
    for (uint64_t i = 0; i < kTotal; ++i) {
      float lo = INFINITY, hi = -INFINITY;
      for (int k = 0; k < c.n; ++k) {
        if (k == 1) continue;
        lo = std::min(lo, workers[k]->initial[i]);
        hi = std::max(hi, workers[k]->initial[i]);
      }
      outside += want[i] < lo || want[i] > hi;
    }
    EXPECT_EQ(outside, 0);
  }
}

TEST(ExchangerTest, SingleParticipantKeepsItsModel) {
  auto workers = MakeWorkers(1, 1000, 1);
  const RoundPlan plan = MakePlan(workers, 1000);
  FakePeerClient client(ByAddress(workers), {});
  RunResult r = RunAll(workers, plan, &client);
  ASSERT_TRUE(r.status[0].ok()) << r.status[0];
  EXPECT_EQ(workers[0]->params, workers[0]->initial);
  EXPECT_EQ(client.calls(), 0);
}

// A read that fails UNAVAILABLE after some chunks resumes where it stopped:
// the chunks already added are not added again.
TEST(ExchangerTest, ReadFailingHalfWayResumesWithoutAddingTwice) {
  constexpr int kN = 3;
  constexpr uint64_t kTotal = 600000;  // 200000 per slice: 4 chunks per read
  auto workers = MakeWorkers(kN, kTotal, 77);
  const RoundPlan plan = MakePlan(workers, kTotal);
  std::atomic<int> contribution_failures{0}, averaged_failures{0};
  std::atomic<bool> contribution_failed{false}, averaged_failed{false};
  Faults faults;
  faults.on_chunk = [&](const std::string& address, const ReadSliceRequest& r, int index,
                        TensorChunk*) -> absl::Status {
    // w2's copy of w1's slice breaks after two chunks, once; so does w3's
    // averaged slice when w1 gathers it.
    if (r.kind() == CONTRIBUTION && address == "10.0.0.2:7000" && r.reader_id() == "w1" &&
        index == 2 && !contribution_failed.exchange(true)) {
      ++contribution_failures;
      return absl::UnavailableError("connection reset");
    }
    if (r.kind() == AVERAGED && address == "10.0.0.3:7000" && r.reader_id() == "w1" && index == 1 &&
        !averaged_failed.exchange(true)) {
      ++averaged_failures;
      return absl::UnavailableError("connection reset");
    }
    return absl::OkStatus();
  };
  FakePeerClient client(ByAddress(workers), faults);
  RunResult r = RunAll(workers, plan, &client);
  for (int k = 0; k < kN; ++k) ASSERT_TRUE(r.status[k].ok()) << r.status[k];
  EXPECT_EQ(contribution_failures.load(), 1);
  EXPECT_EQ(averaged_failures.load(), 1);
  EXPECT_GE(r.stats[0].retries, 2);
  // No chunk counted (or added) twice.
  for (int k = 0; k < kN; ++k) EXPECT_EQ(r.stats[k].bytes_received, ExpectedBytes(plan, k));
  ExpectAveraged(workers);
}

TEST(ExchangerTest, ResumedReadStartsAtTheFirstMissingElement) {
  constexpr int kN = 2;
  constexpr uint64_t kTotal = 400000;
  auto workers = MakeWorkers(kN, kTotal, 5);
  const RoundPlan plan = MakePlan(workers, kTotal);
  absl::Mutex mu;
  std::vector<uint64_t> w1_contribution_begins;
  std::atomic<bool> failed{false};
  Faults faults;
  faults.on_call = [&](const std::string& address, const ReadSliceRequest& r) {
    if (r.reader_id() == "w1" && r.kind() == CONTRIBUTION) {
      absl::MutexLock lock(&mu);
      w1_contribution_begins.push_back(r.begin());
    }
    return absl::OkStatus();
  };
  faults.on_chunk = [&](const std::string&, const ReadSliceRequest& r, int index, TensorChunk*) {
    if (r.reader_id() == "w1" && r.kind() == CONTRIBUTION && index == 2 && !failed.exchange(true)) {
      return absl::UnavailableError("reset");
    }
    return absl::OkStatus();
  };
  FakePeerClient client(ByAddress(workers), faults);
  RunResult r = RunAll(workers, plan, &client);
  for (int k = 0; k < kN; ++k) ASSERT_TRUE(r.status[k].ok()) << r.status[k];
  absl::MutexLock lock(&mu);
  EXPECT_EQ(w1_contribution_begins, (std::vector<uint64_t>{0, 2 * kChunkElements}));
  ExpectAveraged(workers);
}

TEST(ExchangerTest, PeerUnavailableForAWhileIsRetried) {
  constexpr int kN = 4;
  constexpr uint64_t kTotal = 10007;
  auto workers = MakeWorkers(kN, kTotal, 9);
  const RoundPlan plan = MakePlan(workers, kTotal);
  std::atomic<int> refusals{0};
  Faults faults;
  faults.on_call = [&](const std::string& address, const ReadSliceRequest&) {
    if (address == "10.0.0.4:7000" && refusals.fetch_add(1) < 10) {
      return absl::UnavailableError("peer restarting");
    }
    return absl::OkStatus();
  };
  FakePeerClient client(ByAddress(workers), faults);
  RunResult r = RunAll(workers, plan, &client);
  for (int k = 0; k < kN; ++k) ASSERT_TRUE(r.status[k].ok()) << r.status[k];
  ExpectAveraged(workers);
}

// ------------------------------------------------------------ failures
//
// One worker under test (w1) runs its exchange against peers whose state is
// set up by hand (ready, averaged), so nobody waits on a failed participant.

struct Harness {
  explicit Harness(int n, uint64_t total) : workers(MakeWorkers(n, total, 321)) {
    plan = MakePlan(workers, total);
    for (int k = 1; k < n; ++k) {
      const auto& s = plan.slices(k);
      workers[k]->state.SetPlan(kRound, plan.attempt(), s.begin(), s.end());
      workers[k]->state.MarkAveraged(kRound);
    }
  }
  absl::Status Run(PeerClient* client, CancellationToken* abort = nullptr,
                   ExchangeOptions options = TestOptions()) {
    Exchanger ex(client, &workers[0]->state, options);
    return ex.Average(plan, workers[0]->id, workers[0]->params.data(), abort, &stats);
  }
  std::vector<std::unique_ptr<FakeWorker>> workers;
  RoundPlan plan;
  ExchangeStats stats;
};

TEST(ExchangerFailureTest, HarnessSucceedsWithoutFaults) {
  Harness h(3, 300000);
  FakePeerClient client(ByAddress(h.workers), {});
  ASSERT_TRUE(h.Run(&client).ok());
  EXPECT_EQ(h.stats.bytes_received, ExpectedBytes(h.plan, 0));
}

TEST(ExchangerFailureTest, CorruptChunkFailsWithDataLoss) {
  for (auto kind : {CONTRIBUTION, AVERAGED}) {
    SCOPED_TRACE(shoal::v1::SliceKind_Name(kind));
    Harness h(3, 300000);
    std::atomic<int> corrupted{0};
    Faults faults;
    faults.on_chunk = [&](const std::string& address, const ReadSliceRequest& r, int index,
                          TensorChunk* chunk) {
      if (address == "10.0.0.2:7000" && r.kind() == kind && index == 1) {
        (*chunk->mutable_data())[5] ^= 0x40;  // the crc32c stays the old one
        ++corrupted;
      }
      return absl::OkStatus();
    };
    FakePeerClient client(ByAddress(h.workers), faults);
    BadChunkLog bad;
    ExchangeOptions options = TestOptions();
    options.bad_chunks = &bad;
    absl::Status s = h.Run(&client, nullptr, options);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_EQ(corrupted.load(), 1) << "bad data must not be retried";
    // The sender is noted for the next heartbeat (docs/SECURITY.md).
    EXPECT_EQ(bad.Take(), std::vector<std::string>{"10.0.0.2:7000"});
    EXPECT_TRUE(bad.Take().empty());
  }
}

TEST(ExchangerFailureTest, CorruptChunkFailsEveryParticipantWithoutHanging) {
  // All participants run; w2 serves one corrupt chunk of its contribution to
  // w1. w1 fails; the others fail or time out in bounded time, never hang.
  constexpr int kN = 3;
  auto workers = MakeWorkers(kN, 300000, 4);
  const RoundPlan plan = MakePlan(workers, 300000);
  Faults faults;
  faults.on_chunk = [&](const std::string& address, const ReadSliceRequest& r, int index,
                        TensorChunk* chunk) {
    if (address == "10.0.0.2:7000" && r.reader_id() == "w1" && r.kind() == CONTRIBUTION &&
        index == 0) {
      (*chunk->mutable_data())[0] ^= 1;
    }
    return absl::OkStatus();
  };
  FakePeerClient client(ByAddress(workers), faults);
  CancellationToken abort;
  // w1's failure never lets w1's slice be averaged; the others would wait
  // for it until the deadline, so the round gets aborted (as the coordinator
  // does when w1 leaves) once w1 has failed.
  RunResult r;
  r.status.resize(kN);
  r.stats.resize(kN);
  std::vector<std::thread> threads;
  for (int k = 0; k < kN; ++k) {
    threads.emplace_back([&, k] {
      Exchanger ex(&client, &workers[k]->state, TestOptions());
      r.status[k] =
          ex.Average(plan, workers[k]->id, workers[k]->params.data(), &abort, &r.stats[k]);
      if (k == 0) abort.Cancel();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(r.status[0].code(), absl::StatusCode::kDataLoss) << r.status[0];
  for (int k = 1; k < kN; ++k) EXPECT_FALSE(r.status[k].ok()) << workers[k]->id;
}

TEST(ExchangerFailureTest, RefusedReadFailsWithItsCode) {
  for (auto kind : {CONTRIBUTION, AVERAGED}) {
    SCOPED_TRACE(shoal::v1::SliceKind_Name(kind));
    Harness h(4, 1000);
    std::atomic<int> refused{0};
    Faults faults;
    faults.on_call = [&](const std::string& address, const ReadSliceRequest& r) {
      if (address == "10.0.0.3:7000" && r.kind() == kind) {
        ++refused;
        return absl::FailedPreconditionError("round 5 is stale: this worker is at round 6");
      }
      return absl::OkStatus();
    };
    FakePeerClient client(ByAddress(h.workers), faults);
    absl::Status s = h.Run(&client);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(refused.load(), 1) << "a refused read must not be retried";
  }
}

TEST(ExchangerFailureTest, PeerInAnotherRoundFailsWithFailedPrecondition) {
  Harness h(3, 999);
  h.workers[2]->state.BeginTraining(kRound + 1);  // w3 moved on
  FakePeerClient client(ByAddress(h.workers), {});
  absl::Status s = h.Run(&client);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(ExchangerFailureTest, AbortBeforeRunReturnsAborted) {
  Harness h(3, 999);
  FakePeerClient client(ByAddress(h.workers), {});
  CancellationToken abort;
  abort.Cancel();
  absl::Status s = h.Run(&client, &abort);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

TEST(ExchangerFailureTest, AbortWhileWaitingForAnAverageReturnsAbortedPromptly) {
  Harness h(3, 999);
  // w3 has not averaged its slice (and never will): w1 keeps retrying.
  h.workers[2]->state.BeginTraining(kRound);
  h.workers[2]->state.SetReady(kRound);
  h.workers[2]->state.SetPlan(kRound, h.plan.attempt(), h.plan.slices(2).begin(),
                              h.plan.slices(2).end());
  CancellationToken abort;
  std::atomic<int> waits{0};
  Faults faults;
  faults.on_call = [&](const std::string& address, const ReadSliceRequest& r) {
    // The abort arrives after a few refused reads of the average.
    if (r.kind() == AVERAGED && address == "10.0.0.3:7000" && ++waits == 5) abort.Cancel();
    return absl::OkStatus();
  };
  FakePeerClient client(ByAddress(h.workers), faults);
  absl::Status s = h.Run(&client, &abort);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

TEST(ExchangerFailureTest, AbortDuringAStreamReturnsAborted) {
  // The chunk callback cancels the read; that must surface as ABORTED (a
  // normal round abort for the worker), not CANCELLED (an exchange failure).
  for (auto kind : {CONTRIBUTION, AVERAGED}) {
    SCOPED_TRACE(shoal::v1::SliceKind_Name(kind));
    Harness h(2, 600000);
    CancellationToken abort;
    Faults faults;
    faults.on_chunk = [&](const std::string&, const ReadSliceRequest& r, int index, TensorChunk*) {
      if (r.kind() == kind && index == 2) abort.Cancel();  // arrives mid-stream
      return absl::OkStatus();
    };
    FakePeerClient client(ByAddress(h.workers), faults);
    absl::Status s = h.Run(&client, &abort);
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  }
}

TEST(ExchangerFailureTest, PlanWithoutSelfIsInvalidArgument) {
  Harness h(3, 999);
  FakePeerClient client(ByAddress(h.workers), {});
  Exchanger ex(&client, &h.workers[0]->state, TestOptions());
  absl::Status s = ex.Average(h.plan, "w99", h.workers[0]->params.data(), nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(client.calls(), 0);
  EXPECT_EQ(h.workers[0]->params, h.workers[0]->initial);
}

TEST(ExchangerFailureTest, PlanWithWrongTotalIsInvalidArgument) {
  for (uint64_t total : {998u, 1000u, 0u}) {
    Harness h(3, 999);
    h.plan.set_total_elements(total);
    FakePeerClient client(ByAddress(h.workers), {});
    absl::Status s = h.Run(&client);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << total << ": " << s;
    EXPECT_EQ(client.calls(), 0);
    EXPECT_EQ(h.workers[0]->params, h.workers[0]->initial);
  }
}

TEST(ExchangerFailureTest, PeerThatNeverAnswersTimesOut) {
  Harness h(2, 100);
  Faults faults;
  faults.on_call = [](const std::string&, const ReadSliceRequest&) {
    return absl::UnavailableError("connection refused");
  };
  FakePeerClient client(ByAddress(h.workers), faults);
  ExchangeOptions options = TestOptions();
  options.timeout = absl::Milliseconds(200);
  absl::Status s = h.Run(&client, nullptr, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("connection refused"), std::string::npos) << s;
}

}  // namespace
}  // namespace shoal::worker
