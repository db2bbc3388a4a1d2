// Test support: fault injection for model transfers, kept out of the
// production PeerService. A Peer service registered by the test in place of
// the real one: it serves the ReadSlice requests its Source takes (a
// gossip board's copies, a holder's snapshot) with the fault the test sets,
// and hands every other call (and every read while the fault is kNone) to
// the real PeerService it wraps.
//
// Thread-safe (the fault is an atomic; gRPC threads serve).
#ifndef SHOAL_TESTS_SUPPORT_FAULTY_PEER_H_
#define SHOAL_TESTS_SUPPORT_FAULTY_PEER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "services/worker/core/gossip_board.h"
#include "services/worker/peer_service.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal::testing {

class FaultyPeer final
    : public shoal::v1::Peer::WithRawCallbackMethod_ReadSlice<shoal::v1::Peer::CallbackService> {
 public:
  // kCorrupt: every chunk's bytes differ from its (true) CRC-32C;
  // kForge: one bit of every element flipped and a CRC that matches (only
  // the digest of a piece can tell);
  // kTruncate: the stream ends OK after its first chunk; kStall: nothing is
  // sent (the reader's deadline ends the call).
  enum class Fault { kNone, kCorrupt, kForge, kTruncate, kStall };

  // The whole model a read of `request` is served from (the range is
  // checked against it), or null: the read goes to the real service.
  using Source =
      std::function<std::shared_ptr<const std::vector<float>>(const shoal::v1::ReadSliceRequest&)>;
  // GOSSIP reads of `board`'s copies (`board` outlives the source).
  static Source Gossip(const worker::GossipBoard* board);

  // `inner` outlives this service.
  FaultyPeer(worker::PeerService* inner, Source source)
      : inner_(inner), source_(std::move(source)) {}
  void set_fault(Fault fault) { fault_ = fault; }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadSlice(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetPeerInfo(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetPeerInfoRequest* request,
                                        shoal::v1::PeerInfo* response) override {
    return inner_->GetPeerInfo(ctx, request, response);
  }
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::GetModelManifestRequest* request,
                                        shoal::v1::ModelManifest* response) override {
    return inner_->GetManifest(ctx, request, response);
  }
  grpc::ServerUnaryReactor* ReadEncoded(grpc::CallbackServerContext* ctx,
                                        const shoal::v1::ReadEncodedRequest* request,
                                        shoal::v1::EncodedPiece* response) override {
    return inner_->ReadEncoded(ctx, request, response);
  }
  grpc::ServerUnaryReactor* GetModelFile(grpc::CallbackServerContext* ctx,
                                         const shoal::v1::GetModelFileRequest* request,
                                         shoal::v1::ModelFileChunk* response) override {
    return inner_->GetModelFile(ctx, request, response);
  }
  grpc::ServerReadReactor<shoal::v1::PushMessage>* Push(
      grpc::CallbackServerContext* ctx, shoal::v1::PushResponse* response) override {
    return inner_->Push(ctx, response);
  }

 private:
  worker::PeerService* const inner_;
  const Source source_;
  std::atomic<Fault> fault_{Fault::kNone};
};

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_FAULTY_PEER_H_
