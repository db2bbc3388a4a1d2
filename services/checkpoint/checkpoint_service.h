// gRPC adapter of the checkpoint store: decodes requests and chunks (CRC-32C
// checked here, on the wire boundary), calls CheckpointStore and encodes the
// answers. Callback API; each stream handles one message at a time, so an
// upload's memory is one chunk and a download's is one chunk.
#ifndef SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_SERVICE_H_
#define SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_SERVICE_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/clock.h"
#include "services/checkpoint/core/checkpoint_store.h"
#include "shoal/v1/checkpoint.grpc.pb.h"

namespace shoal::checkpoint {

// Thread-safe: the data is in the store; the service itself only counts its
// running streams behind one mutex. The store must outlive the service and
// every call it runs (stop the gRPC server first).
//
// Disk I/O (a chunk's write, a layer's fsync at its end, a 1 MiB read) runs on
// the gRPC callback thread that handles the message: it is bounded per
// message and keeps the stream's flow control simple.
class CheckpointService final : public shoal::v1::Checkpoint::CallbackService {
 public:
  // `gate` decides who may call (common/auth.h): deleting needs the admin
  // token, everything else the run token; open by default.
  // `upload_key` (empty = off): uploads also need an upload grant signed
  // with it (common/upload_grant.h), checked against the manifest's run and
  // round at `clock`'s time (the real clock when null).
  explicit CheckpointService(CheckpointStore* store, TokenGate gate = {},
                             std::string upload_key = "", const Clock* clock = nullptr)
      : store_(store),
        gate_(std::move(gate)),
        upload_key_(std::move(upload_key)),
        clock_(clock != nullptr ? clock : RealClock::Get()) {}

  grpc::ServerReadReactor<shoal::v1::UploadChunk>* Upload(
      grpc::CallbackServerContext* ctx, shoal::v1::CheckpointInfo* response) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx,
                                 const shoal::v1::ListCheckpointsRequest* request,
                                 shoal::v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetManifestRequest* request,
                                        shoal::v1::Manifest* response) override;
  grpc::ServerWriteReactor<shoal::v1::LayerChunk>* ReadLayer(
      grpc::CallbackServerContext* ctx, const shoal::v1::ReadLayerRequest* request) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const shoal::v1::DeleteCheckpointRequest* request,
                                   shoal::v1::DeleteCheckpointResponse* response) override;

  // From now on new calls fail with UNAVAILABLE.
  void StartDraining();
  // Waits up to `timeout` until no upload or read stream is running; true
  // when none is. (gRPC's own Shutdown(deadline) also waits for idle client
  // connections to go away, which can take the whole deadline.)
  bool WaitUntilIdle(absl::Duration timeout);

 private:
  friend class StreamGuard;
  // False when draining; otherwise counts a stream until Leave().
  bool Enter();
  void Leave();
  bool Draining();

  CheckpointStore* const store_;
  const TokenGate gate_;
  const std::string upload_key_;
  const Clock* const clock_;
  absl::Mutex mu_;
  int active_streams_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shoal::checkpoint

#endif  // SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_SERVICE_H_
