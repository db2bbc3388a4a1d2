// The encoded exchange (Exchanger over blobs, docs/COMPRESSION.md) with
// in-memory workers: a fake PeerClient serves Peer.ReadEncoded from each
// worker's EncodedStore in small pieces with CRC-32C, as PeerService does.
// Three workers with int8 + nesterov end bit-identical and near the float64
// reference of the outer step from their committed momentum; the same round
// run twice, its reads finishing in another order, publishes the same encoded
// averages and ends with the same bits; a piece whose
// CRC does not match is DATA_LOSS, a well-formed piece of a malformed
// encoding INVALID_ARGUMENT, and either way the refused worker's parameters
// are left as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/run_options.h"
#include "services/worker/core/aggregation.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/core/outer_optimizer.h"
#include "services/worker/exchanger.h"

namespace shoal::worker {
namespace {

constexpr uint64_t kRound = 7;
// Small pieces: every encoding travels in several.
constexpr size_t kPieceBytes = 700;

struct Worker {
  std::string id;
  std::string address;
  std::vector<float> base;     // the agreed model the round starts from
  std::vector<float> params;   // trained, then the new model
  std::vector<float> trained;  // a copy of the trained model
  ModelState state;
  EncodedStore store;
  std::unique_ptr<OuterStep> outer;
  ExchangeParts parts;
  // Kept after the round, as the worker keeps its exchanger: the outer
  // step reads the round's change from it again at Commit.
  std::unique_ptr<Exchanger> exchanger;
};

// May alter a piece before the reader sees it.
using PieceFault =
    std::function<void(const std::string& address, const shoal::v1::ReadEncodedRequest& r,
                       shoal::v1::EncodedPiece* piece)>;

class FakeEncodedPeers : public PeerClient {
 public:
  FakeEncodedPeers(std::map<std::string, Worker*> by_address, PieceFault fault)
      : by_address_(std::move(by_address)), fault_(std::move(fault)) {}

  absl::Status ReadSlice(const std::string&, const shoal::v1::ReadSliceRequest&, absl::Duration,
                         const std::function<bool(const ChunkView&)>&) override {
    return absl::UnimplementedError("the encoded exchange reads blobs only");
  }
  absl::StatusOr<shoal::v1::PeerInfo> Probe(const std::string&, absl::Duration) override {
    return shoal::v1::PeerInfo();
  }
  absl::StatusOr<shoal::v1::EncodedPiece> ReadEncoded(const std::string& address,
                                                      const shoal::v1::ReadEncodedRequest& r,
                                                      absl::Duration, CancellationToken*) override {
    auto it = by_address_.find(address);
    if (it == by_address_.end()) return absl::UnavailableError(absl::StrCat("no peer ", address));
    absl::StatusOr<Blob> blob = it->second->store.Find(r);
    if (!blob.ok()) return blob.status();
    const std::string& bytes = **blob;
    if (r.offset() > bytes.size()) return absl::InvalidArgumentError("offset past the end");
    const size_t n = std::min<uint64_t>(kPieceBytes, bytes.size() - r.offset());
    shoal::v1::EncodedPiece piece;
    piece.set_round(r.round());
    piece.set_total_bytes(bytes.size());
    piece.set_offset(r.offset());
    piece.set_data(bytes.data() + r.offset(), n);
    piece.set_crc32c(Crc32c(piece.data().data(), n));
    if (fault_) fault_(address, r, &piece);
    return piece;
  }

