// Who this worker says it is when it joins: the part of every JoinRequest
// that does not depend on the mode's protocol. The host sends it for the
// first join (the mode comes with the answer); each protocol adds what it
// holds (previous id and data rank, the model round) for its re-joins.
#ifndef SHOAL_SERVICES_WORKER_CORE_JOIN_REQUEST_H_
#define SHOAL_SERVICES_WORKER_CORE_JOIN_REQUEST_H_

#include <string>

#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

struct JoinIdentity {
  std::string advertise;  // this worker's peer address
  std::string name;
  std::string zone;  // JoinRequest.zone (common/zone.h)
  bool outbound_only = false;
  // JoinRequest.replay_fingerprint (core/trainer.h ReplayFingerprint).
  std::string replay_fingerprint;
};

// A join request of a worker that holds nothing yet (the first join).
inline shoal::v1::JoinRequest NewJoinRequest(const JoinIdentity& identity) {
  shoal::v1::JoinRequest request;
  request.set_peer_address(identity.advertise);
  request.set_name(identity.name);
  request.set_zone(identity.zone);
  request.set_outbound_only(identity.outbound_only);
  request.set_replay_fingerprint(identity.replay_fingerprint);
  return request;
}

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_JOIN_REQUEST_H_
