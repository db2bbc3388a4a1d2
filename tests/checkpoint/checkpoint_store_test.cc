// Unit tests of CheckpointStore: the store on a temporary directory, a fake
// clock, no sockets.
#include "services/checkpoint/core/checkpoint_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/support/test_support.h"

namespace shoal::checkpoint {
namespace {

using ::shoal::checkpoint::testing::CountBlobs;
using ::shoal::checkpoint::testing::CountEntries;
using ::shoal::checkpoint::testing::CountTmp;
using ::shoal::checkpoint::testing::MakeLayer;
using ::shoal::checkpoint::testing::MakeManifest;
using ::shoal::checkpoint::testing::TestLayer;
using ::shoal::testing::TempDir;
using ::testing::HasSubstr;

class CheckpointStoreTest : public ::testing::Test {
 protected:
  StoreOptions Options() {
    StoreOptions o;
    o.data_dir = dir_.path() + "/store";
    o.clock = &clock_;
    return o;
  }

  std::unique_ptr<CheckpointStore> OpenStore(StoreOptions o) {
    auto store = CheckpointStore::Open(std::move(o));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  std::unique_ptr<CheckpointStore> OpenStore() { return OpenStore(Options()); }

  // Uploads in chunks of `chunk` bytes.
  static absl::StatusOr<v1::CheckpointInfo> Upload(CheckpointStore* store,
                                                   const v1::Manifest& manifest,
                                                   const std::vector<TestLayer>& layers,
                                                   size_t chunk = 1000) {
    auto upload = store->BeginUpload(manifest);
    if (!upload.ok()) return upload.status();
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string bytes = layers[i].str();
      for (size_t off = 0; off < bytes.size(); off += chunk) {
        absl::Status s = (*upload)->Append(static_cast<uint32_t>(i), off,
                                           absl::string_view(bytes).substr(off, chunk));
        if (!s.ok()) return s;
      }
    }
    return (*upload)->Commit();
  }

  // The whole range [offset, offset + length) of a layer.
  static absl::StatusOr<std::string> Read(CheckpointStore* store, const std::string& id,
                                          uint32_t layer, uint64_t offset = 0,
                                          uint64_t length = 0) {
    auto reader = store->ReadLayer(id, layer, offset, length);
    if (!reader.ok()) return reader.status();
    std::string all, piece;
    while ((*reader)->remaining() > 0) {
      auto at = (*reader)->Next(777, &piece);
      if (!at.ok()) return at.status();
      if (*at != offset + all.size()) return absl::InternalError("pieces out of order");
      all += piece;
    }
    absl::Status s = (*reader)->Finish();
    if (!s.ok()) return s;
    return all;
  }

  std::string data_dir() { return dir_.path() + "/store"; }
  std::string BlobPath(const std::string& sha) {
    return data_dir() + "/blobs/" + sha.substr(0, 2) + "/" + sha;
  }

  TempDir dir_;
  FakeClock clock_;
  const std::vector<TestLayer> layers_ = {MakeLayer("fc1.weight", {64, 50}, 1),
                                          MakeLayer("fc1.bias", {64}, 2),
                                          MakeLayer("fc2.weight", {10, 64}, 3)};
};

TEST_F(CheckpointStoreTest, CommittedCheckpointRoundTrips) {
  auto store = OpenStore();
  v1::Manifest m = MakeManifest("run-a", 3, layers_);
  auto info = Upload(store.get(), m, layers_);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->id(), "run-a-r3");
  EXPECT_EQ(info->run_id(), "run-a");
  EXPECT_EQ(info->round(), 3u);
  EXPECT_EQ(info->layers(), 3u);
  EXPECT_EQ(info->bytes(), (64 * 50 + 64 + 640) * 4u);
  EXPECT_EQ(info->created_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_EQ(info->damage(), "");

  auto got = store->GetManifest("run-a-r3");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->id(), "run-a-r3");
  EXPECT_EQ(got->model(), "mlp");
  EXPECT_EQ(got->epoch(), m.epoch());
  ASSERT_EQ(got->layers_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got->layers(i).SerializeAsString(), m.layers(i).SerializeAsString()) << i;
    auto bytes = Read(store.get(), "run-a-r3", i);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, layers_[i].str()) << i;
  }
  // Ranges.
  auto range = Read(store.get(), "run-a-r3", 0, 100, 4000);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, layers_[0].str().substr(100, 4000));
  auto tail = Read(store.get(), "run-a-r3", 0, 12000);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(*tail, layers_[0].str().substr(12000));
  auto empty = Read(store.get(), "run-a-r3", 1, 256);  // offset == size: nothing left
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");

  ASSERT_EQ(store->List().size(), 1u);
  EXPECT_EQ(CountTmp(data_dir()), 0u);
  EXPECT_EQ(CountBlobs(data_dir()), 3u);
}

