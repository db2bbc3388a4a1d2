// GossipPeers: the peer list, the consensus evaluator, the final average
// and what the status shows of a gossip run.
#include "services/coordinator/core/gossip_peers.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/coordinator/core/final_average.h"
#include "services/coordinator/core/gossip_status.h"
#include "services/coordinator/core/round_decisions.h"

namespace shoal::coordinator {

using shoal::v1::CoordinatorMessage;

GossipPeers::GossipPeers(const EngineOptions& options, EngineVersions* versions,
                         Membership* members, CheckpointPlanner* checkpoints)
    : options_(options), versions_(versions), members_(members), checkpoints_(checkpoints) {}

void GossipPeers::Resume(const shoal::v1::RunRecord& record, absl::Time) {
  if (record.finished()) phase_ = shoal::v1::FINISHED;
  SHOAL_LOG(INFO) << "resuming gossip run " << options_.run_id
                  << (record.checkpoint_id().empty()
                          ? std::string(" with no checkpoint")
                          : absl::StrCat(" from checkpoint ", record.checkpoint_id()));
}

bool GossipPeers::Gossiping(const std::string& worker_id) const {
  auto it = peers_.find(worker_id);
  return it != peers_.end() && it->second.gossiping;
}

const shoal::v1::Heartbeat* GossipPeers::Figures(const std::string& worker_id) const {
  auto it = peers_.find(worker_id);
  return it == peers_.end() ? nullptr : &it->second.figures;
}

// ----------------------------------------------------------------- Members

void GossipPeers::OnJoined(Member& m, const shoal::v1::JoinRequest&, absl::Time) {
  peers_.try_emplace(m.id);
}

void GossipPeers::FillJoinResponse(const Member&, shoal::v1::JoinResponse* r) const {
  r->set_next_round(NextOpenRound(phase_, round(), /*any_ready=*/false));
}

bool GossipPeers::OnHeartbeat(Member& m, const shoal::v1::Heartbeat& heartbeat, absl::Time) {
  GossipMember& g = peers_[m.id];
  if (g.figures.gossip() && !heartbeat.gossip()) return false;
  if (heartbeat.gossip()) versions_->MarkStatusChanged();
  g.figures = heartbeat;
  return true;
}

bool GossipPeers::Forget(const std::string& worker_id, absl::Time) {
  // Its departure changes the peer list only when it was in it.
  const bool was_gossiping = Gossiping(worker_id);
  peers_.erase(worker_id);
  return was_gossiping;
}

MemberState GossipPeers::DepartureState(MemberState why, const std::string& reason) const {
  // A worker that did its --gossip_steps leaves saying "finished ...".
  if (why == MemberState::kLeft && absl::StartsWith(reason, "finished ")) {
    return MemberState::kFinished;
  }
  return why;
}

void GossipPeers::OnDeparted(const std::string&, MemberState why, const std::string& reason,
                             bool was_gossiping, absl::Time, ModeOutput* out) {
  if (why == MemberState::kFinished && absl::StartsWith(reason, "finished ")) ++finished_;
  if (members_->size() == 0 && phase_ != shoal::v1::FINISHED) {
    phase_ = shoal::v1::WAITING_FOR_MEMBERS;
    // With --gossip_steps the run ends when its last worker finished them.
    if (finished_ > 0) {
      FinishRun(absl::StrCat(finished_, " workers finished their gossip steps"), out);
    }
  }
  if (was_gossiping) SendPeerUpdate(&out->directives);
}

void GossipPeers::FinishRun(const std::string& reason, ModeOutput* out) {
  phase_ = shoal::v1::FINISHED;
  EngineIntent finish;
  finish.kind = EngineIntent::Kind::kFinishRun;
  finish.reason = reason;
  out->Intend(std::move(finish));
}

// ------------------------------------------------------------------- Calls

absl::StatusOr<uint64_t> GossipPeers::JoinRound(Member& m, uint64_t, uint64_t, absl::Time now,
                                                ModeOutput* out) {
  // No rounds: the member joins the peer list at once.
  versions_->MarkStatusChanged();
  m.last_seen = now;
  m.state = MemberState::kTraining;
  GossipMember& g = peers_[m.id];
  if (!g.gossiping) {
    g.gossiping = true;
    SHOAL_LOG(INFO) << "member " << m.id << " gossips (" << members_->size() << " members)";
  }
  phase_ = shoal::v1::TRAINING;
  SendPeerUpdate(&out->directives);
  return uint64_t{0};
}

absl::Status GossipPeers::ReportReady(Member& m, const shoal::v1::ReportReadyRequest& request,
                                      absl::Time, ModeOutput*) {
  return absl::FailedPreconditionError(absl::StrCat("ready for round ", request.round(), " from ",
                                                    m.id, ": a gossip run has no rounds"));
}

absl::Status GossipPeers::ConnectionsReady(Member& m,
                                           const shoal::v1::ConnectionsReadyRequest& request,
                                           absl::Time, ModeOutput*) {
  return absl::FailedPreconditionError(absl::StrCat("connections ready for round ", request.round(),
                                                    " from ", m.id,
                                                    ": a gossip run has no rounds"));
}

absl::Status GossipPeers::ReportRoundDone(Member& m,
                                          const shoal::v1::ReportRoundDoneRequest& request,
                                          absl::Time, ModeOutput*) {
  return absl::FailedPreconditionError(
      absl::StrCat("round ", request.round(), " done from ", m.id, ": a gossip run has no rounds"));
}

absl::Status GossipPeers::ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                           absl::Time, ModeOutput*) {
  return checkpoints_->ReportGossip(request);
}

