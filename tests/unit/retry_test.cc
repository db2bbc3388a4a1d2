// The retry helper and the cancellation token (common/retry.h,
// common/cancellation.h). Backoffs are microseconds: no test waits long.
#include "common/retry.h"

#include <atomic>
#include <thread>

#include "common/cancellation.h"
#include "gtest/gtest.h"

namespace shoal {
namespace {

RetryPolicy Quick() {
  RetryPolicy p;
  p.initial_backoff = absl::Microseconds(10);
  p.max_backoff = absl::Microseconds(50);
  p.deadline = absl::Seconds(30);
  return p;
}

TEST(RetryTest, RetriesUnavailableUntilOk) {
  int calls = 0;
  RetryInfo info;
  absl::Status s = Retry(
      Quick(), nullptr,
      [&](absl::Duration) {
        return ++calls < 3 ? absl::UnavailableError("busy") : absl::OkStatus();
      },
      nullptr, &info);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(info.attempts, 3);
  EXPECT_TRUE(absl::IsUnavailable(info.last));
}

TEST(RetryTest, DoesNotRetryWhatIsRetryableRefuses) {
  int calls = 0;
  absl::Status s = Retry(Quick(), nullptr, [&](absl::Duration) {
    ++calls;
    return absl::InvalidArgumentError("bad range");
  });
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(calls, 1);
}

TEST(RetryTest, AlsoRetryNamesExtraCodes) {
  RetryPolicy p = Quick();
  p.also_retry = {absl::StatusCode::kNotFound};
  int calls = 0;
  absl::Status s = Retry(p, nullptr, [&](absl::Duration) {
    return ++calls < 2 ? absl::NotFoundError("unknown worker") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(ShouldRetry(p, absl::DeadlineExceededError("")));
  EXPECT_FALSE(ShouldRetry(p, absl::FailedPreconditionError("")));
  EXPECT_FALSE(ShouldRetry(p, absl::OkStatus()));
}

TEST(RetryTest, MaxAttemptsReturnsTheLastFailureAnnotated) {
  RetryPolicy p = Quick();
  p.max_attempts = 4;
  int calls = 0;
  int heard = 0;
  absl::Status s = Retry(
      p, nullptr,
      [&](absl::Duration) {
        ++calls;
        return absl::UnavailableError("peer down");
      },
      [&](const absl::Status&, int) { ++heard; });
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_NE(s.message().find("peer down"), absl::string_view::npos);
  EXPECT_NE(s.message().find("4 attempts"), absl::string_view::npos);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(heard, 3);
}

TEST(RetryTest, DeadlineFromTheInjectedClock) {
  FakeClock clock;
  RetryPolicy p = Quick();
  p.clock = &clock;
  p.deadline = absl::Seconds(10);
  int calls = 0;
  absl::Status s = Retry(p, nullptr, [&](absl::Duration left) {
    ++calls;
    EXPECT_LE(left, absl::Seconds(10));
    clock.Advance(absl::Seconds(4));  // each attempt takes 4 s
    return absl::DeadlineExceededError("slow peer");
  });
  EXPECT_EQ(calls, 3);  // at 0, 4 and 8 s; none at 12 s
  EXPECT_TRUE(absl::IsDeadlineExceeded(s));
  EXPECT_NE(s.message().find("slow peer"), absl::string_view::npos);
}

TEST(RetryTest, CancelledTokenStopsBeforeAndBetweenAttempts) {
  CancellationToken token;
  token.Cancel();
  int calls = 0;
  EXPECT_TRUE(absl::IsCancelled(Retry(Quick(), &token, [&](absl::Duration) {
    ++calls;
    return absl::OkStatus();
  })));
  EXPECT_EQ(calls, 0);

  CancellationToken token2;
  RetryPolicy p = Quick();
  p.initial_backoff = p.max_backoff = absl::Hours(1);  // only a cancel ends the pause
  std::thread canceller([&] { token2.Cancel(); });
  absl::Status s = Retry(p, &token2, [&](absl::Duration) { return absl::UnavailableError("x"); });
  canceller.join();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
}

TEST(CancellationTokenTest, CallbacksRunOnceAndWaitersWake) {
  CancellationToken token;
  int runs = 0;
  const uint64_t id = token.Register([&] { ++runs; });
  EXPECT_NE(id, 0u);
  EXPECT_FALSE(token.WaitFor(absl::Milliseconds(1)));
  std::thread t([&] { token.Cancel(); });
  EXPECT_TRUE(token.WaitFor(absl::Hours(1)));
  t.join();
  token.Cancel();
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(token.cancelled());
  // Registering on a cancelled token runs the callback at once.
  EXPECT_EQ(token.Register([&] { ++runs; }), 0u);
  EXPECT_EQ(runs, 2);
}

TEST(CancellationTokenTest, UnregisteredCallbackNeverRuns) {
  CancellationToken token;
  int runs = 0;
  token.Unregister(token.Register([&] { ++runs; }));
  {
    ScopedCancelCallback scoped(&token, [&] { ++runs; });
  }
  token.Cancel();
  EXPECT_EQ(runs, 0);
}

TEST(CancellationTokenTest, ChildFollowsItsParentNotTheOtherWay) {
  CancellationToken parent;
  {
    CancellationToken child(&parent);
    child.Cancel();
    EXPECT_FALSE(parent.cancelled());
  }
  CancellationToken child(&parent);
  std::atomic<int> runs{0};
  child.Register([&] { ++runs; });
  parent.Cancel();
  EXPECT_TRUE(child.cancelled());
  EXPECT_EQ(runs.load(), 1);
  CancellationToken late(&parent);  // a child of a cancelled parent
  EXPECT_TRUE(late.cancelled());
}

}  // namespace
}  // namespace shoal
