// Joins per address (services/coordinator/core/join_limiter.h).
#include "services/coordinator/core/join_limiter.h"

#include <gtest/gtest.h>

#include "common/clock.h"

namespace shoal::coordinator {
namespace {

TEST(JoinLimiterTest, ABurstThenOneJoinPerPeriodPerHost) {
  FakeClock clock;
  JoinLimiter limiter(/*per_minute=*/3, &clock);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("10.0.0.1").ok()) << i;
  const absl::Status refused = limiter.Admit("10.0.0.1");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("retry in 20 s"), std::string::npos) << refused;
  // Another address is not affected.
  EXPECT_TRUE(limiter.Admit("10.0.0.2").ok());
  // One join comes back every 20 s (60 s / 3).
  clock.Advance(absl::Seconds(19));
  EXPECT_FALSE(limiter.Admit("10.0.0.1").ok());
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(limiter.Admit("10.0.0.1").ok());
  EXPECT_FALSE(limiter.Admit("10.0.0.1").ok());
  // A long pause refills the burst, no more.
  clock.Advance(absl::Hours(1));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("10.0.0.1").ok()) << i;
  EXPECT_FALSE(limiter.Admit("10.0.0.1").ok());
}

// Found by the join_limiter fuzz target (corpus crash-clock-set-back): the
// wall clock set back drained the buckets (negative elapsed time), so a host
// was told to wait longer than a full refill, an hour for a clock set back
// an hour.
TEST(JoinLimiterTest, AClockSetBackNeitherDrainsNorRefills) {
  FakeClock clock;
  JoinLimiter limiter(/*per_minute=*/1, &clock);
  EXPECT_TRUE(limiter.Admit("10.0.0.1").ok());
  clock.Advance(-absl::Hours(1));
  const absl::Status refused = limiter.Admit("10.0.0.1");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("retry in 60 s"), std::string::npos) << refused;
  clock.Advance(absl::Seconds(60));
  EXPECT_TRUE(limiter.Admit("10.0.0.1").ok());
}

TEST(JoinLimiterTest, ZeroMeansNoLimit) {
  FakeClock clock;
  JoinLimiter limiter(0, &clock);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(limiter.Admit("10.0.0.1").ok());
}

}  // namespace
}  // namespace shoal::coordinator
