// The tensor wire format, in one place: what a TensorChunk's bytes are, how
// a range of the flat float32 vector is cut into chunks, which checks every
// incoming chunk passes (and with which status code), and the per-cell
// CRC-32C cache that lets a sender checksum model memory once.
//
// Two encodings of the same TensorChunk (shoal/v1/common.proto):
//  - the protobuf message (EncodeChunk / ChunkReceiver::Accept(TensorChunk)):
//    tests, fakes and any standard gRPC client or server;
//  - the zero-copy form the worker uses (EncodeChunkHeader / ParseChunk /
//    ChunkReceiver::Accept(RawChunk)): the sender writes a few header bytes,
//    the data bytes straight from model memory and the CRC field; the
//    receiver walks the fields across gRPC's receive buffers and applies
//    the data from there (ChunkView::CopyTo / AddTo) without gathering it.
// Either side may use either form: the bytes on the wire are the same.
//
// The gRPC half of the module (the Peer.ReadSlice raw method on both ends:
// building a chunk's ByteBuffer from lent memory, reading chunks as raw
// bytes) is common/tensor_wire_grpc.h; this header has no gRPC type, so
// core classes (ModelState, the checkpoint store) use it too.
//
// Status codes of the checks (docs/ARCHITECTURE.md, "Wire format for
// tensors"; the checkpoint store's LayerChunk streams use the same table):
//   wrong round                                FAILED_PRECONDITION
//   size not a positive multiple of the unit   INVALID_ARGUMENT
//   gap, overlap, past the requested range     INVALID_ARGUMENT
//   larger than kMaxChunkBytes                 RESOURCE_EXHAUSTED
//   CRC-32C mismatch                           DATA_LOSS
//   bytes that are not a TensorChunk           DATA_LOSS
//   stream ends before the range is complete   DATA_LOSS
#ifndef SHOAL_COMMON_TENSOR_WIRE_H_
#define SHOAL_COMMON_TENSOR_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/v1/common.pb.h"

namespace shoal {

inline constexpr size_t kBytesPerElement = sizeof(float);

// ---- The chunk grid.
// Tensor bytes travel in chunks of this size (1 MiB measured best here).
inline constexpr size_t kChunkBytes = 1 << 20;
// Largest chunk a receiver accepts (tensor and checkpoint streams alike).
inline constexpr size_t kMaxChunkBytes = 4 << 20;
// Senders cut a range on a fixed grid of cells of kChunkBytes of the flat
// vector, so that a chunk is a whole cell (whose CRC a CellCrcCache may
// know) whenever the range allows; a read's first and last chunk may be
// shorter. Receivers accept any chunking.
inline constexpr uint64_t kCellElements = kChunkBytes / kBytesPerElement;

// Elements [begin, begin + count) of the flat vector.
struct ElementSpan {
  uint64_t begin = 0;
  uint64_t count = 0;
  uint64_t end() const { return begin + count; }
};
// The chunk a sender writes next when `next` < `end` of its range: from
// `next` up to the next cell boundary or `end`, whichever comes first.
ElementSpan NextChunk(uint64_t next, uint64_t end);
// Cells of a vector of `total` elements (the last one may be short).
uint64_t CellCount(uint64_t total);
// The cells [first, last) that lie wholly inside [begin, end) of a vector
// of `total` elements (first == last when none does).
struct CellRange {
  uint64_t first = 0;
  uint64_t last = 0;
};
CellRange CellsWithin(uint64_t begin, uint64_t end, uint64_t total);

// ---- The CRC cache.
// CRC-32C of each cell of one buffer (`total` elements), computed once when
// the buffer becomes readable and looked up for every chunk that is exactly
// one cell. Entries are valid for one window `epoch` of the buffer (the
// owner's count of "the bytes may have changed"); a lookup in another
// epoch misses, so a stale CRC is never served.
// Not thread-safe: its owner guards it (ModelState under its mutex); the
// expensive part, Compute, is static and runs outside any lock.
class CellCrcCache {
 public:
  // CRCs of the cells [first, last) of `data` (`total` elements).
  static std::vector<uint32_t> Compute(const float* data, uint64_t total, uint64_t first,
                                       uint64_t last);

