#include "common/flags_usage.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// Abseil's own flags, handled by absl::ParseCommandLine; those that take a
// value are marked.
bool IsBuiltinFlag(absl::string_view name, bool* takes_value) {
  static const std::set<std::string, std::less<>> kSwitches = {
      "help", "helpfull", "helpshort", "helppackage", "version", "only_check_args"};
  static const std::set<std::string, std::less<>> kValued = {"helpon",  "helpmatch",  "flagfile",
                                                             "fromenv", "tryfromenv", "undefok"};
  *takes_value = kValued.count(name) > 0;
  return *takes_value || kSwitches.count(name) > 0;
}

}  // namespace

std::string NearestWord(absl::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = word.size() > 8 ? 4 : 3;
  for (const std::string& c : candidates) {
    size_t d = EditDistance(word, c);
    if (word.size() >= 3 && absl::StartsWith(c, word)) d = std::min<size_t>(d, 1);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::vector<std::string> UnknownFlagMessages(const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) names.emplace_back(name);
  std::sort(names.begin(), names.end());
  std::vector<std::string> messages;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view a = args[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    a.remove_prefix(a[1] == '-' ? 2 : 1);
    const size_t eq = a.find('=');
    const absl::string_view name = a.substr(0, eq);
    const bool has_value = eq != absl::string_view::npos;
    bool takes_value = false;
    if (IsBuiltinFlag(name, &takes_value)) {
      if (takes_value && !has_value) ++i;
      continue;
    }
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      const absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() && !has_value) continue;
    }
    if (flag == nullptr) {
      std::string message = absl::StrCat("unknown flag --", name);
      if (const std::string near = NearestWord(name, names); !near.empty()) {
        absl::StrAppend(&message, " (did you mean --", near, "?)");
      }
      messages.push_back(std::move(message));
      continue;
    }
    // `--flag value`: the next argument is the value.
    if (!has_value && !flag->IsOfType<bool>()) ++i;
  }
  return messages;
}

std::vector<char*> ParseFlagsOrExit(int argc, char** argv, const std::string& version_line) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--") break;
    if (a == "--version" || a == "-version") {
      std::printf("%s\n", version_line.c_str());
      std::exit(0);
    }
  }
  const std::vector<std::string> unknown = UnknownFlagMessages(args);
  if (!unknown.empty()) {
    std::string program = argc > 0 ? argv[0] : "program";
    program = program.substr(program.rfind('/') + 1);
    for (const std::string& m : unknown)
      std::fprintf(stderr, "%s: %s\n", program.c_str(), m.c_str());
    std::fprintf(stderr, "Run '%s --help' for its flags.\n", program.c_str());
    std::exit(2);
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace shoal
