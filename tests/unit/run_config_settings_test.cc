// One source for the run settings (issue 51): RunConfig's `setting` options
// (protos/shoal/v1/coordinator.proto) make the coordinator's flags
// (generated into this test as into shoal-coordinator), their merge with the
// config file, the start log and docs/CONFIG.md's tables. Every flag
// parses, reads back from the file form and shows in what `shoalctl config`
// prints; the flags at their defaults give the defaults the docs promise;
// the docs in the tree are the generated ones.
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/run_config.h"
#include "common/run_config_doc.h"
#include "common/run_config_file.h"
#include "common/run_config_flags.h"
#include "common/run_config_schema.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace shoal {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using shoal::v1::RunConfig;
using ::testing::HasSubstr;

// The flags are read as the coordinator reads them, after its command line
// was parsed (here: the program's name alone).
class ParsedCommandLine : public ::testing::Environment {
 public:
  void SetUp() override {
    static char name[] = "run_config_settings_test";
    static char* argv[] = {name, nullptr};
    absl::ParseCommandLine(1, argv);
  }
};
::testing::Environment* const kParsed = ::testing::AddGlobalTestEnvironment(new ParsedCommandLine);

// Sets flags for one scope and puts back what they were.
class ScopedFlags {
 public:
  ScopedFlags() = default;
  ScopedFlags(const ScopedFlags&) = delete;
  ScopedFlags& operator=(const ScopedFlags&) = delete;
  ~ScopedFlags() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      std::string error;
      EXPECT_TRUE(absl::FindCommandLineFlag(it->first)->ParseFrom(it->second, &error)) << error;
    }
  }
  // False (with the error in `*error`) when the flag does not parse it.
  bool Set(const std::string& name, const std::string& value, std::string* error) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      *error = "no flag --" + name;
      return false;
    }
    saved_.emplace_back(name, flag->CurrentValue());
    return flag->ParseFrom(value, error);
  }

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

bool Same(const Message& a, const Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

RunConfig Merged() {
  absl::StatusOr<MergedRunConfig> merged = MergeRunConfig(RunConfigFlagsFromCommandLine(), nullptr);
  EXPECT_TRUE(merged.ok()) << merged.status();
  return merged.ok() ? merged->config : RunConfig();
}

// The key's value in `c` as text (repeated fields joined), for comparisons.
std::string KeyText(const SettingInfo& s, const RunConfig& c) {
  if (s.field() == nullptr) return ModeName(c);
  const Message* m = &c;
  for (size_t i = 0; i + 1 < s.path.size(); ++i) {
    m = &m->GetReflection()->GetMessage(*m, s.path[i]);
  }
  std::string out;
  if (!s.field()->is_repeated()) {
    google::protobuf::TextFormat::PrintFieldValueToString(*m, s.field(), -1, &out);
    return out;
  }
  for (int i = 0; i < m->GetReflection()->FieldSize(*m, s.field()); ++i) {
    std::string v;
    google::protobuf::TextFormat::PrintFieldValueToString(*m, s.field(), i, &v);
    absl::StrAppend(&out, v, ",");
  }
  return out;
}

// A value of the flag other than its default.
std::string OtherValue(const SettingInfo& s) {
  const std::string& d = s.setting.default_();
  if (!s.setting.example().empty()) return s.setting.example();
  if (s.setting.form() == shoal::v1::SETTING_DURATION_MS) {
    absl::Duration duration;
    EXPECT_TRUE(absl::ParseDuration(d, &duration)) << s.key;
    return absl::FormatDuration(duration + absl::Seconds(1));
  }
  switch (s.field()->cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      return d == "true" ? "false" : "true";
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v = 0;
      EXPECT_TRUE(absl::SimpleAtoi(d, &v)) << s.key;
      return absl::StrCat(v + 3);
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v = 0;
      EXPECT_TRUE(absl::SimpleAtod(d, &v)) << s.key;
      return absl::StrCat(v + 0.25);
    }
    default:
      ADD_FAILURE() << s.key << ": a string flag needs an `example` in its setting";
      return d;
  }
}

