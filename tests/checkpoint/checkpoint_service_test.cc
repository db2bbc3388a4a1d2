// Integration tests: a real CheckpointServer on 127.0.0.1:0 and the real
// GrpcCheckpointClient (or a raw stub for malformed streams).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/status_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/checkpoint/checkpoint_server.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/support/test_support.h"

namespace shoal::checkpoint {
namespace {

using ::shoal::checkpoint::testing::CountBlobs;
using ::shoal::checkpoint::testing::CountEntries;
using ::shoal::checkpoint::testing::MakeLayer;
using ::shoal::checkpoint::testing::MakeManifest;
using ::shoal::checkpoint::testing::TestLayer;
using ::shoal::testing::TempDir;
using ::shoal::testing::WaitUntil;
using ::testing::HasSubstr;

std::vector<ByteSpan> Spans(const std::vector<TestLayer>& layers) {
  std::vector<ByteSpan> spans;
  for (const auto& l : layers) spans.emplace_back(l.data(), l.bytes());
  return spans;
}

class CheckpointServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(); }

  void Start() {
    CheckpointServerOptions o;
    o.listen = "127.0.0.1:0";
    o.store.data_dir = data_dir();
    o.store.write_fault = [this](size_t) { return disk_full_.load() ? ENOSPC : 0; };
    auto server = CheckpointServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = server_->address();
    client_ = std::make_unique<GrpcCheckpointClient>(address_);
    stub_ = v1::Checkpoint::NewStub(MakeChannel(address_));
  }

  void Restart() {
    server_->Shutdown(absl::Seconds(1));
    server_.reset();
    Start();
  }

  std::string data_dir() { return dir_.path() + "/store"; }

  // Nothing half-uploaded remains once the server has dropped the upload.
  void ExpectNothingCommitted() {
    EXPECT_TRUE(WaitUntil([&] { return CountEntries(data_dir() + "/tmp") == 0; }, absl::Seconds(5)))
        << "tmp/ not cleaned";
    auto list = client_->List("");
    ASSERT_TRUE(list.ok()) << list.status();
    EXPECT_TRUE(list->empty());
    EXPECT_EQ(CountBlobs(data_dir()), 0u);
  }

  // The server still works: a valid upload succeeds and is readable.
  void ExpectServing() {
    auto info = client_->Upload(MakeManifest("ok", 1, layers_), Spans(layers_));
    ASSERT_TRUE(info.ok()) << info.status();
    std::vector<uint8_t> bytes;
    auto m = client_->GetManifest("ok-r1");
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(ReadWholeLayer(client_.get(), "ok-r1", *m, 0, &bytes).ok());
    EXPECT_EQ(std::string(bytes.begin(), bytes.end()), layers_[0].str());
    ASSERT_TRUE(client_->Delete("ok-r1").ok());
  }

  // Sends `messages` on a raw Upload stream, then closes it.
  absl::Status RawUpload(const std::vector<v1::UploadChunk>& messages) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    v1::CheckpointInfo info;
    auto writer = stub_->Upload(&ctx, &info);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  static v1::UploadChunk ManifestMsg(const v1::Manifest& m) {
    v1::UploadChunk c;
    *c.mutable_manifest() = m;
    return c;
  }
  static v1::UploadChunk DataMsg(uint32_t layer, uint64_t offset, const std::string& data) {
    v1::UploadChunk c;
    c.mutable_data()->set_layer(layer);
    c.mutable_data()->set_offset(offset);
    c.mutable_data()->set_data(data);
    c.mutable_data()->set_crc32c(Crc32c(data.data(), data.size()));
    return c;
  }
  // The whole checkpoint as messages.
  std::vector<v1::UploadChunk> Messages(const v1::Manifest& m, const std::vector<TestLayer>& l) {
    std::vector<v1::UploadChunk> out = {ManifestMsg(m)};
    for (size_t i = 0; i < l.size(); ++i) {
      const std::string s = l[i].str();
      for (size_t off = 0; off < s.size(); off += 4096) {
        out.push_back(DataMsg(static_cast<uint32_t>(i), off, s.substr(off, 4096)));
      }
    }
    return out;
  }

