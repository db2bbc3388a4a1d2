// `-o yaml`: the same document as `-o json`, as block YAML. Keys keep their
// order; JSON strings stay strings (double-quoted unless plainly a word:
// int64 fields, which proto JSON prints as strings, hashes, addresses and
// times stay strings for YAML 1.1 and 1.2 readers alike), numbers, booleans
// and null stay what they are.
#ifndef SHOAL_TOOLS_SHOALCTL_YAML_OUTPUT_H_
#define SHOAL_TOOLS_SHOALCTL_YAML_OUTPUT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal::ctl {

// INVALID_ARGUMENT when `json` does not parse.
absl::StatusOr<std::string> JsonToYaml(absl::string_view json);

}  // namespace shoal::ctl

#endif  // SHOAL_TOOLS_SHOALCTL_YAML_OUTPUT_H_
