// The local model apart from the agreed one: overlapped rounds
// (RunConfig.exchange.overlap) and streaming fragments
// (RunConfig.exchange.fragments; docs/OVERLAP.md). The trainer's flat
// buffer becomes the worker's local model L; the model the round protocol,
// the exchange and the peers see (ModelMemory's parameters, the agreed
// model G and the contributions) is a second buffer owned here. The carry
// rule is core/overlap_rule.h.
//
// A round's contribution carries the local progress onto the agreed model
// on the round's fragment [b, e) (the whole model without fragments):
// C = G + (L - S) there, with S where the local model last took an
// average, and C = G elsewhere, so the elements the round does not average
// stay the agreed model on every worker and the hash keeps its meaning.
// The local model keeps its progress outside the fragment until that
// fragment's round.
//
// Overlapped (`ahead`): the steps of round N+1 run on a thread of their own
// while round N is exchanged, and take the round's average as soon as this
// worker's exchange has computed it (Post): between two steps the local
// model moves onto it with the progress made so far (L += P - S; S = P),
// so only the steps that ran during the exchange are stale, not the whole
// round; on a fast link, a few. On a link slower than the training, the
// steps end before the average comes and the carry at the next round
// start does the same. Not overlapped (fragments alone): the steps train
// at the round's start, in the foreground, after the same move.
//
// What it holds (docs/ARCHITECTURE.md's memory table), n the model's
// elements; nothing else of the model's size:
//  - X (params_, n floats): the agreed model / contribution, apart from the
//    trainer's buffer: the exchange averages into it while the trainer
//    trains L. With fragments alone, L keeps its progress outside the
//    round's fragment, so it cannot be X either.
//  - S (start_, n floats): per element, where L last took the agreed model;
//    the progress a contribution carries is L - S. It cannot be X (the
//    exchange overwrites X with the average) nor L.
//  - only with AheadOptions::extrapolate: the agreed model at the last
//    round's start and the value before its last move (agreed_,
//    agreed_before_, n floats each), which the prediction is made from.
// The average the steps ahead take is not copied: they read it from X,
// lent chunk by chunk through the worker's ModelState (Bind), whose rule
// makes every rewrite of X outside the exchange close X's window and wait
// for the chunk in hand; or without lending while the next round's start
// (TrainRound, whose ModelMemory::Train closed the window ahead of its
// write) waits for them, since it writes X only after they end. An average
// whose window closed otherwise (a void, a catch-up, a new attempt) is left
// to the next round start's carry, which is exact per element whatever was
// taken.
//
// Threads: TrainRound, Post and Stop are called from the runner's thread;
// the work ahead runs on a thread this object starts and joins, and
// touches only the trainer (TrainSteps on its own buffer, a step per call,
// SyncParameters before it reads or writes that buffer), S and (lent) X.
// The trainer must not be trained by anyone else meanwhile;
// EvaluateParams (a second instance of the model) is safe.
#ifndef SHOAL_SERVICES_WORKER_LOCAL_TRAINING_H_
#define SHOAL_SERVICES_WORKER_LOCAL_TRAINING_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/shard_plan.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/overlap_rule.h"
#include "services/worker/core/trainer.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

// How the steps ahead meet the last round's average (overlapped rounds;
// RunConfig.exchange.overlap_start / overlap_stale_steps).
struct AheadOptions {
  // 0: the steps ahead start from this worker's contribution. B > 0: on
  // the round's fragment they start from the agreed model moved once more
  // by B times its last move, G + B (G - G_prev) per element, a prediction
  // of the average (the same on every worker); elements whose agreed value
  // has not moved since the local model restarted start from the
  // contribution.
  double extrapolate = 0;
  // 0: the steps ahead take the average as soon as it is posted. S > 0:
  // after exactly S steps (waiting for it at step S, holding it until
  // then), so that the count of stale steps is S whatever the link and
  // the load.
  uint32_t stale_steps = 0;
};

// The options of a run config (validated: common/run_config.h).
AheadOptions AheadOptionsOf(const shoal::v1::ExchangeConfig& exchange);

class LocalTraining {
 public:
  // The trainer's stop (TrainerOptions::stop) must be stop() below, so
  // that Stop() ends the steps ahead at once. `parent` (the worker's stop)
  // cancels it too; it must outlive this object. `ahead`: overlapped
  // rounds (the next round's steps train while this one is averaged).
  explicit LocalTraining(CancellationToken* parent, bool ahead = true, const Clock* clock = nullptr,
                         AheadOptions options = {});
  // Stops and joins the work ahead.
  ~LocalTraining();
  LocalTraining(const LocalTraining&) = delete;
  LocalTraining& operator=(const LocalTraining&) = delete;

  const CancellationToken* stop() const { return &stop_; }

  // Takes the trainer (built with stop()): the agreed model starts as a
  // copy of its initial parameters. Returns that buffer (num_elements()
  // floats), which ModelMemory and the peers use as the parameters, and
  // which `state` (the worker's, bound to it; outlives this object) serves.
  // Without a state (tests), whoever Posts keeps the average unchanged
  // until the next TrainRound.
  float* Bind(Trainer* trainer, const ModelState* state = nullptr);

