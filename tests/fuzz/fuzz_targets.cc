#include "tests/fuzz/fuzz_targets.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/model_file.h"
#include "common/printable.h"
#include "common/run_options.h"
#include "common/sha256.h"
#include "common/tensor_wire.h"
#include "common/tensor_wire_grpc.h"
#include "common/worker_state.h"
#include "common/zone.h"
#include "services/checkpoint/core/checkpoint_store.h"
#include "services/coordinator/core/join_limiter.h"
#include "services/coordinator/core/request_limits.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/round_trust.h"
#include "services/coordinator/core/run_record.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/dataset.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/core/gossip_policy.h"
#include "services/worker/core/idx_reader.h"
#include "services/worker/core/manifest_cache.h"
#include "services/worker/core/serving_rule.h"
#include "services/worker/core/transfer_checks.h"
#include "tools/shoalctl/diagnose.h"
#include "tools/shoalctl/status_format.h"
#include "tools/shoalctl/terminal_text.h"

namespace shoal::fuzz {

void FuzzFail(const char* file, int line, const char* what) {
  std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", file, line, what);
  std::fflush(stderr);
  abort();
}

namespace {

// Takes fixed-size values off the front of the input; past the end it
// yields zeros, so every input is usable.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t U8() { return size_ > 0 ? (--size_, *data_++) : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(U8()) << (8 * i);
    return v;
  }
  // Up to `n` bytes.
  std::string Bytes(size_t n) {
    n = std::min(n, size_);
    std::string s(reinterpret_cast<const char*>(data_), n);
    data_ += n;
    size_ -= n;
    return s;
  }
  std::string Rest() { return Bytes(size_); }
  size_t left() const { return size_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

// `message` cut at `cuts` positions into separately allocated pieces (so
// that a read past a piece is a heap overflow the sanitizer sees), as gRPC
// hands a message over in several receive slices.
struct Pieces {
  std::vector<std::unique_ptr<uint8_t[]>> owned;
  std::vector<BytePiece> pieces;
};
Pieces Cut(const std::string& message, std::vector<size_t> cuts) {
  for (size_t& c : cuts) c = message.empty() ? 0 : c % (message.size() + 1);
  cuts.push_back(0);
  cuts.push_back(message.size());
  std::sort(cuts.begin(), cuts.end());
  Pieces p;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const size_t n = cuts[i + 1] - cuts[i];
    auto buf = std::make_unique<uint8_t[]>(std::max<size_t>(n, 1));
    std::memcpy(buf.get(), message.data() + cuts[i], n);
    p.pieces.push_back(BytePiece{buf.get(), n});
    p.owned.push_back(std::move(buf));
  }
  return p;
}

std::string Gather(const RawChunk& c) {
  std::string s;
  for (const BytePiece& p : c.data) s.append(reinterpret_cast<const char*>(p.data), p.size);
  return s;
}

// ---- tensor_chunk: one TensorChunk as the worker's client receives it
// (ParseChunk across receive slices, then ChunkReceiver on both forms).
void TensorChunkTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t flags = in.U8();
  std::vector<size_t> cuts;
  for (int i = 0; i < (flags & 3); ++i) cuts.push_back(in.U16());
  const uint16_t range = in.U16();  // elements the receiver expects
  const std::string message = in.Rest();
  Pieces p = Cut(message, cuts);

  RawChunk raw;
  absl::Status parsed = ParseChunk(p.pieces.data(), p.pieces.size(), &raw);
  shoal::v1::TensorChunk proto;
  const bool proto_ok = proto.ParseFromString(message);
  if (!parsed.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(parsed));
    return;
  }
  // ParseChunk accepts only what protobuf accepts, with the same values.
  FUZZ_CHECK(proto_ok);
  FUZZ_CHECK(proto.round() == raw.round);
  FUZZ_CHECK(proto.begin() == raw.begin);
  FUZZ_CHECK(proto.crc32c() == raw.crc32c);
  const std::string bytes = Gather(raw);
  FUZZ_CHECK(bytes.size() == raw.data_size);
  FUZZ_CHECK(proto.data() == bytes);

  // Round and CRC right or wrong as the flags say, so both paths are taken.
  const uint64_t round = (flags & 4) ? raw.round + 1 : raw.round;
  if (flags & 8) {
    raw.crc32c = Crc32c(bytes.data(), bytes.size());
    proto.set_crc32c(raw.crc32c);
  }
  const uint64_t begin = (flags & 16) ? raw.begin : raw.begin - (flags >> 5);
  const uint64_t end = begin + range < begin ? ChunkSequence::kUnbounded : begin + range;
  ChunkReceiver r1(round, begin, end);
  ChunkReceiver r2(round, begin, end);
  absl::StatusOr<ChunkView> v1 = r1.Accept(raw);
  absl::StatusOr<ChunkView> v2 = r2.Accept(proto);
  FUZZ_CHECK(v1.status().code() == v2.status().code());
  if (!v1.ok()) return;
  FUZZ_CHECK(v1->begin == raw.begin && v2->begin == raw.begin);
  FUZZ_CHECK(v1->count * kBytesPerElement == bytes.size() && v1->count == v2->count);
  FUZZ_CHECK(v1->count <= end - begin && v1->begin >= begin);
  FUZZ_CHECK(raw.crc32c == Crc32c(bytes.data(), bytes.size()));
  std::vector<float> a(v1->count), b(v1->count);
  v1->CopyTo(a.data());
  v2->CopyTo(b.data());
  FUZZ_CHECK(std::memcmp(a.data(), bytes.data(), bytes.size()) == 0);
  FUZZ_CHECK(std::memcmp(b.data(), bytes.data(), bytes.size()) == 0);
  std::vector<float> sum(v1->count, 0.0f);
  v1->AddTo(sum.data());
}

// ---- chunk_stream: a whole ReadSlice stream of [begin, begin + count)
// into a buffer of exactly that size, as the Exchanger writes model memory;
// the same sizes through a byte-unit ChunkSequence (checkpoint LayerChunks).
void ChunkStreamTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint64_t round = in.U8();
  const uint64_t begin = in.U64();
  const uint64_t count = in.U16() % 4097;
  // A range no caller can ask for (past 2^64, or ending at kUnbounded,
  // which means "to the end").
  if (begin >= ChunkSequence::kUnbounded - count) return;
  std::vector<float> model(count, 0.0f);
  ChunkReceiver receiver(round, begin, begin + count);
  ChunkSequence bytes_seq(begin, begin + count, 1);
  while (in.left() > 0) {
    const uint8_t cuts = in.U8();
    const std::string message = in.Bytes(in.U16());
    Pieces p = Cut(message, {cuts, static_cast<size_t>(cuts) * 7});
    RawChunk raw;
    if (!ParseChunk(p.pieces.data(), p.pieces.size(), &raw).ok()) break;
    absl::StatusOr<ChunkView> view = receiver.Accept(raw);
    absl::StatusOr<uint64_t> n = bytes_seq.Check(raw.begin, raw.data_size);
    if (n.ok()) bytes_seq.Advance(*n);
    if (!view.ok()) {
      const absl::StatusCode c = view.status().code();
      FUZZ_CHECK(c == absl::StatusCode::kFailedPrecondition ||
                 c == absl::StatusCode::kInvalidArgument ||
                 c == absl::StatusCode::kResourceExhausted || c == absl::StatusCode::kDataLoss);
      break;
    }
    FUZZ_CHECK(view->begin >= begin && view->count <= begin + count - view->begin);
    view->AddTo(model.data() + (view->begin - begin));
    FUZZ_CHECK(receiver.received_until() == view->begin + view->count);
  }
  FUZZ_CHECK(receiver.received_until() >= begin && receiver.received_until() <= begin + count);
  FUZZ_CHECK(bytes_seq.next() >= begin && bytes_seq.next() <= begin + count);
  const absl::Status done = receiver.Finish();
  FUZZ_CHECK(done.ok() == (receiver.received_until() == begin + count));
}

// ---- read_slice_request: the request bytes the Peer service's raw
// ReadSlice method decodes itself.
void ReadSliceRequestTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const size_t cut = in.U8();
  const std::string message = in.Rest();
  const size_t at = message.empty() ? 0 : cut % (message.size() + 1);
  grpc::Slice slices[2] = {grpc::Slice(message.data(), at),
                           grpc::Slice(message.data() + at, message.size() - at)};
  grpc::ByteBuffer buffer(slices, 2);
  shoal::v1::ReadSliceRequest request;
  const absl::Status s = DecodeReadSliceRequest(buffer, &request);
  shoal::v1::ReadSliceRequest expected;
  const bool ok = expected.ParseFromString(message);
  FUZZ_CHECK(s.ok() == ok);
  if (!s.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(s));
    return;
  }
  FUZZ_CHECK(request.SerializeAsString() == expected.SerializeAsString());
}

