// RoundEngine, checkpoints: who uploads a round's model
// (DecideCheckpointUploader), its report, and moving an upload that stalls
// or loses its worker (DecideCheckpointWatch); in gossip mode the
// checkpointer (DecideGossipCheckpointer) and its reports.
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/upload_grant.h"
#include "services/coordinator/core/gossip_status.h"
#include "services/coordinator/core/round_decisions.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/round_engine_internal.h"

namespace shoal::coordinator {

using internal::Share;
using shoal::v1::CoordinatorMessage;

void RoundEngine::AssignCheckpoint(uint64_t round, Directives* out) {
  pending_checkpoint_round_ = 0;
  pending_checkpoint_worker_.clear();
  std::vector<CheckpointCandidate> candidates;
  candidates.reserve(members_.size());
  for (const auto& [id, m] : members_) {
    candidates.push_back({id, m.model_round == round && m.model_hash == agreed_hash_});
  }
  const CheckpointUploaderDecision uploader =
      DecideCheckpointUploader(candidates, checkpoint_tried_, options_.checkpointers);
  switch (uploader.action) {
    case CheckpointUploaderDecision::Action::kGiveUp:
      SHOAL_LOG(WARNING) << "checkpoint of round " << round << " " << uploader.reason
                         << "; the next checkpoint round will try again";
      return;
    case CheckpointUploaderDecision::Action::kNoneLeft:
      SHOAL_LOG(WARNING) << "checkpoint of round " << round << ": " << uploader.reason
                         << "; the next checkpoint round will try again";
      return;
    case CheckpointUploaderDecision::Action::kAssign:
      break;
  }
  const std::string& id = uploader.worker_id;
  checkpoint_tried_.insert(id);
  pending_checkpoint_round_ = round;
  pending_checkpoint_worker_ = id;
  pending_checkpoint_since_ = clock_->Now();
  CoordinatorMessage msg;
  msg.mutable_checkpoint_request()->set_round(round);
  msg.mutable_checkpoint_request()->set_model_hash(agreed_hash_);
  msg.mutable_checkpoint_request()->set_run_id(options_.run_id);
  if (!options_.upload_key.empty()) {
    // This round only, for as long as the upload may take before it moves
    // to another worker (and a minute of clock skew with the store).
    UploadGrant grant{options_.run_id, id, round, round,
                      clock_->Now() + options_.checkpoint_timeout + absl::Minutes(1)};
    msg.mutable_checkpoint_request()->set_upload_grant(SignUploadGrant(options_.upload_key, grant));
  }
  out->push_back({id, Share(std::move(msg))});
  SHOAL_LOG(INFO) << "checkpoint of round " << round << " assigned to " << id;
}

absl::Status RoundEngine::ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                           Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  auto found = FindActive(request.worker_id());
  if (!found.ok()) return found.status();
  MarkStatusChanged();
  if (gossip()) return ReportGossipCheckpoint(request);
  if (pending_checkpoint_round_ == 0 || request.round() != pending_checkpoint_round_ ||
      request.worker_id() != pending_checkpoint_worker_) {
    return absl::FailedPreconditionError(absl::StrCat("no checkpoint of round ", request.round(),
                                                      " is expected from ", request.worker_id()));
  }
  if (!request.error().empty() || request.checkpoint_id().empty()) {
    SHOAL_LOG(WARNING) << "checkpoint of round " << request.round() << " by " << request.worker_id()
                       << " failed: " << request.error();
    AssignCheckpoint(request.round(), out);
    return absl::OkStatus();
  }
  checkpoint_id_ = request.checkpoint_id();
  checkpoint_round_ = request.round();
  pending_checkpoint_round_ = 0;
  pending_checkpoint_worker_.clear();
  MarkRecordChanged();
  SHOAL_LOG(INFO) << "checkpoint " << checkpoint_id_ << " of round " << checkpoint_round_
                  << " stored by " << request.worker_id();
  return absl::OkStatus();
}

