// RoundEngine, what it reports: Status() (with its phase detail and the
// zone tree), the durable Record(), the plain accessors, and keeping the
// supernode election up to date.
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/coordinator/core/gossip_status.h"
#include "services/coordinator/core/round_engine.h"
#include "services/coordinator/core/round_engine_internal.h"

namespace shoal::coordinator {

const char* RoundEngine::StateName(MemberState s) {
  switch (s) {
    case MemberState::kWaiting:
      return "waiting";
    case MemberState::kTraining:
      return "training";
    case MemberState::kReady:
      return "ready";
    case MemberState::kSharing:
      return "sharing";
    case MemberState::kLeft:
      return "left";
    case MemberState::kEvicted:
      return "evicted";
  }
  return "unknown";
}

std::string RoundEngine::PhaseDetail() const {
  const uint32_t min = std::max<uint32_t>(1, options_.config.sync().min_participants());
  if (gossip()) {
    size_t gossiping = 0;
    for (const auto& [id, m] : members_) gossiping += m.gossiping ? 1 : 0;
    return absl::StrCat("gossip: ", gossiping, " of ", members_.size(),
                        " members training and averaging pair-wise (no rounds)");
  }
  switch (phase_) {
    case shoal::v1::WAITING_FOR_MEMBERS:
      return absl::StrCat(queued_.size(), " of ", min, " participants needed for round ", round_,
                          " (", members_.size(), " members)");
    case shoal::v1::TRAINING:
      return absl::StrCat(ready_count_, "/", participants_.size(), " participants ready");
    case shoal::v1::SHARING: {
      if (!sharing_started_) {
        return absl::StrCat("connecting: ", connected_count_, "/", participants_.size(),
                            " participants reached their peers (attempt ", attempt_, ", retry ",
                            connection_retries_, "/", options_.max_connection_retry, ")");
      }
      return absl::StrCat(done_count_, "/", participants_.size(),
                          " participants done sharing (attempt ", attempt_, ")");
    }
    case shoal::v1::FINISHED:
      return absl::StrCat("finished after round ", last_completed_round_);
    default:
      return "";
  }
}

shoal::v1::RunStatus RoundEngine::Status() const {
  absl::MutexLock lock(&mu_);
  return StatusLocked();
}

shoal::v1::RunStatus RoundEngine::Status(uint64_t* version) const {
  absl::MutexLock lock(&mu_);
  *version = status_version_;
  return StatusLocked();
}

uint64_t RoundEngine::departures() const {
  absl::MutexLock lock(&mu_);
  return departures_;
}

uint64_t RoundEngine::status_version() const {
  absl::MutexLock lock(&mu_);
  return status_version_;
}

shoal::v1::RunStatus RoundEngine::StatusLocked() const {
  const absl::Time now = clock_->Now();
  shoal::v1::RunStatus s;
  s.set_run_id(options_.run_id);
  s.set_phase(phase_);
  s.set_round(round_);
  s.set_last_completed_round(last_completed_round_);
  s.set_min_participants(options_.config.sync().min_participants());
  s.set_members(members_.size());
  for (const auto& id : participants_) s.add_participants(id);
  *s.mutable_config() = options_.config;
  for (const auto& r : recent_rounds_) *s.add_recent_rounds() = r;
  s.set_started_unix_ms(absl::ToUnixMillis(started_at_));
  s.set_model_hash(agreed_hash_);
  s.set_detail(PhaseDetail());
  s.set_connection_retries(connection_retries_);
  s.set_attempt(phase_ == shoal::v1::SHARING ? attempt_ : 0);
  s.set_queued(queued_.size());
  s.set_checkpoint_id(checkpoint_id_);
  s.set_checkpoint_round(checkpoint_round_);
  if (pending_checkpoint_round_ > 0) {
    s.set_checkpoint_pending(
        absl::StrCat("round ", pending_checkpoint_round_, " by ", pending_checkpoint_worker_));
  }
  if (ready_deadline_.deadline != absl::InfiniteFuture() &&
      round_started_at_ != absl::InfinitePast() && !ready_deadline_.reason.empty()) {
    s.set_ready_deadline_seconds(ReadyDeadlineSeconds());
    s.set_ready_deadline_reason(ready_deadline_.reason);
    s.set_ready_deadline_adaptive(ready_deadline_.adaptive);
  }
  auto add = [&](const Member& m, bool active) {
    auto* w = s.add_workers();
    w->set_id(m.id);
    w->set_address(m.address);
    w->set_zone(m.zone);
    w->set_outbound_only(m.outbound_only);
    w->set_outbound_reason(m.outbound_reason);
    w->set_step_seconds(m.step_seconds);
    w->set_bandwidth_bytes_per_second(m.bandwidth_bps);
    if (active) {
      auto role = roles_.find(m.id);
      w->set_role(role == roles_.end() ? "member" : role->second);
    }
    w->set_state(active && m.progress.syncing() ? "syncing" : StateName(m.state));
    w->set_model_hash(m.model_hash);
    w->set_model_round(m.model_round);
    w->set_test_accuracy(m.metrics.test_accuracy());
    w->set_test_loss(m.metrics.test_loss());
    w->set_metrics_round(m.metrics_round);
    w->set_train_loss(m.train_loss);
    w->set_data_rank(m.data_rank);
    if (active) w->set_last_seen_ms_ago(absl::ToInt64Milliseconds(now - m.last_seen));
    w->set_rounds_completed(m.rounds_completed);
    w->set_reason(m.reason);
    w->set_rounds_missed(m.missed_in_row);
    w->set_missed_reason(m.missed_reason);
    if (!m.train_seconds.empty()) {
      std::vector<double> t(m.train_seconds.begin(), m.train_seconds.end());
      std::sort(t.begin(), t.end());
      const size_t n = t.size();
      w->set_train_seconds_median(n % 2 == 1 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2);
    }
    if (!m.ready_times.empty()) {
      w->set_ready_seconds_median(
          absl::ToDoubleSeconds(MedianDuration({m.ready_times.begin(), m.ready_times.end()})));
    }
    w->set_rounds_late(m.rounds_late);
    w->set_bytes_received(m.bytes_received);
    w->set_bytes_sent(m.bytes_sent);
    w->set_compression_ratio(m.compression_ratio);
    w->set_wire_round(m.wire_round);
    w->set_folded_updates(m.folded_updates);
    w->set_last_fold_staleness(m.last_fold_staleness);
    w->set_last_fold_weight(m.last_fold_weight);
    w->set_last_fold_round(m.last_fold_round);
    w->set_last_fold_train_seconds(m.last_fold_train_seconds);
    w->set_deadline_seconds(m.deadline_seconds);
    if (m.progress.gossip()) {
      const shoal::v1::Heartbeat& h = m.progress;
      w->set_gossip(true);
      w->set_gossip_clock(h.gossip_clock());
      w->set_gossip_loss(h.gossip_loss());
      w->set_train_loss(h.gossip_loss());
      if (h.eval_clock() > 0) {
        w->set_test_accuracy(h.test_accuracy());
        w->set_test_loss(h.test_loss());
        w->set_eval_clock(h.eval_clock());
      }
      w->set_fetches_done(h.fetches_done());
      w->set_fetches_timed_out(h.fetches_timed_out());
      w->set_fetches_failed(h.fetches_failed());
      w->set_pushes_merged(h.pushes_merged());
      w->set_last_partner(h.last_partner());
      w->set_last_factor(h.last_factor());
      w->set_gossip_steps(h.gossip_steps());
      if (!h.final_hash().empty()) w->set_model_hash(h.final_hash());
      w->set_final_models(h.final_models());
      w->set_final_error(h.final_error());
    }
    if (active && m.progress.syncing()) {
      w->set_sync_bytes_done(m.progress.sync_bytes_done());
      w->set_sync_bytes_total(m.progress.sync_bytes_total());
      w->set_sync_sources(m.progress.sync_sources());
    }
  };
  for (const auto& [id, m] : members_) add(m, true);
  for (const auto& m : departed_) add(m, false);
  for (const ZoneElection& z : election_.zones) {
    shoal::v1::ZoneStatus* zs = s.add_zones();
    zs->set_path(z.path);
    zs->set_supernode(z.supernode);
    zs->set_standby(z.standby);
    zs->set_reason(z.reason);
    zs->set_standby_reason(z.standby_reason);
    zs->set_cause(z.cause);
    if (z.elected_at != absl::InfinitePast()) {
      zs->set_elected_unix_ms(absl::ToUnixMillis(z.elected_at));
    }
    zs->set_direct_members(z.direct_members);
    zs->set_workers(z.workers);
    zs->set_changes(z.changes);
    zs->set_challenger(z.challenger);
    zs->set_challenger_rounds(z.challenger_streak);
    zs->set_median_step_seconds(z.medians.step_seconds);
    zs->set_median_bandwidth_bytes_per_second(z.medians.bandwidth_bps);
  }
  if (gossip()) {
    std::vector<const google::protobuf::RepeatedField<float>*> projections;
    for (const auto& [id, m] : members_) {
      if (m.progress.gossip()) projections.push_back(&m.progress.projection());
    }
    uint32_t used = 0;
    s.set_consensus_distance(ConsensusDistance(projections, &used));
    s.set_consensus_workers(used);
    s.set_checkpointer(gossip_checkpointer_);
    s.set_final_average(final_summary_);
    // The freshest consensus evaluation (the evaluator may have changed).
    for (const auto& [id, m] : members_) {
      const shoal::v1::Heartbeat& h = m.progress;
      if (h.consensus_models() == 0 || h.consensus_clock() < s.consensus_clock()) continue;
      s.set_consensus_test_accuracy(h.consensus_accuracy());
      s.set_consensus_test_loss(h.consensus_loss());
      s.set_consensus_models(h.consensus_models());
      s.set_consensus_clock(h.consensus_clock());
      s.set_consensus_worker(id);
    }
    s.set_checkpoint_clock(checkpoint_clock_);
    s.set_checkpoint_steps(checkpoint_steps_);
    s.set_checkpoint_worker(checkpoint_worker_);
    if (checkpoint_time_ != absl::InfinitePast()) {
      s.set_checkpoint_unix_ms(absl::ToUnixMillis(checkpoint_time_));
    }
  }
  return s;
}

double RoundEngine::ReadyDeadlineSeconds() const {
  if (ready_deadline_.deadline == absl::InfiniteFuture() ||
      round_started_at_ == absl::InfinitePast()) {
    return 0;
  }
  return absl::ToDoubleSeconds(ready_deadline_.deadline - round_started_at_);
}

// ------------------------------------------------------- Supernode election

ElectionResult RoundEngine::Election() {
  absl::MutexLock lock(&mu_);
  Changes changes(this);
  if (election_stale_) Reelect(ElectionTrigger::kMembership);
  return election_;
}

void RoundEngine::ReelectAfterDeparture(const std::string& worker_id) {
  if (roles_.contains(worker_id)) {
    Reelect(ElectionTrigger::kMembership);  // the standby takes over now
  } else {
    MarkElectionStale();
  }
}

void RoundEngine::Reelect(ElectionTrigger trigger) {
  std::vector<ElectionMember> input;
  input.reserve(members_.size());
  for (const auto& [id, m] : members_) {
    input.push_back({m.id, m.zone, m.step_seconds, m.bandwidth_bps, /*alive=*/true});
  }
  ElectionResult next = ElectZones(input, election_, options_.election, trigger, *clock_);
  election_stale_ = false;
  // Log changes, not evaluations.
  absl::flat_hash_map<std::string, const ZoneElection*> before;
  for (const ZoneElection& z : election_.zones) before[z.path] = &z;
  bool changed = next.zones.size() != election_.zones.size();
  for (size_t i = 0; i < next.zones.size() && !changed; ++i) {
    changed = !SameShown(next.zones[i], election_.zones[i]);
  }
  for (const ZoneElection& z : next.zones) {
    auto it = before.find(z.path);
    const bool same = it != before.end() && it->second->supernode == z.supernode &&
                      it->second->standby == z.standby;
    if (same || (z.supernode.empty() && it == before.end())) continue;
    SHOAL_LOG(INFO) << "zone \"" << z.path << "\": supernode "
                    << (z.supernode.empty() ? "(none)" : z.supernode) << " standby "
                    << (z.standby.empty() ? "(none)" : z.standby) << " round=" << round_ << " ("
                    << z.cause << "; " << z.reason << ")";
  }
  roles_.clear();
  for (const ZoneElection& z : next.zones) {
    if (!z.standby.empty()) roles_.emplace(z.standby, "standby");
  }
  for (const ZoneElection& z : next.zones) {
    if (!z.supernode.empty()) roles_[z.supernode] = "supernode";
  }
  election_ = std::move(next);
  if (changed) MarkStatusChanged();
  if (options_.config.topology().relay()) UpdateRelayRoutes();
}

void RoundEngine::UpdateRelayRoutes() {
  std::vector<RelayCandidate> candidates;
  candidates.reserve(members_.size());
  for (const auto& [id, m] : members_) {
    candidates.push_back({m.id, m.zone, m.address, m.outbound_only});
  }
  std::vector<RelayAssignment> next = AssignRelays(election_, candidates);
  const std::vector<RelayAssignment> changed = ChangedRelays(relay_routes_, next);
  if (!changed.empty()) {
    // One line per election, not per member (10,000 members move at once).
    SHOAL_LOG(INFO) << "relay routes: " << changed.size() << " changed round=" << round_
                    << " (e.g. " << changed.front().worker_id << ": " << changed.front().reason
                    << ")";
  }
  for (const RelayAssignment& a : changed) {
    SHOAL_VLOG(1) << "relay route of " << a.worker_id << ": " << a.reason;
    shoal::v1::CoordinatorMessage msg;
    auto* use = msg.mutable_use_relay();
    use->set_relay_id(a.relay_id);
    use->set_address(a.relay_address);
    use->set_reason(a.reason);
    relay_changes_.push_back({a.worker_id, internal::Share(std::move(msg))});
  }
  relay_routes_ = std::move(next);
  relay_route_of_.clear();
  for (size_t i = 0; i < relay_routes_.size(); ++i) relay_route_of_[relay_routes_[i].worker_id] = i;
}

SharedMessage RoundEngine::RelayRoute(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  if (!options_.config.topology().relay() || !index_.contains(worker_id)) return nullptr;
  // No election here (a burst of session opens would run one each): a
  // member the latest election did not see gets its route from the next
  // Tick's.
  shoal::v1::CoordinatorMessage msg;
  auto* use = msg.mutable_use_relay();
  auto it = relay_route_of_.find(worker_id);
  if (it == relay_route_of_.end()) {
    use->set_reason("direct: not assigned to a relay yet");
  } else {
    const RelayAssignment& a = relay_routes_[it->second];
    use->set_relay_id(a.relay_id);
    use->set_address(a.relay_address);
    use->set_reason(a.reason);
  }
  return internal::Share(std::move(msg));
}

SharedMessage RoundEngine::FinishedNotice(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  if (phase_ != shoal::v1::FINISHED || !index_.contains(worker_id)) return nullptr;
  shoal::v1::CoordinatorMessage msg;
  msg.mutable_run_finished()->set_last_round(last_completed_round_);
  msg.mutable_run_finished()->set_reason("the run finished before this session opened");
  return internal::Share(std::move(msg));
}

shoal::v1::RunRecord RoundEngine::Record() const {
  absl::MutexLock lock(&mu_);
  return RecordLocked();
}

shoal::v1::RunRecord RoundEngine::RecordLocked() const {
  shoal::v1::RunRecord r;
  r.set_run_id(options_.run_id);
  *r.mutable_config() = options_.config;
  r.set_last_completed_round(last_completed_round_);
  r.set_model_hash(agreed_hash_);
  r.set_next_worker_number(next_worker_number_);
  r.set_checkpoint_id(checkpoint_id_);
  r.set_checkpoint_round(checkpoint_round_);
  r.set_updated_unix_ms(absl::ToUnixMillis(clock_->Now()));
  r.set_finished(phase_ == shoal::v1::FINISHED);
  return r;
}

uint64_t RoundEngine::record_version() const {
  absl::MutexLock lock(&mu_);
  return record_version_;
}

bool RoundEngine::finished() const {
  absl::MutexLock lock(&mu_);
  return phase_ == shoal::v1::FINISHED;
}

uint64_t RoundEngine::last_completed_round() const {
  absl::MutexLock lock(&mu_);
  return last_completed_round_;
}

}  // namespace shoal::coordinator
