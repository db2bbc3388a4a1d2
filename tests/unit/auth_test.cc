// Run and admin tokens (common/auth.h): what a token file may hold and what
// a TokenGate lets in.
#include "common/auth.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "tests/support/test_support.h"

namespace shoal {
namespace {

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

constexpr char kRun[] = "run-token-0123456789";
constexpr char kAdmin[] = "admin-token-0123456789";

Metadata Bearer(const std::string& header) { return {{kAuthMetadataKey, header}}; }

TEST(TokenTest, ValidTokensArePrintableAsciiOfBoundedLength) {
  EXPECT_TRUE(ValidateToken(kRun).ok());
  EXPECT_EQ(ValidateToken("short").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateToken(std::string(kMaxTokenLength + 1, 'a')).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status space = ValidateToken("0123456789 abcdefgh");
  EXPECT_EQ(space.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(space.message().find("position 10"), std::string::npos) << space;
  // The error never echoes the secret.
  EXPECT_EQ(space.message().find("abcdefgh"), std::string::npos) << space;
  EXPECT_FALSE(ValidateToken("0123456789abcdef\xc3\xa9").ok());
}

TEST(TokenTest, ATokenFileLosesItsSurroundingWhitespace) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/t";
  std::ofstream(path) << "  " << kRun << "\n\n";
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kRun);

  EXPECT_EQ(ReadTokenFile(dir.path() + "/missing").status().code(), absl::StatusCode::kNotFound);
  std::ofstream(path, std::ios::trunc) << "two words-0123456789\n";
  const absl::Status bad = ReadTokenFile(path).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(path), std::string::npos) << bad;
}

TEST(TokenGateTest, AnOpenGateLetsEveryoneIn) {
  TokenGate open;
  EXPECT_TRUE(open.open());
  EXPECT_TRUE(open.Check(Metadata{}, Access::kAdmin).ok());
}

TEST(TokenGateTest, TheRunTokenIsAMemberAndOnlyTheAdminTokenDeletes) {
  TokenGate gate(kRun, kAdmin);
  const std::string run = std::string(kBearerPrefix) + kRun;
  const std::string admin = std::string(kBearerPrefix) + kAdmin;
  EXPECT_TRUE(gate.Check(Bearer(run), Access::kMember).ok());
  EXPECT_EQ(gate.Check(Bearer(run), Access::kAdmin).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(gate.Check(Bearer(admin), Access::kMember).ok());
  EXPECT_TRUE(gate.Check(Bearer(admin), Access::kAdmin).ok());
}

TEST(TokenGateTest, MissingMalformedAndUnknownTokensAreUnauthenticated) {
  TokenGate gate(kRun, "");
  EXPECT_EQ(gate.Check(Metadata{}, Access::kMember).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(gate.Check(Bearer(kRun), Access::kMember).code(),  // no "Bearer "
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(gate.Check(Bearer(std::string(kBearerPrefix) + kRun + "x"), Access::kMember).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(gate.Check(Bearer(std::string(kBearerPrefix) + kAdmin), Access::kMember).code(),
            absl::StatusCode::kUnauthenticated);
  // No admin token configured: nobody deletes.
  EXPECT_EQ(gate.Check(Bearer(std::string(kBearerPrefix) + kRun), Access::kAdmin).code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace shoal