TEST_F(CheckpointStoreTest, ListIsNewestFirstAndFiltersByRun) {
  auto store = OpenStore();
  ASSERT_TRUE(Upload(store.get(), MakeManifest("a", 1, layers_), layers_).ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Upload(store.get(), MakeManifest("b", 1, layers_), layers_).ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Upload(store.get(), MakeManifest("a", 2, layers_), layers_).ok());
  auto all = store->List();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].id(), "a-r2");
  EXPECT_EQ(all[1].id(), "b-r1");
  EXPECT_EQ(all[2].id(), "a-r1");
  auto a = store->List("a");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].id(), "a-r2");
  EXPECT_TRUE(store->List("nope").empty());
}

TEST_F(CheckpointStoreTest, BlobsAreDeduplicatedBySha256) {
  auto store = OpenStore();
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  EXPECT_EQ(CountBlobs(data_dir()), 3u);
  // Round 2 changes one layer: one new blob.
  std::vector<TestLayer> next = layers_;
  next[1] = MakeLayer("fc1.bias", {64}, 42);
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 2, next), next).ok());
  EXPECT_EQ(CountBlobs(data_dir()), 4u);
  // Two layers with the same bytes in one checkpoint share a blob.
  std::vector<TestLayer> twins = {MakeLayer("a", {100}, 7), MakeLayer("b", {100}, 7)};
  ASSERT_TRUE(Upload(store.get(), MakeManifest("twins", 1, twins), twins).ok());
  EXPECT_EQ(CountBlobs(data_dir()), 5u);
  EXPECT_EQ(CountTmp(data_dir()), 0u);
}

TEST_F(CheckpointStoreTest, DeleteRemovesUnreferencedBlobsAndKeepsSharedOnes) {
  auto store = OpenStore();
  std::vector<TestLayer> next = layers_;
  next[1] = MakeLayer("fc1.bias", {64}, 42);
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 2, next), next).ok());
  ASSERT_EQ(CountBlobs(data_dir()), 4u);

  ASSERT_TRUE(store->Delete("run-r1").ok());
  EXPECT_EQ(CountBlobs(data_dir()), 3u);  // layers_[1]'s blob went, the shared ones stayed
  EXPECT_FALSE(std::filesystem::exists(data_dir() + "/manifests/run-r1.pb"));
  for (uint32_t i = 0; i < 3; ++i) {
    auto bytes = Read(store.get(), "run-r2", i);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, next[i].str());
  }
  EXPECT_TRUE(absl::IsNotFound(store->GetManifest("run-r1").status()));
  EXPECT_TRUE(absl::IsNotFound(store->Delete("run-r1")));
  ASSERT_TRUE(store->Delete("run-r2").ok());
  EXPECT_EQ(CountBlobs(data_dir()), 0u);
  EXPECT_TRUE(store->List().empty());
}

TEST_F(CheckpointStoreTest, AbandonedUploadLeavesNothing) {
  auto store = OpenStore();
  {
    auto upload = store->BeginUpload(MakeManifest("run", 1, layers_));
    ASSERT_TRUE(upload.ok());
    // Layer 0 complete (hashed, fsynced), layer 1 half written.
    ASSERT_TRUE((*upload)->Append(0, 0, layers_[0].str()).ok());
    ASSERT_TRUE((*upload)->Append(1, 0, layers_[1].str().substr(0, 100)).ok());
    EXPECT_GT(CountTmp(data_dir()), 0u);
    EXPECT_TRUE(store->List().empty());
  }
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(CountEntries(data_dir() + "/tmp"), 0u);
  EXPECT_EQ(CountBlobs(data_dir()), 0u);
}

