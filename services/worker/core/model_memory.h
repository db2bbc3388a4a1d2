// The one owner of a worker's model memory: the parameters (the trainer's
// flat buffer), the snapshot (the last agreed averaged model, served to
// workers catching up: the one model-sized buffer a plain synchronous run
// adds) and, while a worker has late work to fold into a later round, its
// update (allocated only then). There is no copy of the trained model: the
// exchange writes each element of the parameters once, from this worker's
// trained value to the round's average (services/worker/exchanger.h), so
// a new plan attempt contributes the parameters as they are: per element
// the trained value, or the failed attempt's average where it already came
// (ContributeAgain).
//
// Peers read the parameters and the snapshot without copies: gRPC holds
// pointers into them (see "Lending model memory" in core/model_state.h).
// So every write outside the exchange protocol is one sequence: close the
// buffer's window in ModelState, wait until gRPC has given back every chunk
// lent from it, write, then say what the buffer now holds (which reopens
// it). Each public method below is one such sequence, so no caller can do
// it in the wrong order; the only raw write access is the exchange target
// (exchange_target()), whose rules are in services/worker/exchanger.h.
//
// Not thread-safe: the worker's main thread calls it; gRPC threads only
// read through ModelState.
#ifndef SHOAL_SERVICES_WORKER_CORE_MODEL_MEMORY_H_
#define SHOAL_SERVICES_WORKER_CORE_MODEL_MEMORY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/worker/core/model_state.h"

namespace shoal::worker {

class ModelMemory {
 public:
  // `params` (`total` elements) belongs to the trainer and outlives this
  // object; `state` is what the peer service reads. The snapshot starts as a
  // copy of the parameters: the initial model of round 0 with `hash`.
  ModelMemory(ModelState* state, float* params, uint64_t total, const std::string& hash,
              absl::Duration lent_timeout = absl::Seconds(5));
  // Waits for every lent chunk; when gRPC keeps one beyond the timeout the
  // snapshot buffer is leaked (logged) rather than freed under a reader.
  ~ModelMemory();
  ModelMemory(const ModelMemory&) = delete;
  ModelMemory& operator=(const ModelMemory&) = delete;

  uint64_t total() const { return total_; }
  const float* parameters() const { return params_; }
  const float* snapshot() const { return snapshot_.data(); }

  // Local training of `round`: nothing of it is served while `train`
  // rewrites the parameters; then its contribution becomes readable.
  // Returns what `train` returns.
  double Train(uint64_t round, const std::function<double(float* params)>& train);

  // A new plan attempt (a participant was lost): the parameters as the
  // last attempt left them are the contribution again. Reads of that
  // attempt are refused and their chunks given back first, since its
  // exchange rewrote part of them (ServePlan computes their CRCs again).
  void ContributeAgain(uint64_t round);
  // The plan of `round` (attempt) gives this worker [begin, end): serve it
  // and the contribution.
  void ServePlan(uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end);

  // Where the exchange averages in place (see exchanger.h for why peers
  // may read it meanwhile).
  float* exchange_target() { return params_; }

  // The parameters hold the average of `round` (`hash`), not yet agreed:
  // they are served as the snapshot; the snapshot buffer keeps the agreed
  // model.
  void HoldPending(uint64_t round, const std::string& hash);
  // The pending round is agreed: the snapshot buffer takes its bytes.
  void CommitPending(uint64_t round);
  // The pending round is void: the snapshot buffer's model (`round`,
  // `hash`) is served again. The parameters are restored by the caller's
  // next step (DropWork or ContributeAgain).
  void VoidPending(uint64_t round, const std::string& hash);
  // Local work of `round` is discarded: the parameters go back to the
  // snapshot buffer's model.
  void DropWork(uint64_t round);

  // Late work (see "late work" in worker_protocol.h). The work of `round`
  // missed its deadline: its update (parameters minus the snapshot
  // buffer's model, the base it was trained from) is kept, and the
  // parameters go back to that base.
  void KeepLateWork(uint64_t round);
  // The contribution of `round` without training: parameters = snapshot
  // buffer's model (the round's base) + (float)`weight` x the kept update;
  // served like a trained contribution.
  void FoldLateWork(uint64_t round, double weight);
  // The kept update is no longer needed: its memory is freed.
  void DropLateWork();
  bool has_late_work() const { return !late_.empty(); }

  // A catch-up: `pull` fills the snapshot buffer (not served meanwhile).
  // On success the parameters take the pulled model of (`round`, `hash`);
  // on failure the snapshot goes back to the current parameters'
  // (model_round) and the error is returned.
  absl::Status CatchUp(uint64_t round, const std::string& hash, uint64_t model_round,
                       const std::function<absl::Status(float* dst, uint64_t total)>& pull);

  // Gossip mode (docs/GOSSIP.md). Peers read published copies
  // (GossipBoard), never the parameters: each write below closes the
  // parameters' window all the same (nothing of them is served) and waits
  // for chunks still lent from it, so the lending rule holds whatever a
  // peer asks for.
  //
  // Local training without rounds: `train` rewrites the parameters; returns
  // what it returns.
  double TrainUnserved(const std::function<double(float* params)>& train);
  // The interpolation with a peer's model: params += a * (peer - base),
  // where `base` is this worker's model when the fetch started (a published
  // copy) or the parameters themselves (a pushed model: then it is dpwa's
  // params = a * peer + (1 - a) * params). `peer` and `base` hold total()
  // elements.
  void Interpolate(const float* base, const float* peer, double a);
  // The parameters become `model` (total() elements): a late joiner's
  // first model, the final average.
  void ReplaceModel(const float* model);
  // A checkpoint's model: `load` fills the parameters (every element) and
  // checks what it loaded; its error is returned (the parameters then hold
  // whatever it wrote, and the worker does not train from them).
  absl::Status LoadModel(const std::function<absl::Status(float* params, uint64_t total)>& load);

 private:
  // Closes the parameters' window and waits for their lent chunks: the
  // start of every gossip write.
  void BeginUnservedWrite();
  // Waits (bounded) for gRPC to give back the chunks of `buffer`; past the
  // timeout it logs and goes on (a stale reader then fails its CRC check).
  void AwaitLent(ModelState::Buffer buffer);

  ModelState* const state_;
  float* const params_;
  const uint64_t total_;
  const absl::Duration lent_timeout_;
  std::vector<float> snapshot_;
  std::vector<float> late_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_MODEL_MEMORY_H_
