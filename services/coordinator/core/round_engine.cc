// RoundEngine: the facade. Takes the lock, finds the caller, hands each call
// to the part it concerns, and composes what spans the parts: a join, a
// departure, the end of the run, the status and the record.
#include "services/coordinator/core/round_engine.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/coordinator/core/gossip_peers.h"
#include "services/coordinator/core/sync_rounds.h"

namespace shoal::coordinator {
namespace {

using shoal::v1::CoordinatorMessage;

}  // namespace

RoundEngine::RoundEngine(EngineOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      started_at_(clock->Now()),
      membership_(options_, clock_, &versions_, started_at_),
      topology_(options_, clock_, &versions_, &membership_),
      checkpoints_(options_, clock_, &versions_, &membership_),
      mode_(MakeMode()) {
  if (options_.resume.has_value()) {
    absl::MutexLock lock(&mu_);
    const shoal::v1::RunRecord& r = *options_.resume;
    membership_.Resume(r);
    checkpoints_.Resume(r);
    layouts_.Resume(r);
    mode_->Resume(r, clock_->Now());
  }
}

std::unique_ptr<RunMode> RoundEngine::MakeMode() {
  // The mode is the run config's, once: no other part asks which it is.
  if (options_.config.has_gossip()) {
    return std::make_unique<GossipPeers>(options_, &versions_, &membership_, &checkpoints_);
  }
  SyncRounds::RoundStartGate gate;
  if (options_.before_round_start) {
    // Under the lock, in the call that would start the round: a change
    // made earlier in the call (the round that just completed) gets its
    // version now, so that the record handed out is known by its own
    // version: with the version of the state before it, a writer that
    // already saved that version would skip the write, and the RoundStart
    // would go out before the completed round is in the record.
    gate = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      versions_.CommitRecord();
      return options_.before_round_start(CurrentRecord(), versions_.record_version());
    };
  }
  return std::make_unique<SyncRounds>(options_, &versions_, &membership_, &topology_, &checkpoints_,
                                      std::move(gate), started_at_);
}

RoundEngine::~RoundEngine() = default;

// ----------------------------------------------------------------- Members

absl::StatusOr<JoinResult> RoundEngine::Join(const shoal::v1::JoinRequest& request,
                                             const std::string& unreachable) {
  if (absl::Status s = Membership::CheckJoinRequest(request); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  if (mode_->phase() == shoal::v1::FINISHED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run ", options_.run_id, " is finished after round ", mode_->last_completed_round()));
  }
  if (request.has_layout()) {
    if (absl::Status s = layouts_.Check(request.layout()); !s.ok()) return s;
  }
  const absl::Time now = clock_->Now();
  if (absl::Status s = mode_->CheckJoin(request, now); !s.ok()) return s;
  versions_.MarkStatusChanged();
  JoinResult result;
  const std::string& previous = request.previous_worker_id();
  Member* member = previous.empty() ? nullptr : membership_.Find(previous);
  // A worker (new, or a member re-joining from another address) at the
  // address of another active member means that member's process is gone.
  for (const std::string& id : membership_.AtAddress(request.peer_address(), member)) {
    Remove(id, MemberState::kLost, "replaced by a worker at the same address", now,
           &result.directives);
  }
  if (member == nullptr && options_.max_pending_joins > 0 &&
      membership_.pending() >= options_.max_pending_joins) {
    return absl::UnavailableError(
        absl::StrCat(membership_.pending(), " workers joined run ", options_.run_id,
                     " and opened no session yet (--max_pending_joins=", options_.max_pending_joins,
                     "); try again once they have, or once session_grace removed them"));
  }
  if (member == nullptr) {
    absl::StatusOr<Member*> added = membership_.Add(request, mode_->round());
    if (!added.ok()) return added.status();
    member = *added;
  } else {
    SHOAL_LOG(INFO) << "member re-joined: " << member->id << " at " << request.peer_address();
  }
  if (request.has_layout() && layouts_.Record(member->id, request.layout())) {
    versions_.MarkRecordChanged();
  }
  membership_.Refresh(*member, request, unreachable);
  topology_.MarkStale();  // a new member or maybe a new zone: the next Tick re-elects
  mode_->OnJoined(*member, request, now);

  auto& r = result.response;
  // A fresh credential at every join: one a re-joining worker held before
  // stops working.
  if (std::string credential = membership_.IssueCredential(member->id, &result.directives);
      !credential.empty()) {
    r.set_member_credential(std::move(credential));
  }
  r.set_worker_id(member->id);
  r.set_outbound_only(member->outbound_only);
  r.set_outbound_reason(member->outbound_reason);
  r.set_data_rank(member->data_rank);
  *r.mutable_config() = options_.config;
  r.set_run_id(options_.run_id);
  mode_->FillJoinResponse(*member, &r);
  if (const shoal::v1::ModelLayout* layout = layouts_.layout()) *r.mutable_layout() = *layout;
  r.set_checkpoint_id(checkpoints_.checkpoint_id());
  r.set_checkpoint_round(checkpoints_.checkpoint_round());
  if (!options_.config.model().file_sha256().empty()) {
    membership_.AddModelFileHolders(*member, &r);
  }
  return result;
}

absl::Status RoundEngine::Connect(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  absl::StatusOr<Member*> member = membership_.FindActive(worker_id);
  if (!member.ok()) return member.status();
  versions_.MarkStatusChanged();
  membership_.Connect(**member);
  mode_->OnConnected(**member, clock_->Now());
  return absl::OkStatus();
}

absl::Status RoundEngine::Heartbeat(const std::string& worker_id,
                                    const shoal::v1::Heartbeat& heartbeat) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  absl::StatusOr<Member*> member = membership_.FindActive(worker_id);
  if (!member.ok()) return member.status();
  // A heartbeat that only refreshes last_seen leaves a cached status valid
  // (the service bounds its age); sync progress is shown, so it counts.
  const absl::Time now = clock_->Now();
  (*member)->last_seen = now;
  if (!mode_->OnHeartbeat(**member, heartbeat, now)) return absl::OkStatus();
  membership_.TakeProgress(**member, heartbeat);
  return absl::OkStatus();
}

Directives RoundEngine::Disconnect(const std::string& worker_id, const std::string& reason,
                                   SessionEnd how) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  Directives out;
  if (membership_.Contains(worker_id)) {
    versions_.MarkStatusChanged();
    MemberState why = MemberState::kLeft;
    std::string said = reason;
    if (mode_->phase() == shoal::v1::FINISHED) {
      why = MemberState::kFinished;
      if (how == SessionEnd::kBroken) said = "its session ended after the run finished";
    } else if (how == SessionEnd::kBroken) {
      why = MemberState::kLost;
    }
    Remove(worker_id, why, said, clock_->Now(), &out);
  }
  return out;
}