TEST(RunConfigSettingsTest, EveryKeyHasASettingAndEveryFlagIsDefinedFromIt) {
  size_t flags = 0;
  for (const SettingInfo& s : RunConfigSettings()) {
    // Every key is documented; those without a flag say who sets them.
    EXPECT_FALSE(s.setting.doc().empty() && s.setting.help().empty()) << s.key;
    if (!s.has_flag()) {
      EXPECT_FALSE(s.setting.doc_flag().empty() && s.setting.doc_default().empty()) << s.key;
      continue;
    }
    ++flags;
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(s.setting.flag());
    ASSERT_NE(flag, nullptr) << "--" << s.setting.flag() << " (" << s.key << ") is not defined";
    EXPECT_EQ(flag->Help(), s.setting.help()) << s.key;
    EXPECT_EQ(flag->Filename(), RunConfigFlagsFile()) << s.key;
    // The flag's default is the option's, in the flag's own spelling.
    ScopedFlags flags_set;
    std::string error;
    ASSERT_TRUE(flags_set.Set(s.setting.flag(), s.setting.default_(), &error))
        << s.key << ": " << error;
    EXPECT_EQ(flag->CurrentValue(), flag->DefaultValue()) << s.key;
  }
  // The mode and the 59 keys with a flag of their own.
  EXPECT_EQ(flags, 60u);
  // A flag of one mode lives in that mode's group.
  for (const SettingInfo& s : RunConfigSettings()) {
    for (const std::string& mode : s.setting.modes()) EXPECT_EQ(s.group, mode) << s.key;
  }
}

// What the flags give at their defaults (users' scripts rely on them).
TEST(RunConfigSettingsTest, TheFlagsAtTheirDefaultsGiveTheDocumentedDefaults) {
  const RunConfig c = Merged();
  EXPECT_TRUE(c.has_sync());
  EXPECT_EQ(c.model().name(), "mlp");
  EXPECT_EQ(c.training().optimizer(), "sgd");
  EXPECT_DOUBLE_EQ(c.training().learning_rate(), 0.05);
  EXPECT_EQ(c.training().batch_size(), 64u);
  EXPECT_EQ(c.training().local_steps(), 50u);
  EXPECT_EQ(c.training().data_shards(), 2u);  // = min_participants
  EXPECT_EQ(c.sync().min_participants(), 2u);
  EXPECT_TRUE(c.sync().fold_late_work());
  EXPECT_EQ(c.sync().max_staleness(), 4u);
  EXPECT_EQ(c.exchange().codec(), "fp32");
  EXPECT_EQ(c.exchange().outer_optimizer().kind(), "none");
  EXPECT_DOUBLE_EQ(c.exchange().outer_optimizer().lr(), 0.7);
  EXPECT_EQ(c.exchange().aggregation(), "mean");
  EXPECT_FALSE(c.exchange().overlap());
  EXPECT_EQ(c.exchange().fragments(), 1u);
  EXPECT_EQ(c.exchange().overlap_start(), "contribution");
  EXPECT_FALSE(c.topology().hierarchy());
  EXPECT_EQ(c.timeouts().heartbeat_interval_ms(), 1000u);
  EXPECT_EQ(c.timeouts().heartbeat_lease_ms(), 10000u);
  EXPECT_EQ(c.timeouts().round_timeout_ms(), 120000u);
  EXPECT_EQ(c.timeouts().connection_timeout_ms(), 10000u);
  EXPECT_TRUE(c.timeouts().adaptive_deadline().enabled());
  EXPECT_EQ(c.timeouts().adaptive_deadline().floor_ms(), 2000u);
  EXPECT_DOUBLE_EQ(c.timeouts().election().switch_factor(), 1.5);
  EXPECT_EQ(c.timeouts().election().min_tenure_ms(), 30000u);
  EXPECT_EQ(c.checkpoints().every(), 10u);
  EXPECT_EQ(c.checkpoints().checkpointers(), 1u);
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  // Gossip's defaults too.
  ScopedFlags flags;
  std::string error;
  ASSERT_TRUE(flags.Set("mode", "gossip", &error)) << error;
  const RunConfig g = Merged();
  ASSERT_TRUE(g.has_gossip());
  EXPECT_EQ(g.gossip().every(), 10u);
  EXPECT_EQ(g.gossip().timeout_ms(), 5000u);
  EXPECT_EQ(g.gossip().interpolation(), "constant:0.5");
  EXPECT_EQ(g.gossip().checkpoint_every(), 1000u);
  EXPECT_EQ(g.training().data_shards(), 2u);  // --min_participants in gossip
  EXPECT_TRUE(ValidateRunConfig(g).ok()) << ValidateRunConfig(g);
}

