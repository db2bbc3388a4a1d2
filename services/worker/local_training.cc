#include "services/worker/local_training.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "common/logging.h"
#include "common/parallel_chunks.h"
#include "common/run_options.h"

namespace shoal::worker {

namespace {

// L += P - S, S = P over n elements; exact where nothing moved since the
// start (no step yet): L = P. The pointers do not alias (restrict: the
// loop vectorizes).
void TakeAverage(float* __restrict local, float* __restrict start, const float* __restrict avg,
                 uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    const float v = avg[i];
    const float l = local[i];
    const float s = start[i];
    local[i] = l == s ? v : l + (v - s);
    start[i] = v;
  }
}

// The carry of one range (LocalTraining::Carry): L += G - S, S = G where the
// agreed model G moved; exact where nothing moved since the start (L = G);
// with `contribute`, G = S = L after it.
void CarryRange(float* __restrict local, float* __restrict start, float* __restrict params,
                uint64_t n, bool contribute) {
  for (uint64_t i = 0; i < n; ++i) {
    float l = local[i];
    if (start[i] != params[i]) {
      l = l == start[i] ? params[i] : l + (params[i] - start[i]);
      local[i] = l;
      start[i] = params[i];
    }
    if (contribute) {
      params[i] = l;
      start[i] = l;
    }
  }
}

}  // namespace

AheadOptions AheadOptionsOf(const shoal::v1::ExchangeConfig& exchange) {
  AheadOptions options;
  if (absl::StatusOr<OverlapStart> start = ParseOverlapStart(exchange.overlap_start());
      start.ok()) {
    options.extrapolate = start->extrapolate;
  }
  options.stale_steps = exchange.overlap_stale_steps();
  return options;
}

LocalTraining::LocalTraining(CancellationToken* parent, bool ahead, const Clock* clock,
                             AheadOptions options)
    : stop_(parent),
      ahead_mode_(ahead),
      options_(options),
      clock_(clock != nullptr ? clock : RealClock::Get()) {}

LocalTraining::~LocalTraining() { Stop(); }

float* LocalTraining::Bind(Trainer* trainer, const ModelState* state) {
  trainer_ = trainer;
  state_ = state;
  n_ = trainer->num_elements();
  // Its buffer is read and written here only between steps, at the points
  // that call SyncParameters.
  trainer->SyncOnRequest();
  params_.assign(trainer->parameters(), trainer->parameters() + n_);
  start_.assign(params_.begin(), params_.end());
  if (ahead_mode_ && options_.extrapolate > 0) {
    agreed_.assign(params_.begin(), params_.end());
    agreed_before_.assign(params_.begin(), params_.end());
  }
  return params_.data();
}

bool LocalTraining::round_waits() const {
  absl::MutexLock lock(&mu_);
  return round_waits_;
}

uint64_t LocalTraining::model_bytes() const {
  return (params_.capacity() + start_.capacity() + agreed_.capacity() + agreed_before_.capacity()) *
         sizeof(float);
}

void LocalTraining::StartAhead(uint64_t for_round, uint32_t steps) {
  ahead_.started = true;
  ahead_.for_round = for_round;
  ahead_loss_ = 0;
  ahead_seconds_ = 0;
  ahead_merged_ = false;
  ahead_steps_ = 0;
  ahead_stale_steps_ = 0;
  {
    absl::MutexLock lock(&mu_);
    held_ = true;
    abandon_ = false;
    round_started_ = false;
    round_waits_ = false;
  }
  // What the steps ahead train (a Python loop shows it as its round).
  trainer_->SetRound(for_round);
  const bool nice = trainer_->ComputesOnCallingThread();
  thread_ = std::thread([this, steps, nice] {
    // Below the exchange's threads: on a busy machine the average that the
    // steps wait for is not slowed by them (Linux niceness is per thread).
    // Not where the steps compute on another thread (a Python loop's, which
    // waits for this one between its steps).
    if (nice) setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
    absl::Duration trained;
    double loss_sum = 0;
    uint32_t done = 0;
    // A step at a time, so that the average can come in between.
    for (; done < steps; ++done) {
      if (!AwaitGo()) break;
      // The average moves the local model between two steps: as soon as
      // it is posted, or (AheadOptions::stale_steps) at step S exactly.
      const uint32_t at = options_.stale_steps;
      if (at > 0 && done == at) AwaitPosted();
      if ((at == 0 || done == at) && TakePosted()) {
        ahead_merged_ = true;
        ahead_stale_steps_ = done;
      }
      const absl::Time t0 = clock_->Now();
      loss_sum += trainer_->TrainSteps(1);
      trained += clock_->Now() - t0;
    }
    if (!ahead_merged_) ahead_stale_steps_ = done;
    ahead_steps_ = done;
    ahead_loss_ = done == 0 ? 0 : loss_sum / done;
    ahead_seconds_ = absl::ToDoubleSeconds(trained);
  });
}