 private:
  const std::map<std::string, Worker*> by_address_;
  const PieceFault fault_;
};

// `n` workers on one agreed base, each with its own trained model, all
// holding the same committed momentum of round kRound - 1.
std::vector<std::unique_ptr<Worker>> MakeWorkers(int n, uint64_t total, float lr, float mu) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> weights(-1.0f, 1.0f);
  std::normal_distribution<float> step(0.0f, 0.01f);
  std::vector<float> base(total), momentum(total);
  for (float& x : base) x = weights(rng);
  for (float& x : momentum) x = step(rng);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int k = 0; k < n; ++k) {
    auto w = std::make_unique<Worker>();
    w->id = absl::StrCat("w", k + 1);
    w->address = absl::StrCat("10.0.0.", k + 1, ":7000");
    w->base = base;
    w->params = base;
    for (float& x : w->params) x += step(rng);
    w->trained = w->params;
    w->state.Bind(w->params.data(), total, "mlp");
    w->state.SetWorkerId(w->id);
    w->state.BeginTraining(kRound);
    w->state.SetReady(kRound);
    OuterOptions o;
    o.kind = OuterOptimizer::kNesterov;
    o.lr = lr;
    o.momentum = mu;
    w->outer = std::make_unique<OuterStep>(o, total);
    EXPECT_TRUE(w->outer->SetMomentum(kRound - 1, momentum).ok());
    w->parts.store = &w->store;
    w->parts.outer = w->outer.get();
    w->parts.base = w->base.data();
    workers.push_back(std::move(w));
  }
  return workers;
}

shoal::v1::RoundPlan MakePlan(const std::vector<std::unique_ptr<Worker>>& workers, uint64_t total) {
  shoal::v1::RoundPlan plan;
  plan.set_round(kRound);
  plan.set_total_elements(total);
  const size_t n = workers.size();
  for (size_t k = 0; k < n; ++k) {
    auto* s = plan.add_slices();
    s->set_worker_id(workers[k]->id);
    s->set_peer_address(workers[k]->address);
    s->set_begin(total * k / n);
    s->set_end(total * (k + 1) / n);
  }
  return plan;
}