// ---- model_manifest: a manifest received from a peer (CheckManifest, what
// the syncer accepts before building its piece table from it), and the
// worker's own layer table (CheckLayers) through ComputeModelManifest, whose
// result the syncer of another worker must accept.
void ModelManifestTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t mode = in.U8();
  const uint64_t total = in.U16();
  if ((mode & 1) == 0) {
    shoal::v1::ModelManifest m;
    if (!m.ParseFromString(in.Rest())) return;
    const absl::Status s = worker::CheckManifest(m, m.round(), m.model_hash(), total);
    if (!s.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s));
      return;
    }
    // What the syncer then relies on: every layer lies inside the model,
    // the layers tile it, and the piece loop ends.
    FUZZ_CHECK(m.piece_elements() > 0);
    uint64_t next = 0;
    for (const auto& l : m.layers()) {
      FUZZ_CHECK(l.offset() == next);
      FUZZ_CHECK(l.elements() > 0 && l.elements() <= total - l.offset());
      next = l.offset() + l.elements();
      uint64_t pieces = 0;
      for (uint64_t b = 0; b < l.elements(); b += m.piece_elements()) {
        FUZZ_CHECK(++pieces <= l.elements());
        if (b + m.piece_elements() < b) break;  // the syncer's loop would wrap
      }
    }
    FUZZ_CHECK(next == total);
    return;
  }
  const size_t n = in.U8() % 8;
  std::vector<worker::LayerSpan> layers(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t name = in.U8();
    if (name != 0) layers[i].name = absl::StrCat("layer", name);
    layers[i].offset = in.U64();
    layers[i].elements = in.U64();
  }
  const uint64_t piece_elements = std::max<uint64_t>(1, in.U16());
  const absl::Status s = worker::CheckLayers(layers, total);
  if (!s.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(s));
    return;
  }
  for (const auto& l : layers) {
    FUZZ_CHECK(l.offset <= total && l.elements <= total - l.offset);
  }
  std::vector<float> model(total);
  const std::string fill = in.Rest();
  std::memcpy(model.data(), fill.data(), std::min(fill.size(), model.size() * sizeof(float)));
  const shoal::v1::ModelManifest m =
      worker::ComputeModelManifest(model.data(), total, layers, piece_elements, 7, "");
  FUZZ_CHECK(m.model_hash() == Sha256Hex(model.data(), total * sizeof(float)));
  const absl::Status back = worker::CheckManifest(m, 7, m.model_hash(), total);
  FUZZ_CHECK(back.ok());
}

// A directory of our own for the whole process (fuzzers run millions of
// inputs; one directory, reused).
const std::string& ScratchDir() {
  static const std::string* dir = [] {
    std::string tmpl = "/tmp/shoal-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) FuzzFail(__FILE__, __LINE__, "mkdtemp");
    return new std::string(tmpl);
  }();
  return *dir;
}

// ---- run_record: the coordinator's --state_dir/run_record.pb, loaded at
// start and resumed from.
void RunRecordTarget(const uint8_t* data, size_t size) {
  const std::string dir = ScratchDir() + "/state";
  static bool opened = [&] { return coordinator::RunRecordStore(dir).Open().ok(); }();
  FUZZ_CHECK(opened);
  coordinator::RunRecordStore store(dir);
  {
    std::ofstream out(store.path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> record = store.Load();
  if (!record.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(record.status()));
    return;
  }
  FUZZ_CHECK(record->has_value());
  const shoal::v1::RunRecord& r = **record;
  FUZZ_CHECK(!r.run_id().empty());
  static FakeClock clock;
  coordinator::EngineOptions options;
  options.run_id = r.run_id();
  options.config.mutable_sync()->set_min_participants(1);
  options.resume = r;
  coordinator::RoundEngine engine(options, &clock);
  const shoal::v1::RunStatus status = engine.Status();
  if (!r.finished()) {
    // The run continues after the recorded round, never before it.
    FUZZ_CHECK(status.round() > r.last_completed_round());
  }
  shoal::v1::JoinRequest join;
  join.set_peer_address("127.0.0.1:9");
  absl::StatusOr<coordinator::JoinResult> joined = engine.Join(join);
  if (joined.ok()) {
    // Worker ids the engine hands out are "w<n>" with n > 0.
    const std::string& id = joined->response.worker_id();
    uint64_t number = 0;
    FUZZ_CHECK(id.size() > 1 && id[0] == 'w' && absl::SimpleAtoi(id.substr(1), &number) &&
               number > 0);
  }
  (void)engine.Record();
}

// The store of the checkpoint_id target: one checkpoint "run-r1" of two
// small layers, opened once per process.
checkpoint::CheckpointStore* FuzzStore() {
  static checkpoint::CheckpointStore* store = [] {
    checkpoint::StoreOptions options;
    options.data_dir = ScratchDir() + "/store";
    options.verify_on_start = false;
    auto opened = checkpoint::CheckpointStore::Open(options);
    if (!opened.ok()) FuzzFail(__FILE__, __LINE__, "cannot open the store");
    const std::string a(4000, 'a'), b(40, 'b');
    shoal::v1::Manifest m;
    m.set_run_id("run");
    m.set_round(1);
    for (const auto& [name, bytes] : {std::pair{"fc.weight", &a}, std::pair{"fc.bias", &b}}) {
      auto* l = m.add_layers();
      l->set_name(name);
      l->set_dtype("float32");
      l->add_shape(static_cast<int64_t>(bytes->size() / 4));
      l->set_bytes(bytes->size());
      l->set_sha256(Sha256Hex(bytes->data(), bytes->size()));
    }
    auto upload = (*opened)->BeginUpload(m);
    if (!upload.ok() || !(*upload)->Append(0, 0, a).ok() || !(*upload)->Append(1, 0, b).ok() ||
        !(*upload)->Commit().ok()) {
      FuzzFail(__FILE__, __LINE__, "cannot upload the seed checkpoint");
    }
    return opened->release();
  }();
  return store;
}

// ---- checkpoint_id: ids and ranges as the store's GetManifest, ReadLayer,
// Info and Delete get them from any client, and upload headers
// (ValidateManifest: the run id and layer digests name files).
void CheckpointIdTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t mode = in.U8();
  if (mode & 1) {
    shoal::v1::Manifest m;
    if (!m.ParseFromString(in.Rest())) return;
    const absl::Status s = checkpoint::ValidateManifest(m);
    if (!s.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(s));
      return;
    }
    // An accepted upload gets an id the store will serve, and blob names
    // that are plain hex (either case: the store lowercases digests).
    FUZZ_CHECK(
        checkpoint::ValidateCheckpointId(checkpoint::CheckpointId(m.run_id(), m.round())).ok());
    for (const auto& l : m.layers()) {
      FUZZ_CHECK(l.sha256().size() == 64 &&
                 l.sha256().find_first_not_of("0123456789abcdefABCDEF") == std::string::npos);
    }
    return;
  }
  checkpoint::CheckpointStore* store = FuzzStore();
  const uint32_t layer = in.U8() % 4;
  const uint64_t offset = (mode & 2) ? in.U64() : in.U16();
  const uint64_t length = (mode & 4) ? in.U64() : in.U16();
  const std::string id = in.Rest();
  const absl::Status valid = checkpoint::ValidateCheckpointId(id);
  if (valid.ok()) {
    FUZZ_CHECK(!id.empty() && id.size() <= checkpoint::kMaxCheckpointIdLength);
    FUZZ_CHECK(id.find('/') == std::string::npos && id.find('\0') == std::string::npos);
    FUZZ_CHECK(!absl::StrContains(id, "..") && id[0] != '.');
  } else {
    FUZZ_CHECK(absl::IsInvalidArgument(valid));
  }
  const bool known = id == "run-r1";
  auto expect = [&](const absl::Status& s) {
    if (!valid.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(s));
    } else if (!known) {
      FUZZ_CHECK(absl::IsNotFound(s));
    }
  };
  expect(store->GetManifest(id).status());
  expect(store->Info(id).status());
  absl::StatusOr<std::unique_ptr<checkpoint::LayerReader>> reader =
      store->ReadLayer(id, layer, offset, length);
  expect(reader.status());
  if (known) {
    const uint64_t bytes = layer == 0 ? 4000 : 40;
    if (layer > 1 || offset > bytes || length > bytes - offset) {
      FUZZ_CHECK(absl::IsOutOfRange(reader.status()));
    } else {
      FUZZ_CHECK(reader.ok());
      uint64_t got = 0;
      std::string piece;
      while (true) {
        absl::StatusOr<uint64_t> at = (*reader)->Next(1000, &piece);
        FUZZ_CHECK(at.ok());
        if (piece.empty()) break;
        FUZZ_CHECK(*at == offset + got);
        got += piece.size();
      }
      FUZZ_CHECK(got == (length == 0 ? bytes - offset : length));
      FUZZ_CHECK((*reader)->Finish().ok());
    }
  } else {
    expect(store->Delete(id));
  }
  FUZZ_CHECK(store->size() == 1);
}

// ---- address: a worker's --advertise / Join(peer_address) as the
// coordinator admits it, and HostOf, which servers use on --listen.
void AddressTarget(const uint8_t* data, size_t size) {
  const std::string address(reinterpret_cast<const char*>(data), size);
  const std::string host = HostOf(address);
  FUZZ_CHECK(host.size() <= address.size());
  FUZZ_CHECK(address.compare(0, host.size(), host) == 0);
  static FakeClock clock;
  coordinator::EngineOptions options;
  options.run_id = "fuzz";
  options.config.mutable_sync()->set_min_participants(2);
  coordinator::RoundEngine engine(options, &clock);
  shoal::v1::JoinRequest join;
  join.set_peer_address(address);
  absl::StatusOr<coordinator::JoinResult> joined = engine.Join(join);
  if (!joined.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(joined.status()));
    return;
  }
  // An admitted address is "host:port" with a port in 1..65535, and is
  // what the coordinator hands to the other workers.
  const size_t colon = address.rfind(':');
  FUZZ_CHECK(colon != std::string::npos && colon > 0);
  uint32_t port = 0;
  FUZZ_CHECK(absl::SimpleAtoi(address.substr(colon + 1), &port) && port >= 1 && port <= 65535);
  FUZZ_CHECK(HostOf(address) == address.substr(0, colon));
}

