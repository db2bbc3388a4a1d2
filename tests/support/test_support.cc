#include "tests/support/test_support.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "absl/time/clock.h"

namespace shoal::testing {

bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp ? tmp : "/tmp") + "/shoal-test-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string BinDir() {
  const char* dir = std::getenv("SHOAL_BIN_DIR");
  return dir ? dir : "build/bin";
}

std::string DataDir() {
  const char* dir = std::getenv("SHOAL_DATA_DIR");
  return dir ? dir : "/usr/share/datasets/fashion-mnist";
}

std::vector<float> RandomModel(size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(elements);
  for (float& x : v) x = dist(rng);
  return v;
}

std::unique_ptr<Process> Process::Start(const std::vector<std::string>& argv,
                                        const std::string& log_path) {
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + log_path);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    // Signals blocked by the test runner must not stay blocked in the child.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fd);
  return std::unique_ptr<Process>(new Process(pid, log_path));
}

Process::~Process() { Stop(); }

bool Process::Running() { return Wait(absl::ZeroDuration()) == -1; }

void Process::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

int Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!reaped_) {
    const pid_t r = waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (absl::Now() >= deadline) return -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

int Process::Stop(absl::Duration grace) {
  if (reaped_) return Wait(absl::ZeroDuration());
  kill(pid_, SIGCONT);  // a stopped process cannot handle SIGTERM
  kill(pid_, SIGTERM);
  int code = Wait(grace);
  if (code == -1) {
    kill(pid_, SIGKILL);
    code = Wait(absl::Seconds(10));
  }
  return code;
}

std::string Process::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Process::WaitForListenAddress(absl::Duration timeout) {
  static const std::regex kListen("listening on ([0-9.]+:[0-9]+)");
  std::string address;
  WaitUntil(
      [&] {
        std::smatch m;
        const std::string log = Log();
        if (std::regex_search(log, m, kListen)) {
          address = m[1];
          return true;
        }
        return !Running();
      },
      timeout);
  return address;
}

}  // namespace shoal::testing
