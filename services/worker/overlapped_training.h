// Overlapped rounds (RunConfig.exchange.overlap, docs/OVERLAP.md): the
// trainer's flat buffer becomes the worker's local model, trained on a
// thread of its own while the runner's thread exchanges; the model the
// round protocol, the exchange and the peers see (ModelMemory's
// parameters, the agreed model and the contributions) is a second buffer
// owned here. The carry rule is core/overlap_rule.h.
//
// The steps ahead take the round's average as soon as this worker's
// exchange has computed it (Post): between two steps the local model
// moves onto it with the progress made so far (L += P - start; start = P),
// so only the steps that ran during the exchange are stale, not the whole
// round; on a fast link, a few. On a link slower than the training, the
// steps end before the average comes and the carry at the next round
// start does the same.
//
// Threads: TrainRound, Post and Stop are called from the runner's thread;
// the work ahead runs on a thread this object starts and joins, and
// touches only the trainer (TrainSteps on its own buffer), its start and
// (under a mutex) what was posted. The trainer must not be trained by
// anyone else meanwhile; EvaluateParams (a second instance of the model)
// is safe.
#ifndef SHOAL_SERVICES_WORKER_OVERLAPPED_TRAINING_H_
#define SHOAL_SERVICES_WORKER_OVERLAPPED_TRAINING_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "services/worker/core/overlap_rule.h"
#include "services/worker/core/trainer.h"

namespace shoal::worker {

class OverlappedTraining {
 public:
  // The trainer's stop (TrainerOptions::stop) must be stop() below, so
  // that Stop() ends the steps ahead at once. `parent` (the worker's stop)
  // cancels it too; it must outlive this object.
  explicit OverlappedTraining(CancellationToken* parent, const Clock* clock = nullptr);
  // Stops and joins the work ahead.
  ~OverlappedTraining();
  OverlappedTraining(const OverlappedTraining&) = delete;
  OverlappedTraining& operator=(const OverlappedTraining&) = delete;

  const CancellationToken* stop() const { return &stop_; }

  // Takes the trainer (built with stop()): the agreed model starts as a
  // copy of its initial parameters. Returns that buffer (num_elements()
  // floats), which ModelMemory and the peers use as the parameters.
  float* Bind(Trainer* trainer);

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
  // and carries them onto it, or trains `steps` now (DecideAhead), then
  // starts the next round's `steps` ahead, from the contribution. `params`
  // becomes the contribution.
  Round TrainRound(uint64_t round, uint64_t model_round, uint32_t steps, float* params);

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
  // is ahead.
  void Post(const float* average);

  // Ends the work ahead (after its current step) and joins it, and the
  // trainer's model becomes the one Bind's buffer holds (what a worker
  // predicts with at exit); TrainRound must not be called again.
  // Idempotent.
  void Stop();

  const AheadWork& ahead() const { return ahead_; }
  // Rounds that carried work trained ahead / restarted from their base.
  uint64_t carried() const { return carried_; }
  uint64_t restarted() const { return restarted_; }
  // Rounds whose steps ahead took the average before they ended.
  uint64_t merged_early() const { return merged_early_; }

 private:
  void StartAhead(uint64_t for_round, uint32_t steps);
  void JoinAhead();
  // The local model takes what was posted, if anything: L += P - start,
  // start = P. The thread of the work ahead, or the runner's once it
  // ended. True when it did.
  bool TakePosted();
  // Waits while the steps ahead are held; false when they are to end.
  bool AwaitGo();

  CancellationToken stop_;
  const Clock* clock_;
  Trainer* trainer_ = nullptr;
  uint64_t n_ = 0;
  // The agreed model / contribution (ModelMemory's parameters).
  std::vector<float> params_;
  // The local model where the work ahead started.
  std::vector<float> start_;
  AheadWork ahead_;
  std::thread thread_;
  // Written by the thread, read after joining it.
  double ahead_loss_ = 0;
  double ahead_seconds_ = 0;
  bool ahead_merged_ = false;
  uint32_t ahead_steps_ = 0;
  uint32_t ahead_stale_steps_ = 0;
  absl::Mutex mu_;
  std::vector<float> posted_ ABSL_GUARDED_BY(mu_);
  bool has_posted_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool abandon_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t merged_early_ = 0;
  uint64_t carried_ = 0;
  uint64_t restarted_ = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_OVERLAPPED_TRAINING_H_