void RoundEngine::WatchCheckpoint(absl::Time now, Directives* out) {
  if (pending_checkpoint_round_ == 0) return;  // the common case, without building a reason
  CheckpointWatch watch;
  watch.pending_round = pending_checkpoint_round_;
  watch.worker_id = pending_checkpoint_worker_;
  watch.worker_active = index_.contains(pending_checkpoint_worker_);
  watch.since = pending_checkpoint_since_;
  const CheckpointWatchDecision decision =
      DecideCheckpointWatch(watch, options_.checkpoint_timeout, now);
  if (!decision.reassign) return;
  MarkStatusChanged();
  SHOAL_LOG(WARNING) << "checkpoint: " << decision.reason << "; reassigning";
  AssignCheckpoint(pending_checkpoint_round_, out);
}

void RoundEngine::AssignGossipCheckpointer(Directives* out) {
  if (options_.config.checkpoints().store().empty() ||
      options_.config.gossip().checkpoint_every() == 0) {
    return;
  }
  std::vector<GossipCheckpointerCandidate> candidates;
  candidates.reserve(members_.size());
  for (const auto& [id, m] : members_) candidates.push_back({id, m.gossiping});
  const GossipCheckpointerDecision d = DecideGossipCheckpointer(gossip_checkpointer_, candidates);
  if (!d.changed) return;
  MarkStatusChanged();
  gossip_checkpointer_ = d.worker_id;
  if (d.worker_id.empty()) {
    SHOAL_LOG(INFO) << "gossip checkpointer: none (" << d.reason << ")";
    return;
  }
  CoordinatorMessage msg;
  auto* request = msg.mutable_checkpoint_request();
  request->set_gossip(true);
  request->set_round(checkpoint_round_ + 1);
  request->set_run_id(options_.run_id);
  if (!options_.upload_key.empty()) {
    // The checkpointer uploads sequence after sequence without asking again:
    // the grant covers every later one, for gossip_grant_ttl.
    UploadGrant grant{options_.run_id, d.worker_id, checkpoint_round_ + 1,
                      std::numeric_limits<uint64_t>::max(),
                      clock_->Now() + options_.gossip_grant_ttl};
    request->set_upload_grant(SignUploadGrant(options_.upload_key, grant));
  }
  out->push_back({d.worker_id, Share(std::move(msg))});
  SHOAL_LOG(INFO) << "gossip checkpointer: " << d.worker_id << " (" << d.reason
                  << "), uploads every " << options_.config.gossip().checkpoint_every()
                  << " local steps from sequence " << checkpoint_round_ + 1;
}

absl::Status RoundEngine::ReportGossipCheckpoint(
    const shoal::v1::ReportCheckpointRequest& request) {
  if (request.worker_id() != gossip_checkpointer_) {
    return absl::FailedPreconditionError(
        absl::StrCat(request.worker_id(), " is not the checkpointer of this gossip run (",
                     gossip_checkpointer_.empty() ? "none" : gossip_checkpointer_, " is)"));
  }
  if (!request.error().empty() || request.checkpoint_id().empty()) {
    // The checkpointer keeps the role and tries again after its next period.
    SHOAL_LOG(WARNING) << "gossip checkpoint " << request.round() << " by " << request.worker_id()
                       << " failed: " << request.error();
    return absl::OkStatus();
  }
  if (request.round() <= checkpoint_round_) {
    return absl::FailedPreconditionError(absl::StrCat("gossip checkpoint sequence ",
                                                      request.round(), " is not past the latest, ",
                                                      checkpoint_round_));
  }
  checkpoint_id_ = request.checkpoint_id();
  checkpoint_round_ = request.round();
  checkpoint_clock_ = request.gossip_clock();
  checkpoint_steps_ = request.gossip_steps();
  checkpoint_worker_ = request.worker_id();
  checkpoint_time_ = clock_->Now();
  MarkRecordChanged();
  SHOAL_LOG(INFO) << "gossip checkpoint " << checkpoint_id_ << " stored by " << request.worker_id()
                  << " (clock " << checkpoint_clock_ << ", " << checkpoint_steps_ << " steps)";
  return absl::OkStatus();
}

}  // namespace shoal::coordinator
