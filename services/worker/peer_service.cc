#include "services/worker/peer_service.h"

#include <grpcpp/alarm.h>

#include <algorithm>

#include "common/chunk_codec.h"
#include "common/crc32c.h"
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
  ReadSliceReactor(const ModelState* state, RateLimiter* limiter,
                   const shoal::v1::ReadSliceRequest& request, bool corrupt)
      : state_(state),
        limiter_(limiter),
        corrupt_(corrupt),
        round_(request.round()),
        snapshot_(request.kind() == shoal::v1::SNAPSHOT),
        next_(request.begin()),
        end_(request.end()) {
    absl::Status s = state->CheckRead(request, &generation_);
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
    } else if (snapshot_ && state_->snapshot_generation() != generation_) {
      // The bytes sent may mix two models; the reader must start over.
      Finish(grpc::Status(grpc::StatusCode::ABORTED,
                          "the snapshot was replaced by a newer round during the read"));
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
    if (limiter_ != nullptr && limiter_->limited()) {
      const absl::Time when = limiter_->Reserve(count * kBytesPerElement);
      if (when > absl::Now()) {
        // Wait on a timer, not on this gRPC thread.
        alarm_.Set(absl::ToChronoTime(when), [this, count](bool ok) {
          if (!ok) {
            Finish(grpc::Status(grpc::StatusCode::CANCELLED, "upload pacing cancelled"));
            return;
          }
          WriteChunk(count);
        });
        return;
      }
    }
    WriteChunk(count);
  }

  void WriteChunk(uint64_t count) {
    const float* base = snapshot_ ? state_->snapshot() : state_->parameters();
    EncodeChunk(round_, next_, base + next_, count, &chunk_);
    if (corrupt_ && snapshot_) {
      // Test hook: flip one bit per element, then a CRC that matches.
      std::string* data = chunk_.mutable_data();
      for (size_t i = 0; i < data->size(); i += kBytesPerElement) (*data)[i] ^= 0x01;
      chunk_.set_crc32c(Crc32c(data->data(), data->size()));
    }
    next_ += count;
    StartWrite(&chunk_);
  }

  const ModelState* const state_;
  RateLimiter* const limiter_;
  const bool corrupt_;
  grpc::Alarm alarm_;
  const uint64_t round_;
  const bool snapshot_;
  uint64_t generation_ = 0;
  uint64_t next_;
  const uint64_t end_;
  shoal::v1::TensorChunk chunk_;
};

}  // namespace

grpc::ServerWriteReactor<shoal::v1::TensorChunk>* PeerService::ReadSlice(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReadSliceRequest* request) {
  return new ReadSliceReactor(state_, limiter_, *request, corrupt_for_testing_.load());
}

grpc::ServerUnaryReactor* PeerService::GetManifest(
    grpc::CallbackServerContext* ctx, const shoal::v1::GetModelManifestRequest* request,
    shoal::v1::ModelManifest* response) {
  auto* reactor = ctx->DefaultReactor();
  const std::string reader = request->reader_id();
  state_->GetManifest(
      request->round(), [reactor, response, reader](absl::StatusOr<shoal::v1::ModelManifest> m) {
        if (!m.ok()) {
          SHOAL_VLOG(1) << "GetManifest from " << reader << " refused: " << m.status();
          reactor->Finish(ToGrpcStatus(m.status()));
          return;
        }
        *response = *std::move(m);
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
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
