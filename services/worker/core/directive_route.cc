#include "services/worker/core/directive_route.h"

#include "services/worker/core/worker_protocol.h"

namespace shoal::worker {

DirectiveRoute RouteDirective(const shoal::v1::CoordinatorMessage& msg) {
  DirectiveRoute r;
  r.upload_grant = msg.has_checkpoint_request() && !msg.checkpoint_request().upload_grant().empty();
  r.use_relay = msg.has_use_relay();
  r.member_update = msg.has_member_update();
  r.to_runner = !r.use_relay && !r.member_update;
  r.interrupts = r.to_runner && WorkerProtocol::Interrupts(msg);
  return r;
}

}  // namespace shoal::worker
