// Unit tests of the tensor chunk codec (the protobuf form and the zero-copy
// form the worker writes and reads) and of the checksums it relies on
// (CRC-32C for chunks, SHA-256 for model hashes).
#include "common/chunk_codec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
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

// The three-lane CRC against the one-lane one it replaced (and the table),
// for every length up to a few lane blocks and around the block sizes (8 KiB
// and 1 KiB lanes: blocks of 24 KiB and 3 KiB), at every alignment.
TEST(Crc32cTest, ThreeLanesMatchOneLaneAndTable) {
  std::vector<uint8_t> data(3 * 24576 + 5000);
  std::mt19937 rng(11);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 200; ++n) lengths.push_back(n);
  for (size_t n = 201; n < 60000; n += 997) lengths.push_back(n);
  for (size_t block : {3072u, 24576u, 2 * 24576u, 3 * 24576u}) {
    for (size_t d = 0; d < 9; ++d) {
      lengths.push_back(block + d);
      lengths.push_back(block - d);
    }
    lengths.push_back(block + 3072);
    lengths.push_back(block + 3071);
  }
  const bool sse42 = crc32c_internal::HasSse42();
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n : lengths) {
      if (offset + n > data.size()) continue;
      const uint8_t* p = data.data() + offset;
      const uint32_t table = crc32c_internal::ExtendPortable(0, p, n);
      ASSERT_EQ(Crc32c(p, n), table) << "offset=" << offset << " n=" << n;
      if (sse42) {
        ASSERT_EQ(crc32c_internal::ExtendSse42OneLane(0, p, n), table)
            << "offset=" << offset << " n=" << n;
        ASSERT_EQ(crc32c_internal::ExtendSse42ThreeLanes(0, p, n), table)
            << "offset=" << offset << " n=" << n;
      }
    }
  }
  // A whole 1 MiB chunk, and the bitwise reference on a long input.
  std::vector<uint8_t> mib(1 << 20);
  for (uint8_t& b : mib) b = static_cast<uint8_t>(rng());
  EXPECT_EQ(Crc32c(mib.data(), mib.size()),
            crc32c_internal::ExtendPortable(0, mib.data(), mib.size()));
  EXPECT_EQ(Crc32c(data.data(), 30000), ReferenceCrc32c(data.data(), 30000));
}

