// A slow machine made from outside a process: a thread that lets the
// process run for `run_fraction` of every `period` (SIGCONT) and stops it
// (SIGSTOP) for the rest, so a worker under test runs at about that fraction
// of its speed with no test-only slow path inside it. Heartbeats and RPCs
// are only delayed by at most one stopped part of a period.
//
// Signals go to the one PID given, never by name. Thread-compatible: start
// and stop from one test thread.
#ifndef SHOAL_TESTS_SUPPORT_DUTY_CYCLE_H_
#define SHOAL_TESTS_SUPPORT_DUTY_CYCLE_H_

#include <sys/types.h>

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shoal::testing {

class DutyCycle {
 public:
  // Starts throttling `pid` at once. `run_fraction` is clamped to (0, 1].
  DutyCycle(pid_t pid, double run_fraction, absl::Duration period = absl::Milliseconds(200));
  // Stop().
  ~DutyCycle();
  DutyCycle(const DutyCycle&) = delete;
  DutyCycle& operator=(const DutyCycle&) = delete;

  // Ends the throttling and leaves the process running (SIGCONT). Idempotent.
  void Stop();
  // Periods completed so far.
  int periods() const;

 private:
  void Run();
  // Sleeps up to `d`; returns true when Stop() was called meanwhile.
  bool SleepOrStop(absl::Duration d);

  const pid_t pid_;
  const absl::Duration run_;
  const absl::Duration stopped_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int periods_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_DUTY_CYCLE_H_
