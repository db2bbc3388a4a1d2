// Outbound calls to other workers' Peer services, behind an interface so
// that tests can fake peers.
#ifndef SHOAL_SERVICES_WORKER_PEER_CLIENT_H_
#define SHOAL_SERVICES_WORKER_PEER_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/chunk_codec.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal::worker {

class PeerClient {
 public:
  virtual ~PeerClient() = default;
  // Streams [request.begin, request.end) from the peer at `address`. Every
  // chunk is checked (ChunkReceiver) before `on_chunk` sees it; the first bad
  // chunk ends the call with its error. `on_chunk` returning false cancels.
  // The whole call is bounded by `timeout`.
  virtual absl::Status ReadSlice(const std::string& address,
                                 const shoal::v1::ReadSliceRequest& request, absl::Duration timeout,
                                 const std::function<bool(const ChunkView&)>& on_chunk) = 0;
  // Checks that the peer at `address` answers (GetPeerInfo) within `timeout`.
  virtual absl::StatusOr<shoal::v1::PeerInfo> Probe(const std::string& address,
                                                    absl::Duration timeout) = 0;
};

// gRPC implementation; keeps one channel per peer address. Thread-safe.
class GrpcPeerClient : public PeerClient {
 public:
  absl::Status ReadSlice(const std::string& address, const shoal::v1::ReadSliceRequest& request,
                         absl::Duration timeout,
                         const std::function<bool(const ChunkView&)>& on_chunk) override;
  absl::StatusOr<shoal::v1::PeerInfo> Probe(const std::string& address,
                                            absl::Duration timeout) override;

 private:
  shoal::v1::Peer::Stub* StubFor(const std::string& address);
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<shoal::v1::Peer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_PEER_CLIENT_H_