// Bit for bit (NaNs included).
bool SameFloats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The codecs' decoders (services/worker/core/codec.h). Input: one byte
// picking the codec (0 fp32, 1 fp16, 2 bf16, 3 int8, 4 topk:F, 5
// randomk:F, 6 sparse:F), for the sparse codecs a u16 picking F = (v + 1)
// / 65536 (so every k from 1 to n is reachable), two bytes (little-endian)
// of element count, then the encoding. A refusal is INVALID_ARGUMENT and
// writes nothing; an accepted encoding decodes to finite values for int8
// and the sparse codecs (they are averaged into the model as they are),
// the same way twice, and re-encodes to something that decodes.
void EncodedSliceTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t which = in.U8() % 7;
  std::string name = std::vector<std::string>{"fp32",  "fp16",     "bf16",   "int8",
                                              "topk:", "randomk:", "sparse:"}[which];
  if (which >= 4) name += absl::StrCat((in.U16() + 1) / 65536.0);
  const size_t n = in.U16();
  absl::StatusOr<std::unique_ptr<worker::Codec>> codec = worker::MakeCodec(name);
  FUZZ_CHECK(codec.ok());
  const std::string encoded = in.Rest();
  const absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(encoded.data()),
                                        encoded.size());
  std::vector<float> out(n, 12345.0f);
  const absl::Status s = (*codec)->DecodeSlice(bytes, n, out.data());
  if (!s.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(s));
    for (float v : out) FUZZ_CHECK(v == 12345.0f);
    return;
  }
  FUZZ_CHECK(bytes.size() <= (*codec)->MaxEncodedBytes(n));
  if (which >= 3) {
    for (float v : out) FUZZ_CHECK(std::isfinite(v));
  }
  if (which == 4 || which == 5) {
    // k elements set, the others 0.
    size_t nonzero = 0;
    for (float v : out) nonzero += v != 0.0f;
    FUZZ_CHECK(n == 0 || (bytes.size() >= 4 && nonzero <= bytes[0] + (size_t{bytes[1]} << 8) +
                                                              (size_t{bytes[2]} << 16)));
  }
  std::vector<float> again(n);
  FUZZ_CHECK((*codec)->DecodeSlice(bytes, n, again.data()).ok());
  FUZZ_CHECK(SameFloats(out, again));
  for (float& v : out) {
    if (!std::isfinite(v)) v = 0;
  }
  const std::string re = (*codec)->EncodeSlice(out.data(), n, 7);
  FUZZ_CHECK(re.size() <= (*codec)->MaxEncodedBytes(n));
  FUZZ_CHECK(
      (*codec)
          ->DecodeSlice(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(re.data()), re.size()),
                        n, again.data())
          .ok());
  // Lossless codecs give back what they were given.
  if (which == 0) FUZZ_CHECK(SameFloats(out, again));
}

// ---- encoded_pieces: a blob of Peer.ReadEncoded as the reader assembles
// it (EncodedAssembly: exchanger slices and the outer momentum), from
// pieces a peer serves (ServeEncodedPiece, EncodedStore::Find) or makes
// up. Input: mode u8 (bit 0: exact size expected, bit 1: a made-up peer),
// round u8, max u16, blob length u16, the blob, then per piece: flags u8,
// offset u16, total u16, length u16, the bytes.
void EncodedPiecesTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t mode = in.U8();
  const uint64_t round = in.U8();
  const uint64_t max_bytes = in.U16();
  const std::string blob = in.Bytes(in.U16());
  std::optional<uint64_t> exact;
  if (mode & 1) exact = blob.size();
  worker::EncodedAssembly assembly(round, max_bytes, exact, "fuzz blob");

  if ((mode & 2) == 0) {
    // An honest peer: the store finds the blob, pieces are cut by
    // ServeEncodedPiece at the reader's offsets with a fuzzed piece size.
    worker::EncodedStore store;
    store.BeginRound(round, 0);
    store.Publish(round, 0, shoal::v1::AVERAGED, 0, 10, std::make_shared<const std::string>(blob));
    shoal::v1::ReadEncodedRequest request;
    request.set_round(round);
    request.set_kind(shoal::v1::AVERAGED);
    request.set_begin(0);
    request.set_end(10);
    absl::StatusOr<worker::Blob> found = store.Find(request);
    FUZZ_CHECK(found.ok() && **found == blob);
    // Any other request of the store is refused with a documented code.
    shoal::v1::ReadEncodedRequest other;
    other.set_round(in.U8());
    other.set_attempt(in.U8() % 2);
    other.set_kind(static_cast<shoal::v1::SliceKind>(in.U8() % 6));
    other.set_begin(in.U8());
    other.set_end(in.U8());
    absl::StatusOr<worker::Blob> f = store.Find(other);
    if (!f.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(f.status()) || absl::IsUnavailable(f.status()) ||
                 absl::IsFailedPrecondition(f.status()));
    } else {
      FUZZ_CHECK(**f == blob);
    }
    const size_t piece_max = 1 + in.U8();
    int steps = 0;
    while (!assembly.done()) {
      FUZZ_CHECK(++steps <= 70000);
      request.set_offset(assembly.offset());
      absl::StatusOr<shoal::v1::EncodedPiece> piece =
          worker::ServeEncodedPiece(**found, request, piece_max);
      FUZZ_CHECK(piece.ok());
      const absl::Status s = assembly.Add(*piece);
      if (!s.ok()) {
        // Only a blob larger than the reader allows is refused.
        FUZZ_CHECK(absl::IsInvalidArgument(s) && blob.size() > max_bytes);
        return;
      }
    }
    FUZZ_CHECK(blob.size() <= max_bytes && assembly.bytes() == blob);
    // An offset past the end is refused.
    request.set_offset(blob.size() + 1);
    FUZZ_CHECK(absl::IsInvalidArgument(worker::ServeEncodedPiece(blob, request, 8).status()));
    return;
  }
  // A made-up peer: whatever it sends, what the reader keeps is a prefix of
  // what it announced, and done() means every announced byte arrived.
  std::string kept;
  while (in.left() > 0 && !assembly.done()) {
    const uint8_t flags = in.U8();
    shoal::v1::EncodedPiece piece;
    piece.set_round((flags & 1) ? round + 1 : round);
    const uint64_t offset = in.U16();
    piece.set_offset((flags & 2) ? offset : assembly.offset());
    const uint64_t total = in.U16();
    piece.set_total_bytes((flags & 4) ? total : blob.size());
    piece.set_data(in.Bytes(in.U16()));
    piece.set_crc32c((flags & 8) ? in.U16() : Crc32c(piece.data().data(), piece.data().size()));
    const uint64_t before = assembly.offset();
    const absl::Status s = assembly.Add(piece);
    if (!s.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) ||
                 absl::IsDataLoss(s));
      FUZZ_CHECK(assembly.offset() == before);
      continue;
    }
    FUZZ_CHECK(piece.round() == round && piece.offset() == before);
    FUZZ_CHECK(piece.total_bytes() <= max_bytes);
    if (exact) FUZZ_CHECK(piece.total_bytes() == *exact);
    kept += piece.data();
    FUZZ_CHECK(assembly.bytes() == kept && kept.size() <= piece.total_bytes());
  }
  FUZZ_CHECK(assembly.bytes().size() <= max_bytes);
  if (exact && assembly.done()) FUZZ_CHECK(assembly.bytes().size() == *exact);
}

// ---- gossip_transfer: what a gossip fetch takes from a peer
// (services/worker/gossip_fetcher.cc): its GetPeerInfo answer
// (CheckGossipPeerInfo), the GOSSIP read built from it (GossipReadRequest)
// and the chunks of that read into a buffer of exactly the model's size;
// the model is handed over only when the stream is complete, and the
// interpolation with an accepted peer state stays finite. The serving
// side's range check (CheckGossipRange) on the same request. Input:
// elements u16, PeerInfo length u16, PeerInfo, then chunk stream messages
// as in chunk_stream ([cuts u8, len u16, message]*).
void GossipTransferTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint64_t elements = in.U16() % 4097;
  shoal::v1::PeerInfo info;
  if (!info.ParseFromString(in.Bytes(in.U16()))) return;
  const absl::Status checked = worker::CheckGossipPeerInfo(info, elements);
  if (!checked.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(checked) || absl::IsFailedPrecondition(checked));
    return;
  }
  FUZZ_CHECK(std::isfinite(info.gossip_clock()) && std::isfinite(info.gossip_loss()));
  // The interpolation with the peer's state, for each method, from a sane
  // own state.
  for (const char* method : {"constant:0.3", "clock", "loss"}) {
    worker::GossipConfig config;
    FUZZ_CHECK(worker::ParseInterpolation(method, &config).ok());
    config.divergence_threshold = 0.5;
    const worker::GossipState self{1000, 0.25};
    const worker::GossipState peer{info.gossip_clock(), info.gossip_loss()};
    const double a = worker::InterpolationFactor(config, self, peer);
    FUZZ_CHECK(a >= 0 && a <= 1);
    FUZZ_CHECK(std::isfinite(worker::InterpolateClock(self.clock, 900, peer.clock, a)));
  }
  const shoal::v1::ReadSliceRequest req = worker::GossipReadRequest(info, elements, "w1");
  FUZZ_CHECK(req.kind() == shoal::v1::GOSSIP && req.begin() == 0 && req.end() == elements);
  const absl::Status served = worker::CheckGossipRange(req, elements);
  FUZZ_CHECK(served.ok() == (elements > 0));
  std::vector<float> incoming(elements, 0.0f);
  std::vector<uint8_t> written(elements, 0);
  ChunkReceiver receiver(req.round(), req.begin(), req.end());
  absl::Status stream;
  while (in.left() > 0) {
    const uint8_t cuts = in.U8();
    const std::string message = in.Bytes(in.U16());
    Pieces p = Cut(message, {cuts, static_cast<size_t>(cuts) * 5});
    RawChunk raw;
    stream = ParseChunk(p.pieces.data(), p.pieces.size(), &raw);
    if (!stream.ok()) break;
    absl::StatusOr<ChunkView> view = receiver.Accept(raw);
    if (!view.ok()) {
      stream = view.status();
      break;
    }
    FUZZ_CHECK(view->begin + view->count <= elements);
    view->CopyTo(incoming.data() + view->begin);  // what the fetcher does
    for (uint64_t i = view->begin; i < view->begin + view->count; ++i) ++written[i];
  }
  if (stream.ok()) stream = receiver.Finish();
  if (!stream.ok()) return;  // the fetcher hands nothing over
  // Handed over: every element written exactly once.
  for (uint8_t w : written) FUZZ_CHECK(w == 1);
}

