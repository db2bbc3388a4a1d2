#include "services/coordinator/core/round_engine.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/shard_plan.h"

namespace shoal::coordinator {
namespace {

using shoal::v1::CoordinatorMessage;

SharedMessage Share(CoordinatorMessage msg) {
  return std::make_shared<const CoordinatorMessage>(std::move(msg));
}

// Whether two heartbeats carry the same sync progress (what Status() shows).
bool SameProgress(const shoal::v1::Heartbeat& a, const shoal::v1::Heartbeat& b) {
  return a.syncing() == b.syncing() && a.sync_bytes_done() == b.sync_bytes_done() &&
         a.sync_bytes_total() == b.sync_bytes_total() && a.sync_sources() == b.sync_sources();
}

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
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) &&
                  !std::isupper(static_cast<unsigned char>(c));
         });
}

bool ValidWorkerId(const std::string& id) {
  uint64_t n = 0;
  return id.size() > 1 && id[0] == 'w' && absl::SimpleAtoi(id.substr(1), &n) && n > 0;
}

}  // namespace

RoundEngine::RoundEngine(EngineOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock), started_at_(clock->Now()) {
  // Versions of participant lists from different coordinator starts never
  // meet (a worker may keep a list across a restart): they start at the
  // start time in ms times 1000.
  plan_list_version_ =
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(started_at_))) * 1000;
  if (options_.resume.has_value()) {
    const shoal::v1::RunRecord& r = *options_.resume;
    last_completed_round_ = r.last_completed_round();
    agreed_hash_ = r.model_hash();
    round_ = last_completed_round_ + 1;
    next_worker_number_ = std::max<uint64_t>(1, r.next_worker_number());
    checkpoint_id_ = r.checkpoint_id();
    checkpoint_round_ = r.checkpoint_round();
    if (r.finished()) phase_ = shoal::v1::FINISHED;
    SHOAL_LOG(INFO) << "resuming run " << options_.run_id << " after round "
                    << last_completed_round_ << " (next round " << round_ << ")";
  }
}

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

RoundEngine::Member& RoundEngine::At(const std::string& worker_id) const {
  return *index_.at(worker_id);
}

absl::StatusOr<RoundEngine::Member*> RoundEngine::FindActive(const std::string& worker_id) {
  auto it = index_.find(worker_id);
  if (it == index_.end()) {
    if (worker_id.empty()) return absl::InvalidArgumentError("worker_id is empty");
    return absl::NotFoundError(absl::StrCat("unknown worker id '", worker_id,
                                            "' (never joined, left or was evicted: Join again)"));
  }
  return it->second;
}

bool RoundEngine::IsParticipant(const std::string& worker_id) const {
  return participant_set_.contains(worker_id);
}

void RoundEngine::CountFlags(const Member& m, int sign) {
  // Unsigned wrap-around makes -1 a decrement.
  const size_t d = static_cast<size_t>(sign);
  if (m.ready) ready_count_ += d;
  if (m.connections_ok) connected_count_ += d;
  if (m.connections_ok && !m.unreachable.empty()) unreachable_count_ += d;
  if (m.done) done_count_ += d;
}

template <typename F>
void RoundEngine::UpdateFlags(Member& m, F&& update) {
  const bool counted = IsParticipant(m.id);
  if (counted) CountFlags(m, -1);
  update(m);
  if (counted) CountFlags(m, +1);
}

void RoundEngine::ResetRoundFlags(Member& m) {
  UpdateFlags(m, [](Member& x) { x.ready = x.done = x.connections_ok = false; });
}

void RoundEngine::AddParticipant(const std::string& worker_id) {
  if (!participant_set_.insert(worker_id).second) return;
  participants_.push_back(worker_id);
  CountFlags(At(worker_id), +1);
}

bool RoundEngine::RemoveParticipant(const std::string& worker_id) {
  if (participant_set_.erase(worker_id) == 0) return false;
  // Removals are rare (misses, departures); the vector keeps join order.
  participants_.erase(std::find(participants_.begin(), participants_.end(), worker_id));
  CountFlags(At(worker_id), -1);
  return true;
}

std::vector<std::string> RoundEngine::TakeParticipants() {
  std::vector<std::string> taken = std::move(participants_);
  participants_.clear();
  participant_set_.clear();
  ready_count_ = connected_count_ = unreachable_count_ = done_count_ = 0;
  return taken;
}

void RoundEngine::Enqueue(const std::string& worker_id) {
  if (queued_set_.insert(worker_id).second) queued_.push_back(worker_id);
}

bool RoundEngine::IsQueued(const std::string& worker_id) const {
  return queued_set_.contains(worker_id);
}

void RoundEngine::Dequeue(const std::string& worker_id) {
  if (queued_set_.erase(worker_id) == 0) return;
  queued_.erase(std::find(queued_.begin(), queued_.end(), worker_id));
}

std::vector<std::string> RoundEngine::TakeQueue() {
  std::vector<std::string> taken = std::move(queued_);
  queued_.clear();
  queued_set_.clear();
  return taken;
}

