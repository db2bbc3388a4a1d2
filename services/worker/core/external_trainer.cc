#include "services/worker/core/external_trainer.h"

#include <limits>
#include <utility>

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

double ExternalTrainer::TrainSteps(uint32_t steps) {
  absl::MutexLock lock(&mu_);
  if (closed_) return std::numeric_limits<double>::quiet_NaN();
  if (steps == 0) return 0;
  Turn turn;
  turn.kind = Turn::kTrain;
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

void ExternalTrainer::EndTurn(double mean_loss) {
  absl::MutexLock lock(&mu_);
  if (!open_ || !taken_ || ended_ >= number_) return;  // no turn open: nothing to end
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
