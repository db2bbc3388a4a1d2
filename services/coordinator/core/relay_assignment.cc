#include "services/coordinator/core/relay_assignment.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace shoal::coordinator {

std::vector<RelayAssignment> AssignRelays(const ElectionResult& election,
                                          const std::vector<RelayCandidate>& members) {
  absl::flat_hash_map<std::string, const RelayCandidate*> by_id;
  by_id.reserve(members.size());
  for (const RelayCandidate& m : members) by_id.emplace(m.id, &m);

  std::vector<RelayAssignment> out;
  out.reserve(members.size());
  for (const RelayCandidate& m : members) {
    RelayAssignment a;
    a.worker_id = m.id;
    const ZoneElection* zone = election.Find(m.zone);
    const std::string shown = absl::StrCat("\"", m.zone, "\"");
    if (zone == nullptr || zone->supernode.empty()) {
      a.reason = absl::StrCat("direct: zone ", shown, " has no supernode");
    } else if (zone->supernode == m.id) {
      a.reason = absl::StrCat("direct: ", m.id, " is the supernode of ", shown);
    } else if (auto it = by_id.find(zone->supernode); it == by_id.end()) {
      a.reason =
          absl::StrCat("direct: supernode ", zone->supernode, " of ", shown, " is not a member");
    } else if (it->second->outbound_only || it->second->peer_address.empty()) {
      a.reason = absl::StrCat("direct: supernode ", zone->supernode, " of ", shown,
                              " accepts no connections");
    } else {
      a.relay_id = zone->supernode;
      a.relay_address = it->second->peer_address;
      a.reason = absl::StrCat("through ", zone->supernode, ", the supernode of ", shown);
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<RelayAssignment> ChangedRelays(const std::vector<RelayAssignment>& previous,
                                           const std::vector<RelayAssignment>& next) {
  absl::flat_hash_map<std::string, const RelayAssignment*> before;
  before.reserve(previous.size());
  for (const RelayAssignment& a : previous) before.emplace(a.worker_id, &a);
  std::vector<RelayAssignment> out;
  for (const RelayAssignment& a : next) {
    auto it = before.find(a.worker_id);
    // A member new to the list was direct (the session it opened).
    const bool changed = it == before.end() ? !a.relay_id.empty() : !(*it->second == a);
    if (changed) out.push_back(a);
  }
  return out;
}

}  // namespace shoal::coordinator
