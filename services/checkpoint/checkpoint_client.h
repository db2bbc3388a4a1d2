// Outbound calls to shoal-checkpoint, behind an interface so that workers
// and tools can be tested with a fake store. Used by workers (upload, read
// layers when joining late) and shoalctl (list, show, export, delete).
#ifndef SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_CLIENT_H_
#define SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/cancellation.h"
#include "shoal/v1/checkpoint.grpc.pb.h"

namespace shoal::checkpoint {

// Raw little-endian bytes of one layer, in caller memory.
using ByteSpan = absl::Span<const uint8_t>;

// Receives a range of a layer piece by piece: `offset` is the position of
// data[0] within the layer. Returning false cancels the read.
using LayerSink = std::function<bool(uint64_t offset, ByteSpan data)>;

class CheckpointClient {
 public:
  virtual ~CheckpointClient() = default;

  // Uploads one checkpoint: `manifest` (run_id, round, layers with dtype,
  // shape, bytes, sha256; see CompleteManifest) then `layers[i]`'s bytes, in
  // ~1 MiB chunks with CRC-32C encoded straight from that memory. The
  // checkpoint is visible only when this returns OK. INVALID_ARGUMENT
  // (before anything is sent) when the spans do not match the manifest.
  virtual absl::StatusOr<shoal::v1::CheckpointInfo> Upload(const shoal::v1::Manifest& manifest,
                                                           const std::vector<ByteSpan>& layers) = 0;
  // Newest first; only `run_id`'s when not empty.
  virtual absl::StatusOr<std::vector<shoal::v1::CheckpointInfo>> List(
      const std::string& run_id) = 0;
  virtual absl::StatusOr<shoal::v1::Manifest> GetManifest(const std::string& id) = 0;
  // Streams [offset, offset + length) of layer `layer` (length 0: to the
  // end) into `sink`. Every chunk is checked before the sink sees it, with
  // the wire module's checks and codes (common/tensor_wire.h): a chunk of
  // another layer, a gap, an overlap or a chunk past the range is
  // INVALID_ARGUMENT, over 4 MiB RESOURCE_EXHAUSTED, a CRC-32C mismatch or a
  // stream that ends short DATA_LOSS. The store's codes pass through:
  // NOT_FOUND, OUT_OF_RANGE, DATA_LOSS (damaged checkpoint).
  virtual absl::Status ReadLayer(const std::string& id, uint32_t layer, uint64_t offset,
                                 uint64_t length, const LayerSink& sink) = 0;
  virtual absl::Status Delete(const std::string& id) = 0;
};

// Fills each layer's `bytes` and `sha256` from `layers` (hashing them);
// INVALID_ARGUMENT when the counts differ.
absl::Status CompleteManifest(shoal::v1::Manifest* manifest, const std::vector<ByteSpan>& layers);

// The number of leading layers that hold the model: the layers flagged
// `optimizer_state` (the outer optimizer's state, docs/COMPRESSION.md)
// follow them and are not part of the model.
int ModelLayerCount(const shoal::v1::Manifest& manifest);
// The index of the optimizer state layer named `name`, or -1.
int FindStateLayer(const shoal::v1::Manifest& manifest, absl::string_view name);

// Reads a whole layer into `out` (resized) and checks it against the
// manifest entry's size and SHA-256 (DATA_LOSS on mismatch). `on_bytes`,
// when set, is called with the layer's bytes received so far after every
// chunk (progress reports).
absl::Status ReadWholeLayer(CheckpointClient* client, const std::string& id,
                            const shoal::v1::Manifest& manifest, uint32_t layer,
                            std::vector<uint8_t>* out,
                            const std::function<void(uint64_t)>& on_bytes = nullptr);

struct CheckpointClientOptions {
  // Deadline of each unary call (List, GetManifest, Delete), retries
  // included.
  absl::Duration call_timeout = absl::Seconds(10);
  // Deadline of a whole Upload or ReadLayer stream.
  absl::Duration transfer_timeout = absl::Minutes(10);
  // Bytes per upload chunk.
  size_t chunk_bytes = 1 << 20;
  // Cancels the Upload or ReadLayer in flight when cancelled (the worker's
  // stop: SIGTERM must not wait for a store that stopped reading). Not
  // owned; null = never.
  CancellationToken* stop = nullptr;
};

// gRPC implementation. Idempotent reads (List, GetManifest, ReadLayer) are
// retried on UNAVAILABLE with backoff within their deadline; a ReadLayer
// retry resumes after the last byte delivered. Upload and Delete are not
// retried. Thread-safe.
class GrpcCheckpointClient : public CheckpointClient {
 public:
  explicit GrpcCheckpointClient(const std::string& address, CheckpointClientOptions options = {});

  absl::StatusOr<shoal::v1::CheckpointInfo> Upload(const shoal::v1::Manifest& manifest,
                                                   const std::vector<ByteSpan>& layers) override;
  absl::StatusOr<std::vector<shoal::v1::CheckpointInfo>> List(const std::string& run_id) override;
  absl::StatusOr<shoal::v1::Manifest> GetManifest(const std::string& id) override;
  absl::Status ReadLayer(const std::string& id, uint32_t layer, uint64_t offset, uint64_t length,
                         const LayerSink& sink) override;
  absl::Status Delete(const std::string& id) override;

  const std::string& address() const { return address_; }
  // The coordinator's grant for the next uploads (CheckpointRequest.
  // upload_grant; common/upload_grant.h), sent as x-shoal-upload-grant with
  // each Upload until replaced. Empty = none.
  void SetUploadGrant(std::string grant) {
    absl::MutexLock lock(&grant_mu_);
    grant_ = std::move(grant);
  }

 private:
  const std::string address_;
  absl::Mutex grant_mu_;
  std::string grant_ ABSL_GUARDED_BY(grant_mu_);
  const CheckpointClientOptions options_;
  std::unique_ptr<shoal::v1::Checkpoint::Stub> stub_;
};

}  // namespace shoal::checkpoint

#endif  // SHOAL_SERVICES_CHECKPOINT_CHECKPOINT_CLIENT_H_