bool RoundEngine::CountersConsistentForTesting() const {
  absl::MutexLock lock(&mu_);
  size_t ready = 0, connected = 0, unreachable = 0, done = 0;
  for (const std::string& id : participants_) {
    if (!index_.contains(id)) return false;
    const Member& m = At(id);
    ready += m.ready;
    connected += m.connections_ok;
    unreachable += m.connections_ok && !m.unreachable.empty();
    done += m.done;
  }
  if (participant_set_.size() != participants_.size() || queued_set_.size() != queued_.size() ||
      index_.size() != members_.size()) {
    return false;
  }
  for (const auto& [id, m] : members_) {
    auto it = index_.find(id);
    if (it == index_.end() || it->second != &m) return false;
  }
  for (const std::string& id : participants_) {
    if (!participant_set_.contains(id)) return false;
  }
  for (const std::string& id : queued_) {
    if (!queued_set_.contains(id) || !index_.contains(id)) return false;
  }
  return ready == ready_count_ && connected == connected_count_ &&
         unreachable == unreachable_count_ && done == done_count_;
}

bool RoundEngine::IsActive(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(worker_id);
}

absl::Status RoundEngine::CheckRound(uint64_t round, const char* what) const {
  if (round < round_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for round ", round, " is stale: the run is at round ", round_));
  }
  if (round > round_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " for round ", round, " is in the future: the run is at round ", round_));
  }
  return absl::OkStatus();
}

bool RoundEngine::HoldsAgreedModel(const Member& m) const {
  return m.model_round == last_completed_round_ && m.model_hash == agreed_hash_ &&
         !agreed_hash_.empty();
}

std::vector<std::string> RoundEngine::Holders() const {
  std::vector<std::string> holders;
  for (const auto& [id, m] : members_) {
    if (HoldsAgreedModel(m)) holders.push_back(m.address);
  }
  return holders;
}

absl::StatusOr<JoinResult> RoundEngine::Join(const shoal::v1::JoinRequest& request) {
  if (absl::Status s = ValidatePeerAddress(request.peer_address()); !s.ok()) return s;
  if (!request.model_hash().empty() && !IsHexSha256(request.model_hash())) {
    return absl::InvalidArgumentError("model_hash must be 64 lowercase hex digits (SHA-256)");
  }
  absl::MutexLock lock(&mu_);
  if (phase_ == shoal::v1::FINISHED) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", options_.run_id, " is finished after round ", last_completed_round_));
  }
  ++status_version_;
  const absl::Time now = clock_->Now();
  JoinResult result;
  Member* member = nullptr;
  const std::string& previous = request.previous_worker_id();
  if (!previous.empty()) {
    auto it = index_.find(previous);
    if (it != index_.end()) member = it->second;
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
    Member m;
    // After a coordinator restart, workers keep their ids and data ranks.
    bool departed = false;
    for (const Member& d : departed_) departed |= d.id == previous;
    if (ValidWorkerId(previous) && !departed) {
      m.id = previous;
      uint64_t n = 0;
      (void)absl::SimpleAtoi(previous.substr(1), &n);
      next_worker_number_ = std::max(next_worker_number_, n + 1);
      ++record_version_;
    } else {
      m.id = absl::StrCat("w", next_worker_number_++);
      ++record_version_;
    }
    if (request.has_previous_data_rank() && !used.count(request.previous_data_rank())) {
      m.data_rank = request.previous_data_rank();
    } else {
      uint32_t rank = 0;
      while (used.count(rank)) ++rank;
      m.data_rank = rank;
    }
    m.joined_at = now;
    member = &members_.emplace(m.id, std::move(m)).first->second;
    index_[member->id] = member;
    SHOAL_LOG(INFO) << "member joined: " << member->id << " at " << request.peer_address()
                    << " data_rank=" << member->data_rank
                    << " model_round=" << request.model_round() << " round=" << round_
                    << " members=" << members_.size();
  } else {
    SHOAL_LOG(INFO) << "member re-joined: " << member->id << " at " << request.peer_address();
  }
  member->address = request.peer_address();
  member->name = request.name();
  member->connected = false;
  member->plan_list_known = 0;
  member->last_seen = now;
  member->model_round = request.model_round();
  member->model_hash = request.model_hash();

  // After a restart, workers may hold a round the record had not saved yet
  // (the coordinator died between their reports and the write): adopt it.
  if (fresh_start_ && request.model_round() > last_completed_round_ &&
      !request.model_hash().empty() && phase_ == shoal::v1::WAITING_FOR_MEMBERS &&
      participants_.empty()) {
    SHOAL_LOG(WARNING) << "worker " << member->id << " holds round " << request.model_round()
                       << ", newer than the record's " << last_completed_round_
                       << "; continuing from it";
    last_completed_round_ = request.model_round();
    agreed_hash_ = request.model_hash();
    round_ = last_completed_round_ + 1;
    ++record_version_;
  }

  auto& r = result.response;
  r.set_worker_id(member->id);
  r.set_data_rank(member->data_rank);
  *r.mutable_config() = options_.config;
  r.set_run_id(options_.run_id);
  const bool current_open =
      phase_ == shoal::v1::WAITING_FOR_MEMBERS || (phase_ == shoal::v1::TRAINING && !any_ready_);
  r.set_next_round(current_open ? round_ : round_ + 1);
  r.set_model_round(last_completed_round_);
  r.set_model_hash(agreed_hash_);
  for (const std::string& h : Holders()) {
    if (h != member->address) r.add_holders(h);
  }
  r.set_checkpoint_id(checkpoint_id_);
  r.set_checkpoint_round(checkpoint_round_);
  return result;
}

