// Terminal-safe output (tools/shoalctl/terminal_text.h): a status whose
// names, reasons, zones and texts hold terminal control sequences goes
// through every formatter shoalctl has, in every form; the table forms
// print no character that acts on a terminal but their own newlines, and
// the JSON and YAML forms carry each such character escaped and read back
// as the same strings.
#include "tools/shoalctl/terminal_text.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/printable.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/shoalctl/checkpoints_cmd.h"
#include "tools/shoalctl/diagnose.h"
#include "tools/shoalctl/status_format.h"
#include "tools/shoalctl/yaml_output.h"

namespace shoal::ctl {
namespace {

using ::testing::HasSubstr;

constexpr char kRetitle[] = "\x1b]0;pwned\x07";
constexpr char kClear[] = "\x1b[2J\x1b[H";
constexpr char kBidi[] =
    "evil\xe2\x80\xae"
    "txt";
constexpr char kCsi8[] =
    "\xc2\x9b"
    "31m";

// Lines a terminal shows as written: nothing that is not shown but '\n'.
void ExpectTerminalSafe(const std::string& text, const std::string& what) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    EXPECT_FALSE(FindUnprintable(line).has_value()) << what << ": " << line;
  }
}

shoal::v1::RunStatus HostileStatus(bool gossip) {
  shoal::v1::RunStatus s;
  s.set_run_id(std::string("run") + kClear);
  s.set_phase(shoal::v1::TRAINING);
  s.set_round(3);
  s.set_last_completed_round(2);
  s.set_detail(std::string("waiting for ") + kRetitle);
  s.set_error(std::string("stop\nFAKE LINE ") + kCsi8);
  s.set_base_fallback(kBidi);
  s.set_model_hash(std::string("ab") + kClear);
  if (gossip) s.mutable_config()->mutable_gossip();
  s.mutable_config()->mutable_trust()->set_audit_rate(0.5);
  s.mutable_config()->mutable_checkpoints()->set_store(std::string("store") + kRetitle);
  s.set_checkpoint_id(std::string("ck") + kBidi);
  const std::vector<std::string> states = {"training", "left", "lost", "finished"};
  for (int i = 0; i < 4; ++i) {
    shoal::v1::WorkerStatus* w = s.add_workers();
    w->set_id("w" + std::to_string(i + 1));
    w->set_name(std::string(kRetitle) + "name\n| w9 fake row" + std::to_string(i));
    w->set_address(std::string("10.0.0.1:1") + kClear);
    w->set_state(states[i]);
    w->set_reason(std::string("bye") + kCsi8 + "\x07");
    w->set_zone(std::string("eu/") + kBidi);
    w->set_role(i == 0 ? "supernode" : "");
    w->set_model_round(2);
    w->set_model_hash(std::string("cd") + kClear);
    w->set_last_partner(kRetitle);
    w->set_final_error(kClear);
    w->set_outbound_only(i == 0);
    w->set_outbound_reason(kRetitle);
    w->add_score_reasons(std::string("audit ") + kClear);
    w->set_rounds_late(1);
    w->set_wire_round(2);
    w->set_train_share(0.5);
    w->set_relayed_by(kBidi);
    w->set_step_seconds(0.01);
  }
  shoal::v1::ZoneStatus* z = s.add_zones();
  z->set_path(std::string("eu/") + kClear);
  z->set_supernode("w1");
  z->set_reason(kRetitle);
  z->set_cause(kCsi8);
  z->set_challenger(kBidi);
  shoal::v1::Ban* b = s.add_bans();
  b->set_worker_id("w3");
  b->set_name(kRetitle);
  b->set_reason(kClear);
  shoal::v1::RoundSummary* r = s.add_recent_rounds();
  r->set_round(2);
  r->set_model_hash(std::string("ef") + kRetitle);
  return s;
}

