#include "common/tensor_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace shoal {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian float32; add byte swapping for big-endian hosts");

ElementSpan NextChunk(uint64_t next, uint64_t end) {
  const uint64_t cell_end = (next / kCellElements + 1) * kCellElements;
  return {next, std::min(cell_end, end) - next};
}

uint64_t CellCount(uint64_t total) { return (total + kCellElements - 1) / kCellElements; }

CellRange CellsWithin(uint64_t begin, uint64_t end, uint64_t total) {
  end = std::min(end, total);
  const uint64_t first = (begin + kCellElements - 1) / kCellElements;
  uint64_t last = first;
  // A cell ends at its boundary or, the last one, at `total`.
  while (last < CellCount(total) && std::min((last + 1) * kCellElements, total) <= end) ++last;
  return {first, std::max(first, last)};
}

std::vector<uint32_t> CellCrcCache::Compute(const float* data, uint64_t total, uint64_t first,
                                            uint64_t last) {
  std::vector<uint32_t> crcs;
  if (data == nullptr || last <= first) return crcs;
  crcs.reserve(last - first);
  for (uint64_t c = first; c < last; ++c) {
    const uint64_t begin = c * kCellElements;
    const uint64_t count = std::min(kCellElements, total - begin);
    crcs.push_back(Crc32c(data + begin, count * kBytesPerElement));
  }
  return crcs;
}

void CellCrcCache::Install(uint64_t epoch, uint64_t total, std::vector<uint32_t> crcs) {
  epoch_ = epoch;
  total_ = total;
  crcs_ = std::move(crcs);
}

bool CellCrcCache::Update(uint64_t epoch, uint64_t first, const std::vector<uint32_t>& crcs) {
  if (!holds(epoch) || first + crcs.size() > crcs_.size()) return false;
  std::copy(crcs.begin(), crcs.end(), crcs_.begin() + first);
  return true;
}

std::optional<uint32_t> CellCrcCache::Lookup(uint64_t epoch, uint64_t begin, uint64_t count) const {
  if (!holds(epoch) || begin % kCellElements != 0 || begin >= total_) return std::nullopt;
  if (count != std::min(kCellElements, total_ - begin)) return std::nullopt;
  const uint64_t cell = begin / kCellElements;
  if (cell >= crcs_.size()) return std::nullopt;
  return crcs_[cell];
}

void EncodeChunk(uint64_t round, uint64_t begin, const float* data, size_t count,
                 shoal::v1::TensorChunk* chunk) {
  chunk->set_round(round);
  chunk->set_begin(begin);
  const size_t bytes = count * kBytesPerElement;
  chunk->mutable_data()->assign(reinterpret_cast<const char*>(data), bytes);
  chunk->set_crc32c(Crc32c(chunk->data().data(), bytes));
}

// The loops below run up to a multiple of 8 first: GCC 12 at -O2 only
// vectorizes a loop whose trip count it knows to be a multiple of the
// vector width (and, thanks to __restrict, needs no aliasing check).
void AddFloats(float* __restrict dst, const uint8_t* __restrict src, size_t n) {
  const size_t bulk = n & ~size_t{7};
  for (size_t i = 0; i < bulk; ++i) {
    float v;
    std::memcpy(&v, src + i * kBytesPerElement, sizeof(v));  // any alignment
    dst[i] += v;
  }
  for (size_t i = bulk; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * kBytesPerElement, sizeof(v));
    dst[i] += v;
  }
}

void DivideFloats(float* __restrict dst, size_t n, float divisor) {
  const size_t bulk = n & ~size_t{7};
  for (size_t i = 0; i < bulk; ++i) dst[i] /= divisor;
  for (size_t i = bulk; i < n; ++i) dst[i] /= divisor;
}

void AverageInto(float* __restrict dst, const float* __restrict sum, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) dst[i] = (dst[i] + sum[i]) / divisor;
}

void ChunkView::CopyTo(float* dst) const {
  if (data != nullptr) {
    std::memcpy(dst, data, count * kBytesPerElement);
    return;
  }
  // Byte pieces concatenate: an element cut between two pieces is simply
  // copied in two parts.
  auto* out = reinterpret_cast<uint8_t*>(dst);
  for (size_t i = 0; i < num_pieces; ++i) {
    std::memcpy(out, pieces[i].data, pieces[i].size);
    out += pieces[i].size;
  }
}

void ChunkView::AddTo(float* dst) const {
  if (data != nullptr) {
    AddFloats(dst, reinterpret_cast<const uint8_t*>(data), count);
    return;
  }
  // An element cut between two pieces is assembled in `carry` first.
  uint8_t carry[kBytesPerElement];
  size_t have = 0;
  float* out = dst;
  for (size_t i = 0; i < num_pieces; ++i) {
    const uint8_t* p = pieces[i].data;
    size_t n = pieces[i].size;
    if (have > 0) {
      const size_t take = std::min(kBytesPerElement - have, n);
      std::memcpy(carry + have, p, take);
      have += take;
      p += take;
      n -= take;
      if (have < kBytesPerElement) continue;
      float v;
      std::memcpy(&v, carry, sizeof(v));
      *out++ += v;
      have = 0;
    }
    const size_t whole = n / kBytesPerElement;
    AddFloats(out, p, whole);
    out += whole;
    p += whole * kBytesPerElement;
    n -= whole * kBytesPerElement;
    if (n > 0) {
      std::memcpy(carry, p, n);
      have = n;
    }
  }
}

