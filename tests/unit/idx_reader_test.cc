// Unit tests of the IDX reader: header parsing, gzip and plain files, and
// loading a Fashion-MNIST directory (synthetic files; the real dataset when
// it is installed).
#include "services/worker/core/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace shoal::worker {
namespace {

using ::testing::HasSubstr;

void AppendBigEndian32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v >> 24));
  out->push_back(static_cast<char>(v >> 16));
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}

// An IDX buffer: magic 00 00 <type> <ndims>, big-endian dims, then `data`.
std::string MakeIdx(const std::vector<uint32_t>& dims, const std::string& data,
                    uint8_t type = 0x08) {
  std::string out;
  out.push_back(0);
  out.push_back(0);
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(dims.size()));
  for (uint32_t d : dims) AppendBigEndian32(&out, d);
  out += data;
  return out;
}

std::string Bytes(size_t n, uint8_t seed = 1) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 37 + seed) & 0xFF);
  return s;
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

void WritePlain(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Images whose first pixel encodes the index; labels = index % 10.
std::string ImagesIdx(uint32_t count, uint32_t rows = 28, uint32_t cols = 28) {
  std::string data(size_t{count} * rows * cols, '\0');
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t p = 0; p < rows * cols; ++p) {
      data[size_t{i} * rows * cols + p] = static_cast<char>((i * 7 + p) & 0xFF);
    }
  }
  return MakeIdx({count, rows, cols}, data);
}

std::string LabelsIdx(uint32_t count, uint8_t bad_label_at = 0xFF) {
  std::string data(count, '\0');
  for (uint32_t i = 0; i < count; ++i) data[i] = static_cast<char>(i % 10);
  if (bad_label_at < count) data[bad_label_at] = 10;
  return MakeIdx({count}, data);
}

void WriteDataset(const std::string& dir, uint32_t train_images, uint32_t train_labels,
                  uint32_t test_images, uint32_t test_labels, uint8_t bad_train_label = 0xFF) {
  WriteGzip(dir + "/train-images-idx3-ubyte.gz", ImagesIdx(train_images));
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz", LabelsIdx(train_labels, bad_train_label));
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz", ImagesIdx(test_images));
  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", LabelsIdx(test_labels));
}

// ---------------------------------------------------------------- ParseIdx

