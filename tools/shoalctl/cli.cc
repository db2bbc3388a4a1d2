#include "tools/shoalctl/cli.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags_usage.h"
#include "common/status_util.h"

namespace shoal::ctl {
namespace {

// A flag: its one meaning, its environment variable and default.
struct FlagSpec {
  const char* name;
  char short_name;         // 0: none
  const char* value_name;  // nullptr: a switch (--json, --json=false)
  const char* env;         // nullptr: none
  const char* fallback;    // default value ("" none)
  const char* help;
};

// Accepted by every command, anywhere on the line.
const FlagSpec kGlobalFlags[] = {
    {"coordinator", 0, "ADDR", "SHOAL_COORDINATOR", "127.0.0.1:50051",
     "Coordinator address (host:port), or the replicas' addresses separated by commas (the "
     "leader answers; a standby's view when none does)."},
    {"store", 0, "ADDR", "SHOAL_STORE", "127.0.0.1:50052",
     "Checkpoint store address (shoal-checkpoint), for the checkpoints commands."},
    {"output", 'o', "FORMAT", nullptr, "",
     "Output format: table, wide, json or yaml (each command's help says which it prints and "
     "its default)."},
    {"json", 0, nullptr, nullptr, "", "Same as -o json (kept for scripts)."},
    {"rpc_timeout", 0, "DURATION", "SHOAL_RPC_TIMEOUT", "",
     "Deadline of each call, e.g. 5s (default 5s; 10s for the checkpoints commands)."},
    {"token_file", 0, "FILE", "SHOAL_TOKEN_FILE", "",
     "File holding the run's token, sent with every call; for checkpoints delete the store's "
     "admin token (docs/SECURITY.md)."},
    {"tls_ca", 0, "FILE", "SHOAL_TLS_CA", "",
     "PEM CA bundle that servers' certificates must chain to; turns TLS on."},
    {"tls_cert", 0, "FILE", "SHOAL_TLS_CERT", "",
     "PEM certificate to present to servers that require one (mutual TLS); with --tls_key."},
    {"tls_key", 0, "FILE", "SHOAL_TLS_KEY", "", "PEM private key of --tls_cert."},
    {"tls_server_name", 0, "NAME", "SHOAL_TLS_SERVER_NAME", "",
     "Name to check the server's certificate against instead of the host called."},
    {"help", 'h', nullptr, nullptr, "", "Print help (of the command, when one is named)."},
    {"version", 0, nullptr, nullptr, "", "Print shoalctl's version and commit."},
};

// Flags of one command or a few.
const FlagSpec kCommandFlags[] = {
    {"timeout", 0, "DURATION", nullptr, "30m",
     "Give up (exit 1) when the run has not finished after this long."},
    {"interval", 0, "DURATION", nullptr, "250ms", "How often to ask the coordinator."},
    {"run_id", 0, "RUN", nullptr, "", "Only this run's checkpoints."},
    {"id", 0, "ID", nullptr, "", "The checkpoint (also accepted as the operand)."},
    {"out", 0, "FILE", nullptr, "", "Where to write the state dict."},
};

struct CommandSpec {
  std::vector<std::string> words;
  const char* operands;  // usage of the operands, "" none
  size_t min_operands;
  size_t max_operands;
  const char* summary;
  const char* details;
  std::vector<const char*> flags;  // from kCommandFlags
  std::vector<OutputFormat> outputs;
};

const std::vector<OutputFormat> kAllOutputs = {OutputFormat::kTable, OutputFormat::kWide,
                                               OutputFormat::kJson, OutputFormat::kYaml};

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec> kCommands = {
      {{"status"},
       "",
       0,
       0,
       "The run's status: phase, rounds, members, hashes, checkpoints.",
       "table lists the members and folds departed workers into one line; wide lists every "
       "worker with every column; json and yaml carry the whole RunStatus (proto field names, "
       "int64 fields as strings, as grpcurl prints them).",
       {},
       kAllOutputs},
      {{"watch"},
       "",
       0,
       0,
       "Follow the run: a line per completed round, then a summary line.",
       "Exits 0 when the run finishes with every worker on one hash, 3 when the hashes differ, "
       "1 after --timeout, 130 on Ctrl-C. The summary line holds test_accuracy=<value>. -o json "
       "prints one JSON object per line instead: {\"event\": \"round\", ...} per round, "
       "\"waiting\" and \"gossip\" lines, \"unreachable\" while the coordinator cannot be "
       "reached, and a last {\"event\": \"finished\", ...}.",
       {"timeout", "interval"},
       {OutputFormat::kTable, OutputFormat::kJson}},
      {{"config"},
       "",
       0,
       0,
       "The run's effective config, as the file a coordinator's --config reads.",
       "json (the default) or yaml; both are valid --config files (docs/CONFIG.md).",
       {},
       {OutputFormat::kJson, OutputFormat::kYaml}},
      {{"explain"},
       "WORKER",
       1,
       1,
       "Why a worker is or is not contributing, in words.",
       "WORKER is its id (w3) or its --name. From the coordinator's status: its state and "
       "reason (finished, left on SIGTERM, lost in a crash, evicted), the round it waits for "
       "and on whom, its catch-up, lateness, a stale or disagreeing model, NAT and relays, "
       "silence past the heartbeat lease; and whether this host reaches its advertised "
       "address. Exits 1 when a finding is a PROBLEM.",
       {},
       {OutputFormat::kTable, OutputFormat::kJson, OutputFormat::kYaml}},
      {{"doctor"},
       "",
       0,
       0,
       "Check the whole run: one line per finding, exit 1 when something is wrong.",
       "The coordinator (reachable, leader or standby, token and TLS as its answer tells), "
       "every member (heard from, its advertised address reachable from this host, agreeing), "
       "the store (the run's --checkpoint_store, else --store: reachable, taking checkpoints at "
       "the configured rate, damaged checkpoints) and this host's clock against the "
       "coordinator's newest timestamp.",
       {},
       {OutputFormat::kTable, OutputFormat::kJson, OutputFormat::kYaml}},
      {{"checkpoints", "list"},
       "",
       0,
       0,
       "The store's checkpoints, newest first.",
       "",
       {"run_id"},
       kAllOutputs},
      {{"checkpoints", "show"},
       "[ID]",
       0,
       1,
       "A checkpoint's manifest: run, round, model, layers with their SHA-256.",
       "",
       {"id"},
       kAllOutputs},
      {{"checkpoints", "export"},
       "[ID]",
       0,
       1,
       "Every layer of a checkpoint, checked against its SHA-256, into --out.",
       "In Python, torch.load(FILE) returns a dict name -> tensor. The outer optimizer's state "
       "stays in the store.",
       {"id", "out"},
       {OutputFormat::kTable}},
      {{"checkpoints", "delete"},
       "[ID]",
       0,
       1,
       "Delete a checkpoint (needs the store's admin token).",
       "",
       {"id"},
       {OutputFormat::kTable}},
      {{"completion"},
       "bash",
       1,
       1,
       "A bash completion script.",
       "Load it with: source <(shoalctl completion bash)",
       {},
       {OutputFormat::kTable}},
      {{"version"}, "", 0, 0, "shoalctl's version and commit.", "", {}, {OutputFormat::kTable}},
      {{"help"},
       "[COMMAND...]",
       0,
       2,
       "Help on shoalctl or one command.",
       "",
       {},
       {OutputFormat::kTable}},
  };
  return kCommands;
}

const FlagSpec* FindFlag(absl::string_view name) {
  for (const FlagSpec& f : kGlobalFlags) {
    if (name == f.name) return &f;
  }
  for (const FlagSpec& f : kCommandFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

const FlagSpec* FindShortFlag(char c) {
  for (const FlagSpec& f : kGlobalFlags) {
    if (f.short_name == c) return &f;
  }
  return nullptr;
}

bool IsGlobal(const FlagSpec* f) {
  return f >= std::begin(kGlobalFlags) && f < std::end(kGlobalFlags);
}

const CommandSpec* FindCommand(const std::vector<std::string>& words) {
  for (const CommandSpec& c : Commands()) {
    if (c.words == words) return &c;
  }
  return nullptr;
}

// The first words of every command ("status", "checkpoints", ...), once.
std::vector<std::string> TopWords() {
  std::vector<std::string> out;
  for (const CommandSpec& c : Commands()) {
    if (std::find(out.begin(), out.end(), c.words[0]) == out.end()) out.push_back(c.words[0]);
  }
  return out;
}

// The second words of commands that start with `first`.
std::vector<std::string> SubWords(absl::string_view first) {
  std::vector<std::string> out;
  for (const CommandSpec& c : Commands()) {
    if (c.words.size() > 1 && c.words[0] == first) out.push_back(c.words[1]);
  }
  return out;
}

// " (did you mean 'status'?)", or " (did you mean --store?)" for flags.
std::string Suggest(absl::string_view word, const std::vector<std::string>& candidates,
                    absl::string_view flag_prefix = "") {
  const std::string near = NearestWord(word, candidates);
  if (near.empty()) return "";
  return flag_prefix.empty() ? absl::StrCat(" (did you mean '", near, "'?)")
                             : absl::StrCat(" (did you mean ", flag_prefix, near, "?)");
}

std::vector<std::string> AllFlagNames() {
  std::vector<std::string> out;
  for (const FlagSpec& f : kGlobalFlags) out.push_back(f.name);
  for (const FlagSpec& f : kCommandFlags) out.push_back(f.name);
  return out;
}

absl::StatusOr<bool> SwitchValue(absl::string_view name, absl::string_view v) {
  if (v == "true" || v == "yes" || v == "1") return true;
  if (v == "false" || v == "no" || v == "0") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, " is a switch: give it alone or =true / =false, not '", v, "'"));
}

absl::StatusOr<OutputFormat> ParseOutput(absl::string_view v) {
  for (OutputFormat f : kAllOutputs) {
    if (v == OutputFormatName(f)) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("-o must be table, wide, json or yaml, not '", v, "'"));
}

// `text` in lines of at most `width` columns; lines after the first start
// with `indent` spaces (the first is already at `first_column`).
std::string Wrap(absl::string_view text, size_t first_column, size_t indent, size_t width = 100) {
  std::string out;
  size_t column = first_column;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > indent && column + 1 + word.size() > width) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
    } else if (column > first_column || (column > indent && !out.empty())) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
  }
  return out;
}

