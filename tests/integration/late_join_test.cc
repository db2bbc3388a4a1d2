// Integration tests of a late joiner's pull over real gRPC: three holders
// (ModelState with a bound snapshot + PeerService, optionally paced by a
// RateLimiter as --upload_rate_mbps does) on 127.0.0.1:0, a GrpcPeerClient,
// ModelSyncer, and a real in-process CheckpointServer as the fallback.
// Every wait is a poll with a deadline.
#include <grpc/grpc.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/progress.h"
#include "common/rate_limiter.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/checkpoint/checkpoint_server.h"
#include "services/worker/core/model_state.h"
#include "services/worker/model_syncer.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"
#include "tests/support/faulty_peer.h"
#include "tests/support/test_support.h"

namespace shoal::worker {
namespace {

using ::shoal::testing::TempDir;
using ::shoal::testing::WaitUntil;
using ::testing::HasSubstr;

// See peer_exchange_test: keeps gRPC initialised for the whole binary.
[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

constexpr uint64_t kRound = 12;
// 1.5 M elements (6 MB) in four layers; 512 KiB digest pieces.
constexpr uint64_t kTotal = 1'500'000;
constexpr uint64_t kPieceElements = 128 * 1024;

std::vector<LayerSpan> Layers() {
  return {{"fc1.weight", 0, 1'200'000},
          {"fc1.bias", 1'200'000, 1'000},
          {"fc2.weight", 1'201'000, 298'000},
          {"fc2.bias", 1'499'000, 1'000}};
}

std::vector<float> RandomModel(uint32_t seed) { return testing::RandomModel(kTotal, seed); }

// One worker holding the averaged model of kRound in its snapshot and
// serving it, paced at `bytes_per_second` (0: unpaced), behind a FaultyPeer
// that forges its SNAPSHOT reads when a test says so.
struct Holder {
  Holder(const std::vector<float>& model, const std::string& hash, double bytes_per_second)
      : params(model),
        snapshot(model),
        limiter(bytes_per_second),
        service(&state, &limiter),
        faulty(&service,
               [this](const shoal::v1::ReadSliceRequest& request)
                   -> std::shared_ptr<const std::vector<float>> {
                 if (request.kind() != shoal::v1::SNAPSHOT || request.round() != kRound)
                   return nullptr;
                 return std::shared_ptr<const std::vector<float>>(std::shared_ptr<void>(),
                                                                  &snapshot);
               }) {
    state.Bind(params.data(), params.size(), "mlp");
    EXPECT_TRUE(state.SetLayers(Layers()).ok());
    state.SetDigestPieceElements(kPieceElements);
    state.BindSnapshot(snapshot.data());
    state.SetSnapshot(kRound);
    state.SetModel(kRound, hash);
    auto started = GrpcServer::Start("127.0.0.1:0", {&faulty});
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) {
      server = std::move(*started);
      address = server->address();
    }
  }
  ~Holder() { Stop(); }
  void Stop() {
    state.SetShuttingDown();
    if (server != nullptr) server->Shutdown(absl::ZeroDuration());
  }

  std::vector<float> params;
  std::vector<float> snapshot;
  ModelState state;
  RateLimiter limiter;
  PeerService service;
  ::shoal::testing::FaultyPeer faulty;
  std::unique_ptr<GrpcServer> server;
  std::string address;
};

class LateJoinTest : public ::testing::Test {
 protected:
  LateJoinTest() : model_(RandomModel(42)), hash_(Sha256Hex(model_.data(), kTotal * 4)) {}

  // Starts `n` holders, each paced at `bytes_per_second`.
  void StartHolders(int n, double bytes_per_second) {
    for (int i = 0; i < n; ++i) {
      holders_.push_back(std::make_unique<Holder>(model_, hash_, bytes_per_second));
      ASSERT_NE(holders_.back()->server, nullptr);
      addresses_.push_back(holders_.back()->address);
    }
  }

  absl::Status Sync(const CheckpointFallback& fallback = {}) {
    dst_.assign(kTotal, 0.0f);
    ModelSyncer syncer(&client_, options_);
    return syncer.Sync(kRound, hash_, addresses_, dst_.data(), kTotal, "joiner", &progress_,
                       fallback, &stats_);
  }

  // Sync on another thread; `during` runs once `fraction` of the model has
  // arrived.
  absl::Status SyncAndMeanwhile(double fraction, const std::function<void()>& during,
                                const CheckpointFallback& fallback = {}) {
    absl::Status result;
    std::atomic<bool> done{false};
    std::thread sync([&] {
      result = Sync(fallback);
      done = true;
    });
    EXPECT_TRUE(WaitUntil(
        [&] { return done.load() || progress_.bytes_done.load() >= fraction * kTotal * 4; },
        absl::Seconds(30)));
    EXPECT_FALSE(done.load()) << "the pull ended before the fault";
    during();
    sync.join();
    return result;
  }

  void ExpectBitIdentical() {
    ASSERT_EQ(dst_.size(), model_.size());
    EXPECT_EQ(std::memcmp(dst_.data(), model_.data(), kTotal * sizeof(float)), 0);
    EXPECT_EQ(Sha256Hex(dst_.data(), kTotal * 4), hash_);
    EXPECT_FALSE(progress_.syncing.load());
    EXPECT_EQ(progress_.bytes_done.load(), kTotal * 4);
  }

  // A checkpoint store holding the model of kRound, layers as in Layers().
  std::string StartStore() {
    checkpoint::CheckpointServerOptions o;
    o.listen = "127.0.0.1:0";
    o.store.data_dir = dir_.path() + "/store";
    auto server = checkpoint::CheckpointServer::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "";
    store_server_ = std::move(*server);
    store_ = std::make_unique<checkpoint::GrpcCheckpointClient>(store_server_->address());
    shoal::v1::Manifest m;
    m.set_run_id("run");
    m.set_round(kRound);
    m.set_model("mlp");
    std::vector<checkpoint::ByteSpan> spans;
    for (const LayerSpan& l : Layers()) {
      auto* e = m.add_layers();
      e->set_name(l.name);
      e->set_dtype("float32");
      e->add_shape(static_cast<int64_t>(l.elements));
      spans.emplace_back(reinterpret_cast<const uint8_t*>(model_.data() + l.offset),
                         l.elements * sizeof(float));
    }
    EXPECT_TRUE(checkpoint::CompleteManifest(&m, spans).ok());
    auto info = store_->Upload(m, spans);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->id() : "";
  }

  const std::vector<float> model_;
  const std::string hash_;
  TempDir dir_;
  std::unique_ptr<checkpoint::CheckpointServer> store_server_;
  std::unique_ptr<checkpoint::GrpcCheckpointClient> store_;
  std::vector<std::unique_ptr<Holder>> holders_;
  std::vector<std::string> addresses_;
  GrpcPeerClient client_;
  SyncOptions options_;
  SyncProgress progress_;
  SyncStats stats_;
  std::vector<float> dst_;
};

TEST_F(LateJoinTest, ManifestDescribesTheSnapshot) {
  StartHolders(1, 0);
  auto m = client_.GetManifest(addresses_[0], kRound, "joiner", absl::Seconds(10), nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->round(), kRound);
  EXPECT_EQ(m->model_hash(), hash_);
  EXPECT_EQ(m->total_elements(), kTotal);
  EXPECT_EQ(m->piece_elements(), kPieceElements);
  ASSERT_EQ(m->layers_size(), 4);
  EXPECT_EQ(m->layers(2).name(), "fc2.weight");
  EXPECT_EQ(m->layers(2).offset(), 1'201'000u);
  EXPECT_EQ(m->layers(2).sha256(), Sha256Hex(model_.data() + 1'201'000, 298'000 * 4));
  EXPECT_EQ(m->layers(0).piece_sha256_size(), 10);  // 1.2 M / 128 Ki, rounded up
  EXPECT_EQ(m->layers(1).piece_sha256_size(), 0);

  auto other = client_.GetManifest(addresses_[0], kRound + 1, "joiner", absl::Seconds(10), nullptr);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
  holders_[0]->state.BeginSnapshotUpdate();
  auto replacing = client_.GetManifest(addresses_[0], kRound, "joiner", absl::Seconds(10), nullptr);
  EXPECT_EQ(replacing.status().code(), absl::StatusCode::kUnavailable) << replacing.status();
}

TEST_F(LateJoinTest, PullsABitIdenticalModelFromThreeHolders) {
  StartHolders(3, 8e6);
  ::testing::internal::CaptureStderr();
  const absl::Status synced = Sync();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(synced.ok()) << synced;
  ExpectBitIdentical();
  // Progress in the log: a line per layer (at most one a second), the last
  // at 100% with the time it took.
  EXPECT_NE(log.find("pull of round"), std::string::npos) << log;
  EXPECT_NE(log.find("layers); " + FormatBytes(kTotal * 4) + " of " + FormatBytes(kTotal * 4) +
                     " (100%), done in"),
            std::string::npos)
      << log;
  uint64_t bytes = 0;
  for (const PeerSyncStats& p : stats_.peers) {
    EXPECT_GT(p.bytes, 0u) << p.address << " served nothing";
    EXPECT_GT(p.rate, 0) << p.address << " never measured";
    bytes += p.bytes;
  }
  EXPECT_EQ(bytes, kTotal * 4);
  EXPECT_EQ(stats_.pieces_refetched, 0);
}

TEST_F(LateJoinTest, CorruptHolderIsDetectedAndRefetched) {
  StartHolders(3, 8e6);
  holders_[1]->faulty.set_fault(::shoal::testing::FaultyPeer::Fault::kForge);
  ASSERT_TRUE(Sync().ok());
  ExpectBitIdentical();
  const PeerSyncStats& bad = stats_.peers[1];
  EXPECT_GE(bad.corrupt_pieces, 1);
  EXPECT_EQ(bad.bytes, 0u);
  EXPECT_EQ(bad.rank, 2);
  EXPECT_GE(stats_.pieces_refetched, 1);
  EXPECT_EQ(stats_.peers[0].bytes + stats_.peers[2].bytes, kTotal * 4);
}

TEST_F(LateJoinTest, HolderShutDownMidTransfer) {
  StartHolders(3, 2e6);  // ~1 s from three holders
  absl::Status s = SyncAndMeanwhile(0.3, [&] { holders_[2]->Stop(); });
  ASSERT_TRUE(s.ok()) << s;
  ExpectBitIdentical();
  EXPECT_GE(stats_.peers[2].failed_reads + stats_.peers[2].stalls, 1);
  EXPECT_GT(stats_.peers[0].bytes, 0u);
  EXPECT_GT(stats_.peers[1].bytes, 0u);
  EXPECT_EQ(stats_.bytes_from_store, 0u);
}

TEST_F(LateJoinTest, NoHolderLeftFallsBackToTheCheckpointStore) {
  const std::string id = StartStore();
  ASSERT_FALSE(id.empty());
  StartHolders(3, 2e6);
  CheckpointFallback fallback;
  fallback.client = store_.get();
  fallback.run_id = "run";
  absl::Status s = SyncAndMeanwhile(
      0.2,
      [&] {
        for (auto& h : holders_) h->Stop();
      },
      fallback);
  ASSERT_TRUE(s.ok()) << s;
  ExpectBitIdentical();
  EXPECT_GT(stats_.bytes_from_store, 0u);
  EXPECT_LT(stats_.bytes_from_store, kTotal * 4);
  EXPECT_EQ(stats_.checkpoint_id, id);
  for (const PeerSyncStats& p : stats_.peers) EXPECT_TRUE(p.dropped) << p.address;
}

TEST_F(LateJoinTest, NoHolderAtAllReadsEverythingFromTheStore) {
  const std::string id = StartStore();
  ASSERT_FALSE(id.empty());
  StartHolders(2, 0);
  for (auto& h : holders_) h->Stop();
  CheckpointFallback fallback;
  fallback.client = store_.get();
  fallback.checkpoint_id = id;
  ASSERT_TRUE(Sync(fallback).ok());
  ExpectBitIdentical();
  EXPECT_EQ(stats_.bytes_from_store, kTotal * 4);
}

TEST_F(LateJoinTest, NothingLeftIsUnavailable) {
  StartHolders(2, 0);
  for (auto& h : holders_) h->Stop();
  absl::Status s = Sync();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("round 12"));
}

}  // namespace
}  // namespace shoal::worker
