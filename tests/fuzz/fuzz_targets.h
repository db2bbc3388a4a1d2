// The decoders of untrusted bytes, each wrapped as a function of arbitrary
// bytes with its invariants checked. The same functions run under libFuzzer
// (tests/fuzz/fuzz_main.cc, clang, `make fuzz`) and in the normal gcc build,
// where fuzz_corpus_test replays every committed corpus file
// (tests/fuzz/corpus/<target>/) through them.
//
// A target returns normally for any input whose handling is correct (a
// refusal with the documented code is correct) and calls FuzzFail, which
// aborts, when an invariant breaks; out-of-bounds accesses are left to the
// sanitizers of the fuzz build.
#ifndef SHOAL_TESTS_FUZZ_FUZZ_TARGETS_H_
#define SHOAL_TESTS_FUZZ_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shoal::fuzz {

using TargetFn = void (*)(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // also the corpus directory and the fuzzer's name
  TargetFn run;
};

// Every target, in the order `make fuzz` runs them.
const std::vector<Target>& Targets();
// The target called `name`, or null.
const Target* FindTarget(const char* name);

// Prints `what` with the location and aborts.
[[noreturn]] void FuzzFail(const char* file, int line, const char* what);

}  // namespace shoal::fuzz

#define FUZZ_CHECK(cond) \
  if (!(cond)) ::shoal::fuzz::FuzzFail(__FILE__, __LINE__, #cond)

#endif  // SHOAL_TESTS_FUZZ_FUZZ_TARGETS_H_
