// Replays every committed fuzz corpus file (tests/fuzz/corpus/<target>/)
// through the same decode functions the libFuzzer targets call, so the
// corpus, and every crasher fixed since, keeps being exercised by
// `make test` in the normal gcc build.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/tensor_wire.h"
#include "gtest/gtest.h"
#include "services/worker/core/manifest_cache.h"
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

}  // namespace
}  // namespace shoal
