#include "tests/support/faulty_peer.h"

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

// One read with a fault: copies (no lending), one chunk in flight.
// Deleted in OnDone.
class FaultyRead final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FaultyRead(std::shared_ptr<const std::vector<float>> model,
             const shoal::v1::ReadSliceRequest& request, FaultyPeer::Fault fault)
      : request_(request), fault_(fault), model_(std::move(model)) {
    ReactionScope reaction(this);
    if (absl::Status s = worker::CheckGossipRange(request, model_->size()); !s.ok()) {
      FinishOnce(ToGrpcStatus(s));
      return;
    }
    next_ = request.begin();
    if (fault_ == FaultyPeer::Fault::kStall) return;  // OnCancel finishes
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this, &buffer_);
    buffer_.Clear();
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken while writing"));
    } else if (fault_ == FaultyPeer::Fault::kTruncate || next_ >= request_.end()) {
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
    const float* data = model_->data() + next_;
    std::string bytes(reinterpret_cast<const char*>(data), count * kBytesPerElement);
    if (fault_ == FaultyPeer::Fault::kForge) {
      for (size_t i = 0; i < bytes.size(); i += kBytesPerElement) bytes[i] ^= 0x01;
    }
    const uint32_t crc = Crc32c(bytes.data(), bytes.size());
    // kCorrupt: the CRC is the true one, the reader must refuse the bytes.
    if (fault_ == FaultyPeer::Fault::kCorrupt) bytes[0] ^= 0x01;
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
  const FaultyPeer::Fault fault_;
  const std::shared_ptr<const std::vector<float>> model_;
  uint64_t next_ = 0;
  grpc::ByteBuffer buffer_;
  std::atomic<bool> finished_{false};
};

}  // namespace

FaultyPeer::Source FaultyPeer::Gossip(const worker::GossipBoard* board) {
  return [board](const shoal::v1::ReadSliceRequest& request)
             -> std::shared_ptr<const std::vector<float>> {
    if (request.kind() != shoal::v1::GOSSIP) return nullptr;
    absl::StatusOr<std::shared_ptr<const worker::GossipCopy>> copy = board->Find(request.round());
    if (!copy.ok()) return nullptr;  // the real service refuses it the same way
    // Shares the copy's ownership, points at its parameters.
    return std::shared_ptr<const std::vector<float>>(*copy, &(*copy)->params);
  };
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* FaultyPeer::ReadSlice(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* request) {
  const Fault fault = fault_.load();
  shoal::v1::ReadSliceRequest decoded;
  if (fault != Fault::kNone && DecodeReadSliceRequest(*request, &decoded).ok()) {
    if (std::shared_ptr<const std::vector<float>> model = source_(decoded)) {
      return new FaultyRead(std::move(model), decoded, fault);
    }
  }
  return inner_->ReadSlice(ctx, request);
}

}  // namespace shoal::testing
