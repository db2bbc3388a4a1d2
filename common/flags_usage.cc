#include "common/flags_usage.h"

#include <string>

#include "absl/flags/usage_config.h"

namespace shoal {

void UseFlagsOfFileForHelp(absl::string_view main_file) {
  // The filter receives a flag's file after normalize_filename, which we leave
  // at Abseil's default: it strips leading slashes. Strip them the same way
  // here so an absolute __FILE__ compares equal.
  const size_t first = main_file.find_first_not_of("\\/");
  std::string own(first == absl::string_view::npos ? "" : main_file.substr(first));
  auto is_own = [own](absl::string_view filename) { return filename == own; };
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = is_own;
  config.contains_help_flags = is_own;
  config.contains_helppackage_flags = is_own;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace shoal
