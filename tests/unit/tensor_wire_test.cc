// Unit tests of the wire module's grid, CRC cache, shared chunk checks and
// the gRPC half's buffers and method path (no sockets: the ByteBuffers are
// taken apart in memory). Encoding and ChunkReceiver: chunk_codec_test.cc.
#include "common/tensor_wire.h"

#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "common/crc32c.h"
#include "common/tensor_wire_grpc.h"
#include "gtest/gtest.h"

namespace shoal {
namespace {

TEST(ChunkGridTest, CutsOnCellBoundaries) {
  EXPECT_EQ(kCellElements * kBytesPerElement, kChunkBytes);
  ElementSpan c = NextChunk(0, 3 * kCellElements);
  EXPECT_EQ(c.begin, 0u);
  EXPECT_EQ(c.count, kCellElements);
  // A read starting inside a cell ends its first chunk at the boundary.
  c = NextChunk(10, 3 * kCellElements);
  EXPECT_EQ(c.count, kCellElements - 10);
  // ... and its last one at the end of the range.
  c = NextChunk(2 * kCellElements, 2 * kCellElements + 7);
  EXPECT_EQ(c.count, 7u);
  // The chunks of a range tile it.
  uint64_t next = 5;
  int chunks = 0;
  while (next < 3 * kCellElements + 9) {
    next = NextChunk(next, 3 * kCellElements + 9).end();
    ++chunks;
  }
  EXPECT_EQ(next, 3 * kCellElements + 9);
  EXPECT_EQ(chunks, 4);
}

TEST(ChunkGridTest, CellsWithin) {
  EXPECT_EQ(CellCount(0), 0u);
  EXPECT_EQ(CellCount(1), 1u);
  EXPECT_EQ(CellCount(kCellElements), 1u);
  EXPECT_EQ(CellCount(kCellElements + 1), 2u);
  const uint64_t total = 3 * kCellElements + 100;  // the last cell is short
  CellRange r = CellsWithin(0, total, total);
  EXPECT_EQ(r.first, 0u);
  EXPECT_EQ(r.last, 4u);
  r = CellsWithin(1, 2 * kCellElements, total);
  EXPECT_EQ(r.first, 1u);
  EXPECT_EQ(r.last, 2u);
  r = CellsWithin(3 * kCellElements, total, total);  // just the short one
  EXPECT_EQ(r.first, 3u);
  EXPECT_EQ(r.last, 4u);
  r = CellsWithin(5, 10, total);  // none
  EXPECT_EQ(r.first, r.last);
}

TEST(CellCrcCacheTest, LooksUpWholeCellsOfItsEpochOnly) {
  const uint64_t total = 2 * kCellElements + 3;
  std::vector<float> data(total);
  std::iota(data.begin(), data.end(), 0.0f);
  CellCrcCache cache;
  EXPECT_FALSE(cache.holds(1));
  EXPECT_FALSE(cache.Lookup(1, 0, kCellElements).has_value());
  cache.Install(1, total, CellCrcCache::Compute(data.data(), total, 0, CellCount(total)));
  ASSERT_TRUE(cache.holds(1));
  auto crc = cache.Lookup(1, kCellElements, kCellElements);
  ASSERT_TRUE(crc.has_value());
  EXPECT_EQ(*crc, Crc32c(data.data() + kCellElements, kChunkBytes));
  crc = cache.Lookup(1, 2 * kCellElements, 3);  // the short last cell
  ASSERT_TRUE(crc.has_value());
  EXPECT_EQ(*crc, Crc32c(data.data() + 2 * kCellElements, 3 * kBytesPerElement));
  EXPECT_FALSE(cache.Lookup(2, 0, kCellElements).has_value());      // another epoch
  EXPECT_FALSE(cache.Lookup(1, 0, kCellElements - 1).has_value());  // part of a cell
  EXPECT_FALSE(cache.Lookup(1, 1, kCellElements).has_value());      // off the grid

  data[kCellElements] = -1.0f;
  const std::vector<uint32_t> fresh = CellCrcCache::Compute(data.data(), total, 1, 2);
  EXPECT_FALSE(cache.Update(2, 1, fresh));  // another epoch: unchanged
  ASSERT_TRUE(cache.Update(1, 1, fresh));
  EXPECT_EQ(*cache.Lookup(1, kCellElements, kCellElements),
            Crc32c(data.data() + kCellElements, kChunkBytes));
}

TEST(ChunkSequenceTest, SharedChecksAndCodes) {
  ChunkSequence bytes(0, 10, /*unit_bytes=*/1);
  EXPECT_EQ(bytes.Check(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bytes.Check(1, 3).status().code(), absl::StatusCode::kInvalidArgument);   // gap
  EXPECT_EQ(bytes.Check(0, 11).status().code(), absl::StatusCode::kInvalidArgument);  // past
  EXPECT_EQ(bytes.Check(0, kMaxChunkBytes + 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(*bytes.Check(0, 3), 3u);  // any byte count
  bytes.Advance(3);
  EXPECT_EQ(bytes.Check(0, 3).status().code(), absl::StatusCode::kInvalidArgument);  // overlap
  EXPECT_EQ(bytes.Finish().code(), absl::StatusCode::kDataLoss);
  bytes.Advance(*bytes.Check(3, 7));
  EXPECT_TRUE(bytes.Finish().ok());

  ChunkSequence floats(4, 8, kBytesPerElement);
  EXPECT_EQ(floats.Check(4, 6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*floats.Check(4, 8), 2u);

  ChunkSequence open(7, ChunkSequence::kUnbounded, 1);
  open.Advance(*open.Check(7, 1000));
  EXPECT_TRUE(open.Finish().ok());
}

TEST(ChunkSequenceTest, CrcMismatchIsDataLoss) {
  const char bytes[] = "abcdefgh";
  EXPECT_TRUE(CheckChunkCrc(Crc32c(bytes, 8), bytes, 8, "x").ok());
  EXPECT_EQ(CheckChunkCrc(Crc32c(bytes, 8) ^ 1, bytes, 8, "x").code(), absl::StatusCode::kDataLoss);
  // Over pieces cut anywhere.
  const BytePiece pieces[] = {{reinterpret_cast<const uint8_t*>(bytes), 3},
                              {reinterpret_cast<const uint8_t*>(bytes) + 3, 5}};
  EXPECT_TRUE(CheckChunkCrc(Crc32c(bytes, 8), pieces, 2, "x").ok());
}

TEST(TensorWireGrpcTest, MethodPathComesFromTheDescriptor) {
  EXPECT_EQ(ReadSliceMethodPath(), "/shoal.v1.Peer/ReadSlice");
}

// The bytes of a ByteBuffer, as one string.
std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

int returned = 0;
void CountReturn(void* arg) { ++*static_cast<int*>(arg); }

TEST(TensorWireGrpcTest, LentChunkIsATensorChunkAndIsReturned) {
  std::vector<float> model = {1.5f, -2.0f, 3.25f};
  const uint32_t crc = Crc32c(model.data(), model.size() * kBytesPerElement);
  {
    grpc::ByteBuffer buffer =
        LentChunkBuffer(7, 40, model.data(), model.size(), crc, &CountReturn, &returned);
    shoal::v1::TensorChunk parsed;
    ASSERT_TRUE(parsed.ParseFromString(Bytes(buffer)));
    EXPECT_EQ(parsed.round(), 7u);
    EXPECT_EQ(parsed.begin(), 40u);
    EXPECT_EQ(parsed.crc32c(), crc);
    EXPECT_EQ(parsed.data(), std::string(reinterpret_cast<const char*>(model.data()),
                                         model.size() * kBytesPerElement));
    // Checked like any chunk.
    ChunkReceiver receiver(7, 40, 43);
    EXPECT_TRUE(receiver.Accept(parsed).ok());
    EXPECT_EQ(returned, 0);  // gRPC (here: the buffer) still holds the bytes
  }
  EXPECT_EQ(returned, 1);
}

TEST(TensorWireGrpcTest, CopiedChunkAndRequestDecoding) {
  const std::string bytes(8, 'x');
  grpc::ByteBuffer buffer = CopiedChunkBuffer(0, 0, bytes, Crc32c(bytes.data(), 8));
  shoal::v1::TensorChunk parsed;
  ASSERT_TRUE(parsed.ParseFromString(Bytes(buffer)));
  EXPECT_EQ(parsed.data(), bytes);

  shoal::v1::ReadSliceRequest request;
  request.set_round(3);
  request.set_end(9);
  const std::string wire = request.SerializeAsString();
  grpc::Slice slice(wire);
  shoal::v1::ReadSliceRequest decoded;
  ASSERT_TRUE(DecodeReadSliceRequest(grpc::ByteBuffer(&slice, 1), &decoded).ok());
  EXPECT_EQ(decoded.end(), 9u);
  grpc::Slice junk(std::string("\xff\xff\xff"));
  EXPECT_EQ(DecodeReadSliceRequest(grpc::ByteBuffer(&junk, 1), &decoded).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal
