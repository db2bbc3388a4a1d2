#include "tests/support/faulty_gossip_peer.h"

#include <memory>
#include <string>
#include <utility>

#include "common/crc32c.h"
#include "common/reactor_handoff.h"
#include "common/status_util.h"
#include "common/tensor_wire.h"
#include "common/tensor_wire_grpc.h"
#include "services/worker/core/transfer_checks.h"

namespace shoal::testing {
namespace {

// One GOSSIP read with a fault: copies (no lending), one chunk in flight.
// Deleted in OnDone.
class FaultyGossipRead final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FaultyGossipRead(const worker::GossipBoard* board, const shoal::v1::ReadSliceRequest& request,
                   FaultyGossipPeer::Fault fault)
      : request_(request), fault_(fault) {
    ReactionScope reaction(this);
    absl::StatusOr<std::shared_ptr<const worker::GossipCopy>> copy = board->Find(request.round());
    if (!copy.ok()) {
      FinishOnce(ToGrpcStatus(copy.status()));
      return;
    }
    copy_ = *std::move(copy);
    if (absl::Status s = worker::CheckGossipRange(request, copy_->params.size()); !s.ok()) {
      FinishOnce(ToGrpcStatus(s));
      return;
    }
    next_ = request.begin();
    if (fault_ == FaultyGossipPeer::Fault::kStall) return;  // OnCancel finishes
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this, &buffer_);
    buffer_.Clear();
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken while writing"));
    } else if (fault_ == FaultyGossipPeer::Fault::kTruncate || next_ >= request_.end()) {
      FinishOnce(grpc::Status::OK);  // short on purpose with kTruncate
    } else {
      WriteNext();
    }
  }
  void OnCancel() override {
    ReactionScope reaction(this);
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }

 private:
  void WriteNext() {
    const uint64_t count = NextChunk(next_, request_.end()).count;
    const float* data = copy_->params.data() + next_;
    std::string bytes(reinterpret_cast<const char*>(data), count * kBytesPerElement);
    const uint32_t crc = Crc32c(bytes.data(), bytes.size());
    // The CRC is the true one: the reader must refuse the bytes.
    if (fault_ == FaultyGossipPeer::Fault::kCorrupt) bytes[0] ^= 0x01;
    buffer_ = CopiedChunkBuffer(request_.round(), next_, bytes, crc);
    next_ += count;
    BeforeStart(&buffer_);
    StartWrite(&buffer_);
  }
  void FinishOnce(grpc::Status status) {
    if (finished_.exchange(true)) return;
    Finish(std::move(status));
  }

  const shoal::v1::ReadSliceRequest request_;
  const FaultyGossipPeer::Fault fault_;
  std::shared_ptr<const worker::GossipCopy> copy_;
  uint64_t next_ = 0;
  grpc::ByteBuffer buffer_;
  std::atomic<bool> finished_{false};
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* FaultyGossipPeer::ReadSlice(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  const Fault fault = fault_.load();
  shoal::v1::ReadSliceRequest decoded;
  if (fault != Fault::kNone && DecodeReadSliceRequest(*request, &decoded).ok() &&
      decoded.kind() == shoal::v1::GOSSIP) {
    return new FaultyGossipRead(board_, decoded, fault);
  }
  return inner_->ReadSlice(ctx, request);
}

}  // namespace shoal::testing