// ---- model_file: the run's TorchScript file fetched in pieces
// (FetchModelFile) from sources that serve it honestly
// (ServeModelFilePiece) or make pieces up; accepted only whole and with
// the right digest. Input: flags u8, file length u16, the file, then per
// made-up piece: offset u16, total u16, length u16, bytes.
void ModelFileTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t flags = in.U8();
  const std::string file = in.Bytes(in.U16());
  const std::string sha = Sha256Hex(file.data(), file.size());
  const uint64_t claimed = (flags & 1) ? file.size() + (flags >> 4) : file.size();
  // The serving side, for a fuzzed request.
  shoal::v1::GetModelFileRequest ask;
  ask.set_sha256((flags & 2) ? absl::AsciiStrToUpper(sha) : sha.substr(0, 63 - (flags & 1)));
  ask.set_offset(in.U16());
  ask.set_max_bytes(in.U16());
  absl::StatusOr<shoal::v1::ModelFileChunk> served = ServeModelFilePiece(file, sha, ask);
  if (!served.ok()) {
    FUZZ_CHECK(absl::IsNotFound(served.status()) || absl::IsOutOfRange(served.status()));
  } else {
    FUZZ_CHECK(served->offset() == ask.offset() && served->total_bytes() == file.size());
    FUZZ_CHECK(file.compare(ask.offset(), served->data().size(), served->data()) == 0);
  }
  // A made-up source, then (flags bit 2) an honest one.
  std::vector<std::string> made_up;
  while (in.left() > 0) made_up.push_back(in.Bytes(6 + in.U8()));
  size_t next = 0;
  std::vector<ModelFileSource> sources;
  sources.push_back(
      {"made-up",
       [&](const shoal::v1::GetModelFileRequest& r) -> absl::StatusOr<shoal::v1::ModelFileChunk> {
         if (next >= made_up.size()) return absl::UnavailableError("no more");
         Input piece(reinterpret_cast<const uint8_t*>(made_up[next].data()), made_up[next].size());
         ++next;
         shoal::v1::ModelFileChunk c;
         const uint16_t off = piece.U16();
         c.set_offset(off == 0xFFFF ? r.offset() : off);
         const uint16_t total = piece.U16();
         c.set_total_bytes(total == 0xFFFF ? claimed : total);
         c.set_data(piece.Rest());
         return c;
       }});
  if (flags & 4) {
    sources.push_back({"honest", [&](const shoal::v1::GetModelFileRequest& r) {
                         shoal::v1::GetModelFileRequest small = r;
                         small.set_max_bytes(1 + (flags >> 3));
                         return ServeModelFilePiece(file, sha, small);
                       }});
  }
  uint64_t last_progress = 0;
  absl::StatusOr<FetchedModelFile> got =
      FetchModelFile(sources, sha, claimed, [&](uint64_t done, uint64_t total, const std::string&) {
        FUZZ_CHECK(done <= total && total == claimed);
        last_progress = done;
      });
  if (!got.ok()) {
    const absl::StatusCode c = got.status().code();
    FUZZ_CHECK(c == absl::StatusCode::kDataLoss || c == absl::StatusCode::kUnavailable ||
               c == absl::StatusCode::kNotFound || c == absl::StatusCode::kOutOfRange);
    return;
  }
  // Only the file itself is ever accepted.
  FUZZ_CHECK(got->bytes == file && claimed == file.size());
  FUZZ_CHECK(Sha256Hex(got->bytes.data(), got->bytes.size()) == sha);
  FUZZ_CHECK(file.empty() || last_progress == file.size());
}

// ---- auth: a token file's text (ReadTokenFile, ValidateToken) and the
// `authorization` metadata a server checks (TokenGate::Check). Input: mode
// u8, token length u8, the run token's text, then the metadata value(s)
// separated by '\n'.
void AuthTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t mode = in.U8();
  const std::string text = in.Bytes(in.U8() * 4 + in.U8());
  const std::string path = ScratchDir() + "/token";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  if (!token.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(token.status()));
    // A refusal never echoes the token (it is a secret): the message of
    // the same text with each printable character replaced by another is
    // the same message.
    std::string masked = text;
    for (char& c : masked) {
      if (c > 0x20 && c < 0x7f) c = c == 'a' ? 'b' : 'a';
    }
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(masked.data(), static_cast<std::streamsize>(masked.size()));
    }
    const absl::StatusOr<std::string> other = ReadTokenFile(path);
    FUZZ_CHECK(!other.ok() && other.status().message() == token.status().message());
    return;
  }
  FUZZ_CHECK(ValidateToken(*token).ok());
  FUZZ_CHECK(token->size() >= kMinTokenLength && token->size() <= kMaxTokenLength);
  FUZZ_CHECK(absl::StrContains(text, *token));
  for (char c : *token) FUZZ_CHECK(c > 0x20 && c < 0x7f);
  const std::string admin = (mode & 1) ? *token + "-admin" : std::string();
  const TokenGate gate(*token, admin);
  FUZZ_CHECK(!gate.open());
  // The metadata values, as gRPC hands them over.
  std::vector<std::string> values;
  for (absl::string_view v : absl::StrSplit(in.Rest(), '\n')) values.emplace_back(v);
  if (mode & 2) values.push_back(absl::StrCat(kBearerPrefix, *token));
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  const std::string key = (mode & 4) ? "Authorization" : kAuthMetadataKey;
  for (const std::string& v : values) metadata.emplace(key, v);
  for (Access access : {Access::kMember, Access::kAdmin}) {
    const absl::Status s = gate.Check(metadata, access);
    // gRPC keeps the first value of a key that appears more than once.
    auto it = metadata.find(kAuthMetadataKey);
    const std::string first =
        it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
    const bool is_run = first == absl::StrCat(kBearerPrefix, *token);
    const bool is_admin = !admin.empty() && first == absl::StrCat(kBearerPrefix, admin);
    if (is_admin || (is_run && access == Access::kMember)) {
      FUZZ_CHECK(s.ok());
    } else if (is_run) {
      FUZZ_CHECK(absl::IsPermissionDenied(s));
    } else {
      FUZZ_CHECK(absl::IsUnauthenticated(s));
    }
  }
}

// ---- run_specs: the spec strings of flags and of the run config every
// worker parses the same way: --codec, --aggregation, --interpolation,
// --data_split, --outer_optimizer, --input_shape. Input: selector u8, the
// text. Accepted values lie in their documented ranges.
void RunSpecsTarget(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto refused = [](const absl::Status& s) { FUZZ_CHECK(absl::IsInvalidArgument(s)); };
  switch (data[0] % 6) {
    case 0: {
      absl::StatusOr<CodecSpec> spec = ParseCodecSpec(text);
      if (!spec.ok()) return refused(spec.status());
      FUZZ_CHECK(spec->fraction > 0 && spec->fraction <= 1);
      absl::StatusOr<std::unique_ptr<worker::Codec>> codec = worker::MakeCodec(text);
      FUZZ_CHECK(codec.ok());
      // Every slice size encodes within its bound, and the name round-trips.
      for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}}) {
        std::vector<float> x(n, 1.5f);
        const std::string e = (*codec)->EncodeSlice(x.data(), n, 1);
        FUZZ_CHECK(e.size() <= (*codec)->MaxEncodedBytes(n));
        std::vector<float> y(n);
        FUZZ_CHECK((*codec)
                       ->DecodeSlice(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(e.data()),
                                                         e.size()),
                                     n, y.data())
                       .ok());
      }
      FUZZ_CHECK(ParseCodecSpec((*codec)->name()).ok());
      return;
    }
    case 1: {
      absl::StatusOr<AggregationSpec> spec = ParseAggregation(text);
      if (!spec.ok()) return refused(spec.status());
      if (spec->kind == AggregationSpec::Kind::kTrimmedMean) {
        FUZZ_CHECK(spec->trim >= 1 && spec->trim <= 1000);
      }
      FUZZ_CHECK(MinContributions(*spec) >= 1);
      absl::StatusOr<AggregationSpec> again = ParseAggregation(AggregationName(*spec));
      FUZZ_CHECK(again.ok() && again->kind == spec->kind && again->trim == spec->trim);
      return;
    }
    case 2: {
      worker::GossipConfig config;
      const absl::Status s = worker::ParseInterpolation(text, &config);
      if (!s.ok()) return refused(s);
      FUZZ_CHECK(config.constant > 0 && config.constant <= 1);
      return;
    }
    case 3: {
      absl::StatusOr<DataSplit> split = ParseDataSplit(text);
      if (!split.ok()) return refused(split.status());
      if (split->label_skew) FUZZ_CHECK(std::isfinite(split->alpha) && split->alpha > 0);
      return;
    }
    case 4: {
      absl::StatusOr<OuterOptimizer> o = ParseOuterOptimizer(text);
      if (!o.ok()) return refused(o.status());
      return;
    }
    case 5: {
      absl::StatusOr<std::vector<int64_t>> shape = ParseInputShape(text);
      if (!shape.ok()) return refused(shape.status());
      FUZZ_CHECK(shape->size() == 3);
      for (int64_t v : *shape) FUZZ_CHECK(v >= 1 && v <= kMaxInputDim);
      return;
    }
  }
}

