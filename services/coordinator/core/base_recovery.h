// What the coordinator does when a participant cannot load its round's
// base model (docs/CHECKPOINTS.md "A resume never silently starts over"):
// the worker sat the round out and said why (ReportReadyRequest.
// base_unavailable). While another member holds the base, the worker only
// sits out and catches up from it at the next round. When nobody holds it
// and the store cannot serve it either (the checkpoint is damaged, or no
// checkpoint is of that round), training on would mean training some other
// model under the run's round numbers: the run goes back to the newest
// intact checkpoint it knows of (RunRecord.checkpoints) or, with none, stops
// with an error that names the checkpoint.
//
// Pure functions over a snapshot of the engine's state (no clock, no I/O,
// no logging), like round_decisions.h. Thread-compatible.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_BASE_RECOVERY_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_BASE_RECOVERY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// The known intact checkpoints a run can go back to, newest first.
inline constexpr size_t kKnownCheckpoints = 4;

struct BaseUnavailableInput {
  std::string worker_id;
  // The round in progress and its base (the last completed round).
  uint64_t round = 0;
  uint64_t base_round = 0;
  // Another member holds the agreed base model (it can serve it, or it
  // trains on it).
  bool base_held = false;
  // The run's latest checkpoint, as the RoundStart named it.
  std::string checkpoint_id;
  uint64_t checkpoint_round = 0;
  // The worker's report: why, and whether the store found the checkpoint
  // damaged.
  std::string why;
  bool checkpoint_damaged = false;
};

struct BaseUnavailableDecision {
  enum class Action {
    kSitOut,  // the worker sits the round out; the run goes on
    kGoBack,  // the run goes back to `to`
    kStop,    // the run stops with `reason` as its error
  };
  Action action = Action::kSitOut;
  shoal::v1::CheckpointRef to;
  // The round's line for the log and the status (base_fallback, error),
  // and for kSitOut the RoundMissed reason.
  std::string reason;
};

// `known`: the run's intact checkpoints, newest first.
BaseUnavailableDecision DecideBaseUnavailable(const BaseUnavailableInput& in,
                                              absl::Span<const shoal::v1::CheckpointRef> known);

// `known` with `ref` first (an older entry with its id is replaced), at
// most kKnownCheckpoints.
void RememberCheckpoint(const shoal::v1::CheckpointRef& ref,
                        std::vector<shoal::v1::CheckpointRef>* known);

// Going back to `to`: drops `damaged_id` and every checkpoint newer than
// `to` (their rounds will be trained again).
void ForgetAfter(const shoal::v1::CheckpointRef& to, const std::string& damaged_id,
                 std::vector<shoal::v1::CheckpointRef>* known);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_BASE_RECOVERY_H_
