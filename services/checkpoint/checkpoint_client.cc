#include "services/checkpoint/checkpoint_client.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/retry.h"
#include "common/sha256.h"
#include "common/status_util.h"
#include "common/tensor_wire.h"
#include "common/upload_grant.h"

namespace shoal::checkpoint {
namespace {

// Idempotent calls to the store: UNAVAILABLE only (a read that hit its
// deadline used up the call's whole budget), within `timeout`.
RetryPolicy StorePolicy(absl::Duration timeout) {
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(50);
  policy.max_backoff = absl::Seconds(1);
  policy.deadline = timeout;
  policy.unavailable_only = true;
  return policy;
}

}  // namespace

absl::Status CompleteManifest(shoal::v1::Manifest* manifest, const std::vector<ByteSpan>& layers) {
  if (static_cast<size_t>(manifest->layers_size()) != layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the manifest has ", manifest->layers_size(),
                                                   " layers, ", layers.size(), " given"));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    auto* l = manifest->mutable_layers(static_cast<int>(i));
    l->set_bytes(layers[i].size());
    l->set_sha256(Sha256Hex(layers[i].data(), layers[i].size()));
  }
  return absl::OkStatus();
}

int ModelLayerCount(const shoal::v1::Manifest& manifest) {
  int n = 0;
  while (n < manifest.layers_size() && !manifest.layers(n).optimizer_state()) ++n;
  return n;
}

int FindStateLayer(const shoal::v1::Manifest& manifest, absl::string_view name) {
  for (int i = 0; i < manifest.layers_size(); ++i) {
    if (manifest.layers(i).optimizer_state() && manifest.layers(i).name() == name) return i;
  }
  return -1;
}

absl::Status ReadWholeLayer(CheckpointClient* client, const std::string& id,
                            const shoal::v1::Manifest& manifest, uint32_t layer,
                            std::vector<uint8_t>* out,
                            const std::function<void(uint64_t)>& on_bytes) {
  if (layer >= static_cast<uint32_t>(manifest.layers_size())) {
    return absl::OutOfRangeError(
        absl::StrCat("layer ", layer, ": the manifest has ", manifest.layers_size(), " layers"));
  }
  const shoal::v1::LayerEntry& l = manifest.layers(layer);
  out->assign(l.bytes(), 0);
  uint64_t received = 0;
  absl::Status s = client->ReadLayer(id, layer, 0, l.bytes(), [&](uint64_t offset, ByteSpan data) {
    if (offset + data.size() > out->size()) return false;
    std::memcpy(out->data() + offset, data.data(), data.size());
    received += data.size();
    if (on_bytes) on_bytes(received);
    return true;
  });
  if (absl::IsCancelled(s)) {
    return absl::DataLossError(absl::StrCat("layer '", l.name(), "' of ", id,
                                            ": the store sent more than ", l.bytes(), " bytes"));
  }
  RETURN_IF_ERROR(s);
  if (received != l.bytes()) {
    return absl::DataLossError(absl::StrCat("layer '", l.name(), "' of ", id, ": got ", received,
                                            " of ", l.bytes(), " bytes"));
  }
  const std::string digest = Sha256Hex(out->data(), out->size());
  if (digest != l.sha256()) {
    return absl::DataLossError(absl::StrCat("layer '", l.name(), "' of ", id, " hashes to ", digest,
                                            ", the manifest says ", l.sha256()));
  }
  return absl::OkStatus();
}

GrpcCheckpointClient::GrpcCheckpointClient(const std::string& address,
                                           CheckpointClientOptions options)
    : address_(address),
      options_(options),
      stub_(shoal::v1::Checkpoint::NewStub(MakeChannel(address))) {}

absl::StatusOr<shoal::v1::CheckpointInfo> GrpcCheckpointClient::Upload(
    const shoal::v1::Manifest& manifest, const std::vector<ByteSpan>& layers) {
  if (static_cast<size_t>(manifest.layers_size()) != layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the manifest has ", manifest.layers_size(),
                                                   " layers, ", layers.size(), " given"));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& l = manifest.layers(static_cast<int>(i));
    if (l.bytes() != layers[i].size()) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", i, " '", l.name(),
                                                     "': manifest says ", l.bytes(), " bytes, ",
                                                     layers[i].size(), " given"));
    }
  }
  const size_t chunk_bytes = std::clamp<size_t>(options_.chunk_bytes, 1, kMaxChunkBytes);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(options_.transfer_timeout));
  ScopedCancelCallback cancel(options_.stop, [&ctx] { ctx.TryCancel(); });
  {
    absl::MutexLock lock(&grant_mu_);
    if (!grant_.empty()) ctx.AddMetadata(kUploadGrantMetadataKey, grant_);
  }
  shoal::v1::CheckpointInfo info;
  std::unique_ptr<grpc::ClientWriter<shoal::v1::UploadChunk>> writer = stub_->Upload(&ctx, &info);
  shoal::v1::UploadChunk msg;
  *msg.mutable_manifest() = manifest;
  bool ok = writer->Write(msg);
  // One chunk is encoded at a time, straight from the caller's memory.
  shoal::v1::LayerChunk* chunk = msg.mutable_data();
  for (size_t i = 0; ok && i < layers.size(); ++i) {
    const ByteSpan data = layers[i];
    for (size_t off = 0; ok && off < data.size(); off += chunk_bytes) {
      const size_t n = std::min(chunk_bytes, data.size() - off);
      chunk->set_layer(static_cast<uint32_t>(i));
      chunk->set_offset(off);
      chunk->mutable_data()->assign(reinterpret_cast<const char*>(data.data() + off), n);
      chunk->set_crc32c(Crc32c(chunk->data().data(), n));
      ok = writer->Write(msg);
    }
  }
  // When a Write fails the server has ended the call; Finish says why.
  if (ok) writer->WritesDone();
  absl::Status s = FromGrpcStatus(writer->Finish());
  if (!s.ok()) return Annotate(s, absl::StrCat("upload to ", address_));
  return info;
}