// Every flag: a value other than its default parses, changes its key, reads
// back from the file form (RunConfigJson, which --check_config and `shoalctl
// config` print) and shows there under its key.
TEST(RunConfigSettingsTest, EveryFlagParsesRoundTripsThroughTheFileAndShowsInShoalctlConfig) {
  for (const SettingInfo& s : RunConfigSettings()) {
    if (!s.has_flag()) continue;
    ScopedFlags flags;
    std::string error;
    // Only a TorchScript model has an input shape; a mode's flag applies in
    // its mode.
    RunConfig base;
    if (s.setting.form() == shoal::v1::SETTING_SHAPE) {
      ASSERT_TRUE(flags.Set("model", "torchscript:m.pt", &error)) << error;
      base.mutable_model()->set_name("torchscript");
    }
    for (const std::string& mode : s.setting.modes()) {
      ASSERT_TRUE(flags.Set("mode", mode, &error)) << error;
    }
    // The flag parses a value other than its default, and the key takes it.
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(s.setting.flag());
    const std::string value = OtherValue(s);
    ASSERT_TRUE(flags.Set(s.setting.flag(), value, &error))
        << "--" << s.setting.flag() << "=" << value << ": " << error;
    RunConfig with_default = base, with_value = base;
    ASSERT_TRUE(ApplySettingText(s, flag->DefaultValue(), std::nullopt, &with_default).ok());
    ASSERT_TRUE(ApplySettingText(s, flag->CurrentValue(), std::nullopt, &with_value).ok());
    EXPECT_NE(KeyText(s, with_value), KeyText(s, with_default))
        << "--" << s.setting.flag() << "=" << value;
    // The merged config reads back from its file form, which is what
    // --check_config and `shoalctl config` print, and shows the key there.
    const RunConfig c = Merged();
    EXPECT_EQ(KeyText(s, c), KeyText(s, with_value)) << s.key;
    const std::string printed = RunConfigJson(c);
    absl::StatusOr<RunConfigFile> file = ParseRunConfigFile(printed, "printed.json");
    ASSERT_TRUE(file.ok()) << s.key << ": " << file.status();
    EXPECT_TRUE(Same(file->config, c)) << s.key << ": " << printed;
    if (s.field() != nullptr) {
      EXPECT_THAT(printed, HasSubstr(absl::StrCat("\"", s.field()->name(), "\":"))) << s.key;
    }
  }
}

TEST(RunConfigSettingsTest, AFlagWithNoMeaningNamesItself) {
  const SettingInfo* hierarchy = FindSettingByFlag("hierarchy");
  ASSERT_NE(hierarchy, nullptr);
  RunConfig c;
  const absl::Status s = ApplySettingText(*hierarchy, "maybe", std::nullopt, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--hierarchy=maybe is not one of on, off");
  const absl::Status mode = ApplySettingText(*FindSettingByFlag("mode"), "async", std::nullopt, &c);
  EXPECT_EQ(mode.message(), "--mode=async is not one of sync, gossip");
  const absl::Status long_wait =
      ApplySettingText(*FindSettingByFlag("round_timeout"), "1200h", std::nullopt, &c);
  EXPECT_THAT(long_wait.message(),
              HasSubstr("--round_timeout=1200h must be between 0 and 49 days"));
}

TEST(RunConfigSettingsTest, TheStartLogHasALineForEveryGroup) {
  const std::vector<std::string> lines = RunConfigLines(Merged());
  std::vector<std::string> groups;
  for (const std::string& line : lines) groups.push_back(line.substr(0, line.find(':')));
  EXPECT_THAT(groups, ::testing::ElementsAre("model", "training", "sync", "exchange", "topology",
                                             "timeouts", "checkpoints", "trust"));
}

TEST(RunConfigSettingsTest, TheGeneratedFlagSourceIsWhatTheBinaryHas) {
  absl::StatusOr<std::string> source = RunConfigFlagsSource();
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_THAT(*source,
              HasSubstr("ABSL_FLAG(absl::Duration, round_timeout, absl::Milliseconds(120000),"));
  EXPECT_THAT(*source, HasSubstr("ABSL_FLAG(std::string, hierarchy, \"off\","));
}

// docs/CONFIG.md's tables are generated (`make config-doc`): the file in the
// tree is what the descriptor says now.
TEST(RunConfigSettingsTest, ConfigMdIsTheGeneratedOne) {
  const std::string path = std::string(SHOAL_SOURCE_DIR) + "/docs/CONFIG.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::string> rendered = RenderConfigDoc(text.str());
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_TRUE(*rendered == text.str())
      << "docs/CONFIG.md is stale: run `make config-doc` (it rewrites its generated tables from "
         "protos/shoal/v1/coordinator.proto)";
}

}  // namespace
}  // namespace shoal
