// One round's sharded average, bandwidth-optimal:
//  1. reduce-scatter: the worker reads every other participant's copy of the
//     slice it owns and adds it, chunk by chunk, into its own parameters;
//     then divides by N;
//  2. all-gather: it reads every other owner's averaged slice straight into
//     its parameters.
// The first Averager (core/averager.h); chunks are decoded through a Codec
// (core/codec.h, fp32 today).
//
// Both phases run at once (one thread per read); an all-gather read of a
// slice its owner has not averaged yet waits on the owner's server until
// the average is there (PeerService), and is retried after a short backoff
// if that wait ends UNAVAILABLE (common/retry.h: IsRetryable, backoff, the
// exchange's deadline). Each worker moves about 2(N-1)/N of the model per
// round. Reads resume where they stopped, so a retried read never adds
// twice. When the exchange stops (the caller's token is cancelled, or a
// failed reduce means our slice will never be averaged) one cancellation
// token ends every read still running at once: nothing polls.
//
// Chunks are applied straight from the receive buffers (ChunkView::CopyTo /
// AddTo), once checked. With a robust aggregation (trimmed mean, median:
// ExchangeOptions::aggregation) the reduce copies each contribution into a
// buffer of its own and the owner combines them element by element once all
// are in (core/aggregation.h); the mean adds them in place as they arrive.
//
// Why peers may read our parameters while we write them (the zero-copy
// server lends model memory to gRPC, see core/model_state.h): we write a
// slice other than our own only in the all-gather, with its owner's
// average, and the owner averages only after it has received our
// contribution of that slice completely; we write our own slice (adds,
// divide) before MarkAveraged, and nobody else reads it before that.
#ifndef SHOAL_SERVICES_WORKER_EXCHANGER_H_
#define SHOAL_SERVICES_WORKER_EXCHANGER_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/run_options.h"
#include "services/worker/core/averager.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/outer_optimizer.h"
#include "services/worker/core/push_box.h"
#include "services/worker/peer_client.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

struct ExchangeOptions {
  // The whole exchange must finish within this time.
  absl::Duration timeout = absl::Seconds(120);
  // Backoff between retries of a read (not-yet-averaged, peer unavailable).
  absl::Duration initial_backoff = absl::Milliseconds(1);
  absl::Duration max_backoff = absl::Milliseconds(20);
  // Time source of the deadline (the real clock when null).
  const Clock* clock = nullptr;
  // How the owner combines the contributions of its slice: the run's
  // RunConfig.exchange.aggregation (core/aggregation.h), set by the worker from the
  // run config, never from its own flags. The mean sums contributions as
  // they arrive; the robust rules keep each apart until all are in.
  AggregationSpec aggregation;
  // Contributions pushed by participants behind NAT (SliceAssignment.
  // outbound_only): the reduce takes them from here instead of reading
  // them. Null: a plan with such a participant fails FAILED_PRECONDITION.
  PushBox* push_box = nullptr;
};

using ExchangeStats = AveragingStats;

// The encoded exchange (docs/COMPRESSION.md): what travels is the round's
// change (trained model - base), encoded by the run's codec with error
// feedback; the new model is the outer optimizer's step from the base.
// Used when the codec is not raw or an outer optimizer runs.
//  1. the change of every slice (plus the residual error feedback kept) is
//     encoded once and published to `store` (CONTRIBUTION);
//  2. reduce: the owner decodes its own and every other contribution of
//     its slice, averages in fp32, encodes the average once, publishes it
//     (AVERAGED) and decodes it like everyone else;
//  3. gather: every other owner's encoded average is read and decoded;
//  4. params = outer step from `base` with the decoded averaged change.
// Peers read blobs (Peer.ReadEncoded), never model memory, so the
// parameters may be rewritten at the end without waiting for readers.
struct EncodedExchange {
  EncodedStore* store = nullptr;
  OuterStep* outer = nullptr;
  // The agreed model the round started from (the snapshot buffer).
  const float* base = nullptr;
};

