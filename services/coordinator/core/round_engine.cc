#include "services/coordinator/core/round_engine.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "services/coordinator/core/shard_planner.h"

namespace shoal::coordinator {
namespace {

using shoal::v1::CoordinatorMessage;

absl::Status ValidatePeerAddress(const std::string& address) {
  if (address.empty()) return absl::InvalidArgumentError("peer_address is empty");
  if (address.size() > 256) return absl::InvalidArgumentError("peer_address is too long");
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer_address '", address, "' is not host:port with a port in 1..65535"));
  }
  return absl::OkStatus();
}

bool IsHexSha256(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(),
                                       [](char c) { return std::isxdigit(c) && !std::isupper(c); });
}

}  // namespace

RoundEngine::RoundEngine(EngineOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock), started_at_(clock->Now()) {}

const char* RoundEngine::StateName(MemberState s) {
  switch (s) {
    case MemberState::kWaiting:
      return "waiting";
    case MemberState::kTraining:
      return "training";
    case MemberState::kReady:
      return "ready";
    case MemberState::kSharing:
      return "sharing";
    case MemberState::kLeft:
      return "left";
    case MemberState::kEvicted:
      return "evicted";
  }
  return "unknown";
}

absl::StatusOr<RoundEngine::Member*> RoundEngine::FindActive(const std::string& worker_id) {
  auto it = members_.find(worker_id);
  if (it == members_.end()) {
    if (worker_id.empty()) return absl::InvalidArgumentError("worker_id is empty");
    return absl::NotFoundError(absl::StrCat("unknown worker id '", worker_id,
                                            "' (never joined, left or was evicted: Join again)"));
  }
  return &it->second;
}

bool RoundEngine::IsParticipant(const std::string& worker_id) const {
  return std::find(participants_.begin(), participants_.end(), worker_id) != participants_.end();
}

absl::StatusOr<JoinResult> RoundEngine::Join(const shoal::v1::JoinRequest& request) {
  if (absl::Status s = ValidatePeerAddress(request.peer_address()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (phase_ == shoal::v1::FINISHED) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", options_.run_id, " is finished after round ", last_completed_round_));
  }
  const absl::Time now = clock_->Now();
  JoinResult result;
  Member* member = nullptr;
  if (!request.previous_worker_id().empty()) {
    auto it = members_.find(request.previous_worker_id());
    if (it != members_.end()) member = &it->second;
  }
  if (member == nullptr) {
    // A new worker at the address of an active member means that member's
    // process is gone (its port was reused).
    for (auto it = members_.begin(); it != members_.end(); ++it) {
      if (it->second.address == request.peer_address()) {
        RemoveMember(it->first, MemberState::kLeft, "replaced by a new worker at the same address",
                     &result.directives);
        break;
      }
    }
    std::set<uint32_t> used;
    for (const auto& [id, m] : members_) used.insert(m.data_rank);
    uint32_t rank = 0;
    while (used.count(rank)) ++rank;
    Member m;
    m.id = absl::StrCat("w", next_worker_number_++);
    m.data_rank = rank;
    m.joined_at = now;
    member = &members_.emplace(m.id, std::move(m)).first->second;
    SHOAL_LOG(INFO) << "member joined: " << member->id << " at " << request.peer_address()
                    << " data_rank=" << member->data_rank << " round=" << round_
                    << " members=" << members_.size();
  } else {
    SHOAL_LOG(INFO) << "member re-joined: " << member->id << " at " << request.peer_address();
  }
  member->address = request.peer_address();
  member->name = request.name();
  member->connected = false;
  member->last_seen = now;

  auto& r = result.response;
  r.set_worker_id(member->id);
  r.set_data_rank(member->data_rank);
  *r.mutable_config() = options_.config;
  r.set_run_id(options_.run_id);
  const bool current_open =
      phase_ == shoal::v1::WAITING_FOR_MEMBERS || (phase_ == shoal::v1::TRAINING && !any_ready_);
  r.set_next_round(current_open ? round_ : round_ + 1);
  r.set_model_round(last_completed_round_);
  return result;
}

absl::Status RoundEngine::Connect(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto member = FindActive(worker_id);
  if (!member.ok()) return member.status();
  (*member)->connected = true;
  (*member)->last_seen = clock_->Now();
  return absl::OkStatus();
}

absl::Status RoundEngine::Heartbeat(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto member = FindActive(worker_id);
  if (!member.ok()) return member.status();
  (*member)->last_seen = clock_->Now();
  return absl::OkStatus();
}

Directives RoundEngine::Disconnect(const std::string& worker_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Directives out;
  if (members_.count(worker_id)) RemoveMember(worker_id, MemberState::kLeft, reason, &out);
  return out;
}

absl::StatusOr<uint64_t> RoundEngine::JoinRound(const std::string& worker_id, uint64_t round,
                                                Directives* out) {
  absl::MutexLock lock(&mu_);
  auto found = FindActive(worker_id);
  if (!found.ok()) return found.status();
  Member* member = *found;
  if (phase_ == shoal::v1::FINISHED) {
    return absl::FailedPreconditionError(absl::StrCat("run is finished"));
  }
  if (round < round_) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " is stale: the run is at round ", round_));
  }
  if (round > round_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " is in the future: the run is at round ", round_));
  }
  if (IsParticipant(worker_id)) return round_;
  const bool waiting = phase_ == shoal::v1::WAITING_FOR_MEMBERS;
  if (std::find(queued_.begin(), queued_.end(), worker_id) != queued_.end()) {
    return waiting ? round_ : round_ + 1;
  }
  member->last_seen = clock_->Now();
  if (waiting) {
    queued_.push_back(worker_id);
    SHOAL_LOG(INFO) << "member " << worker_id << " waits for round " << round_ << " ("
                    << queued_.size() << "/" << options_.config.min_participants() << ")";
    MaybeStartRound(out);
    return round_;
  }
  if (phase_ == shoal::v1::TRAINING && !any_ready_ && round == round_) {
    participants_.push_back(worker_id);
    member->state = MemberState::kTraining;
    member->ready = member->done = false;
    CoordinatorMessage msg;
    msg.mutable_round_start()->set_round(round_);
    msg.mutable_round_start()->set_base_model_round(last_completed_round_);
    out->push_back({worker_id, std::move(msg)});
    SHOAL_LOG(INFO) << "member " << worker_id << " joins running round " << round_
                    << " participants=" << participants_.size();
    return round_;
  }
  queued_.push_back(worker_id);
  SHOAL_LOG(INFO) << "member " << worker_id << " queued for round " << round_ + 1;
  return round_ + 1;
}