absl::Status RoundEngine::Connect(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto member = FindActive(worker_id);
  if (!member.ok()) return member.status();
  ++status_version_;
  (*member)->connected = true;
  (*member)->plan_list_known = 0;  // a new session has no participant list yet
  (*member)->last_seen = clock_->Now();
  return absl::OkStatus();
}

absl::Status RoundEngine::Heartbeat(const std::string& worker_id,
                                    const shoal::v1::Heartbeat& heartbeat) {
  absl::MutexLock lock(&mu_);
  auto member = FindActive(worker_id);
  if (!member.ok()) return member.status();
  (*member)->last_seen = clock_->Now();
  // A heartbeat that only refreshes last_seen leaves a cached status valid
  // (the service bounds its age); sync progress is shown, so it counts.
  if (!SameProgress((*member)->progress, heartbeat)) ++status_version_;
  (*member)->progress = heartbeat;
  return absl::OkStatus();
}

Directives RoundEngine::Disconnect(const std::string& worker_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Directives out;
  ++status_version_;
  if (index_.contains(worker_id)) RemoveMember(worker_id, MemberState::kLeft, reason, &out);
  return out;
}

absl::StatusOr<uint64_t> RoundEngine::JoinRound(const std::string& worker_id, uint64_t round,
                                                Directives* out) {
  absl::MutexLock lock(&mu_);
  auto found = FindActive(worker_id);
  if (!found.ok()) return found.status();
  Member* member = *found;
  if (phase_ == shoal::v1::FINISHED) {
    return absl::FailedPreconditionError("run is finished");
  }
  ++status_version_;
  // 0: the earliest round still open to this worker (a joiner that spent a
  // while catching up cannot know which one that is).
  if (round == 0) round = round_;
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
  if (IsQueued(worker_id)) return waiting ? round_ : round_ + 1;
  member->last_seen = clock_->Now();
  if (waiting) {
    Enqueue(worker_id);
    SHOAL_LOG(INFO) << "member " << worker_id << " waits for round " << round_ << " ("
                    << queued_.size() << "/" << options_.config.min_participants() << ")";
    MaybeStartRound(out);
    return round_;
  }
  if (phase_ == shoal::v1::TRAINING && !any_ready_ && round == round_) {
    ResetRoundFlags(*member);
    AddParticipant(worker_id);
    member->state = MemberState::kTraining;
    out->push_back({worker_id, Share(RoundStartMessage(!HoldsAgreedModel(*member)))});
    SHOAL_LOG(INFO) << "member " << worker_id << " joins running round " << round_
                    << " participants=" << participants_.size();
    return round_;
  }
  Enqueue(worker_id);
  SHOAL_LOG(INFO) << "member " << worker_id << " queued for round " << round_ + 1;
  return round_ + 1;
}

CoordinatorMessage RoundEngine::RoundStartMessage(bool with_holders) const {
  CoordinatorMessage msg;
  auto* start = msg.mutable_round_start();
  start->set_round(round_);
  start->set_base_model_round(last_completed_round_);
  start->set_base_model_hash(agreed_hash_);
  if (with_holders) {
    for (const std::string& h : Holders()) start->add_holders(h);
  }
  start->set_checkpoint_id(checkpoint_id_);
  start->set_checkpoint_round(checkpoint_round_);
  return msg;
}

void RoundEngine::MaybeStartRound(Directives* out) {
  if (phase_ != shoal::v1::WAITING_FOR_MEMBERS) return;
  const size_t min = std::max<uint32_t>(1, options_.config.min_participants());
  if (queued_.size() < min) return;
  TakeParticipants();  // none while waiting; the queue becomes the round
  const std::vector<std::string> starting = TakeQueue();
  phase_ = shoal::v1::TRAINING;
  any_ready_ = false;
  attempt_ = 0;
  connection_retries_ = 0;
  sharing_started_ = false;
  round_started_at_ = clock_->Now();
  deadline_ = round_started_at_ + options_.round_timeout;
  // Two shared messages: the holders of the base model (O(N)) go only to
  // the workers that lack it.
  const SharedMessage start = Share(RoundStartMessage(/*with_holders=*/false));
  SharedMessage start_with_holders;
  for (const std::string& id : starting) {
    Member& m = At(id);
    const bool holds = HoldsAgreedModel(m);
    if (!holds && start_with_holders == nullptr) {
      start_with_holders = Share(RoundStartMessage(/*with_holders=*/true));
    }
    m.state = MemberState::kTraining;
    ResetRoundFlags(m);
    m.exchange_seconds = 0;
    AddParticipant(id);
    out->push_back({id, holds ? start : start_with_holders});
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
  if (absl::Status s = CheckRound(request.round(), "ready"); !s.ok()) return s;
  if (!IsParticipant(request.worker_id())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", request.worker_id(), " is not a participant of round ", round_,
        member->missed_reason.empty() ? "" : absl::StrCat(" (", member->missed_reason, ")")));
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
  ++status_version_;
  member->last_seen = clock_->Now();
  UpdateFlags(*member, [](Member& m) { m.ready = true; });
  member->state = MemberState::kReady;
  member->train_loss = request.train_loss();
  any_ready_ = true;
  MaybeSendPlan(out);
  return absl::OkStatus();
}