void RoundEngine::Remove(const std::string& worker_id, MemberState why, const std::string& reason,
                         absl::Time now, Directives* out) {
  const std::string id = worker_id;  // callers may pass a key that Depart erases
  why = mode_->DepartureState(why, reason);
  const Member* m = membership_.Find(id);
  if (m == nullptr) return;
  // What the status shows of it from now on, taken while every part still
  // knows it.
  shoal::v1::WorkerStatus gone;
  FillWorker(*m, /*active=*/false, now, &gone);
  const bool was_participant = mode_->Forget(id, now);
  Depart(id, why, reason, std::move(gone), out);
  ModeOutput mode;
  mode_->OnDeparted(id, why, reason, was_participant, now, &mode);
  Apply(std::move(mode), out);
}

void RoundEngine::Depart(const std::string& worker_id, MemberState why, const std::string& reason,
                         shoal::v1::WorkerStatus gone, Directives* out) {
  gone.set_state(MemberStateName(why));
  gone.set_reason(reason);
  const uint64_t round = mode_->round();
  membership_.Remove(worker_id, why, reason, std::move(gone), round, out);
  topology_.Forget(worker_id, round);
}

void RoundEngine::Apply(ModeOutput mode, Directives* out) {
  size_t next = 0;
  for (auto& [at, intent] : mode.intents) {
    for (; next < at; ++next) out->push_back(std::move(mode.directives[next]));
    switch (intent.kind) {
      case EngineIntent::Kind::kDepart: {
        // The mode forgot it already: what it showed of it comes along,
        // after what the other parts show.
        const Member* m = membership_.Find(intent.worker_id);
        if (m == nullptr) break;
        shoal::v1::WorkerStatus gone;
        FillWorker(*m, /*active=*/false, clock_->Now(), &gone);
        gone.MergeFrom(intent.shown);
        Depart(intent.worker_id, intent.why, intent.reason, std::move(gone), out);
        break;
      }
      case EngineIntent::Kind::kFinishRun:
      case EngineIntent::Kind::kFailRun:
        EndRun(intent.reason, intent.kind == EngineIntent::Kind::kFailRun, out);
        break;
    }
  }
  for (; next < mode.directives.size(); ++next) out->push_back(std::move(mode.directives[next]));
}