void RoundEngine::MaybeStartRound(Directives* out) {
  if (phase_ != shoal::v1::WAITING_FOR_MEMBERS) return;
  const size_t min = std::max<uint32_t>(1, options_.config.min_participants());
  if (queued_.size() < min) return;
  participants_ = std::move(queued_);
  queued_.clear();
  phase_ = shoal::v1::TRAINING;
  any_ready_ = false;
  round_started_at_ = clock_->Now();
  for (const std::string& id : participants_) {
    Member& m = members_.at(id);
    m.state = MemberState::kTraining;
    m.ready = m.done = false;
    m.exchange_seconds = 0;
    CoordinatorMessage msg;
    msg.mutable_round_start()->set_round(round_);
    msg.mutable_round_start()->set_base_model_round(last_completed_round_);
    out->push_back({id, std::move(msg)});
  }
  SHOAL_LOG(INFO) << "round " << round_ << " started with " << participants_.size()
                  << " participants: " << absl::StrJoin(participants_, ",");
}

absl::Status RoundEngine::ReportReady(const shoal::v1::ReportReadyRequest& request,
                                      Directives* out) {
  absl::MutexLock lock(&mu_);
  auto found = FindActive(request.worker_id());
  if (!found.ok()) return found.status();
  Member* member = *found;
  const uint64_t round = request.round();
  if (round < round_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ready for round ", round, " is stale: the run is at round ", round_));
  }
  if (round > round_) {
    return absl::FailedPreconditionError(
        absl::StrCat("ready for round ", round, " is in the future: the run is at round ", round_));
  }
  if (!IsParticipant(request.worker_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not a participant of round ", round_));
  }
  if (phase_ != shoal::v1::TRAINING) {
    if (member->ready) return absl::OkStatus();  // retried call
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round_, " is no longer accepting ready reports"));
  }
  if (request.total_elements() == 0) {
    return absl::InvalidArgumentError("total_elements must be positive");
  }
  if (total_elements_ == 0) total_elements_ = request.total_elements();
  if (request.total_elements() != total_elements_) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", request.total_elements(),
                                                   " elements, the run's model has ",
                                                   total_elements_, " (different --model?)"));
  }
  member->last_seen = clock_->Now();
  member->ready = true;
  member->state = MemberState::kReady;
  member->train_loss = request.train_loss();
  any_ready_ = true;
  MaybeSendPlan(out);
  return absl::OkStatus();
}