std::string FlagUsage(const FlagSpec& f) {
  std::string s = f.short_name ? absl::StrCat("-", std::string(1, f.short_name), ", ") : "    ";
  absl::StrAppend(&s, "--", f.name);
  if (f.value_name) absl::StrAppend(&s, "=", f.value_name);
  return s;
}

void AppendFlags(std::string* out, const std::vector<const FlagSpec*>& flags) {
  size_t width = 0;
  for (const FlagSpec* f : flags) width = std::max(width, FlagUsage(*f).size());
  for (const FlagSpec* f : flags) {
    std::string extra;
    if (f->env) absl::StrAppend(&extra, "env ", f->env);
    if (f->fallback[0]) absl::StrAppend(&extra, extra.empty() ? "" : "; ", "default ", f->fallback);
    const std::string text =
        absl::StrCat(f->help, extra.empty() ? "" : absl::StrCat(" [", extra, "]"));
    absl::StrAppendFormat(out, "  %-*s  %s\n", static_cast<int>(width), FlagUsage(*f),
                          Wrap(text, width + 4, width + 4));
  }
}

std::string OutputsText(const std::vector<OutputFormat>& outputs) {
  std::vector<std::string> names;
  for (OutputFormat f : outputs) names.emplace_back(OutputFormatName(f));
  return absl::StrCat(absl::StrJoin(names, ", "), " (default ", names[0], ")");
}

