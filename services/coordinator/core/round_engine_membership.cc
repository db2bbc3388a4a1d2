// RoundEngine, membership: Join, sessions and heartbeats, admission to a
// round (DecideAdmission), sitting a round out, departures and leases.
#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/zone.h"
#include "services/coordinator/core/final_average.h"
#include "services/coordinator/core/round_decisions.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/round_engine_internal.h"

namespace shoal::coordinator {
namespace {

using internal::IsHexSha256;
using internal::Share;
using shoal::v1::CoordinatorMessage;

// Whether two heartbeats carry the same sync progress (what Status() shows).
bool SameProgress(const shoal::v1::Heartbeat& a, const shoal::v1::Heartbeat& b) {
  return a.syncing() == b.syncing() && a.sync_bytes_done() == b.sync_bytes_done() &&
         a.sync_bytes_total() == b.sync_bytes_total() && a.sync_sources() == b.sync_sources();
}

absl::Status ValidatePeerAddress(const std::string& address) {
  if (address.empty()) return absl::InvalidArgumentError("peer_address is empty");
  if (address.size() > 256) return absl::InvalidArgumentError("peer_address is too long");
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer_address '", address, "' is not host:port with a port in 1..65535"));
  }
  return absl::OkStatus();
}

// "w<n>" as the engine writes it: n > 0 in decimal with no sign, space or
// leading zero, and below 2^63 so that the next number (n + 1) cannot wrap
// around to ids already handed out (found by the join_request fuzz target).
bool ValidWorkerId(const std::string& id) {
  uint64_t n = 0;
  return id.size() > 1 && id[0] == 'w' && absl::SimpleAtoi(id.substr(1), &n) && n > 0 &&
         n < (uint64_t{1} << 63) && id == absl::StrCat("w", n);
}

}  // namespace

