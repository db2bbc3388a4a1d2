// Hierarchical rounds of the averaging pipeline (Exchanger, exchanger.h;
// docs/SUPERNODES.md) with in-memory workers: a fake PeerClient serves
// Peer.ReadEncoded from each worker's EncodedStore in small pieces with
// CRC-32C, as PeerService does, stages included (a stage not reached yet is
// UNAVAILABLE and retried).
//  - fp32 models: five workers in two zones end bit-identical and equal to
//    the flat mean up to float rounding;
//  - int8 + nesterov: the changes travel int8 at every level, every worker
//    ends with the same bits, near the float64 reference of the outer step;
//  - trimmed_mean:1 with a poisoning worker in one zone: bit-identical and
//    near the honest mean, where the mean would be far off;
//  - a malformed hierarchy is INVALID_ARGUMENT and leaves the model as it
//    was;
//  - a new attempt after a lost participant carries the groups that did not
//    change (same identity) and still ends bit-identical, fp32 and int8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "services/worker/core/averaging_steps.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/outer_optimizer.h"
#include "services/worker/exchanger.h"

namespace shoal::worker {
namespace {

constexpr uint64_t kRound = 4;
constexpr uint64_t kTotal = 1001;  // slices of uneven sizes
constexpr size_t kPieceBytes = 500;

struct Worker {
  std::string id;
  std::string address;
  std::vector<float> params;
  std::unique_ptr<ModelState> state;
  EncodedStore store;
  // Runs whose changes travel: the agreed base and the outer optimizer.
  std::vector<float> base;
  std::unique_ptr<OuterStep> outer;
};

class FakeStagePeers : public PeerClient {
 public:
  explicit FakeStagePeers(std::map<std::string, Worker*> by_address)
      : by_address_(std::move(by_address)) {}
  absl::Status ReadSlice(const std::string&, const shoal::v1::ReadSliceRequest&, absl::Duration,
                         const std::function<bool(const ChunkView&)>&) override {
    return absl::UnimplementedError("stages are read with ReadEncoded");
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
    const size_t n = std::min<uint64_t>(kPieceBytes, bytes.size() - r.offset());
    shoal::v1::EncodedPiece piece;
    piece.set_round(r.round());
    piece.set_total_bytes(bytes.size());
    piece.set_offset(r.offset());
    piece.set_data(bytes.data() + r.offset(), n);
    piece.set_crc32c(Crc32c(piece.data().data(), n));
    return piece;
  }

 private:
  const std::map<std::string, Worker*> by_address_;
};

shoal::v1::HierarchyGroup* AddGroup(shoal::v1::HierarchyStage* stage, std::vector<uint32_t> members,
                                    std::vector<uint32_t> weights, uint32_t head = 0) {
  auto* g = stage->add_groups();
  for (uint32_t m : members) g->add_members(m);
  for (uint32_t w : weights) g->add_weights(w);
  g->set_head(head);
  return g;
}

// Zones {0, 1, 2} and {3, 4}: the sites' means, the heads (0 and 3)
// weighted 3 and 2, then each head's broadcast to its site.
shoal::v1::RoundPlan TwoSitePlan(const std::vector<std::unique_ptr<Worker>>& workers) {
  shoal::v1::RoundPlan plan;
  plan.set_round(kRound);
  plan.set_attempt(1);
  plan.set_total_elements(kTotal);
  for (const auto& w : workers) {
    auto* s = plan.add_slices();
    s->set_worker_id(w->id);
    s->set_peer_address(w->address);
  }
  auto* up = plan.mutable_hierarchy()->add_stages();
  up->set_kind(shoal::v1::HierarchyStage::AVERAGE);
  AddGroup(up, {0, 1, 2}, {1, 1, 1});
  AddGroup(up, {3, 4}, {1, 1});
  auto* across = plan.mutable_hierarchy()->add_stages();
  across->set_kind(shoal::v1::HierarchyStage::AVERAGE);
  AddGroup(across, {0, 3}, {3, 2});
  auto* down = plan.mutable_hierarchy()->add_stages();
  down->set_kind(shoal::v1::HierarchyStage::BROADCAST);
  AddGroup(down, {0, 1, 2}, {}, 0);
  AddGroup(down, {3, 4}, {}, 3);
  return plan;
}

std::vector<std::unique_ptr<Worker>> MakeWorkers(int n) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int k = 0; k < n; ++k) {
    auto w = std::make_unique<Worker>();
    w->id = absl::StrCat("w", k + 1);
    w->address = absl::StrCat("10.0.0.", k + 1, ":7000");
    w->params.resize(kTotal);
    for (float& x : w->params) x = dist(rng);
    w->state = std::make_unique<ModelState>(w->params.data(), kTotal, "mlp");
    workers.push_back(std::move(w));
  }
  return workers;
}