// ---- dataset_file: the headers of dataset files a worker reads from disk
// (--dataset=idx:DIR / npy:DIR; the default Fashion-MNIST): ParseIdx and
// ParseNpy. Input: selector u8, the file's bytes. An accepted array's data
// has exactly the size its header promises.
void DatasetFileTarget(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    absl::StatusOr<worker::NpyArray> a = worker::ParseNpy(bytes, "fuzz.npy");
    if (!a.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(a.status()));
      return;
    }
    FUZZ_CHECK(!a->dtype.empty());
    uint64_t count = 1;
    for (uint64_t d : a->shape) {
      FUZZ_CHECK(d == 0 || count <= UINT64_MAX / d);
      count *= d;
    }
    uint64_t item = 0;
    FUZZ_CHECK(absl::SimpleAtoi(a->dtype.substr(2), &item) && item >= 1 && item <= 16);
    FUZZ_CHECK(count <= bytes.size() && a->data.size() == count * item);
    return;
  }
  absl::StatusOr<worker::IdxArray> a = worker::ParseIdx(bytes, "fuzz-idx");
  if (!a.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(a.status()));
    return;
  }
  FUZZ_CHECK(a->dims.size() >= 1 && a->dims.size() <= 4);
  uint64_t count = 1;
  for (uint32_t d : a->dims) count *= d;  // 4 x 32 bits may wrap: checked below
  FUZZ_CHECK(a->data.size() <= bytes.size());
  FUZZ_CHECK(a->data.size() == count);
}

// The store of the checkpoint_upload target, opened once per process.
checkpoint::CheckpointStore* UploadStore() {
  static checkpoint::CheckpointStore* store = [] {
    checkpoint::StoreOptions options;
    options.data_dir = ScratchDir() + "/upload-store";
    options.verify_on_start = false;
    auto opened = checkpoint::CheckpointStore::Open(options);
    if (!opened.ok()) FuzzFail(__FILE__, __LINE__, "cannot open the upload store");
    return opened->release();
  }();
  return store;
}

// ---- checkpoint_upload: a Checkpoint.Upload stream as the store's service
// receives it (UploadStream: manifest, then layer chunks, then the
// half-close). Input: flags u8; with bit 0 the messages are raw
// UploadChunk protos ([len u16, bytes]*); else a manifest of up to 3
// layers built from the input (sizes u8 x 4 bytes, the data from the
// input; bit 1: digests of the real bytes, bit 2: CRCs right) cut into
// chunks of a fuzzed size. A committed checkpoint reads back exactly the
// bytes its manifest promises; any refusal leaves nothing behind.
void CheckpointUploadTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t flags = in.U8();
  checkpoint::CheckpointStore* store = UploadStore();
  FUZZ_CHECK(store->size() == 0);
  std::vector<shoal::v1::UploadChunk> messages;
  if (flags & 1) {
    while (in.left() > 0) {
      shoal::v1::UploadChunk m;
      if (!m.ParseFromString(in.Bytes(in.U16()))) break;
      messages.push_back(std::move(m));
    }
  } else {
    shoal::v1::UploadChunk head;
    shoal::v1::Manifest* m = head.mutable_manifest();
    m->set_run_id((flags & 8) ? "fuzz/../x" : "fuzz");
    m->set_round(in.U8());
    const size_t layers = 1 + in.U8() % 3;
    std::vector<std::string> bytes(layers);
    for (size_t i = 0; i < layers; ++i) {
      const size_t elements = in.U8();
      bytes[i] = in.Bytes(4 * elements);
      auto* l = m->add_layers();
      l->set_name(absl::StrCat("l", i));
      l->set_dtype("float32");
      l->add_shape(static_cast<int64_t>(elements));
      l->set_bytes(4 * elements);
      l->set_sha256((flags & 2) ? Sha256Hex(bytes[i].data(), bytes[i].size())
                                : std::string(64, 'a'));
    }
    messages.push_back(std::move(head));
    const size_t chunk = 4 * (1 + in.U8());
    for (size_t i = 0; i < layers; ++i) {
      for (size_t off = 0; off < bytes[i].size(); off += chunk) {
        shoal::v1::UploadChunk c;
        auto* d = c.mutable_data();
        d->set_layer(static_cast<uint32_t>(i));
        d->set_offset(off);
        d->set_data(bytes[i].substr(off, chunk));
        d->set_crc32c((flags & 4) ? Crc32c(d->data().data(), d->data().size()) : 1);
        messages.push_back(std::move(c));
      }
    }
  }
  std::string id;
  absl::StatusOr<shoal::v1::CheckpointInfo> info = absl::InvalidArgumentError("not finished");
  std::vector<shoal::v1::UploadChunk> sent;
  {
    checkpoint::UploadStream stream(store);
    absl::Status s;
    for (shoal::v1::UploadChunk& m : messages) {
      sent.push_back(m);
      s = stream.Accept(std::move(m));
      if (!s.ok()) {
        const absl::StatusCode c = s.code();
        FUZZ_CHECK(c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kDataLoss ||
                   c == absl::StatusCode::kResourceExhausted);
        // A dead stream stays dead.
        FUZZ_CHECK(!stream.Accept(shoal::v1::UploadChunk()).ok());
        FUZZ_CHECK(!stream.Finish().ok());
        break;
      }
    }
    if (s.ok()) info = stream.Finish();
    id = stream.id();
  }
  // Nothing left in tmp/ once the stream is gone.
  FUZZ_CHECK(std::filesystem::is_empty(ScratchDir() + "/upload-store/tmp"));
  if (!info.ok()) {
    FUZZ_CHECK(store->size() == 0);
    return;
  }
  FUZZ_CHECK(store->size() == 1 && info->id() == id);
  absl::StatusOr<shoal::v1::Manifest> manifest = store->GetManifest(id);
  FUZZ_CHECK(manifest.ok());
  // Each layer reads back as the chunks sent for it, in order.
  for (int i = 0; i < manifest->layers_size(); ++i) {
    std::string want;
    for (const shoal::v1::UploadChunk& m : sent) {
      if (m.has_data() && m.data().layer() == static_cast<uint32_t>(i)) want += m.data().data();
    }
    FUZZ_CHECK(want.size() == manifest->layers(i).bytes());
    FUZZ_CHECK(Sha256Hex(want.data(), want.size()) ==
               absl::AsciiStrToLower(manifest->layers(i).sha256()));
    auto reader = store->ReadLayer(id, static_cast<uint32_t>(i), 0, 0);
    FUZZ_CHECK(reader.ok());
    std::string got, piece;
    while (true) {
      FUZZ_CHECK((*reader)->Next(1 << 16, &piece).ok());
      if (piece.empty()) break;
      got += piece;
    }
    FUZZ_CHECK(got == want);
  }
  FUZZ_CHECK(store->Delete(id).ok());
}

// ---- join_request: JoinRequests as the coordinator's Join hands them to
// the round engine, several into one engine (re-joins with a previous id,
// restarts claiming ids and data ranks). Input: [len u16, JoinRequest]*.
// Every admitted worker gets a well-formed id ("w<n>", n > 0) no live
// member holds, and live members' ids, addresses and data ranks stay
// distinct.
void JoinRequestTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  static FakeClock clock;
  coordinator::EngineOptions options;
  options.run_id = "fuzz";
  options.config.mutable_sync()->set_min_participants(2);
  options.max_members = 16;
  coordinator::RoundEngine engine(options, &clock);
  std::map<std::string, std::string> live;  // id -> address, as joined
  while (in.left() > 0) {
    shoal::v1::JoinRequest join;
    if (!join.ParseFromString(in.Bytes(in.U16()))) continue;
    absl::StatusOr<coordinator::JoinResult> joined = engine.Join(join);
    if (!joined.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(joined.status()) ||
                 absl::IsResourceExhausted(joined.status()));
      continue;
    }
    const std::string& id = joined->response.worker_id();
    uint64_t number = 0;
    FUZZ_CHECK(id.size() > 1 && id[0] == 'w' && absl::SimpleAtoi(id.substr(1), &number) &&
               number > 0 && id == absl::StrCat("w", number));
    const bool rejoin = live.count(join.previous_worker_id()) > 0;
    if (rejoin) FUZZ_CHECK(id == join.previous_worker_id());
    // A worker replaces every other live member at its address, no other.
    for (auto it = live.begin(); it != live.end();) {
      it = it->second == join.peer_address() && it->first != id ? live.erase(it) : std::next(it);
    }
    if (!rejoin) FUZZ_CHECK(live.count(id) == 0);
    live[id] = join.peer_address();
    std::set<std::string> ids, addresses;
    std::set<uint32_t> ranks;
    const shoal::v1::RunStatus status = engine.Status();
    for (const auto& w : status.workers()) {
      if (DepartedState(w.state())) continue;
      FUZZ_CHECK(ids.insert(w.id()).second);
      FUZZ_CHECK(addresses.insert(w.address()).second);
      FUZZ_CHECK(ranks.insert(w.data_rank()).second);
    }
    FUZZ_CHECK(ids.size() == live.size());
  }
}