absl::StatusOr<JoinResult> RoundEngine::Join(const shoal::v1::JoinRequest& request,
                                             const std::string& unreachable) {
  if (absl::Status s = ValidatePeerAddress(request.peer_address()); !s.ok()) return s;
  if (absl::Status s = ParseZone(request.zone()).status(); !s.ok()) return s;
  if (!request.model_hash().empty() && !IsHexSha256(request.model_hash())) {
    return absl::InvalidArgumentError("model_hash must be 64 lowercase hex digits (SHA-256)");
  }
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  if (phase_ == shoal::v1::FINISHED) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", options_.run_id, " is finished after round ", last_completed_round_));
  }
  MarkStatusChanged();
  const absl::Time now = clock_->Now();
  JoinResult result;
  Member* member = nullptr;
  const std::string& previous = request.previous_worker_id();
  if (!previous.empty()) {
    auto it = index_.find(previous);
    if (it != index_.end()) member = it->second;
  }
  // A worker (new, or a member re-joining from another address) at the
  // address of another active member means that member's process is gone
  // (its port was reused). Re-joins count too: otherwise two members would
  // share an address, and the next worker there would replace only one
  // (found by the join_request fuzz target).
  std::vector<std::string> replaced;
  for (const auto& [id, m] : members_) {
    if (m.address == request.peer_address() && &m != member) replaced.push_back(id);
  }
  for (const std::string& id : replaced) {
    RemoveMember(id, MemberState::kLeft, "replaced by a worker at the same address",
                 &result.directives);
  }
  if (member == nullptr) {
    if (options_.max_members > 0 && members_.size() >= options_.max_members) {
      return absl::ResourceExhaustedError(
          absl::StrCat("run ", options_.run_id, " is full: ", members_.size(),
                       " members (--max_members=", options_.max_members, ")"));
    }
    std::set<uint32_t> used;
    for (const auto& [id, m] : members_) used.insert(m.data_rank);
    Member m;
    // After a coordinator restart, workers keep their ids and data ranks.
    bool departed = false;
    for (const Member& d : departed_) departed |= d.id == previous;
    if (ValidWorkerId(previous) && !departed) {
      m.id = previous;
      uint64_t n = 0;
      (void)absl::SimpleAtoi(previous.substr(1), &n);
      next_worker_number_ = std::max(next_worker_number_, n + 1);
    } else {
      m.id = absl::StrCat("w", next_worker_number_++);
    }
    // The worker numbering is durable.
    MarkRecordChanged();
    if (request.has_previous_data_rank() && !used.count(request.previous_data_rank())) {
      m.data_rank = request.previous_data_rank();
    } else {
      uint32_t rank = 0;
      while (used.count(rank)) ++rank;
      m.data_rank = rank;
    }
    m.joined_at = now;
    member = &members_.emplace(m.id, std::move(m)).first->second;
    index_[member->id] = member;
    SHOAL_LOG(INFO) << "member joined: " << member->id << " at " << request.peer_address()
                    << " data_rank=" << member->data_rank
                    << " model_round=" << request.model_round() << " round=" << round_
                    << " members=" << members_.size();
  } else {
    SHOAL_LOG(INFO) << "member re-joined: " << member->id << " at " << request.peer_address();
  }
  member->address = request.peer_address();
  member->name = request.name();
  member->zone = request.zone();
  member->outbound_only = request.outbound_only() || !unreachable.empty();
  member->outbound_reason = request.outbound_only() ? "declared (--outbound_only)"
                            : unreachable.empty()   ? ""
                                                    : absl::StrCat("probe: ", unreachable);
  if (member->outbound_only) {
    SHOAL_LOG(INFO) << member->id
                    << " takes part with outbound connections only: " << member->outbound_reason;
  }
  MarkElectionStale();  // a new member or maybe a new zone: the next Tick re-elects
  member->connected = false;
  member->plan_list_known = 0;
  member->last_seen = now;
  member->model_round = request.model_round();
  member->model_hash = request.model_hash();

  // After a restart, workers may hold a round the record had not saved yet
  // (the coordinator died between their reports and the write): adopt it.
  if (fresh_start_ && request.model_round() > last_completed_round_ &&
      !request.model_hash().empty() && phase_ == shoal::v1::WAITING_FOR_MEMBERS &&
      participants_.empty()) {
    SHOAL_LOG(WARNING) << "worker " << member->id << " holds round " << request.model_round()
                       << ", newer than the record's " << last_completed_round_
                       << "; continuing from it";
    last_completed_round_ = request.model_round();
    agreed_hash_ = request.model_hash();
    round_ = last_completed_round_ + 1;
    MarkRecordChanged();
  }

  auto& r = result.response;
  if (roster_.has_value()) {
    // A fresh credential at every join: one a re-joining worker held before
    // stops working.
    shoal::v1::MemberUpdate update;
    r.set_member_credential(roster_->Issue(member->id, &update));
    SendMemberUpdate(std::move(update), &result.directives);
  }
  r.set_worker_id(member->id);
  r.set_outbound_only(member->outbound_only);
  r.set_outbound_reason(member->outbound_reason);
  r.set_data_rank(member->data_rank);
  *r.mutable_config() = options_.config;
  r.set_run_id(options_.run_id);
  r.set_next_round(NextOpenRound(phase_, round_, any_ready_));
  if (!gossip()) {
    // Gossip mode has no agreed model to catch up on: a joiner starts from
    // a peer's model, or from checkpoint_id below (a resumed run).
    r.set_model_round(last_completed_round_);
    r.set_model_hash(agreed_hash_);
    for (const std::string& h : Holders()) {
      if (h != member->address) r.add_holders(h);
    }
  }
  r.set_checkpoint_id(checkpoint_id_);
  r.set_checkpoint_round(checkpoint_round_);
  if (!options_.config.model().file_sha256().empty()) {
    // Spread the file's readers over the members: a window of 8 starting at
    // a place that moves with every join.
    std::vector<const std::string*> open;
    for (const auto& [id, m] : members_) {
      if (m.connected && !m.outbound_only && m.address != member->address) {
        open.push_back(&m.address);
      }
    }
    const size_t n = std::min<size_t>(open.size(), 8);
    for (size_t i = 0; i < n; ++i) {
      r.add_model_file_holders(*open[(joins_for_file_ + i) % open.size()]);
    }
    ++joins_for_file_;
  }
  return result;
}

absl::Status RoundEngine::Connect(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  auto member = FindActive(worker_id);
  if (!member.ok()) return member.status();
  MarkStatusChanged();
  (*member)->connected = true;
  (*member)->plan_list_known = 0;  // a new session has no participant list yet
  (*member)->last_seen = clock_->Now();
  return absl::OkStatus();
}

