#include "bench/proto_zc/zc_peer.h"

#include <grpcpp/alarm.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <nmmintrin.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chunk_codec.h"
#include "common/grpc_util.h"
#include "common/status_util.h"

namespace shoal::bench {
namespace {

constexpr size_t kLane = 8192;  // bytes per CRC lane before the lanes are merged

__attribute__((target("sse4.2"))) uint32_t RawCrc(uint32_t c, const uint8_t* p, size_t n) {
  uint64_t crc = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    crc = _mm_crc32_u64(crc, v);
    p += 8;
    n -= 8;
  }
  uint32_t r = static_cast<uint32_t>(crc);
  while (n-- > 0) r = _mm_crc32_u8(r, *p++);
  return r;
}

// Tables of the linear map "append `len` zero bytes" on the raw CRC register.
struct Shift {
  uint32_t t[4][256];
  explicit Shift(size_t len) {
    std::vector<uint8_t> zeros(len, 0);
    uint32_t basis[32];
    for (int i = 0; i < 32; ++i) basis[i] = RawCrc(1u << i, zeros.data(), len);
    for (int k = 0; k < 4; ++k) {
      for (int b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int j = 0; j < 8; ++j) {
          if ((b >> j) & 1) v ^= basis[8 * k + j];
        }
        t[k][b] = v;
      }
    }
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 255] ^ t[1][(c >> 8) & 255] ^ t[2][(c >> 16) & 255] ^ t[3][c >> 24];
  }
};

}  // namespace

__attribute__((target("sse4.2"))) uint32_t Crc32cExtend(uint32_t crc, const void* data,
                                                        size_t size) {
  static const Shift* shift1 = new Shift(kLane);
  static const Shift* shift2 = new Shift(2 * kLane);
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t state = ~crc;
  while (size >= 3 * kLane) {
    uint64_t c0 = state, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t a, b, c;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kLane + i, 8);
      std::memcpy(&c, p + 2 * kLane + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, c);
    }
    state = (*shift2)(static_cast<uint32_t>(c0)) ^ (*shift1)(static_cast<uint32_t>(c1)) ^
            static_cast<uint32_t>(c2);
    p += 3 * kLane;
    size -= 3 * kLane;
  }
  return ~RawCrc(state, p, size);
}

