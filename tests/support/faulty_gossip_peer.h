// Test support: fault injection for gossip transfers, kept out of the
// production PeerService. A Peer service registered by the test in place of
// the real one: it serves GOSSIP reads of `board` with the fault the test
// sets, and hands every other call (and GOSSIP reads while the fault is
// kNone) to the real PeerService it wraps.
//
// Thread-safe (the fault is an atomic; gRPC threads serve).
#ifndef SHOAL_TESTS_SUPPORT_FAULTY_GOSSIP_PEER_H_
#define SHOAL_TESTS_SUPPORT_FAULTY_GOSSIP_PEER_H_

#include <atomic>

#include "services/worker/core/gossip_board.h"
#include "services/worker/peer_service.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal::testing {

class FaultyGossipPeer final
    : public shoal::v1::Peer::WithRawCallbackMethod_ReadSlice<shoal::v1::Peer::CallbackService> {
 public:
  // kCorrupt: every chunk's bytes differ from its (true) CRC-32C;
  // kTruncate: the stream ends OK after its first chunk; kStall: nothing is
  // sent (the reader's deadline ends the call).
  enum class Fault { kNone, kCorrupt, kTruncate, kStall };

  // `inner` and `board` outlive this service.
  FaultyGossipPeer(worker::PeerService* inner, const worker::GossipBoard* board)
      : inner_(inner), board_(board) {}
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
  const worker::GossipBoard* const board_;
  std::atomic<Fault> fault_{Fault::kNone};
};

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_FAULTY_GOSSIP_PEER_H_
