// The coordinator's run-config flags: one per setting with a flag, defined
// by the source shoal-config-gen generates at build time from RunConfig's
// `setting` options (common/run_config_doc.h), and read here through
// Abseil's flag registry by name, so that no code names them one by one.
#ifndef SHOAL_COMMON_RUN_CONFIG_FLAGS_H_
#define SHOAL_COMMON_RUN_CONFIG_FLAGS_H_

#include <string>
#include <vector>

#include "common/run_config_file.h"

namespace shoal {

// The file the generated flags count as theirs (for --help,
// common/flags_usage.h): defined by the generated source, so a program
// that calls it links the flags.
const char* RunConfigFlagsFile();

// Every run-config flag of this program as the command line left it: its
// current value, whether it was given (on the command line or in a
// --flagfile). For MergeRunConfig.
std::vector<RunConfigFlag> RunConfigFlagsFromCommandLine();

// The current text of flag `name` ("" when the program has none).
std::string CurrentFlagText(const std::string& name);

}  // namespace shoal

#endif  // SHOAL_COMMON_RUN_CONFIG_FLAGS_H_