absl::Status RoundEngine::Heartbeat(const std::string& worker_id,
                                    const shoal::v1::Heartbeat& heartbeat) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  auto member = FindActive(worker_id);
  if (!member.ok()) return member.status();
  (*member)->last_seen = clock_->Now();
  // A heartbeat that only refreshes last_seen leaves a cached status valid
  // (the service bounds its age); sync progress is shown, so it counts.
  // A plain heartbeat (the one Leave sends) keeps the gossip figures shown.
  if ((*member)->progress.gossip() && !heartbeat.gossip()) return absl::OkStatus();
  if (!SameProgress((*member)->progress, heartbeat) || heartbeat.gossip()) MarkStatusChanged();
  (*member)->progress = heartbeat;
  return absl::OkStatus();
}

Directives RoundEngine::Disconnect(const std::string& worker_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  Directives out;
  if (index_.contains(worker_id)) {
    MarkStatusChanged();
    RemoveMember(worker_id, MemberState::kLeft, reason, &out);
  }
  return out;
}

absl::StatusOr<uint64_t> RoundEngine::JoinRound(const std::string& worker_id, uint64_t round,
                                                Directives* out, uint64_t carried) {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  auto found = FindActive(worker_id);
  if (!found.ok()) return found.status();
  Member* member = *found;
  if (gossip()) {
    // No rounds: the member joins the peer list at once.
    MarkStatusChanged();
    member->last_seen = clock_->Now();
    member->state = MemberState::kTraining;
    if (!member->gossiping) {
      member->gossiping = true;
      SHOAL_LOG(INFO) << "member " << worker_id << " gossips (" << members_.size() << " members)";
    }
    phase_ = shoal::v1::TRAINING;
    SendPeerUpdate(out);
    return uint64_t{0};
  }
  AdmissionInput in;
  in.phase = phase_;
  in.round = round_;
  in.any_ready = any_ready_;
  in.requested = round;
  in.participant = IsParticipant(worker_id);
  in.queued = IsQueued(worker_id);
  in.carried = carried;
  const AdmissionDecision admission = DecideAdmission(in);
  using Action = AdmissionDecision::Action;
  if (admission.action == Action::kReject) {
    return absl::FailedPreconditionError(admission.reason);
  }
  MarkStatusChanged();
  if (admission.action == Action::kAlreadyIn) return admission.round;  // a retried call
  member->last_seen = clock_->Now();
  member->carried_round = carried;
  switch (admission.action) {
    case Action::kQueueForThisRound:
      Enqueue(worker_id);
      SHOAL_LOG(INFO) << "member " << worker_id << " waits for round " << round_ << " ("
                      << queued_.size() << "/" << options_.config.sync().min_participants() << ")";
      MaybeStartRound(out);
      break;
    case Action::kJoinRunningRound:
      ResetRoundFlags(*member);
      member->training_since = clock_->Now();
      AddParticipant(worker_id);
      member->state = MemberState::kTraining;
      out->push_back({worker_id, Share(RoundStartMessage(!HoldsAgreedModel(*member)))});
      SHOAL_LOG(INFO) << "member " << worker_id << " joins running round " << round_
                      << " participants=" << participants_.size()
                      << (carried == round_ ? " (carries its trained work)" : "");
      break;
    default:
      Enqueue(worker_id);
      SHOAL_LOG(INFO) << "member " << worker_id << ": " << admission.reason;
      break;
  }
  return admission.round;
}

void RoundEngine::MissRound(const std::string& worker_id, const std::string& reason,
                            Directives* out, bool adaptive) {
  Member& m = At(worker_id);
  RemoveParticipant(worker_id);
  MissedRoundInput in;
  in.missed_before = m.missed_in_row;
  in.adaptive = adaptive;
  // Alive: its session is open and it sent a heartbeat within the last
  // three intervals (a stopped or hung process does not, long before its
  // lease runs out; a slow one does).
  const int64_t interval_ms = options_.config.timeouts().heartbeat_interval_ms();
  const absl::Duration interval =
      interval_ms > 0 ? absl::Milliseconds(interval_ms) : absl::Seconds(1);
  in.alive = m.connected &&
             clock_->Now() - m.last_seen <= std::min(3 * interval, options_.heartbeat_lease);
  const MissedRoundDecision missed = DecideMissedRound(in, options_.max_missed_rounds, reason);
  m.missed_in_row = missed.missed_in_row;
  if (!missed.counts) ++m.rounds_late;
  m.deadline_seconds = ReadyDeadlineSeconds();
  m.fold_round = 0;
  m.missed_reason = absl::StrCat("round ", round_, ": ", reason);
  m.state = MemberState::kWaiting;
  ResetRoundFlags(m);
  SHOAL_LOG(WARNING) << "worker " << worker_id << " sits out round " << round_ << ": " << reason
                     << " (" << m.missed_in_row << " in a row"
                     << (missed.counts ? "" : "; slow, does not count") << ")";
  if (missed.evict) {
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(missed.reason);
    out->push_back({worker_id, Share(std::move(msg))});
    Depart(worker_id, MemberState::kEvicted, missed.reason, out);
    return;
  }
  CoordinatorMessage msg;
  msg.mutable_round_missed()->set_round(round_);
  msg.mutable_round_missed()->set_reason(reason);
  out->push_back({worker_id, Share(std::move(msg))});
  Enqueue(worker_id);  // takes part again from the next round
}