std::string CommandUsage(const CommandSpec& c) {
  std::string s = absl::StrCat("shoalctl ", absl::StrJoin(c.words, " "));
  if (c.operands[0]) absl::StrAppend(&s, " ", c.operands);
  absl::StrAppend(&s, " [flags]");
  return s;
}

}  // namespace

absl::string_view OutputFormatName(OutputFormat format) {
  switch (format) {
    case OutputFormat::kTable:
      return "table";
    case OutputFormat::kWide:
      return "wide";
    case OutputFormat::kJson:
      return "json";
    case OutputFormat::kYaml:
      return "yaml";
  }
  return "table";
}

std::string Invocation::CommandName() const { return absl::StrJoin(command, " "); }

std::string Invocation::Get(absl::string_view flag) const {
  auto it = values.find(std::string(flag));
  return it == values.end() ? "" : it->second;
}

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

// A flag as given on the line, with its value ("true"/"false" for a switch).
using GivenFlags = std::vector<std::pair<const FlagSpec*, std::string>>;

// Splits the line into words (the command and its operands) and flags
// (--name=value, --name value, -o json, -ojson, switches); after "--"
// everything is a word. INVALID_ARGUMENT for an unknown flag (with the
// nearest name) or a value that is missing.
absl::Status SplitLine(const std::vector<std::string>& args, std::vector<std::string>* out_words,
                       GivenFlags* out_flags) {
  std::vector<std::string>& words = *out_words;
  GivenFlags& flags = *out_flags;
  bool operands_only = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (operands_only || a.size() < 2 || a[0] != '-') {
      words.push_back(a);
      continue;
    }
    if (a == "--") {
      operands_only = true;
      continue;
    }
    const FlagSpec* f = nullptr;
    std::string name;
    std::optional<std::string> value;
    if (a[1] == '-') {
      const size_t eq = a.find('=');
      name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) value = a.substr(eq + 1);
      f = FindFlag(name);
      if (f == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag --", name, Suggest(name, AllFlagNames(), "--")));
      }
    } else {
      // -o json, -o=json, -ojson, -h.
      f = FindShortFlag(a[1]);
      if (f == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a.substr(0, 2)));
      }
      name = f->name;
      if (a.size() > 2) value = a.substr(a[2] == '=' ? 3 : 2);
    }
    if (f->value_name == nullptr) {
      absl::StatusOr<bool> on = SwitchValue(name, value.value_or("true"));
      if (!on.ok()) return on.status();
      flags.emplace_back(f, *on ? "true" : "false");
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (--", name, "=", f->value_name, ")"));
      }
      value = args[++i];
    }
    flags.emplace_back(f, *value);
  }
  return absl::OkStatus();
}

