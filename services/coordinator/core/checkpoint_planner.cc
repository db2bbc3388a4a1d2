// CheckpointPlanner: who uploads, their reports, stalled uploads, and the
// gossip checkpointer.
#include "services/coordinator/core/checkpoint_planner.h"

#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/upload_grant.h"
#include "services/coordinator/core/base_recovery.h"

namespace shoal::coordinator {

using shoal::v1::CoordinatorMessage;

CheckpointPlanner::CheckpointPlanner(const EngineOptions& options, const Clock* clock,
                                     EngineVersions* versions, const Membership* members)
    : options_(options), clock_(clock), versions_(versions), members_(members) {}

void CheckpointPlanner::Resume(const shoal::v1::RunRecord& record) {
  checkpoint_id_ = record.checkpoint_id();
  checkpoint_round_ = record.checkpoint_round();
  known_.assign(record.checkpoints().begin(), record.checkpoints().end());
  if (known_.empty() && !checkpoint_id_.empty() &&
      record.last_completed_round() == checkpoint_round_) {
    // A record written before the list: its checkpoint is of the agreed
    // round, whose hash it has.
    shoal::v1::CheckpointRef ref;
    ref.set_id(checkpoint_id_);
    ref.set_round(checkpoint_round_);
    ref.set_model_hash(record.model_hash());
    known_.push_back(ref);
  }
}

void CheckpointPlanner::GoBack(const shoal::v1::CheckpointRef& to, const std::string& damaged_id) {
  ForgetAfter(to, damaged_id, &known_);
  RememberCheckpoint(to, &known_);
  checkpoint_id_ = to.id();
  checkpoint_round_ = to.round();
  pending_round_ = 0;
  pending_worker_.clear();
  versions_->MarkRecordChanged();
}

// ----------------------------------------------------- Synchronous rounds

bool CheckpointPlanner::Due(uint64_t round, bool last) const {
  const uint32_t every = options_.config.checkpoints().every();
  return !options_.config.checkpoints().store().empty() && every > 0 &&
         (round % every == 0 || last);
}

void CheckpointPlanner::StartUpload(uint64_t round, const std::string& agreed_hash,
                                    absl::Span<const CheckpointCandidate> candidates,
                                    Directives* out, const shoal::v1::SampleLedger& ledger) {
  tried_.clear();
  pending_ledger_ = ledger;
  AssignUpload(round, agreed_hash, candidates, out);
}

void CheckpointPlanner::AssignUpload(uint64_t round, const std::string& agreed_hash,
                                     absl::Span<const CheckpointCandidate> candidates,
                                     Directives* out) {
  pending_round_ = 0;
  pending_worker_.clear();
  const CheckpointUploaderDecision uploader =
      DecideCheckpointUploader(candidates, tried_, options_.checkpointers);
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
  tried_.insert(id);
  pending_round_ = round;
  pending_hash_ = agreed_hash;
  pending_worker_ = id;
  pending_since_ = clock_->Now();
  CoordinatorMessage msg;
  msg.mutable_checkpoint_request()->set_round(round);
  msg.mutable_checkpoint_request()->set_model_hash(agreed_hash);
  msg.mutable_checkpoint_request()->set_run_id(options_.run_id);
  if (pending_ledger_.dataset_samples() > 0) {
    *msg.mutable_checkpoint_request()->mutable_ledger() = pending_ledger_;
  }
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

absl::Status CheckpointPlanner::ReportUpload(const shoal::v1::ReportCheckpointRequest& request,
                                             bool* reassign) {
  *reassign = false;
  if (pending_round_ == 0 || request.round() != pending_round_ ||
      request.worker_id() != pending_worker_) {
    return absl::FailedPreconditionError(absl::StrCat("no checkpoint of round ", request.round(),
                                                      " is expected from ", request.worker_id()));
  }
  if (!request.error().empty() || request.checkpoint_id().empty()) {
    SHOAL_LOG(WARNING) << "checkpoint of round " << request.round() << " by " << request.worker_id()
                       << " failed: " << request.error();
    *reassign = true;
    return absl::OkStatus();
  }
  checkpoint_id_ = request.checkpoint_id();
  checkpoint_round_ = request.round();
  shoal::v1::CheckpointRef ref;
  ref.set_id(checkpoint_id_);
  ref.set_round(checkpoint_round_);
  ref.set_model_hash(pending_hash_);
  if (pending_ledger_.dataset_samples() > 0) *ref.mutable_ledger() = pending_ledger_;
  RememberCheckpoint(ref, &known_);
  pending_round_ = 0;
  pending_worker_.clear();
  versions_->MarkRecordChanged();
  SHOAL_LOG(INFO) << "checkpoint " << checkpoint_id_ << " of round " << checkpoint_round_
                  << " stored by " << request.worker_id();
  return absl::OkStatus();
}

uint64_t CheckpointPlanner::StalledUpload(absl::Time now) {
  if (pending_round_ == 0) return 0;  // the common case, without building a reason
  CheckpointWatch watch;
  watch.pending_round = pending_round_;
  watch.worker_id = pending_worker_;
  watch.worker_active = members_->Contains(pending_worker_);
  watch.since = pending_since_;
  const CheckpointWatchDecision decision =
      DecideCheckpointWatch(watch, options_.checkpoint_timeout, now);
  if (!decision.reassign) return 0;
  versions_->MarkStatusChanged();
  SHOAL_LOG(WARNING) << "checkpoint: " << decision.reason << "; reassigning";
  return pending_round_;
}

// ------------------------------------------------------------------ Gossip

void CheckpointPlanner::AssignGossipCheckpointer(
    absl::Span<const GossipCheckpointerCandidate> candidates, Directives* out) {
  if (options_.config.checkpoints().store().empty() ||
      options_.config.gossip().checkpoint_every() == 0) {
    return;
  }
  const GossipCheckpointerDecision d = DecideGossipCheckpointer(gossip_checkpointer_, candidates);
  if (!d.changed) return;
  versions_->MarkStatusChanged();
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

absl::Status CheckpointPlanner::ReportGossip(const shoal::v1::ReportCheckpointRequest& request) {
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
  versions_->MarkRecordChanged();
  SHOAL_LOG(INFO) << "gossip checkpoint " << checkpoint_id_ << " stored by " << request.worker_id()
                  << " (clock " << checkpoint_clock_ << ", " << checkpoint_steps_ << " steps)";
  return absl::OkStatus();
}

// ------------------------------------------------------------------ Status

void CheckpointPlanner::FillStatus(shoal::v1::RunStatus* s) const {
  s->set_checkpoint_id(checkpoint_id_);
  s->set_checkpoint_round(checkpoint_round_);
  if (pending_round_ > 0) {
    s->set_checkpoint_pending(absl::StrCat("round ", pending_round_, " by ", pending_worker_));
  }
  // Set by gossip runs only (empty otherwise).
  s->set_checkpointer(gossip_checkpointer_);
  s->set_checkpoint_clock(checkpoint_clock_);
  s->set_checkpoint_steps(checkpoint_steps_);
  s->set_checkpoint_worker(checkpoint_worker_);
  if (checkpoint_time_ != absl::InfinitePast()) {
    s->set_checkpoint_unix_ms(absl::ToUnixMillis(checkpoint_time_));
  }
}

void CheckpointPlanner::FillRecord(shoal::v1::RunRecord* r) const {
  r->set_checkpoint_id(checkpoint_id_);
  r->set_checkpoint_round(checkpoint_round_);
  for (const shoal::v1::CheckpointRef& ref : known_) *r->add_checkpoints() = ref;
}

}  // namespace shoal::coordinator
