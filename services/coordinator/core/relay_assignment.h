// Which relay each member's control plane goes through (docs/SUPERNODES.md
// "Relay", the worker side): with --relay=on, a member of a zone that has an
// elected supernode opens its session and makes its calls through that
// supernode, which carries them over its one Coordinator.Relay stream.
//
// A pure decision: the election, the members' zones and addresses in, one
// assignment per member out. No gRPC, no threads, no clock.
//
// The rules:
// - A member relays through the supernode of its own zone (the zone it
//   names, not an ancestor's): that is the worker its zone's exchange
//   already goes through.
// - A supernode never relays (it holds its own stream), and nobody relays
//   through a member that cannot accept connections (outbound-only, behind
//   NAT) or has no peer address: those members, and the members of a zone
//   without a supernode (the root of a flat run), go direct.
// - Empty relay_id = direct.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_RELAY_ASSIGNMENT_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_RELAY_ASSIGNMENT_H_

#include <string>
#include <vector>

#include "services/coordinator/core/zone_election.h"

namespace shoal::coordinator {

// One member as the relay decision sees it.
struct RelayCandidate {
  std::string id;
  std::string zone;          // a valid zone path; "" = the root
  std::string peer_address;  // its Peer server ("host:port"); empty = none
  bool outbound_only = false;
};

struct RelayAssignment {
  std::string worker_id;
  std::string relay_id;       // empty = direct
  std::string relay_address;  // the relay's Peer address; empty = direct
  // Readable: "through w3, the supernode of eu/paris", "direct: w3 is the
  // supernode of eu/paris", "direct: zone \"\" has no supernode".
  std::string reason;

  bool operator==(const RelayAssignment& o) const {
    return worker_id == o.worker_id && relay_id == o.relay_id && relay_address == o.relay_address;
  }
};

// One assignment per member, in the members' order. O(N) after an O(Z)
// index of the zones.
std::vector<RelayAssignment> AssignRelays(const ElectionResult& election,
                                          const std::vector<RelayCandidate>& members);

// The assignments of `next` that differ from `previous` (by worker id; a
// member absent from `previous` counts as direct before): what must be told
// to the members. Members gone from `next` are not listed.
std::vector<RelayAssignment> ChangedRelays(const std::vector<RelayAssignment>& previous,
                                           const std::vector<RelayAssignment>& next);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_RELAY_ASSIGNMENT_H_
