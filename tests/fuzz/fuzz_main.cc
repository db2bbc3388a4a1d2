// The libFuzzer entry point of one target; SHOAL_FUZZ_TARGET names it
// (tests/fuzz/CMakeLists.txt builds one fuzzer per target).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/fuzz_targets.h"

namespace {

const shoal::fuzz::Target& TheTarget() {
  static const shoal::fuzz::Target* target = [] {
    const shoal::fuzz::Target* t = shoal::fuzz::FindTarget(SHOAL_FUZZ_TARGET);
    if (t == nullptr) {
      std::fprintf(stderr, "no fuzz target %s\n", SHOAL_FUZZ_TARGET);
      std::abort();
    }
    return t;
  }();
  return *target;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  TheTarget().run(data, size);
  return 0;
}
