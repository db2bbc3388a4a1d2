#include "services/checkpoint/checkpoint_service.h"

#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/reactor_handoff.h"
#include "common/status_util.h"
#include "common/tensor_wire.h"
#include "common/upload_grant.h"

namespace shoal::checkpoint {

// Counts a stream as running for the service's drain, from its reactor's
// construction to its OnDone.
class StreamGuard {
 public:
  explicit StreamGuard(CheckpointService* service)
      : service_(service), entered_(service->Enter()) {}
  ~StreamGuard() {
    if (entered_) service_->Leave();
  }
  bool entered() const { return entered_; }

 private:
  CheckpointService* const service_;
  const bool entered_;
};

namespace {

const grpc::Status kShuttingDown(grpc::StatusCode::UNAVAILABLE,
                                 "the checkpoint store is shutting down");

using shoal::v1::CheckpointInfo;
using shoal::v1::LayerChunk;
using shoal::v1::UploadChunk;

// Prometheus series of the store (common/metrics.h): one update per call,
// never per chunk.
grpc::Status Counted(const char* op, grpc::Status status) {
  std::string result =
      status.ok() ? "ok"
                  : absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  for (char& c : result) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  Metrics::Counter("shoal_checkpoint_store_operations_total",
                   "Checkpoint store calls by operation and result (ok or the gRPC code).",
                   {{"op", op}, {"result", result}})
      .Add();
  return status;
}

// The committed checkpoints and their bytes (before deduplication of
// identical layers), after each commit or delete.
void CountStored(const CheckpointStore& store) {
  double bytes = 0;
  const std::vector<CheckpointInfo> all = store.List();
  for (const CheckpointInfo& info : all) bytes += static_cast<double>(info.bytes());
  Metrics::Gauge("shoal_checkpoint_store_checkpoints", "Committed checkpoints in the store.")
      .Set(static_cast<double>(all.size()));
  Metrics::Gauge("shoal_checkpoint_store_bytes",
                 "Bytes of the committed checkpoints (sum of their sizes; identical layers are "
                 "stored once on disk).")
      .Set(bytes);
}

// One upload stream: the manifest, then layer chunks; commits when the
// client half-closes. Any error aborts the upload (its temporary files go)
// and ends the call without reading the rest. Deletes itself in OnDone.
class UploadReactor : public grpc::ServerReadReactor<UploadChunk> {
 public:
  // `upload_key` empty: no grant needed; else `grant` (the call's
  // x-shoal-upload-grant) must cover the manifest's run and round at `now`.
  UploadReactor(CheckpointService* service, CheckpointStore* store,
                grpc::CallbackServerContext* ctx, CheckpointInfo* response,
                absl::string_view upload_key, std::string grant, absl::Time now)
      : guard_(service),
        store_(store),
        ctx_(ctx),
        response_(response),
        stream_(store),
        upload_key_(upload_key),
        grant_(std::move(grant)),
        now_(now) {
    ReactionScope reaction(this);
    if (!guard_.entered()) {
      Finish(kShuttingDown);
      return;
    }
    BeforeStart(&in_);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    ReactionScope reaction(this, &in_);
    if (!ok) {
      EndOfStream();
      return;
    }
    const bool first = !started_;
    started_ = true;
    if (first && !upload_key_.empty()) {
      // Before anything is written: only the worker the coordinator asked
      // may upload this run's round.
      if (absl::Status s = CheckGrant(); !s.ok()) {
        Fail(s);
        return;
      }
    }
    if (absl::Status s = stream_.Accept(std::move(in_)); !s.ok()) {
      Fail(s);
      return;
    }
    if (first) SHOAL_VLOG(1) << "upload of " << stream_.id() << " started by " << ctx_->peer();
    in_.Clear();
    BeforeStart(&in_);
    StartRead(&in_);
  }

  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }

 private:
  // Hides the base Finish so that every end of the call is counted once.
  void Finish(const grpc::Status& status) {
    grpc::ServerReadReactor<UploadChunk>::Finish(Counted("upload", status));
  }

