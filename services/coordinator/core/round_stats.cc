#include "services/coordinator/core/round_stats.h"

#include <algorithm>
#include <vector>

namespace shoal::coordinator {
namespace {

// Keeps the newest `window` samples.
template <typename T>
void AddSample(std::deque<T>& samples, T sample, size_t window) {
  samples.push_back(sample);
  while (samples.size() > window) samples.pop_front();
}

// Rounds whose summary the status keeps.
constexpr size_t kRecentRounds = 100;

}  // namespace

void RoundStats::OnReady(const shoal::v1::ReportReadyRequest& request) {
  members_[request.worker_id()].train_loss = request.train_loss();
}

void RoundStats::OnRoundDone(const shoal::v1::ReportRoundDoneRequest& request) {
  MemberStats& m = members_[request.worker_id()];
  m.exchange_seconds = request.exchange_seconds();
  m.bytes_received = request.bytes_received();
  m.bytes_sent = request.bytes_sent();
  m.compression_ratio = request.compression_ratio();
  m.wire_round = request.round();
  if (request.train_seconds() > 0) AddSample(m.train_seconds, request.train_seconds(), window_);
  m.round_train_seconds = request.train_seconds();
  if (request.metrics().evaluated()) {
    m.metrics = request.metrics();
    m.metrics_round = request.round();
  }
}

void RoundStats::OnMissed(const round_intent::Missed& missed) {
  MemberStats& m = members_[missed.worker_id];
  if (missed.late) ++m.rounds_late;
  m.deadline_seconds = missed.deadline_seconds;
}

void RoundStats::OnCompleted(const round_intent::Completed& completed) {
  shoal::v1::RoundSummary summary;
  summary.set_round(completed.round);
  summary.set_participants(completed.participants.size());
  summary.set_seconds(completed.seconds);
  summary.set_model_hash(completed.model_hash);
  double loss = 0, exchange = 0;
  for (const std::string& id : completed.participants) {
    MemberStats& m = members_[id];
    loss += m.train_loss;
    exchange += m.exchange_seconds;
    if (m.metrics_round == completed.round && !summary.evaluated()) {
      summary.set_evaluated(true);
      summary.set_test_accuracy(m.metrics.test_accuracy());
      summary.set_test_loss(m.metrics.test_loss());
    }
    ++m.rounds_completed;
    AddSample(m.time_shares,
              MemberStats::TimeShare{m.round_train_seconds, m.exchange_seconds, completed.seconds},
              window_);
    m.deadline_seconds = completed.deadline_seconds;
  }
  for (const round_intent::Completed::Fold& f : completed.folds) {
    MemberStats& m = members_[f.worker_id];
    ++m.folded_updates;
    m.last_fold_round = completed.round;
    m.last_fold_staleness = f.staleness;
    m.last_fold_weight = f.weight;
    m.last_fold_train_seconds = f.train_seconds;
  }
  if (!completed.participants.empty()) {
    summary.set_train_loss(loss / completed.participants.size());
    summary.set_exchange_seconds(exchange / completed.participants.size());
  }
  if (!summary.evaluated() && !recent_rounds_.empty()) {
    summary.set_test_accuracy(recent_rounds_.back().test_accuracy());
    summary.set_test_loss(recent_rounds_.back().test_loss());
  }
  recent_rounds_.push_back(std::move(summary));
  while (recent_rounds_.size() > kRecentRounds) recent_rounds_.pop_front();
}

void RoundStats::FillStatus(shoal::v1::RunStatus* s) const {
  for (const shoal::v1::RoundSummary& r : recent_rounds_) *s->add_recent_rounds() = r;
}

void RoundStats::FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const {
  auto it = members_.find(worker_id);
  if (it == members_.end()) return;
  const MemberStats& m = it->second;
  w->set_test_accuracy(m.metrics.test_accuracy());
  w->set_test_loss(m.metrics.test_loss());
  w->set_metrics_round(m.metrics_round);
  w->set_train_loss(m.train_loss);
  w->set_rounds_completed(m.rounds_completed);
  if (!m.train_seconds.empty()) {
    std::vector<double> t(m.train_seconds.begin(), m.train_seconds.end());
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    w->set_train_seconds_median(n % 2 == 1 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2);
  }
  w->set_rounds_late(m.rounds_late);
  w->set_bytes_received(m.bytes_received);
  w->set_bytes_sent(m.bytes_sent);
  w->set_compression_ratio(m.compression_ratio);
  w->set_wire_round(m.wire_round);
  w->set_folded_updates(m.folded_updates);
  w->set_last_fold_staleness(m.last_fold_staleness);
  w->set_last_fold_weight(m.last_fold_weight);
  w->set_last_fold_round(m.last_fold_round);
  w->set_last_fold_train_seconds(m.last_fold_train_seconds);
  w->set_deadline_seconds(m.deadline_seconds);
  double train = 0, exchange = 0, wall = 0;
  for (const MemberStats::TimeShare& t : m.time_shares) {
    train += t.train;
    exchange += t.exchange;
    wall += t.wall;
  }
  if (wall > 0) {
    // Measured on two clocks (the worker's parts, the coordinator's
    // round): clamped so that the shares stay shares.
    const double t = std::min(1.0, train / wall);
    const double e = std::min(1.0 - t, exchange / wall);
    w->set_train_share(t);
    w->set_exchange_share(e);
    w->set_idle_share(1.0 - t - e);
  }
}

}  // namespace shoal::coordinator
