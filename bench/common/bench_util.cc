#include "bench/common/bench_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace shoal::bench {

Child::Child(const std::vector<std::string>& argv, const std::string& log_path) {
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
    perror("pipe2");
    std::exit(2);
  }
  pid_ = fork();
  if (pid_ < 0) {
    perror("fork");
    std::exit(2);
  }
  if (pid_ == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log >= 0) dup2(log, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    perror("execv");
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  in_ = to_child[1];
  out_ = from_child[0];
}

Child::~Child() { Stop(absl::Seconds(3)); }

bool Child::Send(const std::string& line) {
  if (in_ < 0) return false;
  std::string data = line + "\n";
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = write(in_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    left -= n;
  }
  return true;
}

bool Child::ReadLine(std::string* line, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      *line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return true;
    }
    if (out_ < 0) return false;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{out_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(out_);
      out_ = -1;
      continue;
    }
    buffer_.append(buf, n);
  }
}

bool Child::Expect(const std::string& prefix, std::string* rest, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string line;
  while (ReadLine(&line, deadline - absl::Now())) {
    if (line.rfind(prefix, 0) == 0) {
      if (rest != nullptr) *rest = line.substr(prefix.size());
      return true;
    }
  }
  return false;
}

int Child::Stop(absl::Duration grace) { return StopWith(grace, /*term_first=*/false); }

int Child::Terminate(absl::Duration grace) { return StopWith(grace, /*term_first=*/true); }

int Child::StopWith(absl::Duration grace, bool term_first) {
  if (pid_ <= 0 || reaped_) return -1;
  if (in_ >= 0) {
    close(in_);
    in_ = -1;
  }
  if (term_first) kill(pid_, SIGTERM);
  int status = -1;
  absl::Time deadline = absl::Now() + grace;
  bool termed = term_first;
  while (true) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (r < 0) {
      status = -1;
      break;
    }
    if (absl::Now() > deadline) {
      if (!termed) {
        kill(pid_, SIGTERM);
        termed = true;
        deadline = absl::Now() + grace;
        continue;
      }
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  reaped_ = true;
  if (out_ >= 0) {
    close(out_);
    out_ = -1;
  }
  return status;
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start after ')'.
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; in >> field; ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) {
      stime = std::atof(field.c_str());
      break;
    }
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double ProcessSchedSeconds(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  double total = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(absl::StrCat(dir, "/", e->d_name, "/schedstat"));
    double ns = 0;
    if (f >> ns) total += ns * 1e-9;
  }
  closedir(d);
  return total;
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

namespace {
uint64_t StatusField(const char* name) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(name) + ":";
  while (std::getline(f, line)) {
    if (line.rfind(prefix, 0) == 0)
      return std::strtoull(line.c_str() + prefix.size(), nullptr, 10) * 1024;
  }
  return 0;
}
}  // namespace

uint64_t PeakRssBytes() { return StatusField("VmHWM"); }
uint64_t CurrentRssBytes() { return StatusField("VmRSS"); }

double LoadAverage1() {
  std::ifstream f("/proc/loadavg");
  double l = 0;
  f >> l;
  return l;
}

int Cores() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

void* AllocTouched(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    std::exit(2);
  }
  const long page = sysconf(_SC_PAGESIZE);
  auto* c = static_cast<volatile char*>(p);
  for (size_t i = 0; i < bytes; i += page) c[i] = 1;
  return p;
}

void PrintTable(const std::string& title, const std::vector<Row>& rows) {
  size_t w0 = 6, w1 = 5;
  for (const Row& r : rows) {
    w0 = std::max(w0, r.name.size());
    w1 = std::max(w1, r.value.size());
  }
  std::printf("== %s  (cores=%d, load1=%.2f at the end)\n", title.c_str(), Cores(), LoadAverage1());
  std::printf("%-*s  %-*s  %s\n", static_cast<int>(w0), "figure", static_cast<int>(w1), "value",
              "note");
  for (const Row& r : rows) {
    std::printf("%-*s  %-*s  %s\n", static_cast<int>(w0), r.name.c_str(), static_cast<int>(w1),
                r.value.c_str(), r.note.c_str());
  }
  std::fflush(stdout);
}

std::string Fmt(double v, int decimals) { return absl::StrFormat("%.*f", decimals, v); }

std::string Join(const std::vector<double>& v, int decimals) {
  std::vector<std::string> parts;
  for (double x : v) parts.push_back(Fmt(x, decimals));
  return absl::StrJoin(parts, " ");
}

Flags::Flags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      std::fprintf(stderr, "unexpected argument '%s' (flags are --name=value)\n", a.c_str());
      std::exit(2);
    }
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      given_.emplace_back(a.substr(2), "true");
    } else {
      given_.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
    }
  }
}

std::string Flags::Str(const std::string& name, const std::string& def) {
  used_.push_back(name);
  for (const auto& [k, v] : given_) {
    if (k == name) return v;
  }
  return def;
}

int64_t Flags::Int(const std::string& name, int64_t def) {
  const std::string s = Str(name, "");
  return s.empty() ? def : std::strtoll(s.c_str(), nullptr, 10);
}

double Flags::Double(const std::string& name, double def) {
  const std::string s = Str(name, "");
  return s.empty() ? def : std::strtod(s.c_str(), nullptr);
}

void Flags::CheckAllUsed() {
  for (const auto& [k, v] : given_) {
    if (std::find(used_.begin(), used_.end(), k) == used_.end()) {
      std::fprintf(stderr, "unknown flag --%s\n", k.c_str());
      std::exit(2);
    }
  }
}

}  // namespace shoal::bench
