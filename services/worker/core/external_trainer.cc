#include "services/worker/core/external_trainer.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shoal::worker {

ExternalTrainer::ExternalTrainer(ExternalTrainerOptions options) : options_(std::move(options)) {}

bool ExternalTrainer::RunTurn(Turn turn) {
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !open_; };
  mu_.Await(absl::Condition(&free));
  if (closed_) return false;
  open_ = true;
  turn.local = on_request_;
  turn_ = turn;
  taken_ = false;
  const uint64_t number = ++number_;
  auto done = [this, number]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || ended_ >= number; };
  mu_.Await(absl::Condition(&done));
  open_ = false;
  return ended_ >= number;
}

void ExternalTrainer::Configure(const shoal::v1::RunConfig& config) {
  absl::MutexLock lock(&mu_);
  order_.reset();
  samples_.clear();
  cursor_ = 0;
  batch_ = std::max<uint32_t>(1, config.training().batch_size());
  audited_ = config.trust().audit_rate() > 0 && config.has_sync();
  local_steps_ = std::max<uint32_t>(1, config.training().local_steps());
  // A ledger run refuses at join a loop that did not declare its training
  // set (SampleLedger::CheckDataset): SetSamples says so if it comes anyway.
  if (config.training().sample_ledger() && options_.train_samples > 0) {
    order_.emplace(config.training().seed(), static_cast<int64_t>(options_.train_samples));
  }
}

absl::Status ExternalTrainer::SetSamples(absl::Span<const shoal::v1::SampleRange> ranges) {
  absl::MutexLock lock(&mu_);
  if (!order_.has_value()) {
    return absl::FailedPreconditionError(
        options_.train_samples == 0 ? "the training loop did not declare its training set's size "
                                      "(shoal.Worker(..., train_samples=len(dataset)))"
                                    : "the run keeps no sample ledger");
  }
  absl::StatusOr<std::vector<int64_t>> rows = order_->Rows(ranges);
  if (!rows.ok()) return rows.status();
  samples_ = *std::move(rows);
  cursor_ = 0;
  return absl::OkStatus();
}

double ExternalTrainer::TrainSteps(uint32_t steps) {
  absl::MutexLock lock(&mu_);
  if (closed_) return std::numeric_limits<double>::quiet_NaN();
  Turn turn;
  turn.kind = Turn::kTrain;
  if (order_.has_value()) {
    // The ledger: a batch of the round's samples per step, in order; fewer
    // steps when they run out (BuiltinTrainer::TrainSteps), and no turn
    // when none is left (the round's base is the contribution).
    const size_t left = samples_.size() - cursor_;
    steps = static_cast<uint32_t>(std::min<uint64_t>(steps, (left + batch_ - 1) / batch_));
    const size_t n = std::min<size_t>(left, static_cast<size_t>(steps) * batch_);
    turn.ledger = true;
    turn.batch = batch_;
    turn.samples.assign(samples_.begin() + static_cast<std::ptrdiff_t>(cursor_),
                        samples_.begin() + static_cast<std::ptrdiff_t>(cursor_ + n));
    cursor_ += n;
  }
  if (steps == 0) return 0;
  turn.steps = steps;
  turn.round = round_;
  turn.pull = stale_;
  turn.push = !on_request_;
  if (!RunTurn(turn)) return std::numeric_limits<double>::quiet_NaN();
  ++trained_;
  // By default the buffer is the exchange's until the next turn, which
  // pulls; on request, the progress stays in the module until a sync.
  if (on_request_) {
    unpushed_ = true;
  } else {
    stale_ = true;
  }
  return loss_;
}

void ExternalTrainer::SyncOnRequest() {
  absl::MutexLock lock(&mu_);
  on_request_ = true;
}

void ExternalTrainer::SyncParameters() {
  absl::MutexLock lock(&mu_);
  if (!on_request_) return;  // every turn syncs
  if (unpushed_ && !closed_) {
    Turn turn;
    turn.kind = Turn::kSync;
    turn.push = true;
    if (RunTurn(turn)) unpushed_ = false;
  }
  // The caller may write the buffer now: the module takes it next.
  stale_ = true;
}

