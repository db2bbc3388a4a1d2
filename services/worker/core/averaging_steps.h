// What a round's averaging asks of one worker, step by step: the plans of
// the one averaging pipeline (services/worker/exchanger.h). A pure function
// of the coordinator's RoundPlan: no gRPC, no threads, no clock.
//
// Every round is a list of group steps:
//  - kAverage: the members of a group run one sharded exchange among
//    themselves (reduce-scatter, then all-gather): member k owns slice k,
//    reads every other member's contribution to it, combines them with the
//    members' weights under the run's aggregation rule, and every member
//    reads every averaged slice from its owner.
//  - kBroadcast: every member copies the model from the group's head, as
//    the head holds it: the pieces (ranges) of the last kAverage step the
//    head took part in, or that it copied in an earlier broadcast.
// A flat plan (no RoundPlan.hierarchy) is one kAverage step of every
// participant with weight 1 and the plan's own slices (participants behind
// NAT own empty slices). A hierarchical plan gives the steps of its stages
// that name this worker, in stage order (docs/SUPERNODES.md): slices of an
// AVERAGE group are PlanSlices over the group's member order, and the
// weights are the group's (the participants each member stands for).
#ifndef SHOAL_SERVICES_WORKER_CORE_AVERAGING_STEPS_H_
#define SHOAL_SERVICES_WORKER_CORE_AVERAGING_STEPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shard_plan.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::worker {

struct GroupMember {
  std::string id;
  std::string address;
  // Behind NAT: cannot be read; pushes its contributions to the owners.
  bool outbound_only = false;
};

struct GroupStep {
  enum class Kind { kAverage, kBroadcast };
  Kind kind = Kind::kAverage;
  // 0: the flat round; a hierarchical round's stages count from 1.
  uint32_t stage = 0;
  // The zone the group averages or serves (hierarchical rounds; messages).
  std::string zone;
  std::vector<GroupMember> members;
  // This worker's index in `members`.
  int self = -1;
  // kAverage: one weight per member (1 in a flat round), and the slice
  // member k owns.
  std::vector<uint32_t> weights;
  std::vector<SliceRange> slices;
  // kBroadcast: the index of the head in `members`, and the ranges the
  // head holds its model as (they cover the round's fragment, [0, T)
  // without fragments, in order).
  int head = -1;
  std::vector<SliceRange> pieces;
  // Hierarchical rounds: the identity of the group's result
  // (GroupIdentities); empty in a flat round.
  std::string identity;

  const SliceRange& own() const { return slices[static_cast<size_t>(self)]; }
};

// The part of the model `plan` averages (RoundPlan.fragment_begin/end):
// [0, total_elements) when the plan names no fragment.
SliceRange FragmentRange(const shoal::v1::RoundPlan& plan);

// The steps `self_id` takes in `plan`, in order: slices and pieces cut the
// plan's fragment (FragmentRange). INVALID_ARGUMENT when the worker is not
// a participant, the plan is for another model size than `total`, its
// fragment or a slice lies outside the model or its hierarchy is malformed
// (CheckHierarchy).
absl::StatusOr<std::vector<GroupStep>> PlanSteps(const shoal::v1::RoundPlan& plan,
                                                 const std::string& self_id, uint64_t total);

// INVALID_ARGUMENT unless every group of `hierarchy` names valid, distinct
// participants of an `n`-participant plan (at least two per group), no
// participant sits in two groups of one stage, an AVERAGE group has one
// positive weight per member, and a BROADCAST group's head is a member.
absl::Status CheckHierarchy(const shoal::v1::RoundHierarchy& hierarchy, int n);

// The identity of every group's result in `plan` (a valid hierarchy; by
// stage, then by group, in plan order): a SHA-256 (hex) over the round, the
// model's size and the round's fragment, the stage's kind, the group's zone, its members' ids (with
// their weights, or the head's id), and what each member brings to it: its
// own trained model, or the identity of the group it took part in last. Two
// attempts of a round that give a group the same identity compute the same
// bits for it (the inputs are the same bits, combined in the same order).
std::vector<std::vector<std::string>> GroupIdentities(const shoal::v1::RoundPlan& plan);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_AVERAGING_STEPS_H_