TEST(TerminalTextTest, EveryTableFormatterPrintsNoControlCharacter) {
  for (bool gossip : {false, true}) {
    const shoal::v1::RunStatus raw = HostileStatus(gossip);
    const shoal::v1::RunStatus shown = ForTerminal(raw);
    for (bool wide : {false, true}) {
      const std::string table = FormatStatusTable(shown, wide);
      ExpectTerminalSafe(table, wide ? "wide" : "table");
      // A name's newline cannot forge a row: it is written \x0a.
      EXPECT_THAT(table, ::testing::Not(HasSubstr("\n| w9 fake row")));
      if (!gossip) EXPECT_THAT(table, HasSubstr("\\x1b]0;pwned\\x07name\\x0a| w9 fake row"));
    }
    ExpectTerminalSafe(FormatZoneTree(shown), "zone tree");
    ExpectTerminalSafe(FormatGossipLine(shown), "gossip line");
    ExpectTerminalSafe(FormatConsensus(shown), "consensus");
    ExpectTerminalSafe(FormatSummaryLine(shown, 1.0), "summary");
    ExpectTerminalSafe(FormatRoundLine(shown.recent_rounds(0), 5), "round line");
    absl::StatusOr<std::vector<Finding>> explain = ExplainWorker(shown, "w1", std::nullopt);
    ASSERT_TRUE(explain.ok()) << explain.status();
    ExpectTerminalSafe(FormatFindings(*explain), "explain");
    DoctorFacts facts;
    facts.coordinator_address = "127.0.0.1:1";
    ExpectTerminalSafe(FormatFindings(Doctor(shown, facts)), "doctor");
    // The last pass of every printed text as well.
    ExpectTerminalSafe(TerminalText(FormatStatusTable(raw, true)), "unescaped input, last pass");
  }
}

TEST(TerminalTextTest, JsonAndYamlCarryTheCharactersEscapedAndReadBackTheSame) {
  const shoal::v1::RunStatus raw = HostileStatus(false);
  const std::string json = DocumentText(FormatStatusJson(raw));
  ExpectTerminalSafe(json, "json");
  EXPECT_THAT(json, HasSubstr("\\u001b]0;pwned\\u0007"));
  EXPECT_THAT(json, HasSubstr("\\u202e"));
  EXPECT_THAT(json, HasSubstr("\\u009b"));
  shoal::v1::RunStatus back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(back, raw));

  absl::StatusOr<std::string> yaml = JsonToYaml(FormatStatusJson(raw));
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  const std::string shown_yaml = DocumentText(*yaml);
  ExpectTerminalSafe(shown_yaml, "yaml");
  const YAML::Node doc = YAML::Load(shown_yaml);
  EXPECT_EQ(doc["workers"][0]["name"].as<std::string>(), raw.workers(0).name());
  EXPECT_EQ(doc["zones"][0]["path"].as<std::string>(), raw.zones(0).path());
  EXPECT_EQ(doc["base_fallback"].as<std::string>(), raw.base_fallback());

  for (const std::string& line :
       {FormatRoundJsonLine(raw.recent_rounds(0), 5), FormatFinishedJsonLine(raw, 2.0)}) {
    const std::string shown = DocumentText(line);
    ExpectTerminalSafe(shown, "json line");
    google::protobuf::Struct parsed;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(shown, &parsed).ok()) << shown;
  }
  const std::string findings =
      DocumentText(FormatFindingsJson(*ExplainWorker(raw, "w1", std::nullopt)));
  ExpectTerminalSafe(findings, "findings json");
}

TEST(TerminalTextTest, CheckpointFormsEscapeWhatWorkersUploaded) {
  shoal::v1::CheckpointInfo c;
  c.set_id(std::string("ck") + kRetitle);
  c.set_run_id(std::string("run") + kClear);
  c.set_damage(kBidi);
  ExpectTerminalSafe(FormatCheckpointTable({ForTerminal(c)}), "checkpoints list");
  ExpectTerminalSafe(DocumentText(FormatCheckpointsJson({c})), "checkpoints list -o json");
  shoal::v1::Manifest m;
  m.set_id(c.id());
  m.set_run_id(c.run_id());
  m.set_worker_id(kCsi8);
  auto* layer = m.add_layers();
  layer->set_name(std::string("fc") + kClear);
  layer->set_dtype(kRetitle);
  ExpectTerminalSafe(FormatManifest(ForTerminal(m), EscapeUnprintable(kBidi)), "checkpoints show");
  ExpectTerminalSafe(DocumentText(FormatManifestJson(m, kBidi)), "checkpoints show -o json");
}

TEST(TerminalTextTest, PrintableTextIsLeftAsItIs) {
  shoal::v1::RunStatus s;
  s.add_workers()->set_name("trainer ünï 名前 🐟 \"q\" \\ $(x) %s");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(ForTerminal(s), s));
  EXPECT_EQ(TerminalText("a\nb ü\n"), "a\nb ü\n");
}

}  // namespace
}  // namespace shoal::ctl
