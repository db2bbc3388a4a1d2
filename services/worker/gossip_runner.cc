#include "services/worker/gossip_runner.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/retry.h"
#include "common/status_util.h"
#include "services/worker/core/gossip_policy.h"
#include "services/worker/worker_metrics.h"

namespace shoal::worker {
namespace {

GossipProtocol::Options ProtocolOptions(const RunnerParts& parts) {
  GossipProtocol::Options o;
  o.identity = parts.identity;
  o.has_store = parts.store != nullptr;
  if (parts.codec != nullptr) o.codec_name = parts.codec->name();
  o.clock = parts.clock;
  return o;
}

GossipFetchOutcome Outcome(const GossipFetchResult& r) {
  GossipFetchOutcome o;
  o.peer_id = r.peer_id;
  o.status = r.status;
  o.not_answering = r.not_answering;
  o.peer_clock = r.peer_clock;
  o.peer_loss = r.peer_loss;
  if (r.base != nullptr) {
    o.has_base = true;
    o.base_clock = r.base->clock;
    o.base_loss = r.base->loss;
  }
  o.took = r.took;
  return o;
}

GossipUploadOutcome Outcome(const GossipUploadResult& r) {
  // The same metrics as synchronous uploads (OPERATIONS.md's alerts).
  (r.upload.ok() ? M().uploads_ok : M().uploads_failed).Add();
  if (r.upload.ok()) M().upload_seconds.Observe(absl::ToDoubleSeconds(r.took));
  GossipUploadOutcome o;
  o.sequence = r.sequence;
  o.upload = r.upload;
  o.report = r.report;
  return o;
}

}  // namespace

GossipRunner::GossipRunner(RunnerHost* host, RunnerParts parts)
    : host_(host),
      parts_(std::move(parts)),
      elements_(parts_.memory->total()),
      protocol_(ProtocolOptions(parts_)) {
  if (parts_.store != nullptr) {
    checkpointer_ = std::make_unique<GossipCheckpointer>(parts_.store, parts_.coordinator,
                                                         parts_.trainer->layers(), parts_.clock);
  }
}

GossipRunner::~GossipRunner() {
  // A transfer in flight holds a published copy and our peer client: end
  // them (cancelled by the stop token, bounded by their deadlines) first.
  fetcher_.reset();
  consensus_fetcher_.reset();
  checkpointer_.reset();
}

std::unique_ptr<GossipFetcher> GossipRunner::NewFetcher() const {
  auto fetcher = std::make_unique<GossipFetcher>(parts_.peers, protocol_.worker_id(), parts_.clock,
                                                 parts_.stop);
  // Behind NAT nobody fetches from us: each fetch pushes our model back.
  fetcher->set_push_own(parts_.outbound_only);
  // Pulls travel in the run's codec (docs/GOSSIP.md, "Compressed pulls").
  fetcher->set_codec(parts_.codec);
  return fetcher;
}

absl::Status GossipRunner::OnJoined(const shoal::v1::JoinResponse& joined,
                                    std::optional<absl::Status>* exit) {
  for (GossipAction& a : protocol_.OnJoined(joined)) {
    if (a.kind == GossipAction::kOpenSession) {
      RETURN_IF_ERROR(host_->OpenSession());
      RETURN_IF_ERROR(host_->JoinRound(/*carried_round=*/0));
      continue;
    }
    GossipActions more;
    *exit = ExecuteOne(a, &more);
    if (!exit->has_value() && !more.empty()) *exit = Execute(std::move(more));
    if (exit->has_value()) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status GossipRunner::Run() {
  // The fetchers read as this worker (its id is known from the join).
  fetcher_ = NewFetcher();
  consensus_fetcher_ = NewFetcher();
  if (std::optional<absl::Status> exit = Execute(protocol_.Start(elements_))) return *exit;
  while (true) {
    const absl::Duration wait =
        std::max(absl::ZeroDuration(), protocol_.wake_at() - parts_.clock->Now());
    WorkerEvent event;
    GossipActions actions;
    if (!host_->PopEvent(&event, wait)) {
      actions = protocol_.OnTick();
    } else if (event.kind == WorkerEvent::kStop) {
      actions = protocol_.OnStopRequested(host_->StopReason());
    } else if (event.kind == WorkerEvent::kSessionClosed) {
      if (host_->StopRequested()) continue;  // our own doing
      actions = protocol_.OnSessionClosed(event.status);
    } else {
      actions = protocol_.OnDirective(event.message);
    }
    if (std::optional<absl::Status> exit = Execute(std::move(actions))) return *exit;
  }
}

std::optional<absl::Status> GossipRunner::Execute(GossipActions actions) {
  std::deque<GossipAction> queue(std::make_move_iterator(actions.begin()),
                                 std::make_move_iterator(actions.end()));
  bool stop_told = false;
  while (!queue.empty()) {
    if (!stop_told && host_->StopRequested()) {
      // The shutdown goes before the rest of the batch (its event may sit
      // behind others in the queue).
      stop_told = true;
      GossipActions stop = protocol_.OnStopRequested(host_->StopReason());
      if (!stop.empty()) queue.assign(stop.begin(), stop.end());
    }
    GossipAction action = std::move(queue.front());
    queue.pop_front();
    GossipActions next;
    if (std::optional<absl::Status> exit = ExecuteOne(action, &next)) return exit;
    queue.insert(queue.begin(), std::make_move_iterator(next.begin()),
                 std::make_move_iterator(next.end()));
  }
  return std::nullopt;
}

std::optional<absl::Status> GossipRunner::ExecuteOne(GossipAction& a, GossipActions* next) {
  SHOAL_VLOG(3) << "gossip action " << GossipActionName(a.kind);
  switch (a.kind) {
    case GossipAction::kOpenSession:
      // Only inside OnJoined (it belongs to one join attempt).
      return std::nullopt;
    case GossipAction::kRejoin: {
      host_->CloseSession();
      return host_->Join(protocol_.JoinRequest());
    }
    case GossipAction::kFetchNow: {
      fetched_ = fetcher_->FetchNow(a.peer_id, a.address, elements_, a.timeout);
      *next = protocol_.OnFetched(Outcome(*fetched_));
      return std::nullopt;
    }
    case GossipAction::kAdoptFetched:
      if (fetched_.has_value() && fetched_->status.ok()) {
        parts_.memory->ReplaceModel(fetched_->peer_params);
      }
      fetched_.reset();
      return std::nullopt;
    case GossipAction::kLoadCheckpoint: {
      double clock = 0;
      absl::Status s = LoadCheckpoint(a.checkpoint_id, &clock);
      *next = protocol_.OnCheckpointLoaded(s, clock);
      return std::nullopt;
    }
    case GossipAction::kTrainStep: {
      const absl::Time t0 = parts_.clock->Now();
      const double loss =
          parts_.memory->TrainUnserved([this](float*) { return parts_.trainer->TrainSteps(1); });
      M().train_seconds.Observe(absl::ToDoubleSeconds(parts_.clock->Now() - t0));
      *next = protocol_.OnStepTrained(loss);
      return std::nullopt;
    }
    case GossipAction::kCollect:
      *next = Collect();
      return std::nullopt;
    case GossipAction::kInterpolate:
      if (fetched_.has_value() && fetched_->base != nullptr && fetched_->peer_params != nullptr) {
        parts_.memory->Interpolate(fetched_->base->params.data(), fetched_->peer_params, a.factor);
        M().received_bytes.Add(static_cast<double>(fetched_->wire_bytes));
      }
      fetched_.reset();
      return std::nullopt;
    case GossipAction::kInterpolatePush:
      if (pushed_.has_value() && pushed_->bytes.size() == elements_ * sizeof(float)) {
        parts_.memory->Interpolate(parts_.memory->parameters(),
                                   reinterpret_cast<const float*>(pushed_->bytes.data()), a.factor);
        M().received_bytes.Add(static_cast<double>(pushed_->bytes.size()));
      }
      pushed_.reset();
      return std::nullopt;
    case GossipAction::kEvaluate: {
      const shoal::v1::Metrics m = parts_.trainer->Evaluate();
      M().test_accuracy.Set(m.test_accuracy());
      M().test_loss.Set(m.test_loss());
      *next = protocol_.OnEvaluated(m);
      return std::nullopt;
    }
    case GossipAction::kEvaluateConsensus:
      *next = EvaluateConsensus(a);
      return std::nullopt;
    case GossipAction::kPublish: {
      host_->CountServedBytes();
      const float* params = parts_.memory->parameters();
      latest_ = parts_.board->Publish(params, elements_, a.clock, a.loss);
      if (a.new_loss) M().train_loss.Set(a.loss);
      std::vector<float> projection;
      if (a.project) projection = ProjectModel(params, elements_, a.projection_seed);
      *next = protocol_.OnPublished(latest_ != nullptr, std::move(projection));
      return std::nullopt;
    }
    case GossipAction::kStartFetch:
      fetched_.reset();  // its bytes are the fetcher's, which starts over
      fetcher_->Start(a.peer_id, a.address, elements_, a.timeout, latest_);
      return std::nullopt;
    case GossipAction::kDropFetch:
      // The fetcher cancels its fetch and waits for its calls to end (at
      // once when cancelled); a new one serves the final average.
      fetched_.reset();
      fetcher_ = NewFetcher();
      return std::nullopt;
    case GossipAction::kStartUpload:
      if (checkpointer_ != nullptr) checkpointer_->Start(UploadJob(a.upload));
      return std::nullopt;
    case GossipAction::kDrainUpload: {
      std::optional<GossipUploadOutcome> drained;
      if (checkpointer_ != nullptr) {
        checkpointer_->Wait();
        if (std::optional<GossipUploadResult> r = checkpointer_->Take()) drained = Outcome(*r);
      }
      *next = protocol_.OnUploadDrained(drained);
      return std::nullopt;
    }
    case GossipAction::kUploadNow: {
      GossipUploadOutcome outcome;
      outcome.sequence = a.upload.sequence;
      outcome.upload = absl::FailedPreconditionError("this worker has no checkpoint store");
      outcome.report = absl::OkStatus();
      if (checkpointer_ != nullptr)
        outcome = Outcome(checkpointer_->UploadNow(UploadJob(a.upload)));
      *next = protocol_.OnUploaded(outcome);
      return std::nullopt;
    }
    case GossipAction::kRefuseCheckpoint: {
      shoal::v1::ReportCheckpointRequest refused;
      refused.set_worker_id(protocol_.worker_id());
      refused.set_round(a.sequence);
      refused.set_error(a.reason);
      parts_.coordinator->ReportCheckpoint(refused).IgnoreError();
      return std::nullopt;
    }
    case GossipAction::kFinalAverage:
      *next = FinalAverage(a);
      return std::nullopt;
    case GossipAction::kReport:
      host_->SetHeartbeatReport(a.report);
      return std::nullopt;
    case GossipAction::kFlushReport:
      host_->SetHeartbeatReport(a.report);
      if (!host_->SendHeartbeatNow(a.timeout)) {
        SHOAL_LOG(WARNING) << "gossip: the last heartbeat was not written within "
                           << absl::FormatDuration(a.timeout);
      }
      return std::nullopt;
    case GossipAction::kLeave:
      host_->Leave(a.reason);
      return std::nullopt;
    case GossipAction::kExit:
      host_->CloseSession();
      return a.status;
  }
  return std::nullopt;
}

GossipActions GossipRunner::Collect() {
  GossipActions out;
  auto feed = [&](GossipActions more) { out.insert(out.end(), more.begin(), more.end()); };
  if (std::optional<GossipFetchResult> r = fetcher_->Take()) {
    GossipFetchOutcome outcome = Outcome(*r);
    if (parts_.outbound_only && r->status.ok() && !r->pushed) {
      outcome.push_failed = true;
      outcome.push_error = std::string(r->push_status.message());
    }
    fetched_ = std::move(*r);
    feed(protocol_.OnFetched(outcome));
  }
  // A partner behind NAT pushed us its model (it cannot be fetched).
  if (std::optional<GossipPush> p = parts_.push_box->TakeGossip()) {
    GossipPushOutcome outcome;
    outcome.pusher = p->pusher;
    outcome.clock = p->clock;
    outcome.loss = p->loss;
    outcome.bytes = p->bytes.size();
    pushed_ = std::move(*p);
    feed(protocol_.OnPushReceived(outcome));
  }
  if (checkpointer_ != nullptr) {
    if (std::optional<GossipUploadResult> r = checkpointer_->Take()) {
      feed(protocol_.OnUploaded(Outcome(*r)));
    }
  }
  feed(protocol_.OnCollected());
  return out;
}

GossipActions GossipRunner::EvaluateConsensus(const GossipAction& a) {
  const absl::Time t0 = parts_.clock->Now();
  const float* own = parts_.memory->parameters();
  std::vector<double> sum(own, own + elements_);
  double peer_clocks = 0;
  uint32_t models = 1;
  for (const shoal::v1::GossipPeer& peer : a.peers) {
    GossipFetchResult r =
        consensus_fetcher_->FetchNow(peer.worker_id(), peer.peer_address(), elements_, a.timeout);
    if (!r.status.ok()) {
      SHOAL_VLOG(1) << "consensus evaluation without " << peer.worker_id() << ": "
                    << r.status.message();
      continue;
    }
    for (uint64_t i = 0; i < elements_; ++i) sum[i] += r.peer_params[i];
    peer_clocks += r.peer_clock;
    ++models;
  }
  // Evaluated in a buffer of its own: the live model is not touched.
  consensus_.resize(elements_);
  for (uint64_t i = 0; i < elements_; ++i) consensus_[i] = static_cast<float>(sum[i] / models);
  absl::StatusOr<shoal::v1::Metrics> m = parts_.trainer->EvaluateParams(consensus_.data());
  if (!m.ok()) {
    SHOAL_LOG(WARNING) << "consensus evaluation failed: " << m.status();
    return {};
  }
  return protocol_.OnConsensusEvaluated(*m, models, peer_clocks, parts_.clock->Now() - t0);
}

GossipActions GossipRunner::FinalAverage(const GossipAction& a) {
  // Every worker adds the same floats in the same order (the sources' order
  // in GossipFinal), in float64: the same bits everywhere.
  std::shared_ptr<const GossipCopy> own = latest_ != nullptr ? latest_ : parts_.board->Current();
  std::vector<double> sum(elements_, 0.0);
  std::vector<float> own_decoded;
  uint32_t models = 0;
  absl::Status status;
  const absl::Time t0 = parts_.clock->Now();
  for (const shoal::v1::GossipPeer& source : a.peers) {
    const float* p = nullptr;
    GossipFetchResult r;
    if (source.worker_id() == protocol_.worker_id()) {
      if (own == nullptr) {
        status = absl::FailedPreconditionError("this worker published no final model");
        break;
      }
      p = own->params.data();
      if (own->encoded != nullptr) {
        // Our own final model as the others decode it: every worker adds
        // the same floats.
        own_decoded.resize(elements_);
        status = parts_.codec->DecodeSlice(
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(own->encoded->data()),
                                own->encoded->size()),
            elements_, own_decoded.data());
        if (!status.ok()) break;
        p = own_decoded.data();
      }
    } else {
      // A transfer that failed on its way (a corrupt or truncated stream, a
      // peer that did not answer in time) is tried again; a refusal is not.
      RetryPolicy policy;
      policy.initial_backoff = absl::Milliseconds(10);
      policy.max_backoff = absl::Milliseconds(200);
      policy.max_attempts = static_cast<int>(a.attempts);
      policy.deadline =
          a.timeout * static_cast<double>(std::max<uint32_t>(1, a.attempts)) + absl::Seconds(1);
      policy.also_retry = {absl::StatusCode::kDataLoss};
      policy.clock = parts_.clock;
      status = Retry(policy, parts_.stop, [&](absl::Duration) {
        r = fetcher_->FetchNow(source.worker_id(), source.peer_address(), elements_, a.timeout);
        return r.status;
      });
      if (!status.ok()) break;
      p = r.peer_params;
    }
    for (uint64_t i = 0; i < elements_; ++i) sum[i] += p[i];
    ++models;
  }
  std::string hash;
  if (status.ok() && models > 0) {
    std::vector<float> average(elements_);
    for (uint64_t i = 0; i < elements_; ++i) average[i] = static_cast<float>(sum[i] / models);
    // Keep serving the final copy (not the average): a slower worker still
    // fetches the same bytes. The parameters take the average.
    parts_.memory->ReplaceModel(average.data());
    hash = HashParameters(parts_.memory->parameters(), elements_);
    auto copy = std::make_shared<GossipCopy>();
    copy->publication = own != nullptr ? own->publication : 0;
    copy->clock = protocol_.clock();
    copy->loss = protocol_.last_loss();
    copy->params = std::move(average);
    final_average_ = std::move(copy);
  }
  return protocol_.OnFinalAveraged(status, models, hash, parts_.clock->Now() - t0);
}

GossipUploadJob GossipRunner::UploadJob(const GossipAction::Upload& upload) const {
  GossipUploadJob job;
  job.run_id = upload.run_id;
  job.worker_id = protocol_.worker_id();
  job.model = protocol_.config().model;
  job.sequence = upload.sequence;
  job.steps = upload.steps;
  job.copy = upload.copy == GossipAction::Copy::kFinalAverage && final_average_ != nullptr
                 ? final_average_
                 : (latest_ != nullptr ? latest_ : parts_.board->Current());
  return job;
}

absl::Status GossipRunner::LoadCheckpoint(const std::string& id, double* clock) {
  if (parts_.store == nullptr) {
    return absl::FailedPreconditionError("the run names a checkpoint but no checkpoint store");
  }
  absl::StatusOr<shoal::v1::Manifest> manifest = parts_.store->GetManifest(id);
  if (!manifest.ok()) return Annotate(manifest.status(), "checkpoint store");
  const std::vector<LayerInfo>& layers = parts_.trainer->layers();
  const int count = checkpoint::ModelLayerCount(*manifest);
  if (count != static_cast<int>(layers.size())) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", id, " has ", count,
                                                      " model layers, this model ", layers.size()));
  }
  std::string hash;
  RETURN_IF_ERROR(parts_.memory->LoadModel([&](float* params, uint64_t n) -> absl::Status {
    std::vector<uint8_t> bytes;
    for (int i = 0; i < count; ++i) {
      const shoal::v1::LayerEntry& entry = manifest->layers(i);
      const LayerInfo& l = layers[i];
      if (entry.name() != l.name || entry.bytes() != l.elements * sizeof(float) ||
          l.offset + l.elements > n) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", id, " layer ", i, " is ", entry.name(), " of ", entry.bytes(),
            " bytes; this model has ", l.name, " of ", l.elements * sizeof(float)));
      }
      RETURN_IF_ERROR(checkpoint::ReadWholeLayer(parts_.store, id, *manifest, i, &bytes));
      std::memcpy(params + l.offset, bytes.data(), bytes.size());
    }
    hash = HashParameters(params, n);
    if (!manifest->model_sha256().empty() && hash != manifest->model_sha256()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", id, ": the model hashes to ", hash,
                                              ", the manifest says ", manifest->model_sha256()));
    }
    return absl::OkStatus();
  }));
  *clock = manifest->gossip_clock();
  SHOAL_LOG(INFO) << absl::StrFormat(
      "started from checkpoint %s (model sha256 %s, clock %.0f; %s)", id, hash, *clock,
      manifest->gossip() ? absl::StrCat("uploaded by ", manifest->worker_id(), " at ",
                                        manifest->gossip_steps(), " steps")
                         : absl::StrCat("round ", manifest->round(), " of a synchronous run"));
  return absl::OkStatus();
}

}  // namespace shoal::worker
