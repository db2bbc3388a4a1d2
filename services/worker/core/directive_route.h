// Where one coordinator message goes on a worker (pure): the part the host
// applies at once on the session's thread, and whether the mode's runner
// gets it as an event. One place decides, for every mode: the host's
// session handler (Worker::OnSessionMessage) only follows it.
#ifndef SHOAL_SERVICES_WORKER_CORE_DIRECTIVE_ROUTE_H_
#define SHOAL_SERVICES_WORKER_CORE_DIRECTIVE_ROUTE_H_

#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

struct DirectiveRoute {
  // The store asks for this grant with the checkpoint's upload
  // (common/upload_grant.h): handed to the store client at once.
  bool upload_grant = false;
  // Move the session and the calls (docs/SUPERNODES.md "Relay"); the
  // coordinator client's router thread does it, never the session's.
  bool use_relay = false;
  // Applied to the member set at once: a member that just joined may read
  // from this worker right away.
  bool member_update = false;
  // The runner's protocol decides what it means (queued as an event).
  bool to_runner = false;
  // It makes a running exchange pointless (WorkerProtocol::Interrupts): the
  // exchange is cancelled at once, not when the runner takes the event.
  bool interrupts = false;
};

DirectiveRoute RouteDirective(const shoal::v1::CoordinatorMessage& message);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_DIRECTIVE_ROUTE_H_
