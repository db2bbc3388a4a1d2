#include "tests/fuzz/fuzz_targets.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/sha256.h"
#include "common/tensor_wire.h"
#include "common/tensor_wire_grpc.h"
#include "services/checkpoint/core/checkpoint_store.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/run_record.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/manifest_cache.h"

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
  options.config.set_min_participants(1);
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
  options.config.set_min_participants(2);
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

// The codecs' decoders (services/worker/core/codec.h). Input: one byte
// picking the codec, two bytes (little-endian) of element count, then the
// encoding. A refusal is INVALID_ARGUMENT and writes nothing; an accepted
// encoding decodes to finite values for int8 and the sparse codecs, the
// same way twice, and re-encodes to something that decodes.
void EncodedSliceTarget(const uint8_t* data, size_t size) {
  static const char* const kCodecs[] = {"fp32", "fp16", "bf16", "int8", "topk:0.1", "randomk:0.25"};
  if (size < 3) return;
  const std::string name = kCodecs[data[0] % 6];
  const size_t n = data[1] | size_t{data[2]} << 8;
  absl::StatusOr<std::unique_ptr<worker::Codec>> codec = worker::MakeCodec(name);
  FUZZ_CHECK(codec.ok());
  const absl::Span<const uint8_t> bytes(data + 3, size - 3);
  std::vector<float> out(n, 12345.0f);
  const absl::Status s = (*codec)->DecodeSlice(bytes, n, out.data());
  if (!s.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsDataLoss(s));
    for (float v : out) FUZZ_CHECK(v == 12345.0f);
    return;
  }
  FUZZ_CHECK(bytes.size() <= (*codec)->MaxEncodedBytes(n));
  if (name == "int8" || name[0] == 't' || name[0] == 'r') {
    for (float v : out) FUZZ_CHECK(std::isfinite(v));
  }
  std::vector<float> again(n);
  FUZZ_CHECK((*codec)->DecodeSlice(bytes, n, again.data()).ok());
  FUZZ_CHECK(std::memcmp(out.data(), again.data(), n * sizeof(float)) == 0);
  for (float& v : out) {
    if (!std::isfinite(v)) v = 0;
  }
  const std::string re = (*codec)->EncodeSlice(out.data(), n, 7);
  FUZZ_CHECK((*codec)
                 ->DecodeSlice(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(re.data()),
                                                   re.size()),
                               n, again.data())
                 .ok());
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