// The command: the longest known sequence of leading words; the rest are
// its operands.
absl::Status TakeCommand(const std::vector<std::string>& words, Invocation* out) {
  Invocation& inv = *out;
  const std::vector<std::string> tops = TopWords();
  if (!words.empty()) {
    if (std::find(tops.begin(), tops.end(), words[0]) == tops.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown command '", words[0], "'", Suggest(words[0], tops)));
    }
    inv.command.push_back(words[0]);
    const std::vector<std::string> subs = SubWords(words[0]);
    if (!subs.empty()) {
      if (words.size() < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat(words[0], " needs a command: ", absl::StrJoin(subs, ", ")));
      }
      if (std::find(subs.begin(), subs.end(), words[1]) == subs.end()) {
        return absl::InvalidArgumentError(absl::StrCat("unknown command '", words[0], " ", words[1],
                                                       "'", Suggest(words[1], subs)));
      }
      inv.command.push_back(words[1]);
    }
    inv.operands.assign(words.begin() + inv.command.size(), words.end());
  }
  return absl::OkStatus();
}

// The flags given, each checked to belong to the command (or be global),
// into `inv`; -o and --json agree.
absl::Status TakeFlags(const GivenFlags& flags, const CommandSpec* spec, Invocation* out) {
  Invocation& inv = *out;
  for (const auto& [f, value] : flags) {
    const std::string name = f->name;
    if (!IsGlobal(f)) {
      const bool ours = spec != nullptr && std::find(spec->flags.begin(), spec->flags.end(),
                                                     name) != spec->flags.end();
      if (!ours) {
        std::vector<std::string> owners;
        for (const CommandSpec& c : Commands()) {
          if (std::find(c.flags.begin(), c.flags.end(), name) != c.flags.end()) {
            owners.push_back(absl::StrJoin(c.words, " "));
          }
        }
        return absl::InvalidArgumentError(absl::StrCat(
            "--", name, " is not a flag of '", spec ? absl::StrJoin(spec->words, " ") : "shoalctl",
            "' (it belongs to ", absl::StrJoin(owners, ", "), ")"));
      }
    }
    if (name == "help") {
      inv.help = value == "true";
    } else if (name == "version") {
      inv.version = value == "true";
    } else if (name == "json") {
      if (value == "true") {
        if (inv.output_given && inv.output != OutputFormat::kJson) {
          return absl::InvalidArgumentError("--json is -o json: give one format");
        }
        inv.output = OutputFormat::kJson;
        inv.output_given = true;
      }
    } else if (name == "output") {
      absl::StatusOr<OutputFormat> o = ParseOutput(value);
      if (!o.ok()) return o.status();
      if (inv.output_given && inv.output != *o) {
        return absl::InvalidArgumentError("two output formats given: give one -o");
      }
      inv.output = *o;
      inv.output_given = true;
    } else {
      inv.values[name] = value;
      inv.given.insert(name);
    }
  }
  return absl::OkStatus();
}

