// Unit tests of the model-file transfer (common/model_file): serving pieces
// and fetching from sources in order, with the digest check.
#include "common/model_file.h"

#include <string>
#include <vector>

#include "common/sha256.h"
#include "gtest/gtest.h"

namespace shoal {
namespace {

std::string Bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xFF);
  return s;
}

shoal::v1::GetModelFileRequest Req(const std::string& sha, uint64_t offset, uint32_t max = 0) {
  shoal::v1::GetModelFileRequest r;
  r.set_sha256(sha);
  r.set_offset(offset);
  r.set_max_bytes(max);
  return r;
}

// A source answering from `bytes` (digest `sha`), counting its calls.
ModelFileSource Serving(const std::string& name, const std::string& bytes, const std::string& sha,
                        int* calls) {
  return {name, [bytes, sha, calls](const shoal::v1::GetModelFileRequest& r) {
            ++*calls;
            return ServeModelFilePiece(bytes, sha, r);
          }};
}

TEST(ModelFileTest, ServesPiecesOfAtMostOneMiB) {
  const std::string file = Bytes(kModelFilePieceBytes + 10);
  const std::string sha = Sha256Hex(file.data(), file.size());
  auto first = ServeModelFilePiece(file, sha, Req(sha, 0));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->data().size(), kModelFilePieceBytes);
  EXPECT_EQ(first->total_bytes(), file.size());
  auto last = ServeModelFilePiece(file, sha, Req(sha, kModelFilePieceBytes, 4096));
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->data(), file.substr(kModelFilePieceBytes));
  auto small = ServeModelFilePiece(file, sha, Req(sha, 5, 3));
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->data(), file.substr(5, 3));
  auto end = ServeModelFilePiece(file, sha, Req(sha, file.size()));
  ASSERT_TRUE(end.ok());
  EXPECT_TRUE(end->data().empty());
}

TEST(ModelFileTest, RefusesOtherDigestsOffsetsAndRunsWithoutFile) {
  const std::string file = Bytes(100);
  const std::string sha = Sha256Hex(file.data(), file.size());
  EXPECT_EQ(ServeModelFilePiece(file, sha, Req(std::string(64, 'a'), 0)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ServeModelFilePiece(file, sha, Req(sha, 101)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ServeModelFilePiece("", "", Req(sha, 0)).status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelFileTest, FetchesFromTheFirstSourceThatHasIt) {
  const std::string file = Bytes(2 * kModelFilePieceBytes + 77);
  const std::string sha = Sha256Hex(file.data(), file.size());
  int missing_calls = 0, good_calls = 0, coordinator_calls = 0;
  std::vector<ModelFileSource> sources = {
      Serving("peer a", "", "", &missing_calls),  // has not fetched it yet
      Serving("peer b", file, sha, &good_calls),
      Serving("coordinator", file, sha, &coordinator_calls),
  };
  std::vector<uint64_t> progress;
  auto got = FetchModelFile(
      sources, sha, file.size(),
      [&](uint64_t done, uint64_t, const std::string&) { progress.push_back(done); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, file);
  EXPECT_EQ(got->source, "peer b");
  EXPECT_EQ(missing_calls, 1);
  EXPECT_EQ(good_calls, 3);
  EXPECT_EQ(coordinator_calls, 0);  // the coordinator is the last resort
  ASSERT_EQ(progress.size(), 3u);
  EXPECT_EQ(progress.back(), file.size());
}

TEST(ModelFileTest, ASourceWithOtherBytesIsDroppedForTheNext) {
  const std::string file = Bytes(1000);
  const std::string sha = Sha256Hex(file.data(), file.size());
  std::string tampered = file;
  tampered[500] ^= 1;
  int bad_calls = 0, good_calls = 0;
  // The tampered peer claims the run's digest but serves other bytes.
  std::vector<ModelFileSource> sources = {Serving("peer bad", tampered, sha, &bad_calls),
                                          Serving("coordinator", file, sha, &good_calls)};
  auto got = FetchModelFile(sources, sha, file.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->source, "coordinator");
  EXPECT_EQ(bad_calls, 1);

  auto only_bad = FetchModelFile({sources[0]}, sha, file.size());
  EXPECT_EQ(only_bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(only_bad.status().message().find("peer bad"), std::string::npos) << only_bad.status();
}

TEST(ModelFileTest, InconsistentPiecesAndWrongSizesFail) {
  const std::string file = Bytes(1000);
  const std::string sha = Sha256Hex(file.data(), file.size());
  ModelFileSource wrong_offset{"peer shifted", [&](const shoal::v1::GetModelFileRequest& r) {
                                 auto p = ServeModelFilePiece(file, sha, r);
                                 if (p.ok()) p->set_offset(r.offset() + 1);
                                 return p;
                               }};
  EXPECT_EQ(FetchModelFile({wrong_offset}, sha, file.size()).status().code(),
            absl::StatusCode::kDataLoss);
  int calls = 0;
  // The run says 999 bytes; the source serves 1000.
  EXPECT_EQ(FetchModelFile({Serving("peer", file, sha, &calls)}, sha, 999).status().code(),
            absl::StatusCode::kDataLoss);
  ModelFileSource down{
      "peer down",
      [](const shoal::v1::GetModelFileRequest&) -> absl::StatusOr<shoal::v1::ModelFileChunk> {
        return absl::UnavailableError("connection refused");
      }};
  auto failed = FetchModelFile({down}, sha, file.size());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("connection refused"), std::string::npos);
  EXPECT_EQ(FetchModelFile({}, sha, 10).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace shoal