SharedMessage RoundEngine::MemberList(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  return membership_.MemberList(worker_id);
}

bool RoundEngine::IsActive(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  return membership_.Contains(worker_id);
}

uint64_t RoundEngine::departures() const {
  absl::MutexLock lock(&mu_);
  return membership_.departures();
}

// ------------------------------------------------------------ Mode's calls

absl::StatusOr<uint64_t> RoundEngine::JoinRound(const std::string& worker_id, uint64_t round,
                                                Directives* out, uint64_t carried) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  absl::StatusOr<Member*> member = membership_.FindActive(worker_id);
  if (!member.ok()) return member.status();
  ModeOutput mode;
  absl::StatusOr<uint64_t> admitted =
      mode_->JoinRound(**member, round, carried, clock_->Now(), &mode);
  Apply(std::move(mode), out);
  return admitted;
}

absl::Status RoundEngine::ReportReady(const shoal::v1::ReportReadyRequest& request,
                                      Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  absl::StatusOr<Member*> member = membership_.FindActive(request.worker_id());
  if (!member.ok()) return member.status();
  ModeOutput mode;
  const absl::Status s = mode_->ReportReady(**member, request, clock_->Now(), &mode);
  Apply(std::move(mode), out);
  return s;
}

absl::Status RoundEngine::ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request,
                                           Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  absl::StatusOr<Member*> member = membership_.FindActive(request.worker_id());
  if (!member.ok()) return member.status();
  ModeOutput mode;
  const absl::Status s = mode_->ConnectionsReady(**member, request, clock_->Now(), &mode);
  Apply(std::move(mode), out);
  return s;
}

absl::Status RoundEngine::ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request,
                                          Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  absl::StatusOr<Member*> member = membership_.FindActive(request.worker_id());
  if (!member.ok()) return member.status();
  ModeOutput mode;
  const absl::Status s = mode_->ReportRoundDone(**member, request, clock_->Now(), &mode);
  Apply(std::move(mode), out);
  return s;
}

absl::Status RoundEngine::ReportAudit(const shoal::v1::ReportAuditRequest& request,
                                      Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  absl::StatusOr<Member*> member = membership_.FindActive(request.worker_id());
  if (!member.ok()) return member.status();
  ModeOutput mode;
  const absl::Status s = mode_->ReportAudit(**member, request, clock_->Now(), &mode);
  Apply(std::move(mode), out);
  return s;
}

absl::Status RoundEngine::ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                           Directives* out) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  absl::StatusOr<Member*> member = membership_.FindActive(request.worker_id());
  if (!member.ok()) return member.status();
  versions_.MarkStatusChanged();
  ModeOutput mode;
  const absl::Status s = mode_->ReportCheckpoint(request, clock_->Now(), &mode);
  Apply(std::move(mode), out);
  return s;
}

Directives RoundEngine::Tick() {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  Directives out;
  const absl::Time now = clock_->Now();
  const std::vector<std::pair<std::string, std::string>> expired = membership_.ExpiredLeases(now);
  if (!expired.empty()) versions_.MarkStatusChanged();
  for (const auto& [id, reason] : expired) {
    // No heartbeat within the lease: it crashed, froze or was cut off.
    Remove(id, MemberState::kLost, reason, now, &out);
  }
  ModeOutput mode;
  mode_->Tick(now, &mode);
  Apply(std::move(mode), &out);
  topology_.ReelectIfStale(mode_->round());
  // Routes changed by an election since the last tick (relay on).
  topology_.TakeRelayChanges(&out);
  return out;
}

Directives RoundEngine::HoldRounds(bool hold) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  Directives out;
  ModeOutput mode;
  mode_->HoldRounds(hold, clock_->Now(), &mode);
  Apply(std::move(mode), &out);
  return out;
}