void GossipPeers::Tick(absl::Time, ModeOutput* out) {
  UpdateConsensusEvaluator(&out->directives);
  MaybeFinalAverage(out);
}

// -------------------------------------------------------------- Peer lists

void GossipPeers::SendPeerUpdate(Directives* out) {
  CoordinatorMessage msg;
  auto* update = msg.mutable_peer_update();
  update->set_version(++peer_list_version_);
  update->set_consensus_evaluator(consensus_evaluator_);
  for (const auto& [id, m] : members_->members()) {
    // Nobody can fetch from a worker behind NAT; it fetches from the others.
    if (!Gossiping(id) || m.outbound_only) continue;
    auto* p = update->add_peers();
    p->set_worker_id(id);
    p->set_peer_address(m.address);
  }
  // One shared message for every recipient (O(N) bytes each, on changes
  // of the membership only).
  SharedMessage shared = Share(std::move(msg));
  std::vector<GossipCheckpointerCandidate> candidates;
  candidates.reserve(members_->size());
  for (const auto& [id, m] : members_->members()) {
    const bool gossiping = Gossiping(id);
    if (gossiping) out->push_back({id, shared});
    candidates.push_back({id, gossiping});
  }
  checkpoints_->AssignGossipCheckpointer(candidates, out);
}

void GossipPeers::UpdateConsensusEvaluator(Directives* out) {
  if (options_.config.gossip().consensus_eval_every() == 0 || phase_ == shoal::v1::FINISHED) return;
  std::vector<ConsensusCandidate> candidates;
  for (const auto& [id, m] : members_->members()) {
    if (!Gossiping(id) || m.outbound_only) continue;
    candidates.push_back({id, Figures(id)->gossip_steps()});
  }
  const ConsensusEvaluatorDecision d = DecideConsensusEvaluator(consensus_evaluator_, candidates);
  if (!d.changed) return;
  SHOAL_LOG(INFO) << "gossip: the consensus evaluator is "
                  << (d.worker_id.empty() ? std::string("nobody")
                                          : absl::StrCat(d.worker_id, " (", d.reason, ")"));
  consensus_evaluator_ = d.worker_id;
  versions_->MarkStatusChanged();
  SendPeerUpdate(out);
}

