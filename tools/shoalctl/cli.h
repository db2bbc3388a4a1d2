// shoalctl's one command line: the commands, every flag with its one meaning,
// the environment variables, help, suggestions and bash completion, all
// drawn from one table (cli.cc). Global flags go anywhere on the line, as
// in kubectl and etcdctl:
//
//   shoalctl -o yaml status                  shoalctl status -o json
//   SHOAL_STORE=h:50052 shoalctl checkpoints list --run_id=r1
//   shoalctl help checkpoints export         shoalctl watch --help
//
// A flag's value comes from the command line, else its environment variable,
// else its default. Pure: no I/O, the environment is passed in.
#ifndef SHOAL_TOOLS_SHOALCTL_CLI_H_
#define SHOAL_TOOLS_SHOALCTL_CLI_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shoal::ctl {

// `-o table|wide|json|yaml`.
enum class OutputFormat { kTable, kWide, kJson, kYaml };
absl::string_view OutputFormatName(OutputFormat format);

// One parsed command line.
struct Invocation {
  // The command's words: {"status"}, {"checkpoints", "list"}, {"help"}, ...
  // Empty when the line names none (then `help` or `version` may be set).
  std::vector<std::string> command;
  // Operands after the command words: `explain WORKER`, `help COMMAND...`,
  // `checkpoints show ID`.
  std::vector<std::string> operands;
  // Every flag the command knows, with its value from the line, the
  // environment or its default ("" when it has none).
  std::map<std::string, std::string> values;
  // Flags given on the line or through the environment.
  std::set<std::string> given;
  OutputFormat output = OutputFormat::kTable;
  bool output_given = false;
  bool help = false;
  bool version = false;

  // "checkpoints list".
  std::string CommandName() const;
  std::string Get(absl::string_view flag) const;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment.
EnvLookup ProcessEnv();

// Parses `args` (argv without the program name). INVALID_ARGUMENT with a
// message for people (an unknown flag or command names the nearest one) on
// bad usage. Does not check that the output format suits the command: see
// CheckOutput.
absl::StatusOr<Invocation> ParseCommandLine(const std::vector<std::string>& args,
                                            const EnvLookup& env);

// INVALID_ARGUMENT when the command does not print `inv.output` (config
// prints json or yaml; watch prints table lines or json lines).
absl::Status CheckOutput(const Invocation& inv);
// The formats the command prints, the first its default.
std::vector<OutputFormat> OutputsOf(const std::vector<std::string>& command);

// A duration flag ("5s", "10m"); INVALID_ARGUMENT naming the flag when it
// does not parse. `fallback` when the flag has no value.
absl::StatusOr<absl::Duration> DurationFlag(const Invocation& inv, absl::string_view flag,
                                            absl::Duration fallback);

// `shoalctl help [COMMAND...]`: the overview for an empty command, else the
// command's usage with every flag it takes. INVALID_ARGUMENT for an unknown
// command.
absl::StatusOr<std::string> HelpText(const std::vector<std::string>& command);

// `shoalctl completion bash`: a script for `source <(shoalctl completion
// bash)` that completes commands, flags and -o values.
std::string BashCompletion();

}  // namespace shoal::ctl

#endif  // SHOAL_TOOLS_SHOALCTL_CLI_H_