  TempDir dir_;
  std::atomic<bool> disk_full_{false};
  std::unique_ptr<CheckpointServer> server_;
  std::string address_;
  std::unique_ptr<GrpcCheckpointClient> client_;
  std::unique_ptr<v1::Checkpoint::Stub> stub_;
  // Layer 0 spans three 1 MiB chunks.
  const std::vector<TestLayer> layers_ = {MakeLayer("fc1.weight", {640, 1000}, 1),
                                          MakeLayer("fc1.bias", {640}, 2),
                                          MakeLayer("fc2.weight", {10, 640}, 3)};
};

TEST_F(CheckpointServiceTest, UploadListGetReadDelete) {
  auto info = client_->Upload(MakeManifest("run-1", 7, layers_), Spans(layers_));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->id(), "run-1-r7");
  EXPECT_EQ(info->bytes(), (640 * 1000 + 640 + 6400) * 4u);
  EXPECT_GT(info->created_unix_ms(), 0);

  auto list = client_->List("");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].id(), "run-1-r7");
  EXPECT_EQ((*list)[0].layers(), 3u);
  EXPECT_TRUE(client_->List("run-2")->empty());

  auto m = client_->GetManifest("run-1-r7");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->layers_size(), 3);
  EXPECT_EQ(m->layers(0).name(), "fc1.weight");
  EXPECT_THAT(m->layers(0).shape(), ::testing::ElementsAre(640, 1000));

  for (uint32_t i = 0; i < 3; ++i) {
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(ReadWholeLayer(client_.get(), "run-1-r7", *m, i, &bytes).ok());
    EXPECT_EQ(std::string(bytes.begin(), bytes.end()), layers_[i].str()) << i;
  }
  // A range across a chunk boundary, delivered in order with offsets.
  std::string range;
  uint64_t expect_at = (1 << 20) - 10;
  absl::Status s =
      client_->ReadLayer("run-1-r7", 0, expect_at, (1 << 20) + 20, [&](uint64_t at, ByteSpan d) {
        EXPECT_EQ(at, expect_at);
        expect_at += d.size();
        range.append(reinterpret_cast<const char*>(d.data()), d.size());
        return true;
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(range, layers_[0].str().substr((1 << 20) - 10, (1 << 20) + 20));
  // To the end of the layer (length 0).
  range.clear();
  s = client_->ReadLayer("run-1-r7", 1, 1000, 0, [&](uint64_t, ByteSpan d) {
    range.append(reinterpret_cast<const char*>(d.data()), d.size());
    return true;
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(range, layers_[1].str().substr(1000));
  // A sink that stops early cancels the read.
  s = client_->ReadLayer("run-1-r7", 0, 0, 0, [](uint64_t, ByteSpan) { return false; });
  EXPECT_TRUE(absl::IsCancelled(s)) << s;

  ASSERT_TRUE(client_->Delete("run-1-r7").ok());
  EXPECT_TRUE(client_->List("")->empty());
  EXPECT_TRUE(absl::IsNotFound(client_->GetManifest("run-1-r7").status()));
  EXPECT_EQ(CountBlobs(data_dir()), 0u);
}

TEST_F(CheckpointServiceTest, UnknownIdIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(client_->GetManifest("nope-r1").status()));
  EXPECT_TRUE(absl::IsNotFound(client_->Delete("nope-r1")));
  absl::Status s = client_->ReadLayer("nope-r1", 0, 0, 0, [](uint64_t, ByteSpan) { return true; });
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  ExpectServing();
}

// Hostile ids through the real protocol: each is INVALID_ARGUMENT before the
// store looks anything up or touches a file, and the server keeps serving.
TEST_F(CheckpointServiceTest, HostileIdsAreInvalidArguments) {
  ASSERT_TRUE(client_->Upload(MakeManifest("run", 1, layers_), Spans(layers_)).ok());
  const std::vector<std::string> hostile = {
      "",
      "..",
      "../run-r1",
      "run-r1/..",
      "manifests/run-r1",
      "/etc/passwd",
      ".hidden-r1",
      "a..b-r1",
      std::string("run-r1\0x", 8),
      "run r1",
      "run-r1\n",
      std::string(checkpoint::kMaxCheckpointIdLength + 1, 'x'),
      std::string(1 << 20, 'a')};
  auto sink = [](uint64_t, ByteSpan) { return true; };
  for (const std::string& id : hostile) {
    SCOPED_TRACE(id.substr(0, 40));
    absl::Status s = client_->GetManifest(id).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    s = client_->ReadLayer(id, 0, 0, 0, sink);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    s = client_->Delete(id);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  }
  // The longest valid id is merely unknown.
  EXPECT_TRUE(absl::IsNotFound(
      client_->GetManifest(std::string(checkpoint::kMaxCheckpointIdLength, 'x')).status()));
  // A run id filter of List is checked the same way.
  grpc::ClientContext ctx;
  v1::ListCheckpointsRequest list;
  list.set_run_id("../run");
  v1::ListCheckpointsResponse listed;
  EXPECT_EQ(stub_->List(&ctx, list, &listed).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Nothing was touched: the checkpoint is still there and whole.
  auto m = client_->GetManifest("run-r1");
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(ReadWholeLayer(client_.get(), "run-r1", *m, 1, &bytes).ok());
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), layers_[1].str());
  ASSERT_TRUE(client_->Delete("run-r1").ok());
  ExpectServing();
}

// Huge offsets and lengths on a raw stub (the client library checks its
// own spans): OUT_OF_RANGE, never a wrapped range, and the server serves on.
TEST_F(CheckpointServiceTest, HugeOffsetsAndLengthsAreOutOfRange) {
  ASSERT_TRUE(client_->Upload(MakeManifest("run", 1, layers_), Spans(layers_)).ok());
  const uint64_t kMax = ~uint64_t{0};
  struct Case {
    uint32_t layer;
    uint64_t offset, length;
  };
  for (const Case& c : {Case{1, kMax, 0}, Case{1, 8, kMax}, Case{1, kMax - 7, 16},
                        Case{1, 2560, kMax - 2559}, Case{~0u, 0, 0}, Case{3, 0, 0}}) {
    SCOPED_TRACE(absl::StrCat(c.layer, " ", c.offset, " ", c.length));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    v1::ReadLayerRequest request;
    request.set_id("run-r1");
    request.set_layer(c.layer);
    request.set_offset(c.offset);
    request.set_length(c.length);
    auto reader = stub_->ReadLayer(&ctx, request);
    v1::LayerChunk chunk;
    size_t chunks = 0;
    while (reader->Read(&chunk)) ++chunks;
    EXPECT_EQ(chunks, 0u);
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::OUT_OF_RANGE);
  }
  ASSERT_TRUE(client_->Delete("run-r1").ok());
  ExpectServing();
}

