#include "common/tensor_wire_grpc.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/alarm.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/reactor_handoff.h"
#include "common/status_util.h"
#include "shoal/v1/peer.grpc.pb.h"

namespace shoal {
namespace {

const std::string* FindReadSliceMethodPath() {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          shoal::v1::Peer::service_full_name());
  const google::protobuf::Descriptor* in = shoal::v1::ReadSliceRequest::descriptor();
  const google::protobuf::Descriptor* out = shoal::v1::TensorChunk::descriptor();
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* m = service->method(i);
    if (m->input_type() == in && m->output_type() == out && m->server_streaming() &&
        !m->client_streaming()) {
      return new std::string(absl::StrCat("/", service->full_name(), "/", m->name()));
    }
  }
  SHOAL_LOG(ERROR) << "shoal.v1.Peer has no server-streaming method from ReadSliceRequest to "
                      "TensorChunk; the tensor wire format cannot work";
  std::abort();
}

}  // namespace

const std::string& ReadSliceMethodPath() {
  static const std::string* const path = FindReadSliceMethodPath();
  return *path;
}

absl::Status DecodeReadSliceRequest(const grpc::ByteBuffer& raw,
                                    shoal::v1::ReadSliceRequest* request) {
  grpc::ByteBuffer copy(raw);  // Deserialize consumes its input; this shares the slices
  if (!grpc::SerializationTraits<shoal::v1::ReadSliceRequest>::Deserialize(&copy, request).ok()) {
    return absl::InvalidArgumentError("the request is not a serialized shoal.v1.ReadSliceRequest");
  }
  return absl::OkStatus();
}

namespace {

grpc::ByteBuffer ChunkBuffer(uint64_t round, uint64_t begin, size_t bytes, grpc::Slice data,
                             uint32_t crc) {
  uint8_t head[kChunkHeaderMaxBytes];
  const size_t head_size = EncodeChunkHeader(round, begin, bytes, head);
  uint8_t tail[kChunkTrailerBytes];
  EncodeChunkTrailer(crc, tail);
  grpc::Slice slices[3] = {grpc::Slice(head, head_size), std::move(data),
                           grpc::Slice(tail, sizeof(tail))};
  return grpc::ByteBuffer(slices, 3);
}

}  // namespace

grpc::ByteBuffer LentChunkBuffer(uint64_t round, uint64_t begin, const float* data, uint64_t count,
                                 uint32_t crc, ReturnLentChunk returned, void* arg) {
  const size_t bytes = count * kBytesPerElement;
  // The slice points at the lender's memory; gRPC never writes through it.
  return ChunkBuffer(round, begin, bytes,
                     grpc::Slice(const_cast<float*>(data), bytes, returned, arg), crc);
}

grpc::ByteBuffer CopiedChunkBuffer(uint64_t round, uint64_t begin, const std::string& bytes,
                                   uint32_t crc) {
  return ChunkBuffer(round, begin, bytes.size(), grpc::Slice(bytes), crc);
}

namespace {

// One Peer.ReadSlice call as a callback reactor. It keeps itself alive
// (self_) until OnDone; the handle the caller holds outlives it.
//
// Reads: one in flight at a time. A hold is taken before StartCall and let
// go when no read will follow (the stream ended, a chunk was refused, the
// consumer stopped, or a paused call was cancelled), so that OnDone cannot
// run while a paused call waits for Resume. No lock of ours is held while
// calling into gRPC: a start may complete inline.
class ChunkStreamReactor final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                                 public ChunkStreamCall,
                                 public std::enable_shared_from_this<ChunkStreamReactor> {
 public:
  ChunkStreamReactor(std::unique_ptr<grpc::ClientContext> ctx,
                     const shoal::v1::ReadSliceRequest& request, std::string source,
                     ChunkStreamCallbacks callbacks)
      : ctx_(std::move(ctx)),
        source_(std::move(source)),
        callbacks_(std::move(callbacks)),
        receiver_(request.round(), request.begin(), request.end()) {
    bool own_buffer = false;
    (void)grpc::SerializationTraits<shoal::v1::ReadSliceRequest>::Serialize(request, &request_,
                                                                            &own_buffer);
  }

  void Start(grpc::GenericStub* stub) {
    self_ = shared_from_this();
    grpc::ClientContext* ctx;
    {
      absl::MutexLock lock(&mu_);
      ctx = ctx_.get();
    }
    stub->PrepareBidiStreamingCall(ctx, ReadSliceMethodPath(), grpc::StubOptions(), this);
    AddHold();
    // The request is the only message: sent with the half-close.
    StartWriteLast(&request_, grpc::WriteOptions());
    BeforeStart(&message_);
    StartRead(&message_);
    StartCall();
  }

  void Resume() override {
    {
      absl::MutexLock lock(&mu_);
      if (!paused_) {
        if (!reads_over_) resume_pending_ = true;
        return;
      }
      paused_ = false;
    }
    BeforeStart(&message_);
    StartRead(&message_);
  }

  void Cancel() override {
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;  // and ctx_ is gone
      cancelled_ = true;
      if (paused_) {
        // No read is in flight: nothing else will let the hold go.
        paused_ = false;
        reads_over_ = true;
        release = true;
      }
      // Under mu_, so that OnDone cannot take the context meanwhile; gRPC
      // never runs a client reaction inside TryCancel.
      ctx_->TryCancel();
    }
    if (release) {
      // On gRPC's executor, not here: letting the hold go may end the call
      // (OnDone, on_done) at once, and Cancel may run inside a cancellation
      // token's callback that on_done's owner unregisters from. The reactor
      // lives until OnDone, which cannot come before this runs.
      release_.Set(std::chrono::system_clock::now(), [this](bool) { RemoveHold(); });
    }
  }

  void OnWriteDone(bool) override {}

