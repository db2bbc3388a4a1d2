// One supernode's relay stream (Coordinator.Relay, docs/SUPERNODES.md
// "Relay"): reads the RelayHello, then RelayUp batches that the service
// handles (CoordinatorService::HandleRelayBatch); writes the RelayDown
// messages queued for it (QueuedStream). Deletes itself in OnDone.
#ifndef SHOAL_SERVICES_COORDINATOR_RELAY_REACTOR_H_
#define SHOAL_SERVICES_COORDINATOR_RELAY_REACTOR_H_

#include <atomic>
#include <string>

#include "services/coordinator/coordinator_service.h"
#include "common/queued_stream.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// The read side runs on one gRPC callback at a time; Enqueue and Close are
// thread-safe (QueuedStream); relay_id() is set once, before the service
// learns of the relay.
class RelayReactor : public QueuedStream {
 public:
  RelayReactor(CoordinatorService* service, grpc::CallbackServerContext* ctx);

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  const std::string& relay_id() const { return relay_id_; }

 private:
  // The stream broke or ended: the service forgets the relay (once).
  void Broken(const std::string& reason);

  CoordinatorService* const service_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer in_bytes_;  // read path only
  shoal::v1::RelayUp in_;
  std::string relay_id_;
  std::atomic<bool> broken_{false};
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_RELAY_REACTOR_H_
