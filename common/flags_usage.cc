#include "common/flags_usage.h"

#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/usage_config.h"

namespace shoal {
namespace {

// The filter receives a flag's file after normalize_filename, which we leave
// at Abseil's default: it strips leading slashes. Strip them the same way
// here so an absolute __FILE__ compares equal.
std::string Normalized(absl::string_view file) {
  const size_t first = file.find_first_not_of("\\/");
  return std::string(first == absl::string_view::npos ? "" : file.substr(first));
}

}  // namespace

void UseFlagsOfFileForHelp(absl::string_view main_file) { UseFlagsOfFileForHelp(main_file, {}); }

void UseFlagsOfFileForHelp(absl::string_view main_file,
                           std::initializer_list<absl::string_view> shared_files) {
  std::vector<std::string> own = {Normalized(main_file)};
  for (absl::string_view f : shared_files) own.push_back(Normalized(f));
  auto is_own = [own](absl::string_view filename) { return absl::c_linear_search(own, filename); };
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = is_own;
  config.contains_help_flags = is_own;
  config.contains_helppackage_flags = is_own;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace shoal
