// Shoal's own memory, counted (issue 47, docs/ARCHITECTURE.md "Memory"): this
// binary replaces the global operator new / delete with ones that count the
// bytes live and their peak while a test watches. The model-sized buffers of
// Shoal's code are std::vectors, so they are all seen here; gRPC's own
// receive buffers (its C allocator) are not, and are bounded by its flow
// control. Not a timed assertion: byte counts only.
//
//  - a synchronous round through ModelMemory adds one model (the snapshot),
//    nothing per round, and nothing for a new plan attempt;
//  - three workers' fp32 exchange over real gRPC on loopback adds at most
//    the reduce windows (16 cells each), not a copy of any model;
//  - the outer optimizer keeps its momentum only (no pending copy).
#include <grpc/grpc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/tensor_wire.h"
#include "gtest/gtest.h"
#include "services/worker/core/model_memory.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/outer_optimizer.h"
#include "services/worker/exchanger.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"
#include "shoal/v1/coordinator.pb.h"

namespace {

// Bytes allocated through operator new and not yet freed, and the most of
// them seen since the last Reset. The size of each block sits in a header in
// front of it (16 bytes, keeping the alignment malloc gives).
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
constexpr size_t kHeader = 16;

void* Counted(size_t n) {
  void* raw = std::malloc(n + kHeader);
  if (raw == nullptr) throw std::bad_alloc();
  std::memcpy(raw, &n, sizeof(n));
  const int64_t live = g_live.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
  int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return static_cast<char*>(raw) + kHeader;
}

void Uncounted(void* p) {
  if (p == nullptr) return;
  void* raw = static_cast<char*>(p) - kHeader;
  size_t n;
  std::memcpy(&n, raw, sizeof(n));
  g_live.fetch_sub(static_cast<int64_t>(n));
  std::free(raw);
}

}  // namespace

void* operator new(size_t n) { return Counted(n); }
void* operator new[](size_t n) { return Counted(n); }
void operator delete(void* p) noexcept { Uncounted(p); }
void operator delete[](void* p) noexcept { Uncounted(p); }
void operator delete(void* p, size_t) noexcept { Uncounted(p); }
void operator delete[](void* p, size_t) noexcept { Uncounted(p); }

namespace shoal::worker {
namespace {

// What a test watches: the peak of live bytes above where they stood.
class Watch {
 public:
  Watch() : base_(g_live.load()) { g_peak.store(base_); }
  int64_t peak_added() const { return g_peak.load() - base_; }
  int64_t added() const { return g_live.load() - base_; }

