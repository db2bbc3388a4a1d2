// Gossip checkpoints (docs/GOSSIP.md, "Checkpoints"): the worker the
// coordinator picked as checkpointer uploads one of its published copies
// (GossipBoard) to the checkpoint store in the background while it keeps
// training, then reports the checkpoint to the coordinator. The copy is held
// (reference-counted) for the whole upload, so the bytes cannot change under
// it, and the upload goes through the same path as synchronous checkpoints:
// CompleteManifest, CheckpointClient::Upload (chunks of ~1 MiB with
// CRC-32C, atomic commit at the store).
//
// Threads: Start(), Take() and UploadNow() are called from the worker's main
// thread; one background thread runs at most one upload and its report.
#ifndef SHOAL_SERVICES_WORKER_GOSSIP_CHECKPOINTER_H_
#define SHOAL_SERVICES_WORKER_GOSSIP_CHECKPOINTER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/worker/coordinator_client.h"
#include "services/worker/core/gossip_board.h"
#include "services/worker/core/trainer.h"
#include "shoal/v1/checkpoint.pb.h"

namespace shoal::worker {

// Appends one float32 manifest entry per layer of `layers` and the span of
// its bytes in `base` (the flat parameter vector): the model part of every
// checkpoint this worker uploads, synchronous or gossip.
void AppendModelLayers(const std::vector<LayerInfo>& layers, const float* base,
                       shoal::v1::Manifest* manifest, std::vector<checkpoint::ByteSpan>* spans);

// One upload: the copy and what the manifest says about it.
struct GossipUploadJob {
  std::string run_id;
  std::string worker_id;
  std::string model;
  // Sequence number within the run (Manifest.round; the id is
  // "<run_id>-r<sequence>").
  uint64_t sequence = 0;
  // Local steps trained at the publication of `copy`.
  uint64_t steps = 0;
  std::shared_ptr<const GossipCopy> copy;
};

struct GossipUploadResult {
  uint64_t sequence = 0;
  uint64_t steps = 0;
  double clock = 0;
  // OK, or why the upload failed (the coordinator was told).
  absl::Status upload;
  std::string checkpoint_id;
  // The coordinator's answer to the report. FAILED_PRECONDITION: this
  // worker is no longer the checkpointer (or the sequence is stale).
  absl::Status report;
  absl::Duration took;
};

class GossipCheckpointer {
 public:
  GossipCheckpointer(checkpoint::CheckpointClient* store, CoordinatorClient* coordinator,
                     std::vector<LayerInfo> layers, const Clock* clock);
  ~GossipCheckpointer();  // joins an upload in flight

  // Starts `job` in the background. False when an upload is in flight or its
  // result was not taken yet.
  bool Start(GossipUploadJob job);
  // The finished upload's result, once; nullopt while one runs or none was
  // started.
  std::optional<GossipUploadResult> Take();
  // Waits for an upload in flight (its result stays for Take()).
  void Wait();
  // The same upload and report on the calling thread (the final checkpoint
  // of a worker that finished its --gossip_steps).
  GossipUploadResult UploadNow(const GossipUploadJob& job);
  bool idle() const { return !running_.load() && !has_result_.load(); }

 private:
  checkpoint::CheckpointClient* const store_;
  CoordinatorClient* const coordinator_;
  const std::vector<LayerInfo> layers_;
  const Clock* const clock_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<bool> has_result_{false};
  absl::Mutex mu_;
  std::optional<GossipUploadResult> result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_GOSSIP_CHECKPOINTER_H_
