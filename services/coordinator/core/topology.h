// The run's topology on the coordinator: the supernode election per zone
// (zone_election.h: bottom-up, scores, hysteresis, standby takeover), the
// roles it gives, the measurements it uses (each member's median step time
// and inbound bandwidth from its ReportRoundDone), and with
// RunConfig.topology.relay the route of every member's control plane
// (relay_assignment.h) with the UseRelay directives of the routes that
// changed. The decisions are the pure functions of those files; this keeps
// their results and decides when to re-elect. A part of RoundEngine.
//
// When it re-elects: membership changes mark the election stale and the
// next Tick re-elects (a burst of joins costs one O(N log N) election, not
// one per join); the loss of a supernode or a standby re-elects at once, so
// that the standby takes over before any plan is built; a completed round
// re-elects with its new measurements (the only evaluations that count for
// the hysteresis).
//
// Not thread-safe: owned by RoundEngine and called only with the engine's
// mutex held; it never calls out. It reads the members from Membership.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_TOPOLOGY_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/membership.h"
#include "services/coordinator/core/relay_assignment.h"
#include "services/coordinator/core/zone_election.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

class Topology {
 public:
  Topology(const EngineOptions& options, const Clock* clock, EngineVersions* versions,
           const Membership* members);
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  // Membership changed (a member, maybe a new zone): the next
  // ReelectIfStale re-elects.
  void MarkStale() { stale_ = true; }
  // A member's measurements from a round (ReportRoundDone fields 110-111);
  // 0 = not measured (keeps the last).
  void Measure(const std::string& worker_id, double step_seconds, double bandwidth_bps);
  // `worker_id` was removed from the members: re-elects at once when it
  // held a role (the standby takes over now), else marks the election
  // stale. `round` (the run's current round) is for the log.
  void Forget(const std::string& worker_id, uint64_t round);
  void Reelect(ElectionTrigger trigger, uint64_t round);
  void ReelectIfStale(uint64_t round) {
    if (stale_) Reelect(ElectionTrigger::kMembership, round);
  }
  // The latest election (call ReelectIfStale first for an up-to-date one).
  const ElectionResult& election() const { return election_; }

  // With RunConfig.topology.relay: the UseRelay for a direct session of
  // `worker_id` (its current route, "go direct" included). Null when relay
  // is off.
  SharedMessage RelayRoute(const std::string& worker_id) const;
  // The UseRelay directives of the routes changed by elections since the
  // last call.
  void TakeRelayChanges(Directives* out);

  // The zones in the status.
  void FillStatus(shoal::v1::RunStatus* s) const;
  // What the status shows of a member from this part: its measurements,
  // and its role while `active`.
  void FillWorker(const std::string& worker_id, bool active, shoal::v1::WorkerStatus* w) const;

 private:
  struct Measurements {
    double step_seconds = 0;   // median step time, seconds; 0 = not measured
    double bandwidth_bps = 0;  // median inbound bandwidth, bytes per second
  };
  // After an election with relay on: the members' routes; those that
  // changed are queued in relay_changes_.
  void UpdateRelayRoutes(uint64_t round);

  const EngineOptions& options_;
  const Clock* const clock_;
  EngineVersions* const versions_;
  const Membership* const members_;
  absl::flat_hash_map<std::string, Measurements> measured_;
  // The latest election, whether membership changed since, and the roles it
  // gives (id -> "supernode" / "standby"; absent = "member").
  ElectionResult election_;
  bool stale_ = false;
  absl::flat_hash_map<std::string, const char*> roles_;
  // Every member's route after the latest election, and the UseRelay
  // directives not handed out yet.
  std::vector<RelayAssignment> relay_routes_;
  absl::flat_hash_map<std::string, size_t> relay_route_of_;
  Directives relay_changes_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_TOPOLOGY_H_
