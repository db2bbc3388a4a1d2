#include "services/worker/core/external_trainer.h"

#include <limits>
#include <utility>

namespace shoal::worker {

ExternalTrainer::ExternalTrainer(ExternalTrainerOptions options) : options_(std::move(options)) {}

double ExternalTrainer::TrainSteps(uint32_t steps) {
  absl::MutexLock lock(&mu_);
  if (closed_) return std::numeric_limits<double>::quiet_NaN();
  if (steps == 0) return 0;
  const uint64_t turn = ++turn_;
  steps_ = steps;
  taken_ = false;
  auto done = [this, turn]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || ended_ >= turn; };
  mu_.Await(absl::Condition(&done));
  steps_ = 0;
  if (ended_ < turn) return std::numeric_limits<double>::quiet_NaN();
  return loss_;
}

std::optional<uint32_t> ExternalTrainer::AwaitTurn(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || (steps_ > 0 && !taken_);
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return std::nullopt;
  if (closed_) return 0;
  taken_ = true;
  return steps_;
}

void ExternalTrainer::EndTurn(double mean_loss) {
  absl::MutexLock lock(&mu_);
  if (!taken_ || ended_ >= turn_) return;  // no turn open: nothing to end
  loss_ = mean_loss;
  ended_ = turn_;
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
  return ended_;
}

}  // namespace shoal::worker
