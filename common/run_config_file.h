// The run config file (shoal-coordinator --config, docs/CONFIG.md) and its
// merge with the coordinator's flags.
//
// The file is YAML or JSON (JSON is YAML's flow style: one parser reads
// both). Its keys are RunConfig's field names nested by group:
//   model: {name: mlp}
//   training: {learning_rate: 0.05, batch_size: 64}
//   sync: {min_participants: 3, rounds: 20}
// An unknown key, a duplicate, a value of the wrong type, or both `sync` and
// `gossip` is INVALID_ARGUMENT naming the key's path and line.
//
// The effective config is every flag's value (defaults included), then the
// file's keys, then the flags given on the command line: a flag left at its
// default never overrides the file. Pure functions apart from reading the
// file; thread-safe.
#ifndef SHOAL_COMMON_RUN_CONFIG_FILE_H_
#define SHOAL_COMMON_RUN_CONFIG_FILE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal {

struct RunConfigFile {
  // Where it came from (the path), for messages.
  std::string name;
  std::string text;
  // The file's keys alone, on an empty config.
  shoal::v1::RunConfig config;
};

// Parses `text` (named `name` in messages).
absl::StatusOr<RunConfigFile> ParseRunConfigFile(const std::string& text, const std::string& name);
// Reads and parses `path`: NOT_FOUND when it does not exist, FAILED_PRECONDITION
// when it cannot be read, INVALID_ARGUMENT for its content.
absl::StatusOr<RunConfigFile> ReadRunConfigFile(const std::string& path);

// Sets the keys `file` names on `into`; the others keep their values. With
// `keep_mode`, a mode group (`sync` or `gossip`) other than the one `into`
// has is skipped and its name added to `skipped`.
absl::Status ApplyRunConfigFile(const RunConfigFile& file, shoal::v1::RunConfig* into,
                                bool keep_mode, std::vector<std::string>* skipped);

// One coordinator flag that sets a key of the run config.
struct RunConfigFlag {
  enum class Mode { kAny, kSync, kGossip };
  // The flag's name, without dashes.
  std::string flag;
  // The key it sets ("training.learning_rate"); "mode" for --mode, which
  // chooses the mode group.
  std::string key;
  // The flag applies only in this mode; in the other it is ignored (a note
  // says so when it was given).
  Mode mode = Mode::kAny;
  // Given on the command line (or in a --flagfile).
  bool given = false;
  // Sets the key from the flag's current value; INVALID_ARGUMENT for a value
  // that has no meaning (e.g. --mode=async).
  std::function<absl::Status(shoal::v1::RunConfig*)> apply;
};

struct MergedRunConfig {
  // Normalized (NormalizeRunConfig), not yet validated.
  shoal::v1::RunConfig config;
  // What was ignored and why, one line each, for the start log.
  std::vector<std::string> notes;
};

// The effective config of `flags` and `file` (nullptr: no file), in the
// order above. The mode is the --mode flag's when given, else the file's
// mode group when it has one, else the flag's default; a mode group of the
// file that --mode overrides is ignored (noted).
absl::StatusOr<MergedRunConfig> MergeRunConfig(const std::vector<RunConfigFlag>& flags,
                                               const RunConfigFile* file);

}  // namespace shoal

#endif  // SHOAL_COMMON_RUN_CONFIG_FILE_H_
