// The box of contributions pushed by participants behind NAT: a push is
// handed over whole once, waiters wake on arrival or cancel, old rounds and
// too many bytes are refused.
#include "services/worker/core/push_box.h"

#include <thread>

#include "gtest/gtest.h"

namespace shoal::worker {
namespace {

PushKey Key(uint64_t round, const std::string& pusher = "w3") {
  return {.round = round, .attempt = 1, .pusher = pusher, .begin = 0, .end = 4};
}

TEST(PushBoxTest, TakeGetsThePushOnceAndWaitsForIt) {
  PushBox box(1 << 20);
  std::thread pusher([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(box.Put(Key(3), "abcd").ok());
  });
  absl::StatusOr<std::string> got = box.Take(Key(3), absl::Now() + absl::Seconds(10), nullptr);
  pusher.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "abcd");
  EXPECT_EQ(box.bytes(), 0u);
  // Gone once taken: a second take times out.
  EXPECT_EQ(box.Take(Key(3), absl::Now() + absl::Milliseconds(20), nullptr).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(PushBoxTest, KeysKeepPushersRoundsAndKindsApart) {
  PushBox box(1 << 20);
  ASSERT_TRUE(box.Put(Key(3, "w3"), "three").ok());
  ASSERT_TRUE(box.Put(Key(3, "w4"), "four").ok());
  PushKey encoded = Key(3, "w3");
  encoded.encoded = true;
  EXPECT_EQ(box.Take(encoded, absl::Now() + absl::Milliseconds(20), nullptr).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*box.Take(Key(3, "w4"), absl::Now(), nullptr), "four");
  EXPECT_EQ(*box.Take(Key(3, "w3"), absl::Now(), nullptr), "three");
}

TEST(PushBoxTest, CancelEndsTheWait) {
  PushBox box(1 << 20);
  CancellationToken token;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(30));
    token.Cancel();
  });
  absl::StatusOr<std::string> got = box.Take(Key(1), absl::Now() + absl::Seconds(30), &token);
  canceller.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
}

TEST(PushBoxTest, OldRoundsAreDroppedAndRefusedAndBytesAreCapped) {
  PushBox box(10);
  ASSERT_TRUE(box.Put(Key(4), "12345").ok());
  ASSERT_TRUE(box.Put(Key(5), "12345").ok());
  EXPECT_EQ(box.Put(Key(6), "1").code(), absl::StatusCode::kResourceExhausted);
  // A retried push of the same key replaces the first (no double count).
  EXPECT_TRUE(box.Put(Key(5), "54321").ok());
  EXPECT_EQ(box.bytes(), 10u);
  box.DropBefore(5);
  EXPECT_EQ(box.bytes(), 5u);
  EXPECT_EQ(box.Put(Key(4), "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*box.Take(Key(5), absl::Now(), nullptr), "54321");
}

}  // namespace
}  // namespace shoal::worker