TEST_F(CheckpointStoreTest, UploadCutByACrashIsWipedOnOpen) {
  const std::string dir = data_dir();
  // A child process opens the store, uploads part of a checkpoint and dies
  // without running any destructor (as kill -9 would leave it).
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    StoreOptions o;
    o.data_dir = dir;
    auto store = CheckpointStore::Open(o);
    if (!store.ok()) _exit(3);
    auto upload = (*store)->BeginUpload(MakeManifest("run", 1, layers_));
    if (!upload.ok()) _exit(4);
    if (!(*upload)->Append(0, 0, layers_[0].str()).ok()) _exit(5);
    if (!(*upload)->Append(1, 0, layers_[1].str().substr(0, 64)).ok()) _exit(6);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_GT(CountTmp(dir), 0u);

  // Also a blob that made it into place without its manifest (a crash
  // between the two steps of a commit).
  const std::string orphan = Sha256Hex("orphan", 6);
  std::filesystem::create_directories(BlobPath(orphan) + "/..");
  std::ofstream(BlobPath(orphan)) << "orphan";

  auto store = OpenStore();
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(CountEntries(dir + "/tmp"), 0u);
  EXPECT_EQ(CountBlobs(dir), 0u);
  // And the store works.
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  EXPECT_EQ(store->List().size(), 1u);
}

TEST_F(CheckpointStoreTest, ReopenServesEverythingCommitted) {
  std::vector<TestLayer> next = layers_;
  next[2] = MakeLayer("fc2.weight", {10, 64}, 99);
  {
    auto store = OpenStore();
    ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
    clock_.Advance(absl::Seconds(5));
    ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 2, next), next).ok());
  }
  auto store = OpenStore();
  auto list = store->List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].id(), "run-r2");
  EXPECT_EQ(list[0].created_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_EQ(list[0].damage(), "");
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(*Read(store.get(), "run-r1", i), layers_[i].str());
    EXPECT_EQ(*Read(store.get(), "run-r2", i), next[i].str());
  }
}

TEST_F(CheckpointStoreTest, OnlyOneStorePerDirectory) {
  auto store = OpenStore();
  auto second = CheckpointStore::Open(Options());
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
  store.reset();
  EXPECT_TRUE(CheckpointStore::Open(Options()).ok());
}

TEST_F(CheckpointStoreTest, UnknownFormatIsRefused) {
  std::filesystem::create_directories(data_dir());
  std::ofstream(data_dir() + "/FORMAT") << "something else 9\n";
  auto store = CheckpointStore::Open(Options());
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
}

TEST_F(CheckpointStoreTest, LayerWithTheWrongHashIsRefusedWithDataLoss) {
  auto store = OpenStore();
  v1::Manifest m = MakeManifest("run", 1, layers_);
  m.mutable_layers(1)->set_sha256(std::string(64, 'a'));
  auto info = Upload(store.get(), m, layers_);
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("fc1.bias"));
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(CountEntries(data_dir() + "/tmp"), 0u);
  EXPECT_EQ(CountBlobs(data_dir()), 0u);
}

