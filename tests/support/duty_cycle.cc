#include "tests/support/duty_cycle.h"

#include <signal.h>

#include <algorithm>

namespace shoal::testing {

DutyCycle::DutyCycle(pid_t pid, double run_fraction, absl::Duration period)
    : pid_(pid),
      run_(period * std::clamp(run_fraction, 0.01, 1.0)),
      stopped_(period - run_),
      thread_([this] { Run(); }) {}

DutyCycle::~DutyCycle() { Stop(); }

void DutyCycle::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  kill(pid_, SIGCONT);  // whatever part of the period it was in
}

int DutyCycle::periods() const {
  absl::MutexLock lock(&mu_);
  return periods_;
}

bool DutyCycle::SleepOrStop(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  mu_.AwaitWithTimeout(absl::Condition(&stopping), d);
  return stop_;
}

void DutyCycle::Run() {
  while (true) {
    if (kill(pid_, SIGCONT) != 0) return;  // the process is gone
    if (SleepOrStop(run_)) return;
    if (stopped_ > absl::ZeroDuration()) {
      if (kill(pid_, SIGSTOP) != 0) return;
      if (SleepOrStop(stopped_)) return;
    }
    absl::MutexLock lock(&mu_);
    ++periods_;
  }
}

}  // namespace shoal::testing