// Runs `plan` on `averagers[k]` for the workers `who` (indices into
// workers) in parallel.
void RunAttempt(const shoal::v1::RoundPlan& plan, std::vector<std::unique_ptr<Worker>>& workers,
                std::vector<std::unique_ptr<Exchanger>>& averagers, const std::vector<int>& who,
                std::vector<AveragingStats>* stats) {
  std::vector<absl::Status> status(workers.size());
  stats->assign(workers.size(), AveragingStats());
  std::vector<std::thread> threads;
  for (int k : who) {
    threads.emplace_back([&, k] {
      status[k] = averagers[k]->Average(plan, workers[k]->id, workers[k]->params.data(), nullptr,
                                        &(*stats)[k]);
    });
  }
  for (auto& t : threads) t.join();
  for (int k : who) ASSERT_TRUE(status[k].ok()) << workers[k]->id << ": " << status[k];
}

ExchangeOptions Options(AggregationSpec aggregation = {}) {
  ExchangeOptions options;
  options.timeout = absl::Seconds(30);
  options.aggregation = aggregation;
  return options;
}

// One exchanger per worker: fp32 models when `codec` is null, else the
// changes from each worker's base with `codec` and its outer step.
std::vector<std::unique_ptr<Exchanger>> MakeExchangers(
    std::vector<std::unique_ptr<Worker>>& workers, PeerClient* peers,
    const ExchangeOptions& options, const Codec* codec = nullptr) {
  std::vector<std::unique_ptr<Exchanger>> out;
  for (auto& w : workers) {
    ExchangeParts parts;
    parts.store = &w->store;
    if (codec != nullptr) {
      parts.codec = codec;
      parts.outer = w->outer.get();
      parts.base = w->base.data();
    }
    out.push_back(std::make_unique<Exchanger>(peers, w->state.get(), options, parts));
  }
  return out;
}

std::map<std::string, Worker*> ByAddress(const std::vector<std::unique_ptr<Worker>>& workers) {
  std::map<std::string, Worker*> by_address;
  for (const auto& w : workers) by_address[w->address] = w.get();
  return by_address;
}

void ExpectAllEqual(const std::vector<std::unique_ptr<Worker>>& workers,
                    const std::vector<int>& who) {
  for (int k : who) {
    EXPECT_EQ(std::memcmp(workers[k]->params.data(), workers[who[0]]->params.data(),
                          kTotal * sizeof(float)),
              0)
        << workers[k]->id << " differs from " << workers[who[0]]->id;
  }
}

// Every worker on one agreed base with its own trained model (base plus a
// small step), and nesterov with zero momentum.
void MakeTrained(std::vector<std::unique_ptr<Worker>>& workers, float lr, float mu) {
  std::mt19937 rng(17);
  std::normal_distribution<float> step(0.0f, 0.02f);
  const std::vector<float> base = workers[0]->params;
  for (auto& w : workers) {
    w->base = base;
    w->params = base;
    for (float& x : w->params) x += step(rng);
    w->state = std::make_unique<ModelState>(w->params.data(), kTotal, "mlp");
    OuterOptions o;
    o.kind = OuterOptimizer::kNesterov;
    o.lr = lr;
    o.momentum = mu;
    w->outer = std::make_unique<OuterStep>(o, kTotal);
  }
}