  struct Round {
    double loss = 0;
    // Seconds the steps of this contribution trained (ahead or not).
    double train_seconds = 0;
    AheadUse use = AheadUse::kRestart;
    // kCarry: how many of the steps ran before the last round's average
    // came (from a stale model); all of them when it came after the last.
    uint32_t stale_steps = 0;
    uint32_t steps = 0;
  };
  // Round `round`'s training, `params` (the buffer Bind returned) holding
  // the agreed model of `model_round`: waits for the steps trained ahead
  // (or trains them now, not overlapped) and carries the local progress
  // onto it, or restarts the local model from it and trains `steps` now
  // (DecideAhead). `params` becomes the contribution on `fragment` (the
  // elements the round averages) and stays the agreed model elsewhere.
  // Overlapped, the next round's `steps` start ahead.
  Round TrainRound(uint64_t round, uint64_t model_round, uint32_t steps, float* params,
                   SliceRange fragment);
  Round TrainRound(uint64_t round, uint64_t model_round, uint32_t steps, float* params) {
    return TrainRound(round, model_round, steps, params, {0, n_});
  }

  bool overlapped() const { return ahead_mode_; }

  // The steps ahead start held: they run only once the round they follow
  // is being exchanged (its plan came: Release), never while it waits for
  // the other participants to be ready, so that a worker faster than the
  // others does not train a round's worth of steps from a stale model
  // (the plain round would idle there too). An average posted, the next
  // TrainRound or Stop end the hold as well.
  void Release();

  // This worker's exchange computed `average` (num_elements() floats) for
  // the round whose contribution the steps ahead started from (a new
  // attempt posts again): they move onto it between two steps, or at the
  // next TrainRound when they already ended. Nothing happens when no work
  // is ahead (not overlapped: the next TrainRound takes the agreed model).
  // With a state (Bind), `average` must be the buffer Bind returned: it is
  // read in place, for as long as its window stays open, not copied.
  void Post(const float* average);

  // Ends the work ahead (after its current step) and joins it, and the
  // trainer's model becomes the one Bind's buffer holds (the agreed model:
  // what a worker predicts with at exit); TrainRound must not be called
  // again. Idempotent.
  void Stop();

  const AheadWork& ahead() const { return ahead_; }
  // Rounds that carried the local progress / restarted from their base.
  uint64_t carried() const { return carried_; }
  uint64_t restarted() const { return restarted_; }
  // Rounds whose steps ahead took the average before they ended.
  uint64_t merged_early() const { return merged_early_; }
  // Bytes of the model-sized buffers held (see the class comment).
  uint64_t model_bytes() const;
  // TrainRound waits for the steps ahead (they may read X meanwhile).
  bool round_waits() const;

 private:
  void StartAhead(uint64_t for_round, uint32_t steps);
  void JoinAhead();
  // The local model takes what was posted, if anything: L += P - start,
  // start = P, where P is still lent (all of it, or the chunks before the
  // first refused). The thread of the work ahead. True when it took any.
  bool TakePosted();
  // On [begin, end): the local model takes the agreed model `params`
  // where it has not yet (L += G - S, S = G); with `contribute`, those
  // elements then become the contribution (params = S = L).
  void Carry(float* params, uint64_t begin, uint64_t end, bool contribute);
  // Waits while the steps ahead are held; false when they are to end.
  bool AwaitGo();
  // AheadOptions::stale_steps: waits until an average is posted, the next
  // round starts, or the steps ahead are to end.
  void AwaitPosted();
  // AheadOptions::extrapolate: notes which agreed values moved since the
  // last round (params: the agreed model at a round's start); `restart`
  // forgets the moves (a base that is not the round before's).
  void TrackAgreed(const float* params, bool restart);
  // Where the steps ahead start on [begin, end): G + B (G - G_prev).
  void StartFromPrediction(SliceRange fragment);

  CancellationToken stop_;
  const bool ahead_mode_;
  const AheadOptions options_;
  const Clock* clock_;
  Trainer* trainer_ = nullptr;
  const ModelState* state_ = nullptr;
  uint64_t n_ = 0;
  // The agreed model / contribution (ModelMemory's parameters).
  std::vector<float> params_;
  // S: per element, the local model where it last took the agreed model
  // (an average, or the contribution it carried).
  std::vector<float> start_;
  // AheadOptions::extrapolate: per element, the agreed value at the last
  // round's start and the one before its last move.
  std::vector<float> agreed_;
  std::vector<float> agreed_before_;
  AheadWork ahead_;
  std::thread thread_;
  // Written by the thread, read after joining it.
  double ahead_loss_ = 0;
  double ahead_seconds_ = 0;
  bool ahead_merged_ = false;
  uint32_t ahead_steps_ = 0;
  uint32_t ahead_stale_steps_ = 0;
  // Stop() gave the trainer the agreed model.
  bool stopped_ = false;
  mutable absl::Mutex mu_;
  // What Post gave: the average (X), the window it is valid in (with a
  // state), and the count of posts (a newer one is taken again).
  const float* posted_ ABSL_GUARDED_BY(mu_) = nullptr;
  ModelState::ReadGrant posted_grant_ ABSL_GUARDED_BY(mu_);
  uint64_t posted_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool has_posted_ ABSL_GUARDED_BY(mu_) = false;
  // TrainRound waits for the steps ahead: X is not written until they end.
  bool round_waits_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool abandon_ ABSL_GUARDED_BY(mu_) = false;
  // The next round started (TrainRound): the steps ahead no longer wait
  // for an average.
  bool round_started_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t merged_early_ = 0;
  uint64_t carried_ = 0;
  uint64_t restarted_ = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_LOCAL_TRAINING_H_
