// The hierarchical round (docs/SUPERNODES.md, "The hierarchical round"):
// the Averager (core/averager.h) that runs the stages of
// RoundPlan.hierarchy in order, and hands a plan without a hierarchy to
// the flat exchange it wraps.
//  - AVERAGE stage: a sharded exchange among the group's members (slice k
//    of n by the shard formula over the group's member order). The owner of
//    a slice reads every member's copy of it and computes
//    sum(w_i * x_i) / sum(w_i) in member order, then every member reads the
//    averaged slices from their owners.
//  - BROADCAST stage: the head publishes its whole model; the members copy
//    it.
// Every stage's data is published in the EncodedStore as an immutable copy
// (raw float32) tagged with the stage, and read through Peer.ReadEncoded
// with that stage: a worker may rewrite its parameters as soon as it has
// published what the stage needs, whatever its group's slower members are
// still reading. What a member reads of a stage its peer has not reached yet
// is UNAVAILABLE there and retried, like a not-yet-averaged slice.
//
// Every member of an AVERAGE group copies the owners' bytes, and a
// BROADCAST copies bytes, so every participant ends with the same bits (the
// hash check holds). The result is the flat mean of all participants up to
// the order of float additions: zone means weighted by zone sizes add the
// same terms grouped differently.
//
// A new attempt of the round (a participant was lost, a head say) redoes
// only what changed: every group's result has an identity (GroupIdentities),
// and a group this worker finished in an earlier attempt of the round with
// the same identity is carried, not redone: the worker publishes what the
// stage publishes from the copies it kept (its input to the group and the
// group's result), so that a member that had not finished the group can
// still complete it, and takes the result without reading anything. When a
// head dies, its zone's group, the groups above it and the broadcasts
// change identity and run again; the other zones' groups are carried.
//
// The raw exchange only: the coordinator refuses --hierarchy=on with
// another codec, an outer optimizer or a robust aggregation.
//
// Not thread-safe: one Average at a time (it starts and joins its own read
// threads).
#ifndef SHOAL_SERVICES_WORKER_HIERARCHICAL_AVERAGER_H_
#define SHOAL_SERVICES_WORKER_HIERARCHICAL_AVERAGER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "services/worker/core/averager.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/core/model_state.h"
#include "services/worker/exchanger.h"
#include "services/worker/peer_client.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

// INVALID_ARGUMENT unless every group of `hierarchy` names valid, distinct
// participants of an `n`-participant plan (at least two per group), no
// participant sits in two groups of one stage, an AVERAGE group has one
// positive weight per member, and a BROADCAST group's head is a member.
absl::Status CheckHierarchy(const shoal::v1::RoundHierarchy& hierarchy, int n);

// The identity of every group's result in `plan` (a valid hierarchy; by
// stage, then by group, in plan order): a SHA-256 (hex) over the round, the
// model's size, the stage's kind, the group's zone, its members' ids (with
// their weights, or the head's id), and what each member brings to it: its
// own trained model, or the identity of the group it took part in last. Two
// attempts of a round that give a group the same identity compute the same
// bits for it (the inputs are the same bits, combined in the same order).
std::vector<std::vector<std::string>> GroupIdentities(const shoal::v1::RoundPlan& plan);

class HierarchicalAverager final : public Averager {
 public:
  // `flat` runs plans without a hierarchy; all pointers outlive this.
  HierarchicalAverager(PeerClient* peers, ModelState* state, EncodedStore* store,
                       ExchangeOptions options, Averager* flat);

  const char* name() const override { return "hierarchical"; }
  absl::Status Average(const shoal::v1::RoundPlan& plan, const std::string& self_id, float* params,
                       CancellationToken* cancel, AveragingStats* stats) override;

 private:
  struct Read {
    std::string address;
    shoal::v1::SliceKind kind = shoal::v1::SLICE_KIND_UNSPECIFIED;
    uint32_t stage = 0;
    uint64_t begin = 0;
    uint64_t end = 0;
  };
  // Reads the whole raw float32 blob of `read` into `out` ((end - begin)
  // floats), piece by piece, checking sizes and CRCs, resuming and retrying
  // what may be retried until `deadline`.
  absl::Status ReadBlob(const shoal::v1::RoundPlan& plan, const std::string& self_id,
                        const Read& read, absl::Time deadline, CancellationToken* stop, float* out,
                        std::atomic<int>* retries);
  absl::Status AverageStage(const shoal::v1::RoundPlan& plan, uint32_t stage,
                            const shoal::v1::HierarchyGroup& group, int self,
                            const std::string& self_id, float* params, absl::Time deadline,
                            CancellationToken* stop, AveragingStats* stats, uint64_t* received);
  // What this worker kept of a group it finished: its input to the group
  // (AVERAGE only: the contributions it publishes) and the group's result.
  struct Carried {
    std::vector<float> input;
    std::vector<float> result;
  };
  // Publishes what the stage publishes from `carried` and takes its result.
  void CarryStage(const shoal::v1::RoundPlan& plan, uint32_t stage,
                  const shoal::v1::HierarchyStage::Kind kind,
                  const shoal::v1::HierarchyGroup& group, int self, const Carried& carried,
                  float* params, AveragingStats* stats);
  absl::Status BroadcastStage(const shoal::v1::RoundPlan& plan, uint32_t stage,
                              const shoal::v1::HierarchyGroup& group, int self,
                              const std::string& self_id, float* params, absl::Time deadline,
                              CancellationToken* stop, AveragingStats* stats, uint64_t* received);

  PeerClient* const peers_;
  ModelState* const state_;
  EncodedStore* const store_;
  const ExchangeOptions options_;
  const Clock* const clock_;
  Averager* const flat_;
  // The groups finished in the attempts of carried_round_, by identity.
  // Memory: per group, up to two models (the input for AVERAGE, the result),
  // until the next round.
  uint64_t carried_round_ = 0;
  std::map<std::string, Carried> carried_;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_HIERARCHICAL_AVERAGER_H_
