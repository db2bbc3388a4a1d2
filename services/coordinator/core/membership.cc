// Membership: joins (ids, data ranks, replaced addresses, the member
// limit), sessions, leases, departures and member credentials.
#include "services/coordinator/core/membership.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/zone.h"
#include "services/coordinator/core/round_decisions.h"

namespace shoal::coordinator {
namespace {

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

// "w<n>" as the engine writes it: n > 0 in decimal with no sign, space or
// leading zero, and below 2^63 so that the next number (n + 1) cannot wrap
// around to ids already handed out (found by the join_request fuzz target).
bool ValidWorkerId(const std::string& id) {
  uint64_t n = 0;
  return id.size() > 1 && id[0] == 'w' && absl::SimpleAtoi(id.substr(1), &n) && n > 0 &&
         n < (uint64_t{1} << 63) && id == absl::StrCat("w", n);
}

}  // namespace

const char* MemberStateName(MemberState s) {
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
    case MemberState::kLost:
      return "lost";
    case MemberState::kFinished:
      return "finished";
    case MemberState::kEvicted:
      return "evicted";
  }
  return "unknown";
}

Membership::Membership(const EngineOptions& options, const Clock* clock, EngineVersions* versions,
                       absl::Time started_at)
    : options_(options), clock_(clock), versions_(versions) {
  if (options_.member_credentials) {
    // The epoch names this start: a credential of an earlier start (or of
    // another replica's term) is never judged against this roster's list.
    roster_.emplace(static_cast<uint64_t>(std::max<int64_t>(1, absl::ToUnixMicros(started_at))),
                    options_.credential_secret
                        ? options_.credential_secret
                        : std::function<std::string()>(RandomCredentialSecret));
  }
}

void Membership::Resume(const shoal::v1::RunRecord& record) {
  next_worker_number_ = std::max<uint64_t>(1, record.next_worker_number());
}

Member* Membership::Find(const std::string& worker_id) const {
  auto it = index_.find(worker_id);
  return it == index_.end() ? nullptr : it->second;
}

absl::StatusOr<Member*> Membership::FindActive(const std::string& worker_id) const {
  auto it = index_.find(worker_id);
  if (it == index_.end()) {
    if (worker_id.empty()) return absl::InvalidArgumentError("worker_id is empty");
    return absl::NotFoundError(absl::StrCat("unknown worker id '", worker_id,
                                            "' (never joined, left or was evicted: Join again)"));
  }
  return it->second;
}

// ------------------------------------------------------------------- Join

absl::Status Membership::CheckJoinRequest(const shoal::v1::JoinRequest& request) {
  if (absl::Status s = ValidatePeerAddress(request.peer_address()); !s.ok()) return s;
  if (absl::Status s = ParseZone(request.zone()).status(); !s.ok()) return s;
  if (!request.model_hash().empty() && !IsHexSha256(request.model_hash())) {
    return absl::InvalidArgumentError("model_hash must be 64 lowercase hex digits (SHA-256)");
  }
  if (!request.initial_model_hash().empty() && !IsHexSha256(request.initial_model_hash())) {
    return absl::InvalidArgumentError(
        "initial_model_hash must be 64 lowercase hex digits (SHA-256)");
  }
  return absl::OkStatus();
}

std::vector<std::string> Membership::AtAddress(const std::string& address,
                                               const Member* except) const {
  // Re-joins count too: otherwise two members would share an address, and
  // the next worker there would replace only one (found by the
  // join_request fuzz target).
  std::vector<std::string> found;
  for (const auto& [id, m] : members_) {
    if (m.address == address && &m != except) found.push_back(id);
  }
  return found;
}