void RoundEngine::MaybeSendPlan(Directives* out) {
  if (phase_ != shoal::v1::TRAINING || participants_.empty()) return;
  if (ready_count_ < participants_.size()) return;
  phase_ = shoal::v1::SHARING;
  SendPlan(out);
}

void RoundEngine::SendPlan(Directives* out) {
  ++attempt_;
  connection_retries_ = 0;
  sharing_started_ = false;
  deadline_ = clock_->Now() + options_.connection_timeout;
  const std::vector<SliceRange> slices = PlanSlices(total_elements_, participants_.size());
  // A new version whenever the list (ids, addresses, order) changed.
  bool same_list = plan_list_.size() == participants_.size();
  for (size_t k = 0; same_list && k < participants_.size(); ++k) {
    const Member& m = At(participants_[k]);
    same_list = plan_list_[k].first == m.id && plan_list_[k].second == m.address;
  }
  if (!same_list) {
    ++plan_list_version_;
    plan_list_.clear();
    plan_list_.reserve(participants_.size());
    for (const std::string& id : participants_) plan_list_.emplace_back(id, At(id).address);
  }
  CoordinatorMessage msg;
  shoal::v1::RoundPlan* plan = msg.mutable_round_plan();
  plan->set_round(round_);
  plan->set_total_elements(total_elements_);
  plan->set_attempt(attempt_);
  plan->set_participants_version(plan_list_version_);
  CoordinatorMessage compact = msg;  // the same plan without the list
  plan->mutable_slices()->Reserve(static_cast<int>(participants_.size()));
  for (size_t k = 0; k < participants_.size(); ++k) {
    Member& m = At(participants_[k]);
    m.state = MemberState::kSharing;
    if (m.done && m.model_round == round_) {
      // A report of an earlier attempt: that model is discarded.
      m.model_round = last_completed_round_;
      m.model_hash = agreed_hash_;
    }
    UpdateFlags(m, [](Member& x) {
      x.connections_ok = x.done = false;
      x.unreachable.clear();
    });
    auto* s = plan->add_slices();
    s->set_worker_id(m.id);
    s->set_peer_address(m.address);
    s->set_begin(slices[k].begin);
    s->set_end(slices[k].end);
  }
  // The full plan names every participant (O(N) bytes): it goes, as one
  // shared copy, only to sessions that do not hold this list yet.
  const SharedMessage full = Share(std::move(msg));
  const SharedMessage small = Share(std::move(compact));
  for (const std::string& id : participants_) {
    Member& m = At(id);
    out->push_back({id, m.plan_list_known == plan_list_version_ ? small : full});
    m.plan_list_known = plan_list_version_;
  }
  SHOAL_LOG(INFO) << "round " << round_ << " plan attempt " << attempt_ << ": "
                  << participants_.size() << " participants, " << total_elements_ << " elements";
}