// The environment, then the defaults, for the flags not on the line.
void FillDefaults(const CommandSpec* spec, const EnvLookup& env, Invocation* out) {
  Invocation& inv = *out;
  std::vector<const FlagSpec*> known;
  for (const FlagSpec& f : kGlobalFlags) known.push_back(&f);
  if (spec) {
    for (const char* n : spec->flags) known.push_back(FindFlag(n));
  }
  for (const FlagSpec* f : known) {
    if (f->value_name == nullptr || std::string(f->name) == "output") continue;
    if (inv.given.count(f->name)) continue;
    if (f->env != nullptr) {
      if (std::optional<std::string> v = env(f->env); v.has_value() && !v->empty()) {
        inv.values[f->name] = *v;
        inv.given.insert(f->name);
        continue;
      }
    }
    inv.values[f->name] = f->fallback;
  }
  if (spec && !inv.output_given) inv.output = spec->outputs[0];
}

}  // namespace

absl::StatusOr<Invocation> ParseCommandLine(const std::vector<std::string>& args,
                                            const EnvLookup& env) {
  Invocation inv;
  std::vector<std::string> words;
  GivenFlags flags;
  RETURN_IF_ERROR(SplitLine(args, &words, &flags));
  RETURN_IF_ERROR(TakeCommand(words, &inv));
  const CommandSpec* spec = inv.command.empty() ? nullptr : FindCommand(inv.command);
  RETURN_IF_ERROR(TakeFlags(flags, spec, &inv));
  FillDefaults(spec, env, &inv);
  if (spec && !inv.help) {
    if (inv.operands.size() < spec->min_operands || inv.operands.size() > spec->max_operands) {
      return absl::InvalidArgumentError(
          inv.operands.size() < spec->min_operands
              ? absl::StrCat(inv.CommandName(), " needs ", spec->operands)
              : absl::StrCat("unexpected argument '", inv.operands[spec->max_operands],
                             "' (usage: ", CommandUsage(*spec), ")"));
    }
    if (inv.command == std::vector<std::string>{"completion"} && inv.operands[0] != "bash") {
      return absl::InvalidArgumentError(
          absl::StrCat("completion is for bash only, not '", inv.operands[0], "'"));
    }
  }
  return inv;
}

