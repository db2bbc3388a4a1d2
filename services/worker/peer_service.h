// gRPC adapter of the worker's Peer service: streams slices of the flat
// parameter vector, straight from model memory, once ModelState allows it,
// and describes the snapshot (GetManifest) for workers catching up.
//
// ReadSlice is served through the generated raw method: each chunk is the
// wire module's zero-copy ByteBuffer (common/tensor_wire_grpc.h) around
// model memory lent by ModelState (see "Lending model memory" in
// core/model_state.h). Chunks are cut on the wire module's 1 MiB grid, so
// most of them are whole cells whose CRC ModelState computed once when
// they became readable.
//
// An AVERAGED read of a slice whose owner has not averaged it yet waits on
// the server (no thread blocked: a ModelState observer plus a timer) until
// it is averaged, for at most `averaged_wait` (and less than the reader's
// deadline); then it fails UNAVAILABLE and the reader may ask again. A
// ReadEncoded of a piece not published yet waits the same way, on the
// EncodedStore (EncodedStore::Await) and a timer.
#ifndef SHOAL_SERVICES_WORKER_PEER_SERVICE_H_
#define SHOAL_SERVICES_WORKER_PEER_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/member_credentials.h"
#include "common/rate_limiter.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/core/gossip_board.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/push_box.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal::worker {

struct PeerServiceOptions {
  // Longest wait of an AVERAGED read for its slice's average, and of a
  // ReadEncoded for a piece not published yet (0: refuse at once with
  // UNAVAILABLE, as before reads were parked).
  absl::Duration averaged_wait = absl::Seconds(2);
  // Time source of the park deadlines (the real clock when null); gRPC's
  // alarms fire the same distance ahead on wall-clock time.
  const Clock* clock = nullptr;
  // Who may read (--token_file, common/auth.h); open by default.
  TokenGate gate;
  // Member credentials (common/member_credentials.h): when set and enabled,
  // ReadSlice, GetManifest, ReadEncoded and GetModelFile also need a current
  // member's credential (PERMISSION_DENIED otherwise). GetPeerInfo (round
  // and gossip figures, no model) needs the token only. Outlives the service.
  const MemberSet* members = nullptr;
  // ReadSlice streams one caller host may have running at once
  // (--max_reads_per_peer); past it RESOURCE_EXHAUSTED. 0 = no limit.
  uint32_t max_reads_per_peer = 0;
};

// Counts the reads running per caller host (max_reads_per_peer).
// Thread-safe. A slot may outlive the ReadSlots that handed it out (a
// reactor that gRPC deletes after the service is gone): the counts live as
// long as the last slot.
class ReadSlots {
 public:
  explicit ReadSlots(uint32_t max) : max_(max) {}
  // A slot held until the last copy of the pointer goes; null when `host`
  // already runs `max` reads. Always a slot when max is 0 (no limit).
  std::shared_ptr<void> Acquire(const std::string& host);
  uint32_t max() const { return max_; }

 private:
  struct Counts {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, uint32_t> running ABSL_GUARDED_BY(mu);
    void Release(const std::string& host);
  };
  const uint32_t max_;
  const std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
};

// Bytes this worker's Peer service handed to gRPC and saw written, by what
// was read (counted per chunk with one relaxed atomic add; the worker turns
// them into Prometheus counters once per action).
struct PeerSentBytes {
  std::atomic<uint64_t> exchange{0};    // CONTRIBUTION and AVERAGED slices
  std::atomic<uint64_t> snapshot{0};    // SNAPSHOT reads (catch-ups, late joins)
  std::atomic<uint64_t> model_file{0};  // GetModelFile pieces
};