bool RoundEngine::Depart(std::string worker_id, MemberState why, const std::string& reason,
                         Directives* out) {
  auto it = members_.find(worker_id);
  if (it == members_.end()) return false;
  // Out of the round first: its flags leave the counters with it.
  const bool was_participant = RemoveParticipant(worker_id);
  Dequeue(worker_id);
  Member gone = std::move(it->second);
  index_.erase(worker_id);
  members_.erase(it);
  ++departures_;
  gone.state = why;
  gone.reason = reason;
  gone.connected = false;
  SHOAL_LOG(INFO) << "member " << (why == MemberState::kEvicted ? "evicted" : "left") << ": "
                  << worker_id << " round=" << round_ << " reason=\"" << reason
                  << "\" members=" << members_.size();
  departed_.push_back(std::move(gone));
  while (departed_.size() > options_.max_departed_shown) departed_.pop_front();
  ReelectAfterDeparture(worker_id);
  if (shoal::v1::MemberUpdate update; roster_.has_value() && roster_->Revoke(worker_id, &update)) {
    SendMemberUpdate(std::move(update), out);
  }
  return was_participant;
}

void RoundEngine::SendMemberUpdate(shoal::v1::MemberUpdate update, Directives* out) {
  CoordinatorMessage msg;
  *msg.mutable_member_update() = std::move(update);
  SharedMessage shared = Share(std::move(msg));
  for (const auto& [id, m] : members_) {
    if (m.connected) out->push_back({id, shared});
  }
}

SharedMessage RoundEngine::MemberList(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  if (!roster_.has_value() || !index_.contains(worker_id)) return nullptr;
  CoordinatorMessage msg;
  *msg.mutable_member_update() = roster_->Full();
  return Share(std::move(msg));
}

void RoundEngine::RemoveMember(std::string worker_id, MemberState why, const std::string& reason,
                               Directives* out) {
  if (gossip()) {
    auto it = index_.find(worker_id);
    const bool was_gossiping = it != index_.end() && it->second->gossiping;
    Depart(worker_id, why, reason, out);
    if (why == MemberState::kLeft && absl::StartsWith(reason, "finished ")) ++gossip_finished_;
    if (members_.empty() && phase_ != shoal::v1::FINISHED) {
      phase_ = shoal::v1::WAITING_FOR_MEMBERS;
      // With --gossip_steps the run ends when its last worker finished them.
      if (gossip_finished_ > 0) {
        Finish(absl::StrCat(gossip_finished_, " workers finished their gossip steps"), out);
      }
    }
    if (was_gossiping) SendPeerUpdate(out);
    return;
  }
  if (!Depart(worker_id, why, reason, out)) return;
  if (phase_ == shoal::v1::TRAINING) {
    if (participants_.empty()) {
      phase_ = shoal::v1::WAITING_FOR_MEMBERS;
      MaybeStartRound(out);
    } else {
      // Before sharing the round goes on without the worker.
      MaybeSendPlan(out);
    }
  } else if (phase_ == shoal::v1::SHARING) {
    Replan(absl::StrCat("participant ", worker_id, " lost: ", reason), out);
  }
}

