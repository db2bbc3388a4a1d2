// Unit tests of the tensor chunk codec and of the checksums it relies on
// (CRC-32C for chunks, SHA-256 for model hashes).
#include "common/chunk_codec.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/sha256.h"
#include "gtest/gtest.h"

namespace shoal {
namespace {

using ::shoal::v1::TensorChunk;

std::vector<float> Ramp(size_t n, float offset = 0.25f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = offset + static_cast<float>(i) * -0.5f;
  return v;
}

// Bitwise CRC-32C, independent of the library's table and SSE4.2 paths.
uint32_t ReferenceCrc32c(const uint8_t* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return crc ^ 0xFFFFFFFFu;
}

// ---------------------------------------------------------------- CRC-32C

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0x00000000u);
  EXPECT_EQ(Crc32c("a", 1), 0xC1D04330u);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Crc32c(fox.data(), fox.size()), 0x22620404u);

  // RFC 3720 (iSCSI), appendix B.4.
  uint8_t buf[32];
  std::memset(buf, 0, sizeof(buf));
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof(buf));
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x113FDB5Cu);
}

TEST(Crc32cTest, MatchesReferenceForEveryLengthAndAlignment) {
  std::vector<uint8_t> data(300);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n + offset <= data.size(); n += (n < 40 ? 1 : 37)) {
      EXPECT_EQ(Crc32c(data.data() + offset, n), ReferenceCrc32c(data.data() + offset, n))
          << "offset=" << offset << " n=" << n;
    }
  }
}

// ---------------------------------------------------------------- SHA-256

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(Sha256Hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, IncrementalUpdatesMatchOneShot) {
  const std::string text = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  Sha256 h;
  h.Update(text.data(), 5);
  h.Update(text.data() + 5, 0);
  h.Update(text.data() + 5, text.size() - 5);
  EXPECT_EQ(h.HexDigest(), Sha256Hex(text.data(), text.size()));

  Sha256 abc;
  abc.Update("a", 1);
  abc.Update("bc", 2);
  const std::string digest = abc.HexDigest();
  EXPECT_EQ(digest, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digest.size(), 64u);
}

// ---------------------------------------------------------------- Encoding

TEST(ChunkCodecTest, EncodeChunkFillsAllFields) {
  const std::vector<float> values = Ramp(10);
  TensorChunk chunk;
  EncodeChunk(/*round=*/3, /*begin=*/40, values.data() + 2, 5, &chunk);
  EXPECT_EQ(chunk.round(), 3u);
  EXPECT_EQ(chunk.begin(), 40u);
  ASSERT_EQ(chunk.data().size(), 5 * sizeof(float));
  EXPECT_EQ(std::memcmp(chunk.data().data(), values.data() + 2, 5 * sizeof(float)), 0);
  EXPECT_EQ(chunk.crc32c(), Crc32c(chunk.data().data(), chunk.data().size()));
}

TEST(ChunkCodecTest, RoundTripInChunks) {
  const uint64_t begin = 500, end = 10'500;
  const std::vector<float> model = Ramp(end);
  ChunkReceiver receiver(/*round=*/7, begin, end);
  EXPECT_EQ(receiver.received_until(), begin);

  std::vector<float> received(end, 0.0f);
  const size_t chunk_elements = 1024;  // the last chunk is shorter
  for (uint64_t at = begin; at < end; at += chunk_elements) {
    const size_t count = std::min<uint64_t>(chunk_elements, end - at);
    TensorChunk chunk;
    EncodeChunk(7, at, model.data() + at, count, &chunk);
    absl::StatusOr<ChunkView> view = receiver.Accept(chunk);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->begin, at);
    EXPECT_EQ(view->count, count);
    std::memcpy(received.data() + view->begin, view->data, view->count * sizeof(float));
    EXPECT_EQ(receiver.received_until(), at + count);
  }
  EXPECT_TRUE(receiver.Finish().ok());
  for (uint64_t i = begin; i < end; ++i) ASSERT_EQ(received[i], model[i]) << "element " << i;
}

TEST(ChunkCodecTest, EmptyRangeFinishesAtOnce) {
  ChunkReceiver receiver(1, 20, 20);
  EXPECT_TRUE(receiver.Finish().ok());
}

// ---------------------------------------------------------------- Rejections

class ChunkReceiverTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRound = 4;
  static constexpr uint64_t kBegin = 100;
  static constexpr uint64_t kEnd = 200;

  TensorChunk Chunk(uint64_t begin, size_t count, uint64_t round = kRound) {
    TensorChunk chunk;
    EncodeChunk(round, begin, model_.data() + begin, count, &chunk);
    return chunk;
  }

  // The receiver still takes the correct next chunk at `at`.
  void ExpectAcceptsNext(uint64_t at, size_t count) {
    EXPECT_EQ(receiver_.received_until(), at);
    const TensorChunk chunk = Chunk(at, count);  // the view points into it
    absl::StatusOr<ChunkView> view = receiver_.Accept(chunk);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->begin, at);
    EXPECT_EQ(view->count, count);
    EXPECT_EQ(view->data[0], model_[at]);
    EXPECT_EQ(receiver_.received_until(), at + count);
  }

  const std::vector<float> model_ = Ramp(300);
  ChunkReceiver receiver_{kRound, kBegin, kEnd};
};

