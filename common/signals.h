// SIGINT / SIGTERM handling for the binaries: call Install() in main before
// any thread starts; a watcher thread turns the signal into a notification
// that the main loop polls or waits on with a timeout.
#ifndef SHOAL_COMMON_SIGNALS_H_
#define SHOAL_COMMON_SIGNALS_H_

#include "absl/time/time.h"
#include "common/cancellation.h"

namespace shoal {

class ShutdownSignal {
 public:
  static void Install();
  static bool Requested();
  // Waits up to `timeout`; true when a signal arrived.
  static bool WaitFor(absl::Duration timeout);
  // Lets code (and tests) request shutdown without a signal.
  static void Request();
  // Cancelled when shutdown is requested: parent of the tokens that stop
  // work in flight.
  static CancellationToken* Token();
};

}  // namespace shoal

#endif  // SHOAL_COMMON_SIGNALS_H_