TEST_F(CheckpointServiceTest, ReadsPastTheEndAreOutOfRange) {
  ASSERT_TRUE(client_->Upload(MakeManifest("run", 1, layers_), Spans(layers_)).ok());
  auto sink = [](uint64_t, ByteSpan) { return true; };
  absl::Status s = client_->ReadLayer("run-r1", 3, 0, 0, sink);
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
  s = client_->ReadLayer("run-r1", 1, 2561, 0, sink);
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
  s = client_->ReadLayer("run-r1", 1, 2000, 561, sink);
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
  EXPECT_TRUE(client_->ReadLayer("run-r1", 1, 2000, 560, sink).ok());
  ASSERT_TRUE(client_->Delete("run-r1").ok());
  ExpectServing();
}

TEST_F(CheckpointServiceTest, ChunkWithABadChecksumIsDataLoss) {
  auto msgs = Messages(MakeManifest("run", 1, layers_), layers_);
  msgs[3].mutable_data()->set_crc32c(msgs[3].data().crc32c() ^ 1);
  absl::Status s = RawUpload(msgs);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("checksum"));
  ExpectNothingCommitted();
  ExpectServing();
}

TEST_F(CheckpointServiceTest, BytesThatDoNotMatchTheManifestHashAreDataLoss) {
  std::vector<TestLayer> tampered = layers_;
  tampered[2].values[5] += 1;
  // The manifest describes layers_, the bytes are tampered's.
  auto info = client_->Upload(MakeManifest("run", 1, layers_), Spans(tampered));
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("fc2.weight"));
  ExpectNothingCommitted();
  ExpectServing();
}

TEST_F(CheckpointServiceTest, TruncatedUploadCommitsNothing) {
  auto msgs = Messages(MakeManifest("run", 1, layers_), layers_);
  msgs.resize(msgs.size() - 3);  // the stream closes before the last bytes
  absl::Status s = RawUpload(msgs);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("nothing committed"));
  ExpectNothingCommitted();
  // A manifest alone, then close.
  s = RawUpload({ManifestMsg(MakeManifest("run", 1, layers_))});
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  ExpectNothingCommitted();
  ExpectServing();
}