absl::Status RoundEngine::ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request,
                                           Directives* out) {
  absl::MutexLock lock(&mu_);
  auto found = FindActive(request.worker_id());
  if (!found.ok()) return found.status();
  Member* member = *found;
  if (absl::Status s = CheckRound(request.round(), "connections ready"); !s.ok()) return s;
  if (!IsParticipant(request.worker_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not a participant of round ", round_));
  }
  if (phase_ != shoal::v1::SHARING || request.attempt() != attempt_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan attempt ", request.attempt(), " is not current (round ", round_, " is at attempt ",
        attempt_, phase_ == shoal::v1::SHARING ? "" : ", not sharing", ")"));
  }
  if (sharing_started_) return absl::OkStatus();  // retried call
  for (const std::string& id : request.unreachable()) {
    if (!IsParticipant(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unreachable worker '", id, "' is not a participant of round ", round_));
    }
  }
  ++status_version_;
  member->last_seen = clock_->Now();
  UpdateFlags(*member, [&request](Member& m) {
    m.connections_ok = true;
    m.unreachable.assign(request.unreachable().begin(), request.unreachable().end());
  });
  if (!member->unreachable.empty()) {
    SHOAL_LOG(WARNING) << "round " << round_ << ": " << member->id << " cannot reach "
                       << absl::StrJoin(member->unreachable, ",");
  }
  MaybeStartSharing(out);
  return absl::OkStatus();
}

std::vector<std::string> RoundEngine::FailingPeers() const {
  // A participant fails when it did not report, or when a strict majority of
  // the others that reported cannot reach it (so one worker that reaches
  // nobody does not drag down the peers it names).
  std::map<std::string, int> named;
  int reporters = 0;
  for (const std::string& id : participants_) {
    const Member& m = At(id);
    if (!m.connections_ok) continue;
    ++reporters;
    for (const std::string& u : m.unreachable) ++named[u];
  }
  std::vector<std::string> failing;
  for (const std::string& id : participants_) {
    const Member& m = At(id);
    const int others = reporters - (m.connections_ok ? 1 : 0);
    const auto it = named.find(id);
    const int n = it == named.end() ? 0 : it->second;
    if (!m.connections_ok || (n > 0 && 2 * n > others)) failing.push_back(id);
  }
  if (!failing.empty()) return failing;
  // Nobody is named by a majority: blame those that cannot reach most of
  // the others (a worker whose own outbound connections fail).
  const size_t others = participants_.size() - 1;
  for (const std::string& id : participants_) {
    if (2 * At(id).unreachable.size() > others) failing.push_back(id);
  }
  if (!failing.empty()) return failing;
  // Still nobody (e.g. two workers that cannot reach each other): blame
  // everyone named at least once.
  for (const auto& [id, n] : named) {
    if (n > 0) failing.push_back(id);
  }
  return failing;
}

void RoundEngine::MaybeStartSharing(Directives* out) {
  if (phase_ != shoal::v1::SHARING || sharing_started_) return;
  if (connected_count_ < participants_.size()) return;
  if (unreachable_count_ > 0) {
    ConnectionTimeout(out);  // everyone reported: no need to wait for the deadline
    return;
  }
  sharing_started_ = true;
  deadline_ = clock_->Now() + options_.round_timeout;
  CoordinatorMessage msg;
  msg.mutable_start_sharing()->set_round(round_);
  msg.mutable_start_sharing()->set_attempt(attempt_);
  const SharedMessage shared = Share(std::move(msg));
  for (const std::string& id : participants_) out->push_back({id, shared});
  SHOAL_LOG(INFO) << "round " << round_ << ": all " << participants_.size()
                  << " participants connected, sharing starts (attempt " << attempt_ << ")";
}

void RoundEngine::ConnectionTimeout(Directives* out) {
  const std::vector<std::string> failing = FailingPeers();
  if (connection_retries_ < options_.max_connection_retry) {
    ++connection_retries_;
    deadline_ = clock_->Now() + options_.connection_timeout;
    SHOAL_LOG(WARNING) << "round " << round_ << ": peers not connected ("
                       << absl::StrJoin(failing, ",") << "), retry " << connection_retries_ << "/"
                       << options_.max_connection_retry;
    CoordinatorMessage msg;
    auto* retry = msg.mutable_retry_connections();
    retry->set_round(round_);
    retry->set_attempt(attempt_);
    retry->set_retry(connection_retries_);
    for (const std::string& id : failing) retry->add_failing(id);
    const SharedMessage shared = Share(std::move(msg));
    for (const std::string& id : participants_) {
      UpdateFlags(At(id), [](Member& m) {
        m.connections_ok = false;
        m.unreachable.clear();
      });
      out->push_back({id, shared});
    }
    return;
  }
  const std::string reason = absl::StrCat("could not connect with the peers of round ", round_,
                                          " after ", options_.max_connection_retry, " retries");
  for (const std::string& id : failing) {
    CoordinatorMessage msg;
    msg.mutable_connection_fail()->set_round(round_);
    msg.mutable_connection_fail()->set_reason(reason);
    out->push_back({id, Share(std::move(msg))});
    Depart(id, MemberState::kEvicted, reason);
  }
  if (participants_.empty()) {
    AbortRound("no participant left after connection failures", out);
    return;
  }
  SendPlan(out);  // the rest go on with a recomputed plan
}

absl::Status RoundEngine::ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request,
                                          Directives* out) {
  absl::MutexLock lock(&mu_);
  auto found = FindActive(request.worker_id());
  if (!found.ok()) return found.status();
  Member* member = *found;
  if (request.round() != round_ || phase_ != shoal::v1::SHARING || !sharing_started_) {
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
  if (request.attempt() != 0 && request.attempt() != attempt_) {
    return absl::FailedPreconditionError(absl::StrCat("plan attempt ", request.attempt(),
                                                      " is not current (round ", round_,
                                                      " is at attempt ", attempt_, ")"));
  }
  if (!IsHexSha256(request.model_hash())) {
    return absl::InvalidArgumentError("model_hash must be 64 lowercase hex digits (SHA-256)");
  }
  ++status_version_;
  member->last_seen = clock_->Now();
  UpdateFlags(*member, [](Member& m) { m.done = true; });
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
  if (phase_ != shoal::v1::SHARING || !sharing_started_ || participants_.empty()) return;
  if (done_count_ < participants_.size()) return;
  // The hash most participants hold wins; the others are out of sync.
  std::map<std::string, size_t> votes;
  for (const std::string& id : participants_) ++votes[At(id).model_hash];
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
    if (At(id).model_hash != hash) disagree.push_back(id);
  }
  for (const std::string& id : disagree) {
    SHOAL_LOG(ERROR) << "round " << round_ << ": worker " << id << " reported hash "
                     << At(id).model_hash.substr(0, 12) << ", majority has " << hash.substr(0, 12);
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(
        absl::StrCat("model hash mismatch in round ", round_));
    out->push_back({id, Share(std::move(msg))});
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
    Member& m = At(id);
    loss += m.train_loss;
    exchange += m.exchange_seconds;
    if (m.metrics_round == round_ && !summary.evaluated()) {
      summary.set_evaluated(true);
      summary.set_test_accuracy(m.metrics.test_accuracy());
      summary.set_test_loss(m.metrics.test_loss());
    }
    m.rounds_completed++;
    m.missed_in_row = 0;
    m.state = MemberState::kWaiting;
  }
  summary.set_train_loss(loss / participants_.size());
  summary.set_exchange_seconds(exchange / participants_.size());
  if (!summary.evaluated() && !recent_rounds_.empty()) {
    summary.set_test_accuracy(recent_rounds_.back().test_accuracy());
    summary.set_test_loss(recent_rounds_.back().test_loss());
  }
  recent_rounds_.push_back(summary);
  while (recent_rounds_.size() > 100) recent_rounds_.pop_front();
  last_completed_round_ = round_;
  agreed_hash_ = hash;
  fresh_start_ = false;
  ++record_version_;
  SHOAL_LOG(INFO) << "round " << round_ << " complete: participants=" << participants_.size()
                  << " hash=" << hash.substr(0, 16) << " seconds=" << summary.seconds();

  CoordinatorMessage done;
  done.mutable_round_complete()->set_round(round_);
  done.mutable_round_complete()->set_model_hash(hash);
  const SharedMessage shared_done = Share(std::move(done));
  for (const std::string& id : participants_) out->push_back({id, shared_done});

  const uint64_t limit = options_.config.rounds();
  const bool last = limit > 0 && last_completed_round_ >= limit;
  const uint32_t every = options_.config.checkpoint_every();
  if (!options_.config.checkpoint_store().empty() && every > 0 &&
      (last_completed_round_ % every == 0 || last)) {
    checkpoint_tried_.clear();
    AssignCheckpoint(last_completed_round_, out);
  }
  if (last) {
    Finish(absl::StrCat("completed ", limit, " rounds"), out);
    return;
  }
  // Participation is sticky: this round's participants take part in the next
  // one, joined by those queued during this round.
  const std::vector<std::string> stay = TakeParticipants();
  const std::vector<std::string> joining = TakeQueue();
  for (const std::string& id : stay) Enqueue(id);
  for (const std::string& id : joining) Enqueue(id);  // skips those already in
  ++round_;
  phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  MaybeStartRound(out);
}

