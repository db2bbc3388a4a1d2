// Unit tests of the coordinator's durable run record (temp file + rename).
#include "services/coordinator/core/run_record.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace shoal::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

shoal::v1::RunRecord MakeRecord(uint64_t round, const std::string& hash) {
  shoal::v1::RunRecord r;
  r.set_run_id("run-abc");
  r.mutable_config()->mutable_model()->set_name("mlp");
  r.mutable_config()->mutable_sync()->set_min_participants(2);
  r.set_last_completed_round(round);
  r.set_model_hash(hash);
  r.set_next_worker_number(4);
  r.set_checkpoint_id("ckpt-1");
  r.set_updated_unix_ms(1'700'000'000'000);
  return r;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// File names in `dir`, sorted.
std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(RunRecordStoreTest, LoadOnEmptyDirIsNullopt) {
  testing::TempDir tmp;
  RunRecordStore store(tmp.path());
  ASSERT_TRUE(store.Open().ok());
  EXPECT_TRUE(store.enabled());
  EXPECT_EQ(store.path(), tmp.path() + "/run_record.pb");
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->has_value());
}

TEST(RunRecordStoreTest, OpenCreatesMissingDirectories) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/a/b/state";
  RunRecordStore store(dir);
  ASSERT_TRUE(store.Open().ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  ASSERT_TRUE(store.Save(MakeRecord(1, "h")).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/run_record.pb"));
}

TEST(RunRecordStoreTest, SaveThenLoadRoundTrips) {
  testing::TempDir tmp;
  RunRecordStore store(tmp.path());
  ASSERT_TRUE(store.Open().ok());
  shoal::v1::RunRecord record = MakeRecord(7, std::string(64, 'c'));
  record.set_finished(true);
  ASSERT_TRUE(store.Save(record).ok());

  absl::StatusOr<std::optional<shoal::v1::RunRecord>> loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  const shoal::v1::RunRecord& r = **loaded;
  EXPECT_EQ(r.run_id(), "run-abc");
  EXPECT_EQ(r.config().model().name(), "mlp");
  EXPECT_EQ(r.config().sync().min_participants(), 2u);
  EXPECT_EQ(r.last_completed_round(), 7u);
  EXPECT_EQ(r.model_hash(), std::string(64, 'c'));
  EXPECT_EQ(r.next_worker_number(), 4u);
  EXPECT_EQ(r.checkpoint_id(), "ckpt-1");
  EXPECT_EQ(r.updated_unix_ms(), 1'700'000'000'000);
  EXPECT_TRUE(r.finished());
  EXPECT_EQ(r.SerializeAsString(), record.SerializeAsString());

  // A second store on the same directory (a restarted coordinator) reads it.
  RunRecordStore again(tmp.path());
  ASSERT_TRUE(again.Open().ok());
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> reloaded = again.Load();
  ASSERT_TRUE(reloaded.ok() && reloaded->has_value());
  EXPECT_EQ((*reloaded)->last_completed_round(), 7u);
}

TEST(RunRecordStoreTest, SaveTwiceKeepsNewestAndLeavesNoTempFile) {
  testing::TempDir tmp;
  RunRecordStore store(tmp.path());
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(store.Save(MakeRecord(1, "first")).ok());
  ASSERT_TRUE(store.Save(MakeRecord(2, "second")).ok());

  absl::StatusOr<std::optional<shoal::v1::RunRecord>> loaded = store.Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->last_completed_round(), 2u);
  EXPECT_EQ((*loaded)->model_hash(), "second");
  EXPECT_THAT(Files(tmp.path()), ElementsAre("run_record.pb"));
}

TEST(RunRecordStoreTest, CorruptedRecordIsDataLoss) {
  testing::TempDir tmp;
  RunRecordStore store(tmp.path());
  ASSERT_TRUE(store.Open().ok());
  // A truncated varint: not a parsable message.
  WriteAll(store.path(), std::string("\xff\xff\xff\xff", 4));
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> loaded = store.Load();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr("run_record.pb"));

  // A parsable message without a run id is not a record either.
  WriteAll(store.path(), "");
  EXPECT_EQ(store.Load().status().code(), absl::StatusCode::kDataLoss);

  // Saving a good record repairs it.
  ASSERT_TRUE(store.Save(MakeRecord(3, "h")).ok());
  loaded = store.Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->last_completed_round(), 3u);
}

TEST(RunRecordStoreTest, RoundNumbersWithoutRoomToCountUpAreDataLoss) {
  testing::TempDir tmp;
  RunRecordStore store(tmp.path());
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(store.Save(MakeRecord(~uint64_t{0}, "h")).ok());
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> loaded = store.Load();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr("largest round"));
  ASSERT_TRUE(store.Save(MakeRecord(uint64_t{1} << 40, "h")).ok());
  EXPECT_TRUE(store.Load().ok());
}

TEST(RunRecordStoreTest, OpenUnderRegularFileIsFailedPrecondition) {
  testing::TempDir tmp;
  const std::string file = tmp.path() + "/not-a-dir";
  WriteAll(file, "x");
  RunRecordStore store(file + "/state");
  const absl::Status s = store.Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(file));
  // Saving there fails too (no crash, an error).
  EXPECT_FALSE(store.Save(MakeRecord(1, "h")).ok());
}

TEST(RunRecordStoreTest, DisabledStoreIsANoOp) {
  RunRecordStore store("");
  EXPECT_FALSE(store.enabled());
  EXPECT_TRUE(store.Open().ok());
  EXPECT_TRUE(store.Save(MakeRecord(1, "h")).ok());
  absl::StatusOr<std::optional<shoal::v1::RunRecord>> loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->has_value());
}

TEST(WriteFileAtomicallyTest, CreatesAndReplacesContent) {
  testing::TempDir tmp;
  const std::string path = tmp.path() + "/data.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "first version, longer").ok());
  EXPECT_EQ(ReadAll(path), "first version, longer");
  ASSERT_TRUE(WriteFileAtomically(path, std::string("two\0bytes", 9)).ok());
  EXPECT_EQ(ReadAll(path), std::string("two\0bytes", 9));
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_EQ(ReadAll(path), "");
  EXPECT_THAT(Files(tmp.path()), ElementsAre("data.bin"));
}

TEST(WriteFileAtomicallyTest, MissingDirectoryIsAnError) {
  testing::TempDir tmp;
  const absl::Status s = WriteFileAtomically(tmp.path() + "/missing/data.bin", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

}  // namespace
}  // namespace shoal::coordinator
