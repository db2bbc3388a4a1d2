// The run config's settings as RunConfig's descriptor and its `setting`
// options say (protos/shoal/v1/coordinator.proto): one entry per key, with
// its flag, the flag's default and help, the modes it applies to and its
// docs. Everything that lists the settings is derived from this: the
// coordinator's flags (generated at build time, common/run_config_doc.h),
// the flags' merge with the config file (RunConfigFlagsOf), the start log
// (RunConfigLines) and docs/CONFIG.md's tables (make config-doc).
// Pure functions over the descriptor; thread-safe.
#ifndef SHOAL_COMMON_RUN_CONFIG_SCHEMA_H_
#define SHOAL_COMMON_RUN_CONFIG_SCHEMA_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/run_config_file.h"
#include "google/protobuf/descriptor.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal {

struct SettingInfo {
  // The file's key ("timeouts.round_timeout_ms"); "mode" for the oneof.
  std::string key;
  // The group it belongs to: RunConfig's field ("timeouts", "sync").
  std::string group;
  // The fields from RunConfig down to the key's (empty for the mode).
  std::vector<const google::protobuf::FieldDescriptor*> path;
  // Its options.
  shoal::v1::Setting setting;
  const google::protobuf::FieldDescriptor* field() const {
    return path.empty() ? nullptr : path.back();
  }
  bool has_flag() const { return !setting.flag().empty(); }
};

struct SettingGroup {
  // RunConfig's field ("model", "sync", ...) and its heading's note.
  std::string name;
  std::string doc;
  const google::protobuf::FieldDescriptor* field = nullptr;
  // Its keys in the descriptor's order (nested groups' in place).
  std::vector<const SettingInfo*> settings;
};

// Every key of RunConfig, in the descriptor's order, the mode first.
const std::vector<SettingInfo>& RunConfigSettings();
// RunConfig's groups in the descriptor's order.
const std::vector<SettingGroup>& RunConfigGroups();
// The setting whose flag is `flag`, or null.
const SettingInfo* FindSettingByFlag(const std::string& flag);

// The flag applies in `config`'s mode (its `modes` option).
bool SettingApplies(const SettingInfo& s, const shoal::v1::RunConfig& config);

// Sets the key from the flag's text (`text` as the flag prints its value:
// "120s", "true", "0.05", "on") by the setting's form. `zero_takes`: the
// text of the flag named by the setting's zero_takes option, when there is
// one. INVALID_ARGUMENT naming --flag=text for a value with no meaning.
absl::Status ApplySettingText(const SettingInfo& s, const std::string& text,
                              const std::optional<std::string>& zero_takes,
                              shoal::v1::RunConfig* config);

// A flag's current text and whether it was given on the command line.
struct FlagText {
  std::string text;
  bool given = false;
};
// The flags' values by name (null when the program has no such flag).
using FlagLookup = std::function<std::optional<FlagText>(const std::string& flag)>;
// Every setting with a flag as a RunConfigFlag for MergeRunConfig, its
// value from `lookup`. A setting whose flag `lookup` lacks is left out.
std::vector<RunConfigFlag> RunConfigFlagsOf(const FlagLookup& lookup);

// The flag's default in the file's form, for docs: "120000", "false",
// "`mlp`", "" (an empty string).
std::string FileFormDefault(const SettingInfo& s);

}  // namespace shoal

#endif  // SHOAL_COMMON_RUN_CONFIG_SCHEMA_H_
