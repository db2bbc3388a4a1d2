// Unit tests of --dataset (services/worker/core/dataset): IDX quadruples
// (plain or gzip) and .npy files written here, and each check's message.
#include "services/worker/core/dataset.h"

#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace shoal::worker {
namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string BigEndian(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string Idx(const std::vector<uint32_t>& dims, uint8_t fill) {
  std::string out("\0\0\x08", 3);
  out.push_back(static_cast<char>(dims.size()));
  size_t n = 1;
  for (uint32_t d : dims) out += BigEndian(d), n *= d;
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((fill + i) % 10));
  return out;
}

std::string Npy(const std::string& descr, const std::string& shape, const std::string& data,
                const std::string& order = "False") {
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': ", order,
                                    ", 'shape': ", shape, ", }");
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xFF));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header + data;
}

std::string Gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
  return path;
}

TEST(DatasetTest, IdxQuadruplePlainOrGzipOfAnySize) {
  testing::TempDir dir;
  Write(dir.path() + "/train-images-idx3-ubyte", Idx({5, 8, 6}, 0));
  Gzip(dir.path() + "/train-labels-idx1-ubyte.gz", Idx({5}, 3));
  Write(dir.path() + "/t10k-images-idx3-ubyte", Idx({2, 8, 6}, 0));
  Write(dir.path() + "/t10k-labels-idx1-ubyte", Idx({2}, 0));
  auto d = LoadDataset("idx:" + dir.path(), "");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.count, 5u);
  EXPECT_EQ(d->train.rows, 8u);
  EXPECT_EQ(d->train.cols, 6u);
  EXPECT_EQ(d->test.count, 2u);
  EXPECT_EQ(d->train.labels[0], 3);
  EXPECT_EQ(MaxLabel(*d), 7);

  // Test images of another size.
  Write(dir.path() + "/t10k-images-idx3-ubyte", Idx({2, 8, 7}, 0));
  auto other = LoadDataset("idx:" + dir.path(), "");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(other.status().message(), "test images are 8 x 7"))
      << other.status();
  // Fewer labels than images.
  Write(dir.path() + "/t10k-images-idx3-ubyte", Idx({3, 8, 6}, 0));
  auto count = LoadDataset("idx:" + dir.path(), "");
  EXPECT_TRUE(absl::StrContains(count.status().message(), "has 3 images but")) << count.status();
  // A missing file is named.
  std::remove((dir.path() + "/t10k-labels-idx1-ubyte").c_str());
  auto missing = LoadDataset("idx:" + dir.path(), "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "t10k-labels-idx1-ubyte"))
      << missing.status();
}

TEST(DatasetTest, NpyFilesWithUint8ImagesAndIntegerLabels) {
  testing::TempDir dir;
  Write(dir.path() + "/train_images.npy", Npy("|u1", "(3, 4, 4)", std::string(48, '\x10')));
  std::string labels64;
  for (int64_t v : {0, 9, 4}) labels64.append(reinterpret_cast<const char*>(&v), 8);
  Write(dir.path() + "/train_labels.npy", Npy("<i8", "(3,)", labels64));
  Write(dir.path() + "/test_images.npy", Npy("|u1", "(1, 4, 4)", std::string(16, '\x20')));
  Write(dir.path() + "/test_labels.npy", Npy("|u1", "(1,)", std::string(1, '\x02')));
  auto d = LoadDataset("npy:" + dir.path(), "");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.count, 3u);
  EXPECT_EQ(d->train.rows, 4u);
  EXPECT_EQ(d->train.labels, (std::vector<uint8_t>{0, 9, 4}));
  EXPECT_EQ(d->test.pixels[0], 0x20);
  EXPECT_EQ(MaxLabel(*d), 9);

  struct Case {
    std::string file, bytes, message;
  };
  std::string negative = labels64;
  const int64_t minus = -1;
  negative.replace(8, 8, reinterpret_cast<const char*>(&minus), 8);
  const std::vector<Case> cases = {
      {"train_images.npy", Npy("<f4", "(3, 4, 4)", std::string(192, '\0')), "images must be uint8"},
      {"train_images.npy", Npy("|u1", "(3, 16)", std::string(48, '\0')), "must have 3 dimensions"},
      {"train_images.npy", Npy("|u1", "(3, 4, 4)", std::string(40, '\0')),
       "the header says 48 elements"},
      {"train_images.npy", Npy("|u1", "(3, 4, 4)", std::string(48, '\0'), "True"), "Fortran order"},
      {"train_images.npy", "not numpy at all", "bad magic"},
      {"train_labels.npy", Npy("<i8", "(3,)", negative), "label < 0 at index 1"},
      {"train_labels.npy", Npy("<f8", "(3,)", std::string(24, '\0')), "labels must be integers"},
      {"train_labels.npy", Npy("<i8", "(2,)", labels64.substr(0, 16)), "has 3 images but"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    testing::TempDir bad;
    for (const char* f :
         {"train_images.npy", "train_labels.npy", "test_images.npy", "test_labels.npy"}) {
      std::ifstream in(dir.path() + "/" + f, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      Write(bad.path() + "/" + f, f == c.file ? c.bytes : bytes);
    }
    auto r = LoadDataset("npy:" + bad.path(), "");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.message)) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.file)) << r.status();
  }
}

TEST(DatasetTest, UnknownSpecsAreRefused) {
  auto r = LoadDataset("cifar10", "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "fashion-mnist, idx:DIR or npy:DIR"));
}

}  // namespace
}  // namespace shoal::worker
