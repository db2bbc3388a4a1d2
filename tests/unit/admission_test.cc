// Who may call the coordinator (services/coordinator/admission.h): the run
// token on every call, then a join's rate per caller host; FakeClock.
#include "services/coordinator/admission.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/clock.h"

namespace shoal::coordinator {
namespace {

constexpr char kToken[] = "admission-test-token-0123456789";

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(AdmissionTest, TheTokenComesFirstAndOnlyAdmittedJoinsAreCounted) {
  FakeClock clock;
  JoinLimiter joins(/*per_minute=*/1, &clock);
  const Admission admission(TokenGate(kToken, ""), &joins);
  const std::string bearer = absl::StrCat(kBearerPrefix, kToken);
  Metadata with_token = {{kAuthMetadataKey, bearer}};
  Metadata without;
  const std::string peer = "ipv4:10.0.0.7:5123";

  // Without the token: UNAUTHENTICATED, join or not, and nothing counted.
  EXPECT_EQ(admission.Admit(without, peer, /*join=*/true).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(admission.Admit(without, peer, /*join=*/false).code(),
            absl::StatusCode::kUnauthenticated);
  // The host's one join a minute.
  EXPECT_TRUE(admission.Admit(with_token, peer, /*join=*/true).ok());
  EXPECT_EQ(admission.Admit(with_token, "ipv4:10.0.0.7:6000", /*join=*/true).code(),
            absl::StatusCode::kResourceExhausted)
      << "the host counts, not the port";
  // Other calls of the same host, and joins of another host, go on.
  EXPECT_TRUE(admission.Admit(with_token, peer, /*join=*/false).ok());
  EXPECT_TRUE(admission.Admit(with_token, "ipv4:10.0.0.8:5123", /*join=*/true).ok());
  clock.Advance(absl::Minutes(1));
  EXPECT_TRUE(admission.Admit(with_token, peer, /*join=*/true).ok());
}

TEST(AdmissionTest, WithoutTokenOrLimitEveryCallIsAdmitted) {
  const Admission admission;
  Metadata none;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(admission.Admit(none, "ipv4:10.0.0.7:5123", /*join=*/true).ok());
  }
}

}  // namespace
}  // namespace shoal::coordinator
