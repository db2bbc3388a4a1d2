// The run configuration (shoal.v1.RunConfig, grouped by concern: issue 25,
// docs/CONFIG.md): its one validator, the defaults the coordinator derives,
// the mode helpers and its printed form. No gRPC types; the file format
// (YAML/JSON) and the merge with flags live in common/run_config_file.h.
// Pure functions, thread-safe.
#ifndef SHOAL_COMMON_RUN_CONFIG_H_
#define SHOAL_COMMON_RUN_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal {

// True in gossip mode. An unset mode is sync.
bool IsGossip(const shoal::v1::RunConfig& config);
// "sync" or "gossip".
const char* ModeName(const shoal::v1::RunConfig& config);

// Beyond this many rounds a late update's weight (1 / (1 + s)) is noise.
inline constexpr uint32_t kMaxStalenessLimit = 1000;

// RunConfig.exchange.fragments: more would make each round's exchange a
// few slices too small to pay for their round trips.
inline constexpr uint32_t kMaxFragments = 4096;

// What the coordinator derives before it validates, idempotent: an unset
// mode becomes sync; training.data_shards 0 becomes sync.min_participants;
// gossip.every and gossip.timeout_ms are at least 1; gossip.final_average
// holds only with gossip.steps.
void NormalizeRunConfig(shoal::v1::RunConfig* config);

// Every check of a run configuration, and every combination the run refuses,
// in one table (run_config.cc, kRules), checked in its order. OK, or
// INVALID_ARGUMENT with one message per case naming the file key and its
// flag, e.g. "exchange.codec (--codec): unknown codec ...". Expects a
// normalized config (NormalizeRunConfig).
absl::Status ValidateRunConfig(const shoal::v1::RunConfig& config);

// What docs/CONFIG.md says of each refusal of that table, in its order.
struct RunConfigRuleDoc {
  enum class Kind {
    kKey,          // a value of one key
    kCombination,  // keys that have no meaning together
  };
  Kind kind;
  const char* refused;
  const char* why;  // combinations only
};
std::vector<RunConfigRuleDoc> RunConfigRuleDocs();

// The config as JSON with the proto field names (the file's keys) and every
// field, unset ones included: readable back as a config file.
std::string RunConfigJson(const shoal::v1::RunConfig& config);
// One line per group of RunConfig's descriptor, "group: {compact JSON}", in
// its order (of the mode groups, the run's: "sync" or "gossip"): the
// coordinator's start log.
std::vector<std::string> RunConfigLines(const shoal::v1::RunConfig& config);

}  // namespace shoal

#endif  // SHOAL_COMMON_RUN_CONFIG_H_
