// Shared fixtures for every test tier.
#ifndef SHOAL_TESTS_SUPPORT_TEST_SUPPORT_H_
#define SHOAL_TESTS_SUPPORT_TEST_SUPPORT_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace shoal::testing {

// Polls `condition` every 20 ms until it holds or `timeout` passes.
bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout);

// A fresh directory under $TMPDIR, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Directory of the built binaries (SHOAL_BIN_DIR, set by ctest).
std::string BinDir();

// Fashion-MNIST directory (SHOAL_DATA_DIR or Debian's default).
std::string DataDir();

// `elements` floats drawn uniformly from [-1, 1) by std::mt19937(seed): a
// model whose values are reproducible and different for each seed.
std::vector<float> RandomModel(size_t elements, uint32_t seed);

// A child process running a built binary, its stdout and stderr in a log
// file. The destructor stops it by PID (SIGTERM, then SIGKILL after 5 s), so
// a failing test never leaves processes behind.
class Process {
 public:
  // Starts argv[0] (a path) with the remaining arguments.
  static std::unique_ptr<Process> Start(const std::vector<std::string>& argv,
                                        const std::string& log_path);
  ~Process();

  pid_t pid() const { return pid_; }
  bool Running();
  // Sends `sig` (SIGKILL, SIGSTOP, ...).
  void Signal(int sig);
  // Waits for exit up to `timeout`; returns the exit code, 128+signal when
  // killed by a signal, or -1 on timeout.
  int Wait(absl::Duration timeout);
  // SIGTERM, wait up to `grace`, then SIGKILL; returns the exit status as Wait.
  int Stop(absl::Duration grace = absl::Seconds(5));
  std::string Log() const;
  const std::string& log_path() const { return log_path_; }
  // Polls the log until it contains "listening on HOST:PORT" and returns
  // "HOST:PORT", or "" after `timeout` or if the process exited.
  std::string WaitForListenAddress(absl::Duration timeout);

 private:
  Process(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_TEST_SUPPORT_H_
