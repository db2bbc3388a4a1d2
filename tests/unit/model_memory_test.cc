// The model memory owner (services/worker/core/model_memory.h): every write
// outside the exchange closes the buffer's window and waits for the chunks
// lent to gRPC before it touches the memory; and what peers are served
// (parameters or snapshot, which round) follows each step.
#include "services/worker/core/model_memory.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/model_state.h"

namespace shoal::worker {
namespace {

using ::shoal::v1::ReadSliceRequest;

constexpr uint64_t kTotal = 64;

ReadSliceRequest Request(uint64_t round, shoal::v1::SliceKind kind, uint64_t begin = 0,
                         uint64_t end = kTotal) {
  ReadSliceRequest r;
  r.set_round(round);
  r.set_begin(begin);
  r.set_end(end);
  r.set_kind(kind);
  r.set_reader_id("w9");
  return r;
}

class ModelMemoryTest : public ::testing::Test {
 protected:
  ModelMemoryTest() : params_(kTotal, 1.0f) {
    state_.Bind(params_.data(), kTotal, "mlp");
    state_.SetWorkerId("w1");
    memory_ =
        std::make_unique<ModelMemory>(&state_, params_.data(), kTotal, "h0", absl::Seconds(10));
  }

  // The snapshot a SNAPSHOT read of `round` is served from, or null.
  const float* ServedSnapshot(uint64_t round) {
    ModelState::ReadGrant grant;
    if (!state_.CheckRead(Request(round, shoal::v1::SNAPSHOT), &grant, nullptr).ok()) {
      return nullptr;
    }
    absl::StatusOr<ModelState::LentChunk> chunk = state_.LendChunk(grant, 0, kTotal);
    if (!chunk.ok()) return nullptr;
    const float* data = chunk->data;
    state_.ReturnChunk(grant.buffer);
    return data;
  }

  // One training round that sets every parameter to `value`.
  void TrainTo(uint64_t round, float value) {
    memory_->Train(round, [&](float* p) {
      for (uint64_t i = 0; i < kTotal; ++i) p[i] = value;
      return 0.5;
    });
  }

