// SyncRounds: runs the round value (SyncRound) for the engine.
#include "services/coordinator/core/sync_rounds.h"

#include <utility>
#include <variant>

namespace shoal::coordinator {
namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

SyncRounds::SyncRounds(const EngineOptions& options, EngineVersions* versions, Membership* members,
                       Topology* topology, CheckpointPlanner* checkpoints, RoundStartGate gate,
                       absl::Time started_at)
    : versions_(versions),
      members_(members),
      topology_(topology),
      checkpoints_(checkpoints),
      gate_(std::move(gate)),
      round_(SyncRound::OptionsOf(options), started_at),
      stats_(round_.SampleWindow()) {}

// ------------------------------------------------------------ RoundWorld

ZoneHeads SyncRounds::Heads(uint64_t round) const {
  topology_->ReelectIfStale(round);
  ZoneHeads heads;
  for (const ZoneElection& z : topology_->election().zones) {
    if (!z.supernode.empty()) heads[z.path] = z.supernode;
  }
  return heads;
}

bool SyncRounds::MayStartRound(bool record_changed) const {
  if (record_changed) versions_->MarkRecordChanged();
  return gate_ == nullptr || gate_();
}

// ------------------------------------------------------------ Running it

absl::Status SyncRounds::Run(const RoundEvent& event, absl::Time now, Member* m, ModeOutput* out,
                             RoundOutput* result) {
  RoundOutput step = round_.Step(event, now, *this);
  if (step.touched && m != nullptr) m->last_seen = now;
  if (step.accepted) {
    // The report's figures are in before the round's intents (a round it
    // completes sums them).
    if (const auto* ready = std::get_if<round_event::Ready>(&event))
      stats_.OnReady(*ready->request);
    if (const auto* done = std::get_if<round_event::RoundDone>(&event)) {
      stats_.OnRoundDone(*done->request);
    }
  }
  const absl::Status status = step.status;
  for (;;) {
    if (step.status_changed) versions_->MarkStatusChanged();
    if (step.record_changed) versions_->MarkRecordChanged();
    // The directives and the intents in the order the round made them.
    size_t next = 0;
    for (PlacedIntent& placed : step.intents) {
      for (; next < placed.at; ++next) out->directives.push_back(std::move(step.directives[next]));
      Apply(placed.intent, out);
    }
    for (; next < step.directives.size(); ++next) {
      out->directives.push_back(std::move(step.directives[next]));
    }
    if (result != nullptr) {
      result->admitted_round = step.admitted_round;
      result->was_participant = step.was_participant;
      result = nullptr;  // of the first step only
    }
    if (!step.then.has_value()) break;
    const RoundEvent then = *std::move(step.then);
    step = round_.Step(then, now, *this);
  }
  return status;
}

void SyncRounds::Apply(RoundIntent& intent, ModeOutput* out) {
  namespace i = round_intent;
  std::visit(
      Overloaded{
          [&](i::Depart& d) {
            // The round's view of it, then the status figures, before they go.
            stats_.FillWorker(d.worker_id, &d.shown);
            stats_.Forget(d.worker_id);
            EngineIntent e;
            e.kind = EngineIntent::Kind::kDepart;
            e.worker_id = std::move(d.worker_id);
            e.why = d.why;
            e.reason = std::move(d.reason);
            e.shown = std::move(d.shown);
            out->Intend(std::move(e));
          },
          [&](i::Finish& f) {
            EngineIntent e;
            e.kind = f.failed ? EngineIntent::Kind::kFailRun : EngineIntent::Kind::kFinishRun;
            e.reason = std::move(f.reason);
            out->Intend(std::move(e));
          },
          [&](i::Checkpoint& c) {
            if (c.first) {
              checkpoints_->StartUpload(c.round, c.agreed_hash, c.candidates, &out->directives,
                                        c.ledger);
            } else {
              checkpoints_->AssignUpload(c.round, c.agreed_hash, c.candidates, &out->directives);
            }
          },
          [&](i::GoBack& g) { checkpoints_->GoBack(g.to, g.damaged_id); },
          [&](i::Measure& m) { topology_->Measure(m.worker_id, m.step_seconds, m.bandwidth_bps); },
          [&](i::Reelect& r) { topology_->Reelect(ElectionTrigger::kMeasurements, r.round); },
          [&](i::Missed& m) { stats_.OnMissed(m); },
          [&](i::Completed& c) { stats_.OnCompleted(c); },
      },
      intent);
}

// ----------------------------------------------------------------- Calls
// The round answers only the workers' calls and CheckJoin: its other
// events cannot fail.

void SyncRounds::Resume(const shoal::v1::RunRecord& record, absl::Time now) {
  ModeOutput ignored;
  Run(round_event::Resume{&record}, now, nullptr, &ignored).IgnoreError();
}

absl::Status SyncRounds::CheckJoin(const shoal::v1::JoinRequest& request, absl::Time now) {
  ModeOutput ignored;
  return Run(round_event::CheckJoin{&request}, now, nullptr, &ignored);
}

void SyncRounds::OnJoined(Member& m, const shoal::v1::JoinRequest& request, absl::Time now) {
  ModeOutput ignored;
  Run(round_event::Joined{m.id, &request}, now, &m, &ignored).IgnoreError();
}

void SyncRounds::FillJoinResponse(const Member& m, shoal::v1::JoinResponse* r) const {
  round_.FillJoinResponse(m, *this, r);
}

void SyncRounds::OnConnected(Member& m, absl::Time now) {
  ModeOutput ignored;
  Run(round_event::Connected{m.id}, now, &m, &ignored).IgnoreError();
}

bool SyncRounds::OnHeartbeat(Member& m, const shoal::v1::Heartbeat& heartbeat, absl::Time now) {
  ModeOutput ignored;
  Run(round_event::Heartbeat{m.id, &heartbeat}, now, &m, &ignored).IgnoreError();
  return true;
}

bool SyncRounds::Forget(const std::string& worker_id, absl::Time now) {
  ModeOutput ignored;
  RoundOutput result;
  Run(round_event::Forget{worker_id}, now, nullptr, &ignored, &result).IgnoreError();
  stats_.Forget(worker_id);
  return result.was_participant;
}

void SyncRounds::OnDeparted(const std::string& worker_id, MemberState, const std::string& reason,
                            bool was_participant, absl::Time now, ModeOutput* out) {
  Run(round_event::Departed{worker_id, reason, was_participant}, now, nullptr, out).IgnoreError();
}

absl::StatusOr<uint64_t> SyncRounds::JoinRound(Member& m, uint64_t round, uint64_t carried,
                                               absl::Time now, ModeOutput* out) {
  RoundOutput result;
  if (absl::Status s = Run(round_event::JoinRound{m.id, round, carried}, now, &m, out, &result);
      !s.ok()) {
    return s;
  }
  return result.admitted_round;
}

absl::Status SyncRounds::ReportReady(Member& m, const shoal::v1::ReportReadyRequest& request,
                                     absl::Time now, ModeOutput* out) {
  return Run(round_event::Ready{&request}, now, &m, out);
}

absl::Status SyncRounds::ConnectionsReady(Member& m,
                                          const shoal::v1::ConnectionsReadyRequest& request,
                                          absl::Time now, ModeOutput* out) {
  return Run(round_event::ConnectionsReady{&request}, now, &m, out);
}

absl::Status SyncRounds::ReportRoundDone(Member& m,
                                         const shoal::v1::ReportRoundDoneRequest& request,
                                         absl::Time now, ModeOutput* out) {
  return Run(round_event::RoundDone{&request}, now, &m, out);
}

absl::Status SyncRounds::ReportAudit(Member& m, const shoal::v1::ReportAuditRequest& request,
                                     absl::Time now, ModeOutput* out) {
  return Run(round_event::Audit{&request}, now, &m, out);
}

absl::Status SyncRounds::ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                          absl::Time, ModeOutput* out) {
  bool reassign = false;
  if (absl::Status s = checkpoints_->ReportUpload(request, &reassign); !s.ok()) return s;
  if (reassign) {
    checkpoints_->AssignUpload(request.round(), round_.agreed_hash(),
                               round_.CheckpointCandidates(request.round(), *this),
                               &out->directives);
  }
  return absl::OkStatus();
}

void SyncRounds::Tick(absl::Time now, ModeOutput* out) {
  Run(round_event::Tick{checkpoints_->StalledUpload(now)}, now, nullptr, out).IgnoreError();
}

void SyncRounds::HoldRounds(bool hold, absl::Time now, ModeOutput* out) {
  Run(round_event::Hold{hold}, now, nullptr, out).IgnoreError();
}

// ---------------------------------------------------------- Status, record

void SyncRounds::FillStatus(shoal::v1::RunStatus* s, absl::Time now) const {
  round_.FillStatus(s, now, *this);
  stats_.FillStatus(s);
}

void SyncRounds::FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const {
  stats_.FillWorker(worker_id, w);
  round_.FillWorker(worker_id, w);
}

void SyncRounds::FillRecord(shoal::v1::RunRecord* r, absl::Time now) const {
  round_.FillRecord(r, now);
}

bool SyncRounds::ConsistentForTesting() const { return round_.ConsistentForTesting(*this); }

}  // namespace shoal::coordinator
