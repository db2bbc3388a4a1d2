#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

#include <thread>

#include "absl/synchronization/notification.h"
#include "common/logging.h"

namespace shoal {
namespace {
absl::Notification& Note() {
  static absl::Notification note;
  return note;
}
}  // namespace

void ShutdownSignal::Install() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) {
      SHOAL_LOG(INFO) << "received " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down";
      Request();
    }
  }).detach();
}

bool ShutdownSignal::Requested() { return Note().HasBeenNotified(); }

bool ShutdownSignal::WaitFor(absl::Duration timeout) {
  return Note().WaitForNotificationWithTimeout(timeout);
}

void ShutdownSignal::Request() {
  if (!Note().HasBeenNotified()) Note().Notify();
}

}  // namespace shoal