ChunkView ChunkView::Range(uint64_t first, size_t n, std::vector<BytePiece>* storage) const {
  ChunkView out;
  out.begin = first;
  out.count = n;
  const size_t skip = (first - begin) * kBytesPerElement;
  if (data != nullptr) {
    out.data = data + (first - begin);
    return out;
  }
  // Walk the pieces to the range's first byte, then take its bytes.
  storage->clear();
  size_t left = n * kBytesPerElement;
  size_t offset = skip;
  for (size_t i = 0; i < num_pieces && left > 0; ++i) {
    if (offset >= pieces[i].size) {
      offset -= pieces[i].size;
      continue;
    }
    const size_t take = std::min(pieces[i].size - offset, left);
    storage->push_back({pieces[i].data + offset, take});
    left -= take;
    offset = 0;
  }
  out.pieces = storage->data();
  out.num_pieces = storage->size();
  return out;
}

namespace {

size_t PutVarint(uint64_t v, uint8_t* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<uint8_t>(v);
  return n;
}

// Protobuf wire types and the tags of TensorChunk's fields.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;
constexpr uint8_t kRoundTag = (1 << 3) | kVarint;
constexpr uint8_t kBeginTag = (2 << 3) | kVarint;
constexpr uint8_t kDataTag = (3 << 3) | kLengthDelimited;
constexpr uint8_t kCrcTag = (4 << 3) | kFixed32;

// Reads bytes across pieces.
class PieceCursor {
 public:
  PieceCursor(const BytePiece* pieces, size_t n) : pieces_(pieces), n_(n) { SkipEmpty(); }
  bool done() const { return index_ >= n_; }

  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = pieces_[index_].data[offset_];
    Advance(1);
    return true;
  }
  bool Varint(uint64_t* v, int max_bytes = 10) {
    *v = 0;
    for (int shift = 0; shift < 7 * max_bytes && shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes: malformed
  }
  bool Fixed(size_t bytes, uint64_t* v) {
    *v = 0;
    for (size_t i = 0; i < bytes; ++i) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b) << (8 * i);
    }
    return true;
  }
  // Moves over the next `n` bytes; appends them to `out` (when not null) as
  // pieces of the underlying buffers.
  bool Take(uint64_t n, std::vector<BytePiece>* out) {
    while (n > 0) {
      if (done()) return false;
      const BytePiece& p = pieces_[index_];
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, p.size - offset_));
      if (out != nullptr) out->push_back({p.data + offset_, take});
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    if (offset_ == pieces_[index_].size) {
      ++index_;
      offset_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (index_ < n_ && pieces_[index_].size == 0) ++index_;
  }
  const BytePiece* pieces_;
  size_t n_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

}  // namespace

size_t EncodeChunkHeader(uint64_t round, uint64_t begin, size_t data_bytes, uint8_t* out) {
  size_t n = 0;
  out[n++] = kRoundTag;
  n += PutVarint(round, out + n);
  out[n++] = kBeginTag;
  n += PutVarint(begin, out + n);
  out[n++] = kDataTag;
  n += PutVarint(data_bytes, out + n);
  return n;
}

