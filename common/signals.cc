#include "common/signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/logging.h"

namespace shoal {
namespace {

absl::Notification& Note() {
  static absl::Notification note;
  return note;
}

int g_pipe[2] = {-1, -1};

// Async-signal-safe: only write(2). Threads started before main (OpenBLAS,
// OpenMP) do not block signals, so a handler is used instead of sigwait().
void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_pipe[1] >= 0) (void)!write(g_pipe[1], &b, 1);
}

}  // namespace

void ShutdownSignal::Install() {
  if (pipe2(g_pipe, O_CLOEXEC) != 0) return;
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::thread([] {
    unsigned char sig = 0;
    while (read(g_pipe[0], &sig, 1) == 1) {
      if (Requested()) continue;
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
  static std::atomic<bool> requested{false};
  if (!requested.exchange(true)) {
    Note().Notify();
    Token()->Cancel();
  }
}

CancellationToken* ShutdownSignal::Token() {
  static CancellationToken* token = new CancellationToken();  // never destroyed
  return token;
}

}  // namespace shoal
