#include "services/worker/peer_service.h"

#include <algorithm>

#include "common/chunk_codec.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/status_util.h"

namespace shoal::worker {
namespace {

constexpr uint64_t kChunkElements = kChunkBytes / kBytesPerElement;

// Writes one slice chunk by chunk; each chunk is encoded from model memory
// just before it is written, so at most one chunk is buffered per stream.
class ReadSliceReactor : public grpc::ServerWriteReactor<shoal::v1::TensorChunk> {
 public:
  ReadSliceReactor(const ModelState* state, const shoal::v1::ReadSliceRequest& request)
      : state_(state), round_(request.round()), next_(request.begin()), end_(request.end()) {
    absl::Status s = state->CheckRead(request);
    if (!s.ok()) {
      SHOAL_VLOG(1) << "ReadSlice from " << request.reader_id() << " refused: " << s;
      Finish(ToGrpcStatus(s));
      return;
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken while writing"));
    } else if (next_ < end_) {
      WriteNext();
    } else {
      Finish(grpc::Status::OK);
    }
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const uint64_t count = std::min(kChunkElements, end_ - next_);
    EncodeChunk(round_, next_, state_->parameters() + next_, count, &chunk_);
    next_ += count;
    StartWrite(&chunk_);
  }

  const ModelState* const state_;
  const uint64_t round_;
  uint64_t next_;
  const uint64_t end_;
  shoal::v1::TensorChunk chunk_;
};

}  // namespace

grpc::ServerWriteReactor<shoal::v1::TensorChunk>* PeerService::ReadSlice(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReadSliceRequest* request) {
  return new ReadSliceReactor(state_, *request);
}

grpc::ServerUnaryReactor* PeerService::GetPeerInfo(grpc::CallbackServerContext* ctx,
                                                   const shoal::v1::GetPeerInfoRequest* request,
                                                   shoal::v1::PeerInfo* response) {
  auto* reactor = ctx->DefaultReactor();
  *response = state_->Info();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace shoal::worker