TEST_F(CheckpointServiceTest, MalformedStreamsAreInvalidArguments) {
  const v1::Manifest m = MakeManifest("run", 1, layers_);
  // First message not a manifest.
  absl::Status s = RawUpload({DataMsg(0, 0, "abcd")});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("first message"));
  // No message at all.
  s = RawUpload({});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  // A second manifest.
  s = RawUpload({ManifestMsg(m), ManifestMsg(m)});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  // Duplicate layer names, bad dtype (through the real client).
  v1::Manifest dup = m;
  dup.mutable_layers(2)->set_name("fc1.bias");
  auto info = client_->Upload(dup, Spans(layers_));
  EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("duplicate layer name"));
  v1::Manifest dtype = m;
  dtype.mutable_layers(0)->set_dtype("bfloat16");
  info = client_->Upload(dtype, Spans(layers_));
  EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("dtype"));
  // A gap in a layer.
  auto msgs = Messages(m, layers_);
  msgs.erase(msgs.begin() + 2);
  s = RawUpload(msgs);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  ExpectNothingCommitted();
  ExpectServing();
}

TEST_F(CheckpointServiceTest, FullDiskIsResourceExhausted) {
  disk_full_ = true;
  auto info = client_->Upload(MakeManifest("run", 1, layers_), Spans(layers_));
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(info.status())) << info.status();
  ExpectNothingCommitted();
  disk_full_ = false;
  ExpectServing();
}

TEST_F(CheckpointServiceTest, ClientThatGoesAwayMidUploadCommitsNothing) {
  auto msgs = Messages(MakeManifest("run", 1, layers_), layers_);
  {
    grpc::ClientContext ctx;
    v1::CheckpointInfo info;
    auto writer = stub_->Upload(&ctx, &info);
    for (size_t i = 0; i < msgs.size() / 2; ++i) ASSERT_TRUE(writer->Write(msgs[i]));
    ASSERT_TRUE(WaitUntil([&] { return testing::CountTmp(data_dir()) > 0; }, absl::Seconds(5)));
    ctx.TryCancel();
    EXPECT_FALSE(writer->Finish().ok());
  }
  ExpectNothingCommitted();
  ExpectServing();
}

TEST_F(CheckpointServiceTest, ConcurrentUploadsSharingBlobsAndDeletes) {
  // Eight rounds share layers 1 and 2; each has its own layer 0.
  std::vector<std::vector<TestLayer>> rounds;
  for (int r = 0; r < 8; ++r) {
    rounds.push_back({MakeLayer("w", {300, 100}, static_cast<float>(r)), layers_[1], layers_[2]});
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int r = 0; r < 8; ++r) {
    threads.emplace_back([&, r] {
      auto info = client_->Upload(MakeManifest("run", r + 1, rounds[r]), Spans(rounds[r]));
      if (!info.ok()) ++failures;
      // Every other one is deleted again right away, racing the others.
      if (info.ok() && r % 2 == 0 && !client_->Delete(info->id()).ok()) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto list = client_->List("run");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 4u);
  for (const auto& c : *list) {
    auto m = client_->GetManifest(c.id());
    ASSERT_TRUE(m.ok());
    for (uint32_t i = 0; i < 3; ++i) {
      std::vector<uint8_t> bytes;
      absl::Status s = ReadWholeLayer(client_.get(), c.id(), *m, i, &bytes);
      EXPECT_TRUE(s.ok()) << c.id() << " layer " << i << ": " << s;
    }
  }
  EXPECT_EQ(CountBlobs(data_dir()), 4u + 2u);
}

TEST_F(CheckpointServiceTest, RestartServesCommittedAndReportsDamage) {
  ASSERT_TRUE(client_->Upload(MakeManifest("run", 1, layers_), Spans(layers_)).ok());
  std::vector<TestLayer> other = {MakeLayer("x", {1000}, 9)};
  ASSERT_TRUE(client_->Upload(MakeManifest("run", 2, other), Spans(other)).ok());
  server_->Shutdown(absl::Seconds(1));
  // Corrupt the blob of layer 1 of round 1.
  const std::string sha = Sha256Hex(layers_[1].data(), layers_[1].bytes());
  {
    std::fstream f(data_dir() + "/blobs/" + sha.substr(0, 2) + "/" + sha,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.put('\x55');
  }
  server_.reset();
  Start();
  auto list = client_->List("run");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].damage(), "");
  EXPECT_THAT((*list)[1].damage(), HasSubstr("fc1.bias"));
  absl::Status s = client_->ReadLayer("run-r1", 0, 0, 0, [](uint64_t, ByteSpan) { return true; });
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  auto m = client_->GetManifest("run-r2");
  ASSERT_TRUE(m.ok());
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(ReadWholeLayer(client_.get(), "run-r2", *m, 0, &bytes).ok());
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), other[0].str());
}