bool LocalTraining::AwaitGo() {
  absl::MutexLock lock(&mu_);
  auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !held_ || has_posted_ || abandon_ || stop_.cancelled();
  };
  // The stop is a token of its own: looked at every second.
  while (!go()) mu_.AwaitWithTimeout(absl::Condition(&go), absl::Seconds(1));
  return !abandon_ && !stop_.cancelled();
}

void LocalTraining::AwaitPosted() {
  absl::MutexLock lock(&mu_);
  auto posted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return has_posted_ || round_started_ || abandon_ || stop_.cancelled();
  };
  while (!posted()) mu_.AwaitWithTimeout(absl::Condition(&posted), absl::Seconds(1));
}

void LocalTraining::TrackAgreed(const float* params, bool restart) {
  if (agreed_.empty()) return;
  if (restart) {
    std::copy_n(params, n_, agreed_.data());
    std::copy_n(params, n_, agreed_before_.data());
    return;
  }
  for (uint64_t i = 0; i < n_; ++i) {
    if (params[i] == agreed_[i]) continue;
    agreed_before_[i] = agreed_[i];
    agreed_[i] = params[i];
  }
}

void LocalTraining::StartFromPrediction(SliceRange fragment) {
  if (agreed_.empty()) return;
  float* local = trainer_->parameters();
  const float b = static_cast<float>(options_.extrapolate);
  for (uint64_t i = fragment.begin; i < fragment.end; ++i) {
    const float g = agreed_[i];
    // No move seen yet (the first rounds, or after a restart): the
    // contribution is the better guess.
    if (g == agreed_before_[i]) continue;
    const float p = g + b * (g - agreed_before_[i]);
    local[i] = p;
    start_[i] = p;
  }
}

void LocalTraining::Release() {
  absl::MutexLock lock(&mu_);
  held_ = false;
}

bool LocalTraining::TakePosted() {
  const float* average = nullptr;
  ModelState::ReadGrant grant;
  uint64_t seq = 0;
  bool pinned = false;
  {
    absl::MutexLock lock(&mu_);
    if (!has_posted_) return false;
    average = posted_;
    grant = posted_grant_;
    seq = posted_seq_;
    pinned = round_waits_;
  }
  // X may be read while its window is open, and while the next round's
  // start waits for these steps: it writes X only after them (its window
  // closed already, ahead of that write). Otherwise X may have been
  // rewritten since (a void, a catch-up): looked at again at the next
  // step, and left to the round start's carry if nothing pins it.
  const bool lend = state_ != nullptr && !pinned;
  if (lend && !state_->IsCurrent(grant)) return false;
  {
    absl::MutexLock lock(&mu_);
    if (posted_seq_ == seq) has_posted_ = false;  // a newer one is taken next
  }
  trainer_->SyncParameters();
  float* local = trainer_->parameters();
  float* start = start_.data();
  // A chunk at a time, on a few threads (the loop waits for this pass): a
  // rewrite of X waits at most for the chunks in hand.
  constexpr uint64_t kChunk = ModelState::kCellElements;
  std::atomic<bool> took{false};
  ForEachChunk(0, n_, kChunk, PassThreads(), [&](uint64_t b, uint64_t e) {
    const float* p = average + b;
    if (lend) {
      absl::StatusOr<ModelState::LentChunk> lent = state_->LendChunk(grant, b, e - b);
      // Refused: the rest keeps its start, and the carry at the next round
      // start moves it (exact per element, whatever was taken here).
      if (!lent.ok()) return false;
      p = lent->data;
    }
    TakeAverage(local + b, start + b, p, e - b);
    if (lend) state_->ReturnChunk(ModelState::Buffer::kParameters);
    took.store(true, std::memory_order_relaxed);
    return true;
  });
  return took.load();
}

void LocalTraining::Post(const float* average) {
  // Not overlapped, the next round's start takes the agreed model.
  if (!ahead_.started || !ahead_mode_) return;
  if (state_ != nullptr && average != params_.data()) {
    SHOAL_LOG(ERROR) << "an average was posted from another buffer than the agreed model's; "
                        "the next round start takes the agreed model instead";
    return;
  }
  ModelState::ReadGrant grant;
  if (state_ != nullptr) grant = state_->GrantParameters();
  absl::MutexLock lock(&mu_);
  posted_ = average;
  posted_grant_ = grant;
  ++posted_seq_;
  has_posted_ = true;
  held_ = false;  // the exchange is over
}

void LocalTraining::Carry(float* params, uint64_t begin, uint64_t end, bool contribute) {
  float* local = trainer_->parameters();
  float* start = start_.data();
  ForEachChunk(begin, end, ModelState::kCellElements, PassThreads(), [&](uint64_t b, uint64_t e) {
    CarryRange(local + b, start + b, params + b, e - b, contribute);
    return true;
  });
}