TEST(HierarchicalExchangeTest, FiveWorkersInTwoZonesEndBitIdenticalAtTheFlatMean) {
  auto workers = MakeWorkers(5);
  std::vector<double> mean(kTotal, 0.0);
  for (const auto& w : workers) {
    for (uint64_t i = 0; i < kTotal; ++i) mean[i] += w->params[i] / 5.0;
  }
  FakeStagePeers peers(ByAddress(workers));
  auto averagers = MakeExchangers(workers, &peers, Options());
  std::vector<AveragingStats> stats;
  RunAttempt(TwoSitePlan(workers), workers, averagers, {0, 1, 2, 3, 4}, &stats);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectAllEqual(workers, {0, 1, 2, 3, 4});
  for (int k = 0; k < 5; ++k) ASSERT_EQ(stats[k].stage_bytes_received.size(), 3u);
  for (uint64_t i = 0; i < kTotal; ++i) {
    EXPECT_NEAR(workers[0]->params[i], mean[i], 1e-6) << "element " << i;
  }
  // Only the heads cross zones: each reads half the model from the other
  // and the other half back averaged, one model's worth per zone. The others
  // read one model from their head (the pieces it holds it as).
  EXPECT_EQ(stats[0].stage_bytes_received[1] + stats[3].stage_bytes_received[1],
            2 * kTotal * sizeof(float));
  for (int k : {1, 2, 4}) {
    EXPECT_EQ(stats[k].stage_bytes_received[1], 0u);
    EXPECT_EQ(stats[k].stage_bytes_received[2], kTotal * sizeof(float));
  }
}

TEST(HierarchicalExchangeTest, Int8WithNesterovTravelsEncodedAtEveryLevelAndEndsBitIdentical) {
  auto workers = MakeWorkers(5);
  const float lr = 0.7f, mu = 0.9f;
  MakeTrained(workers, lr, mu);
  // The float64 reference: new = base + lr (1 + mu) x mean change (zero
  // momentum before).
  std::vector<double> mean_change(kTotal, 0.0);
  double max_change = 0;
  for (const auto& w : workers) {
    for (uint64_t i = 0; i < kTotal; ++i) {
      const double c = static_cast<double>(w->params[i]) - w->base[i];
      mean_change[i] += c / 5.0;
      max_change = std::max(max_change, std::fabs(c));
    }
  }
  absl::StatusOr<std::unique_ptr<Codec>> int8 = MakeCodec("int8");
  ASSERT_TRUE(int8.ok());
  FakeStagePeers peers(ByAddress(workers));
  auto averagers = MakeExchangers(workers, &peers, Options(), int8->get());
  std::vector<AveragingStats> stats;
  RunAttempt(TwoSitePlan(workers), workers, averagers, {0, 1, 2, 3, 4}, &stats);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectAllEqual(workers, {0, 1, 2, 3, 4});
  // Two levels of int8 (and the owners' re-encodings): each at most half a
  // quantization step of the block's largest value.
  const double tolerance = lr * (1 + mu) * 4 * max_change / 127;
  for (uint64_t i = 0; i < kTotal; ++i) {
    const double expected = workers[0]->base[i] + lr * (1 + mu) * mean_change[i];
    ASSERT_NEAR(workers[0]->params[i], expected, tolerance) << "element " << i;
  }
  // The heads' exchange across zones carries int8: about a quarter of fp32.
  const uint64_t across = stats[0].stage_bytes_received[1] + stats[3].stage_bytes_received[1];
  EXPECT_LT(across, 2 * kTotal * sizeof(float) * 3 / 10) << across;
  EXPECT_GT(across, 0u);
  // The momentum is the same on every worker once committed.
  for (auto& w : workers) w->outer->Commit(kRound);
  for (const auto& w : workers) EXPECT_EQ(w->outer->momentum(), workers[0]->outer->momentum());
}

