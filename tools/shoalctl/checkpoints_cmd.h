// `shoalctl checkpoints ...`: list, show, export and delete checkpoints of a
// shoal-checkpoint store.
//   shoalctl checkpoints list   [--run_id=RUN] [-o table|wide|json|yaml]
//   shoalctl checkpoints show   ID [-o ...]
//   shoalctl checkpoints export ID --out=FILE
//   shoalctl checkpoints delete ID
// with the global flags (--store, --rpc_timeout, TLS, token; cli.h).
#ifndef SHOAL_TOOLS_SHOALCTL_CHECKPOINTS_CMD_H_
#define SHOAL_TOOLS_SHOALCTL_CHECKPOINTS_CMD_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "services/checkpoint/checkpoint_client.h"
#include "shoal/v1/checkpoint.pb.h"
#include "tools/shoalctl/cli.h"

namespace shoal::ctl {

using CheckpointClientFactory = std::function<std::unique_ptr<shoal::checkpoint::CheckpointClient>(
    const std::string& store, absl::Duration timeout)>;

// Runs a parsed `shoalctl checkpoints list|show|export|delete` (cli.h) and
// returns the exit code: 0 done, 1 the store refused or failed, 2 bad usage.
// Output goes to stdout, errors to stderr. TLS and the token are the
// process's (main.cc sets them from the global flags).
int RunCheckpointsCommand(const Invocation& inv);
int RunCheckpointsCommand(const Invocation& inv, const CheckpointClientFactory& make_client,
                          std::ostream& out, std::ostream& err);
// Tests: parses `checkpoints <args...>` without the environment, then runs
// it (or prints its help).
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