  absl::Status CheckGrant() {
    if (!in_.has_manifest()) {
      return absl::InvalidArgumentError("the first message of an upload must carry the manifest");
    }
    absl::StatusOr<UploadGrant> grant = VerifyUploadGrant(upload_key_, grant_, now_);
    if (!grant.ok()) return grant.status();
    RETURN_IF_ERROR(GrantCovers(*grant, in_.manifest().run_id(), in_.manifest().round()));
    SHOAL_VLOG(1) << "upload of round " << in_.manifest().round() << " granted to "
                  << grant->worker_id;
    return absl::OkStatus();
  }

  void EndOfStream() {
    // A client that half-closed has sent everything; a cancelled or broken
    // call must not commit even if every byte arrived.
    if (ctx_->IsCancelled()) {
      Fail(absl::CancelledError("upload cancelled"));
      return;
    }
    absl::StatusOr<CheckpointInfo> info = stream_.Finish();
    if (!info.ok()) {
      Fail(info.status());
      return;
    }
    Metrics::Counter("shoal_checkpoint_store_uploaded_bytes_total",
                     "Bytes of checkpoints committed by uploads.")
        .Add(static_cast<double>(info->bytes()));
    Metrics::Histogram("shoal_checkpoint_store_upload_size_bytes",
                       "Size of each committed checkpoint upload.", Metrics::BytesBuckets())
        .Observe(static_cast<double>(info->bytes()));
    *response_ = std::move(*info);
    CountStored(*store_);
    Finish(grpc::Status::OK);
  }

  void Fail(const absl::Status& status) {
    const std::string what = stream_.id();
    if (absl::IsCancelled(status)) {
      SHOAL_LOG(INFO) << "upload of " << what << " from " << ctx_->peer()
                      << " cancelled (client gone or server stopping); nothing committed";
    } else {
      SHOAL_LOG(WARNING) << "upload of " << what << " from " << ctx_->peer()
                         << " refused: " << status;
    }
    stream_.Abort();  // removes the temporary files
    Finish(ToGrpcStatus(status));
  }

  StreamGuard guard_;
  CheckpointStore* const store_;
  grpc::CallbackServerContext* const ctx_;
  CheckpointInfo* const response_;
  UploadChunk in_;
  UploadStream stream_;
  bool started_ = false;
  const absl::string_view upload_key_;  // the service's, which outlives the call
  const std::string grant_;
  const absl::Time now_;
};

// Streams a byte range of a layer, one chunk read from disk just before it
// is written. Deletes itself in OnDone.
class ReadLayerReactor : public grpc::ServerWriteReactor<LayerChunk> {
 public:
  ReadLayerReactor(CheckpointService* service, CheckpointStore* store,
                   const shoal::v1::ReadLayerRequest& request)
      : guard_(service), layer_(request.layer()) {
    ReactionScope reaction(this);
    if (!guard_.entered()) {
      Finish(kShuttingDown);
      return;
    }
    auto reader =
        store->ReadLayer(request.id(), request.layer(), request.offset(), request.length());
    if (!reader.ok()) {
      SHOAL_VLOG(1) << "ReadLayer refused: " << reader.status();
      Finish(ToGrpcStatus(reader.status()));
      return;
    }
    reader_ = std::move(*reader);
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this, &chunk_);
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken while writing"));
      return;
    }
    WriteNext();
  }

  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }

 private:
  // Hides the base Finish so that every end of the call is counted once.
  void Finish(const grpc::Status& status) {
    grpc::ServerWriteReactor<LayerChunk>::Finish(Counted("read_layer", status));
  }

  void WriteNext() {
    if (reader_->remaining() == 0) {
      Finish(ToGrpcStatus(reader_->Finish()));
      return;
    }
    absl::StatusOr<uint64_t> offset = reader_->Next(kChunkBytes, chunk_.mutable_data());
    if (!offset.ok()) {
      Finish(ToGrpcStatus(offset.status()));
      return;
    }
    chunk_.set_layer(layer_);
    chunk_.set_offset(*offset);
    chunk_.set_crc32c(Crc32c(chunk_.data().data(), chunk_.data().size()));
    BeforeStart(&chunk_);
    StartWrite(&chunk_);
  }

  StreamGuard guard_;
  const uint32_t layer_;
  std::unique_ptr<LayerReader> reader_;
  LayerChunk chunk_;
};

// A stream refused before it starts (no or a wrong token). Deletes itself.
template <class Reactor>
class Refused final : public Reactor {
 public:
  explicit Refused(const grpc::Status& status) {
    ReactionScope reaction(this);
    this->Finish(status);
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }
};

}  // namespace