// ---- read_slice_rule: a ReadSliceRequest as the peer service decides it
// (raw bytes decoded by DecodeReadSliceRequest; GOSSIP reads checked by
// CheckGossipRange, the others by the serving rule DecideRead) against a
// fuzzed serving state. Input: the state (total u16, round u8, flags u8,
// attempt u8, own begin u16, own end u16, snapshot round u8), then the
// request's bytes. Whatever is served lies inside the model (and, for an
// AVERAGED read, inside the worker's own slice).
void ReadSliceRuleTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  worker::ServingState st;
  st.total_elements = in.U16();
  st.round = in.U8();
  const uint8_t f = in.U8();
  st.bound = f & 1;
  st.ready = f & 2;
  st.has_plan = f & 4;
  st.averaged = f & 8;
  st.has_snapshot = f & 16;
  st.snapshot_valid = f & 32;
  st.shutting_down = f & 64;
  st.attempt = in.U8();
  st.own_begin = in.U16();
  st.own_end = in.U16();
  st.snapshot_round = in.U8();
  const std::string message = in.Rest();
  grpc::Slice slice(message.data(), message.size());
  grpc::ByteBuffer buffer(&slice, 1);
  shoal::v1::ReadSliceRequest r;
  if (!DecodeReadSliceRequest(buffer, &r).ok()) return;
  if (r.kind() == shoal::v1::GOSSIP) {
    const absl::Status s = worker::CheckGossipRange(r, st.total_elements);
    if (s.ok()) {
      FUZZ_CHECK(r.begin() < r.end() && r.end() <= st.total_elements);
    } else {
      FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsOutOfRange(s));
    }
    return;
  }
  const worker::ServingDecision d = worker::DecideRead(st, r);
  if (!d.status.ok()) {
    const absl::StatusCode c = d.status.code();
    FUZZ_CHECK(c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kOutOfRange ||
               c == absl::StatusCode::kFailedPrecondition || c == absl::StatusCode::kUnavailable);
    FUZZ_CHECK(!d.may_wait || absl::IsUnavailable(d.status));
    return;
  }
  FUZZ_CHECK(st.bound && !st.shutting_down);
  FUZZ_CHECK(r.begin() < r.end() && r.end() <= st.total_elements);
  if (r.kind() == shoal::v1::AVERAGED) {
    FUZZ_CHECK(st.has_plan && st.averaged && r.begin() >= st.own_begin && r.end() <= st.own_end);
  }
  if (r.kind() == shoal::v1::SNAPSHOT) {
    FUZZ_CHECK(d.buffer == worker::ModelBuffer::kSnapshot && r.round() == st.snapshot_round);
  } else {
    FUZZ_CHECK(d.buffer == worker::ModelBuffer::kParameters && r.round() == st.round && st.ready);
  }
}

// ---- join_limiter: the coordinator's --max_joins_per_minute buckets
// (JoinLimiter::Admit, one per caller host) under a fuzzed sequence of
// hosts and clock steps, backwards included (the real clock is the wall
// clock, which an operator or NTP may set back). Input: per_minute u16
// (0: no limit), then per step: op u8 (bits 0-2: the host, bit 3: a clock
// step of u16 ms follows, bit 4: the step goes back, bit 5: a refused
// host waits as long as it was told and asks again).
// Invariants: no limit admits everything; a refusal is RESOURCE_EXHAUSTED
// and asks to wait at most a minute (a full refill), after which the host
// is admitted; a host is admitted at most per_minute times plus one more per
// 60 s / per_minute of forward clock time since its first join.
void JoinLimiterTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint32_t per_minute = in.U16();
  FakeClock clock;
  coordinator::JoinLimiter limiter(per_minute, &clock);
  static const std::string kHosts[8] = {"10.0.0.1",
                                        "10.0.0.2",
                                        "",
                                        "[::1]",
                                        std::string(300, 'h'),
                                        "host:with:colons",
                                        std::string("nul\0byte", 8),
                                        "10.0.0.1 "};
  struct Seen {
    double forward_seconds = 0;  // forward clock time since its first join
    uint64_t admitted = 0;
  };
  std::map<int, Seen> seen;
  auto forward = [&](absl::Duration d) {
    for (auto& [host, s] : seen) s.forward_seconds += absl::ToDoubleSeconds(d);
  };
  int steps = 0;
  while (in.left() > 0 && ++steps <= 2000) {
    const uint8_t op = in.U8();
    if (op & 8) {
      const absl::Duration d = absl::Milliseconds(in.U16());
      if (op & 16) {
        clock.Advance(-d);
      } else {
        clock.Advance(d);
        forward(d);
      }
    }
    const int host = op & 7;
    seen.try_emplace(host);
    absl::Status s = limiter.Admit(kHosts[host]);
    if (per_minute == 0) {
      FUZZ_CHECK(s.ok());
      continue;
    }
    if (s.ok()) {
      ++seen[host].admitted;
    } else {
      FUZZ_CHECK(absl::IsResourceExhausted(s));
      // "retry in N s": a bucket refills completely within a minute.
      const size_t at = s.message().rfind("retry in ");
      FUZZ_CHECK(at != absl::string_view::npos);
      double wait = -1;
      const absl::string_view rest = s.message().substr(at + 9);
      FUZZ_CHECK(absl::SimpleAtod(rest.substr(0, rest.find(' ')), &wait));
      FUZZ_CHECK(wait >= 0 && wait <= 60);
      if (op & 32) {
        const absl::Duration d = absl::Seconds(wait) + absl::Milliseconds(1);
        clock.Advance(d);
        forward(d);
        FUZZ_CHECK(limiter.Admit(kHosts[host]).ok());
        ++seen[host].admitted;
      }
    }
    const Seen& h = seen[host];
    FUZZ_CHECK(static_cast<double>(h.admitted) <=
               per_minute + h.forward_seconds * per_minute / 60.0 + 1e-6 * per_minute + 1e-9);
  }
}

