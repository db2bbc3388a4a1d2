// Outbound calls to other workers' Peer services, behind an interface so
// that tests can fake peers.
#ifndef SHOAL_SERVICES_WORKER_PEER_CLIENT_H_
#define SHOAL_SERVICES_WORKER_PEER_CLIENT_H_

#include <grpcpp/generic/generic_stub.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/member_credentials.h"
#include "common/tensor_wire.h"
#include "common/tensor_wire_grpc.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal::worker {

class PeerClient {
 public:
  virtual ~PeerClient() = default;
  // Streams [request.begin, request.end) from the peer at `address`. Every
  // chunk is checked (ChunkReceiver) before `on_chunk` sees it; the first bad
  // chunk ends the call with its error. `on_chunk` returning false cancels.
  // The whole call is bounded by `timeout`. The view (and the receive
  // buffers its pieces point into) is valid during the callback only; use
  // ChunkView::CopyTo / AddTo, which work on pieces.
  virtual absl::Status ReadSlice(const std::string& address,
                                 const shoal::v1::ReadSliceRequest& request, absl::Duration timeout,
                                 const std::function<bool(const ChunkView&)>& on_chunk) = 0;
  // ReadSlice that `canceller` (may be null) ends with CANCELLED from
  // another thread (or at once when it is already cancelled). The default implementation can only
  // stop between chunks (fakes that never block need no more); GrpcPeerClient cancels the call
  // itself, so a read waiting for a chunk ends at once.
  virtual absl::Status ReadSliceCancellable(const std::string& address,
                                            const shoal::v1::ReadSliceRequest& request,
                                            absl::Duration timeout,
                                            shoal::CancellationToken* canceller,
                                            const std::function<bool(const ChunkView&)>& on_chunk);
  // Starts a read of [request.begin, request.end) from the peer at `address`
  // and returns at once; `callbacks` hear every checked chunk and the end
  // (common/tensor_wire_grpc.h: ChunkStreamCallbacks, pause and resume).
  // The call is bounded by `timeout`. GrpcPeerClient drives it with gRPC's
  // callback API (no thread); the default runs ReadSlice on a thread of its
  // own, which is enough for fakes.
  virtual std::shared_ptr<ChunkStreamCall> StartReadSlice(
      const std::string& address, const shoal::v1::ReadSliceRequest& request,
      absl::Duration timeout, ChunkStreamCallbacks callbacks);
  // The peer's description of its snapshot of `round` (Peer.GetManifest),
  // within `timeout`; `canceller` (may be null) ends the call early.
  // Default: UNIMPLEMENTED.
  virtual absl::StatusOr<shoal::v1::ModelManifest> GetManifest(const std::string& address,
                                                               uint64_t round,
                                                               const std::string& reader_id,
                                                               absl::Duration timeout,
                                                               shoal::CancellationToken* canceller);
  // Starts GetManifest and returns at once; `done` hears the manifest or
  // the error, once, on any thread; `canceller` (may be null; outlives the
  // call) ends the call early with CANCELLED. GrpcPeerClient uses gRPC's
  // callback API, with GetManifest's short retry of UNAVAILABLE on a gRPC
  // alarm; the default runs GetManifest on a thread of its own (fakes).
  using ManifestDone = std::function<void(absl::StatusOr<shoal::v1::ModelManifest>)>;
  virtual void StartGetManifest(const std::string& address, uint64_t round,
                                const std::string& reader_id, absl::Duration timeout,
                                shoal::CancellationToken* canceller, ManifestDone done);
  // One piece of an encoded slice (Peer.ReadEncoded) within `timeout`;
  // `canceller` (may be null) ends the call early. The caller checks the
  // piece. Default: UNIMPLEMENTED.
  virtual absl::StatusOr<shoal::v1::EncodedPiece> ReadEncoded(
      const std::string& address, const shoal::v1::ReadEncodedRequest& request,
      absl::Duration timeout, shoal::CancellationToken* canceller);
  // Starts ReadEncoded and returns at once; `done` hears the piece or the
  // error, once, on any thread; `canceller` (may be null) ends the call
  // early. GrpcPeerClient uses gRPC's callback API; the default runs
  // ReadEncoded on a thread of its own (fakes).
  using PieceDone = std::function<void(absl::StatusOr<shoal::v1::EncodedPiece>)>;
  virtual void StartReadEncoded(const std::string& address,
                                const shoal::v1::ReadEncodedRequest& request,
                                absl::Duration timeout, shoal::CancellationToken* canceller,
                                PieceDone done);
  // Sends `bytes` to the peer at `address` as one Peer.Push stream
  // (`header` first, then 1 MiB pieces with their CRC-32C), within
  // `timeout`; `canceller` (may be null) ends it early. Default:
  // UNIMPLEMENTED.
  virtual absl::Status Push(const std::string& address, const shoal::v1::PushHeader& header,
                            absl::string_view bytes, absl::Duration timeout,
                            shoal::CancellationToken* canceller);
  // Starts Push and returns at once; `bytes` must stay valid until `done`
  // has heard the call's status, once, on any thread. GrpcPeerClient
  // writes the stream with gRPC's callback API (one 1 MiB piece in flight);
  // the default runs Push on a thread of its own (fakes).
  using StatusDone = std::function<void(absl::Status)>;
  virtual void StartPush(const std::string& address, const shoal::v1::PushHeader& header,
                         absl::string_view bytes, absl::Duration timeout,
                         shoal::CancellationToken* canceller, StatusDone done);
  // Checks that the peer at `address` answers (GetPeerInfo) within `timeout`.
  virtual absl::StatusOr<shoal::v1::PeerInfo> Probe(const std::string& address,
                                                    absl::Duration timeout) = 0;
  // Starts Probe and returns at once; `done` hears the peer's info or the
  // error, once, on any thread; `canceller` (may be null; outlives the
  // call) ends the call early with CANCELLED. GrpcPeerClient uses gRPC's
  // callback API; the default runs Probe on a thread of its own (fakes; it
  // does not hear `canceller`).
  using InfoDone = std::function<void(absl::StatusOr<shoal::v1::PeerInfo>)>;
  virtual void StartProbe(const std::string& address, absl::Duration timeout,
                          shoal::CancellationToken* canceller, InfoDone done);
  // Probes every address of `addresses` at once, within `timeout` in all;
  // result i is address i's (OK: it answered). GrpcPeerClient issues every
  // call at once and waits for them together. The default probes one after
  // the other, each within `timeout`: enough for fakes, which answer at
  // once.
  virtual std::vector<absl::Status> ProbeAll(const std::vector<std::string>& addresses,
                                             absl::Duration timeout);
};