  // Replaces every entry: `crcs` are all CellCount(total) cells, valid in
  // `epoch`.
  void Install(uint64_t epoch, uint64_t total, std::vector<uint32_t> crcs);
  // Overwrites cells [first, first + crcs.size()) when the cache holds
  // `epoch` (false, and nothing changes, otherwise).
  bool Update(uint64_t epoch, uint64_t first, const std::vector<uint32_t>& crcs);
  // True when every cell is known for `epoch`.
  bool holds(uint64_t epoch) const { return epoch_ == epoch && epoch != 0; }
  // The CRC of the chunk [begin, begin + count) when it is exactly one cell
  // and the cache holds `epoch`.
  std::optional<uint32_t> Lookup(uint64_t epoch, uint64_t begin, uint64_t count) const;

 private:
  uint64_t epoch_ = 0;  // 0: nothing cached
  uint64_t total_ = 0;
  std::vector<uint32_t> crcs_;
};

// ---- Encoding.
// Fills `chunk` with elements [begin, begin + count) taken from `data`
// (which points at element `begin`).
void EncodeChunk(uint64_t round, uint64_t begin, const float* data, size_t count,
                 shoal::v1::TensorChunk* chunk);

// A run of bytes, e.g. one of the slices gRPC received a message in.
struct BytePiece {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// A view of a checked chunk's elements [begin, begin + count). The bytes
// are either contiguous (`data`) or, when they arrived in several receive
// buffers, in `pieces` (in order, count * 4 bytes in total, cut anywhere,
// even inside an element) with `data` null. CopyTo and AddTo handle both,
// so consumers should use them rather than `data`.
struct ChunkView {
  uint64_t begin = 0;  // first element in the flat vector
  const float* data = nullptr;
  size_t count = 0;
  const BytePiece* pieces = nullptr;
  size_t num_pieces = 0;

  // dst[i] = element begin + i. `dst` points at element `begin`.
  void CopyTo(float* dst) const;
  // dst[i] += element begin + i (one float addition per element, in order).
  void AddTo(float* dst) const;
  // The view of elements [first, first + n) of this one (inside it), whose
  // pieces, when it has any, are kept in `storage` (reused by the caller).
  ChunkView Range(uint64_t first, size_t n, std::vector<BytePiece>* storage) const;
};

// dst[i] += src[i] for i < n. `src` holds little-endian float32 bytes at any
// alignment; the two must not overlap (so the loop vectorizes).
void AddFloats(float* __restrict dst, const uint8_t* __restrict src, size_t n);
// dst[i] /= divisor for i < n. A division, not a multiplication by the
// inverse: the same bits as the scalar loop it replaces, on every worker.
void DivideFloats(float* __restrict dst, size_t n, float divisor);
// dst[i] = (dst[i] + sum[i]) / divisor for i < n: the owner's mean of a cell,
// its own contribution in `dst` and the others' sum in `sum`, in one pass.
void AverageInto(float* __restrict dst, const float* __restrict sum, size_t n, float divisor);

// ---- The zero-copy form of TensorChunk (shoal/v1/common.proto):
// field 1 round (varint), 2 begin (varint), 3 data (bytes), 4 crc32c
// (fixed32). The header is fields 1-3 up to the data bytes, the trailer
// field 4. Header + data + trailer are exactly what protobuf serializes for
// the same values when round, begin and crc are non-zero; a zero is written
// explicitly, which every protobuf parser accepts.
inline constexpr size_t kChunkHeaderMaxBytes = 3 + 3 * 10;
inline constexpr size_t kChunkTrailerBytes = 5;
// Writes the header into `out` (at least kChunkHeaderMaxBytes); returns its
// length.
size_t EncodeChunkHeader(uint64_t round, uint64_t begin, size_t data_bytes, uint8_t* out);
void EncodeChunkTrailer(uint32_t crc, uint8_t* out);

// A TensorChunk as received, its data bytes left in the receive buffers.
struct RawChunk {
  uint64_t round = 0;
  uint64_t begin = 0;
  uint32_t crc32c = 0;
  bool has_data = false;
  size_t data_size = 0;
  std::vector<BytePiece> data;  // the data field's bytes, in order
};

// Parses a TensorChunk's protobuf encoding spread over `pieces` into `out`
// (reused by the caller across messages: no allocation once warm). Unknown
// fields are skipped and a repeated field keeps its last value, as protobuf
// does. DATA_LOSS when the bytes are not a well-formed message.
absl::Status ParseChunk(const BytePiece* pieces, size_t num_pieces, RawChunk* out);

// ---- Checks shared by every chunk stream (TensorChunk and the checkpoint
// store's LayerChunk): a stream delivers [begin, end) of something (elements
// of the flat vector, bytes of a layer) in order, without gaps or overlaps.
// Not thread-safe (one per stream).
class ChunkSequence {
 public:
  // `unit_bytes`: bytes per position (4 for float32 elements, 1 for bytes).
  // `end` may be kUnbounded (a read "to the end" of unknown length).
  static constexpr uint64_t kUnbounded = ~uint64_t{0};
  ChunkSequence(uint64_t begin, uint64_t end, size_t unit_bytes)
      : end_(end), next_(begin), unit_bytes_(unit_bytes) {}

