// Topology: the supernode election, its roles and the relay routes.
#include "services/coordinator/core/topology.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace shoal::coordinator {

Topology::Topology(const EngineOptions& options, const Clock* clock, EngineVersions* versions,
                   const Membership* members)
    : options_(options), clock_(clock), versions_(versions), members_(members) {}

void Topology::Measure(const std::string& worker_id, double step_seconds, double bandwidth_bps) {
  if (step_seconds <= 0 && bandwidth_bps <= 0) return;
  Measurements& m = measured_[worker_id];
  if (step_seconds > 0) m.step_seconds = step_seconds;
  if (bandwidth_bps > 0) m.bandwidth_bps = bandwidth_bps;
}

void Topology::Forget(const std::string& worker_id, uint64_t round) {
  measured_.erase(worker_id);
  if (roles_.contains(worker_id)) {
    Reelect(ElectionTrigger::kMembership, round);  // the standby takes over now
  } else {
    MarkStale();
  }
}

void Topology::Reelect(ElectionTrigger trigger, uint64_t round) {
  std::vector<ElectionMember> input;
  input.reserve(members_->size());
  for (const auto& [id, m] : members_->members()) {
    auto it = measured_.find(id);
    const Measurements measured = it == measured_.end() ? Measurements() : it->second;
    input.push_back({m.id, m.zone, measured.step_seconds, measured.bandwidth_bps, /*alive=*/true});
  }
  ElectionResult next = ElectZones(input, election_, options_.election, trigger, *clock_);
  stale_ = false;
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
                    << (z.standby.empty() ? "(none)" : z.standby) << " round=" << round << " ("
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
  if (changed) versions_->MarkStatusChanged();
  if (options_.config.topology().relay()) UpdateRelayRoutes(round);
}

void Topology::UpdateRelayRoutes(uint64_t round) {
  std::vector<RelayCandidate> candidates;
  candidates.reserve(members_->size());
  for (const auto& [id, m] : members_->members()) {
    candidates.push_back({m.id, m.zone, m.address, m.outbound_only});
  }
  std::vector<RelayAssignment> next = AssignRelays(election_, candidates);
  const std::vector<RelayAssignment> changed = ChangedRelays(relay_routes_, next);
  if (!changed.empty()) {
    // One line per election, not per member (10,000 members move at once).
    SHOAL_LOG(INFO) << "relay routes: " << changed.size() << " changed round=" << round << " (e.g. "
                    << changed.front().worker_id << ": " << changed.front().reason << ")";
  }
  for (const RelayAssignment& a : changed) {
    SHOAL_VLOG(1) << "relay route of " << a.worker_id << ": " << a.reason;
    shoal::v1::CoordinatorMessage msg;
    auto* use = msg.mutable_use_relay();
    use->set_relay_id(a.relay_id);
    use->set_address(a.relay_address);
    use->set_reason(a.reason);
    relay_changes_.push_back({a.worker_id, Share(std::move(msg))});
  }
  relay_routes_ = std::move(next);
  relay_route_of_.clear();
  for (size_t i = 0; i < relay_routes_.size(); ++i) relay_route_of_[relay_routes_[i].worker_id] = i;
}

SharedMessage Topology::RelayRoute(const std::string& worker_id) const {
  if (!options_.config.topology().relay()) return nullptr;
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
  return Share(std::move(msg));
}

void Topology::TakeRelayChanges(Directives* out) {
  for (Directive& d : relay_changes_) out->push_back(std::move(d));
  relay_changes_.clear();
}

void Topology::FillStatus(shoal::v1::RunStatus* s) const {
  for (const ZoneElection& z : election_.zones) {
    shoal::v1::ZoneStatus* zs = s->add_zones();
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
}

void Topology::FillWorker(const std::string& worker_id, bool active,
                          shoal::v1::WorkerStatus* w) const {
  if (auto it = measured_.find(worker_id); it != measured_.end()) {
    w->set_step_seconds(it->second.step_seconds);
    w->set_bandwidth_bytes_per_second(it->second.bandwidth_bps);
  }
  if (active) {
    auto role = roles_.find(worker_id);
    w->set_role(role == roles_.end() ? "member" : role->second);
  }
}

}  // namespace shoal::coordinator