// ---- audit_report: the coordinator's audits, scores and bans
// (RoundTrust, docs/SECURITY.md "Audits, scores and bans") driven by what
// members send: joins with any fingerprint and name, ready reports with any
// contribution hash, ReportAudit from any member for any audit id with any
// hash or an error, bad-chunk reports, and the rounds' steps. Input: per
// step op u8 % 10, then its bytes:
//   0 join k u8 (k % 6), fingerprint u8 (% 3: "a", "b", none)
//   1 start the next round
//   2 ready k, hash u8 (255: none; else one of 4 hashes)
//   3 assign (every member ready this round is a participant)
//   4 report: audit u8 (index into the audits handed out), auditor k,
//     hash u8 (254: an error, 255: the participant's own hash)
//   5 leave the round k     6 drop what is pending    7 record k, event u8
//   8 bad chunks from k to j    9 check a join of k (by id, then by name),
//     then, when the next u8 is odd, again after every ban ended
// Invariants: an auditor is never its participant and shares its non-empty
// fingerprint; a report from anyone but the auditor asked is
// PERMISSION_DENIED and settles nothing; a pass needs the participant's own
// hash; failed <= performed + second-opinion blames; nothing is pending
// after a drop; scores never exceed 1; a banned member's joins are refused
// with PERMISSION_DENIED until the ban ends, and a join with no replay
// fingerprint with FAILED_PRECONDITION.
void AuditReportTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  shoal::v1::TrustConfig config;
  config.set_audit_rate(1);
  config.set_ban_below(0.5);
  config.set_ban_seconds(60);
  coordinator::RoundTrust trust(config, "fuzz");
  static const std::string kHashes[4] = {std::string(64, 'a'), std::string(64, 'b'),
                                         std::string(64, 'c'), std::string(64, 'd')};
  static const char* kFingerprints[3] = {"a", "b", ""};
  auto id = [](int k) { return absl::StrCat("w", k); };
  std::map<std::string, std::string> fingerprint, hash;
  std::set<std::string> ready, banned;
  struct Out {
    std::string participant, auditor;
  };
  std::map<uint64_t, Out> out;
  std::vector<uint64_t> handed;
  const absl::Time now = absl::FromUnixSeconds(1000000);
  uint64_t round = 0;
  int steps = 0;
  auto note = [&](const coordinator::RoundTrust::Assignment& a) {
    FUZZ_CHECK(a.auditor != a.request.participant());
    FUZZ_CHECK(!fingerprint[a.auditor].empty());
    FUZZ_CHECK(fingerprint[a.auditor] == fingerprint[a.request.participant()]);
    FUZZ_CHECK(ready.count(a.auditor) == 1);
    out[a.request.audit_id()] = {a.request.participant(), a.auditor};
    handed.push_back(a.request.audit_id());
  };
  while (in.left() > 0 && ++steps <= 2000) {
    switch (in.U8() % 10) {
      case 0: {
        const std::string k = id(in.U8() % 6);
        shoal::v1::JoinRequest j;
        j.set_name("name-" + k);
        j.set_replay_fingerprint(kFingerprints[in.U8() % 3]);
        fingerprint[k] = j.replay_fingerprint();
        trust.OnJoined(k, j);
        break;
      }
      case 1:
        trust.StartRound(++round);
        ready.clear();
        hash.clear();
        out.clear();
        handed.clear();
        break;
      case 2: {
        const std::string k = id(in.U8() % 6);
        const uint8_t h = in.U8();
        if (fingerprint.count(k) == 0) break;  // members only
        shoal::v1::ReportReadyRequest r;
        if (h != 255) r.set_contribution_hash(kHashes[h % 4]);
        trust.OnReady(k, r, {});
        ready.insert(k);
        hash[k] = r.contribution_hash();
        break;
      }
      case 3: {
        const std::vector<std::string> participants(ready.begin(), ready.end());
        for (const auto& a : trust.Assign(round > 0 ? round - 1 : 0, kHashes[0], participants)) {
          note(a);
        }
        break;
      }
      case 4: {
        const uint8_t which = in.U8();
        const std::string auditor = id(in.U8() % 6);
        const uint8_t h = in.U8();
        const uint64_t audit = handed.empty() ? which : handed[which % handed.size()];
        shoal::v1::ReportAuditRequest r;
        r.set_round(round);
        r.set_audit_id(audit);
        auto o = out.find(audit);
        if (h == 254) {
          r.set_error("cannot replay");
        } else if (h == 255 && o != out.end()) {
          r.set_replay_hash(hash[o->second.participant]);
        } else {
          r.set_replay_hash(kHashes[h % 4]);
        }
        const uint64_t failed_before = trust.audits_failed();
        absl::StatusOr<coordinator::RoundTrust::Verdict> v = trust.OnReport(auditor, r);
        if (o == out.end()) {
          FUZZ_CHECK(absl::IsNotFound(v.status()));
          break;
        }
        if (o->second.auditor != auditor) {
          FUZZ_CHECK(absl::IsPermissionDenied(v.status()));
          FUZZ_CHECK(trust.audits_failed() == failed_before);
          break;
        }
        FUZZ_CHECK(v.ok());
        using Kind = coordinator::RoundTrust::Verdict::Kind;
        if (v->kind == Kind::kPassed) {
          FUZZ_CHECK(!hash[o->second.participant].empty());
          FUZZ_CHECK(r.replay_hash() == hash[o->second.participant]);
        }
        if (v->kind == Kind::kSecondOpinion) {
          FUZZ_CHECK(v->second.auditor != auditor);
          note(v->second);
        }
        out.erase(audit);
        break;
      }
      case 5: {
        const std::string k = id(in.U8() % 6);
        trust.LeaveRound(k);
        ready.erase(k);
        for (auto it = out.begin(); it != out.end();) {
          it = it->second.participant == k || it->second.auditor == k ? out.erase(it)
                                                                      : std::next(it);
        }
        break;
      }
      case 6:
        trust.DropPending("deadline");
        out.clear();
        FUZZ_CHECK(!trust.Pending());
        break;
      case 7: {
        const std::string k = id(in.U8() % 6);
        const auto event = static_cast<coordinator::TrustEvent>(in.U8() % 7);
        const std::string ban = trust.Record(k, event, "");
        if (!ban.empty()) {
          trust.Ban(k, "name-" + k, ban, now);
          banned.insert(k);
        }
        break;
      }
      case 8: {
        const std::string k = id(in.U8() % 6);
        const std::string j = id(in.U8() % 6);
        std::string reporters;
        trust.OnBadChunks(k, j, &reporters);
        break;
      }
      case 9: {
        const std::string k = id(in.U8() % 6);
        // The run is audited: a join must name a replay fingerprint, and a
        // ban is checked before the fingerprint.
        const std::string print = kFingerprints[in.U8() % 3];
        shoal::v1::JoinRequest by_id;
        by_id.set_previous_worker_id(k);
        by_id.set_replay_fingerprint(print);
        shoal::v1::JoinRequest by_name;
        by_name.set_name("name-" + k);
        by_name.set_replay_fingerprint(print);
        for (const auto* j : {&by_id, &by_name}) {
          const absl::Status s = trust.CheckJoin(*j, now);
          if (banned.count(k) != 0) {
            FUZZ_CHECK(absl::IsPermissionDenied(s));
          } else if (print.empty()) {
            FUZZ_CHECK(absl::IsFailedPrecondition(s));
          } else {
            FUZZ_CHECK(s.ok());
          }
        }
        if (in.U8() & 1) {
          // ban_seconds later every ban (all made at `now`) is over.
          for (const auto* j : {&by_id, &by_name}) {
            FUZZ_CHECK(trust.CheckJoin(*j, now + absl::Seconds(61)).ok() == !print.empty());
          }
          banned.clear();
        }
        break;
      }
    }
    FUZZ_CHECK(trust.Pending() == !out.empty());
    for (int k = 0; k < 6; ++k) {
      shoal::v1::WorkerStatus w;
      trust.FillWorker(id(k), &w);
      FUZZ_CHECK(w.score() <= 1.0);
    }
  }
}

// ---- read_encoded_request: a Peer.ReadEncoded request as the peer service
// answers it from its EncodedStore (Find) and cuts the piece
// (ServeEncodedPiece), against a store driven through a fuzzed sequence of
// rounds, attempts, stages, publications and optimizer states (what the
// exchange does), compared with a model of the documented rules. The
// request's fields are fuzzed (any round, attempt, stage and kind value,
// range and offset) or parsed from raw bytes. Input: per step an op u8:
//   0 BeginRound round u8, attempt u8      1 Publish kind u8, begin u8, end u8,
//   2 ReachStage stage u8                     stage u8, blob length u8, the blob
//   3 SetState round u8, blob length u8, the blob
//   4 a request of fields: round u8, attempt u8, stage u8, kind u8, begin u8,
//     end u8, flag u8 (bit 0: end counts from begin), offset u8, piece size u8
//   5 a request parsed from length u8 raw bytes, then piece size u8
// Invariants: a request is served iff its blob was published (and kept) or
// is the state of that round, byte for byte; every refusal is a documented
// code, INVALID_ARGUMENT for no kind, a kind the store never holds, or an
// empty range; UNAVAILABLE ("ask again") never for an older round or
// attempt, which can never come; a served piece is the blob's bytes at the
// offset with its size, round and CRC; an offset past the end is
// INVALID_ARGUMENT.
void ReadEncodedRequestTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  worker::EncodedStore store;
  // The model: round, attempt, stage of the exchange under way; what is kept.
  bool started = false;
  uint64_t round = 0;
  uint32_t attempt = 0;
  uint32_t stage = 0;
  using Key = std::tuple<uint64_t, uint32_t, uint32_t, int, uint64_t, uint64_t>;
  std::map<Key, std::string> kept;
  std::optional<std::pair<uint64_t, std::string>> state;
  auto publishable = [](int kind) {
    return kind == shoal::v1::CONTRIBUTION || kind == shoal::v1::AVERAGED ||
           kind == shoal::v1::STAGE_MODEL;
  };
  int steps = 0;
  while (in.left() > 0 && ++steps <= 500) {
    const uint8_t op = in.U8() % 6;
    if (op == 0) {
      const uint64_t r = in.U8();
      const uint32_t a = in.U8() % 4;
      store.BeginRound(r, a);
      // Only the previous round's averages stay: a second start of the
      // same round and attempt is another plan and starts empty too.
      for (auto it = kept.begin(); it != kept.end();) {
        const auto& [kr, ka, ks, kk, kb, ke] = it->first;
        const bool keep = kr + 1 == r && kk == shoal::v1::AVERAGED;
        it = keep ? std::next(it) : kept.erase(it);
      }
      started = true;
      round = r;
      attempt = a;
      stage = 0;
    } else if (op == 1) {
      static const int kKinds[3] = {shoal::v1::CONTRIBUTION, shoal::v1::AVERAGED,
                                    shoal::v1::STAGE_MODEL};
      const int kind = kKinds[in.U8() % 3];
      const uint64_t begin = in.U8();
      const uint64_t end = begin + 1 + in.U8();
      const uint32_t st = in.U8() % 4;
      std::string blob = in.Bytes(in.U8());
      store.Publish(round, attempt, static_cast<shoal::v1::SliceKind>(kind), begin, end,
                    std::make_shared<const std::string>(blob), st);
      if (started) kept[Key{round, attempt, st, kind, begin, end}] = blob;
    } else if (op == 2) {
      const uint32_t st = in.U8() % 4;
      store.ReachStage(round, attempt, st);
      if (started) stage = std::max(stage, st);
    } else if (op == 3) {
      const uint64_t r = in.U8();
      std::string blob = in.Bytes(in.U8());
      store.SetState(r, std::make_shared<const std::string>(blob));
      state = std::make_pair(r, blob);
    } else {
      shoal::v1::ReadEncodedRequest request;
      if (op == 4) {
        request.set_round(in.U8());
        request.set_attempt(in.U8() % 4);
        request.set_stage(in.U8() % 5);
        const uint8_t k = in.U8();
        // Mostly the kinds the service knows, sometimes any value (proto3
        // enums are open: a peer may send any number).
        request.set_kind(static_cast<shoal::v1::SliceKind>(k < 200 ? k % 6 : k));
        request.set_begin(in.U8());
        const uint64_t end = in.U8();
        // flag bit 0: the end counts from the begin (a range that is never
        // empty), else as is (empty and reversed ranges too).
        request.set_end(end + ((in.U8() & 1) ? request.begin() : 0));
        request.set_offset(in.U8());
      } else {
        if (!request.ParseFromString(in.Bytes(in.U8()))) continue;
      }
      const size_t piece_max = 1 + in.U8();
      // The peer service sends GOSSIP to the gossip board, never here.
      if (request.kind() == shoal::v1::GOSSIP) continue;
      absl::StatusOr<worker::Blob> found = store.Find(request);
      const int kind = request.kind();
      std::optional<std::string> expect;
      if (kind == shoal::v1::SNAPSHOT) {
        if (state && state->first == request.round()) expect = state->second;
      } else {
        auto it = kept.find(Key{request.round(), request.attempt(), request.stage(), kind,
                                request.begin(), request.end()});
        if (it != kept.end() && request.begin() < request.end()) expect = it->second;
      }
      if (expect.has_value()) {
        FUZZ_CHECK(found.ok() && **found == *expect);
      } else {
        FUZZ_CHECK(!found.ok());
        const absl::Status& e = found.status();
        FUZZ_CHECK(absl::IsInvalidArgument(e) || absl::IsUnavailable(e) ||
                   absl::IsFailedPrecondition(e));
        if (kind == shoal::v1::SLICE_KIND_UNSPECIFIED ||
            (kind != shoal::v1::SNAPSHOT && !publishable(kind)) ||
            (kind != shoal::v1::SNAPSHOT && request.begin() >= request.end())) {
          FUZZ_CHECK(absl::IsInvalidArgument(e));
        }
        // Asking again never helps for an older round or attempt.
        if (kind != shoal::v1::SNAPSHOT && started &&
            (request.round() < round ||
             (request.round() == round && request.attempt() < attempt))) {
          FUZZ_CHECK(!absl::IsUnavailable(e));
        }
        if (kind == shoal::v1::SNAPSHOT && state && request.round() < state->first) {
          FUZZ_CHECK(!absl::IsUnavailable(e));
        }
        continue;
      }
      absl::StatusOr<shoal::v1::EncodedPiece> piece =
          worker::ServeEncodedPiece(**found, request, piece_max);
      const std::string& blob = **found;
      if (request.offset() > blob.size()) {
        FUZZ_CHECK(absl::IsInvalidArgument(piece.status()));
        continue;
      }
      FUZZ_CHECK(piece.ok());
      const size_t n = std::min<size_t>(piece_max, blob.size() - request.offset());
      FUZZ_CHECK(piece->round() == request.round() && piece->offset() == request.offset() &&
                 piece->total_bytes() == blob.size());
      FUZZ_CHECK(piece->data() == blob.substr(request.offset(), n));
      FUZZ_CHECK(piece->crc32c() == Crc32c(piece->data().data(), piece->data().size()));
    }
  }
}

