// gRPC adapter of the worker's Peer service: streams slices of the flat
// parameter vector, straight from model memory, once ModelState allows it,
// and describes the snapshot (GetManifest) for workers catching up.
#ifndef SHOAL_SERVICES_WORKER_PEER_SERVICE_H_
#define SHOAL_SERVICES_WORKER_PEER_SERVICE_H_

#include <atomic>

#include "common/rate_limiter.h"
#include "services/worker/core/model_state.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal::worker {

// Thread-safe (state lives in ModelState).
class PeerService final : public shoal::v1::Peer::CallbackService {
 public:
  // `limiter` (optional) caps the bytes per second served to all peers.
  explicit PeerService(const ModelState* state, RateLimiter* limiter = nullptr)
      : state_(state), limiter_(limiter) {}

  grpc::ServerWriteReactor<shoal::v1::TensorChunk>* ReadSlice(
      grpc::CallbackServerContext* ctx, const shoal::v1::ReadSliceRequest* request) override;
  grpc::ServerUnaryReactor* GetPeerInfo(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetPeerInfoRequest* request,
                                        shoal::v1::PeerInfo* response) override;
  // Finishes at once from the cached manifest, or after this thread (or
  // another request's) has hashed the snapshot (ModelState::GetManifest).
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetModelManifestRequest* request,
                                        shoal::v1::ModelManifest* response) override;

  // Test hook (fault injection only, never set by the worker): SNAPSHOT
  // reads serve bytes that differ from the model but carry a valid CRC-32C,
  // so only the manifest's digests can catch them.
  void set_corrupt_for_testing(bool corrupt) { corrupt_for_testing_ = corrupt; }

 private:
  const ModelState* const state_;
  RateLimiter* const limiter_;
  std::atomic<bool> corrupt_for_testing_{false};
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_PEER_SERVICE_H_
