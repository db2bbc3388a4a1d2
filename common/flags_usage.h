// What `--help` lists. Abseil's default lists only the flags of files named
// after the program (shoal-worker.cc, shoal-worker_main.cc), so a binary whose
// flags live in `services/worker/main.cc` printed "No flags matched". Each
// binary's main() calls UseFlagsOfFileForHelp(__FILE__) before
// absl::ParseCommandLine(); --helpfull still lists every linked flag.
#ifndef SHOAL_COMMON_FLAGS_USAGE_H_
#define SHOAL_COMMON_FLAGS_USAGE_H_

#include <initializer_list>

#include "absl/strings/string_view.h"

namespace shoal {

// Makes --help, --helpshort and --helppackage list the flags defined in
// `main_file` (pass __FILE__ from the file that holds the binary's ABSL_FLAGs,
// so the name is spelled exactly as in the flags' own records). Call once,
// before absl::ParseCommandLine(); not thread-safe.
void UseFlagsOfFileForHelp(absl::string_view main_file);
// The same with more files whose flags the binary shares (common/tls_flags).
void UseFlagsOfFileForHelp(absl::string_view main_file,
                           std::initializer_list<absl::string_view> shared_files);

}  // namespace shoal

#endif  // SHOAL_COMMON_FLAGS_USAGE_H_