// Thread-safe (state lives in ModelState).
class PeerService final
    : public shoal::v1::Peer::WithRawCallbackMethod_ReadSlice<shoal::v1::Peer::CallbackService> {
 public:
  // `limiter` (optional) caps the bytes per second served to all peers.
  explicit PeerService(const ModelState* state, RateLimiter* limiter = nullptr,
                       PeerServiceOptions options = {})
      : state_(state), limiter_(limiter), options_(options) {}
  // `encoded` (may be null: ReadEncoded is UNIMPLEMENTED) serves the
  // encoded exchange's slices; it outlives the service.
  void set_encoded_store(const EncodedStore* encoded) { encoded_ = encoded; }
  // Where pushes of participants behind NAT go (null: Push is
  // UNIMPLEMENTED); it outlives the service.
  void set_push_box(PushBox* box) { push_box_ = box; }
  // A contribution pushed by a participant behind NAT (docs/SUPERNODES.md
  // "NAT"): checked piece by piece, put in the box only when whole.
  grpc::ServerReadReactor<shoal::v1::PushMessage>* Push(grpc::CallbackServerContext* ctx,
                                                        shoal::v1::PushResponse* response) override;

  // A piece of an encoded slice from the EncodedStore (a copy of at most
  // 1 MiB; the store's blobs are immutable).
  grpc::ServerUnaryReactor* ReadEncoded(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::ReadEncodedRequest* request,
                                        shoal::v1::EncodedPiece* response) override;

  // `request` is a serialized ReadSliceRequest (INVALID_ARGUMENT if not).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadSlice(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetPeerInfo(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetPeerInfoRequest* request,
                                        shoal::v1::PeerInfo* response) override;
  // Finishes at once from the cached manifest, or after this thread (or
  // another request's) has hashed the snapshot (ModelState::GetManifest).
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetModelManifestRequest* request,
                                        shoal::v1::ModelManifest* response) override;
  // The run's TorchScript file once SetModelFile gave it (NOT_FOUND before).
  grpc::ServerUnaryReactor* GetModelFile(grpc::CallbackServerContext* ctx,
                                         const shoal::v1::GetModelFileRequest* request,
                                         shoal::v1::ModelFileChunk* response) override;
  // The verified model file this worker serves to workers joining later.
  void SetModelFile(std::string bytes, std::string sha256) {
    auto file =
        std::make_shared<const ModelFileCopy>(ModelFileCopy{std::move(bytes), std::move(sha256)});
    absl::MutexLock lock(&file_mu_);
    model_file_ = std::move(file);
  }

  // What this service has sent, per reader (the worker's metrics).
  const PeerSentBytes& sent() const { return sent_; }

  // Gossip mode: GOSSIP reads are served from `board` (whole published
  // copies, lent zero-copy; each chunk holds its copy until gRPC drops it).
  // Set before the server starts serving gossip reads; null = NOT_FOUND.
  void set_gossip_board(const GossipBoard* board) { gossip_board_ = board; }

 private:
  // The run token (gate), then a current member's credential (members).
  grpc::Status Allowed(const grpc::CallbackServerContext* ctx) const;
  const ModelState* const state_;
  RateLimiter* const limiter_;
  const PeerServiceOptions options_;
  ReadSlots read_slots_{options_.max_reads_per_peer};
  const EncodedStore* encoded_ = nullptr;
  PushBox* push_box_ = nullptr;
  PeerSentBytes sent_;
  struct ModelFileCopy {
    std::string bytes;
    std::string sha256;
  };
  absl::Mutex file_mu_;
  std::shared_ptr<const ModelFileCopy> model_file_ ABSL_GUARDED_BY(file_mu_);
  // The encoded copy of a gossip publication a ReadEncoded of kind GOSSIP
  // asks for (NOT_FOUND outside gossip mode, FAILED_PRECONDITION when the
  // run gossips float32 or the publication was replaced).
  absl::StatusOr<Blob> FindGossipEncoding(const shoal::v1::ReadEncodedRequest& request) const;
  std::atomic<const GossipBoard*> gossip_board_{nullptr};
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_PEER_SERVICE_H_
