// The averaging pipeline: the one Averager (core/averager.h) of the
// synchronous modes. Given a round's plan it averages the model in place,
// flat or hierarchical, with any codec, outer optimizer and aggregation rule:
//  1. the plan becomes group steps (core/averaging_steps.h): one kAverage
//     step of every participant in a flat round; in a hierarchical round
//     (RoundPlan.hierarchy: zones and supernodes) the stages that name this
//     worker, kAverage inside its zone, among the heads above, then
//     kBroadcast back down;
//  2. every kAverage step is the same reduce-scatter / all-gather
//     (fan_out.h), with the run's Codec and aggregation rule at every
//     level; a zone's result counts with the number of participants under
//     it (core/aggregation.h, CombineWeighted);
//  3. what travels: the models themselves when the run has no codec and
//     no outer optimizer (fp32 and "none"), else the round's change (the
//     trained model minus the agreed base), and the new model is the outer
//     optimizer's step from the base with the averaged change
//     (core/outer_optimizer.h). Every worker applies the same decoded bytes
//     in the same order, so every worker ends with the same bits.
// The transport follows from that: a flat round of fp32 models reads and
// serves model memory itself (memory_transport.h, zero-copy, summed as it
// arrives); every other round travels as immutable encoded blobs
// (blob_transport.h) in the EncodedStore, so that peers never read model
// memory while it is rewritten.
//
// A new attempt of a hierarchical round (a participant was lost, a head
// say) redoes only what changed: every group's result has an identity
// (GroupIdentities), and a group this worker finished in an earlier attempt
// of the round with the same identity and the same input bits is carried,
// not redone: the worker publishes again what it published there (so that a
// member that had not finished the group can still complete it), takes the
// result and the error feedback it left, and reads nothing. When a head
// dies, its zone's group, the groups above it and the broadcasts change
// identity and run again; the other zones' groups are carried.
//
// Not thread-safe: one Average at a time (it starts and joins its own read
// threads).
#ifndef SHOAL_SERVICES_WORKER_EXCHANGER_H_
#define SHOAL_SERVICES_WORKER_EXCHANGER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/run_options.h"
#include "services/worker/blob_transport.h"
#include "services/worker/core/averager.h"
#include "services/worker/core/bad_chunk_log.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/core/model_state.h"
#include "services/worker/core/outer_optimizer.h"
#include "services/worker/core/push_box.h"
#include "services/worker/peer_client.h"
#include "services/worker/uplink_pacer.h"
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
  // How owners combine the contributions of their slice: the run's
  // RunConfig.exchange.aggregation (core/aggregation.h), set by the worker from the
  // run config, never from its own flags.
  AggregationSpec aggregation;
  // Contributions pushed by participants behind NAT (SliceAssignment.
  // outbound_only): the reduce takes them from here instead of reading
  // them. Null: a plan with such a participant fails FAILED_PRECONDITION.
  PushBox* push_box = nullptr;
  // Where the peers that sent bad chunks are noted (may be null;
  // core/bad_chunk_log.h).
  BadChunkLog* bad_chunks = nullptr;
  // Paces this worker's connections at its uplink rate before each step
  // (--uplink_mbps; uplink_pacer.h). Null: unpaced.
  UplinkPacer* pacer = nullptr;
};

using ExchangeStats = AveragingStats;

// What the pipeline needs beyond the peers and the model state; every
// pointer outlives the exchanger. With the defaults it runs flat rounds of
// fp32 models only.
struct ExchangeParts {
  // The run's codec; fp32 when null.
  const Codec* codec = nullptr;
  // What Peer.ReadEncoded serves: needed by every round but a flat round of
  // fp32 models.
  EncodedStore* store = nullptr;
  // The run's outer optimizer (its kind "none" included); needed when
  // changes travel (a lossy codec or an outer optimizer other than none).
  OuterStep* outer = nullptr;
  // The agreed model the round started from (the snapshot buffer); needed
  // when changes travel.
  const float* base = nullptr;
};

class Exchanger final : public Averager {
 public:
  Exchanger(PeerClient* peers, ModelState* state, ExchangeOptions options,
            ExchangeParts parts = {});

  const char* name() const override { return "sharded"; }
  // Runs the averaging of `plan` for the participant `self_id` on `params`
  // (in a flat round it records the plan in the ModelState, as the worker
  // does when the plan arrives). Returns ABORTED early when `cancel` is
  // cancelled.
  absl::Status Average(const shoal::v1::RoundPlan& plan, const std::string& self_id, float* params,
                       CancellationToken* cancel, AveragingStats* stats) override;

  // True when the round's change travels (not the model): a codec other
  // than fp32, or an outer optimizer other than none.
  bool changes_travel() const { return changes_; }

 private:
  // Every round but a flat one of fp32 models: the steps over blobs.
  // How the steps read and push: the peers, the backoffs, the push box and
  // where bad chunks are noted.
  SliceIo Io() const;
  // `fragment`: the part of the model the round averages (the outer step
  // moves it only).
  absl::Status AverageBlobs(const std::vector<GroupStep>& steps, const StepCall& call,
                            SliceRange fragment, bool flat, float* params,
                            CancellationToken* cancel, AveragingStats* stats);
  // The vector a blob round's steps average in place: the parameters, or
  // (when changes travel) change_; see the fields below.
  float* RoundInput(uint64_t round, bool flat, float* params);
  // Logs the rule an owner applied when it changes (a trimmed mean falling
  // back to the median in a small group, and back).
  void NoteRule(uint64_t round, uint32_t stage, const GroupStep& step,
                const AggregationSpec& applied);

  // Error feedback of every stage this worker took part in, and its value
  // when the current round's first attempt began (a new attempt of the
  // same round starts from it again).
  struct Feedback {
    uint64_t round = ~uint64_t{0};
    std::map<uint32_t, StageFeedback> current;
    std::map<uint32_t, StageFeedback> start;
  };
  // What this worker kept of a group it finished in an attempt of the
  // current round (see the class comment).
  struct Carried {
    std::string input_hash;  // kAverage: SHA-256 of the step's input
    std::vector<float> result;
    std::vector<PublishedBlob> published;
    std::vector<HeldPiece> held;
    StageFeedback feedback;
  };

  PeerClient* const peers_;
  ModelState* const state_;
  const ExchangeOptions options_;
  const Clock* const clock_;
  const Codec* const codec_;
  const ExchangeParts parts_;
  const bool changes_;
  Feedback feedback_;
  // The groups finished in the attempts of carried_round_, by identity.
  uint64_t carried_round_ = 0;
  std::map<std::string, Carried> carried_;
  std::map<uint32_t, std::string> last_rule_;
  // The round whose input the fields below hold, and ModelState::trainings
  // then: a later Average of the same round with no training between is a
  // new attempt.
  uint64_t input_round_ = 0;
  uint64_t input_trainings_ = 0;
  // When changes travel: the change (the trained model minus the base,
  // then per element the average where an attempt's exchange wrote it);
  // a flat round's later attempts exchange it as they find it. Reused (its
  // pages stay mapped) by the next round.
  std::vector<float> change_;
  // A hierarchical round only: its input (the trained model, or its
  // change), which every attempt starts from.
  std::vector<float> kept_input_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_EXCHANGER_H_