TEST(ParseIdxTest, ParsesThreeDimensionalUnsignedBytes) {
  const std::string data = Bytes(2 * 3 * 4);
  absl::StatusOr<IdxArray> a = ParseIdx(MakeIdx({2, 3, 4}, data), "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<uint32_t>{2, 3, 4}));
  ASSERT_EQ(a->data.size(), data.size());
  EXPECT_EQ(std::string(a->data.begin(), a->data.end()), data);
}

TEST(ParseIdxTest, ParsesBigEndianDims) {
  // 0x00000102 = 258 elements: a little-endian reader would see 0x02010000.
  absl::StatusOr<IdxArray> a = ParseIdx(MakeIdx({258}, Bytes(258)), "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<uint32_t>{258}));
}

TEST(ParseIdxTest, RejectsBadMagic) {
  std::string bytes = MakeIdx({4}, Bytes(4));
  bytes[0] = 1;
  absl::StatusOr<IdxArray> a = ParseIdx(bytes, "file.idx");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("file.idx"));

  bytes = MakeIdx({4}, Bytes(4));
  bytes[1] = 8;
  EXPECT_EQ(ParseIdx(bytes, "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseIdx("", "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseIdx(std::string("\0\0", 2), "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParseIdxTest, RejectsNonUnsignedByteType) {
  // 0x0D = float32.
  absl::StatusOr<IdxArray> a = ParseIdx(MakeIdx({2}, Bytes(8), 0x0D), "x");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("unsigned byte"));
  // 0x09 = signed byte, same size per element.
  EXPECT_EQ(ParseIdx(MakeIdx({2}, Bytes(2), 0x09), "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParseIdxTest, RejectsDataSizeMismatch) {
  EXPECT_EQ(ParseIdx(MakeIdx({2, 3, 4}, Bytes(23)), "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseIdx(MakeIdx({2, 3, 4}, Bytes(25)), "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseIdx(MakeIdx({5}, ""), "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseIdxTest, RejectsTruncatedHeader) {
  // Says 3 dims but holds only one and a half.
  const std::string full = MakeIdx({2, 3, 4}, Bytes(24));
  for (size_t len : {4u, 5u, 8u, 10u, 15u}) {
    EXPECT_EQ(ParseIdx(full.substr(0, len), "x").status().code(),
              absl::StatusCode::kInvalidArgument)
        << "length " << len;
  }
  // Zero dimensions is not a valid header either.
  EXPECT_EQ(ParseIdx(MakeIdx({}, ""), "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseIdxTest, AcceptsEmptyArray) {
  absl::StatusOr<IdxArray> a = ParseIdx(MakeIdx({0, 28, 28}, ""), "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims[0], 0u);
  EXPECT_TRUE(a->data.empty());
}

// ---------------------------------------------------------------- ReadIdxFile

TEST(ReadIdxFileTest, ReadsGzipFile) {
  shoal::testing::TempDir dir;
  const std::string data = Bytes(3 * 28 * 28, 9);
  const std::string path = dir.path() + "/images.gz";
  WriteGzip(path, MakeIdx({3, 28, 28}, data));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<uint32_t>{3, 28, 28}));
  EXPECT_EQ(std::string(a->data.begin(), a->data.end()), data);
}

TEST(ReadIdxFileTest, ReadsLargeGzipFileAcrossBufferBoundaries) {
  shoal::testing::TempDir dir;
  const std::string data = Bytes(200 * 1000 + 3, 5);  // more than the 64 KiB read buffer
  const std::string path = dir.path() + "/big.gz";
  WriteGzip(path, MakeIdx({200 * 1000 + 3}, data));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(std::string(a->data.begin(), a->data.end()), data);
}

TEST(ReadIdxFileTest, ReadsPlainFile) {
  shoal::testing::TempDir dir;
  const std::string data = Bytes(10, 3);
  const std::string path = dir.path() + "/labels";
  WritePlain(path, MakeIdx({10}, data));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, (std::vector<uint32_t>{10}));
  EXPECT_EQ(std::string(a->data.begin(), a->data.end()), data);
}

TEST(ReadIdxFileTest, MissingFileIsNotFound) {
  shoal::testing::TempDir dir;
  const std::string path = dir.path() + "/nope.gz";
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(a.status().message(), HasSubstr(path));
}

TEST(ReadIdxFileTest, BadContentIsInvalidArgumentNamingThePath) {
  shoal::testing::TempDir dir;
  const std::string path = dir.path() + "/bad.gz";
  WriteGzip(path, MakeIdx({2, 2}, Bytes(3)));
  absl::StatusOr<IdxArray> a = ReadIdxFile(path);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr(path));
}

// ---------------------------------------------------------------- LoadFashionMnist

TEST(LoadFashionMnistTest, MissingDirectoryIsNotFoundAndNamesThePackage) {
  shoal::testing::TempDir dir;
  const std::string missing = dir.path() + "/no-such-dir";
  absl::StatusOr<FashionMnist> d = LoadFashionMnist(missing);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(d.status().message(), HasSubstr(missing));
  EXPECT_THAT(d.status().message(), HasSubstr("dataset-fashion-mnist"));
}

TEST(LoadFashionMnistTest, DirectoryWithoutFilesIsNotFoundNamingDirAndFile) {
  shoal::testing::TempDir dir;
  absl::StatusOr<FashionMnist> d = LoadFashionMnist(dir.path());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(d.status().message(), HasSubstr(dir.path()));
  EXPECT_THAT(d.status().message(), HasSubstr("train-images-idx3-ubyte.gz"));
}

TEST(LoadFashionMnistTest, LoadsSyntheticFiles) {
  shoal::testing::TempDir dir;
  WriteDataset(dir.path(), 10, 10, 5, 5);
  absl::StatusOr<FashionMnist> d = LoadFashionMnist(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.count, 10u);
  EXPECT_EQ(d->train.rows, 28u);
  EXPECT_EQ(d->train.cols, 28u);
  EXPECT_EQ(d->train.pixels.size(), 10u * 28 * 28);
  EXPECT_EQ(d->train.labels, (std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(d->test.count, 5u);
  EXPECT_EQ(d->test.pixels.size(), 5u * 28 * 28);
  EXPECT_EQ(d->test.labels, (std::vector<uint8_t>{0, 1, 2, 3, 4}));
  // Image i's pixel p is (7i + p) & 0xFF.
  EXPECT_EQ(d->train.pixels[3 * 28 * 28 + 5], (3 * 7 + 5) & 0xFF);
  EXPECT_EQ(d->test.pixels[4 * 28 * 28 + 100], (4 * 7 + 100) & 0xFF);
}

TEST(LoadFashionMnistTest, CountMismatchIsInvalidArgument) {
  shoal::testing::TempDir dir;
  WriteDataset(dir.path(), 10, 9, 5, 5);
  absl::StatusOr<FashionMnist> d = LoadFashionMnist(dir.path());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr(dir.path()));

  shoal::testing::TempDir dir2;
  WriteDataset(dir2.path(), 10, 10, 5, 6);
  EXPECT_EQ(LoadFashionMnist(dir2.path()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadFashionMnistTest, LabelAboveNineIsInvalidArgument) {
  shoal::testing::TempDir dir;
  WriteDataset(dir.path(), 10, 10, 5, 5, /*bad_train_label=*/7);
  absl::StatusOr<FashionMnist> d = LoadFashionMnist(dir.path());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("label"));
}

TEST(LoadFashionMnistTest, WrongDimensionalityIsInvalidArgument) {
  shoal::testing::TempDir dir;
  WriteDataset(dir.path(), 10, 10, 5, 5);
  // Labels given as a 2-dim array.
  WriteGzip(dir.path() + "/train-labels-idx1-ubyte.gz", MakeIdx({10, 1}, Bytes(10)));
  EXPECT_EQ(LoadFashionMnist(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadFashionMnistTest, RealDatasetWhenInstalled) {
  const std::string dir = shoal::testing::DataDir();
  struct stat st;
  if (stat((dir + "/train-images-idx3-ubyte.gz").c_str(), &st) != 0) {
    GTEST_SKIP() << "Fashion-MNIST not installed at " << dir;
  }
  absl::StatusOr<FashionMnist> d = LoadFashionMnist(dir);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.count, 60000u);
  EXPECT_EQ(d->test.count, 10000u);
  EXPECT_EQ(d->train.rows, 28u);
  EXPECT_EQ(d->train.cols, 28u);
  EXPECT_EQ(d->test.rows, 28u);
  EXPECT_EQ(d->test.cols, 28u);
  EXPECT_EQ(d->train.pixels.size(), 60000u * 28 * 28);
  EXPECT_EQ(d->test.pixels.size(), 10000u * 28 * 28);
  EXPECT_EQ(d->train.labels.size(), 60000u);
  EXPECT_EQ(d->test.labels.size(), 10000u);
  // Balanced classes: 6000 / 1000 of each.
  std::vector<int> train_counts(10), test_counts(10);
  for (uint8_t l : d->train.labels) ++train_counts[l];
  for (uint8_t l : d->test.labels) ++test_counts[l];
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(train_counts[c], 6000) << "class " << c;
    EXPECT_EQ(test_counts[c], 1000) << "class " << c;
  }
}

}  // namespace
}  // namespace shoal::worker
