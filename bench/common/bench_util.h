// Helpers shared by the benchmark drivers: child processes spoken to over
// pipes (one line per message), medians, /proc readings and the result
// table every benchmark prints. Bench code only; nothing in services/ uses it.
#ifndef SHOAL_BENCH_COMMON_BENCH_UTIL_H_
#define SHOAL_BENCH_COMMON_BENCH_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace shoal::bench {

// A child process with its stdin and stdout on pipes; stderr goes to
// `log_path` (appended). Killed (SIGTERM, then SIGKILL) when destroyed.
// Not thread-safe.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log_path);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Writes `line` plus a newline. False when the child is gone.
  bool Send(const std::string& line);
  // Next line of the child's stdout, without the newline; false on EOF or
  // after `timeout`.
  bool ReadLine(std::string* line, absl::Duration timeout);
  // Reads lines until one starts with `prefix`; returns the rest of it.
  bool Expect(const std::string& prefix, std::string* rest, absl::Duration timeout);
  // Closes its stdin, waits up to `grace`, then kills it. Returns the exit
  // status (as from waitpid) or -1.
  int Stop(absl::Duration grace);
  // Sends SIGTERM at once, waits up to `grace`, then kills it.
  int Terminate(absl::Duration grace);

 private:
  int StopWith(absl::Duration grace, bool term_first);
  pid_t pid_ = -1;
  int in_ = -1;   // its stdin (we write)
  int out_ = -1;  // its stdout (we read)
  std::string buffer_;
  bool reaped_ = false;
};

// Path of the running executable (/proc/self/exe).
std::string SelfExe();

double Median(std::vector<double> v);
double Percentile(std::vector<double> v, double p);  // p in [0, 100]

// utime + stime of `pid` in seconds (/proc/PID/stat, clock ticks).
double ProcessCpuSeconds(pid_t pid);
// On-CPU time of every thread of `pid` in seconds (/proc/PID/task/*/schedstat,
// nanoseconds; 0 when the kernel does not provide it).
double ProcessSchedSeconds(pid_t pid);
// CPU-seconds (user + system, every thread) of this process so far.
double SelfCpuSeconds();
// VmHWM / VmRSS of this process, bytes.
uint64_t PeakRssBytes();
uint64_t CurrentRssBytes();
// 1-minute load average.
double LoadAverage1();
int Cores();

// Allocates `bytes` and touches every page (so page faults are not timed).
// The memory stays until process exit.
void* AllocTouched(size_t bytes);

// Prints the table: a header line with the machine, then one row per
// figure: name, value, unit, and a note (baseline / repetitions).
struct Row {
  std::string name;
  std::string value;
  std::string note;
};
void PrintTable(const std::string& title, const std::vector<Row>& rows);

std::string Fmt(double v, int decimals);
std::string Join(const std::vector<double>& v, int decimals);

// Reads "--name=value" flags. Unknown flags are fatal (typos).
class Flags {
 public:
  Flags(int argc, char** argv);
  std::string Str(const std::string& name, const std::string& def);
  int64_t Int(const std::string& name, int64_t def);
  double Double(const std::string& name, double def);
  // Exits with a message when a flag was given that no one asked for.
  void CheckAllUsed();

 private:
  std::vector<std::pair<std::string, std::string>> given_;
  std::vector<std::string> used_;
};

}  // namespace shoal::bench

#endif  // SHOAL_BENCH_COMMON_BENCH_UTIL_H_