grpc::ServerReadReactor<UploadChunk>* CheckpointService::Upload(grpc::CallbackServerContext* ctx,
                                                                CheckpointInfo* response) {
  if (grpc::Status allowed = gate_.Check(ctx, Access::kMember); !allowed.ok()) {
    return new Refused<grpc::ServerReadReactor<UploadChunk>>(Counted("upload", allowed));
  }
  std::string grant;
  if (!upload_key_.empty()) {
    auto it = ctx->client_metadata().find(kUploadGrantMetadataKey);
    if (it != ctx->client_metadata().end()) grant.assign(it->second.data(), it->second.size());
  }
  return new UploadReactor(this, store_, ctx, response, upload_key_, std::move(grant),
                           clock_->Now());
}

grpc::ServerUnaryReactor* CheckpointService::List(grpc::CallbackServerContext* ctx,
                                                  const shoal::v1::ListCheckpointsRequest* request,
                                                  shoal::v1::ListCheckpointsResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  if (grpc::Status allowed = gate_.Check(ctx, Access::kMember); !allowed.ok()) {
    reactor->Finish(Counted("list", allowed));
    return reactor;
  }
  if (Draining()) {
    reactor->Finish(Counted("list", kShuttingDown));
    return reactor;
  }
  // The filter is a run id; a malformed one is refused like a bad id.
  if (!request->run_id().empty()) {
    if (absl::Status s = ValidateRunId(request->run_id()); !s.ok()) {
      reactor->Finish(Counted("list", ToGrpcStatus(s)));
      return reactor;
    }
  }
  for (auto& info : store_->List(request->run_id())) {
    *response->add_checkpoints() = std::move(info);
  }
  reactor->Finish(Counted("list", grpc::Status::OK));
  return reactor;
}

grpc::ServerUnaryReactor* CheckpointService::GetManifest(
    grpc::CallbackServerContext* ctx, const shoal::v1::GetManifestRequest* request,
    shoal::v1::Manifest* response) {
  auto* reactor = ctx->DefaultReactor();
  if (grpc::Status allowed = gate_.Check(ctx, Access::kMember); !allowed.ok()) {
    reactor->Finish(Counted("get_manifest", allowed));
    return reactor;
  }
  if (Draining()) {
    reactor->Finish(Counted("get_manifest", kShuttingDown));
    return reactor;
  }
  absl::StatusOr<shoal::v1::Manifest> manifest = store_->GetManifest(request->id());
  if (manifest.ok()) *response = std::move(*manifest);
  reactor->Finish(Counted("get_manifest", ToGrpcStatus(manifest.status())));
  return reactor;
}

grpc::ServerWriteReactor<LayerChunk>* CheckpointService::ReadLayer(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReadLayerRequest* request) {
  if (grpc::Status allowed = gate_.Check(ctx, Access::kMember); !allowed.ok()) {
    return new Refused<grpc::ServerWriteReactor<LayerChunk>>(Counted("read_layer", allowed));
  }
  return new ReadLayerReactor(this, store_, *request);
}

grpc::ServerUnaryReactor* CheckpointService::Delete(
    grpc::CallbackServerContext* ctx, const shoal::v1::DeleteCheckpointRequest* request,
    shoal::v1::DeleteCheckpointResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  if (grpc::Status allowed = gate_.Check(ctx, Access::kAdmin); !allowed.ok()) {
    reactor->Finish(Counted("delete", allowed));
    return reactor;
  }
  if (Draining()) {
    reactor->Finish(Counted("delete", kShuttingDown));
    return reactor;
  }
  const absl::Status deleted = store_->Delete(request->id());
  if (deleted.ok()) CountStored(*store_);
  reactor->Finish(Counted("delete", ToGrpcStatus(deleted)));
  return reactor;
}

bool CheckpointService::Enter() {
  absl::MutexLock lock(&mu_);
  if (draining_) return false;
  ++active_streams_;
  return true;
}

void CheckpointService::Leave() {
  absl::MutexLock lock(&mu_);
  --active_streams_;
}

bool CheckpointService::Draining() {
  absl::MutexLock lock(&mu_);
  return draining_;
}

void CheckpointService::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool CheckpointService::WaitUntilIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_streams_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

}  // namespace shoal::checkpoint