// True when `text` holds nothing that acts on a terminal but its newlines.
bool TerminalSafe(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (FindUnprintable(line).has_value()) return false;
  }
  return true;
}

// ---- text_limits: any bytes as the value of any field the coordinator
// limits (core/request_limits.h), and as a whole message of each checked
// type. Input: [rule u8][value]. Accepted values fit their rule (length,
// characters, zone grammar); refusals are INVALID_ARGUMENT naming the field
// and never quote a character that is not shown; the escapes of
// common/printable.h leave nothing that is not shown, change nothing
// printable, and a document's escapes stay within its text.
void TextLimitsTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  const std::vector<coordinator::TextRule>& rules = coordinator::TextRules();
  const coordinator::TextRule& rule = rules[in.U8() % rules.size()];
  const std::string value = in.Rest();
  const absl::Status s = coordinator::CheckText("Field.path", value, rule);
  if (s.ok()) {
    FUZZ_CHECK(value.size() <= rule.max_bytes);
    FUZZ_CHECK(!FindUnprintable(value).has_value());
    if (rule.kind == coordinator::TextKind::kZone) FUZZ_CHECK(ParseZone(value).ok());
    if (rule.kind != coordinator::TextKind::kText) {
      for (char c : value) FUZZ_CHECK(c > 0x20 && c < 0x7f);
    }
  } else {
    FUZZ_CHECK(absl::IsInvalidArgument(s));
    FUZZ_CHECK(absl::StrContains(s.message(), "Field.path"));
    FUZZ_CHECK(!FindUnprintable(s.message()).has_value());
  }
  const std::string escaped = EscapeUnprintable(value);
  FUZZ_CHECK(!FindUnprintable(escaped).has_value());
  if (!FindUnprintable(value).has_value()) FUZZ_CHECK(escaped == value);
  FUZZ_CHECK(TerminalSafe(EscapeUnprintable(value, "\n")));
  const std::string doc = EscapeUnprintableInDocument(value);
  for (absl::string_view line : absl::StrSplit(doc, absl::ByAnyChar("\n\t\r"))) {
    FUZZ_CHECK(!FindUnprintable(line).has_value());
  }
  // The same bytes as a whole message of each kind a stranger sends.
  for (const google::protobuf::Descriptor* d : coordinator::CheckedMessages()) {
    std::unique_ptr<google::protobuf::Message> m(
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(d)->New());
    if (!m->ParseFromString(value)) continue;
    const absl::Status checked = coordinator::CheckRequestText(*m);
    FUZZ_CHECK(checked.ok() || absl::IsInvalidArgument(checked));
    FUZZ_CHECK(!FindUnprintable(checked.message()).has_value());
  }
}

// ---- status_format: a RunStatus from any bytes (a coordinator's answer
// as shoalctl parses it, then strings of any bytes, as an old or hostile
// coordinator may send them, in names, reasons, zones) through every
// formatter of shoalctl. Input: [status len u16][RunStatus][strings...].
// The table forms and the findings print nothing that acts on a terminal
// but their newlines, and never more rows than workers; the JSON form
// escapes it all.
void StatusFormatTarget(const uint8_t* data, size_t size) {
  Input in(data, size);
  shoal::v1::RunStatus status;
  if (!status.ParseFromString(in.Bytes(in.U16()))) status.Clear();
  status.set_detail(in.Bytes(in.U8()));
  while (in.left() > 0 && status.workers_size() < 16) {
    shoal::v1::WorkerStatus* w = status.add_workers();
    w->set_id(in.Bytes(in.U8() % 32));
    w->set_name(in.Bytes(in.U8()));
    w->set_address(in.Bytes(in.U8() % 64));
    w->set_zone(in.Bytes(in.U8() % 64));
    w->set_state(std::vector<std::string>{"waiting", "training", "left", "lost", "evicted",
                                          "finished", "syncing"}[in.U8() % 7]);
    w->set_reason(in.Bytes(in.U8()));
    w->set_role(in.U8() % 2 ? "member" : "");
    w->set_outbound_only(in.U8() % 2);
    w->set_outbound_reason(in.Bytes(in.U8() % 32));
    if (in.U8() % 2) w->add_score_reasons(in.Bytes(in.U8()));
    if (in.U8() % 4 == 0) {
      shoal::v1::ZoneStatus* z = status.add_zones();
      z->set_path(in.Bytes(in.U8() % 64));
      z->set_supernode(w->id());
      z->set_reason(in.Bytes(in.U8()));
    }
    if (in.U8() % 4 == 0) {
      shoal::v1::Ban* b = status.add_bans();
      b->set_worker_id(w->id());
      b->set_name(w->name());
      b->set_reason(in.Bytes(in.U8()));
    }
  }
  if (in.U8() % 2) status.mutable_config()->mutable_gossip();
  const shoal::v1::RunStatus shown = ctl::ForTerminal(status);
  for (bool wide : {false, true}) {
    const std::string table = ctl::FormatStatusTable(shown, wide);
    FUZZ_CHECK(TerminalSafe(table));
  }
  FUZZ_CHECK(TerminalSafe(ctl::FormatZoneTree(shown)));
  FUZZ_CHECK(TerminalSafe(ctl::FormatGossipLine(shown)));
  FUZZ_CHECK(TerminalSafe(ctl::FormatSummaryLine(shown, 1.5)));
  for (const auto& r : shown.recent_rounds()) FUZZ_CHECK(TerminalSafe(ctl::FormatRoundLine(r, 3)));
  if (shown.workers_size() > 0) {
    absl::StatusOr<std::vector<ctl::Finding>> findings =
        ctl::ExplainWorker(shown, shown.workers(0).id(), std::nullopt);
    if (findings.ok()) FUZZ_CHECK(TerminalSafe(ctl::FormatFindings(*findings)));
  }
  FUZZ_CHECK(TerminalSafe(ctl::FormatFindings(ctl::Doctor(shown, ctl::DoctorFacts()))));
  // JSON: every string escaped.
  const std::string json = ctl::DocumentText(ctl::FormatStatusJson(status));
  for (absl::string_view line : absl::StrSplit(json, '\n')) {
    FUZZ_CHECK(!FindUnprintable(line).has_value());
  }
  FUZZ_CHECK(TerminalSafe(ctl::DocumentText(ctl::FormatFinishedJsonLine(status, 2.0))));
}
}  // namespace

const std::vector<Target>& Targets() {
  static const std::vector<Target> targets = {
      {"tensor_chunk", TensorChunkTarget},
      {"chunk_stream", ChunkStreamTarget},
      {"read_slice_request", ReadSliceRequestTarget},
      {"model_manifest", ModelManifestTarget},
      {"run_record", RunRecordTarget},
      {"checkpoint_id", CheckpointIdTarget},
      {"address", AddressTarget},
      {"encoded_slice", EncodedSliceTarget},
      {"encoded_pieces", EncodedPiecesTarget},
      {"gossip_transfer", GossipTransferTarget},
      {"model_file", ModelFileTarget},
      {"auth", AuthTarget},
      {"run_specs", RunSpecsTarget},
      {"dataset_file", DatasetFileTarget},
      {"checkpoint_upload", CheckpointUploadTarget},
      {"join_request", JoinRequestTarget},
      {"read_slice_rule", ReadSliceRuleTarget},
      {"join_limiter", JoinLimiterTarget},
      {"read_encoded_request", ReadEncodedRequestTarget},
      {"audit_report", AuditReportTarget},
      {"text_limits", TextLimitsTarget},
      {"status_format", StatusFormatTarget},
  };
  return targets;
}

const Target* FindTarget(const char* name) {
  for (const Target& t : Targets()) {
    if (std::strcmp(t.name, name) == 0) return &t;
  }
  return nullptr;
}

}  // namespace shoal::fuzz
