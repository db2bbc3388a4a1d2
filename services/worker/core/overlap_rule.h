// Overlapped rounds (RunConfig.exchange.overlap, docs/OVERLAP.md): which
// local progress a round's contribution carries. Pure decisions, no
// threads or I/O; services/worker/local_training.h carries them out.
//
// The rule (the delayed update of asynchronous / streaming DiLoCo with a
// delay of one round): when round N's local steps end the worker reports
// its contribution C_N and at once trains round N+1's steps on its local
// model, starting from C_N. When round N+1 starts, the agreed model G_N
// (round N's average, the same on every worker) is what the round is based
// on, and its contribution is
//
//   C_{N+1} = G_N + (L - C_N)
//
// where L is the local model after those steps: the progress made while
// round N was averaged, carried onto the agreed model. The local model
// then continues from C_{N+1}. So every contribution is exactly one
// round's local steps of progress (its change from the round's base is
// L - C_N), none of it is counted twice or lost, and the agreed model is a
// pure function of the agreed models and contributions before it, as
// without overlap: the hash vote, checkpoints and joiners see it unchanged.
//
// The progress carries only onto the model it was meant for: the worker
// must hold the agreed model of round N when round N+1 starts. Anything
// else (round N was aborted and starts again, the worker caught up past
// it, it folded late work instead of training) restarts the local model
// from the round's base, and the steps are trained in the foreground.
#ifndef SHOAL_SERVICES_WORKER_CORE_OVERLAP_RULE_H_
#define SHOAL_SERVICES_WORKER_CORE_OVERLAP_RULE_H_

#include <cstdint>

namespace shoal::worker {

// Local steps trained ahead of their round.
struct AheadWork {
  // Started (and maybe still running).
  bool started = false;
  // The round whose contribution it becomes: one after the round whose
  // contribution it started from.
  uint64_t for_round = 0;
};

enum class AheadUse {
  // Carry the progress onto the round's base (C = G + (L - start)).
  kCarry,
  // Let it go: the local model restarts from the round's base.
  kRestart,
};

// Round `round` starts, based on the agreed model of `model_round` (what
// the worker holds when it trains).
inline AheadUse DecideAhead(const AheadWork& work, uint64_t round, uint64_t model_round) {
  if (!work.started) return AheadUse::kRestart;
  if (work.for_round != round) return AheadUse::kRestart;
  // Trained from the contribution to round - 1: the base must be that
  // round's agreed model.
  if (model_round + 1 != round) return AheadUse::kRestart;
  return AheadUse::kCarry;
}

inline const char* AheadUseName(AheadUse use) {
  return use == AheadUse::kCarry ? "carry" : "restart";
}

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_OVERLAP_RULE_H_