TEST(HierarchicalExchangeTest, TrimmedMeanAcrossZonesHoldsAgainstAPoisoningWorker) {
  // Zones {0, 1, 2} and {3, 4, 5}; worker 1 sends its model scaled by 100.
  auto workers = MakeWorkers(6);
  std::vector<double> honest(kTotal, 0.0);
  for (int k : {0, 2, 3, 4, 5}) {
    for (uint64_t i = 0; i < kTotal; ++i) honest[i] += workers[k]->params[i] / 5.0;
  }
  for (float& x : workers[1]->params) x *= 100.0f;
  shoal::v1::RoundPlan plan;
  plan.set_round(kRound);
  plan.set_attempt(1);
  plan.set_total_elements(kTotal);
  for (const auto& w : workers) {
    auto* s = plan.add_slices();
    s->set_worker_id(w->id);
    s->set_peer_address(w->address);
  }
  auto* up = plan.mutable_hierarchy()->add_stages();
  up->set_kind(shoal::v1::HierarchyStage::AVERAGE);
  AddGroup(up, {0, 1, 2}, {1, 1, 1});
  AddGroup(up, {3, 4, 5}, {1, 1, 1});
  auto* across = plan.mutable_hierarchy()->add_stages();
  across->set_kind(shoal::v1::HierarchyStage::AVERAGE);
  AddGroup(across, {0, 3}, {3, 3});
  auto* down = plan.mutable_hierarchy()->add_stages();
  down->set_kind(shoal::v1::HierarchyStage::BROADCAST);
  AddGroup(down, {0, 1, 2}, {}, 0);
  AddGroup(down, {3, 4, 5}, {}, 3);
  FakeStagePeers peers(ByAddress(workers));
  auto averagers =
      MakeExchangers(workers, &peers, Options({AggregationSpec::Kind::kTrimmedMean, 1}));
  std::vector<AveragingStats> stats;
  RunAttempt(plan, workers, averagers, {0, 1, 2, 3, 4, 5}, &stats);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectAllEqual(workers, {0, 1, 2, 3, 4, 5});
  // Inside zone A the trimmed mean of three is the median (the poisoned
  // value is dropped); across zones each zone counts three times and one
  // unit is trimmed at each end. Honest values lie in [-1, 1]: the result
  // stays there, where the mean of the six would reach about 17.
  double worst = 0;
  for (uint64_t i = 0; i < kTotal; ++i) {
    EXPECT_LE(std::fabs(workers[0]->params[i]), 1.0f) << "element " << i;
    worst = std::max(worst, std::fabs(workers[0]->params[i] - honest[i]));
  }
  EXPECT_LT(worst, 1.5);
}