absl::StatusOr<Member*> Membership::Add(const shoal::v1::JoinRequest& request, uint64_t round) {
  if (options_.max_members > 0 && members_.size() >= options_.max_members) {
    return absl::ResourceExhaustedError(
        absl::StrCat("run ", options_.run_id, " is full: ", members_.size(),
                     " members (--max_members=", options_.max_members, ")"));
  }
  const std::string& previous = request.previous_worker_id();
  std::set<uint32_t> used;
  for (const auto& [id, m] : members_) used.insert(m.data_rank);
  Member m;
  // After a coordinator restart, workers keep their ids and data ranks.
  bool departed = false;
  for (const shoal::v1::WorkerStatus& d : departed_) departed |= d.id() == previous;
  if (ValidWorkerId(previous) && !departed) {
    m.id = previous;
    uint64_t n = 0;
    (void)absl::SimpleAtoi(previous.substr(1), &n);
    next_worker_number_ = std::max(next_worker_number_, n + 1);
  } else {
    m.id = absl::StrCat("w", next_worker_number_++);
  }
  // The worker numbering is durable.
  versions_->MarkRecordChanged();
  if (request.has_previous_data_rank() && !used.count(request.previous_data_rank())) {
    m.data_rank = request.previous_data_rank();
  } else {
    uint32_t rank = 0;
    while (used.count(rank)) ++rank;
    m.data_rank = rank;
  }
  m.joined_at = clock_->Now();
  Member* member = &members_.emplace(m.id, std::move(m)).first->second;
  index_[member->id] = member;
  SHOAL_LOG(INFO) << "member joined: " << member->id
                  << (member->name.empty() ? "" : absl::StrCat(" (", member->name, ")")) << " at "
                  << request.peer_address() << " data_rank=" << member->data_rank
                  << " model_round=" << request.model_round() << " round=" << round
                  << " members=" << members_.size();
  return member;
}

void Membership::Refresh(Member& m, const shoal::v1::JoinRequest& request,
                         const std::string& unreachable) {
  m.address = request.peer_address();
  m.name = request.name();
  m.zone = request.zone();
  m.outbound_only = request.outbound_only() || !unreachable.empty();
  m.outbound_reason = request.outbound_only() ? "declared (--outbound_only)"
                      : unreachable.empty()   ? ""
                                              : absl::StrCat("probe: ", unreachable);
  if (m.outbound_only) {
    SHOAL_LOG(INFO) << m.id << " takes part with outbound connections only: " << m.outbound_reason;
  }
  m.connected = false;
  if (!m.pending) ++pending_;
  m.pending = true;
  m.last_seen = clock_->Now();
}

std::string Membership::IssueCredential(const std::string& worker_id, Directives* out) {
  if (!roster_.has_value()) return "";
  shoal::v1::MemberUpdate update;
  std::string credential = roster_->Issue(worker_id, &update);
  shoal::v1::CoordinatorMessage msg;
  *msg.mutable_member_update() = std::move(update);
  SendToConnected(Share(std::move(msg)), out);
  return credential;
}

void Membership::AddModelFileHolders(const Member& joiner, shoal::v1::JoinResponse* response) {
  std::vector<const std::string*> open;
  for (const auto& [id, m] : members_) {
    if (m.connected && !m.outbound_only && m.address != joiner.address) open.push_back(&m.address);
  }
  const size_t n = std::min<size_t>(open.size(), 8);
  for (size_t i = 0; i < n; ++i) {
    response->add_model_file_holders(*open[(joins_for_file_ + i) % open.size()]);
  }
  ++joins_for_file_;
}

// ------------------------------------------------------ Sessions, leases

void Membership::Connect(Member& m) {
  if (m.pending) --pending_;
  m.pending = false;
  m.connected = true;
  m.last_seen = clock_->Now();
}

void Membership::TakeProgress(Member& m, const shoal::v1::Heartbeat& heartbeat) {
  if (m.syncing != heartbeat.syncing() || m.sync_bytes_done != heartbeat.sync_bytes_done() ||
      m.sync_bytes_total != heartbeat.sync_bytes_total() ||
      m.sync_sources != heartbeat.sync_sources()) {
    versions_->MarkStatusChanged();
  }
  m.syncing = heartbeat.syncing();
  m.sync_bytes_done = heartbeat.sync_bytes_done();
  m.sync_bytes_total = heartbeat.sync_bytes_total();
  m.sync_sources = heartbeat.sync_sources();
}