void EncodeChunkTrailer(uint32_t crc, uint8_t* out) {
  out[0] = kCrcTag;
  for (int i = 0; i < 4; ++i) out[1 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

absl::Status ParseChunk(const BytePiece* pieces, size_t num_pieces, RawChunk* out) {
  out->round = 0;
  out->begin = 0;
  out->crc32c = 0;
  out->has_data = false;
  out->data_size = 0;
  out->data.clear();
  PieceCursor c(pieces, num_pieces);
  auto malformed = [](const char* what) {
    return absl::DataLossError(absl::StrCat("malformed TensorChunk: ", what));
  };
  while (!c.done()) {
    uint64_t tag;
    // A tag is at most 5 bytes and 32 bits, as protobuf reads it (found by
    // tests/fuzz tensor_chunk: a 6-byte tag was skipped as an unknown field,
    // so this accepted bytes protobuf refuses).
    if (!c.Varint(&tag, 5)) return malformed("truncated or overlong field tag");
    if ((tag >> 3) == 0) return malformed("field number 0");
    if (tag > 0xFFFFFFFFu) return malformed("field tag past 32 bits");
    uint64_t v;
    switch (tag) {
      case kRoundTag:
        if (!c.Varint(&out->round)) return malformed("truncated round");
        continue;
      case kBeginTag:
        if (!c.Varint(&out->begin)) return malformed("truncated begin");
        continue;
      case kDataTag:
        if (!c.Varint(&v)) return malformed("truncated data length");
        out->data.clear();  // the last occurrence wins
        out->has_data = true;
        out->data_size = static_cast<size_t>(v);
        if (!c.Take(v, &out->data)) return malformed("data shorter than its length");
        continue;
      case kCrcTag:
        if (!c.Fixed(4, &v)) return malformed("truncated crc32c");
        out->crc32c = static_cast<uint32_t>(v);
        continue;
      default:
        break;
    }
    // A field this version does not know (or a known number with another
    // wire type): skipped, as protobuf does.
    switch (tag & 7) {
      case kVarint:
        if (!c.Varint(&v)) return malformed("truncated varint field");
        break;
      case kFixed64:
        if (!c.Fixed(8, &v)) return malformed("truncated fixed64 field");
        break;
      case kLengthDelimited:
        if (!c.Varint(&v) || !c.Take(v, nullptr)) return malformed("truncated bytes field");
        break;
      case kFixed32:
        if (!c.Fixed(4, &v)) return malformed("truncated fixed32 field");
        break;
      default:
        return malformed("unsupported wire type");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckChunkSize(size_t bytes) {
  if (bytes > kMaxChunkBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("chunk of ", bytes, " bytes exceeds the limit of ", kMaxChunkBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ChunkSequence::Check(uint64_t begin, size_t bytes) const {
  if (absl::Status s = CheckChunkSize(bytes); !s.ok()) return s;
  if (bytes == 0 || bytes % unit_bytes_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk size ", bytes, " is not a positive multiple of ", unit_bytes_,
                     unit_bytes_ == kBytesPerElement ? " bytes (float32)" : " bytes"));
  }
  if (begin != next_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk starts at ", begin, ", expected ", next_, " (gap or overlap)"));
  }
  const uint64_t count = bytes / unit_bytes_;
  if (count > end_ - next_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk [", begin, ", ", begin + count,
                                                   ") runs past the end of the range at ", end_));
  }
  return count;
}

absl::Status ChunkSequence::Finish() const {
  if (end_ != kUnbounded && next_ != end_) {
    return absl::DataLossError(
        absl::StrCat("stream ended at ", next_, " before the end of the range at ", end_));
  }
  return absl::OkStatus();
}

absl::Status CheckChunkCrc(uint32_t expected, const BytePiece* pieces, size_t num_pieces,
                           const std::string& what) {
  // Over the receive buffers where they are: nothing is copied before the
  // bytes are known to be good.
  uint32_t crc = 0;
  for (size_t i = 0; i < num_pieces; ++i) crc = Crc32cExtend(crc, pieces[i].data, pieces[i].size);
  if (crc != expected) {
    return absl::DataLossError(
        absl::StrCat("checksum mismatch on ", what, ": got ", crc, ", chunk says ", expected));
  }
  return absl::OkStatus();
}

absl::Status CheckChunkCrc(uint32_t expected, const void* data, size_t size,
                           const std::string& what) {
  const BytePiece piece{static_cast<const uint8_t*>(data), size};
  return CheckChunkCrc(expected, &piece, 1, what);
}

absl::StatusOr<uint64_t> ChunkReceiver::CheckHeader(uint64_t round, uint64_t begin,
                                                    size_t bytes) const {
  if (round != round_) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk is for round ", round, ", expected round ", round_));
  }
  return sequence_.Check(begin, bytes);
}

absl::StatusOr<ChunkView> ChunkReceiver::Accept(const shoal::v1::TensorChunk& chunk) {
  const std::string& data = chunk.data();
  absl::StatusOr<uint64_t> count = CheckHeader(chunk.round(), chunk.begin(), data.size());
  if (!count.ok()) return count.status();
  if (absl::Status crc = CheckChunkCrc(chunk.crc32c(), data.data(), data.size(),
                                       absl::StrCat("chunk at element ", chunk.begin()));
      !crc.ok()) {
    return crc;
  }
  ChunkView view{chunk.begin(), reinterpret_cast<const float*>(data.data()), *count};
  sequence_.Advance(*count);
  return view;
}

absl::StatusOr<ChunkView> ChunkReceiver::Accept(const RawChunk& chunk) {
  absl::StatusOr<uint64_t> count = CheckHeader(chunk.round, chunk.begin, chunk.data_size);
  if (!count.ok()) return count.status();
  if (absl::Status crc = CheckChunkCrc(chunk.crc32c, chunk.data.data(), chunk.data.size(),
                                       absl::StrCat("chunk at element ", chunk.begin));
      !crc.ok()) {
    return crc;
  }
  ChunkView view;
  view.begin = chunk.begin;
  view.count = *count;
  view.pieces = chunk.data.data();
  view.num_pieces = chunk.data.size();
  sequence_.Advance(*count);
  return view;
}

}  // namespace shoal