TEST_F(CheckpointStoreTest, TruncatedUploadCommitsNothing) {
  auto store = OpenStore();
  auto upload = store->BeginUpload(MakeManifest("run", 1, layers_));
  ASSERT_TRUE(upload.ok());
  ASSERT_TRUE((*upload)->Append(0, 0, layers_[0].str()).ok());
  ASSERT_TRUE((*upload)->Append(1, 0, layers_[1].str().substr(0, 8)).ok());
  auto info = (*upload)->Commit();
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(absl::IsDataLoss(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("nothing committed"));
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(CountTmp(data_dir()), 0u);
}

TEST_F(CheckpointStoreTest, ChunksOutOfOrderAreInvalid) {
  auto store = OpenStore();
  const v1::Manifest m = MakeManifest("run", 1, layers_);
  const std::string l0 = layers_[0].str();
  struct Case {
    const char* what;
    std::function<absl::Status(PendingUpload*)> run;
  };
  const std::vector<Case> cases = {
      {"gap", [&](PendingUpload* u) { return u->Append(0, 4, l0.substr(4, 8)); }},
      {"overlap",
       [&](PendingUpload* u) {
         EXPECT_TRUE(u->Append(0, 0, l0.substr(0, 8)).ok());
         return u->Append(0, 4, l0.substr(4, 8));
       }},
      {"past the end", [&](PendingUpload* u) { return u->Append(1, 0, std::string(300, 'x')); }},
      {"skips an incomplete layer", [&](PendingUpload* u) { return u->Append(1, 0, "abcd"); }},
      {"unknown layer", [&](PendingUpload* u) { return u->Append(7, 0, "abcd"); }},
      {"empty chunk", [&](PendingUpload* u) { return u->Append(0, 0, ""); }},
      {"layer again",
       [&](PendingUpload* u) {
         EXPECT_TRUE(u->Append(0, 0, l0).ok());
         return u->Append(0, 0, l0.substr(0, 4));
       }},
  };
  for (const Case& c : cases) {
    auto upload = store->BeginUpload(m);
    ASSERT_TRUE(upload.ok());
    absl::Status s = c.run(upload->get());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.what << ": " << s;
    // The upload is dead after an error.
    EXPECT_EQ((*upload)->Commit().status(), s) << c.what;
  }
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(CountEntries(data_dir() + "/tmp"), 0u);
}

TEST_F(CheckpointStoreTest, BadManifestsAreInvalidArguments) {
  auto store = OpenStore();
  const v1::Manifest good = MakeManifest("run", 1, layers_);
  struct Case {
    const char* what;
    std::function<void(v1::Manifest*)> mutate;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no run id", [](v1::Manifest* m) { m->clear_run_id(); }, "run_id"},
      {"path in run id", [](v1::Manifest* m) { m->set_run_id("../evil"); }, "run_id"},
      {"slash in run id", [](v1::Manifest* m) { m->set_run_id("a/b"); }, "run_id"},
      {"no layers", [](v1::Manifest* m) { m->clear_layers(); }, "no layers"},
      {"duplicate names", [](v1::Manifest* m) { m->mutable_layers(2)->set_name("fc1.weight"); },
       "duplicate layer name 'fc1.weight'"},
      {"empty name", [](v1::Manifest* m) { m->mutable_layers(0)->clear_name(); }, "no name"},
      {"bad dtype", [](v1::Manifest* m) { m->mutable_layers(1)->set_dtype("float16"); },
       "unsupported dtype 'float16'"},
      {"bytes vs shape", [](v1::Manifest* m) { m->mutable_layers(1)->set_bytes(100); },
       "bytes is 100"},
      {"negative dim", [](v1::Manifest* m) { m->mutable_layers(1)->set_shape(0, -64); },
       "negative"},
      {"short sha", [](v1::Manifest* m) { m->mutable_layers(0)->set_sha256("abc"); }, "sha256"},
      {"non-hex sha",
       [](v1::Manifest* m) { m->mutable_layers(0)->set_sha256(std::string(64, 'z')); }, "sha256"},
      {"model layer after optimizer state",
       [](v1::Manifest* m) { m->mutable_layers(1)->set_optimizer_state(true); },
       "a model layer after an optimizer state layer"},
      {"only optimizer state",
       [](v1::Manifest* m) { m->mutable_layers(0)->set_optimizer_state(true); }, "no model layer"},
  };
  for (const Case& c : cases) {
    v1::Manifest m = good;
    c.mutate(&m);
    auto upload = store->BeginUpload(m);
    ASSERT_FALSE(upload.ok()) << c.what;
    EXPECT_TRUE(absl::IsInvalidArgument(upload.status())) << c.what << ": " << upload.status();
    EXPECT_THAT(std::string(upload.status().message()), HasSubstr(c.message)) << c.what;
  }
  EXPECT_EQ(CountEntries(data_dir() + "/tmp"), 0u);
}

TEST_F(CheckpointStoreTest, StoreSetsIdAndAcceptsUppercaseHashes) {
  auto store = OpenStore();
  v1::Manifest m = MakeManifest("run", 5, layers_);
  m.set_id("whatever-the-client-says");
  m.set_created_unix_ms(1);
  for (auto& l : *m.mutable_layers()) absl::AsciiStrToUpper(l.mutable_sha256());
  auto info = Upload(store.get(), m, layers_);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->id(), "run-r5");
  EXPECT_EQ(store->GetManifest("run-r5")->layers(0).sha256(),
            Sha256Hex(layers_[0].data(), layers_[0].bytes()));
}