std::vector<std::pair<std::string, std::string>> Membership::ExpiredLeases(absl::Time now) const {
  std::vector<std::pair<std::string, std::string>> expired;
  for (const auto& [id, m] : members_) {
    LeaseDecision lease = DecideLease(m.connected, m.last_seen, options_.heartbeat_lease,
                                      options_.session_grace, now);
    if (lease.expired) expired.emplace_back(id, std::move(lease.reason));
  }
  return expired;
}

bool Membership::Alive(const Member& m, absl::Time now) const {
  const int64_t interval_ms = options_.config.timeouts().heartbeat_interval_ms();
  const absl::Duration interval =
      interval_ms > 0 ? absl::Milliseconds(interval_ms) : absl::Seconds(1);
  return m.connected && now - m.last_seen <= std::min(3 * interval, options_.heartbeat_lease);
}

// ------------------------------------------------------------- Departures

void Membership::Remove(std::string worker_id, MemberState why, const std::string& reason,
                        shoal::v1::WorkerStatus gone, uint64_t round, Directives* out) {
  auto it = members_.find(worker_id);
  if (it == members_.end()) return;
  if (it->second.pending) --pending_;
  index_.erase(worker_id);
  members_.erase(it);
  ++departures_;
  SHOAL_LOG(INFO) << "member " << MemberStateName(why) << ": " << worker_id << " round=" << round
                  << " reason=\"" << reason << "\" members=" << members_.size();
  departed_.push_back(std::move(gone));
  while (departed_.size() > options_.max_departed_shown) departed_.pop_front();
  if (shoal::v1::MemberUpdate update; roster_.has_value() && roster_->Revoke(worker_id, &update)) {
    shoal::v1::CoordinatorMessage msg;
    *msg.mutable_member_update() = std::move(update);
    SendToConnected(Share(std::move(msg)), out);
  }
}

// --------------------------------------------------------------- Messages

void Membership::EndRun(const SharedMessage& run_finished, Directives* out) {
  for (auto& [id, m] : members_) {
    m.state = MemberState::kWaiting;
    out->push_back({id, run_finished});
  }
}

void Membership::SendToConnected(const SharedMessage& message, Directives* out) const {
  for (const auto& [id, m] : members_) {
    if (m.connected) out->push_back({id, message});
  }
}

SharedMessage Membership::MemberList(const std::string& worker_id) const {
  if (!roster_.has_value() || !index_.contains(worker_id)) return nullptr;
  shoal::v1::CoordinatorMessage msg;
  *msg.mutable_member_update() = roster_->Full();
  return Share(std::move(msg));
}

// ----------------------------------------------------------------- Status

void Membership::FillWorker(const Member& m, bool active, absl::Time now,
                            shoal::v1::WorkerStatus* w) const {
  w->set_id(m.id);
  w->set_name(m.name);
  w->set_address(m.address);
  w->set_zone(m.zone);
  w->set_outbound_only(m.outbound_only);
  w->set_outbound_reason(m.outbound_reason);
  w->set_state(active && m.syncing ? "syncing" : MemberStateName(m.state));
  w->set_data_rank(m.data_rank);
  if (active) w->set_last_seen_ms_ago(absl::ToInt64Milliseconds(now - m.last_seen));
  if (active && m.syncing) {
    w->set_sync_bytes_done(m.sync_bytes_done);
    w->set_sync_bytes_total(m.sync_bytes_total);
    w->set_sync_sources(m.sync_sources);
  }
}

bool Membership::ConsistentForTesting() const {
  if (index_.size() != members_.size()) return false;
  for (const auto& [id, m] : members_) {
    auto it = index_.find(id);
    if (it == index_.end() || it->second != &m) return false;
  }
  return true;
}

}  // namespace shoal::coordinator
