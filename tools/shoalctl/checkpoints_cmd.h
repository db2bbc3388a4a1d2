// `shoalctl checkpoints ...`: list, show, export and delete checkpoints of a
// shoal-checkpoint store.
//   shoalctl checkpoints list   --store=ADDR [--json] [--run_id=RUN]
//   shoalctl checkpoints show   --store=ADDR --id=ID [--json]
//   shoalctl checkpoints export --store=ADDR --id=ID --out=FILE
//   shoalctl checkpoints delete --store=ADDR --id=ID
// Common: --timeout=DURATION (deadline of each call, default 10s).
#ifndef SHOAL_TOOLS_SHOALCTL_CHECKPOINTS_CMD_H_
#define SHOAL_TOOLS_SHOALCTL_CHECKPOINTS_CMD_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "services/checkpoint/checkpoint_client.h"
#include "shoal/v1/checkpoint.pb.h"

namespace shoal::ctl {

// Usage text of `shoalctl checkpoints`.
extern const char kCheckpointsUsage[];

// Runs `shoalctl checkpoints <args...>` (args are what follows
// "checkpoints"; options are `--key=value`, `--json` alone means true) and
// returns the exit code: 0 done, 1 the store refused or failed, 2 bad usage.
// Output goes to stdout, errors to stderr.
int RunCheckpointsCommand(const std::vector<std::string>& args);

// The same with the client and streams injected (tests).
using CheckpointClientFactory = std::function<std::unique_ptr<shoal::checkpoint::CheckpointClient>(
    const std::string& store, absl::Duration timeout)>;
int RunCheckpointsCommand(const std::vector<std::string>& args,
                          const CheckpointClientFactory& make_client, std::ostream& out,
                          std::ostream& err);

// Pure formatting, no I/O.
std::string FormatCheckpointTable(const std::vector<shoal::v1::CheckpointInfo>& checkpoints);
// A JSON array of objects: id, run_id, round, created (RFC 3339, UTC),
// created_unix_ms, bytes, layers, damage ("" when healthy).
std::string FormatCheckpointsJson(const std::vector<shoal::v1::CheckpointInfo>& checkpoints);
// `damage` as in CheckpointInfo.
std::string FormatManifest(const shoal::v1::Manifest& manifest, const std::string& damage);
std::string FormatManifestJson(const shoal::v1::Manifest& manifest, const std::string& damage);

}  // namespace shoal::ctl

#endif  // SHOAL_TOOLS_SHOALCTL_CHECKPOINTS_CMD_H_