TEST_F(CheckpointStoreTest, ReuploadOfTheSameIdReplacesIt) {
  auto store = OpenStore();
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  std::vector<TestLayer> other = layers_;
  other[0] = MakeLayer("fc1.weight", {64, 50}, 1000);
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, other), other).ok());
  ASSERT_EQ(store->List().size(), 1u);
  EXPECT_EQ(*Read(store.get(), "run-r1", 0), other[0].str());
  EXPECT_EQ(CountBlobs(data_dir()), 3u);  // the replaced layer's blob is gone
}

TEST_F(CheckpointStoreTest, RetentionKeepsTheLastKPerRun) {
  StoreOptions o = Options();
  o.retain = 2;
  auto store = OpenStore(o);
  for (uint64_t round = 1; round <= 4; ++round) {
    std::vector<TestLayer> l = {MakeLayer("w", {100}, static_cast<float>(round))};
    ASSERT_TRUE(Upload(store.get(), MakeManifest("run", round, l), l).ok());
    clock_.Advance(absl::Seconds(1));
  }
  std::vector<TestLayer> other = {MakeLayer("w", {100}, 77)};
  ASSERT_TRUE(Upload(store.get(), MakeManifest("other", 1, other), other).ok());
  auto run = store->List("run");
  ASSERT_EQ(run.size(), 2u);
  EXPECT_EQ(run[0].id(), "run-r4");
  EXPECT_EQ(run[1].id(), "run-r3");
  EXPECT_EQ(store->List("other").size(), 1u);
  EXPECT_EQ(CountBlobs(data_dir()), 3u);
  EXPECT_EQ(CountEntries(data_dir() + "/manifests"), 3u);

  // A lower retention applies when the store opens again.
  store.reset();
  o.retain = 1;
  store = OpenStore(o);
  ASSERT_EQ(store->List("run").size(), 1u);
  EXPECT_EQ(store->List("run")[0].id(), "run-r4");
  EXPECT_EQ(CountBlobs(data_dir()), 2u);
}

TEST_F(CheckpointStoreTest, ReadErrorsHaveTheirCodes) {
  auto store = OpenStore();
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  EXPECT_TRUE(absl::IsNotFound(store->ReadLayer("run-r9", 0, 0, 0).status()));
  EXPECT_TRUE(absl::IsNotFound(store->GetManifest("nope").status()));
  EXPECT_TRUE(absl::IsOutOfRange(store->ReadLayer("run-r1", 3, 0, 0).status()));
  EXPECT_TRUE(absl::IsOutOfRange(store->ReadLayer("run-r1", 1, 257, 0).status()));
  EXPECT_TRUE(absl::IsOutOfRange(store->ReadLayer("run-r1", 1, 200, 57).status()));
  EXPECT_TRUE(store->ReadLayer("run-r1", 1, 200, 56).ok());
}