std::optional<ExternalTrainer::Turn> ExternalTrainer::AwaitTurn(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || (open_ && !taken_); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return std::nullopt;
  if (closed_) {
    Turn closed;
    closed.kind = Turn::kClosed;
    closed.local = on_request_;
    // Once: the module takes what was written since its last turn (the
    // agreed model that local training leaves at its stop, the last
    // average).
    closed.pull = std::exchange(stale_, false);
    return closed;
  }
  taken_ = true;
  if (turn_.pull) stale_ = false;  // the loop takes the buffer now
  return turn_;
}

absl::StatusOr<std::string> ExternalTrainer::Replay(
    const float* base, absl::Span<const shoal::v1::SampleRange> samples, uint64_t round) {
  absl::MutexLock lock(&mu_);
  if (!audited_ || !order_.has_value()) {
    return absl::FailedPreconditionError("the run is not audited (RunConfig.trust.audit_rate)");
  }
  if (!options_.replayable) {
    return absl::UnimplementedError(
        "the training loop handed Shoal no step to replay (shoal.Worker(..., step=, optimizer=))");
  }
  if (closed_) return absl::CancelledError("the worker is shutting down");
  absl::StatusOr<std::vector<int64_t>> rows = order_->Rows(samples);
  if (!rows.ok()) return rows.status();
  Turn turn;
  turn.kind = Turn::kReplay;
  turn.round = round;
  turn.batch = batch_;
  // As TrainSteps hands out the round's samples: a batch a step, at most
  // the round's steps.
  turn.steps =
      static_cast<uint32_t>(std::min<uint64_t>(local_steps_, (rows->size() + batch_ - 1) / batch_));
  turn.samples = *std::move(rows);
  replay_base_ = base;
  replay_hash_.clear();
  replay_error_.clear();
  const bool ended = RunTurn(std::move(turn));
  replay_base_ = nullptr;
  if (!ended) return absl::CancelledError("the worker is shutting down");
  if (!replay_error_.empty()) {
    return absl::UnknownError(absl::StrCat("the training loop's replay failed: ", replay_error_));
  }
  return replay_hash_;
}

absl::Status ExternalTrainer::CopyReplayBase(float* dst, uint64_t elements) {
  absl::MutexLock lock(&mu_);
  if (!open_ || !taken_ || turn_.kind != Turn::kReplay || replay_base_ == nullptr) {
    return absl::FailedPreconditionError("no replay turn is open");
  }
  if (elements != options_.elements) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the replay's model has ", elements, " elements, the worker's ", options_.elements));
  }
  std::copy_n(replay_base_, elements, dst);
  return absl::OkStatus();
}

void ExternalTrainer::EndReplay(const std::string& hash, const std::string& error) {
  absl::MutexLock lock(&mu_);
  if (!open_ || !taken_ || ended_ >= number_ || turn_.kind != Turn::kReplay) return;
  replay_hash_ = hash;
  replay_error_ = error.empty() && hash.empty() ? "no hash" : error;
  ended_ = number_;
}

void ExternalTrainer::EndTurn(double mean_loss) {
  absl::MutexLock lock(&mu_);
  // No turn open (or a replay, which EndReplay ends): nothing to end.
  if (!open_ || !taken_ || ended_ >= number_ || turn_.kind == Turn::kReplay) return;
  if (turn_.kind == Turn::kTrain) loss_ = mean_loss;
  ended_ = number_;
}

void ExternalTrainer::ReportMetrics(const shoal::v1::Metrics& metrics) {
  absl::MutexLock lock(&mu_);
  metrics_ = metrics;
  metrics_->set_evaluated(true);
}

shoal::v1::Metrics ExternalTrainer::Evaluate() {
  absl::MutexLock lock(&mu_);
  shoal::v1::Metrics m;
  if (metrics_) m = *std::exchange(metrics_, std::nullopt);
  return m;
}

absl::StatusOr<shoal::v1::Metrics> ExternalTrainer::EvaluateParams(const float*) {
  return absl::UnimplementedError("a Python worker evaluates in its own loop");
}

std::vector<Trainer::Prediction> ExternalTrainer::Predict(int64_t) { return {}; }

void ExternalTrainer::SetRound(uint64_t round) {
  absl::MutexLock lock(&mu_);
  round_ = round;
}

uint64_t ExternalTrainer::round() const {
  absl::MutexLock lock(&mu_);
  return round_;
}

void ExternalTrainer::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

uint64_t ExternalTrainer::turns() const {
  absl::MutexLock lock(&mu_);
  return trained_;
}

}  // namespace shoal::worker