  void OnReadDone(bool ok) override {
    ChunkNext next = ChunkNext::kStop;
    {
      ReactionScope reaction(this, &message_);
      if (ok) next = Consume();
    }
    if (!ok || next == ChunkNext::kStop) {
      {
        absl::MutexLock lock(&mu_);
        if (ok) ctx_->TryCancel();  // a refused chunk or the consumer's stop
        reads_over_ = true;
      }
      RemoveHold();
      return;
    }
    if (next == ChunkNext::kPause) {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        reads_over_ = true;
      } else if (!resume_pending_) {
        paused_ = true;
        return;
      } else {
        resume_pending_ = false;
      }
    }
    bool over;
    {
      absl::MutexLock lock(&mu_);
      over = reads_over_;
    }
    if (over) {
      RemoveHold();
      return;
    }
    BeforeStart(&message_);
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    AfterAllReactions(this);
    bool cancelled;
    std::unique_ptr<grpc::ClientContext> ctx;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      cancelled = cancelled_;
      ctx = std::move(ctx_);
    }
    // The context holds a reference to the channel. Let it go before the
    // consumer hears the end: once it has, it may destroy the client, and
    // the last reference to a channel must not be dropped here, on a
    // thread of gRPC's callback queue (the queue would shut down under it).
    ctx.reset();
    absl::Status result;
    if (!bad_.ok()) {
      result = bad_;
    } else if (cancelled) {
      result = absl::CancelledError(absl::StrCat("read from ", source_, " cancelled"));
    } else if (absl::Status s = FromGrpcStatus(status); !s.ok()) {
      result = Annotate(s, source_);
    } else {
      result = Annotate(receiver_.Finish(), absl::StrCat("from ", source_));
    }
    callbacks_.on_done(std::move(result), receiver_.received_until());
    // The last reference may be ours: nothing of this object is used after.
    std::shared_ptr<ChunkStreamReactor> self = std::move(self_);
  }

 private:
  // Parses, checks and hands over one received message.
  ChunkNext Consume() {
    // References to gRPC's receive buffers (~17 per 1 MiB chunk), no copy.
    slices_.clear();
    if (!message_.Dump(&slices_).ok()) {
      bad_ = absl::DataLossError(absl::StrCat("cannot read a chunk's bytes from ", source_));
      return ChunkNext::kStop;
    }
    pieces_.clear();
    for (const grpc::Slice& s : slices_) pieces_.push_back({s.begin(), s.size()});
    if (absl::Status parsed = ParseChunk(pieces_.data(), pieces_.size(), &chunk_); !parsed.ok()) {
      bad_ = Annotate(parsed, absl::StrCat("from ", source_));
      return ChunkNext::kStop;
    }
    absl::StatusOr<ChunkView> view = receiver_.Accept(chunk_);
    if (!view.ok()) {
      bad_ = Annotate(view.status(), absl::StrCat("from ", source_));
      return ChunkNext::kStop;
    }
    const ChunkNext next = callbacks_.on_chunk(*view);
    message_.Clear();
    slices_.clear();
    if (next == ChunkNext::kStop) {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    return next;
  }

  std::unique_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);  // taken by OnDone
  const std::string source_;
  const ChunkStreamCallbacks callbacks_;
  grpc::ByteBuffer request_;
  // Touched by one read's reaction at a time (reads never overlap).
  grpc::ByteBuffer message_;
  std::vector<grpc::Slice> slices_;
  std::vector<BytePiece> pieces_;
  RawChunk chunk_;
  ChunkReceiver receiver_;
  absl::Status bad_;  // written in reactions, read in OnDone
  std::shared_ptr<ChunkStreamReactor> self_;
  grpc::Alarm release_;

  absl::Mutex mu_;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool resume_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_over_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::shared_ptr<ChunkStreamCall> StartChunkStream(grpc::GenericStub* stub,
                                                  std::unique_ptr<grpc::ClientContext> ctx,
                                                  const shoal::v1::ReadSliceRequest& request,
                                                  std::string source,
                                                  ChunkStreamCallbacks callbacks) {
  auto call = std::make_shared<ChunkStreamReactor>(std::move(ctx), request, std::move(source),
                                                   std::move(callbacks));
  call->Start(stub);
  return call;
}

absl::Status ReadChunkStream(grpc::GenericStub* stub, std::unique_ptr<grpc::ClientContext> ctx,
                             const shoal::v1::ReadSliceRequest& request, const std::string& source,
                             CancellationToken* canceller,
                             const std::function<bool(const ChunkView&)>& on_chunk) {
  struct Result {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  ChunkStreamCallbacks callbacks;
  callbacks.on_chunk = [&on_chunk](const ChunkView& view) {
    return on_chunk(view) ? ChunkNext::kRead : ChunkNext::kStop;
  };
  callbacks.on_done = [result](absl::Status status, uint64_t) {
    absl::MutexLock lock(&result->mu);
    result->status = std::move(status);
    result->done = true;
  };
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  std::shared_ptr<ChunkStreamCall> call =
      StartChunkStream(stub, std::move(ctx), request, source, std::move(callbacks));
  // The handle keeps the call alive: cancelling after its end is a no-op.
  ScopedCancelCallback cancel(canceller, [call] { call->Cancel(); });
  absl::MutexLock lock(&result->mu);
  // gRPC ends the call by its deadline; past it (and a margin), cancel it.
  // Then wait for its end: on_chunk refers to the caller's frame.
  if (!result->mu.AwaitWithDeadline(absl::Condition(&result->done), deadline + absl::Seconds(5))) {
    result->mu.Unlock();
    call->Cancel();
    result->mu.Lock();
    result->mu.Await(absl::Condition(&result->done));
  }
  return result->status;
}

}  // namespace shoal