TEST_F(CheckpointStoreTest, VerifyOnStartFindsACorruptedBlob) {
  std::vector<TestLayer> other = layers_;
  other[1] = MakeLayer("fc1.bias", {64}, 5);
  {
    auto store = OpenStore();
    ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
    ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 2, other), other).ok());
  }
  // Flip one byte of layer 1 of round 1 (a blob only round 1 uses).
  const std::string sha = Sha256Hex(layers_[1].data(), layers_[1].bytes());
  {
    std::fstream f(BlobPath(sha), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17);
    f.put('\x7f');
  }
  auto store = OpenStore();
  auto r1 = store->Info("run-r1");
  ASSERT_TRUE(r1.ok());
  EXPECT_THAT(r1->damage(), HasSubstr("fc1.bias"));
  EXPECT_THAT(r1->damage(), HasSubstr("corrupted"));
  EXPECT_EQ(store->Info("run-r2")->damage(), "");
  // Reads of the damaged checkpoint fail with DATA_LOSS, its manifest stays
  // readable, the healthy one is unaffected.
  auto read = store->ReadLayer("run-r1", 0, 0, 0);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("damaged"));
  EXPECT_TRUE(store->GetManifest("run-r1").ok());
  EXPECT_EQ(*Read(store.get(), "run-r2", 1), other[1].str());

  // Uploading the same bytes again repairs the blob.
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 3, layers_), layers_).ok());
  EXPECT_EQ(store->Info("run-r1")->damage(), "");
  EXPECT_EQ(*Read(store.get(), "run-r1", 1), layers_[1].str());
}

TEST_F(CheckpointStoreTest, WithoutVerificationAWholeLayerReadFindsCorruption) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  }
  const std::string sha = Sha256Hex(layers_[0].data(), layers_[0].bytes());
  {
    std::fstream f(BlobPath(sha), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put('\x01');
  }
  StoreOptions o = Options();
  o.verify_on_start = false;
  auto store = OpenStore(o);
  EXPECT_EQ(store->Info("run-r1")->damage(), "");  // sizes match; not hashed
  auto read = Read(store.get(), "run-r1", 0);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
  EXPECT_THAT(store->Info("run-r1")->damage(), HasSubstr("fc1.weight"));
  EXPECT_TRUE(absl::IsDataLoss(store->ReadLayer("run-r1", 1, 0, 0).status()));
}

TEST_F(CheckpointStoreTest, MissingOrTruncatedBlobIsDamageEvenWithoutVerification) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  }
  std::filesystem::remove(BlobPath(Sha256Hex(layers_[2].data(), layers_[2].bytes())));
  std::filesystem::resize_file(BlobPath(Sha256Hex(layers_[1].data(), layers_[1].bytes())), 10);
  StoreOptions o = Options();
  o.verify_on_start = false;
  auto store = OpenStore(o);
  const std::string damage = store->Info("run-r1")->damage();
  EXPECT_THAT(damage, HasSubstr("fc1.bias"));
  EXPECT_THAT(damage, HasSubstr("and 1 more"));
  EXPECT_TRUE(absl::IsDataLoss(store->ReadLayer("run-r1", 0, 0, 0).status()));
  // Deleting a damaged checkpoint works and leaves no blob behind.
  ASSERT_TRUE(store->Delete("run-r1").ok());
  EXPECT_EQ(CountBlobs(data_dir()), 0u);
}

TEST_F(CheckpointStoreTest, FullDiskIsResourceExhaustedAndCommitsNothing) {
  std::atomic<int> fail_after{-1};  // writes allowed before failing; -1 = never fail
  StoreOptions o = Options();
  o.write_fault = [&](size_t) {
    if (fail_after.load() < 0) return 0;
    if (fail_after.load() == 0) return ENOSPC;
    --fail_after;
    return 0;
  };
  auto store = OpenStore(o);

  // The first layer write fails.
  fail_after = 0;
  auto info = Upload(store.get(), MakeManifest("run", 1, layers_), layers_);
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("No space left"));
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(CountEntries(data_dir() + "/tmp"), 0u);

  // Every layer is written, the manifest's write fails: the blobs already
  // moved into place are taken back.
  int layer_writes = 0;
  for (const auto& l : layers_) layer_writes += static_cast<int>((l.bytes() + 999) / 1000);
  fail_after = layer_writes;
  info = Upload(store.get(), MakeManifest("run", 1, layers_), layers_);
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(info.status())) << info.status();
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(CountEntries(data_dir() + "/tmp"), 0u);
  EXPECT_EQ(CountBlobs(data_dir()), 0u);

  // Space again: the store works.
  fail_after = -1;
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  EXPECT_EQ(store->List().size(), 1u);
}

