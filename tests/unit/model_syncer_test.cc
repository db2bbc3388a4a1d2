// Unit tests of the catch-up pull (ModelSyncer) with in-memory holders: a
// fake PeerClient serves each holder's model in checked chunks (as the gRPC
// peer service and client do) and its manifest (ComputeModelManifest, as
// ModelState does); a fake CheckpointClient plays the store. Time for
// throughput and stalls comes from a fake clock. No sockets.
#include "services/worker/model_syncer.h"

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/chunk_codec.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/core/model_state.h"
#include "tests/support/test_support.h"

namespace shoal::worker {
namespace {

using ::shoal::testing::WaitUntil;
using ::shoal::v1::ReadSliceRequest;
using ::shoal::v1::TensorChunk;
using ::testing::HasSubstr;

constexpr uint64_t kRound = 7;
constexpr uint64_t kPieceElements = 16 * 1024;  // 64 KiB digest pieces
constexpr size_t kChunkElements = 4 * 1024;     // 16 KiB chunks

// A small MLP-like layer table: two big layers (several pieces), two small.
std::vector<LayerSpan> Layers() {
  return {{"fc1.weight", 0, 100'000},
          {"fc1.bias", 100'000, 100},
          {"fc2.weight", 100'100, 40'000},
          {"fc2.bias", 140'100, 10}};
}
constexpr uint64_t kTotal = 140'110;

std::vector<float> RandomModel(uint32_t seed) { return testing::RandomModel(kTotal, seed); }

std::string HashOf(const std::vector<float>& v) {
  return Sha256Hex(v.data(), v.size() * sizeof(float));
}

struct Holder {
  enum Mode { kGood, kCorrupt, kDown, kReadsFail };
  std::vector<float> model;
  Mode mode = kGood;
  // The first read to this holder waits (no byte) until it is cancelled.
  bool stall_first_read = false;
  // The first read to this holder fails with UNAVAILABLE (a blip).
  bool fail_first_read = false;
  // Its manifest's digest of layer 0 is wrong (its piece digests are right).
  bool bad_layer_digest = false;
  // Describes the model as one layer "all" (a worker whose layer table
  // was never set).
  bool single_layer = false;
  // Its manifest request gets no answer until the caller cancels it.
  bool hold_manifest = false;
};

// Counts a call in flight for its scope.
class InFlight {
 public:
  explicit InFlight(std::atomic<int>* n) : n_(n) { ++*n_; }
  ~InFlight() { --*n_; }

 private:
  std::atomic<int>* const n_;
};

// Routes calls to in-memory holders. Thread-safe.
class FakePeers : public PeerClient {
 public:
  explicit FakePeers(std::map<std::string, Holder> holders) : holders_(std::move(holders)) {}

  absl::Status ReadSlice(const std::string& address, const ReadSliceRequest& request,
                         absl::Duration timeout,
                         const std::function<bool(const ChunkView&)>& on_chunk) override {
    return ReadSliceCancellable(address, request, timeout, nullptr, on_chunk);
  }

  absl::Status ReadSliceCancellable(
      const std::string& address, const ReadSliceRequest& request, absl::Duration timeout,
      CancellationToken* canceller,
      const std::function<bool(const ChunkView&)>& on_chunk) override {
    InFlight in_flight(&reads_in_flight_);
    auto it = holders_.find(address);
    if (it == holders_.end()) return absl::UnavailableError("no such peer");
    const Holder& h = it->second;
    bool stall = false;
    {
      absl::MutexLock lock(&mu_);
      reads_[address]++;
      if (h.stall_first_read && reads_[address] == 1) {
        stall = true;
        stalled_begin_ = request.begin();
        stalled_end_ = request.end();
      }
      // Hold every read until enough holders have one (so that each of
      // them takes part, however the manifests' answers interleave).
      auto enough = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return static_cast<int>(reads_.size()) >= wait_for_holders_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    }
    if (h.fail_first_read && reads(address) == 1) return absl::UnavailableError("blip");
    if (h.mode == Holder::kDown || h.mode == Holder::kReadsFail) {
      return absl::UnavailableError(absl::StrCat("peer ", address, " is gone"));
    }
    if (request.kind() != shoal::v1::SNAPSHOT || request.round() != kRound) {
      return absl::FailedPreconditionError("wrong read");
    }
    if (stall) {
      absl::Notification cancelled;
      const uint64_t hook = canceller ? canceller->Register([&] { cancelled.Notify(); }) : 0;
      stall_started_.Notify();
      const bool got = cancelled.WaitForNotificationWithTimeout(absl::Seconds(30));
      if (canceller != nullptr) canceller->Unregister(hook);
      stall_cancelled_ = got;
      return absl::CancelledError("stalled read cancelled");
    }
    ChunkReceiver receiver(request.round(), request.begin(), request.end());
    for (uint64_t b = request.begin(); b < request.end(); b += kChunkElements) {
      const size_t count = std::min<uint64_t>(kChunkElements, request.end() - b);
      TensorChunk chunk;
      EncodeChunk(request.round(), b, h.model.data() + b, count, &chunk);
      if (h.mode == Holder::kCorrupt) {
        // Wrong bytes, right CRC: only the digests can tell.
        (*chunk.mutable_data())[0] ^= 0x40;
        chunk.set_crc32c(Crc32c(chunk.data().data(), chunk.data().size()));
      }
      absl::StatusOr<ChunkView> view = receiver.Accept(chunk);
      if (!view.ok()) return view.status();
      if (!on_chunk(*view)) return absl::CancelledError("cancelled by the caller");
    }
    return receiver.Finish();
  }

  absl::StatusOr<shoal::v1::ModelManifest> GetManifest(const std::string& address, uint64_t round,
                                                       const std::string& reader_id,
                                                       absl::Duration timeout,
                                                       CancellationToken* canceller) override {
    InFlight in_flight(&manifests_in_flight_);
    auto it = holders_.find(address);
    if (it == holders_.end() || it->second.mode == Holder::kDown) {
      return absl::UnavailableError(absl::StrCat("peer ", address, " is gone"));
    }
    if (it->second.hold_manifest) {
      absl::Notification cancelled;
      const uint64_t hook = canceller ? canceller->Register([&] { cancelled.Notify(); }) : 0;
      manifest_cancelled_ = cancelled.WaitForNotificationWithTimeout(absl::Seconds(30));
      if (canceller != nullptr) canceller->Unregister(hook);
      return absl::CancelledError("held manifest request cancelled");
    }
    if (round != kRound) return absl::FailedPreconditionError("another round");
    const std::vector<LayerSpan> layers =
        it->second.single_layer ? std::vector<LayerSpan>{{"all", 0, kTotal}} : Layers();
    shoal::v1::ModelManifest m =
        ComputeModelManifest(it->second.model.data(), kTotal, layers, kPieceElements, round, "");
    if (it->second.bad_layer_digest) m.mutable_layers(0)->set_sha256(std::string(64, '0'));
    return m;
  }

  absl::StatusOr<shoal::v1::PeerInfo> Probe(const std::string& address,
                                            absl::Duration timeout) override {
    return shoal::v1::PeerInfo();
  }

  // Reads start only once this many holders have been asked for one.
  void set_wait_for_holders(int n) {
    absl::MutexLock lock(&mu_);
    wait_for_holders_ = n;
  }

  int reads(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return reads_[address];
  }
  absl::Notification& stall_started() { return stall_started_; }
  // Reads and manifest requests still inside this client.
  int reads_in_flight() const { return reads_in_flight_.load(); }
  int manifests_in_flight() const { return manifests_in_flight_.load(); }
  bool manifest_cancelled() const { return manifest_cancelled_.load(); }
  bool stall_cancelled() const { return stall_cancelled_.load(); }
  uint64_t stalled_bytes() {
    absl::MutexLock lock(&mu_);
    return (stalled_end_ - stalled_begin_) * sizeof(float);
  }

 private:
  const std::map<std::string, Holder> holders_;
  absl::Mutex mu_;
  std::map<std::string, int> reads_ ABSL_GUARDED_BY(mu_);
  int wait_for_holders_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stalled_begin_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stalled_end_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stall_started_;
  std::atomic<bool> stall_cancelled_{false};
  std::atomic<int> reads_in_flight_{0};
  std::atomic<int> manifests_in_flight_{0};
  std::atomic<bool> manifest_cancelled_{false};
};

// A store holding checkpoints of whole models, layers as in Layers().
class FakeStore : public checkpoint::CheckpointClient {
 public:
  // `with_momentum`: an outer optimizer state layer follows the model's,
  // as a nesterov run's checkpoints have (reading it is out of range here).
  void Add(const std::string& id, uint64_t round, const std::vector<float>& model,
           bool with_model_hash = true, bool with_momentum = false) {
    shoal::v1::Manifest m;
    m.set_id(id);
    m.set_run_id("run");
    m.set_round(round);
    m.set_model("mlp");
    if (with_model_hash) m.set_model_sha256(HashOf(model));
    for (const LayerSpan& l : Layers()) {
      auto* e = m.add_layers();
      e->set_name(l.name);
      e->set_dtype("float32");
      e->add_shape(static_cast<int64_t>(l.elements));
      e->set_bytes(l.elements * sizeof(float));
      e->set_sha256(Sha256Hex(model.data() + l.offset, l.elements * sizeof(float)));
    }
    if (with_momentum) {
      auto* e = m.add_layers();
      e->set_name("outer.momentum");
      e->set_dtype("float32");
      e->add_shape(static_cast<int64_t>(model.size()));
      e->set_bytes(model.size() * sizeof(float));
      e->set_sha256(std::string(64, 'a'));
      e->set_optimizer_state(true);
    }
    checkpoints_[id] = {m, model};
  }

  absl::StatusOr<shoal::v1::CheckpointInfo> Upload(
      const shoal::v1::Manifest& manifest, const std::vector<checkpoint::ByteSpan>&) override {
    return absl::UnimplementedError("read-only fake");
  }
  absl::StatusOr<std::vector<shoal::v1::CheckpointInfo>> List(const std::string& run_id) override {
    std::vector<shoal::v1::CheckpointInfo> list;
    for (const auto& [id, c] : checkpoints_) {
      shoal::v1::CheckpointInfo info;
      info.set_id(id);
      info.set_run_id(c.manifest.run_id());
      info.set_round(c.manifest.round());
      list.push_back(info);
    }
    return list;
  }
  absl::StatusOr<shoal::v1::Manifest> GetManifest(const std::string& id) override {
    auto it = checkpoints_.find(id);
    if (it == checkpoints_.end()) return absl::NotFoundError(id);
    return it->second.manifest;
  }
  absl::Status ReadLayer(const std::string& id, uint32_t layer, uint64_t offset, uint64_t length,
                         const checkpoint::LayerSink& sink) override {
    auto it = checkpoints_.find(id);
    if (it == checkpoints_.end()) return absl::NotFoundError(id);
    const LayerSpan l = Layers().at(layer);
    const auto* bytes = reinterpret_cast<const uint8_t*>(it->second.model.data() + l.offset);
    const uint64_t size = l.elements * sizeof(float);
    if (length == 0) length = size - offset;
    if (offset + length > size) return absl::OutOfRangeError("past the layer");
    reads_++;
    for (uint64_t b = offset; b < offset + length; b += 10'000) {
      const uint64_t n = std::min<uint64_t>(10'000, offset + length - b);
      if (!sink(b, checkpoint::ByteSpan(bytes + b, n))) return absl::CancelledError("sink");
    }
    return absl::OkStatus();
  }
  absl::Status Delete(const std::string&) override { return absl::UnimplementedError("fake"); }

  int reads() const { return reads_.load(); }

 private:
  struct Checkpoint {
    shoal::v1::Manifest manifest;
    std::vector<float> model;
  };
  std::map<std::string, Checkpoint> checkpoints_;
  std::atomic<int> reads_{0};
};

// A FakeClock that counts how often it is read (the syncer reads it once
// per stall check).
class CountingClock : public Clock {
 public:
  absl::Time Now() const override {
    calls_++;
    return clock_.Now();
  }
  void Advance(absl::Duration d) { clock_.Advance(d); }
  int calls() const { return calls_.load(); }

 private:
  FakeClock clock_;
  mutable std::atomic<int> calls_{0};
};

class ModelSyncerTest : public ::testing::Test {
 protected:
  ModelSyncerTest() : model_(RandomModel(1)), hash_(HashOf(model_)) {
    options_.clock = &clock_;
    options_.poll_interval = absl::Milliseconds(2);
    options_.stall_timeout = absl::Seconds(5);
  }

  std::map<std::string, Holder> Holders(int n) {
    std::map<std::string, Holder> h;
    for (int i = 1; i <= n; ++i) h[absl::StrCat("w", i)] = Holder{model_, Holder::kGood, false};
    return h;
  }

  absl::Status Sync(PeerClient* peers, const std::vector<std::string>& holders,
                    const CheckpointFallback& fallback = {}) {
    dst_.assign(kTotal, 0.0f);
    ModelSyncer syncer(peers, options_);
    return syncer.Sync(kRound, hash_, holders, dst_.data(), kTotal, "w9", &progress_, fallback,
                       &stats_);
  }

  void ExpectBitIdentical() {
    ASSERT_EQ(dst_.size(), model_.size());
    EXPECT_EQ(std::memcmp(dst_.data(), model_.data(), kTotal * sizeof(float)), 0);
    EXPECT_EQ(HashOf(dst_), hash_);
    EXPECT_EQ(progress_.bytes_done.load(), kTotal * sizeof(float));
    EXPECT_FALSE(progress_.syncing.load());
  }

  const std::vector<float> model_;
  const std::string hash_;
  CountingClock clock_;
  SyncOptions options_;
  SyncProgress progress_;
  SyncStats stats_;
  std::vector<float> dst_;
};

TEST_F(ModelSyncerTest, PullsABitIdenticalModelFromThreeHolders) {
  FakePeers peers(Holders(3));
  peers.set_wait_for_holders(3);  // the reads overlap: all three serve
  ASSERT_TRUE(Sync(&peers, {"w1", "w2", "w3"}).ok());
  ExpectBitIdentical();
  ASSERT_EQ(stats_.peers.size(), 3u);
  uint64_t bytes = 0;
  for (const PeerSyncStats& p : stats_.peers) {
    EXPECT_TRUE(p.used) << p.address << ": " << p.why;
    EXPECT_FALSE(p.dropped) << p.address;
    EXPECT_GT(p.bytes, 0u) << p.address;
    bytes += p.bytes;
  }
  EXPECT_EQ(bytes, kTotal * sizeof(float));
  EXPECT_EQ(stats_.bytes_from_store, 0u);
  EXPECT_EQ(stats_.pieces_refetched, 0);
  EXPECT_EQ(stats_.attempts, 1);
}

TEST_F(ModelSyncerTest, CorruptHolderIsCaughtRefetchedElsewhereAndRankedDown) {
  auto holders = Holders(3);
  holders["w2"].mode = Holder::kCorrupt;
  FakePeers peers(holders);
  peers.set_wait_for_holders(3);
  ASSERT_TRUE(Sync(&peers, {"w1", "w2", "w3"}).ok());
  ExpectBitIdentical();
  const PeerSyncStats& bad = stats_.peers[1];
  ASSERT_EQ(bad.address, "w2");
  EXPECT_GE(peers.reads("w2"), 1);
  EXPECT_GE(bad.corrupt_pieces, 1);
  EXPECT_EQ(bad.bytes, 0u);  // nothing of it was kept
  EXPECT_EQ(bad.rank, 2);    // ranked last
  EXPECT_GE(stats_.pieces_refetched, bad.corrupt_pieces);
  EXPECT_EQ(stats_.peers[0].bytes + stats_.peers[2].bytes, kTotal * sizeof(float));
}

TEST_F(ModelSyncerTest, StalledReadMovesToAnotherHolderAfterTheStallTimeout) {
  auto holders = Holders(2);
  holders["w1"].stall_first_read = true;
  FakePeers peers(holders);
  peers.set_wait_for_holders(2);
  absl::Status result;
  std::thread sync([&] { result = Sync(&peers, {"w1", "w2"}); });
  ASSERT_TRUE(peers.stall_started().WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Everything else arrives; the stalled piece waits.
  ASSERT_TRUE(WaitUntil(
      [&] { return progress_.bytes_done.load() == kTotal * sizeof(float) - peers.stalled_bytes(); },
      absl::Seconds(10)));
  // Just under the stall timeout: a few stall checks later, still waiting.
  clock_.Advance(absl::Seconds(4.9));
  const int calls = clock_.calls();
  ASSERT_TRUE(WaitUntil([&] { return clock_.calls() >= calls + 6; }, absl::Seconds(10)));
  EXPECT_FALSE(peers.stall_cancelled());
  EXPECT_EQ(progress_.bytes_done.load(), kTotal * sizeof(float) - peers.stalled_bytes());
  // Past it: cancelled and read from w2.
  clock_.Advance(absl::Seconds(0.2));
  sync.join();
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_TRUE(peers.stall_cancelled());
  ExpectBitIdentical();
  EXPECT_EQ(stats_.peers[0].stalls, 1);
  EXPECT_EQ(stats_.peers[0].rank, 1);
  EXPECT_GE(stats_.pieces_refetched, 1);
}

TEST_F(ModelSyncerTest, BlipOnTheOnlyHolderIsRetried) {
  auto holders = Holders(1);
  holders["w1"].fail_first_read = true;
  FakePeers peers(holders);
  ASSERT_TRUE(Sync(&peers, {"w1"}).ok());
  ExpectBitIdentical();
  EXPECT_EQ(stats_.peers[0].failed_reads, 1);
  EXPECT_FALSE(stats_.peers[0].dropped);
  EXPECT_EQ(stats_.pieces_refetched, 1);
}

TEST_F(ModelSyncerTest, WorkerStopCancelsAStalledReadAndSyncWaitsForItsEnd) {
  auto holders = Holders(1);
  holders["w1"].stall_first_read = true;
  FakePeers peers(holders);
  CancellationToken stop;
  options_.stop = &stop;
  absl::Status result;
  std::atomic<bool> done{false};
  std::thread sync([&] {
    result = Sync(&peers, {"w1"});
    // Sync has returned: none of its reads may still be running.
    EXPECT_EQ(peers.reads_in_flight(), 0);
    EXPECT_EQ(peers.manifests_in_flight(), 0);
    done = true;
  });
  ASSERT_TRUE(peers.stall_started().WaitForNotificationWithTimeout(absl::Seconds(10)));
  stop.Cancel();
  // Well before the stall timeout (the fake clock never moves) and the
  // piece's 30 s deadline.
  EXPECT_TRUE(WaitUntil([&] { return done.load(); }, absl::Seconds(20)));
  sync.join();
  EXPECT_TRUE(absl::IsCancelled(result)) << result;
  EXPECT_TRUE(peers.stall_cancelled());
  EXPECT_FALSE(progress_.syncing.load());
}

TEST_F(ModelSyncerTest, ManifestRequestStillInFlightIsCancelledAndWaitedFor) {
  auto holders = Holders(2);
  holders["w2"].hold_manifest = true;
  FakePeers peers(holders);
  ASSERT_TRUE(Sync(&peers, {"w1", "w2"}).ok());
  // The pull needed w1 alone; w2's request ended (cancelled) before Sync
  // returned.
  EXPECT_EQ(peers.manifests_in_flight(), 0);
  EXPECT_TRUE(peers.manifest_cancelled());
  ExpectBitIdentical();
  EXPECT_FALSE(stats_.peers[1].used);
  EXPECT_EQ(peers.reads("w2"), 0);
}

TEST_F(ModelSyncerTest, LayerNotMatchingItsDigestIsNotKept) {
  // Every piece matches, the layer does not: the (only) holder's manifest
  // contradicts itself. Nobody else can serve the layer.
  auto holders = Holders(1);
  holders["w1"].bad_layer_digest = true;
  FakePeers peers(holders);
  absl::Status s = Sync(&peers, {"w1"});
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("fc1.weight"));
  EXPECT_GE(stats_.peers[0].corrupt_pieces, 1);
  EXPECT_GE(stats_.pieces_refetched, 7);  // all of fc1.weight
}

TEST_F(ModelSyncerTest, HolderOfAnotherModelIsNotUsed) {
  auto holders = Holders(2);
  holders["w2"].model = RandomModel(2);
  FakePeers peers(holders);
  ASSERT_TRUE(Sync(&peers, {"w1", "w2"}).ok());
  ExpectBitIdentical();
  EXPECT_FALSE(stats_.peers[1].used);
  EXPECT_THAT(stats_.peers[1].why, HasSubstr("hash"));
  EXPECT_EQ(peers.reads("w2"), 0);
}

TEST_F(ModelSyncerTest, AllHoldersGoneFallsBackToTheStore) {
  auto holders = Holders(3);
  for (auto& [address, h] : holders) h.mode = Holder::kDown;
  FakePeers peers(holders);
  FakeStore store;
  store.Add("run-r6", kRound - 1, RandomModel(3));
  store.Add("run-r7", kRound, model_);
  CheckpointFallback fallback;
  fallback.client = &store;
  fallback.run_id = "run";
  ASSERT_TRUE(Sync(&peers, {"w1", "w2", "w3"}, fallback).ok());
  ExpectBitIdentical();
  EXPECT_EQ(stats_.bytes_from_store, kTotal * sizeof(float));
  EXPECT_EQ(stats_.checkpoint_id, "run-r7");
  EXPECT_GT(store.reads(), 0);
}

TEST_F(ModelSyncerTest, StoreCheckpointWithOptimizerStateServesTheModelAlone) {
  auto holders = Holders(2);
  for (auto& [address, h] : holders) h.mode = Holder::kDown;
  FakePeers peers(holders);
  FakeStore store;
  store.Add("run-r7", kRound, model_, /*with_model_hash=*/true, /*with_momentum=*/true);
  CheckpointFallback fallback;
  fallback.client = &store;
  fallback.checkpoint_id = "run-r7";
  ASSERT_TRUE(Sync(&peers, {"w1", "w2"}, fallback).ok());
  ExpectBitIdentical();
  EXPECT_EQ(stats_.bytes_from_store, kTotal * sizeof(float));
}

TEST_F(ModelSyncerTest, HoldersFailingEveryReadFallBackToTheStore) {
  // They describe the model, then every read fails: dropped, store.
  auto holders = Holders(2);
  for (auto& [address, h] : holders) h.mode = Holder::kReadsFail;
  FakePeers peers(holders);
  FakeStore store;
  store.Add("run-r7", kRound, model_);
  CheckpointFallback fallback;
  fallback.client = &store;
  fallback.checkpoint_id = "run-r7";
  ASSERT_TRUE(Sync(&peers, {"w1", "w2"}, fallback).ok());
  ExpectBitIdentical();
  EXPECT_TRUE(stats_.peers[0].dropped);
  EXPECT_TRUE(stats_.peers[1].dropped);
  EXPECT_EQ(stats_.bytes_from_store, kTotal * sizeof(float));
}

TEST_F(ModelSyncerTest, NothingLeftIsUnavailable) {
  auto holders = Holders(2);
  for (auto& [address, h] : holders) h.mode = Holder::kDown;
  FakePeers peers(holders);
  absl::Status s = Sync(&peers, {"w1", "w2"});
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_FALSE(progress_.syncing.load());

  // A store without a checkpoint of the round is no help either.
  FakeStore store;
  store.Add("run-r6", kRound - 1, RandomModel(3));
  CheckpointFallback fallback;
  fallback.client = &store;
  s = Sync(&peers, {"w1", "w2"}, fallback);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("no checkpoint of round 7"));

  // No holder at all and no store.
  s = Sync(&peers, {});
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

TEST_F(ModelSyncerTest, StoreOfAnotherModelIsNotUsed) {
  auto holders = Holders(1);
  holders["w1"].mode = Holder::kReadsFail;
  FakePeers peers(holders);
  // Same round, other bytes: caught by the checkpoint's model hash, or
  // (without one) by its layers' digests against the holders' manifest.
  for (bool with_model_hash : {true, false}) {
    FakeStore store;
    store.Add("run-r7", kRound, RandomModel(4), with_model_hash);
    CheckpointFallback fallback;
    fallback.client = &store;
    absl::Status s = Sync(&peers, {"w1"}, fallback);
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("does not hold this model"));
    EXPECT_EQ(store.reads(), 0);
  }
}

TEST_F(ModelSyncerTest, StorePiecesMaySpanLayersWhenHoldersHaveNoLayerTable) {
  // The holders describe one layer "all"; the store keeps per-tensor
  // layers, so a piece may cover the end of one and the start of the next.
  auto holders = Holders(2);
  for (auto& [address, h] : holders) {
    h.single_layer = true;
    h.mode = Holder::kReadsFail;
  }
  FakePeers peers(holders);
  FakeStore store;
  store.Add("run-r7", kRound, model_);
  CheckpointFallback fallback;
  fallback.client = &store;
  ASSERT_TRUE(Sync(&peers, {"w1", "w2"}, fallback).ok());
  ExpectBitIdentical();
  EXPECT_EQ(stats_.bytes_from_store, kTotal * sizeof(float));
}

// The manifest ModelState serves (GetManifest) for its snapshot.
class ModelStateManifestTest : public ::testing::Test {
 protected:
  ModelStateManifestTest() : params_(RandomModel(5)), snapshot_(params_) {
    state_.Bind(params_.data(), kTotal, "mlp");
    state_.SetDigestPieceElements(kPieceElements);
    state_.BindSnapshot(snapshot_.data());
    state_.SetSnapshot(kRound);
  }

  absl::StatusOr<shoal::v1::ModelManifest> Get(uint64_t round) {
    absl::StatusOr<shoal::v1::ModelManifest> out = absl::InternalError("no answer");
    int answers = 0;
    state_.GetManifest(round, [&](absl::StatusOr<shoal::v1::ModelManifest> m) {
      out = std::move(m);
      ++answers;
    });
    EXPECT_EQ(answers, 1);  // answered once, on this thread
    return out;
  }

  std::vector<float> params_;
  std::vector<float> snapshot_;
  ModelState state_;
};

TEST_F(ModelStateManifestTest, WithoutLayerTableTheModelIsOneLayer) {
  auto m = Get(kRound);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->layers_size(), 1);
  EXPECT_EQ(m->layers(0).name(), "all");
  EXPECT_EQ(m->layers(0).elements(), kTotal);
  EXPECT_EQ(m->layers(0).sha256(), HashOf(snapshot_));
  EXPECT_EQ(m->model_hash(), HashOf(snapshot_));
  EXPECT_EQ(m->layers(0).piece_sha256_size(), (kTotal + kPieceElements - 1) / kPieceElements);
  EXPECT_EQ(m->layers(0).piece_sha256(1),
            Sha256Hex(snapshot_.data() + kPieceElements, kPieceElements * sizeof(float)));
}

TEST_F(ModelStateManifestTest, LayerTableIsCheckedAndDescribed) {
  EXPECT_TRUE(absl::IsInvalidArgument(state_.SetLayers({{"a", 0, 10}, {"b", 11, kTotal - 11}})));
  EXPECT_TRUE(absl::IsInvalidArgument(state_.SetLayers({{"a", 0, 10}})));
  EXPECT_TRUE(absl::IsInvalidArgument(state_.SetLayers({})));
  ASSERT_TRUE(state_.SetLayers(Layers()).ok());
  auto m = Get(kRound);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->layers_size(), 4);
  for (int i = 0; i < 4; ++i) {
    const LayerSpan l = Layers()[i];
    EXPECT_EQ(m->layers(i).name(), l.name);
    EXPECT_EQ(m->layers(i).offset(), l.offset);
    EXPECT_EQ(m->layers(i).elements(), l.elements);
    EXPECT_EQ(m->layers(i).sha256(),
              Sha256Hex(snapshot_.data() + l.offset, l.elements * sizeof(float)));
  }
  EXPECT_EQ(m->layers(0).piece_sha256_size(), 7);  // 100,000 / 16,384 rounded up
  EXPECT_EQ(m->layers(1).piece_sha256_size(), 0);  // one piece: the layer digest
}

TEST_F(ModelStateManifestTest, AgreedHashIsUsedWhenItIsTheSnapshotsRound) {
  state_.SetModel(kRound, "agreed");
  EXPECT_EQ(Get(kRound)->model_hash(), "agreed");
}

TEST_F(ModelStateManifestTest, RefusesOtherRoundsAndSnapshotsBeingReplaced) {
  EXPECT_TRUE(absl::IsFailedPrecondition(Get(kRound + 1).status()));
  state_.BeginSnapshotUpdate();
  EXPECT_TRUE(absl::IsUnavailable(Get(kRound).status()));
  state_.SetSnapshot(kRound);
  state_.SetShuttingDown();
  EXPECT_TRUE(absl::IsUnavailable(Get(kRound).status()));
  ModelState unbound;
  absl::Status s;
  unbound.GetManifest(kRound, [&](absl::StatusOr<shoal::v1::ModelManifest> m) { s = m.status(); });
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

TEST_F(ModelStateManifestTest, CachedUntilTheSnapshotChanges) {
  auto first = Get(kRound);
  ASSERT_TRUE(first.ok());
  // Bytes changed behind ModelState's back are not seen: the cache holds.
  snapshot_[0] += 1;
  EXPECT_EQ(Get(kRound)->layers(0).sha256(), first->layers(0).sha256());
  // A proper update (new generation) is hashed again.
  state_.BeginSnapshotUpdate();
  state_.SetSnapshot(kRound);
  EXPECT_EQ(Get(kRound)->layers(0).sha256(), HashOf(snapshot_));
  EXPECT_NE(Get(kRound)->layers(0).sha256(), first->layers(0).sha256());
}

// A holder may hash the model before it answers: the manifest's deadline
// grows with the model (2 GB on busy cores took longer than 10 s).
TEST(ManifestTimeoutTest, TenSecondsOrTheModelAtTheMinimumRate) {
  SyncOptions options;
  EXPECT_EQ(ManifestTimeout(options, 4 << 20), absl::Seconds(10));
  EXPECT_EQ(ManifestTimeout(options, 2'000'000'000), absl::Seconds(40));
  options.manifest_min_rate = 0;  // off: the fixed deadline
  EXPECT_EQ(ManifestTimeout(options, 2'000'000'000), absl::Seconds(10));
}

}  // namespace
}  // namespace shoal::worker