 private:
  int64_t base_;
};

[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(0.5f, 1.5f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A round's sequence of memory actions, twice, with a re-plan in the
// second: one model-sized buffer (the snapshot) and nothing more.
TEST(MemoryBudgetTest, ASynchronousRoundHoldsTheSnapshotOnly) {
  const uint64_t total = 16 * kMiB / sizeof(float);
  const int64_t model = static_cast<int64_t>(total * sizeof(float));
  std::vector<float> params = Random(total, 1);
  ModelState state;
  state.Bind(params.data(), total, "mlp");
  Watch watch;
  {
    ModelMemory memory(&state, params.data(), total, "h0");
    for (uint64_t round = 1; round <= 2; ++round) {
      memory.Train(round, [](float* p) {
        p[0] += 1;
        return 0.5;
      });
      memory.ServePlan(round, 1, 0, total / 2);
      memory.exchange_target()[1] = 3.0f;  // the exchange's average
      if (round == 2) {
        memory.ContributeAgain(round);  // a participant was lost
        memory.ServePlan(round, 2, 0, total / 2);
      }
      memory.HoldPending(round, absl::StrCat("h", round));
      memory.CommitPending(round);
    }
    EXPECT_LE(watch.peak_added(), model + model / 64)
        << "beyond the snapshot: " << (watch.peak_added() - model) << " bytes";
  }
  EXPECT_LE(watch.added(), model / 64);
}

// The outer optimizer's state is its momentum.
TEST(MemoryBudgetTest, TheOuterOptimizerKeepsItsMomentumOnly) {
  const uint64_t total = 4 * kMiB / sizeof(float);
  const int64_t model = static_cast<int64_t>(total * sizeof(float));
  std::vector<float> base = Random(total, 2), change = Random(total, 3), out(total);
  Watch watch;
  OuterOptions o;
  o.kind = OuterOptimizer::kNesterov;
  o.lr = 0.7f;
  o.momentum = 0.9f;
  OuterStep step(o, total);
  for (uint64_t round = 1; round <= 3; ++round) {
    step.Apply(round, 0, total, base.data(), change.data(), out.data());
    step.Commit(round);
  }
  EXPECT_LE(watch.peak_added(), model + 4096);
}

struct Node {
  Node(std::string id, size_t n, uint32_t seed)
      : id(std::move(id)), params(Random(n, seed)), service(&state, nullptr, {}) {
    state.Bind(params.data(), params.size(), "mlp");
    state.SetWorkerId(this->id);
    auto started = GrpcServer::Start("127.0.0.1:0", {&service});
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server = std::move(*started);
    ExchangeOptions options;
    options.timeout = absl::Seconds(60);
    exchanger = std::make_unique<Exchanger>(&client, &state, options);
  }
  ~Node() {
    state.SetShuttingDown();
    if (server != nullptr) server->Shutdown(absl::Seconds(1));
  }
  std::string id;
  std::vector<float> params;
  ModelState state;
  PeerService service;
  std::unique_ptr<GrpcServer> server;
  GrpcPeerClient client;
  std::unique_ptr<Exchanger> exchanger;
};

// Three workers (in this process) average a 48 MiB model each over real
// gRPC: what Shoal's code allocates meanwhile stays within the three reduce
// windows (16 MiB each at most) and small change; no copy of a model, and
// everything is given back after the round.
TEST(MemoryBudgetTest, TheExchangeAddsItsWindowsNotAModel) {
  const uint64_t total = 48 * kMiB / sizeof(float);
  const int64_t model = static_cast<int64_t>(total * sizeof(float));
  std::vector<std::unique_ptr<Node>> nodes;
  for (int k = 0; k < 3; ++k) {
    nodes.push_back(std::make_unique<Node>(absl::StrCat("w", k + 1), total, 10 + k));
    ASSERT_NE(nodes.back()->server, nullptr);
  }
  v1::RoundPlan plan;
  plan.set_round(1);
  plan.set_attempt(1);
  plan.set_total_elements(total);
  for (int k = 0; k < 3; ++k) {
    auto* s = plan.add_slices();
    s->set_worker_id(nodes[k]->id);
    s->set_peer_address(nodes[k]->server->address());
    s->set_begin(total * k / 3);
    s->set_end(total * (k + 1) / 3);
  }
  for (auto& n : nodes) {
    n->state.BeginTraining(1);
    n->state.SetReady(1);
  }
  Watch watch;
  std::vector<absl::Status> results(3);
  {
    std::vector<std::thread> threads;
    for (int k = 0; k < 3; ++k) {
      threads.emplace_back([&, k] {
        results[k] = nodes[k]->exchanger->Average(plan, nodes[k]->id, nodes[k]->params.data(),
                                                  nullptr, nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(results[k].ok()) << nodes[k]->id << ": " << results[k];
  ASSERT_EQ(std::memcmp(nodes[0]->params.data(), nodes[1]->params.data(), model), 0);
  ASSERT_EQ(std::memcmp(nodes[0]->params.data(), nodes[2]->params.data(), model), 0);
  const int64_t windows = 3 * 16 * static_cast<int64_t>(kCellElements * sizeof(float));
  EXPECT_LE(watch.peak_added(), windows + 4 * static_cast<int64_t>(kMiB))
      << "the three exchanges added " << watch.peak_added() << " bytes at most; a model is "
      << model;
  EXPECT_LT(watch.peak_added(), model);
}

}  // namespace
}  // namespace shoal::worker