TEST_F(CheckpointStoreTest, EmptyLayersNeedNoChunks) {
  auto store = OpenStore();
  std::vector<TestLayer> l = {MakeLayer("empty", {0, 4}, 0), MakeLayer("w", {10}, 1),
                              MakeLayer("empty2", {0}, 0)};
  auto info = Upload(store.get(), MakeManifest("run", 1, l), l);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(*Read(store.get(), "run-r1", 0), "");
  EXPECT_EQ(*Read(store.get(), "run-r1", 1), l[1].str());
  EXPECT_EQ(*Read(store.get(), "run-r1", 2), "");
}

TEST_F(CheckpointStoreTest, ReaderSurvivesAConcurrentDelete) {
  auto store = OpenStore();
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  auto reader = store->ReadLayer("run-r1", 0, 0, 0);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(store->Delete("run-r1").ok());
  std::string all, piece;
  while ((*reader)->remaining() > 0) {
    ASSERT_TRUE((*reader)->Next(4096, &piece).ok());
    all += piece;
  }
  EXPECT_TRUE((*reader)->Finish().ok());
  EXPECT_EQ(all, layers_[0].str());
}

TEST(CheckpointIdTest, OnlySafeFileNamesAreIds) {
  for (const std::string id : {"run-r1", "fmnist-1-r30", "a.b_c-r0", "nope", "R_1.2-x"}) {
    EXPECT_TRUE(ValidateCheckpointId(id).ok()) << id;
  }
  EXPECT_TRUE(ValidateCheckpointId(std::string(kMaxCheckpointIdLength, 'x')).ok());
  // The longest run id with the largest round is still a valid id.
  EXPECT_TRUE(
      ValidateCheckpointId(CheckpointId(std::string(kMaxRunIdLength, 'r'), ~uint64_t{0})).ok());
  for (const std::string& id :
       {std::string(), std::string(".."), std::string("."), std::string("../x"), std::string("a/b"),
        std::string("/abs"), std::string(".hidden"), std::string("a..b"), std::string("a\\b"),
        std::string("a b"), std::string("a\nb"), std::string("x\0y", 3), std::string("caf\xc3\xa9"),
        std::string(kMaxCheckpointIdLength + 1, 'x')}) {
    const absl::Status s = ValidateCheckpointId(id);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << id << ": " << s;
  }
  // Run ids follow the same rules (a run id with ".." would make ids the
  // store then refuses).
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateRunId("a..b")));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateRunId(std::string(kMaxRunIdLength + 1, 'r'))));
  EXPECT_TRUE(ValidateRunId(std::string(kMaxRunIdLength, 'r')).ok());
}

TEST_F(CheckpointStoreTest, HostileIdsAreRefusedBeforeAnyLookup) {
  auto store = OpenStore();
  ASSERT_TRUE(Upload(store.get(), MakeManifest("run", 1, layers_), layers_).ok());
  for (const std::string& id : {std::string("../manifests/run-r1"), std::string("run-r1/"),
                                std::string(".."), std::string(4096, 'a')}) {
    EXPECT_TRUE(absl::IsInvalidArgument(store->GetManifest(id).status())) << id;
    EXPECT_TRUE(absl::IsInvalidArgument(store->Info(id).status())) << id;
    EXPECT_TRUE(absl::IsInvalidArgument(store->ReadLayer(id, 0, 0, 0).status())) << id;
    EXPECT_TRUE(absl::IsInvalidArgument(store->Delete(id))) << id;
  }
  // The message quotes a hostile id escaped and shortened.
  const absl::Status s = store->GetManifest(std::string(300, 'a') + "\n").status();
  EXPECT_LT(s.message().size(), 200u) << s;
  EXPECT_EQ(store->size(), 1u);
  EXPECT_TRUE(store->GetManifest("run-r1").ok());
}

}  // namespace
}  // namespace shoal::checkpoint