void RoundEngine::MissRound(const std::string& worker_id, const std::string& reason,
                            Directives* out) {
  Member& m = At(worker_id);
  RemoveParticipant(worker_id);
  ++m.missed_in_row;
  m.missed_reason = absl::StrCat("round ", round_, ": ", reason);
  m.state = MemberState::kWaiting;
  ResetRoundFlags(m);
  SHOAL_LOG(WARNING) << "worker " << worker_id << " sits out round " << round_ << ": " << reason
                     << " (" << m.missed_in_row << " in a row)";
  if (options_.max_missed_rounds > 0 && m.missed_in_row >= options_.max_missed_rounds) {
    const std::string why =
        absl::StrCat("missed ", m.missed_in_row, " rounds in a row (last: ", reason, ")");
    CoordinatorMessage msg;
    msg.mutable_leave_requested()->set_reason(why);
    out->push_back({worker_id, Share(std::move(msg))});
    Depart(worker_id, MemberState::kEvicted, why);
    return;
  }
  CoordinatorMessage msg;
  msg.mutable_round_missed()->set_round(round_);
  msg.mutable_round_missed()->set_reason(reason);
  out->push_back({worker_id, Share(std::move(msg))});
  Enqueue(worker_id);  // takes part again from the next round
}

bool RoundEngine::Depart(const std::string& worker_id, MemberState why, const std::string& reason) {
  auto it = members_.find(worker_id);
  if (it == members_.end()) return false;
  // Out of the round first: its flags leave the counters with it.
  const bool was_participant = RemoveParticipant(worker_id);
  Dequeue(worker_id);
  Member gone = std::move(it->second);
  index_.erase(worker_id);
  members_.erase(it);
  ++departures_;
  gone.state = why;
  gone.reason = reason;
  gone.connected = false;
  SHOAL_LOG(INFO) << "member " << (why == MemberState::kEvicted ? "evicted" : "left") << ": "
                  << worker_id << " round=" << round_ << " reason=\"" << reason
                  << "\" members=" << members_.size();
  departed_.push_back(std::move(gone));
  while (departed_.size() > options_.max_departed_shown) departed_.pop_front();
  return was_participant;
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
    Replan(absl::StrCat("participant ", worker_id, " lost: ", reason), out);
  }
}

void RoundEngine::Replan(const std::string& reason, Directives* out) {
  if (participants_.empty()) {
    AbortRound(reason, out);
    return;
  }
  SHOAL_LOG(WARNING) << "round " << round_ << ": " << reason << "; " << participants_.size()
                     << " survivors exchange again";
  SendPlan(out);
}