void RoundEngine::EndRun(const std::string& reason, bool failed, Directives* out) {
  versions_.MarkRecordChanged();
  CoordinatorMessage msg;
  msg.mutable_run_finished()->set_last_round(mode_->last_completed_round());
  msg.mutable_run_finished()->set_reason(reason);
  if (failed) {
    run_error_ = reason;
    msg.mutable_run_finished()->set_failed(true);
    SHOAL_LOG(ERROR) << "run " << options_.run_id << " stopped: " << reason;
  } else {
    SHOAL_LOG(INFO) << "run " << options_.run_id << " finished: " << reason;
  }
  membership_.EndRun(Share(std::move(msg)), out);
}

SharedMessage RoundEngine::FinishedNotice(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  if (mode_->phase() != shoal::v1::FINISHED || !membership_.Contains(worker_id)) return nullptr;
  CoordinatorMessage msg;
  msg.mutable_run_finished()->set_last_round(mode_->last_completed_round());
  msg.mutable_run_finished()->set_reason(
      run_error_.empty() ? "the run finished before this session opened" : run_error_);
  msg.mutable_run_finished()->set_failed(!run_error_.empty());
  return Share(std::move(msg));
}

// ---------------------------------------------------------------- Topology

ElectionResult RoundEngine::Election() {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  topology_.ReelectIfStale(mode_->round());
  return topology_.election();
}

SharedMessage RoundEngine::RelayRoute(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  if (!membership_.Contains(worker_id)) return nullptr;
  return topology_.RelayRoute(worker_id);
}

// ---------------------------------------------------------- Status, record

shoal::v1::RunStatus RoundEngine::Status() const {
  absl::MutexLock lock(&mu_);
  return StatusLocked();
}

shoal::v1::RunStatus RoundEngine::Status(uint64_t* version) const {
  absl::MutexLock lock(&mu_);
  *version = versions_.status_version();
  return StatusLocked();
}

uint64_t RoundEngine::status_version() const {
  absl::MutexLock lock(&mu_);
  return versions_.status_version();
}

void RoundEngine::FillWorker(const Member& m, bool active, absl::Time now,
                             shoal::v1::WorkerStatus* w) const {
  membership_.FillWorker(m, active, now, w);
  topology_.FillWorker(m.id, active, w);
  mode_->FillWorker(m.id, w);
}

shoal::v1::RunStatus RoundEngine::StatusLocked() const {
  const absl::Time now = clock_->Now();
  shoal::v1::RunStatus s;
  s.set_run_id(options_.run_id);
  *s.mutable_config() = options_.config;
  s.set_started_unix_ms(absl::ToUnixMillis(started_at_));
  s.set_min_participants(options_.config.sync().min_participants());
  s.set_members(membership_.size());
  mode_->FillStatus(&s, now);
  checkpoints_.FillStatus(&s);
  for (const auto& [id, m] : membership_.members())
    FillWorker(m, /*active=*/true, now, s.add_workers());
  for (const shoal::v1::WorkerStatus& w : membership_.departed()) *s.add_workers() = w;
  s.set_departed_not_shown(membership_.departures() - membership_.departed().size());
  s.set_pending_joins(membership_.pending());
  topology_.FillStatus(&s);
  s.set_error(run_error_);
  return s;
}

shoal::v1::RunRecord RoundEngine::Record() const {
  absl::MutexLock lock(&mu_);
  return CurrentRecord();
}

shoal::v1::RunRecord RoundEngine::CurrentRecord() const {
  shoal::v1::RunRecord r;
  r.set_run_id(options_.run_id);
  *r.mutable_config() = options_.config;
  const absl::Time now = clock_->Now();
  mode_->FillRecord(&r, now);
  r.set_next_worker_number(membership_.next_worker_number());
  checkpoints_.FillRecord(&r);
  layouts_.FillRecord(&r);
  r.set_updated_unix_ms(absl::ToUnixMillis(now));
  // A run stopped on an error is not finished: a restart tries again.
  r.set_finished(mode_->phase() == shoal::v1::FINISHED && run_error_.empty());
  return r;
}

uint64_t RoundEngine::record_version() const {
  absl::MutexLock lock(&mu_);
  return versions_.record_version();
}

bool RoundEngine::finished() const {
  absl::MutexLock lock(&mu_);
  return mode_->phase() == shoal::v1::FINISHED;
}

uint64_t RoundEngine::last_completed_round() const {
  absl::MutexLock lock(&mu_);
  return mode_->last_completed_round();
}

bool RoundEngine::CountersConsistentForTesting() const {
  absl::MutexLock lock(&mu_);
  return membership_.ConsistentForTesting() && mode_->ConsistentForTesting();
}

}  // namespace shoal::coordinator