class Exchanger final : public Averager {
 public:
  // `codec` (the run's; fp32 when null) outlives the exchanger.
  // `encoded` (null: the raw exchange, fp32 only) selects the encoded
  // exchange; its parts outlive the exchanger.
  Exchanger(PeerClient* peers, ModelState* state, ExchangeOptions options,
            const Codec* codec = nullptr, const EncodedExchange* encoded = nullptr);

  const char* name() const override { return "sharded"; }
  // Runs the exchange of `plan` for the participant `self_id` on `params`
  // (and records the plan in the ModelState, as the worker does when the
  // plan arrives). Returns ABORTED early when `cancel` is cancelled. One at
  // a time.
  absl::Status Average(const shoal::v1::RoundPlan& plan, const std::string& self_id, float* params,
                       CancellationToken* cancel, AveragingStats* stats) override;

 private:
  // Reads [begin, end) of `kind` from `address`, resuming after failures;
  // `apply` gets each checked chunk; `stop` ends the read early.
  absl::Status ReadWithRetry(const std::string& address, shoal::v1::SliceKind kind, uint64_t round,
                             uint32_t attempt, uint64_t begin, uint64_t end,
                             const std::string& self_id, absl::Time deadline,
                             CancellationToken* stop,
                             const std::function<absl::Status(const ChunkView&)>& apply,
                             std::atomic<int>* retries);

  // A participant behind NAT pushes its contribution of every other
  // owner's slice to that owner (raw: its parameters; encoded: the blob it
  // published), retrying until `deadline`.
  absl::Status PushWithRetry(const shoal::v1::SliceAssignment& owner, uint64_t round,
                             uint32_t attempt, const std::string& self_id, bool encoded,
                             absl::string_view bytes, absl::Time deadline, CancellationToken* stop,
                             std::atomic<int>* retries);
  // The owner's side: the contribution `pusher` pushed for our slice.
  absl::StatusOr<std::string> TakePushed(const std::string& pusher, uint64_t round,
                                         uint32_t attempt, uint64_t begin, uint64_t end,
                                         bool encoded, absl::Time deadline,
                                         CancellationToken* stop);

  absl::Status AverageEncoded(const shoal::v1::RoundPlan& plan, int self, float* params,
                              CancellationToken* cancel, AveragingStats* stats);
  // The robust rules: combines `inputs` (one per participant, plan order)
  // into `out` (which may be one of them) under the run's aggregation.
  absl::Status CombineOwnSlice(uint64_t round, const std::vector<const float*>& inputs,
                               uint64_t count, float* out);
  // Reads the whole encoding of [begin, end) of `kind` from `address`,
  // piece by piece, resuming after failures; checks sizes and CRCs.
  absl::StatusOr<std::string> ReadEncodedWithRetry(const std::string& address,
                                                   shoal::v1::SliceKind kind, uint64_t round,
                                                   uint32_t attempt, uint64_t begin, uint64_t end,
                                                   const std::string& self_id, absl::Time deadline,
                                                   CancellationToken* stop,
                                                   std::atomic<int>* retries);

  PeerClient* const peers_;
  ModelState* const state_;
  const ExchangeOptions options_;
  const Clock* const clock_;
  const Codec* const codec_;
  const EncodedExchange encoded_;
  const bool use_encoded_;
  // Error feedback: what this worker's encodings left out so far, and its
  // value when the current round's first attempt began (a new attempt of
  // the same round starts from it again).
  std::vector<float> residual_;
  std::vector<float> residual_start_;
  uint64_t residual_round_ = ~uint64_t{0};
  // The owner's error feedback on its re-encoding of the average, over the
  // slice it owns (zero elsewhere), with the same per-attempt restart.
  std::vector<float> owner_residual_;
  std::vector<float> owner_residual_start_;
  // The rule the owner applied last (logged when it changes: a trimmed mean
  // falling back to the median in a small round, and back).
  std::string last_rule_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_EXCHANGER_H_