void GossipPeers::MaybeFinalAverage(ModeOutput* out) {
  if (!options_.config.gossip().final_average() || phase_ == shoal::v1::FINISHED) return;
  std::vector<FinalAverageMember> members;
  members.reserve(members_->size());
  for (const auto& [id, m] : members_->members()) {
    const shoal::v1::Heartbeat* h = Figures(id);
    FinalAverageMember f;
    f.worker_id = id;
    f.address = m.address;
    f.outbound_only = m.outbound_only;
    f.recipient = final_recipients_.count(id) > 0;
    if (h != nullptr) {
      f.done = Gossiping(id) && h->gossip_done();
      f.hash = h->final_hash();
      f.models = h->final_models();
      f.error = h->final_error();
    }
    members.push_back(std::move(f));
  }
  FinalAverageDecision d = DecideFinalAverage(members, final_sent_);
  if (d.summary != final_summary_) {
    final_summary_ = d.summary;
    versions_->MarkStatusChanged();
  }
  switch (d.action) {
    case FinalAverageDecision::Action::kWait:
      return;
    case FinalAverageDecision::Action::kSend: {
      CoordinatorMessage msg;
      for (const FinalAverageMember& s : d.sources) {
        auto* p = msg.mutable_gossip_final()->add_sources();
        p->set_worker_id(s.worker_id);
        p->set_peer_address(s.address);
      }
      const SharedMessage shared = Share(std::move(msg));
      for (const FinalAverageMember& m : members) {
        final_recipients_.insert(m.worker_id);
        out->directives.push_back({m.worker_id, shared});
      }
      final_sent_ = true;
      SHOAL_LOG(INFO) << "gossip: every member trained its steps; " << d.summary;
      return;
    }
    case FinalAverageDecision::Action::kFinish:
      FinishRun(absl::StrCat("gossip: ", d.summary), out);
      return;
  }
}

// ------------------------------------------------------------------ Status

void GossipPeers::FillStatus(shoal::v1::RunStatus* s, absl::Time) const {
  s->set_phase(phase_);
  s->set_round(round());
  size_t gossiping = 0;
  for (const auto& [id, g] : peers_) gossiping += g.gossiping ? 1 : 0;
  s->set_detail(absl::StrCat("gossip: ", gossiping, " of ", members_->size(),
                             " members training and averaging pair-wise (no rounds)"));
  std::vector<const google::protobuf::RepeatedField<float>*> projections;
  for (const auto& [id, m] : members_->members()) {
    const shoal::v1::Heartbeat* h = Figures(id);
    if (h != nullptr && h->gossip()) projections.push_back(&h->projection());
  }
  uint32_t used = 0;
  s->set_consensus_distance(ConsensusDistance(projections, &used));
  s->set_consensus_workers(used);
  s->set_final_average(final_summary_);
  // The freshest consensus evaluation (the evaluator may have changed).
  for (const auto& [id, m] : members_->members()) {
    const shoal::v1::Heartbeat* h = Figures(id);
    if (h == nullptr || h->consensus_models() == 0 || h->consensus_clock() < s->consensus_clock()) {
      continue;
    }
    s->set_consensus_test_accuracy(h->consensus_accuracy());
    s->set_consensus_test_loss(h->consensus_loss());
    s->set_consensus_models(h->consensus_models());
    s->set_consensus_clock(h->consensus_clock());
    s->set_consensus_worker(id);
  }
}

void GossipPeers::FillWorker(const std::string& worker_id, shoal::v1::WorkerStatus* w) const {
  const shoal::v1::Heartbeat* found = Figures(worker_id);
  if (found == nullptr || !found->gossip()) return;
  const shoal::v1::Heartbeat& h = *found;
  w->set_gossip(true);
  w->set_gossip_clock(h.gossip_clock());
  w->set_gossip_loss(h.gossip_loss());
  w->set_train_loss(h.gossip_loss());
  if (h.eval_clock() > 0) {
    w->set_test_accuracy(h.test_accuracy());
    w->set_test_loss(h.test_loss());
    w->set_eval_clock(h.eval_clock());
  }
  w->set_fetches_done(h.fetches_done());
  w->set_fetches_timed_out(h.fetches_timed_out());
  w->set_fetches_failed(h.fetches_failed());
  w->set_pushes_merged(h.pushes_merged());
  w->set_last_partner(h.last_partner());
  w->set_last_factor(h.last_factor());
  w->set_gossip_steps(h.gossip_steps());
  if (!h.final_hash().empty()) w->set_model_hash(h.final_hash());
  w->set_final_models(h.final_models());
  w->set_final_error(h.final_error());
}

bool GossipPeers::ConsistentForTesting() const {
  if (peers_.size() != members_->size()) return false;
  for (const auto& [id, m] : members_->members()) {
    if (!peers_.contains(id)) return false;
  }
  return true;
}

}  // namespace shoal::coordinator
