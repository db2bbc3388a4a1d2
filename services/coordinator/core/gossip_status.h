// Gossip mode on the coordinator (docs/GOSSIP.md): the run-wide consensus
// distance computed from the model projections the workers report with their
// heartbeats, the choice of the consensus evaluator and of the gossip
// checkpointer. Pure functions, no state. (The gossip knobs are checked with the rest of the run
// config: common/run_config.h.)
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_STATUS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_STATUS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// The root mean square Euclidean distance of `projections` (one per worker,
// equal lengths; others are skipped) to their mean: 0 when all agree. -1
// when fewer than two are usable. Sets *used to the number used.
double ConsensusDistance(
    const std::vector<const google::protobuf::RepeatedField<float>*>& projections, uint32_t* used);

// A member as the choice of the gossip checkpointer sees it.
struct GossipCheckpointerCandidate {
  std::string worker_id;
  // It called JoinRound and is in the peer lists (its session is open).
  bool gossiping = false;
};

struct GossipCheckpointerDecision {
  // The checkpointer from now on; empty when no member gossips.
  std::string worker_id;
  // True when it differs from the current one: tell it (CheckpointRequest
  // with gossip = true).
  bool changed = false;
  std::string reason;
};

// Who uploads the checkpoints of a gossip run (docs/GOSSIP.md,
// "Checkpoints"). The current checkpointer stays while it gossips (a
// change costs the new one a whole period before its first upload);
// otherwise the gossiping member with the smallest id (in `members`' order,
// which the caller gives by id) takes over. Sticky and deterministic, so
// that membership changes elsewhere never move the role.
GossipCheckpointerDecision DecideGossipCheckpointer(
    const std::string& current, absl::Span<const GossipCheckpointerCandidate> members);

// A member as the choice of the consensus evaluator sees it: one that
// gossips and can be fetched from (not behind NAT).
struct ConsensusCandidate {
  std::string worker_id;
  uint64_t steps = 0;  // its local steps so far (Heartbeat.gossip_steps)
};

struct ConsensusEvaluatorDecision {
  // The evaluator from now on; empty when no member can be.
  std::string worker_id;
  // True when it differs from the current one (a PeerUpdate names it).
  bool changed = false;
  // Why it is the one, e.g. "1200 steps, the most trained"; empty when
  // nobody is.
  std::string reason;
};

// Who evaluates the consensus model (--consensus_eval_every): the member
// that trained the most steps (the first by `candidates`' order among
// equals; the caller gives them by id). Sticky: while the current one is a
// candidate another takes over only with more than 1.5 x its steps + 10,
// so that members at about the same count do not trade the role.
ConsensusEvaluatorDecision DecideConsensusEvaluator(
    const std::string& current, absl::Span<const ConsensusCandidate> candidates);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_STATUS_H_