  std::vector<float> params_;
  ModelState state_;
  std::unique_ptr<ModelMemory> memory_;
};

TEST_F(ModelMemoryTest, StartsServingTheInitialModelFromTheSnapshot) {
  EXPECT_EQ(ServedSnapshot(0), memory_->snapshot());
  EXPECT_EQ(memory_->snapshot()[7], 1.0f);
}

TEST_F(ModelMemoryTest, TrainingWaitsForLentChunksBeforeWriting) {
  TrainTo(1, 2.0f);
  ModelState::ReadGrant grant;
  ASSERT_TRUE(state_.CheckRead(Request(1, shoal::v1::CONTRIBUTION), &grant, nullptr).ok());
  ASSERT_TRUE(state_.LendChunk(grant, 0, kTotal).ok());  // gRPC holds it
  std::thread give_back([&] {
    absl::SleepFor(absl::Milliseconds(30));
    state_.ReturnChunk(grant.buffer);
  });
  int lent_while_training = -1;
  memory_->Train(2, [&](float* p) {
    lent_while_training = state_.chunks_lent(ModelState::Buffer::kParameters);
    p[0] = 3.0f;
    return 0.1;
  });
  give_back.join();
  EXPECT_EQ(lent_while_training, 0);
  // The old window is closed: the grant of round 1 lends nothing more.
  EXPECT_FALSE(state_.IsCurrent(grant));
  // Round 2's contribution is readable.
  EXPECT_TRUE(state_.CheckRead(Request(2, shoal::v1::CONTRIBUTION)).ok());
}

TEST_F(ModelMemoryTest, PendingIsServedFromTheParametersUntilCommitted) {
  TrainTo(1, 2.0f);
  memory_->HoldPending(1, "h1");
  EXPECT_EQ(ServedSnapshot(1), params_.data());
  EXPECT_EQ(memory_->snapshot()[0], 1.0f);  // the agreed model is kept
  memory_->CommitPending(1);
  EXPECT_EQ(ServedSnapshot(1), memory_->snapshot());
  EXPECT_EQ(memory_->snapshot()[0], 2.0f);
}

TEST_F(ModelMemoryTest, VoidServesTheAgreedModelAgainAndDropRestoresIt) {
  TrainTo(1, 2.0f);
  memory_->HoldPending(1, "h1");
  memory_->VoidPending(0, "h0");
  EXPECT_EQ(ServedSnapshot(0), memory_->snapshot());
  EXPECT_EQ(ServedSnapshot(1), nullptr);
  memory_->DropWork(1);
  EXPECT_EQ(params_[5], 1.0f);
}

// A new attempt contributes what the last one left: the trained values and,
// where the failed attempt's average already came, that average; its reads
// are refused first, and the new attempt's contribution is served with CRCs
// of the bytes as they are now.
TEST_F(ModelMemoryTest, ContributeAgainServesTheParametersAsTheLastAttemptLeftThem) {
  TrainTo(1, 2.0f);
  memory_->ServePlan(1, 1, 0, 32);
  ModelState::ReadGrant grant;
  bool may_wait = false;
  shoal::v1::ReadSliceRequest first = Request(1, shoal::v1::CONTRIBUTION);
  first.set_attempt(1);
  ASSERT_TRUE(state_.CheckRead(first, &grant, &may_wait).ok());
  memory_->exchange_target()[3] = 9.0f;  // the first attempt's average
  memory_->ContributeAgain(1);
  EXPECT_FALSE(state_.IsCurrent(grant));
  EXPECT_EQ(params_[3], 9.0f);
  EXPECT_EQ(params_[4], 2.0f);
  memory_->ServePlan(1, 2, 0, 32);
  shoal::v1::ReadSliceRequest again = Request(1, shoal::v1::CONTRIBUTION);
  again.set_attempt(2);
  ASSERT_TRUE(state_.CheckRead(again, &grant, &may_wait).ok());
  absl::StatusOr<ModelState::LentChunk> chunk = state_.LendChunk(grant, 0, 4);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(chunk->data[3], 9.0f);
  state_.ReturnChunk(ModelState::Buffer::kParameters);
}

TEST_F(ModelMemoryTest, CatchUpReplacesBothOrNeither) {
  absl::Status failed = memory_->CatchUp(3, "h3", 0, [](float* dst, uint64_t n) {
    dst[0] = 42.0f;  // half-written, then the pull fails
    return absl::UnavailableError("no holder");
  });
  EXPECT_TRUE(absl::IsUnavailable(failed));
  EXPECT_EQ(memory_->snapshot()[0], 1.0f);
  EXPECT_EQ(ServedSnapshot(0), memory_->snapshot());

  ASSERT_TRUE(memory_
                  ->CatchUp(3, "h3", 0,
                            [](float* dst, uint64_t n) {
                              for (uint64_t i = 0; i < n; ++i) dst[i] = 7.0f;
                              return absl::OkStatus();
                            })
                  .ok());
  EXPECT_EQ(params_[10], 7.0f);
  EXPECT_EQ(memory_->snapshot()[10], 7.0f);
  EXPECT_EQ(ServedSnapshot(3), memory_->snapshot());
}

// The Codec seam's first implementation: fp32 decodes to the same bits.
TEST(Fp32CodecTest, RoundTripsAndAccumulates) {
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec("fp32");
  ASSERT_TRUE(codec.ok());
  EXPECT_TRUE((*codec)->raw());
  const std::vector<float> src = {1.5f, -2.25f, 3.0e-8f, 1e30f};
  std::vector<uint8_t> wire((*codec)->EncodedBytes(src.size()));
  (*codec)->Encode(src.data(), src.size(), wire.data());
  ChunkView view;
  view.begin = 0;
  view.count = src.size();
  view.data = reinterpret_cast<const float*>(wire.data());
  std::vector<float> out(src.size(), 0.0f);
  ASSERT_TRUE((*codec)->ApplyAverage(view, out.data()).ok());
  EXPECT_EQ(out, src);
  ASSERT_TRUE((*codec)->AccumulateContribution(view, out.data()).ok());
  EXPECT_EQ(out[0], 3.0f);
  (*codec)->RoundTripAverage(out.data(), out.size());
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_TRUE(absl::IsInvalidArgument(MakeCodec("int3").status()));
}

TEST_F(ModelMemoryTest, LateWorkIsKeptThenFoldedOntoANewerBaseWithItsWeight) {
  // Base 1.0 everywhere; round 1 trains to 3.0: the update is +2.0.
  TrainTo(1, 3.0f);
  EXPECT_FALSE(memory_->has_late_work());
  memory_->KeepLateWork(1);
  EXPECT_TRUE(memory_->has_late_work());
  EXPECT_EQ(params_[5], 1.0f);  // back to the base
  // Its contribution of round 1 is no longer served.
  ModelState::ReadGrant grant;
  EXPECT_FALSE(state_.CheckRead(Request(1, shoal::v1::CONTRIBUTION), &grant, nullptr).ok());
  // A newer base (round 2's average, 5.0) arrives by catch-up.
  ASSERT_TRUE(memory_
                  ->CatchUp(2, "h2", 0,
                            [](float* dst, uint64_t total) {
                              for (uint64_t i = 0; i < total; ++i) dst[i] = 5.0f;
                              return absl::OkStatus();
                            })
                  .ok());
  // Folded into round 3 with w = 1/2: 5 + 0.5 x 2.
  memory_->FoldLateWork(3, 0.5);
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(params_[i], 6.0f) << i;
  // Served as round 3's contribution, like a trained one.
  EXPECT_TRUE(state_.CheckRead(Request(3, shoal::v1::CONTRIBUTION), &grant, nullptr).ok());
  // Folded again (the round was voided): from the base again, not twice.
  memory_->DropWork(3);
  EXPECT_EQ(params_[0], 5.0f);
  memory_->FoldLateWork(3, 1.0 / 3);
  EXPECT_EQ(params_[0], 5.0f + static_cast<float>(1.0 / 3) * 2.0f);
  memory_->DropLateWork();
  EXPECT_FALSE(memory_->has_late_work());
}

// Gossip mode writes through the owner too: each write closes the
// parameters' window (nothing of them is served), then writes.
TEST_F(ModelMemoryTest, GossipWritesCloseTheParametersWindow) {
  TrainTo(1, 2.0f);
  ModelState::ReadGrant grant;
  ASSERT_TRUE(state_.CheckRead(Request(1, shoal::v1::CONTRIBUTION), &grant, nullptr).ok());
  const std::vector<float> peer(kTotal, 6.0f);
  const std::vector<float> base(kTotal, 4.0f);
  // params += a * (peer - base): 2 + 0.25 * (6 - 4).
  memory_->Interpolate(base.data(), peer.data(), 0.25);
  EXPECT_FALSE(state_.IsCurrent(grant));
  EXPECT_FALSE(state_.CheckRead(Request(1, shoal::v1::CONTRIBUTION)).ok());
  EXPECT_FLOAT_EQ(params_[0], 2.5f);
  // Against the parameters themselves (a pushed model): dpwa's rule.
  memory_->Interpolate(params_.data(), peer.data(), 0.5);
  EXPECT_FLOAT_EQ(params_[kTotal - 1], 4.25f);

  const double loss = memory_->TrainUnserved([](float* p) {
    p[0] = 9.0f;
    return 0.3;
  });
  EXPECT_DOUBLE_EQ(loss, 0.3);
  EXPECT_EQ(params_[0], 9.0f);

  const std::vector<float> model(kTotal, 7.0f);
  memory_->ReplaceModel(model.data());
  EXPECT_EQ(params_, model);

  absl::Status loaded = memory_->LoadModel([](float* p, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) p[i] = 8.0f;
    return absl::DataLossError("the manifest says otherwise");
  });
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(params_[3], 8.0f);
  // The snapshot (the initial model) is not touched by any of them.
  EXPECT_EQ(memory_->snapshot()[0], 1.0f);
}

}  // namespace
}  // namespace shoal::worker