TEST(HierarchicalExchangeTest, MalformedHierarchiesAreInvalidArgumentAndWriteNothing) {
  auto workers = MakeWorkers(5);
  const std::vector<float> before = workers[0]->params;
  FakeStagePeers peers({});
  ExchangeParts parts;
  parts.store = &workers[0]->store;
  Exchanger averager(&peers, workers[0]->state.get(), {}, parts);
  using Edit = std::function<void(shoal::v1::RoundHierarchy*)>;
  const std::vector<std::pair<std::string, Edit>> edits = {
      {"member out of range",
       [](auto* h) { h->mutable_stages(0)->mutable_groups(0)->set_members(1, 9); }},
      {"member twice", [](auto* h) { h->mutable_stages(0)->mutable_groups(1)->set_members(0, 0); }},
      {"missing weight",
       [](auto* h) { h->mutable_stages(1)->mutable_groups(0)->mutable_weights()->RemoveLast(); }},
      {"zero weight", [](auto* h) { h->mutable_stages(1)->mutable_groups(0)->set_weights(0, 0); }},
      {"head not a member", [](auto* h) { h->mutable_stages(2)->mutable_groups(1)->set_head(0); }},
      {"group of one",
       [](auto* h) {
         h->mutable_stages(1)->mutable_groups(0)->mutable_members()->RemoveLast();
         h->mutable_stages(1)->mutable_groups(0)->mutable_weights()->RemoveLast();
       }},
      {"no kind",
       [](auto* h) {
         h->mutable_stages(0)->set_kind(shoal::v1::HierarchyStage::KIND_UNSPECIFIED);
       }},
  };
  for (const auto& [what, edit] : edits) {
    shoal::v1::RoundPlan plan = TwoSitePlan(workers);
    edit(plan.mutable_hierarchy());
    AveragingStats stats;
    const absl::Status s = averager.Average(plan, "w1", workers[0]->params.data(), nullptr, &stats);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
    EXPECT_EQ(workers[0]->params, before) << what;
  }
  // Not a participant.
  AveragingStats stats;
  EXPECT_EQ(averager.Average(TwoSitePlan(workers), "w9", workers[0]->params.data(), nullptr, &stats)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Attempt 2 of TwoSitePlan's round after w4 (zone B's head, index 3) was
// lost: zone A's group is the same; zone B is w5 alone, who leads it.
shoal::v1::RoundPlan PlanWithoutW4(const std::vector<std::unique_ptr<Worker>>& workers) {
  shoal::v1::RoundPlan plan;
  plan.set_round(kRound);
  plan.set_attempt(2);
  plan.set_total_elements(kTotal);
  for (int k : {0, 1, 2, 4}) {
    auto* s = plan.add_slices();
    s->set_worker_id(workers[k]->id);
    s->set_peer_address(workers[k]->address);
  }
  auto* up = plan.mutable_hierarchy()->add_stages();
  up->set_kind(shoal::v1::HierarchyStage::AVERAGE);
  AddGroup(up, {0, 1, 2}, {1, 1, 1});
  auto* across = plan.mutable_hierarchy()->add_stages();
  across->set_kind(shoal::v1::HierarchyStage::AVERAGE);
  AddGroup(across, {0, 3}, {3, 1});
  auto* down = plan.mutable_hierarchy()->add_stages();
  down->set_kind(shoal::v1::HierarchyStage::BROADCAST);
  AddGroup(down, {0, 1, 2}, {}, 0);
  return plan;
}

TEST(HierarchicalExchangeTest, GroupIdentitiesChangeWhereTheGroupOrItsInputsChange) {
  auto workers = MakeWorkers(5);
  const auto first = GroupIdentities(TwoSitePlan(workers));
  const auto second = GroupIdentities(PlanWithoutW4(workers));
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(second.size(), 3u);
  EXPECT_EQ(second[0][0], first[0][0]) << "zone A's group did not change";
  EXPECT_NE(second[1][0], first[1][0]) << "zone B's head and weight changed";
  EXPECT_NE(second[2][0], first[2][0]) << "the broadcast carries the new result";
  // Same plan, same identities; another round, other identities.
  EXPECT_EQ(GroupIdentities(TwoSitePlan(workers)), first);
  shoal::v1::RoundPlan later = TwoSitePlan(workers);
  later.set_round(kRound + 1);
  EXPECT_NE(GroupIdentities(later)[0][0], first[0][0]);
  // A weight is part of it, and so is what a member brings: with zone B's
  // group changed, the group across zones changes though its members and
  // weights are the same.
  shoal::v1::RoundPlan weighted = TwoSitePlan(workers);
  weighted.mutable_hierarchy()->mutable_stages(0)->mutable_groups(0)->set_weights(2, 2);
  EXPECT_NE(GroupIdentities(weighted)[0][0], first[0][0]);
  EXPECT_EQ(GroupIdentities(weighted)[0][1], first[0][1]);
  shoal::v1::RoundPlan regrouped = TwoSitePlan(workers);
  regrouped.mutable_hierarchy()->mutable_stages(0)->mutable_groups(1)->set_zone("b2");
  EXPECT_EQ(GroupIdentities(regrouped)[0][0], first[0][0]);
  EXPECT_NE(GroupIdentities(regrouped)[1][0], first[1][0]);
}

// The carried-group scenario (see below) with `codec` (null: fp32 models).
void CarryScenario(const Codec* codec) {
  auto workers = MakeWorkers(5);
  if (codec != nullptr) MakeTrained(workers, 0.7f, 0.9f);
  std::vector<std::vector<float>> trained;
  for (const auto& w : workers) trained.push_back(w->params);
  FakeStagePeers peers(ByAddress(workers));
  auto averagers = MakeExchangers(workers, &peers, Options(), codec);
  auto remake = [&](int k) {
    ExchangeParts parts;
    parts.store = &workers[k]->store;
    if (codec != nullptr) {
      parts.codec = codec;
      parts.outer = workers[k]->outer.get();
      parts.base = workers[k]->base.data();
    }
    return std::make_unique<Exchanger>(&peers, workers[k]->state.get(), Options(), parts);
  };
  std::vector<AveragingStats> stats;
  RunAttempt(TwoSitePlan(workers), workers, averagers, {0, 1, 2, 3, 4}, &stats);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  // w4 is lost. The survivors start attempt 2 from their trained models (as
  // the worker restores its contribution); w2 restarted meanwhile and kept
  // nothing, so it runs zone A's group again while w1 and w3 carry it.
  for (int k = 0; k < 5; ++k) workers[k]->params = trained[k];
  averagers[1] = remake(1);
  const shoal::v1::RoundPlan plan = PlanWithoutW4(workers);
  RunAttempt(plan, workers, averagers, {0, 1, 2, 4}, &stats);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(stats[0].stages_carried, 1u);
  EXPECT_EQ(stats[2].stages_carried, 1u);
  EXPECT_EQ(stats[1].stages_carried, 0u);
  EXPECT_EQ(stats[4].stages_carried, 0u);
  EXPECT_EQ(stats[0].stage_bytes_received[0], 0u) << "w1 read nothing for zone A's group";
  EXPECT_EQ(stats[2].stage_bytes_received[0], 0u);
  EXPECT_GT(stats[1].stage_bytes_received[0], 0u) << "w2 redid its slice and read the others'";
  EXPECT_GT(stats[0].stage_bytes_received[1], 0u) << "the heads average across zones again";
  ExpectAllEqual(workers, {0, 1, 2, 4});
  const std::vector<float> carried = workers[0]->params;

  // The same attempt with nothing carried gives the same bits.
  for (int k = 0; k < 5; ++k) {
    workers[k]->params = trained[k];
    averagers[k] = remake(k);
  }
  RunAttempt(plan, workers, averagers, {0, 1, 2, 4}, &stats);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int k : {0, 1, 2, 4}) EXPECT_EQ(stats[k].stages_carried, 0u);
  EXPECT_EQ(std::memcmp(workers[0]->params.data(), carried.data(), kTotal * sizeof(float)), 0)
      << "carrying a group changed the result";
}

TEST(HierarchicalExchangeTest, ANewAttemptCarriesTheUnchangedZoneAndEndsBitIdentical) {
  CarryScenario(nullptr);
}

TEST(HierarchicalExchangeTest, ANewAttemptCarriesTheUnchangedZoneWithInt8) {
  absl::StatusOr<std::unique_ptr<Codec>> int8 = MakeCodec("int8");
  ASSERT_TRUE(int8.ok());
  CarryScenario(int8->get());
}

}  // namespace
}  // namespace shoal::worker