std::vector<OutputFormat> OutputsOf(const std::vector<std::string>& command) {
  const CommandSpec* spec = FindCommand(command);
  return spec ? spec->outputs : std::vector<OutputFormat>{OutputFormat::kTable};
}

absl::Status CheckOutput(const Invocation& inv) {
  const std::vector<OutputFormat> outputs = OutputsOf(inv.command);
  if (std::find(outputs.begin(), outputs.end(), inv.output) != outputs.end()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      inv.CommandName(), " prints ", OutputsText(outputs), ", not ", OutputFormatName(inv.output)));
}

absl::StatusOr<absl::Duration> DurationFlag(const Invocation& inv, absl::string_view flag,
                                            absl::Duration fallback) {
  const std::string v = inv.Get(flag);
  if (v.empty()) return fallback;
  absl::Duration d;
  if (!absl::ParseDuration(v, &d) || d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be a positive duration such as 5s or 10m, not '", v, "'"));
  }
  return d;
}

absl::StatusOr<std::string> HelpText(const std::vector<std::string>& command) {
  std::vector<const FlagSpec*> globals;
  for (const FlagSpec& f : kGlobalFlags) globals.push_back(&f);
  if (command.empty()) {
    std::string out =
        "shoalctl operates a Shoal training run: its status, its progress, its config and its "
        "checkpoints.\n\nUsage: shoalctl COMMAND [flags]   (flags may go anywhere on the line)\n"
        "\nCommands:\n";
    size_t width = 0;
    for (const CommandSpec& c : Commands()) {
      width = std::max(width, absl::StrJoin(c.words, " ").size() + 1 + strlen(c.operands));
    }
    for (const CommandSpec& c : Commands()) {
      std::string name = absl::StrJoin(c.words, " ");
      if (c.operands[0]) absl::StrAppend(&name, " ", c.operands);
      absl::StrAppendFormat(&out, "  %-*s  %s\n", static_cast<int>(width), name, c.summary);
    }
    absl::StrAppend(&out,
                    "\nGlobal flags (every command; a flag beats its environment variable, "
                    "which beats the default):\n");
    AppendFlags(&out, globals);
    absl::StrAppend(&out,
                    "\nExamples:\n"
                    "  shoalctl status --coordinator=127.0.0.1:50051\n"
                    "  shoalctl watch -o json | jq .round\n"
                    "  SHOAL_STORE=127.0.0.1:50052 shoalctl checkpoints list -o yaml\n"
                    "\nRun 'shoalctl help COMMAND' (or 'shoalctl COMMAND --help') for a command's "
                    "flags and output formats.\n");
    return out;
  }
  std::vector<std::string> words = command;
  const CommandSpec* spec = FindCommand(words);
  if (spec == nullptr && words.size() == 1 && !SubWords(words[0]).empty()) {
    // `help checkpoints`: each of its commands.
    std::string out = absl::StrCat("shoalctl ", words[0], ": ", "\n");
    for (const CommandSpec& c : Commands()) {
      if (c.words[0] != words[0]) continue;
      absl::StrAppendFormat(&out, "  %-40s  %s\n", CommandUsage(c), c.summary);
    }
    absl::StrAppend(&out, "\nRun 'shoalctl help ", words[0],
                    " COMMAND' for a command's flags and output formats.\n");
    return out;
  }
  if (spec == nullptr) {
    const std::string joined = absl::StrJoin(words, " ");
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command '", joined, "'", Suggest(words[0], TopWords())));
  }
  std::string out = absl::StrCat(CommandUsage(*spec), "\n\n", spec->summary, "\n");
  if (spec->details[0]) absl::StrAppend(&out, Wrap(spec->details, 0, 0), "\n");
  absl::StrAppend(&out, "Output: ", OutputsText(spec->outputs), "\n");
  if (!spec->flags.empty()) {
    std::vector<const FlagSpec*> own;
    for (const char* n : spec->flags) own.push_back(FindFlag(n));
    absl::StrAppend(&out, "\nFlags:\n");
    AppendFlags(&out, own);
  }
  absl::StrAppend(&out, "\nGlobal flags:\n");
  AppendFlags(&out, globals);
  return out;
}