void RoundEngine::AbortRound(const std::string& reason, Directives* out) {
  SHOAL_LOG(WARNING) << "round " << round_ << " aborted: " << reason;
  CoordinatorMessage msg;
  msg.mutable_round_aborted()->set_round(round_);
  msg.mutable_round_aborted()->set_reason(reason);
  const SharedMessage shared = Share(std::move(msg));
  const std::vector<std::string> aborted = TakeParticipants();
  const std::vector<std::string> waiting = TakeQueue();
  for (const std::string& id : aborted) {
    out->push_back({id, shared});
    Member& m = At(id);
    m.state = MemberState::kWaiting;
    if (m.done && m.model_round == round_) {
      // It rolls back to the last agreed model.
      m.model_round = last_completed_round_;
      m.model_hash = agreed_hash_;
    }
    ResetRoundFlags(m);
    Enqueue(id);
  }
  for (const std::string& id : waiting) Enqueue(id);
  phase_ = shoal::v1::WAITING_FOR_MEMBERS;
  MaybeStartRound(out);
}

void RoundEngine::Finish(const std::string& reason, Directives* out) {
  phase_ = shoal::v1::FINISHED;
  ++record_version_;
  SHOAL_LOG(INFO) << "run " << options_.run_id << " finished: " << reason;
  CoordinatorMessage msg;
  msg.mutable_run_finished()->set_last_round(last_completed_round_);
  msg.mutable_run_finished()->set_reason(reason);
  const SharedMessage shared = Share(std::move(msg));
  for (auto& [id, m] : members_) {
    m.state = MemberState::kWaiting;
    out->push_back({id, shared});
  }
  TakeParticipants();
  TakeQueue();
}

void RoundEngine::AssignCheckpoint(uint64_t round, Directives* out) {
  pending_checkpoint_round_ = 0;
  pending_checkpoint_worker_.clear();
  if (checkpoint_tried_.size() >= std::max<uint32_t>(1, options_.checkpointers) + 2) {
    SHOAL_LOG(WARNING) << "checkpoint of round " << round << " failed " << checkpoint_tried_.size()
                       << " times; the next checkpoint round will try again";
    return;
  }
  for (const auto& [id, m] : members_) {
    if (checkpoint_tried_.count(id) || m.model_round != round || m.model_hash != agreed_hash_) {
      continue;
    }
    checkpoint_tried_.insert(id);
    pending_checkpoint_round_ = round;
    pending_checkpoint_worker_ = id;
    pending_checkpoint_since_ = clock_->Now();
    CoordinatorMessage msg;
    msg.mutable_checkpoint_request()->set_round(round);
    msg.mutable_checkpoint_request()->set_model_hash(agreed_hash_);
    msg.mutable_checkpoint_request()->set_run_id(options_.run_id);
    out->push_back({id, Share(std::move(msg))});
    SHOAL_LOG(INFO) << "checkpoint of round " << round << " assigned to " << id;
    return;
  }
  SHOAL_LOG(WARNING) << "no worker left to upload the checkpoint of round " << round
                     << "; the next checkpoint round will try again";
}

absl::Status RoundEngine::ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request,
                                           Directives* out) {
  absl::MutexLock lock(&mu_);
  auto found = FindActive(request.worker_id());
  if (!found.ok()) return found.status();
  ++status_version_;
  if (pending_checkpoint_round_ == 0 || request.round() != pending_checkpoint_round_ ||
      request.worker_id() != pending_checkpoint_worker_) {
    return absl::FailedPreconditionError(absl::StrCat("no checkpoint of round ", request.round(),
                                                      " is expected from ", request.worker_id()));
  }
  if (!request.error().empty() || request.checkpoint_id().empty()) {
    SHOAL_LOG(WARNING) << "checkpoint of round " << request.round() << " by " << request.worker_id()
                       << " failed: " << request.error();
    AssignCheckpoint(request.round(), out);
    return absl::OkStatus();
  }
  checkpoint_id_ = request.checkpoint_id();
  checkpoint_round_ = request.round();
  pending_checkpoint_round_ = 0;
  pending_checkpoint_worker_.clear();
  ++record_version_;
  SHOAL_LOG(INFO) << "checkpoint " << checkpoint_id_ << " of round " << checkpoint_round_
                  << " stored by " << request.worker_id();
  return absl::OkStatus();
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
  if (!expired.empty()) ++status_version_;
  for (const auto& [id, reason] : expired) RemoveMember(id, MemberState::kEvicted, reason, &out);
  if (pending_checkpoint_round_ > 0 &&
      (!index_.contains(pending_checkpoint_worker_) ||
       now - pending_checkpoint_since_ > options_.checkpoint_timeout)) {
    ++status_version_;
    SHOAL_LOG(WARNING) << "checkpoint of round " << pending_checkpoint_round_ << " by "
                       << pending_checkpoint_worker_ << " did not complete; reassigning";
    AssignCheckpoint(pending_checkpoint_round_, &out);
  }

  if (now < deadline_) return out;
  // Only these phases act on the deadline (a quiet tick leaves the status).
  if (phase_ == shoal::v1::TRAINING || phase_ == shoal::v1::SHARING) ++status_version_;
  if (phase_ == shoal::v1::TRAINING) {
    std::vector<std::string> late;
    for (const std::string& id : participants_) {
      if (!At(id).ready) late.push_back(id);
    }
    if (late.size() == participants_.size()) {
      // Nobody is ready: there is no one to go on with, so keep waiting.
      deadline_ = now + options_.round_timeout;
      SHOAL_LOG(WARNING) << "round " << round_ << ": no participant ready after "
                         << absl::FormatDuration(options_.round_timeout) << "; still waiting";
      return out;
    }
    for (const std::string& id : late) {
      MissRound(id,
                absl::StrCat("not ready within --round_timeout=",
                             absl::FormatDuration(options_.round_timeout)),
                &out);
    }
    MaybeSendPlan(&out);
  } else if (phase_ == shoal::v1::SHARING && !sharing_started_) {
    ConnectionTimeout(&out);
  } else if (phase_ == shoal::v1::SHARING) {
    std::vector<std::string> late;
    for (const std::string& id : participants_) {
      if (!At(id).done) late.push_back(id);
    }
    if (late.size() == participants_.size()) {
      AbortRound("no participant finished sharing within --round_timeout", &out);
      return out;
    }
    // Those done hold the complete average; the others catch up later.
    for (const std::string& id : late) {
      MissRound(id, "did not finish sharing within --round_timeout", &out);
    }
    MaybeCompleteRound(&out);
  }
  return out;
}