TEST_F(ChunkReceiverTest, WrongRoundIsFailedPrecondition) {
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin, 10, kRound - 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin, 10, kRound + 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExpectAcceptsNext(kBegin, 10);
}

TEST_F(ChunkReceiverTest, SizeNotMultipleOfFourOrEmptyIsInvalidArgument) {
  for (size_t cut : {1u, 2u, 3u}) {
    TensorChunk chunk = Chunk(kBegin, 10);
    chunk.mutable_data()->resize(chunk.data().size() - cut);
    chunk.set_crc32c(Crc32c(chunk.data().data(), chunk.data().size()));
    EXPECT_EQ(receiver_.Accept(chunk).status().code(), absl::StatusCode::kInvalidArgument)
        << "cut " << cut;
  }
  TensorChunk empty = Chunk(kBegin, 0);
  EXPECT_TRUE(empty.data().empty());
  EXPECT_EQ(receiver_.Accept(empty).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectAcceptsNext(kBegin, 10);
}

TEST_F(ChunkReceiverTest, GapOrOverlapIsInvalidArgument) {
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin + 1, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);  // gap at the start
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin - 1, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);  // before the range
  ExpectAcceptsNext(kBegin, 10);
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);  // the same chunk again
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin + 5, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);  // overlap
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin + 20, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);  // gap
  ExpectAcceptsNext(kBegin + 10, 10);
}

TEST_F(ChunkReceiverTest, PastTheEndIsInvalidArgument) {
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin, kEnd - kBegin + 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ExpectAcceptsNext(kBegin, 90);
  EXPECT_EQ(receiver_.Accept(Chunk(kBegin + 90, 11)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ExpectAcceptsNext(kBegin + 90, 10);  // exactly up to the end
  EXPECT_TRUE(receiver_.Finish().ok());
  EXPECT_EQ(receiver_.Accept(Chunk(kEnd, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(receiver_.Finish().ok());
}

TEST(ChunkCodecTest, LargerThanMaxChunkIsResourceExhausted) {
  const size_t max_elements = kMaxChunkBytes / sizeof(float);
  const std::vector<float> model = Ramp(max_elements + 2);
  ChunkReceiver receiver(1, 0, model.size());
  TensorChunk chunk;
  EncodeChunk(1, 0, model.data(), max_elements + 1, &chunk);
  EXPECT_EQ(receiver.Accept(chunk).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(receiver.received_until(), 0u);

  // Exactly the limit is fine.
  EncodeChunk(1, 0, model.data(), max_elements, &chunk);
  ASSERT_EQ(chunk.data().size(), kMaxChunkBytes);
  absl::StatusOr<ChunkView> view = receiver.Accept(chunk);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->count, max_elements);
  EncodeChunk(1, max_elements, model.data() + max_elements, 2, &chunk);
  EXPECT_TRUE(receiver.Accept(chunk).ok());
  EXPECT_TRUE(receiver.Finish().ok());
}

TEST_F(ChunkReceiverTest, CorruptedBytesAreDataLoss) {
  for (size_t byte : {0u, 17u, 39u}) {
    TensorChunk chunk = Chunk(kBegin, 10);
    (*chunk.mutable_data())[byte] ^= 0x01;
    EXPECT_EQ(receiver_.Accept(chunk).status().code(), absl::StatusCode::kDataLoss)
        << "byte " << byte;
  }
  TensorChunk bad_crc = Chunk(kBegin, 10);
  bad_crc.set_crc32c(bad_crc.crc32c() ^ 0x80000000u);
  EXPECT_EQ(receiver_.Accept(bad_crc).status().code(), absl::StatusCode::kDataLoss);
  ExpectAcceptsNext(kBegin, 10);
}

TEST_F(ChunkReceiverTest, FinishBeforeWholeRangeIsDataLoss) {
  EXPECT_EQ(receiver_.Finish().code(), absl::StatusCode::kDataLoss);
  ExpectAcceptsNext(kBegin, 60);
  EXPECT_EQ(receiver_.Finish().code(), absl::StatusCode::kDataLoss);
  ExpectAcceptsNext(kBegin + 60, 39);
  EXPECT_EQ(receiver_.Finish().code(), absl::StatusCode::kDataLoss);  // one element short
  ExpectAcceptsNext(kBegin + 99, 1);
  EXPECT_TRUE(receiver_.Finish().ok());
}

TEST_F(ChunkReceiverTest, KeepsPositionAfterEveryKindOfRejection) {
  ExpectAcceptsNext(kBegin, 25);
  const uint64_t at = kBegin + 25;
  TensorChunk flipped = Chunk(at, 10);
  (*flipped.mutable_data())[3] ^= 0x40;
  TensorChunk odd = Chunk(at, 10);
  odd.mutable_data()->pop_back();
  const std::vector<TensorChunk> bad = {Chunk(at, 10, kRound + 1), odd,
                                        Chunk(at + 1, 10),         Chunk(at - 1, 10),
                                        Chunk(at, kEnd - at + 1),  flipped};
  for (const TensorChunk& chunk : bad) {
    EXPECT_FALSE(receiver_.Accept(chunk).ok());
    EXPECT_EQ(receiver_.received_until(), at);
  }
  ExpectAcceptsNext(at, 10);
  ExpectAcceptsNext(at + 10, kEnd - at - 10);
  EXPECT_TRUE(receiver_.Finish().ok());
}

}  // namespace
}  // namespace shoal
