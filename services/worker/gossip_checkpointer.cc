#include "services/worker/gossip_checkpointer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace shoal::worker {

void AppendModelLayers(const std::vector<LayerInfo>& layers, const float* base,
                       shoal::v1::Manifest* manifest, std::vector<checkpoint::ByteSpan>* spans) {
  for (const LayerInfo& l : layers) {
    auto* entry = manifest->add_layers();
    entry->set_name(l.name);
    entry->set_dtype("float32");
    for (int64_t d : l.shape) entry->add_shape(d);
    spans->push_back(
        {reinterpret_cast<const uint8_t*>(base + l.offset), l.elements * sizeof(float)});
  }
}

GossipCheckpointer::GossipCheckpointer(checkpoint::CheckpointClient* store,
                                       CoordinatorClient* coordinator,
                                       std::vector<LayerInfo> layers, const Clock* clock)
    : store_(store), coordinator_(coordinator), layers_(std::move(layers)), clock_(clock) {}

GossipCheckpointer::~GossipCheckpointer() { Wait(); }

void GossipCheckpointer::Wait() {
  if (thread_.joinable()) thread_.join();
}

bool GossipCheckpointer::Start(GossipUploadJob job) {
  if (running_.load() || has_result_.load()) return false;
  Wait();
  running_ = true;
  thread_ = std::thread([this, job = std::move(job)] {
    GossipUploadResult r = UploadNow(job);
    {
      absl::MutexLock lock(&mu_);
      result_ = std::move(r);
    }
    has_result_ = true;
    running_ = false;
  });
  return true;
}

std::optional<GossipUploadResult> GossipCheckpointer::Take() {
  if (running_.load() || !has_result_.load()) return std::nullopt;
  Wait();
  has_result_ = false;
  absl::MutexLock lock(&mu_);
  std::optional<GossipUploadResult> r = std::move(result_);
  result_.reset();
  return r;
}

GossipUploadResult GossipCheckpointer::UploadNow(const GossipUploadJob& job) {
  GossipUploadResult r;
  r.sequence = job.sequence;
  r.steps = job.steps;
  const absl::Time t0 = clock_->Now();
  shoal::v1::Manifest manifest;
  std::vector<checkpoint::ByteSpan> spans;
  if (job.copy == nullptr || job.copy->params.empty()) {
    r.upload = absl::FailedPreconditionError("nothing published yet");
  } else {
    r.clock = job.copy->clock;
    manifest.set_run_id(job.run_id);
    manifest.set_round(job.sequence);
    manifest.set_model(job.model);
    manifest.set_gossip(true);
    manifest.set_gossip_clock(job.copy->clock);
    manifest.set_gossip_steps(job.steps);
    manifest.set_worker_id(job.worker_id);
    // The hash of the whole flat vector, as a synchronous checkpoint's
    // agreed hash (the layers tile it in order).
    manifest.set_model_sha256(HashParameters(job.copy->params.data(), job.copy->params.size()));
    AppendModelLayers(layers_, job.copy->params.data(), &manifest, &spans);
    r.upload = checkpoint::CompleteManifest(&manifest, spans);
    if (r.upload.ok()) {
      absl::StatusOr<shoal::v1::CheckpointInfo> info = store_->Upload(manifest, spans);
      if (info.ok()) {
        r.checkpoint_id = info->id();
      } else {
        r.upload = info.status();
      }
    }
  }
  r.took = clock_->Now() - t0;
  shoal::v1::ReportCheckpointRequest report;
  report.set_worker_id(job.worker_id);
  report.set_round(job.sequence);
  if (r.upload.ok()) {
    report.set_checkpoint_id(r.checkpoint_id);
    report.set_gossip_clock(r.clock);
    report.set_gossip_steps(r.steps);
    SHOAL_LOG(INFO) << absl::StrFormat(
        "gossip checkpoint %s uploaded in %.2fs (clock %.0f, %d steps, model sha256 %s)",
        r.checkpoint_id, absl::ToDoubleSeconds(r.took), r.clock, r.steps, manifest.model_sha256());
  } else {
    report.set_error(r.upload.ToString());
    SHOAL_LOG(WARNING) << "gossip checkpoint " << job.sequence << " failed: " << r.upload;
  }
  r.report = coordinator_->ReportCheckpoint(report);
  return r;
}

}  // namespace shoal::worker