std::string RoundEngine::PhaseDetail() const {
  const uint32_t min = std::max<uint32_t>(1, options_.config.min_participants());
  switch (phase_) {
    case shoal::v1::WAITING_FOR_MEMBERS:
      return absl::StrCat(queued_.size(), " of ", min, " participants needed for round ", round_,
                          " (", members_.size(), " members)");
    case shoal::v1::TRAINING:
      return absl::StrCat(ready_count_, "/", participants_.size(), " participants ready");
    case shoal::v1::SHARING: {
      if (!sharing_started_) {
        return absl::StrCat("connecting: ", connected_count_, "/", participants_.size(),
                            " participants reached their peers (attempt ", attempt_, ", retry ",
                            connection_retries_, "/", options_.max_connection_retry, ")");
      }
      return absl::StrCat(done_count_, "/", participants_.size(),
                          " participants done sharing (attempt ", attempt_, ")");
    }
    case shoal::v1::FINISHED:
      return absl::StrCat("finished after round ", last_completed_round_);
    default:
      return "";
  }
}

shoal::v1::RunStatus RoundEngine::Status() const {
  absl::MutexLock lock(&mu_);
  return StatusLocked();
}

shoal::v1::RunStatus RoundEngine::Status(uint64_t* version) const {
  absl::MutexLock lock(&mu_);
  *version = status_version_;
  return StatusLocked();
}

uint64_t RoundEngine::departures() const {
  absl::MutexLock lock(&mu_);
  return departures_;
}

uint64_t RoundEngine::status_version() const {
  absl::MutexLock lock(&mu_);
  return status_version_;
}

shoal::v1::RunStatus RoundEngine::StatusLocked() const {
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
  s.set_connection_retries(connection_retries_);
  s.set_attempt(phase_ == shoal::v1::SHARING ? attempt_ : 0);
  s.set_queued(queued_.size());
  s.set_checkpoint_id(checkpoint_id_);
  s.set_checkpoint_round(checkpoint_round_);
  if (pending_checkpoint_round_ > 0) {
    s.set_checkpoint_pending(
        absl::StrCat("round ", pending_checkpoint_round_, " by ", pending_checkpoint_worker_));
  }
  auto add = [&](const Member& m, bool active) {
    auto* w = s.add_workers();
    w->set_id(m.id);
    w->set_address(m.address);
    w->set_state(active && m.progress.syncing() ? "syncing" : StateName(m.state));
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
    w->set_rounds_missed(m.missed_in_row);
    w->set_missed_reason(m.missed_reason);
    if (active && m.progress.syncing()) {
      w->set_sync_bytes_done(m.progress.sync_bytes_done());
      w->set_sync_bytes_total(m.progress.sync_bytes_total());
      w->set_sync_sources(m.progress.sync_sources());
    }
  };
  for (const auto& [id, m] : members_) add(m, true);
  for (const auto& m : departed_) add(m, false);
  return s;
}

shoal::v1::RunRecord RoundEngine::Record() const {
  absl::MutexLock lock(&mu_);
  shoal::v1::RunRecord r;
  r.set_run_id(options_.run_id);
  *r.mutable_config() = options_.config;
  r.set_last_completed_round(last_completed_round_);
  r.set_model_hash(agreed_hash_);
  r.set_next_worker_number(next_worker_number_);
  r.set_checkpoint_id(checkpoint_id_);
  r.set_checkpoint_round(checkpoint_round_);
  r.set_updated_unix_ms(absl::ToUnixMillis(clock_->Now()));
  r.set_finished(phase_ == shoal::v1::FINISHED);
  return r;
}

uint64_t RoundEngine::record_version() const {
  absl::MutexLock lock(&mu_);
  return record_version_;
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
