// shoalctl's one command line (tools/shoalctl/cli.h): global flags anywhere,
// one meaning per flag, the environment, -o, help, suggestions, and the bash
// completion script run by a real bash. Also -o yaml's conversion.
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags_usage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"
#include "tools/shoalctl/cli.h"
#include "tools/shoalctl/yaml_output.h"

namespace shoal::ctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<Invocation> Parse(std::vector<std::string> args,
                                 std::map<std::string, std::string> env = {}) {
  return ParseCommandLine(args, Env(std::move(env)));
}

TEST(ShoalctlCliTest, GlobalFlagsGoAnywhereOnTheLine) {
  for (const auto& line :
       std::vector<std::vector<std::string>>{{"--coordinator=h:1", "-o", "yaml", "status"},
                                             {"status", "--coordinator", "h:1", "-oyaml"},
                                             {"-o=yaml", "status", "--coordinator=h:1"}}) {
    absl::StatusOr<Invocation> inv = Parse(line);
    ASSERT_TRUE(inv.ok()) << inv.status();
    EXPECT_THAT(inv->command, ElementsAre("status"));
    EXPECT_EQ(inv->Get("coordinator"), "h:1");
    EXPECT_EQ(inv->output, OutputFormat::kYaml);
  }
  absl::StatusOr<Invocation> inv = Parse({"--store", "s:2", "checkpoints", "list", "--run_id=r"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_THAT(inv->command, ElementsAre("checkpoints", "list"));
  EXPECT_EQ(inv->Get("store"), "s:2");
  EXPECT_EQ(inv->Get("run_id"), "r");
}

TEST(ShoalctlCliTest, TheLineBeatsTheEnvironmentWhichBeatsTheDefault) {
  const std::map<std::string, std::string> env = {{"SHOAL_COORDINATOR", "env:1"},
                                                  {"SHOAL_STORE", "env:2"},
                                                  {"SHOAL_TOKEN_FILE", "/run/token"},
                                                  {"SHOAL_TLS_CA", "/ca.pem"}};
  absl::StatusOr<Invocation> inv = Parse({"status"}, env);
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ(inv->Get("coordinator"), "env:1");
  EXPECT_EQ(inv->Get("store"), "env:2");
  EXPECT_EQ(inv->Get("token_file"), "/run/token");
  EXPECT_EQ(inv->Get("tls_ca"), "/ca.pem");
  inv = Parse({"status", "--coordinator=flag:1"}, env);
  EXPECT_EQ(inv->Get("coordinator"), "flag:1");
  inv = Parse({"status"});
  EXPECT_EQ(inv->Get("coordinator"), "127.0.0.1:50051");
  EXPECT_EQ(inv->Get("store"), "127.0.0.1:50052");
  EXPECT_EQ(inv->Get("token_file"), "");
  // An empty variable is no value.
  inv = Parse({"status"}, {{"SHOAL_COORDINATOR", ""}});
  EXPECT_EQ(inv->Get("coordinator"), "127.0.0.1:50051");
}

TEST(ShoalctlCliTest, EachCommandHasItsDefaultOutputAndRefusesOthers) {
  absl::StatusOr<Invocation> inv = Parse({"config"});
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ(inv->output, OutputFormat::kJson);
  EXPECT_TRUE(CheckOutput(*inv).ok());
  inv = Parse({"config", "-o", "table"});
  ASSERT_TRUE(inv.ok());
  EXPECT_THAT(CheckOutput(*inv).message(), HasSubstr("config prints json, yaml"));
  inv = Parse({"watch", "-o", "yaml"});
  ASSERT_TRUE(inv.ok());
  EXPECT_FALSE(CheckOutput(*inv).ok());
  inv = Parse({"watch", "--json"});
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ(inv->output, OutputFormat::kJson);
  EXPECT_TRUE(CheckOutput(*inv).ok());
  inv = Parse({"status", "--json=false"});
  EXPECT_EQ(inv->output, OutputFormat::kTable);
  for (const char* yes : {"--json=yes", "--json=true", "--json=1", "--json"}) {
    inv = Parse({"checkpoints", "list", yes});
    ASSERT_TRUE(inv.ok()) << yes;
    EXPECT_EQ(inv->output, OutputFormat::kJson) << yes;
  }
  EXPECT_FALSE(Parse({"status", "-o", "xml"}).ok());
  EXPECT_FALSE(Parse({"status", "-o", "json", "-o", "yaml"}).ok());
  EXPECT_FALSE(Parse({"status", "--json=maybe"}).ok());
}

TEST(ShoalctlCliTest, OneMeaningPerFlag) {
  // --timeout is watch's give-up time; a call's deadline is --rpc_timeout.
  absl::StatusOr<Invocation> inv = Parse({"checkpoints", "list", "--timeout=2s"});
  ASSERT_FALSE(inv.ok());
  EXPECT_THAT(inv.status().message(),
              HasSubstr("--timeout is not a flag of 'checkpoints list' (it belongs to watch)"));
  inv = Parse({"checkpoints", "list", "--rpc_timeout=2s"});
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ(*DurationFlag(*inv, "rpc_timeout", absl::Seconds(10)), absl::Seconds(2));
  inv = Parse({"checkpoints", "list"});
  EXPECT_EQ(*DurationFlag(*inv, "rpc_timeout", absl::Seconds(10)), absl::Seconds(10));
  inv = Parse({"status", "--rpc_timeout=soon"});
  ASSERT_TRUE(inv.ok());
  EXPECT_THAT(DurationFlag(*inv, "rpc_timeout", absl::Seconds(5)).status().message(),
              HasSubstr("--rpc_timeout must be a positive duration"));
  inv = Parse({"watch"});
  EXPECT_EQ(*DurationFlag(*inv, "timeout", absl::Seconds(1)), absl::Minutes(30));
}

TEST(ShoalctlCliTest, UnknownFlagsAndCommandsNameTheNearest) {
  absl::StatusOr<Invocation> inv = Parse({"status", "--coordinater=h:1"});
  EXPECT_THAT(inv.status().message(),
              HasSubstr("unknown flag --coordinater (did you mean --coordinator?)"));
  inv = Parse({"stauts"});
  EXPECT_THAT(inv.status().message(),
              HasSubstr("unknown command 'stauts' (did you mean 'status'?)"));
  inv = Parse({"checkpoints", "lsit"});
  EXPECT_THAT(inv.status().message(), HasSubstr("(did you mean 'list'?)"));
  inv = Parse({"checkpoints"});
  EXPECT_THAT(inv.status().message(), HasSubstr("checkpoints needs a command: list, show"));
  inv = Parse({"status", "--frobnicate"});
  EXPECT_THAT(inv.status().message(), HasSubstr("unknown flag --frobnicate"));
  EXPECT_THAT(inv.status().message(), Not(HasSubstr("did you mean")));
  inv = Parse({"status", "--coordinator"});
  EXPECT_THAT(inv.status().message(), HasSubstr("--coordinator needs a value"));
  inv = Parse({"status", "extra"});
  EXPECT_THAT(inv.status().message(), HasSubstr("unexpected argument 'extra'"));
}

TEST(ShoalctlCliTest, CheckpointIdsAsOperands) {
  absl::StatusOr<Invocation> inv = Parse({"checkpoints", "show", "run-r4", "-o", "json"});
  ASSERT_TRUE(inv.ok());
  EXPECT_THAT(inv->operands, ElementsAre("run-r4"));
  EXPECT_FALSE(Parse({"checkpoints", "show", "a", "b"}).ok());
  // After `--` a word that starts with '-' is an operand.
  inv = Parse({"checkpoints", "delete", "--", "-odd-id"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_THAT(inv->operands, ElementsAre("-odd-id"));
}

TEST(ShoalctlCliTest, HelpDescribesEveryFlagOfEveryCommand) {
  absl::StatusOr<std::string> overview = HelpText({});
  ASSERT_TRUE(overview.ok());
  for (const char* command :
       {"status", "watch", "config", "explain WORKER", "doctor", "checkpoints list",
        "checkpoints show", "checkpoints export", "checkpoints delete", "completion", "help"}) {
    EXPECT_THAT(*overview, HasSubstr(command));
  }
  for (const char* env : {"SHOAL_COORDINATOR", "SHOAL_STORE", "SHOAL_TOKEN_FILE", "SHOAL_TLS_CA",
                          "SHOAL_TLS_CERT", "SHOAL_TLS_KEY", "SHOAL_TLS_SERVER_NAME"}) {
    EXPECT_THAT(*overview, HasSubstr(env));
  }
  const std::map<std::vector<std::string>, std::vector<std::string>> own = {
      {{"watch"}, {"--timeout=DURATION", "--interval=DURATION", "table, json (default table)"}},
      {{"checkpoints", "list"}, {"--run_id=RUN"}},
      {{"checkpoints", "export"}, {"--id=ID", "--out=FILE", "torch.load"}},
      {{"status"}, {"table, wide, json, yaml (default table)"}},
      {{"config"}, {"json, yaml (default json)"}},
  };
  for (const auto& [command, expected] : own) {
    absl::StatusOr<std::string> text = HelpText(command);
    ASSERT_TRUE(text.ok());
    for (const std::string& e : expected) EXPECT_THAT(*text, HasSubstr(e)) << *text;
    for (const char* global :
         {"--coordinator=ADDR", "--store=ADDR", "-o, --output=FORMAT", "--rpc_timeout=DURATION",
          "--token_file=FILE", "--tls_ca=FILE", "--tls_cert=FILE", "--tls_key=FILE",
          "--tls_server_name=NAME", "-h, --help", "--version", "--json"}) {
      EXPECT_THAT(*text, HasSubstr(global)) << *text;
    }
  }
  EXPECT_THAT(*HelpText({"checkpoints"}), HasSubstr("shoalctl checkpoints export [ID] [flags]"));
  EXPECT_THAT(HelpText({"stauts"}).status().message(), HasSubstr("did you mean 'status'"));
  absl::StatusOr<Invocation> inv = Parse({"watch", "--help"});
  ASSERT_TRUE(inv.ok());
  EXPECT_TRUE(inv->help);
  inv = Parse({"-h", "checkpoints", "show"});
  ASSERT_TRUE(inv.ok());
  EXPECT_TRUE(inv->help);
  EXPECT_THAT(inv->command, ElementsAre("checkpoints", "show"));
}

// Completes the line `words` (the last word is the one being typed) with
// the generated script in a real bash; returns COMPREPLY.
std::vector<std::string> Complete(const std::vector<std::string>& words) {
  shoal::testing::TempDir dir;
  const std::string script = dir.path() + "/completion.bash";
  std::ofstream(script) << BashCompletion();
  std::string line = "shoalctl";
  for (const std::string& w : words) absl::StrAppend(&line, " '", w, "'");
  const std::string driver = dir.path() + "/driver.bash";
  std::ofstream(driver) << "source " << script << "\n"
                        << "COMP_WORDS=(" << line << ")\n"
                        << "COMP_CWORD=" << words.size() << "\n"
                        << "_shoalctl\n"
                        << "printf '%s\\n' \"${COMPREPLY[@]}\"\n";
  FILE* p = popen(("bash " + driver).c_str(), "r");
  std::vector<std::string> out;
  char buf[512];
  std::string current;
  while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) {
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    if (!s.empty()) out.push_back(s);
  }
  if (p != nullptr) pclose(p);
  return out;
}

TEST(ShoalctlCliTest, BashCompletionCompletesCommandsFlagsAndFormats) {
  EXPECT_THAT(Complete({"st"}), ElementsAre("status"));
  EXPECT_THAT(Complete({"checkpoints", "e"}), ElementsAre("export"));
  EXPECT_THAT(Complete({"status", "-o", "y"}), ElementsAre("yaml"));
  EXPECT_THAT(Complete({"watch", "--tim"}), ElementsAre("--timeout"));
  EXPECT_THAT(Complete({"checkpoints", "list", "--run"}), ElementsAre("--run_id"));
  // A flag's value is not taken for a command word.
  EXPECT_THAT(Complete({"--coordinator", "h:1", "checkpoints", "l"}), ElementsAre("list"));
  EXPECT_THAT(Complete({"status", "--tim"}), ElementsAre());  // watch's flag only
  EXPECT_THAT(Complete({"help", "wa"}), ElementsAre("watch"));
}

TEST(ShoalctlYamlTest, KeepsOrderAndTypes) {
  absl::StatusOr<std::string> yaml = JsonToYaml(
      R"json({"run_id": "r1", "round": "12", "phase": "TRAINING", "members": 3, "ok": true,
          "flag": "true", "none": null, "empty": "", "workers": [{"id": "w1", "acc": 0.88}],
          "nested": {}, "text": "a: b # c", "when": "2026-11-28T17:21:57.002Z",
          "addr": "127.0.0.1:50051", "hash": "0a1b", "id": "w1 (alice)"})json");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_THAT(*yaml, HasSubstr("run_id: r1\nround: \"12\"\nphase: TRAINING\nmembers: 3\nok: true\n"
                               "flag: \"true\"\n"));
  EXPECT_THAT(*yaml, HasSubstr("empty: \"\""));
  EXPECT_THAT(*yaml, HasSubstr("workers:\n  - id: w1\n    acc: 0.88"));
  EXPECT_THAT(*yaml, HasSubstr("none: ~"));
  EXPECT_THAT(*yaml, HasSubstr("text: \"a: b # c\""));
  EXPECT_THAT(*yaml, HasSubstr("when: \"2026-11-28T17:21:57.002Z\""));
  EXPECT_THAT(*yaml, HasSubstr("addr: \"127.0.0.1:50051\""));
  EXPECT_THAT(*yaml, HasSubstr("hash: \"0a1b\""));
  EXPECT_THAT(*yaml, HasSubstr("id: \"w1 (alice)\""));
  EXPECT_FALSE(JsonToYaml("{\"unclosed\": [").ok());
}

// The binaries' own flags (common/flags_usage.h): an unknown flag names the
// nearest registered one. This test binary registers none of its own, so
// the check uses Abseil's built-in ones.
TEST(UnknownFlagMessagesTest, NamesTheNearestFlag) {
  EXPECT_TRUE(UnknownFlagMessages({"--helpfull", "--flagfile", "f", "--", "--x"}).empty());
  const std::vector<std::string> m = UnknownFlagMessages({"--flagfil=x", "--zzzzzz"});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], "unknown flag --flagfil (did you mean --flagfile?)");
  EXPECT_EQ(m[1], "unknown flag --zzzzzz");
  EXPECT_EQ(NearestWord("coordinater", {"coordinator", "checkpoint_store"}), "coordinator");
  EXPECT_EQ(NearestWord("min_part", {"min_participants", "max_joins"}), "min_participants");
  EXPECT_EQ(NearestWord("qqq", {"coordinator"}), "");
}

}  // namespace
}  // namespace shoal::ctl
