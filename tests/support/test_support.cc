#include "tests/support/test_support.h"

#include <cstdlib>
#include <filesystem>
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

}  // namespace shoal::testing
