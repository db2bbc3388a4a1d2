#include "common/run_config_flags.h"

#include <optional>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/reflection.h"
#include "common/run_config_schema.h"

namespace shoal {

std::vector<RunConfigFlag> RunConfigFlagsFromCommandLine() {
  return RunConfigFlagsOf([](const std::string& name) -> std::optional<FlagText> {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) return std::nullopt;
    // Abseil 20220623 has no public "was this flag given" (the method of
    // CommandLineFlag is private); this is what its own --flagfile
    // handling asks, and it counts flags from a --flagfile too.
    return FlagText{flag->CurrentValue(), absl::flags_internal::WasPresentOnCommandLine(name)};
  });
}

std::string CurrentFlagText(const std::string& name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag == nullptr ? std::string() : flag->CurrentValue();
}

}  // namespace shoal
