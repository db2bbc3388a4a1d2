// Process set-up for the server binaries: Abseil's Mutex deadlock
// detection off.
#ifndef SHOAL_COMMON_MUTEX_MODE_H_
#define SHOAL_COMMON_MUTEX_MODE_H_

#include "absl/synchronization/mutex.h"

namespace shoal {

// Debian's Abseil checks lock order on every absl::Mutex acquisition (gRPC's
// locks included), keeping a global graph of every mutex: about 5 % of the
// coordinator's CPU with 1,000 sessions (GraphCycles::GetId and
// UpdateStackTrace in a perf profile). It is a debugging aid: the tests keep
// it on (they link no main of ours), the servers turn it off first thing in
// main, before any thread starts.
inline void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace shoal

#endif  // SHOAL_COMMON_MUTEX_MODE_H_
