// TSan builds only: data handed over through Debian's absl::Mutex, CondVar and
// Notification is not reported as a race (tsan_absl_sync.cc). Without those
// annotations each case below makes ThreadSanitizer report, and the test
// executable exits with TSan's exit code.
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace {

TEST(TsanAbslSyncTest, MutexOrdersWritersOfAGuardedCounter) {
  absl::Mutex mu;
  int counter = 0;  // guarded by mu
  auto add = [&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++counter;
    }
  };
  std::thread a(add);
  std::thread b(add);
  a.join();
  b.join();
  EXPECT_EQ(counter, 2000);
}

TEST(TsanAbslSyncTest, NotificationPublishesWhatWasWrittenBeforeIt) {
  absl::Notification done;
  int payload = 0;  // written before Notify, read after the wait
  std::thread writer([&] {
    payload = 42;
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(payload, 42);
  writer.join();
}

TEST(TsanAbslSyncTest, AwaitAndCondVarWaitSeeTheOtherThreadsWrites) {
  absl::Mutex mu;
  absl::CondVar cv;
  int stage = 0;  // guarded by mu
  int side = 0;   // written under mu by the helper, read under mu here
  std::thread helper([&] {
    absl::MutexLock lock(&mu);
    side = 1;
    stage = 1;
    cv.Signal();
    mu.Await(absl::Condition(
        +[](int* s) { return *s == 2; }, &stage));
    side = 3;
    stage = 3;
  });
  {
    absl::MutexLock lock(&mu);
    while (stage != 1) cv.Wait(&mu);
    EXPECT_EQ(side, 1);
    side = 2;
    stage = 2;
    mu.Await(absl::Condition(
        +[](int* s) { return *s == 3; }, &stage));
    EXPECT_EQ(side, 3);
  }
  helper.join();
}

}  // namespace
