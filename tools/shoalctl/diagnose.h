// `shoalctl explain WORKER` and `shoalctl doctor`: findings in words from a
// run's status and from what this host can check itself (a TCP handshake to
// each member's advertised address, a call to the store). Pure: the caller
// gathers the facts (main.cc), these functions judge them.
#ifndef SHOAL_TOOLS_SHOALCTL_DIAGNOSE_H_
#define SHOAL_TOOLS_SHOALCTL_DIAGNOSE_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/v1/checkpoint.pb.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::ctl {

struct Finding {
  // kOk: checked and fine; kNote: worth knowing, not wrong; kProblem:
  // something to fix (doctor exits 1 when there is one).
  enum class Level { kOk, kNote, kProblem };
  Level level = Level::kNote;
  // What the finding is about: "coordinator", "store", "w3", "round 12".
  std::string subject;
  std::string text;
};

// "ok", "note", "PROBLEM".
const char* LevelName(Finding::Level level);
// One line per finding: "PROBLEM  w3        not heard from for 12.0s ...".
std::string FormatFindings(const std::vector<Finding>& findings);
bool AnyProblem(const std::vector<Finding>& findings);
// -o json: {"problem": bool, "findings": [{"level", "subject", "text"}, ...]}.
std::string FormatFindingsJson(const std::vector<Finding>& findings);

// Why WORKER (an id such as "w3" or its --name) is or is not contributing,
// as far as the coordinator's status tells: its state and reason, the round
// it waits for and on whom, catch-up progress, lateness, a stale or
// disagreeing model, NAT (push mode) and relays, silence past the heartbeat
// lease. NOT_FOUND (naming the run's workers) for an unknown worker.
// `reachable`: this host's TCP handshake to its advertised address, when
// checked.
absl::StatusOr<std::vector<Finding>> ExplainWorker(const shoal::v1::RunStatus& status,
                                                   const std::string& worker,
                                                   const std::optional<absl::Status>& reachable);

// What doctor checked beside the coordinator's status.
struct DoctorFacts {
  // The coordinator call's outcome (status below is meaningful when ok).
  absl::Status coordinator = absl::OkStatus();
  std::string coordinator_address;
  // Each member's advertised address: this host's TCP handshake to it.
  std::map<std::string, absl::Status> member_reachable;
  // The store (the run's --checkpoint_store, or --store): its address, the
  // List call's outcome and answer.
  std::string store_address;
  std::optional<absl::Status> store;
  std::vector<shoal::v1::CheckpointInfo> checkpoints;
  // What this client used.
  bool client_tls = false;
  bool client_token = false;
  // This host's clock when the status came back (unix ms).
  int64_t local_unix_ms = 0;
};

// A check of the whole run: the coordinator (reachable, leader or standby,
// token and TLS as its refusal tells), the run's progress, every member
// (reachable from here, heard from, agreeing), the store (reachable, taking
// checkpoints at the configured rate, damaged checkpoints), and this host's
// clock against the coordinator's newest timestamp.
std::vector<Finding> Doctor(const shoal::v1::RunStatus& status, const DoctorFacts& facts);

}  // namespace shoal::ctl

#endif  // SHOAL_TOOLS_SHOALCTL_DIAGNOSE_H_