namespace {

size_t PutVarint(uint64_t v, char* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<char>(v);
  return n;
}

constexpr uint64_t kChunkElements = kChunkBytes / kBytesPerElement;

class ZcReadSliceReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ZcReadSliceReactor(const worker::ModelState* state, grpc::CallbackServerContext* ctx,
                     const grpc::ByteBuffer* raw, bool park)
      : state_(state), ctx_(ctx), park_(park) {
    grpc::Slice flat;
    if (!raw->DumpToSingleSlice(&flat).ok() ||
        !request_.ParseFromArray(flat.begin(), static_cast<int>(flat.size()))) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad ReadSliceRequest"));
      return;
    }
    round_ = request_.round();
    snapshot_ = request_.kind() == shoal::v1::SNAPSHOT;
    next_ = request_.begin();
    end_ = request_.end();
    Start();
  }

 private:
  // Checks the request; a read of a slice that is not averaged yet waits
  // here (parked on a timer, no gRPC thread blocked) instead of failing with
  // UNAVAILABLE and being retried by the reader after a 1-20 ms backoff.
  void Start() {
    absl::Status s = state_->CheckRead(request_, &generation_);
    if (s.ok()) {
      WriteNext();
      return;
    }
    if (park_ && absl::IsUnavailable(s) && request_.kind() == shoal::v1::AVERAGED &&
        !ctx_->IsCancelled()) {
      alarm_.Set(absl::ToChronoTime(absl::Now() + absl::Microseconds(200)), [this](bool ok) {
        if (!ok) {
          Finish(grpc::Status(grpc::StatusCode::CANCELLED, "wait cancelled"));
          return;
        }
        Start();
      });
      return;
    }
    Finish(ToGrpcStatus(s));
  }

 public:
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken while writing"));
    } else if (snapshot_ && state_->snapshot_generation() != generation_) {
      Finish(grpc::Status(grpc::StatusCode::ABORTED, "snapshot replaced during the read"));
    } else if (next_ < end_) {
      WriteNext();
    } else {
      Finish(grpc::Status::OK);
    }
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const uint64_t count = std::min(kChunkElements, end_ - next_);
    const float* base = snapshot_ ? state_->snapshot() : state_->parameters();
    const char* data = reinterpret_cast<const char*>(base + next_);
    const size_t bytes = count * kBytesPerElement;
    const uint32_t crc = Crc32cExtend(0, data, bytes);
    char head[32];
    size_t h = 0;
    head[h++] = 0x08;  // field 1 (round), varint
    h += PutVarint(round_, head + h);
    head[h++] = 0x10;  // field 2 (begin), varint
    h += PutVarint(next_, head + h);
    head[h++] = 0x1A;  // field 3 (data), length-delimited
    h += PutVarint(bytes, head + h);
    char tail[5];
    tail[0] = 0x25;  // field 4 (crc32c), fixed32
    std::memcpy(tail + 1, &crc, 4);
    grpc::Slice slices[3] = {grpc::Slice(head, h),
                             grpc::Slice(data, bytes, grpc::Slice::STATIC_SLICE),
                             grpc::Slice(tail, sizeof(tail))};
    buffer_ = grpc::ByteBuffer(slices, 3);
    next_ += count;
    StartWrite(&buffer_);
  }

  const worker::ModelState* const state_;
  grpc::CallbackServerContext* const ctx_;
  const bool park_;
  shoal::v1::ReadSliceRequest request_;
  grpc::Alarm alarm_;
  uint64_t round_ = 0;
  bool snapshot_ = false;
  uint64_t generation_ = 0;
  uint64_t next_ = 0;
  uint64_t end_ = 0;
  grpc::ByteBuffer buffer_;
};

// Walks the bytes of a received message across its slices.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>* slices) : slices_(slices) {
    if (slices_ != nullptr) Skip(0);
  }
  bool done() const { return slices_ == nullptr || index_ >= slices_->size(); }
  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = (*slices_)[index_].begin()[offset_];
    Skip(1);
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool Fixed32(uint32_t* v) {
    uint8_t b[4];
    for (uint8_t& x : b) {
      if (!Byte(&x)) return false;
    }
    std::memcpy(v, b, 4);
    return true;
  }
  // Calls fn(ptr, len) for each contiguous piece of the next `n` bytes.
  template <typename Fn>
  bool Pieces(size_t n, Fn fn) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = (*slices_)[index_];
      const size_t take = std::min(n, s.size() - offset_);
      fn(s.begin() + offset_, take);
      Skip(take);
      n -= take;
    }
    return true;
  }
  // True when the next `n` bytes lie in one slice; `*p` points at them.
  bool Contiguous(size_t n, const uint8_t** p) const {
    if (done() || (*slices_)[index_].size() - offset_ < n) return false;
    *p = (*slices_)[index_].begin() + offset_;
    return true;
  }

 private:
  void Skip(size_t n) {
    offset_ += n;
    while (index_ < slices_->size() && offset_ >= (*slices_)[index_].size()) {
      offset_ -= (*slices_)[index_].size();
      ++index_;
    }
  }
  const std::vector<grpc::Slice>* slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

struct ParsedChunk {
  uint64_t round = 0;
  uint64_t begin = 0;
  uint32_t crc = 0;
  size_t data_size = 0;
  bool has_data = false;
  Cursor data_at{nullptr};
};

