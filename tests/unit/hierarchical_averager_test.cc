// The hierarchical exchange (HierarchicalAverager, docs/SUPERNODES.md) with
// in-memory workers: a fake PeerClient serves Peer.ReadEncoded from each
// worker's EncodedStore in small pieces with CRC-32C, as PeerService does,
// stages included (a stage not reached yet is UNAVAILABLE and retried).
// Five workers in two zones end bit-identical and equal to the flat mean up
// to float rounding; a plan without a hierarchy goes to the flat averager;
// a malformed hierarchy is INVALID_ARGUMENT and leaves the model as it was;
// a new attempt after a lost participant carries the groups that did not
// change (same identity) and still ends bit-identical.
#include "services/worker/hierarchical_averager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

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

// Counts the plans handed to it.
class CountingAverager : public Averager {
 public:
  const char* name() const override { return "flat"; }
  absl::Status Average(const shoal::v1::RoundPlan&, const std::string&, float*, CancellationToken*,
                       AveragingStats*) override {
    ++calls;
    return absl::OkStatus();
  }
  int calls = 0;
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

TEST(HierarchicalAveragerTest, FiveWorkersInTwoZonesEndBitIdenticalAtTheFlatMean) {
  auto workers = MakeWorkers(5);
  std::vector<double> mean(kTotal, 0.0);
  for (const auto& w : workers) {
    for (uint64_t i = 0; i < kTotal; ++i) mean[i] += w->params[i] / 5.0;
  }
  std::map<std::string, Worker*> by_address;
  for (const auto& w : workers) by_address[w->address] = w.get();
  FakeStagePeers peers(by_address);
  const shoal::v1::RoundPlan plan = TwoSitePlan(workers);
  ExchangeOptions options;
  options.timeout = absl::Seconds(30);
  std::vector<absl::Status> status(workers.size());
  std::vector<AveragingStats> stats(workers.size());
  std::vector<std::thread> threads;
  CountingAverager flat;
  for (size_t k = 0; k < workers.size(); ++k) {
    threads.emplace_back([&, k] {
      HierarchicalAverager averager(&peers, workers[k]->state.get(), &workers[k]->store, options,
                                    &flat);
      status[k] =
          averager.Average(plan, workers[k]->id, workers[k]->params.data(), nullptr, &stats[k]);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(flat.calls, 0);
  for (size_t k = 0; k < workers.size(); ++k) {
    ASSERT_TRUE(status[k].ok()) << workers[k]->id << ": " << status[k];
    EXPECT_EQ(
        std::memcmp(workers[k]->params.data(), workers[0]->params.data(), kTotal * sizeof(float)),
        0)
        << workers[k]->id << " differs from w1";
    ASSERT_EQ(stats[k].stage_bytes_received.size(), 3u);
  }
  for (uint64_t i = 0; i < kTotal; ++i) {
    EXPECT_NEAR(workers[0]->params[i], mean[i], 1e-6) << "element " << i;
  }
  // Only the heads cross zones: each reads half the model from the other
  // and the other half back averaged, one model's worth per zone. The others
  // read one model from their head.
  EXPECT_EQ(stats[0].stage_bytes_received[1] + stats[3].stage_bytes_received[1],
            2 * kTotal * sizeof(float));
  for (int k : {1, 2, 4}) {
    EXPECT_EQ(stats[k].stage_bytes_received[1], 0u);
    EXPECT_EQ(stats[k].stage_bytes_received[2], kTotal * sizeof(float));
  }
}

TEST(HierarchicalAveragerTest, APlanWithoutHierarchyIsFlat) {
  auto workers = MakeWorkers(2);
  FakeStagePeers peers({});
  CountingAverager flat;
  HierarchicalAverager averager(&peers, workers[0]->state.get(), &workers[0]->store, {}, &flat);
  shoal::v1::RoundPlan plan = TwoSitePlan(workers);
  plan.clear_hierarchy();
  AveragingStats stats;
  EXPECT_TRUE(averager.Average(plan, "w1", workers[0]->params.data(), nullptr, &stats).ok());
  EXPECT_EQ(flat.calls, 1);
}

TEST(HierarchicalAveragerTest, MalformedHierarchiesAreInvalidArgumentAndWriteNothing) {
  auto workers = MakeWorkers(5);
  const std::vector<float> before = workers[0]->params;
  FakeStagePeers peers({});
  CountingAverager flat;
  HierarchicalAverager averager(&peers, workers[0]->state.get(), &workers[0]->store, {}, &flat);
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
  EXPECT_EQ(flat.calls, 0);
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

TEST(HierarchicalAveragerTest, GroupIdentitiesChangeWhereTheGroupOrItsInputsChange) {
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

// Runs `plan` on `averagers[k]` for the workers `who` (indices into
// workers) in parallel.
void RunAttempt(const shoal::v1::RoundPlan& plan, std::vector<std::unique_ptr<Worker>>& workers,
                std::vector<std::unique_ptr<HierarchicalAverager>>& averagers,
                const std::vector<int>& who, std::vector<AveragingStats>* stats) {
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

TEST(HierarchicalAveragerTest, ANewAttemptCarriesTheUnchangedZoneAndEndsBitIdentical) {
  auto workers = MakeWorkers(5);
  std::vector<std::vector<float>> trained;
  for (const auto& w : workers) trained.push_back(w->params);
  std::map<std::string, Worker*> by_address;
  for (const auto& w : workers) by_address[w->address] = w.get();
  FakeStagePeers peers(by_address);
  ExchangeOptions options;
  options.timeout = absl::Seconds(30);
  CountingAverager flat;
  auto make = [&](int k) {
    return std::make_unique<HierarchicalAverager>(&peers, workers[k]->state.get(),
                                                  &workers[k]->store, options, &flat);
  };
  std::vector<std::unique_ptr<HierarchicalAverager>> averagers;
  for (int k = 0; k < 5; ++k) averagers.push_back(make(k));
  std::vector<AveragingStats> stats;
  RunAttempt(TwoSitePlan(workers), workers, averagers, {0, 1, 2, 3, 4}, &stats);
  ASSERT_FALSE(HasFatalFailure());

  // w4 is lost. The survivors start attempt 2 from their trained models (as
  // the worker restores its contribution); w2 restarted meanwhile and kept
  // nothing, so it runs zone A's group again while w1 and w3 carry it.
  for (int k = 0; k < 5; ++k) workers[k]->params = trained[k];
  averagers[1] = make(1);
  const shoal::v1::RoundPlan plan = PlanWithoutW4(workers);
  RunAttempt(plan, workers, averagers, {0, 1, 2, 4}, &stats);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(stats[0].stages_carried, 1u);
  EXPECT_EQ(stats[2].stages_carried, 1u);
  EXPECT_EQ(stats[1].stages_carried, 0u);
  EXPECT_EQ(stats[4].stages_carried, 0u);
  EXPECT_EQ(stats[0].stage_bytes_received[0], 0u) << "w1 read nothing for zone A's group";
  EXPECT_EQ(stats[2].stage_bytes_received[0], 0u);
  EXPECT_GT(stats[1].stage_bytes_received[0], 0u) << "w2 redid its slice and read the others'";
  EXPECT_GT(stats[0].stage_bytes_received[1], 0u) << "the heads average across zones again";
  std::vector<std::vector<float>> carried;
  for (int k : {0, 1, 2, 4}) carried.push_back(workers[k]->params);
  for (const auto& p : carried) {
    EXPECT_EQ(std::memcmp(p.data(), carried[0].data(), kTotal * sizeof(float)), 0);
  }

  // The same attempt with nothing carried gives the same bits.
  for (int k = 0; k < 5; ++k) {
    workers[k]->params = trained[k];
    averagers[k] = make(k);
  }
  RunAttempt(plan, workers, averagers, {0, 1, 2, 4}, &stats);
  ASSERT_FALSE(HasFatalFailure());
  for (int k : {0, 1, 2, 4}) EXPECT_EQ(stats[k].stages_carried, 0u);
  EXPECT_EQ(std::memcmp(workers[0]->params.data(), carried[0].data(), kTotal * sizeof(float)), 0)
      << "carrying a group changed the result";
}

}  // namespace
}  // namespace shoal::worker