absl::StatusOr<std::vector<shoal::v1::CheckpointInfo>> GrpcCheckpointClient::List(
    const std::string& run_id) {
  shoal::v1::ListCheckpointsRequest request;
  request.set_run_id(run_id);
  shoal::v1::ListCheckpointsResponse response;
  absl::Status s = Retry(StorePolicy(options_.call_timeout), nullptr, [&](absl::Duration left) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(left));
    return FromGrpcStatus(stub_->List(&ctx, request, &response));
  });
  if (!s.ok()) return Annotate(s, absl::StrCat("list checkpoints at ", address_));
  return std::vector<shoal::v1::CheckpointInfo>(response.checkpoints().begin(),
                                                response.checkpoints().end());
}

absl::StatusOr<shoal::v1::Manifest> GrpcCheckpointClient::GetManifest(const std::string& id) {
  shoal::v1::GetManifestRequest request;
  request.set_id(id);
  shoal::v1::Manifest manifest;
  absl::Status s = Retry(StorePolicy(options_.call_timeout), nullptr, [&](absl::Duration left) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(left));
    return FromGrpcStatus(stub_->GetManifest(&ctx, request, &manifest));
  });
  if (!s.ok()) return Annotate(s, absl::StrCat("manifest of ", id, " at ", address_));
  return manifest;
}

absl::Status GrpcCheckpointClient::ReadLayer(const std::string& id, uint32_t layer, uint64_t offset,
                                             uint64_t length, const LayerSink& sink) {
  const std::string what = absl::StrCat("layer ", layer, " of ", id, " at ", address_);
  const bool bounded = length != 0;
  const uint64_t end = offset + length;  // when bounded
  uint64_t next = offset;
  // A retried read resumes at `next`, so nothing is delivered twice.
  absl::Status s = Retry(
      StorePolicy(options_.transfer_timeout), options_.stop,
      [&](absl::Duration left) -> absl::Status {
        grpc::ClientContext ctx;
        ctx.set_deadline(DeadlineIn(left));
        ScopedCancelCallback cancel(options_.stop, [&ctx] { ctx.TryCancel(); });
        shoal::v1::ReadLayerRequest request;
        request.set_id(id);
        request.set_layer(layer);
        request.set_offset(next);
        request.set_length(bounded ? end - next : 0);
        const bool resumed = next != offset;
        if (bounded && resumed && next == end) return absl::OkStatus();
        auto reader = stub_->ReadLayer(&ctx, request);
        shoal::v1::LayerChunk chunk;
        absl::Status bad;
        // The wire module's checks and codes (common/tensor_wire.h): a chunk of
        // another layer or out of place is INVALID_ARGUMENT, a bad CRC or a
        // short stream DATA_LOSS.
        ChunkSequence sequence(next, bounded ? end : ChunkSequence::kUnbounded, /*unit_bytes=*/1);
        while (reader->Read(&chunk)) {
          const std::string& data = chunk.data();
          if (chunk.layer() != layer) {
            bad = absl::InvalidArgumentError(
                absl::StrCat("chunk of layer ", chunk.layer(), ", expected layer ", layer));
          } else if (absl::StatusOr<uint64_t> checked = sequence.Check(chunk.offset(), data.size());
                     !checked.ok()) {
            bad = checked.status();
          } else if (absl::Status crc = CheckChunkCrc(chunk.crc32c(), data.data(), data.size(),
                                                      absl::StrCat("the chunk at offset ", next));
                     !crc.ok()) {
            bad = crc;
          } else if (!sink(next,
                           ByteSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size()))) {
            bad = absl::CancelledError("read cancelled by the caller");
          }
          if (!bad.ok()) break;
          sequence.Advance(data.size());
          next += data.size();
        }
        if (!bad.ok()) {
          ctx.TryCancel();
          (void)reader->Finish();
          return bad;  // final: not UNAVAILABLE
        }
        absl::Status finished = FromGrpcStatus(reader->Finish());
        if (finished.ok()) return sequence.Finish();
        return finished;
      });
  return Annotate(s, what);
}

absl::Status GrpcCheckpointClient::Delete(const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(options_.call_timeout));
  shoal::v1::DeleteCheckpointRequest request;
  request.set_id(id);
  shoal::v1::DeleteCheckpointResponse response;
  return Annotate(FromGrpcStatus(stub_->Delete(&ctx, request, &response)),
                  absl::StrCat("delete ", id, " at ", address_));
}

}  // namespace shoal::checkpoint