// Fields of one TensorChunk; `data_at` is left at the data bytes.
absl::Status Parse(const std::vector<grpc::Slice>* slices, ParsedChunk* out) {
  Cursor c(slices);
  while (!c.done()) {
    uint64_t tag;
    if (!c.Varint(&tag)) return absl::DataLossError("truncated chunk");
    switch (tag) {
      case 0x08:
        if (!c.Varint(&out->round)) return absl::DataLossError("truncated chunk");
        break;
      case 0x10:
        if (!c.Varint(&out->begin)) return absl::DataLossError("truncated chunk");
        break;
      case 0x1A: {
        uint64_t n;
        if (!c.Varint(&n)) return absl::DataLossError("truncated chunk");
        out->has_data = true;
        out->data_size = n;
        out->data_at = c;
        if (!c.Pieces(n, [](const uint8_t*, size_t) {})) {
          return absl::DataLossError("truncated chunk");
        }
        break;
      }
      case 0x25:
        if (!c.Fixed32(&out->crc)) return absl::DataLossError("truncated chunk");
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("unexpected field tag ", tag));
    }
  }
  return absl::OkStatus();
}

// The checks of ChunkReceiver::Accept except the CRC.
absl::Status CheckChunk(const ParsedChunk& p, uint64_t round, uint64_t next, uint64_t end) {
  if (p.round != round) return absl::FailedPreconditionError("chunk of another round");
  if (p.data_size > kMaxChunkBytes) return absl::ResourceExhaustedError("chunk too big");
  if (!p.has_data || p.data_size == 0 || p.data_size % kBytesPerElement != 0) {
    return absl::InvalidArgumentError("chunk size is not a positive multiple of 4");
  }
  if (p.begin != next) return absl::InvalidArgumentError("gap or overlap");
  if (p.data_size / kBytesPerElement > end - next) {
    return absl::InvalidArgumentError("chunk runs past the end of the range");
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* ZcPeerService::ReadSlice(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  return new ZcReadSliceReactor(state_, ctx, request, park_averaged_reads_);
}

grpc::ServerUnaryReactor* ZcPeerService::GetPeerInfo(grpc::CallbackServerContext* ctx,
                                                     const shoal::v1::GetPeerInfoRequest* request,
                                                     shoal::v1::PeerInfo* response) {
  auto* reactor = ctx->DefaultReactor();
  *response = state_->Info();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

std::shared_ptr<grpc::Channel> ZcPeerClient::ChannelFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& ch = channels_[address];
  if (ch == nullptr) {
    // Shoal's channel settings (common/grpc_util.cc MakeChannel) plus the
    // extra arguments of this client, if any.
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    for (const auto& [key, value] : extra_args_) args.SetInt(key, value);
    ch = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  return ch;
}

namespace {

// Runs one ReadSlice call; `on_message` gets each received message's slices.
template <typename Fn>
absl::Status RawRead(const std::shared_ptr<grpc::Channel>& channel,
                     const shoal::v1::ReadSliceRequest& request, absl::Duration timeout,
                     std::atomic<uint64_t>* messages, std::atomic<uint64_t>* slice_count,
                     Fn on_message) {
  static const grpc::internal::RpcMethod method("/shoal.v1.Peer/ReadSlice",
                                                grpc::internal::RpcMethod::SERVER_STREAMING);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                    request));
  grpc::ByteBuffer message;
  std::vector<grpc::Slice> slices;
  absl::Status bad;
  while (reader->Read(&message)) {
    slices.clear();
    if (!message.Dump(&slices).ok()) {
      bad = absl::DataLossError("cannot read a chunk's bytes");
      break;
    }
    ++*messages;
    *slice_count += slices.size();
    bad = on_message(&slices);
    if (!bad.ok()) break;
  }
  if (!bad.ok()) {
    ctx.TryCancel();
    (void)reader->Finish();
    return bad;
  }
  return FromGrpcStatus(reader->Finish());
}

}  // namespace

absl::Status ZcPeerClient::ReadSliceInto(const std::string& address,
                                         const shoal::v1::ReadSliceRequest& request,
                                         absl::Duration timeout, float* dst) {
  uint64_t next = request.begin();
  const uint64_t end = request.end();
  absl::Status s = RawRead(ChannelFor(address), request, timeout, &messages_, &slices_,
                           [&](const std::vector<grpc::Slice>* slices) -> absl::Status {
                             ParsedChunk p;
                             RETURN_IF_ERROR(Parse(slices, &p));
                             RETURN_IF_ERROR(CheckChunk(p, request.round(), next, end));
                             // Checksum and copy block by block, so the copy reads bytes the
                             // checksum just brought into the cache.
                             auto* out = reinterpret_cast<uint8_t*>(dst + next);
                             uint32_t crc = 0;
                             p.data_at.Pieces(p.data_size, [&](const uint8_t* piece, size_t n) {
                               constexpr size_t kBlock = 96 << 10;
                               for (size_t off = 0; off < n; off += kBlock) {
                                 const size_t m = std::min(kBlock, n - off);
                                 crc = Crc32cExtend(crc, piece + off, m);
                                 std::memcpy(out, piece + off, m);
                                 out += m;
                               }
                             });
                             if (crc != p.crc) return absl::DataLossError("checksum mismatch");
                             next += p.data_size / kBytesPerElement;
                             return absl::OkStatus();
                           });
  if (!s.ok()) return s;
  if (next != end) return absl::DataLossError("stream ended before the end of the range");
  return absl::OkStatus();
}

absl::Status ZcPeerClient::ReadSlice(const std::string& address,
                                     const shoal::v1::ReadSliceRequest& request,
                                     absl::Duration timeout,
                                     const std::function<bool(const ChunkView&)>& on_chunk) {
  uint64_t next = request.begin();
  const uint64_t end = request.end();
  std::vector<float> scratch;
  absl::Status s = RawRead(ChannelFor(address), request, timeout, &messages_, &slices_,
                           [&](const std::vector<grpc::Slice>* slices) -> absl::Status {
                             ParsedChunk p;
                             RETURN_IF_ERROR(Parse(slices, &p));
                             RETURN_IF_ERROR(CheckChunk(p, request.round(), next, end));
                             const size_t count = p.data_size / kBytesPerElement;
                             const uint8_t* contiguous = nullptr;
                             const float* data;
                             // Bytes in one slice and aligned: a view, no copy. Otherwise gather.
                             if (p.data_at.Contiguous(p.data_size, &contiguous) &&
                                 reinterpret_cast<uintptr_t>(contiguous) % alignof(float) == 0) {
                               data = reinterpret_cast<const float*>(contiguous);
                             } else {
                               scratch.resize(count);
                               auto* out = reinterpret_cast<uint8_t*>(scratch.data());
                               p.data_at.Pieces(p.data_size, [&](const uint8_t* piece, size_t n) {
                                 std::memcpy(out, piece, n);
                                 out += n;
                               });
                               data = scratch.data();
                             }
                             if (Crc32cExtend(0, data, p.data_size) != p.crc) {
                               return absl::DataLossError("checksum mismatch");
                             }
                             if (!on_chunk(ChunkView{p.begin, data, count})) {
                               return absl::CancelledError("read cancelled by the caller");
                             }
                             next += count;
                             return absl::OkStatus();
                           });
  if (!s.ok()) return s;
  if (next != end) return absl::DataLossError("stream ended before the end of the range");
  return absl::OkStatus();
}

absl::StatusOr<shoal::v1::PeerInfo> ZcPeerClient::Probe(const std::string& address,
                                                        absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  ctx.set_wait_for_ready(true);
  shoal::v1::PeerInfo info;
  auto stub = shoal::v1::Peer::NewStub(ChannelFor(address));
  RETURN_IF_ERROR(FromGrpcStatus(stub->GetPeerInfo(&ctx, shoal::v1::GetPeerInfoRequest(), &info)));
  return info;
}

}  // namespace shoal::bench