std::vector<absl::Status> RunAll(const std::vector<std::unique_ptr<Worker>>& workers,
                                 const Codec& codec, PieceFault fault,
                                 absl::Duration timeout = absl::Seconds(20),
                                 AggregationSpec aggregation = {}) {
  std::map<std::string, Worker*> by_address;
  for (const auto& w : workers) by_address[w->address] = w.get();
  FakeEncodedPeers peers(by_address, std::move(fault));
  const shoal::v1::RoundPlan plan = MakePlan(workers, workers[0]->params.size());
  ExchangeOptions options;
  options.timeout = timeout;
  options.aggregation = aggregation;
  std::vector<absl::Status> status(workers.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < workers.size(); ++k) {
    threads.emplace_back([&, k] {
      ExchangeParts parts = workers[k]->parts;
      parts.codec = &codec;
      workers[k]->exchanger =
          std::make_unique<Exchanger>(&peers, &workers[k]->state, options, parts);
      AveragingStats stats;
      status[k] = workers[k]->exchanger->Average(plan, workers[k]->id, workers[k]->params.data(),
                                                 nullptr, &stats);
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

std::unique_ptr<Codec> Int8() {
  auto c = MakeCodec("int8");
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

TEST(EncodedExchangeTest, Int8NesterovWorkersEndBitIdenticalNearTheReference) {
  const uint64_t total = 3001;  // slices that are not a multiple of the int8 block
  const float lr = 0.7f, mu = 0.9f;
  auto workers = MakeWorkers(3, total, lr, mu);
  auto codec = Int8();
  const std::vector<absl::Status> status = RunAll(workers, *codec, nullptr);
  for (size_t k = 0; k < workers.size(); ++k) ASSERT_TRUE(status[k].ok()) << k << status[k];
  for (size_t k = 1; k < workers.size(); ++k) {
    EXPECT_EQ(
        std::memcmp(workers[0]->params.data(), workers[k]->params.data(), total * sizeof(float)), 0)
        << workers[k]->id << " differs from " << workers[0]->id;
  }
  // float64 reference: g = base - mean(trained); m' = mu m + g;
  // new = base - lr (g + mu m'). int8 loses at most half a step of the
  // largest change per block, twice (the contributions, the average), and
  // the step multiplies that by lr (1 + mu).
  double max_change = 0;
  for (const auto& w : workers) {
    for (uint64_t i = 0; i < total; ++i) {
      max_change = std::max<double>(max_change, std::fabs(w->trained[i] - w->base[i]));
    }
  }
  const double tolerance = lr * (1 + mu) * (2 * max_change / 127) + 1e-6;
  const std::vector<float>& m = workers[0]->outer->momentum();  // still round kRound - 1
  ASSERT_EQ(workers[0]->outer->momentum_round(), kRound - 1);
  int bad = 0;
  double moved = 0;
  for (uint64_t i = 0; i < total; ++i) {
    double mean = 0;
    for (const auto& w : workers) mean += w->trained[i];
    mean /= workers.size();
    const double g = workers[0]->base[i] - mean;
    const double next = mu * m[i] + g;
    const double want = workers[0]->base[i] - lr * (g + mu * next);
    moved = std::max(moved, std::fabs(want - workers[0]->base[i]));
    if (std::fabs(workers[0]->params[i] - want) > tolerance && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << workers[0]->params[i] << ", want " << want
                    << " +- " << tolerance;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(moved, 10 * tolerance);  // the reference is not within noise of the base
  // The round's momentum is identical everywhere once committed.
  for (auto& w : workers) w->outer->Commit(kRound);
  for (size_t k = 1; k < workers.size(); ++k) {
    EXPECT_EQ(workers[k]->outer->momentum(), workers[0]->outer->momentum());
  }
}

// Robust aggregation in the encoded exchange (issue 14): one worker's change
// scaled by 1000; with trimmed_mean:1 (5 workers) or the median (4) the
// owners combine the decoded changes by the rule, every worker ends with the
// same bits, and the new model is base + the rule's change (lr 1, no
// momentum), far from what the mean would give.
TEST(EncodedExchangeTest, RobustRulesCombineTheDecodedChanges) {
  for (const char* rule : {"trimmed_mean:1", "median"}) {
    SCOPED_TRACE(rule);
    const int n = std::string(rule) == "median" ? 4 : 5;
    const uint64_t total = 3001;
    auto workers = MakeWorkers(n, total, /*lr=*/1.0f, /*mu=*/0.0f);
    Worker& poisoner = *workers[2];
    for (uint64_t i = 0; i < total; ++i) {
      poisoner.params[i] = poisoner.base[i] + 1000 * (poisoner.params[i] - poisoner.base[i]);
    }
    poisoner.trained = poisoner.params;
    auto fp32 = MakeCodec("fp32");
    ASSERT_TRUE(fp32.ok());
    const AggregationSpec spec = *ParseAggregation(rule);
    const std::vector<absl::Status> status =
        RunAll(workers, **fp32, nullptr, absl::Seconds(20), spec);
    for (int k = 0; k < n; ++k) ASSERT_TRUE(status[k].ok()) << k << status[k];
    for (int k = 1; k < n; ++k) {
      EXPECT_EQ(
          std::memcmp(workers[0]->params.data(), workers[k]->params.data(), total * sizeof(float)),
          0)
          << workers[k]->id << " differs from " << workers[0]->id;
    }
    std::vector<std::vector<float>> changes(n, std::vector<float>(total));
    std::vector<const float*> inputs;
    for (int k = 0; k < n; ++k) {
      for (uint64_t i = 0; i < total; ++i) {
        changes[k][i] = workers[k]->trained[i] - workers[k]->base[i];
      }
      inputs.push_back(changes[k].data());
    }
    std::vector<float> want(total);
    ASSERT_TRUE(CombineContributions(spec, inputs, total, want.data()).ok());
    int bad = 0, far_from_mean = 0;
    for (uint64_t i = 0; i < total; ++i) {
      const double got = workers[0]->params[i] - workers[0]->base[i];
      if (std::fabs(got - want[i]) > 1e-6 && ++bad <= 5) {
        ADD_FAILURE() << "element " << i << ": change " << got << ", want " << want[i];
      }
      double mean = 0;
      for (int k = 0; k < n; ++k) mean += changes[k][i];
      mean /= n;
      far_from_mean += std::fabs(got - mean) > 10 * std::fabs(want[i]);
    }
    EXPECT_EQ(bad, 0);
    EXPECT_GT(far_from_mean, static_cast<int>(total / 2));
  }
}

TEST(EncodedExchangeTest, TheSameRoundTwiceGivesTheSameBits) {
  const uint64_t total = 2000;
  auto codec = Int8();
  auto a = MakeWorkers(3, total, 0.7f, 0.9f);
  auto b = MakeWorkers(3, total, 0.7f, 0.9f);
  // Run a: w2's contributions arrive late; run b: w3's. The owners' sums
  // must not depend on which read finished first.
  auto late = [](const std::string& slow) -> PieceFault {
    return [slow](const std::string& address, const shoal::v1::ReadEncodedRequest& r,
                  shoal::v1::EncodedPiece*) {
      if (address == slow && r.kind() == shoal::v1::CONTRIBUTION) {
        absl::SleepFor(absl::Milliseconds(30));
      }
    };
  };
  for (const auto& s : RunAll(a, *codec, late(a[1]->address))) ASSERT_TRUE(s.ok()) << s;
  for (const auto& s : RunAll(b, *codec, late(b[2]->address))) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(a[0]->params.data(), b[0]->params.data(), total * sizeof(float)), 0);
  // The owners published the same encoded averages.
  const shoal::v1::RoundPlan plan = MakePlan(a, total);
  for (int k = 0; k < 3; ++k) {
    shoal::v1::ReadEncodedRequest r;
    r.set_round(kRound);
    r.set_kind(shoal::v1::AVERAGED);
    r.set_begin(plan.slices(k).begin());
    r.set_end(plan.slices(k).end());
    absl::StatusOr<Blob> x = a[k]->store.Find(r);
    absl::StatusOr<Blob> y = b[k]->store.Find(r);
    ASSERT_TRUE(x.ok() && y.ok()) << x.status() << y.status();
    EXPECT_EQ(**x, **y) << "slice " << k;
  }
}

// Found by the soak (issue 30): the leader was killed after a round's
// exchange, and the new leader planned the round again with the same
// attempt number but other inputs (one site had lost members). A peer read
// the old plan's blobs from a worker that had not started the new plan yet,
// and the workers ended with different models. A worker whose plan is void
// withdraws what it published (the worker does it when its session is lost
// or its pending average is voided): here w1 starts the new plan first and
// asks w2 before w2 starts, and both still end with the bits of the new
// plan run on fresh workers.
class CountingPeers : public FakeEncodedPeers {
 public:
  using FakeEncodedPeers::FakeEncodedPeers;
  absl::StatusOr<shoal::v1::EncodedPiece> ReadEncoded(const std::string& address,
                                                      const shoal::v1::ReadEncodedRequest& r,
                                                      absl::Duration timeout,
                                                      CancellationToken* cancel) override {
    ++reads_[address];
    return FakeEncodedPeers::ReadEncoded(address, r, timeout, cancel);
  }
  int reads(const std::string& address) const {
    auto it = reads_.find(address);
    return it == reads_.end() ? 0 : it->second.load();
  }
  void Watch(const std::string& address) { reads_[address] = 0; }

 private:
  std::map<std::string, std::atomic<int>> reads_;
};

TEST(EncodedExchangeTest, ARoundPlannedAgainWithTheSameAttemptNeverReadsTheVoidPlan) {
  const uint64_t total = 2000;
  auto codec = Int8();
  auto workers = MakeWorkers(2, total, 0.7f, 0.9f);
  for (const auto& s : RunAll(workers, *codec, nullptr)) ASSERT_TRUE(s.ok()) << s;
  // The new leader's plan: w2 brings another model (its site changed).
  std::vector<float> other = workers[1]->trained;
  for (float& x : other) x += 0.05f;
  for (auto& w : workers) w->store.Withdraw();
  workers[0]->params = workers[0]->trained;
  workers[1]->params = other;
  // What the new plan gives on workers that never saw the old one.
  auto fresh = MakeWorkers(2, total, 0.7f, 0.9f);
  fresh[1]->params = other;
  for (const auto& s : RunAll(fresh, *codec, nullptr)) ASSERT_TRUE(s.ok()) << s;

  std::map<std::string, Worker*> by_address;
  for (const auto& w : workers) by_address[w->address] = w.get();
  CountingPeers peers(by_address, nullptr);
  peers.Watch(workers[1]->address);
  peers.Watch(workers[0]->address);
  const shoal::v1::RoundPlan plan = MakePlan(workers, total);
  ExchangeOptions options;
  options.timeout = absl::Seconds(20);
  std::vector<absl::Status> status(2);
  auto run = [&](size_t k) {
    ExchangeParts parts = workers[k]->parts;
    parts.codec = codec.get();
    Exchanger ex(&peers, &workers[k]->state, options, parts);
    status[k] = ex.Average(plan, workers[k]->id, workers[k]->params.data(), nullptr, nullptr);
  };
  std::thread first(run, 0);
  // w1 asks w2 (and is told to wait) before w2 starts the new plan.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (peers.reads(workers[1]->address) < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GE(peers.reads(workers[1]->address), 2);
  std::thread second(run, 1);
  first.join();
  second.join();
  for (const auto& s : status) ASSERT_TRUE(s.ok()) << s;
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(
        std::memcmp(workers[k]->params.data(), fresh[k]->params.data(), total * sizeof(float)), 0)
        << workers[k]->id << " did not end with the new plan's model";
  }
}

TEST(EncodedExchangeTest, CorruptPieceIsDataLossAndNothingIsWritten) {
  const uint64_t total = 2000;
  auto workers = MakeWorkers(3, total, 0.7f, 0.9f);
  auto codec = Int8();
  const std::string victim = workers[0]->address;
  // Every piece of w1's average is damaged on the way.
  const std::vector<absl::Status> status =
      RunAll(workers, *codec,
             [&](const std::string& address, const shoal::v1::ReadEncodedRequest& r,
                 shoal::v1::EncodedPiece* piece) {
               if (address == victim && r.kind() == shoal::v1::AVERAGED) {
                 (*piece->mutable_data())[0] ^= 0x10;
               }
             });
  EXPECT_TRUE(status[0].ok()) << status[0];
  for (size_t k = 1; k < workers.size(); ++k) {
    EXPECT_EQ(status[k].code(), absl::StatusCode::kDataLoss) << k << status[k];
    EXPECT_EQ(workers[k]->params, workers[k]->trained) << workers[k]->id << " was written";
  }
}

TEST(EncodedExchangeTest, MalformedContributionIsInvalidArgumentAndNothingIsWritten) {
  const uint64_t total = 2000;
  auto workers = MakeWorkers(3, total, 0.7f, 0.9f);
  auto codec = Int8();
  const std::string from = workers[1]->address;
  // w2's contribution to w1's slice carries a NaN block scale, with a CRC
  // that matches: the bytes arrive intact but do not decode.
  const std::vector<absl::Status> status = RunAll(
      workers, *codec,
      [&](const std::string& address, const shoal::v1::ReadEncodedRequest& r,
          shoal::v1::EncodedPiece* piece) {
        if (address == from && r.kind() == shoal::v1::CONTRIBUTION && piece->offset() == 0) {
          const float nan = std::numeric_limits<float>::quiet_NaN();
          std::memcpy(piece->mutable_data()->data(), &nan, sizeof(nan));
          piece->set_crc32c(Crc32c(piece->data().data(), piece->data().size()));
        }
      },
      absl::Seconds(2));
  EXPECT_EQ(status[0].code(), absl::StatusCode::kInvalidArgument) << status[0];
  EXPECT_EQ(workers[0]->params, workers[0]->trained) << "w1 was written";
  // The others never get w1's average: they fail too, and keep their model.
  for (size_t k = 1; k < workers.size(); ++k) {
    EXPECT_FALSE(status[k].ok()) << k;
    EXPECT_EQ(workers[k]->params, workers[k]->trained) << workers[k]->id << " was written";
  }
}

}  // namespace
}  // namespace shoal::worker
