// Replays every committed fuzz corpus file (tests/fuzz/corpus/<target>/)
// through the same decode functions the libFuzzer targets call, so the
// corpus, and every crasher fixed since, keeps being exercised by
// `make test` in the normal gcc build.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/crc32c.h"
#include "common/run_options.h"
#include "common/sha256.h"
#include "common/tensor_wire.h"
#include "common/worker_state.h"
#include "gtest/gtest.h"
#include "services/checkpoint/core/checkpoint_store.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/run_record.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/manifest_cache.h"
#include "services/worker/core/transfer_checks.h"
#include "tests/fuzz/fuzz_targets.h"

namespace shoal::fuzz {
namespace {

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class FuzzCorpusTest : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzCorpusTest, EveryCorpusFileDecodesWithItsInvariantsHeld) {
  const std::filesystem::path dir = std::filesystem::path(SHOAL_FUZZ_CORPUS_DIR) / GetParam().name;
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    SCOPED_TRACE(entry.path().string());
    const std::string bytes = ReadAll(entry.path());
    // A broken invariant aborts (FUZZ_CHECK) and names the file above.
    GetParam().run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++files;
  }
  EXPECT_GT(files, 0u) << "no corpus for " << GetParam().name;
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpusTest, ::testing::ValuesIn(Targets()),
                         [](const ::testing::TestParamInfo<Target>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace shoal::fuzz

namespace shoal {
namespace {

// Crashers `make fuzz` found, as plain tests (their inputs are also in the
// corpus as crash-*).

// tensor_chunk: a field tag of more than 5 bytes was skipped as an unknown
// field, so ParseChunk accepted bytes protobuf refuses.
TEST(FuzzRegressionTest, OverlongFieldTagIsDataLoss) {
  // Tag 0x41 (field 8, fixed64) padded to 6 bytes, then 8 bytes of value.
  const uint8_t padded[] = {0xc1, 0x80, 0x80, 0x80, 0x80, 0x00, 1, 2, 3, 4, 5, 6, 7, 8};
  // The crasher's shape: a 6-byte tag past 32 bits.
  const uint8_t wide[] = {0xc1, 0xc1, 0xc1, 0xc1, 0xc1, 0x64, 1, 2, 3, 4, 5, 6, 7, 8};
  for (const auto* bytes : {padded, wide}) {
    const BytePiece piece{bytes, sizeof(padded)};
    RawChunk chunk;
    EXPECT_TRUE(absl::IsDataLoss(ParseChunk(&piece, 1, &chunk)));
    shoal::v1::TensorChunk proto;
    EXPECT_FALSE(proto.ParseFromArray(bytes, sizeof(padded)));
  }
}

// Sizes near 2^64 must not wrap the running sum of layer sizes into a
// table that looks complete (found by reading the checks after a fuzz run).
TEST(FuzzRegressionTest, LayerSizesThatWrapAroundAreInvalid) {
  const uint64_t huge = ~uint64_t{0};
  using worker::LayerSpan;
  EXPECT_TRUE(absl::IsInvalidArgument(
      worker::CheckLayers({LayerSpan{"a", 0, huge}, LayerSpan{"b", huge, 11}}, 10)));
  EXPECT_TRUE(worker::CheckLayers({LayerSpan{"a", 0, 4}, LayerSpan{"b", 4, 6}}, 10).ok());

  shoal::v1::ModelManifest m;
  m.set_round(3);
  m.set_model_hash("h");
  m.set_total_elements(10);
  m.set_piece_elements(huge);
  auto* a = m.add_layers();
  a->set_name("a");
  a->set_offset(0);
  a->set_elements(huge);
  a->set_sha256("x");
  auto* b = m.add_layers();
  b->set_name("b");
  b->set_offset(huge);
  b->set_elements(11);
  b->set_sha256("y");
  EXPECT_TRUE(absl::IsInvalidArgument(worker::CheckManifest(m, 3, "h", 10)));
}

// encoded_slice: an int8 block scale that is finite but above FLT_MAX /
// 127 decoded 127 x scale to inf, which the owner would average into the
// model (corpus/encoded_slice/crash-int8-scale-overflows).
TEST(FuzzRegressionTest, Int8ScaleWhoseMultiplesOverflowIsInvalid) {
  auto codec = worker::MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  for (float scale : {FLT_MAX, FLT_MAX / 126.0f}) {
    uint8_t bytes[5];
    std::memcpy(bytes, &scale, 4);
    bytes[4] = 127;
    float out = 7.0f;
    EXPECT_TRUE(absl::IsInvalidArgument((*codec)->DecodeSlice(bytes, 1, &out))) << scale;
    EXPECT_EQ(out, 7.0f);
  }
  // The encoder's own scale for max |x| = FLT_MAX (FLT_MAX / 127 rounded
  // up) had the same overflow: it now takes the next float down, and
  // decodes to finite values.
  const float big[2] = {FLT_MAX, -FLT_MAX};
  const std::string e = (*codec)->EncodeSlice(big, 2, 0);
  float out[2];
  ASSERT_TRUE(
      (*codec)
          ->DecodeSlice(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(e.data()), e.size()),
                        2, out)
          .ok());
  EXPECT_TRUE(std::isfinite(out[0]) && std::isfinite(out[1]));
}

// encoded_slice: fp32's decoder passed a null destination to memcpy for an
// empty slice (undefined behaviour; corpus/encoded_slice/crash-fp32-empty-slice).
TEST(FuzzRegressionTest, EmptyFp32SliceDecodesWithNullPointers) {
  auto codec = worker::MakeCodec("fp32");
  ASSERT_TRUE(codec.ok());
  EXPECT_TRUE((*codec)->DecodeSlice(absl::Span<const uint8_t>(), 0, nullptr).ok());
}

// join_request: a worker re-joining as w18446744073709551614 moved the
// next worker number to 2^64 - 1, so the numbering wrapped: the next new
// workers got w0 and then w1, the id of a live member
// (corpus/join_request/crash-id-wraps).
TEST(FuzzRegressionTest, HugePreviousWorkerIdDoesNotWrapTheNumbering) {
  FakeClock clock;
  coordinator::EngineOptions options;
  options.run_id = "run";
  options.config.mutable_sync()->set_min_participants(2);
  coordinator::RoundEngine engine(options, &clock);
  std::set<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    shoal::v1::JoinRequest join;
    join.set_peer_address(absl::StrCat("127.0.0.1:", 5001 + i));
    if (i == 1) join.set_previous_worker_id("w18446744073709551614");
    if (i == 2) join.set_previous_worker_id("w01");
    auto joined = engine.Join(join);
    ASSERT_TRUE(joined.ok()) << joined.status();
    const std::string& id = joined->response.worker_id();
    EXPECT_NE(id, "w0");
    EXPECT_TRUE(ids.insert(id).second) << id << " handed out twice";
  }
  EXPECT_EQ(ids.count("w18446744073709551614"), 0u);
  EXPECT_EQ(ids.count("w01"), 0u);
}

// join_request: a member re-joining from the address of another live
// member left both at one address; the next worker there replaced only
// one of them (corpus/join_request/crash-rejoin-takes-an-address).
TEST(FuzzRegressionTest, RejoinAtAnotherMembersAddressReplacesIt) {
  FakeClock clock;
  coordinator::EngineOptions options;
  options.run_id = "run";
  options.config.mutable_sync()->set_min_participants(3);
  coordinator::RoundEngine engine(options, &clock);
  auto join = [&](const std::string& address, const std::string& previous) {
    shoal::v1::JoinRequest j;
    j.set_peer_address(address);
    j.set_previous_worker_id(previous);
    auto r = engine.Join(j);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->response.worker_id() : std::string();
  };
  const std::string a = join("127.0.0.1:5001", "");
  const std::string b = join("127.0.0.1:5002", "");
  EXPECT_EQ(join("127.0.0.1:5002", a), a);  // a moves to b's address
  std::map<std::string, std::string> active;
  const shoal::v1::RunStatus status = engine.Status();
  for (const auto& w : status.workers()) {
    if (!DepartedState(w.state())) active[w.id()] = w.address();
  }
  EXPECT_EQ(active, (std::map<std::string, std::string>{{a, "127.0.0.1:5002"}})) << b;
}

// The same numbering from a run record: a worker number past 2^62 is a
// damaged record.
TEST(FuzzRegressionTest, RunRecordWithAHugeWorkerNumberIsDataLoss) {
  const std::string dir = ::testing::TempDir() + "/fuzz-run-record";
  coordinator::RunRecordStore store(dir);
  ASSERT_TRUE(store.Open().ok());
  shoal::v1::RunRecord r;
  r.set_run_id("run");
  r.set_next_worker_number(~uint64_t{0});
  ASSERT_TRUE(store.Save(r).ok());
  EXPECT_TRUE(absl::IsDataLoss(store.Load().status()));
  r.set_next_worker_number(12);
  ASSERT_TRUE(store.Save(r).ok());
  EXPECT_TRUE(store.Load().ok());
}

// gossip_transfer: a peer announcing an infinite (or NaN, or negative)
// clock made the fetching worker's clock NaN after interpolating
// (corpus/gossip_transfer/crash-infinite-clock).
TEST(FuzzRegressionTest, GossipPeerStateMustBeFinite) {
  shoal::v1::PeerInfo info;
  info.set_total_elements(6);
  info.set_gossip_publication(5);
  info.set_gossip_clock(100);
  info.set_gossip_loss(0.5);
  EXPECT_TRUE(worker::CheckGossipPeerInfo(info, 6).ok());
  for (double clock : {double{INFINITY}, double{-INFINITY}, double{NAN}, -1.0}) {
    info.set_gossip_clock(clock);
    EXPECT_TRUE(absl::IsInvalidArgument(worker::CheckGossipPeerInfo(info, 6))) << clock;
  }
  info.set_gossip_clock(100);
  info.set_gossip_loss(NAN);
  EXPECT_TRUE(absl::IsInvalidArgument(worker::CheckGossipPeerInfo(info, 6)));
  info.set_gossip_loss(0.5);
  EXPECT_TRUE(absl::IsInvalidArgument(worker::CheckGossipPeerInfo(info, 7)));
  info.set_gossip_publication(0);
  EXPECT_TRUE(absl::IsFailedPrecondition(worker::CheckGossipPeerInfo(info, 6)));
}

// The ReadEncoded checks both readers now share: the outer momentum pull
// did not check a piece's round before.
TEST(EncodedAssemblyTest, RefusesAnotherRoundAndResumesAfterARefusal) {
  worker::EncodedAssembly blob(4, 100, 8, "momentum");
  shoal::v1::EncodedPiece piece;
  piece.set_round(3);
  piece.set_total_bytes(8);
  piece.set_data("abcd");
  piece.set_crc32c(Crc32c("abcd", 4));
  EXPECT_TRUE(absl::IsFailedPrecondition(blob.Add(piece)));
  piece.set_round(4);
  ASSERT_TRUE(blob.Add(piece).ok());
  EXPECT_EQ(blob.offset(), 4u);
  EXPECT_FALSE(blob.done());
  piece.set_offset(4);
  piece.set_data("efgh");  // CRC of other bytes
  EXPECT_TRUE(absl::IsDataLoss(blob.Add(piece)));
  piece.set_crc32c(Crc32c("efgh", 4));
  piece.set_total_bytes(9);  // not the exact size
  EXPECT_TRUE(absl::IsInvalidArgument(blob.Add(piece)));
  piece.set_total_bytes(8);
  ASSERT_TRUE(blob.Add(piece).ok());
  EXPECT_TRUE(blob.done());
  EXPECT_EQ(blob.bytes(), "abcdefgh");
}

// The Upload stream's order, as the checkpoint service now delegates it.
TEST(UploadStreamTest, ManifestFirstThenChunksAndADeadStreamStaysDead) {
  checkpoint::StoreOptions options;
  options.data_dir = ::testing::TempDir() + "/fuzz-upload-store";
  auto store = checkpoint::CheckpointStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string bytes(8, 'x');
  shoal::v1::UploadChunk head;
  auto* m = head.mutable_manifest();
  m->set_run_id("run");
  m->set_round(2);
  auto* l = m->add_layers();
  l->set_name("fc");
  l->set_dtype("float32");
  l->add_shape(2);
  l->set_bytes(8);
  l->set_sha256(Sha256Hex(bytes.data(), bytes.size()));
  shoal::v1::UploadChunk data;
  data.mutable_data()->set_data(bytes);
  data.mutable_data()->set_crc32c(Crc32c(bytes.data(), bytes.size()));
  {
    checkpoint::UploadStream stream(store->get());
    EXPECT_TRUE(absl::IsInvalidArgument(stream.Accept(data)));
    EXPECT_FALSE(stream.Accept(head).ok());
    EXPECT_FALSE(stream.Finish().ok());
  }
  {
    checkpoint::UploadStream stream(store->get());
    EXPECT_TRUE(absl::IsInvalidArgument(stream.Finish().status()));
  }
  checkpoint::UploadStream stream(store->get());
  ASSERT_TRUE(stream.Accept(head).ok());
  EXPECT_EQ(stream.id(), "run-r2");
  EXPECT_TRUE(absl::IsInvalidArgument(stream.Accept(head)));
  checkpoint::UploadStream good(store->get());
  ASSERT_TRUE(good.Accept(head).ok());
  ASSERT_TRUE(good.Accept(data).ok());
  auto info = good.Finish();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->id(), "run-r2");
  EXPECT_TRUE((*store)->GetManifest("run-r2").ok());
}

TEST(ParseInputShapeTest, ThreePositiveIntegers) {
  auto shape = ParseInputShape("1,28,28");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(*shape, (std::vector<int64_t>{1, 28, 28}));
  for (const char* bad : {"", "1,28", "1,28,28,1", "0,28,28", "1,,28", "1,28,65537", "a,b,c"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseInputShape(bad).status())) << bad;
  }
}

}  // namespace
}  // namespace shoal