// Extending over pieces gives the CRC of the whole, wherever it is cut.
TEST(Crc32cTest, ExtendOverPiecesMatchesWhole) {
  std::vector<uint8_t> data(100000);
  std::mt19937 rng(12);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(data.data(), data.size());
  EXPECT_EQ(Crc32cExtend(0, data.data(), data.size()), whole);
  for (size_t cut : {0u, 1u, 7u, 3071u, 3072u, 24577u, 65536u, 99999u, 100000u}) {
    const uint32_t first = Crc32c(data.data(), cut);
    EXPECT_EQ(Crc32cExtend(first, data.data() + cut, data.size() - cut), whole) << "cut " << cut;
  }
  uint32_t crc = 0;
  size_t at = 0;
  while (at < data.size()) {
    const size_t n = std::min<size_t>(data.size() - at, 1 + rng() % 40000);
    crc = Crc32cExtend(crc, data.data() + at, n);
    at += n;
  }
  EXPECT_EQ(crc, whole);
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

// ---------------------------------------------------------------- Zero-copy form

// The bytes the zero-copy server writes for a chunk: header, data, trailer.
std::string RawChunkBytes(uint64_t round, uint64_t begin, const float* data, size_t count,
                          uint32_t crc) {
  uint8_t head[kChunkHeaderMaxBytes];
  const size_t n = EncodeChunkHeader(round, begin, count * sizeof(float), head);
  uint8_t tail[kChunkTrailerBytes];
  EncodeChunkTrailer(crc, tail);
  std::string out(reinterpret_cast<const char*>(head), n);
  out.append(reinterpret_cast<const char*>(data), count * sizeof(float));
  out.append(reinterpret_cast<const char*>(tail), sizeof(tail));
  return out;
}

// `bytes` cut into pieces of the given sizes (cycled), as gRPC's receive
// slices cut a message.
std::vector<BytePiece> Cut(const std::string& bytes, const std::vector<size_t>& sizes) {
  std::vector<BytePiece> pieces;
  size_t at = 0, i = 0;
  while (at < bytes.size()) {
    const size_t n = std::min(bytes.size() - at, sizes[i++ % sizes.size()]);
    pieces.push_back({reinterpret_cast<const uint8_t*>(bytes.data()) + at, n});
    at += n;
  }
  return pieces;
}

TEST(ZeroCopyChunkTest, BytesAreThoseOfTheProtobufMessage) {
  const std::vector<float> model = Ramp(300'000);
  for (uint64_t round : {1ull, 127ull, 128ull, 1ull << 40}) {
    for (uint64_t begin : {1ull, 300ull, 262'144ull}) {
      for (size_t count : {1u, 31u, 32u, 37'000u}) {
        TensorChunk expected;
        EncodeChunk(round, begin, model.data(), count, &expected);
        const std::string raw = RawChunkBytes(round, begin, model.data(), count, expected.crc32c());
        EXPECT_EQ(raw, expected.SerializeAsString())
            << "round=" << round << " begin=" << begin << " count=" << count;
      }
    }
  }
}

TEST(ZeroCopyChunkTest, ProtobufParsesExplicitZeros) {
  // round 0, begin 0 and crc 0 are written explicitly; protobuf omits them.
  const std::vector<float> data = {0.0f, 1.5f};
  const std::string raw = RawChunkBytes(0, 0, data.data(), data.size(), 0);
  TensorChunk parsed;
  ASSERT_TRUE(parsed.ParseFromString(raw));
  EXPECT_EQ(parsed.round(), 0u);
  EXPECT_EQ(parsed.begin(), 0u);
  EXPECT_EQ(parsed.crc32c(), 0u);
  EXPECT_EQ(parsed.data(), std::string(reinterpret_cast<const char*>(data.data()), 8));
}

TEST(ZeroCopyChunkTest, ParsesProtobufBytesCutAnywhere) {
  const std::vector<float> model = Ramp(5000);
  TensorChunk chunk;
  EncodeChunk(9, 1234, model.data() + 1234, 3000, &chunk);
  const std::string bytes = chunk.SerializeAsString();
  for (const std::vector<size_t>& sizes :
       std::vector<std::vector<size_t>>{{1}, {2, 3}, {7}, {4096}, {5, 8191, 1}, {bytes.size()}}) {
    const std::vector<BytePiece> pieces = Cut(bytes, sizes);
    RawChunk raw;
    ASSERT_TRUE(ParseChunk(pieces.data(), pieces.size(), &raw).ok());
    EXPECT_EQ(raw.round, 9u);
    EXPECT_EQ(raw.begin, 1234u);
    EXPECT_EQ(raw.crc32c, chunk.crc32c());
    ASSERT_EQ(raw.data_size, chunk.data().size());
    std::string data;
    for (const BytePiece& p : raw.data) data.append(reinterpret_cast<const char*>(p.data), p.size);
    EXPECT_EQ(data, chunk.data());

    ChunkReceiver receiver(9, 1234, 5000);
    absl::StatusOr<ChunkView> view = receiver.Accept(raw);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->begin, 1234u);
    EXPECT_EQ(view->count, 3000u);
  }
}

TEST(ZeroCopyChunkTest, SkipsUnknownFieldsAndKeepsTheLastValue) {
  const std::vector<float> model = Ramp(10);
  TensorChunk chunk;
  EncodeChunk(3, 4, model.data(), 2, &chunk);
  // Fields a newer sender might add (numbers 5-8, every wire type), and a
  // second `begin` that wins over the first.
  std::string extra;
  extra += '\x28';  // field 5, varint
  extra += '\x96';
  extra += '\x01';
  extra += '\x31';  // field 6, fixed64
  extra += std::string(8, '\x07');
  extra += '\x3A';  // field 7, bytes
  extra += '\x03';
  extra += "abc";
  extra += '\x45';  // field 8, fixed32
  extra += std::string(4, '\x01');
  extra += '\x10';  // field 2 (begin) again
  extra += '\x06';
  const std::string bytes = chunk.SerializeAsString() + extra;
  TensorChunk reference;
  ASSERT_TRUE(reference.ParseFromString(bytes));
  const std::vector<BytePiece> pieces = Cut(bytes, {3});
  RawChunk raw;
  ASSERT_TRUE(ParseChunk(pieces.data(), pieces.size(), &raw).ok());
  EXPECT_EQ(raw.round, reference.round());
  EXPECT_EQ(raw.begin, reference.begin());
  EXPECT_EQ(raw.begin, 6u);
  EXPECT_EQ(raw.crc32c, reference.crc32c());
  EXPECT_EQ(raw.data_size, reference.data().size());
}

TEST(ZeroCopyChunkTest, MalformedBytesAreDataLoss) {
  const std::vector<float> model = Ramp(10);
  TensorChunk chunk;
  EncodeChunk(3, 4, model.data(), 2, &chunk);
  const std::string good = chunk.SerializeAsString();
  const std::vector<std::string> bad = {
      good.substr(0, good.size() - 1),  // crc cut short
      good.substr(0, 5),                // data shorter than its length
      std::string("\x08"),              // round without a value
      std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),  // varint > 10 bytes
      std::string("\x0b", 1),                                               // group (wire type 3)
      std::string("\x00\x01", 2),                                           // field number 0
  };
  for (const std::string& bytes : bad) {
    const std::vector<BytePiece> pieces = Cut(bytes, {2});
    RawChunk raw;
    EXPECT_EQ(ParseChunk(pieces.data(), pieces.size(), &raw).code(), absl::StatusCode::kDataLoss)
        << ::testing::PrintToString(bytes);
  }
}

TEST(ZeroCopyChunkTest, AcceptChecksLikeTheProtobufForm) {
  const std::vector<float> model = Ramp(100);
  TensorChunk chunk;
  EncodeChunk(2, 10, model.data() + 10, 20, &chunk);
  auto accept = [&](const TensorChunk& c, uint64_t round = 2) {
    const std::string bytes = c.SerializeAsString();
    const std::vector<BytePiece> pieces = Cut(bytes, {5, 11});
    RawChunk raw;
    EXPECT_TRUE(ParseChunk(pieces.data(), pieces.size(), &raw).ok());
    ChunkReceiver receiver(round, 10, 30);
    return receiver.Accept(raw).status().code();
  };
  EXPECT_EQ(accept(chunk), absl::StatusCode::kOk);
  TensorChunk bad_crc = chunk;
  bad_crc.set_crc32c(chunk.crc32c() ^ 4);
  EXPECT_EQ(accept(bad_crc), absl::StatusCode::kDataLoss);
  TensorChunk flipped = chunk;
  (*flipped.mutable_data())[41] ^= 0x10;
  EXPECT_EQ(accept(flipped), absl::StatusCode::kDataLoss);
  EXPECT_EQ(accept(chunk, 3), absl::StatusCode::kFailedPrecondition);
  TensorChunk odd = chunk;
  odd.mutable_data()->pop_back();
  odd.set_crc32c(Crc32c(odd.data().data(), odd.data().size()));
  EXPECT_EQ(accept(odd), absl::StatusCode::kInvalidArgument);
  TensorChunk gap = chunk;
  gap.set_begin(11);
  EXPECT_EQ(accept(gap), absl::StatusCode::kInvalidArgument);
  TensorChunk none = chunk;
  none.clear_data();
  EXPECT_EQ(accept(none), absl::StatusCode::kInvalidArgument);
}

TEST(ZeroCopyChunkTest, CopyAndAddFromPiecesCutInsideElements) {
  const size_t count = 3001;
  std::vector<float> src(count), base(count);
  for (size_t i = 0; i < count; ++i) {
    src[i] = 0.1f * static_cast<float>(i) - 7.0f;
    base[i] = 3.0f - 0.01f * static_cast<float>(i);
  }
  const std::string bytes(reinterpret_cast<const char*>(src.data()), count * sizeof(float));
  std::vector<float> want_sum = base;
  for (size_t i = 0; i < count; ++i) want_sum[i] += src[i];
  for (const std::vector<size_t>& sizes :
       std::vector<std::vector<size_t>>{{1}, {3}, {5, 2}, {4}, {4095, 6}, {bytes.size()}}) {
    const std::vector<BytePiece> pieces = Cut(bytes, sizes);
    ChunkView view;
    view.begin = 0;
    view.count = count;
    view.pieces = pieces.data();
    view.num_pieces = pieces.size();
    std::vector<float> copy(count, -1.0f);
    view.CopyTo(copy.data());
    EXPECT_EQ(std::memcmp(copy.data(), src.data(), bytes.size()), 0);
  }
  // The contiguous form does the same.
  ChunkView contiguous{0, src.data(), count};
  std::vector<float> copy(count, -1.0f);
  contiguous.CopyTo(copy.data());
  EXPECT_EQ(std::memcmp(copy.data(), src.data(), bytes.size()), 0);
  std::vector<float> sum = base;
  contiguous.AddTo(sum.data());
  EXPECT_EQ(std::memcmp(sum.data(), want_sum.data(), bytes.size()), 0);
}

TEST(ZeroCopyChunkTest, DivideFloatsIsTheScalarDivision) {
  std::vector<float> v(1003), w;
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f / static_cast<float>(i + 1) + 3.3f;
  w = v;
  for (float divisor : {3.0f, 7.0f}) {
    DivideFloats(v.data(), v.size(), divisor);
    for (float& x : w) x /= divisor;
    EXPECT_EQ(std::memcmp(v.data(), w.data(), v.size() * sizeof(float)), 0);
  }
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
