// Checkpoint planning on the coordinator: the run's latest checkpoint (id
// and round: durable, in the run record) and who uploads the next one. In
// synchronous rounds: which holder of a completed round's agreed model
// uploads it (DecideCheckpointUploader), its report, and moving an upload
// that stalls or loses its worker (DecideCheckpointWatch). In gossip mode:
// the checkpointer (DecideGossipCheckpointer in gossip_status.h), its
// grant, and its reports of later and later sequences. Every
// CheckpointRequest carries an upload grant when the run has an upload key
// (common/upload_grant.h). A part of RoundEngine; the run's mode gives it
// the candidates (it knows who holds which model, or who gossips).
//
// Not thread-safe: owned by RoundEngine and called only with the engine's
// mutex held; it never calls out.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_CHECKPOINT_PLANNER_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_CHECKPOINT_PLANNER_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/gossip_status.h"
#include "services/coordinator/core/membership.h"
#include "services/coordinator/core/round_decisions.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

class CheckpointPlanner {
 public:
  CheckpointPlanner(const EngineOptions& options, const Clock* clock, EngineVersions* versions,
                    const Membership* members);
  CheckpointPlanner(const CheckpointPlanner&) = delete;
  CheckpointPlanner& operator=(const CheckpointPlanner&) = delete;

  // A resumed run keeps its latest checkpoint and those it can go back to.
  void Resume(const shoal::v1::RunRecord& record);
  const std::string& checkpoint_id() const { return checkpoint_id_; }
  uint64_t checkpoint_round() const { return checkpoint_round_; }
  // The run's intact checkpoints, newest first (core/base_recovery.h).
  const std::vector<shoal::v1::CheckpointRef>& known() const { return known_; }
  // The run goes back to `to` (core/base_recovery.h): it becomes the latest
  // checkpoint; `damaged_id` and those newer than `to` are forgotten, and an
  // upload in progress is dropped.
  void GoBack(const shoal::v1::CheckpointRef& to, const std::string& damaged_id);

  // ------------------------------------------------- Synchronous rounds
  // Whether the completed round `round` is to be uploaded: the run has a
  // store and it is a multiple of checkpoints.every, or the last round.
  bool Due(uint64_t round, bool last) const;
  // A new upload of `round`: asks the first holder of its agreed model
  // (`candidates`, by id) to upload it.
  // `ledger`: the sample ledger as of `round` (empty without one), carried
  // by the request into the manifest and kept with the checkpoint's ref.
  void StartUpload(uint64_t round, const std::string& agreed_hash,
                   absl::Span<const CheckpointCandidate> candidates, Directives* out,
                   const shoal::v1::SampleLedger& ledger = shoal::v1::SampleLedger());
  // Asks the next untried holder of `round`'s model to upload it; gives up
  // when none is left (the next checkpoint round tries again).
  void AssignUpload(uint64_t round, const std::string& agreed_hash,
                    absl::Span<const CheckpointCandidate> candidates, Directives* out);
  // A round's ReportCheckpoint: FAILED_PRECONDITION unless it is the
  // upload in progress. A failed upload sets *reassign: ask another holder
  // (AssignUpload); a stored one becomes the run's checkpoint.
  absl::Status ReportUpload(const shoal::v1::ReportCheckpointRequest& request, bool* reassign);
  // The upload in progress (Tick): the round whose upload moves to another
  // worker now (its worker is gone or did not report in time), else 0.
  uint64_t StalledUpload(absl::Time now);

  // --------------------------------------------------------------- Gossip
  // Keeps one gossiping member as the checkpointer (`candidates`: every
  // member by id) and tells a new one with a CheckpointRequest (gossip =
  // true) whose grant covers every later sequence. Off without a store or
  // a period. Called on every peer-list change.
  void AssignGossipCheckpointer(absl::Span<const GossipCheckpointerCandidate> candidates,
                                Directives* out);
  // ReportCheckpoint in gossip mode: a report from the checkpointer of a
  // sequence number past the latest.
  absl::Status ReportGossip(const shoal::v1::ReportCheckpointRequest& request);

  void FillStatus(shoal::v1::RunStatus* s) const;
  void FillRecord(shoal::v1::RunRecord* r) const;

 private:
  const EngineOptions& options_;
  const Clock* const clock_;
  EngineVersions* const versions_;
  const Membership* const members_;
  std::string checkpoint_id_;
  uint64_t checkpoint_round_ = 0;
  std::vector<shoal::v1::CheckpointRef> known_;
  // The upload in progress: round (0 = none), its model hash, worker, since
  // when, and the workers already tried for it.
  uint64_t pending_round_ = 0;
  std::string pending_hash_;
  shoal::v1::SampleLedger pending_ledger_;
  std::string pending_worker_;
  absl::Time pending_since_;
  std::set<std::string> tried_;
  // Gossip mode: the checkpointer (empty = none), and of the latest
  // checkpoint the uploader's clock, steps, id and when it was recorded.
  std::string gossip_checkpointer_;
  double checkpoint_clock_ = 0;
  uint64_t checkpoint_steps_ = 0;
  std::string checkpoint_worker_;
  absl::Time checkpoint_time_ = absl::InfinitePast();
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_CHECKPOINT_PLANNER_H_