std::string BashCompletion() {
  std::vector<std::string> globals, valued;
  for (const FlagSpec& f : kGlobalFlags) {
    globals.push_back(absl::StrCat("--", f.name));
    if (f.short_name) globals.push_back(absl::StrCat("-", std::string(1, f.short_name)));
  }
  const auto add_valued = [&valued](const FlagSpec& f) {
    if (f.value_name == nullptr) return;
    valued.push_back(absl::StrCat("--", f.name));
    if (f.short_name) valued.push_back(absl::StrCat("-", std::string(1, f.short_name)));
  };
  for (const FlagSpec& f : kGlobalFlags) add_valued(f);
  for (const FlagSpec& f : kCommandFlags) add_valued(f);
  std::string out =
      "# bash completion for shoalctl: source <(shoalctl completion bash)\n"
      "_shoalctl() {\n"
      "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
      "  local cmd=\"\" sub=\"\" i w skip=0\n";
  absl::StrAppend(&out, "  local valued=\" ", absl::StrJoin(valued, " "), " \"\n");
  absl::StrAppend(&out,
                  "  case \"$prev\" in\n"
                  "    -o|--output) COMPREPLY=($(compgen -W \"table wide json yaml\" -- \"$cur\"));"
                  " return ;;\n"
                  "    --token_file|--tls_ca|--tls_cert|--tls_key|--out) "
                  "COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
                  "  esac\n"
                  "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
                  "    w=\"${COMP_WORDS[i]}\"\n"
                  "    if ((skip)); then skip=0; continue; fi\n"
                  "    case \"$w\" in\n"
                  "      -*) [[ \"$w\" != *=* && \"$valued\" == *\" $w \"* ]] && skip=1 ;;\n"
                  "      *) if [[ -z \"$cmd\" ]]; then cmd=\"$w\"; elif [[ -z \"$sub\" ]]; then "
                  "sub=\"$w\"; fi ;;\n"
                  "    esac\n"
                  "  done\n"
                  "  local words=\"\"\n"
                  "  if [[ \"$cur\" == -* ]]; then\n");
  absl::StrAppend(&out, "    words=\"", absl::StrJoin(globals, " "), "\"\n");
  absl::StrAppend(&out, "    case \"$cmd $sub\" in\n");
  for (const CommandSpec& c : Commands()) {
    if (c.flags.empty()) continue;
    std::vector<std::string> own;
    for (const char* n : c.flags) own.push_back(absl::StrCat("--", n));
    const std::string pattern = c.words.size() > 1
                                    ? absl::StrCat("\"", absl::StrJoin(c.words, " "), "\"")
                                    : absl::StrCat("\"", c.words[0], " \"*");
    absl::StrAppend(&out, "      ", pattern, ") words=\"$words ", absl::StrJoin(own, " "),
                    "\" ;;\n");
  }
  absl::StrAppend(&out, "    esac\n");
  absl::StrAppend(&out, "  elif [[ -z \"$cmd\" || \"$cmd\" == help ]]; then\n    words=\"",
                  absl::StrJoin(TopWords(), " "), "\"\n");
  for (const std::string& top : TopWords()) {
    const std::vector<std::string> subs = SubWords(top);
    if (subs.empty()) continue;
    absl::StrAppend(&out, "  elif [[ \"$cmd\" == ", top, " && -z \"$sub\" ]]; then\n    words=\"",
                    absl::StrJoin(subs, " "), "\"\n");
  }
  absl::StrAppend(&out,
                  "  elif [[ \"$cmd\" == completion && -z \"$sub\" ]]; then\n    words=\"bash\"\n"
                  "  fi\n"
                  "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
                  "}\n"
                  "complete -F _shoalctl shoalctl\n");
  return out;
}

}  // namespace shoal::ctl
