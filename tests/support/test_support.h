// Shared fixtures for every test tier.
#ifndef SHOAL_TESTS_SUPPORT_TEST_SUPPORT_H_
#define SHOAL_TESTS_SUPPORT_TEST_SUPPORT_H_

#include <functional>
#include <string>

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

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_TEST_SUPPORT_H_