// gRPC implementation; keeps one channel per peer address. Thread-safe.
// ReadSlice reads each TensorChunk as raw bytes and checks and hands over
// its data bytes where gRPC received them (ChunkView pieces; see
// common/tensor_wire_grpc.h): no protobuf parse into a string, no copy
// before the caller's own.
class GrpcPeerClient : public PeerClient {
 public:
  // `credential` (may be null; outlives the client): this worker's member
  // credential, sent with every call (common/member_credentials.h).
  explicit GrpcPeerClient(const MemberCredentialHolder* credential = nullptr,
                          const Clock* clock = RealClock::Get())
      : credential_(credential), clock_(clock) {}

  absl::Status ReadSlice(const std::string& address, const shoal::v1::ReadSliceRequest& request,
                         absl::Duration timeout,
                         const std::function<bool(const ChunkView&)>& on_chunk) override;
  absl::Status ReadSliceCancellable(const std::string& address,
                                    const shoal::v1::ReadSliceRequest& request,
                                    absl::Duration timeout, shoal::CancellationToken* canceller,
                                    const std::function<bool(const ChunkView&)>& on_chunk) override;
  std::shared_ptr<ChunkStreamCall> StartReadSlice(const std::string& address,
                                                  const shoal::v1::ReadSliceRequest& request,
                                                  absl::Duration timeout,
                                                  ChunkStreamCallbacks callbacks) override;
  absl::StatusOr<shoal::v1::ModelManifest> GetManifest(
      const std::string& address, uint64_t round, const std::string& reader_id,
      absl::Duration timeout, shoal::CancellationToken* canceller) override;
  void StartGetManifest(const std::string& address, uint64_t round, const std::string& reader_id,
                        absl::Duration timeout, shoal::CancellationToken* canceller,
                        ManifestDone done) override;
  absl::StatusOr<shoal::v1::EncodedPiece> ReadEncoded(const std::string& address,
                                                      const shoal::v1::ReadEncodedRequest& request,
                                                      absl::Duration timeout,
                                                      shoal::CancellationToken* canceller) override;
  void StartReadEncoded(const std::string& address, const shoal::v1::ReadEncodedRequest& request,
                        absl::Duration timeout, shoal::CancellationToken* canceller,
                        PieceDone done) override;
  absl::Status Push(const std::string& address, const shoal::v1::PushHeader& header,
                    absl::string_view bytes, absl::Duration timeout,
                    shoal::CancellationToken* canceller) override;
  void StartPush(const std::string& address, const shoal::v1::PushHeader& header,
                 absl::string_view bytes, absl::Duration timeout,
                 shoal::CancellationToken* canceller, StatusDone done) override;
  absl::StatusOr<shoal::v1::PeerInfo> Probe(const std::string& address,
                                            absl::Duration timeout) override;
  void StartProbe(const std::string& address, absl::Duration timeout,
                  shoal::CancellationToken* canceller, InfoDone done) override;
  // Asynchronous GetPeerInfo calls (the callback API), one per address,
  // each with the deadline `timeout`; no thread per peer.
  std::vector<absl::Status> ProbeAll(const std::vector<std::string>& addresses,
                                     absl::Duration timeout) override;

 private:
  struct Peer {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<shoal::v1::Peer::Stub> stub;
    // Peer.ReadSlice is read through this as raw bytes (the typed stub
    // would parse each chunk into a protobuf string): StartChunkStream.
    std::unique_ptr<grpc::GenericStub> generic;
  };
  const Peer& PeerFor(const std::string& address);
  // A call's context: its deadline and this worker's member credential.
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout) const;
  const MemberCredentialHolder* const credential_;
  const Clock* const clock_;
  absl::Mutex mu_;
  // Entries are never removed, so references stay valid.
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_PEER_CLIENT_H_