  // Checks a chunk of `bytes` starting at position `begin`; returns the
  // positions it covers. RESOURCE_EXHAUSTED: bigger than kMaxChunkBytes.
  // INVALID_ARGUMENT: size not a positive multiple of the unit, gap or
  // overlap, past the end. Does not advance (see Advance).
  absl::StatusOr<uint64_t> Check(uint64_t begin, size_t bytes) const;
  void Advance(uint64_t positions) { next_ += positions; }
  // DATA_LOSS when the stream ended before `end` (OK when unbounded).
  absl::Status Finish() const;

  uint64_t next() const { return next_; }
  uint64_t end() const { return end_; }

 private:
  uint64_t end_;
  uint64_t next_;
  size_t unit_bytes_;
};

// RESOURCE_EXHAUSTED when a chunk of `bytes` is bigger than kMaxChunkBytes.
absl::Status CheckChunkSize(size_t bytes);
// DATA_LOSS unless the CRC-32C of `pieces` (in order) is `expected`. `what`
// names the chunk in the message ("chunk at element 5").
absl::Status CheckChunkCrc(uint32_t expected, const BytePiece* pieces, size_t num_pieces,
                           const std::string& what);
absl::Status CheckChunkCrc(uint32_t expected, const void* data, size_t size,
                           const std::string& what);

// Checks the TensorChunks of one stream of the range [begin, end) of
// `round`: the round (FAILED_PRECONDITION), then ChunkSequence's checks,
// then the CRC. Not thread-safe (one per stream).
class ChunkReceiver {
 public:
  ChunkReceiver(uint64_t round, uint64_t begin, uint64_t end)
      : round_(round), sequence_(begin, end, kBytesPerElement) {}

  // The view points into `chunk`, valid while it lives.
  absl::StatusOr<ChunkView> Accept(const shoal::v1::TensorChunk& chunk);
  // The same checks on a parsed zero-copy chunk; the view's pieces point
  // into `chunk.data` (and so into the receive buffers).
  absl::StatusOr<ChunkView> Accept(const RawChunk& chunk);

  // DATA_LOSS when the stream ended before the whole range arrived.
  absl::Status Finish() const { return sequence_.Finish(); }

  uint64_t received_until() const { return sequence_.next(); }

 private:
  // Every check but the CRC; returns the element count.
  absl::StatusOr<uint64_t> CheckHeader(uint64_t round, uint64_t begin, size_t bytes) const;

  uint64_t round_;
  ChunkSequence sequence_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_TENSOR_WIRE_H_