void RoundEngine::MaybeSendPlan(Directives* out) {
  if (phase_ != shoal::v1::TRAINING || participants_.empty()) return;
  for (const std::string& id : participants_) {
    if (!members_.at(id).ready) return;
  }
  phase_ = shoal::v1::SHARING;
  const std::vector<SliceRange> slices = PlanSlices(total_elements_, participants_.size());
  CoordinatorMessage msg;
  shoal::v1::RoundPlan* plan = msg.mutable_round_plan();
  plan->set_round(round_);
  plan->set_total_elements(total_elements_);
  for (size_t k = 0; k < participants_.size(); ++k) {
    Member& m = members_.at(participants_[k]);
    m.state = MemberState::kSharing;
    auto* s = plan->add_slices();
    s->set_worker_id(m.id);
    s->set_peer_address(m.address);
    s->set_begin(slices[k].begin);
    s->set_end(slices[k].end);
  }
  for (const std::string& id : participants_) out->push_back({id, msg});
  SHOAL_LOG(INFO) << "round " << round_ << ": all " << participants_.size()
                  << " participants ready, sharing " << total_elements_ << " elements";
}

absl::Status RoundEngine::ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request,
                                          Directives* out) {
  absl::MutexLock lock(&mu_);
  auto found = FindActive(request.worker_id());
  if (!found.ok()) return found.status();
  Member* member = *found;
  if (request.round() != round_ || phase_ != shoal::v1::SHARING) {
    if (request.round() == last_completed_round_ && member->model_round == request.round()) {
      return absl::OkStatus();  // retried call for a round that completed
    }
    return absl::FailedPreconditionError(absl::StrCat("round ", request.round(),
                                                      " is not sharing (run at round ", round_,
                                                      ", ", shoal::v1::Phase_Name(phase_), ")"));
  }
  if (!IsParticipant(request.worker_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not a participant of round ", round_));
  }
  if (!IsHexSha256(request.model_hash())) {
    return absl::InvalidArgumentError("model_hash must be 64 lowercase hex digits (SHA-256)");
  }
  member->last_seen = clock_->Now();
  member->done = true;
  member->model_hash = request.model_hash();
  member->model_round = request.round();
  member->exchange_seconds = request.exchange_seconds();
  if (request.metrics().evaluated()) {
    member->metrics = request.metrics();
    member->metrics_round = request.round();
  }
  MaybeCompleteRound(out);
  return absl::OkStatus();
}

void RoundEngine::MaybeCompleteRound(Directives* out) {
  if (phase_ != shoal::v1::SHARING) return;
  for (const std::string& id : participants_) {
    if (!members_.at(id).done) return;
  }
  // The hash most participants hold wins; the others are out of sync.
  std::map<std::string, size_t> votes;
  for (const std::string& id : participants_) ++votes[members_.at(id).model_hash];
  std::string hash;
  size_t best = 0;
  for (const auto& [h, n] : votes) {
    if (n > best) best = n, hash = h;
  }
  if (votes.size() > 1 && 2 * best <= participants_.size()) {
    // No strict majority: nobody can tell which copy is right, so everyone
    // rolls back and the round runs again.
    AbortRound("participants reported different model hashes with no majority", out);
    return;
  }
  std::vector<std::string> disagree;
  for (const std::string& id : participants_) {
    if (members_.at(id).model_hash != hash) disagree.push_back(id);
  }
  for (const std::string& id : disagree) {
    SHOAL_LOG(ERROR) << "round " << round_ << ": worker " << id << " reported hash "
                     << members_.at(id).model_hash.substr(0, 12) << ", majority has "
                     << hash.substr(0, 12);
    Depart(id, MemberState::kEvicted, absl::StrCat("model hash mismatch in round ", round_));
  }

  const absl::Time now = clock_->Now();
  shoal::v1::RoundSummary summary;
  summary.set_round(round_);
  summary.set_participants(participants_.size());
  summary.set_seconds(absl::ToDoubleSeconds(now - round_started_at_));
  summary.set_model_hash(hash);
  double loss = 0, exchange = 0;
  for (const std::string& id : participants_) {
    Member& m = members_.at(id);
    loss += m.train_loss;
    exchange += m.exchange_seconds;
    if (m.metrics_round == round_ && !summary.evaluated()) {
      summary.set_evaluated(true);
      summary.set_test_accuracy(m.metrics.test_accuracy());
      summary.set_test_loss(m.metrics.test_loss());
    }
    m.rounds_completed++;
    m.state = MemberState::kWaiting;
  }
  if (!participants_.empty()) {
    summary.set_train_loss(loss / participants_.size());
    summary.set_exchange_seconds(exchange / participants_.size());
  }
  if (!summary.evaluated() && !recent_rounds_.empty()) {
    summary.set_test_accuracy(recent_rounds_.back().test_accuracy());
    summary.set_test_loss(recent_rounds_.back().test_loss());
  }
  recent_rounds_.push_back(summary);
  while (recent_rounds_.size() > 100) recent_rounds_.pop_front();
  last_completed_round_ = round_;
  agreed_hash_ = hash;
  SHOAL_LOG(INFO) << "round " << round_ << " complete: participants=" << participants_.size()
                  << " hash=" << hash.substr(0, 16) << " seconds=" << summary.seconds();

  CoordinatorMessage done;
  done.mutable_round_complete()->set_round(round_);
  done.mutable_round_complete()->set_model_hash(hash);
  for (const std::string& id : participants_) out->push_back({id, done});

  const uint64_t limit = options_.config.rounds();
  if (limit > 0 && last_completed_round_ >= limit) {
    Finish(absl::StrCat("completed ", limit, " rounds"), out);
    return;
  }
  // Participation is sticky: this round's participants take part in the next
  // one, joined by those queued during this round.
  std::vector<std::string> next = std::move(participants_);
  participants_.clear();
  for (const std::string& id : queued_) {
    if (std::find(next.begin(), next.end(), id) == next.end()) next.push_back(id);
  }
  queued_ = std::move(next);
  ++round_;
  phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  MaybeStartRound(out);
}

bool RoundEngine::Depart(const std::string& worker_id, MemberState why, const std::string& reason) {
  auto it = members_.find(worker_id);
  if (it == members_.end()) return false;
  Member gone = std::move(it->second);
  members_.erase(it);
  gone.state = why;
  gone.reason = reason;
  gone.connected = false;
  SHOAL_LOG(INFO) << "member " << (why == MemberState::kEvicted ? "evicted" : "left") << ": "
                  << worker_id << " round=" << round_ << " reason=\"" << reason
                  << "\" members=" << members_.size();
  departed_.push_back(std::move(gone));
  while (departed_.size() > options_.max_departed_shown) departed_.pop_front();
  queued_.erase(std::remove(queued_.begin(), queued_.end(), worker_id), queued_.end());
  auto p = std::find(participants_.begin(), participants_.end(), worker_id);
  if (p == participants_.end()) return false;
  participants_.erase(p);
  return true;
}

void RoundEngine::RemoveMember(const std::string& worker_id, MemberState why,
                               const std::string& reason, Directives* out) {
  if (!Depart(worker_id, why, reason)) return;
  if (phase_ == shoal::v1::TRAINING) {
    if (participants_.empty()) {
      phase_ = shoal::v1::WAITING_FOR_MEMBERS;
      MaybeStartRound(out);
    } else {
      // Before sharing the round goes on without the worker.
      MaybeSendPlan(out);
    }
  } else if (phase_ == shoal::v1::SHARING) {
    AbortRound(absl::StrCat("participant ", worker_id, " left during sharing: ", reason), out);
  }
}

void RoundEngine::AbortRound(const std::string& reason, Directives* out) {
  SHOAL_LOG(WARNING) << "round " << round_ << " aborted: " << reason;
  CoordinatorMessage msg;
  msg.mutable_round_aborted()->set_round(round_);
  msg.mutable_round_aborted()->set_reason(reason);
  std::vector<std::string> next = participants_;
  for (const std::string& id : participants_) {
    out->push_back({id, msg});
    Member& m = members_.at(id);
    m.state = MemberState::kWaiting;
    if (m.done && m.model_round == round_) {
      // It rolls back to the last agreed model.
      m.model_round = last_completed_round_;
      m.model_hash = agreed_hash_;
    }
    m.ready = m.done = false;
  }
  for (const std::string& id : queued_) next.push_back(id);
  participants_.clear();
  queued_ = std::move(next);
  phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  MaybeStartRound(out);
}

void RoundEngine::Finish(const std::string& reason, Directives* out) {
  phase_ = shoal::v1::FINISHED;
  SHOAL_LOG(INFO) << "run " << options_.run_id << " finished: " << reason;
  CoordinatorMessage msg;
  msg.mutable_run_finished()->set_last_round(last_completed_round_);
  msg.mutable_run_finished()->set_reason(reason);
  for (auto& [id, m] : members_) {
    m.state = MemberState::kWaiting;
    out->push_back({id, msg});
  }
  participants_.clear();
  queued_.clear();
}

Directives RoundEngine::Tick() {
  absl::MutexLock lock(&mu_);
  Directives out;
  const absl::Time now = clock_->Now();
  std::vector<std::pair<std::string, std::string>> expired;
  for (const auto& [id, m] : members_) {
    if (m.connected && now - m.last_seen > options_.heartbeat_lease) {
      expired.emplace_back(
          id, absl::StrCat("no heartbeat for ", absl::FormatDuration(now - m.last_seen)));
    } else if (!m.connected && now - m.last_seen > options_.session_grace) {
      expired.emplace_back(id, absl::StrCat("no session opened within ",
                                            absl::FormatDuration(options_.session_grace)));
    }
  }
  for (const auto& [id, reason] : expired) RemoveMember(id, MemberState::kEvicted, reason, &out);
  return out;
}

std::string RoundEngine::PhaseDetail() const {
  const uint32_t min = std::max<uint32_t>(1, options_.config.min_participants());
  switch (phase_) {
    case shoal::v1::WAITING_FOR_MEMBERS:
      return absl::StrCat(queued_.size(), " of ", min, " participants needed for round ", round_,
                          " (", members_.size(), " members)");
    case shoal::v1::TRAINING: {
      size_t ready = 0;
      for (const auto& id : participants_) ready += members_.at(id).ready;
      return absl::StrCat(ready, "/", participants_.size(), " participants ready");
    }
    case shoal::v1::SHARING: {
      size_t done = 0;
      for (const auto& id : participants_) done += members_.at(id).done;
      return absl::StrCat(done, "/", participants_.size(), " participants done sharing");
    }
    case shoal::v1::FINISHED:
      return absl::StrCat("finished after round ", last_completed_round_);
    default:
      return "";
  }
}

shoal::v1::RunStatus RoundEngine::Status() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  shoal::v1::RunStatus s;
  s.set_run_id(options_.run_id);
  s.set_phase(phase_);
  s.set_round(round_);
  s.set_last_completed_round(last_completed_round_);
  s.set_min_participants(options_.config.min_participants());
  s.set_members(members_.size());
  for (const auto& id : participants_) s.add_participants(id);
  *s.mutable_config() = options_.config;
  for (const auto& r : recent_rounds_) *s.add_recent_rounds() = r;
  s.set_started_unix_ms(absl::ToUnixMillis(started_at_));
  s.set_model_hash(agreed_hash_);
  s.set_detail(PhaseDetail());
  auto add = [&](const Member& m, bool active) {
    auto* w = s.add_workers();
    w->set_id(m.id);
    w->set_address(m.address);
    w->set_state(StateName(m.state));
    w->set_model_hash(m.model_hash);
    w->set_model_round(m.model_round);
    w->set_test_accuracy(m.metrics.test_accuracy());
    w->set_test_loss(m.metrics.test_loss());
    w->set_metrics_round(m.metrics_round);
    w->set_train_loss(m.train_loss);
    w->set_data_rank(m.data_rank);
    if (active) w->set_last_seen_ms_ago(absl::ToInt64Milliseconds(now - m.last_seen));
    w->set_rounds_completed(m.rounds_completed);
    w->set_reason(m.reason);
  };
  for (const auto& [id, m] : members_) add(m, true);
  for (const auto& m : departed_) add(m, false);
  return s;
}

bool RoundEngine::finished() const {
  absl::MutexLock lock(&mu_);
  return phase_ == shoal::v1::FINISHED;
}

uint64_t RoundEngine::last_completed_round() const {
  absl::MutexLock lock(&mu_);
  return last_completed_round_;
}

}  // namespace shoal::coordinator