void RoundEngine::ExpireLeases(absl::Time now, Directives* out) {
  std::vector<std::pair<std::string, std::string>> expired;
  for (const auto& [id, m] : members_) {
    LeaseDecision lease = DecideLease(m.connected, m.last_seen, options_.heartbeat_lease,
                                      options_.session_grace, now);
    if (lease.expired) expired.emplace_back(id, std::move(lease.reason));
  }
  if (!expired.empty()) MarkStatusChanged();
  for (const auto& [id, reason] : expired) RemoveMember(id, MemberState::kEvicted, reason, out);
}

void RoundEngine::SendPeerUpdate(Directives* out) {
  CoordinatorMessage msg;
  auto* update = msg.mutable_peer_update();
  update->set_version(++peer_list_version_);
  update->set_consensus_evaluator(consensus_evaluator_);
  for (const auto& [id, m] : members_) {
    // Nobody can fetch from a worker behind NAT; it fetches from the others.
    if (!m.gossiping || m.outbound_only) continue;
    auto* p = update->add_peers();
    p->set_worker_id(id);
    p->set_peer_address(m.address);
  }
  // One shared message for every recipient (O(N) bytes each, on changes
  // of the membership only).
  SharedMessage shared = Share(std::move(msg));
  for (const auto& [id, m] : members_) {
    if (m.gossiping) out->push_back({id, shared});
  }
  AssignGossipCheckpointer(out);
}

void RoundEngine::MaybeFinalAverage(Directives* out) {
  if (!options_.config.gossip().final_average() || phase_ == shoal::v1::FINISHED) return;
  std::vector<FinalAverageMember> members;
  members.reserve(members_.size());
  for (const auto& [id, m] : members_) {
    FinalAverageMember f;
    f.worker_id = id;
    f.address = m.address;
    f.outbound_only = m.outbound_only;
    f.done = m.gossiping && m.progress.gossip_done();
    f.recipient = final_recipients_.count(id) > 0;
    f.hash = m.progress.final_hash();
    f.models = m.progress.final_models();
    f.error = m.progress.final_error();
    members.push_back(std::move(f));
  }
  FinalAverageDecision d = DecideFinalAverage(members, final_sent_);
  if (d.summary != final_summary_) {
    final_summary_ = d.summary;
    MarkStatusChanged();
  }
  switch (d.action) {
    case FinalAverageDecision::Action::kWait:
      return;
    case FinalAverageDecision::Action::kSend: {
      CoordinatorMessage msg;
      for (const FinalAverageMember& s : d.sources) {
        auto* p = msg.mutable_gossip_final()->add_sources();
        p->set_worker_id(s.worker_id);
        p->set_peer_address(s.address);
      }
      const SharedMessage shared = Share(std::move(msg));
      for (const FinalAverageMember& m : members) {
        final_recipients_.insert(m.worker_id);
        out->push_back({m.worker_id, shared});
      }
      final_sent_ = true;
      SHOAL_LOG(INFO) << "gossip: every member trained its steps; " << d.summary;
      return;
    }
    case FinalAverageDecision::Action::kFinish:
      Finish(absl::StrCat("gossip: ", d.summary), out);
      return;
  }
}

void RoundEngine::UpdateConsensusEvaluator(Directives* out) {
  if (options_.config.gossip().consensus_eval_every() == 0 || phase_ == shoal::v1::FINISHED) return;
  const Member* current = nullptr;
  const Member* best = nullptr;
  std::string best_id;
  for (const auto& [id, m] : members_) {
    if (!m.gossiping || m.outbound_only) continue;
    if (id == consensus_evaluator_) current = &m;
    if (best == nullptr || m.progress.gossip_steps() > best->progress.gossip_steps()) {
      best = &m;
      best_id = id;
    }
  }
  std::string pick = consensus_evaluator_;
  if (current == nullptr) {
    pick = best_id;  // none yet, or it left: the most trained (or none)
  } else if (best != nullptr && best != current &&
             best->progress.gossip_steps() > 1.5 * current->progress.gossip_steps() + 10) {
    pick = best_id;
  }
  if (pick == consensus_evaluator_) return;
  SHOAL_LOG(INFO) << "gossip: the consensus evaluator is " << (pick.empty() ? "nobody" : pick)
                  << (best != nullptr ? absl::StrCat(" (", best->progress.gossip_steps(),
                                                     " steps, the most trained)")
                                      : std::string());
  consensus_evaluator_ = pick;
  MarkStatusChanged();
  SendPeerUpdate(out);
}

}  // namespace shoal::coordinator
