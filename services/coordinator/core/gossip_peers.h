// Gossip mode on the coordinator (RunConfig.gossip, docs/GOSSIP.md): no
// rounds. JoinRound puts a member in the peer list, and every change of the
// list goes to every gossiping member as one shared PeerUpdate; Tick names
// the consensus evaluator (DecideConsensusEvaluator) and, with
// final_average, sends the GossipFinal once every member trained its steps
// and ends the run once they all reported (DecideFinalAverage); with
// --gossip_steps the run is finished when its last member left after its
// steps. What it keeps of a member (GossipMember): whether it gossips and
// its latest heartbeat's gossip figures (clock, loss, fetches, projection,
// final average, consensus evaluation), which the status shows. The
// checkpointer is CheckpointPlanner's, re-decided on every peer-list
// change.
//
// A RunMode of RoundEngine. Not thread-safe: called only with the engine's
// mutex held; it never calls out.
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_PEERS_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_PEERS_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/coordinator/core/checkpoint_planner.h"
#include "services/coordinator/core/engine_types.h"
#include "services/coordinator/core/membership.h"
#include "services/coordinator/core/run_mode.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

class GossipPeers : public RunMode {
 public:
  GossipPeers(const EngineOptions& options, EngineVersions* versions, Membership* members,
              CheckpointPlanner* checkpoints);

  shoal::v1::Phase phase() const override { return phase_; }
  // A gossip run has no rounds: the status and Join have always said 1.
  uint64_t round() const override { return 1; }
  uint64_t last_completed_round() const override { return 0; }
  // A gossip run has no rounds nor agreed model: its workers start from the
  // record's checkpoint (docs/GOSSIP.md, "Checkpoints").
  void Resume(const shoal::v1::RunRecord& record, absl::Time now) override;

  void OnJoined(Member& m, const shoal::v1::JoinRequest& request, absl::Time now) override;
  // The next round only: no agreed model to catch up on (a joiner starts
  // from a peer's model, or from the run's checkpoint).
  void FillJoinResponse(const Member& m, shoal::v1::JoinResponse* r) const override;
  void OnConnected(Member&, absl::Time) override {}
  // Keeps the heartbeat's figures; a plain heartbeat (the one Leave sends)
  // after gossip ones is ignored, so that the figures stay shown.
  bool OnHeartbeat(Member& m, const shoal::v1::Heartbeat& heartbeat, absl::Time now) override;
  // A worker that left after its --gossip_steps is "finished".
  MemberState DepartureState(MemberState why, const std::string& reason) const override;
  // True when it was in the peer list.
  bool Forget(const std::string& worker_id, absl::Time now) override;
  // A new peer list; with --gossip_steps the end of the run once the last
  // member left after its steps.
  void OnDeparted(const std::string& worker_id, MemberState why, const std::string& reason,
                  bool was_gossiping, absl::Time now, ModeOutput* out) override;

  // The member joins the peer list at once (returns round 0).
  absl::StatusOr<uint64_t> JoinRound(Member& m, uint64_t round, uint64_t carried, absl::Time now,
                                     ModeOutput* out) override;
  // The round reports: FAILED_PRECONDITION (no rounds).
  absl::Status ReportReady(Member& m, const shoal::v1::ReportReadyRequest& request, absl::Time now,
                           ModeOutput* out) override;
  absl::Status ConnectionsReady(Member& m, const shoal::v1::ConnectionsReadyRequest& request,
                                absl::Time now, ModeOutput* out) override;
  absl::Status ReportRoundDone(Member& m, const shoal::v1::ReportRoundDoneRequest& request,
                               absl::Time now, ModeOutput* out) override;
  // The checkpointer's reports (CheckpointPlanner::ReportGossip).
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request, absl::Time now,
                                ModeOutput* out) override;
  // The consensus evaluator, then the final average.
  void Tick(absl::Time now, ModeOutput* out) override;
  // No round to hold.
  void HoldRounds(bool, absl::Time, ModeOutput*) override {}

  void FillStatus(shoal::v1::RunStatus* s, absl::Time now) const override;
  void FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const override;
  void FillRecord(shoal::v1::RunRecord*, absl::Time) const override {}
  bool ConsistentForTesting() const override;

 private:
  // What gossip keeps of a member.
  struct GossipMember {
    // It called JoinRound and is in the peer lists.
    bool gossiping = false;
    // Its latest heartbeat: the gossip figures when `figures.gossip()`.
    shoal::v1::Heartbeat figures;
  };

  bool Gossiping(const std::string& worker_id) const;
  // The gossip figures of `worker_id`, or null when it sent none.
  const shoal::v1::Heartbeat* Figures(const std::string& worker_id) const;
  // The peer list (gossiping members but those behind NAT, whom nobody can
  // fetch from) to every gossiping member, then the checkpointer.
  void SendPeerUpdate(Directives* out);
  void UpdateConsensusEvaluator(Directives* out);
  void MaybeFinalAverage(ModeOutput* out);
  // The run is over: FINISHED, and the engine's kFinishRun.
  void FinishRun(const std::string& reason, ModeOutput* out);

  const EngineOptions& options_;
  EngineVersions* const versions_;
  Membership* const members_;
  CheckpointPlanner* const checkpoints_;

  absl::node_hash_map<std::string, GossipMember> peers_;
  shoal::v1::Phase phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  // Version of the latest PeerUpdate.
  uint64_t peer_list_version_ = 0;
  // Members that left after their --gossip_steps.
  uint64_t finished_ = 0;
  // The final average: whether the GossipFinal went out, to whom, and what
  // the status says of it.
  bool final_sent_ = false;
  std::set<std::string> final_recipients_;
  std::string final_summary_;
  std::string consensus_evaluator_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_GOSSIP_PEERS_H_