TEST_F(CheckpointServiceTest, ClientChecksSpansBeforeSending) {
  auto spans = Spans(layers_);
  spans.pop_back();
  auto info = client_->Upload(MakeManifest("run", 1, layers_), spans);
  EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << info.status();
  spans = Spans(layers_);
  spans[1] = spans[1].subspan(0, 8);
  info = client_->Upload(MakeManifest("run", 1, layers_), spans);
  EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << info.status();
}

TEST_F(CheckpointServiceTest, ShutdownLetsARunningUploadFinishWithinTheGrace) {
  auto msgs = Messages(MakeManifest("run", 1, layers_), layers_);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(absl::Seconds(30)));
  v1::CheckpointInfo info;
  auto writer = stub_->Upload(&ctx, &info);
  const size_t half = msgs.size() / 2;
  for (size_t i = 0; i < half; ++i) ASSERT_TRUE(writer->Write(msgs[i]));
  // The server must have started the upload before it drains (else it
  // rightly refuses it as a new call).
  ASSERT_TRUE(WaitUntil([&] { return testing::CountTmp(data_dir()) > 0; }, absl::Seconds(10)));
  std::thread stopper([&] { server_->Shutdown(absl::Seconds(20)); });
  // Joined on every path, also when an expectation below fails.
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{stopper};
  // New calls are refused while the upload drains.
  CheckpointClientOptions quick;
  quick.call_timeout = absl::Milliseconds(300);
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto list = GrpcCheckpointClient(address_, quick).List("");
        return !list.ok() && absl::IsUnavailable(list.status());
      },
      absl::Seconds(5)));
  bool written = true;
  for (size_t i = half; i < msgs.size() && written; ++i) written = writer->Write(msgs[i]);
  EXPECT_TRUE(written);
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(info.id(), "run-r1");
  stopper.join();
  server_.reset();
  Start();
  auto list = client_->List("");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 1u);
}

TEST_F(CheckpointServiceTest, ShutdownCancelsAnUploadStillRunningAfterTheGrace) {
  auto msgs = Messages(MakeManifest("run", 1, layers_), layers_);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(absl::Seconds(60)));
  v1::CheckpointInfo info;
  auto writer = stub_->Upload(&ctx, &info);
  for (size_t i = 0; i < msgs.size() / 2; ++i) ASSERT_TRUE(writer->Write(msgs[i]));
  ASSERT_TRUE(WaitUntil([&] { return testing::CountTmp(data_dir()) > 0; }, absl::Seconds(30)));
  server_->Shutdown(absl::Milliseconds(300));
  // The shutdown cancelled the upload: had it waited for the upload, the
  // upload would have ended by the client's deadline (DEADLINE_EXCEEDED).
  const grpc::Status finished = writer->Finish();
  EXPECT_FALSE(finished.ok());
  EXPECT_NE(finished.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << finished.error_message();
  server_.reset();
  EXPECT_EQ(CountEntries(data_dir() + "/tmp"), 0u);
  Start();
  ExpectNothingCommitted();
}

TEST_F(CheckpointServiceTest, UnreachableStoreIsUnavailableWithinTheDeadline) {
  CheckpointClientOptions o;
  o.call_timeout = absl::Milliseconds(500);
  server_->Shutdown(absl::ZeroDuration());
  GrpcCheckpointClient client(address_, o);
  const absl::Time start = absl::Now();
  auto list = client.List("");
  EXPECT_FALSE(list.ok());
  EXPECT_TRUE(absl::IsUnavailable(list.status()) || absl::IsDeadlineExceeded(list.status()))
      << list.status();
  // A hang guard (120 x the call timeout), not a target: the client gives
  // up instead of retrying without end.
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
}

}  // namespace
}  // namespace shoal::checkpoint
