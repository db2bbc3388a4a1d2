// The final average of a gossip run with --gossip_steps (docs/GOSSIP.md,
// "The final average"): when every member has trained its steps and
// published its final model, every member averages the same final models in
// the same order, so the run ends with one model whose hash every worker
// reports. This is the coordinator's decision of when to send the list and
// when the run is over, from what the members' heartbeats say. Pure: no
// clock, no state.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_FINAL_AVERAGE_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_FINAL_AVERAGE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::coordinator {

// An active member as the final average sees it (from its heartbeats).
struct FinalAverageMember {
  std::string worker_id;
  std::string address;
  // Behind NAT: nobody can fetch its model, so it is not a source (it still
  // averages the others' and reports).
  bool outbound_only = false;
  // Trained its steps and serves its final model (Heartbeat.gossip_done).
  bool done = false;
  // It was sent the GossipFinal (it joined before the list went out).
  bool recipient = false;
  // Its result: the hash of the averaged model, or why it has none.
  std::string hash;
  uint32_t models = 0;
  std::string error;
};

struct FinalAverageDecision {
  enum class Action {
    kWait,    // members still training, or results still to come
    kSend,    // send GossipFinal{sources} to every member
    kFinish,  // every recipient reported: the run is finished
  };
  Action action = Action::kWait;
  // kSend: the sources, in the order every worker averages them.
  std::vector<FinalAverageMember> sources;
  // kFinish: every recipient reported the same hash (and none failed).
  bool agree = false;
  // For the status and the log; empty while no member is done.
  std::string summary;
};

// `members`: the active members in worker-id order; `sent`: the GossipFinal
// went out already. Before it: kSend once every member is done (kFinish,
// disagreeing, when none of them can be fetched from). After it: kFinish
// once every recipient still active reported a hash or an error; members
// that joined after it do not hold the run up.
FinalAverageDecision DecideFinalAverage(const std::vector<FinalAverageMember>& members, bool sent);

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_FINAL_AVERAGE_H_
