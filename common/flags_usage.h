// What `--help` lists. Abseil's default lists only the flags of files named
// after the program (shoal-worker.cc, shoal-worker_main.cc), so a binary whose
// flags live in `services/worker/main.cc` printed "No flags matched". Each
// binary's main() calls UseFlagsOfFileForHelp(__FILE__) before
// absl::ParseCommandLine(); --helpfull still lists every linked flag.
#ifndef SHOAL_COMMON_FLAGS_USAGE_H_
#define SHOAL_COMMON_FLAGS_USAGE_H_

#include <initializer_list>
#include <string>
#include <vector>

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

// absl::ParseCommandLine with two habits of the tools operators know:
// `--version` prints `version_line` (common/version.h) and exits 0, and an
// unknown flag ends the program with exit code 2 and the nearest flag's name
// ("unknown flag --coordinater (did you mean --coordinator?)") instead of
// Abseil's bare "Unknown command line flag". Returns the positional
// arguments, as absl::ParseCommandLine does.
std::vector<char*> ParseFlagsOrExit(int argc, char** argv, const std::string& version_line);

// The unknown flags among `args` (argv without the program name) with their
// suggestion, one message per flag; empty when every flag is known. Looks
// flags up in Abseil's registry; pure otherwise (tests).
std::vector<std::string> UnknownFlagMessages(const std::vector<std::string>& args);

// The candidate nearest to `word` by edit distance when it is close enough to
// be a typo (at most 2 edits, 3 for words longer than 8; a candidate that
// starts with `word` also counts), else "".
std::string NearestWord(absl::string_view word, const std::vector<std::string>& candidates);

}  // namespace shoal

#endif  // SHOAL_COMMON_FLAGS_USAGE_H_