void LocalTraining::JoinAhead() {
  if (thread_.joinable()) thread_.join();
}

LocalTraining::Round LocalTraining::TrainRound(uint64_t round, uint64_t model_round, uint32_t steps,
                                               float* params, SliceRange fragment) {
  Round r;
  r.use = DecideAhead(ahead_, round, model_round);
  {
    // Carried: the steps ahead still held (the last round never got its
    // plan) train now; let go: they end after the step in progress.
    absl::MutexLock lock(&mu_);
    held_ = false;
    abandon_ = r.use == AheadUse::kRestart;
    round_started_ = true;
    round_waits_ = true;  // X is not written before the join below
  }
  JoinAhead();
  {
    absl::MutexLock lock(&mu_);
    round_waits_ = false;
  }
  // The steps' progress is in the trainer's buffer, read and written below.
  trainer_->SyncParameters();
  TrackAgreed(params, r.use == AheadUse::kRestart);
  float* local = trainer_->parameters();
  uint32_t trained = 0;
  double loss_sum = 0;
  // The contribution is already in `params` (one pass with the carry).
  bool contributed = false;
  if (r.use == AheadUse::kCarry) {
    {
      absl::MutexLock lock(&mu_);
      has_posted_ = false;  // the agreed model below is that average
    }
    // The local model takes the agreed model wherever it has not yet (an
    // average that came after the last step ahead, or, not overlapped, at
    // all). When every step trained ahead, the round's fragment becomes
    // the contribution in the same pass: it is on the way from the steps'
    // end to the ready report, which every participant waits for.
    contributed = ahead_steps_ >= steps || stop_.cancelled();
    Carry(params, 0, fragment.begin, false);
    Carry(params, fragment.begin, fragment.end, contributed);
    Carry(params, fragment.end, n_, false);
    if (ahead_merged_) ++merged_early_;
    trained = ahead_steps_;
    loss_sum = ahead_loss_ * ahead_steps_;
    r.train_seconds = ahead_seconds_;
    r.stale_steps = ahead_stale_steps_;
    ++carried_;
  } else {
    {
      absl::MutexLock lock(&mu_);
      has_posted_ = false;  // for other work
    }
    if (ahead_.started) {
      SHOAL_LOG(INFO) << "round " << round << " (base: the model of round " << model_round
                      << "): the local progress was for round " << ahead_.for_round
                      << "; it is let go and the round trains from its base";
    }
    // The local model restarts from the round's base.
    std::copy_n(params, n_, local);
    std::copy_n(params, n_, start_.data());
    ++restarted_;
  }
  if (trained < steps && !stop_.cancelled()) {
    // Not overlapped, or restarted: the steps train now.
    const absl::Time t0 = clock_->Now();
    loss_sum += trainer_->TrainSteps(steps - trained) * (steps - trained);
    r.train_seconds += absl::ToDoubleSeconds(clock_->Now() - t0);
    trained = steps;
    trainer_->SyncParameters();
  }
  r.steps = trained;
  r.loss = trained == 0 ? 0 : loss_sum / trained;
  // The local model now holds the agreed model plus the progress since it
  // took it (S = G everywhere): C = L on the fragment. Where the steps
  // started from the agreed model itself (the average came before the
  // first step ahead, or no step was ahead), these are the bits of a
  // round trained without a local model. The rest of the model stays
  // agreed in `params`, and keeps its progress in the local model until
  // its own round.
  if (!contributed) {
    const uint64_t width = fragment.end - fragment.begin;
    std::copy_n(local + fragment.begin, width, params + fragment.begin);
    std::copy_n(local + fragment.begin, width, start_.data() + fragment.begin);
  }
  ahead_ = {};
  if (!ahead_mode_) {
    ahead_.started = true;  // nothing trains ahead; the next round carries
    ahead_.for_round = round + 1;
    ahead_merged_ = false;
    ahead_steps_ = 0;
    ahead_stale_steps_ = 0;
    ahead_loss_ = 0;
    ahead_seconds_ = 0;
  } else if (!stop_.cancelled()) {
    // The contribution is reported as is; the steps ahead may start from
    // a prediction of its average instead.
    StartFromPrediction(fragment);
    StartAhead(round + 1, steps);
  }
  return r;
}

void LocalTraining::Stop() {
  stop_.Cancel();
  {
    absl::MutexLock lock(&mu_);
    abandon_ = true;
  }
  JoinAhead();
  if (trainer_ == nullptr || stopped_) return;
  stopped_ = true;
  // What is read of the trainer from now on (predictions at exit, a Python
  // loop's module after its run) is the agreed model, not the steps ahead.
  trainer_->SyncParameters();
  std::copy_n(params_.data(), n_, trainer_->parameters());
}

}  // namespace shoal::worker
