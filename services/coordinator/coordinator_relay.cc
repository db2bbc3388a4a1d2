// CoordinatorService, the relay: a supernode's one stream carries its zone
// members' sessions and unary calls (docs/SUPERNODES.md "Relay").
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/coordinator_methods.h"
#include "common/logging.h"
#include "common/raw_service.h"
#include "common/reactor_handoff.h"
#include "common/status_util.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/core/request_limits.h"
#include "services/coordinator/relay_reactor.h"
#include "services/coordinator/stream_wire.h"

namespace shoal::coordinator {
namespace {

using shoal::v1::RelayedCall;
using shoal::v1::RelayedCallResult;
using shoal::v1::RelayUp;

void SetStatus(const absl::Status& s, RelayedCallResult* result) {
  result->set_code(static_cast<int32_t>(s.code()));
  result->set_message(std::string(s.message()));
}

}  // namespace

RelayReactor::RelayReactor(CoordinatorService* service, grpc::CallbackServerContext* ctx)
    : service_(service), ctx_(ctx) {
  ReactionScope reaction(this);
  BeforeStart(&in_bytes_);
  StartRead(&in_bytes_);
}

void RelayReactor::OnReadDone(bool ok) {
  ReactionScope reaction(this, &in_bytes_);
  // A message that does not parse ends the stream like a broken one.
  if (ok) ok = ParseMessage(&in_bytes_, &in_);
  if (!ok) {
    Broken("relay stream closed");
    Close(grpc::Status::OK);
    return;
  }
  if (relay_id_.empty()) {
    if (!in_.has_hello() || in_.hello().worker_id().empty()) {
      Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "the first relay message must carry a RelayHello with the relay's "
                         "worker_id"));
      return;
    }
    if (absl::Status s = CheckRequestText(in_.hello()); !s.ok()) {
      Close(ToGrpcStatus(s));
      return;
    }
    if (!service_->engine_->IsActive(in_.hello().worker_id())) {
      Close(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                         absl::StrCat("relay ", in_.hello().worker_id(),
                                      " is not a current member of the run; Join first")));
      return;
    }
    relay_id_ = in_.hello().worker_id();
    if (!service_->AddRelay(this)) return;
    SHOAL_LOG(INFO) << "relay opened by " << relay_id_ << " from " << ctx_->peer();
  } else if (in_.has_hello()) {
    Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "a relay stream carries one RelayHello, in its first message"));
    Broken("second RelayHello");
    return;
  }
  const size_t entries = in_.sessions_size() + in_.calls_size() + in_.gone_size();
  if (entries > service_->relay_limits_.max_batch) {
    Close(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("a RelayUp carries at most ", service_->relay_limits_.max_batch,
                     " sessions, calls and gone notices in all (--relay_max_batch); this one "
                     "has ",
                     entries)));
    Broken("oversized batch");
    return;
  }
  if (entries > 0) service_->HandleRelayBatch(this, in_);
  BeforeStart(&in_bytes_);
  StartRead(&in_bytes_);
}

void RelayReactor::OnCancel() {
  ReactionScope reaction(this);
  Broken("relay stream cancelled");
}

void RelayReactor::OnDone() {
  AfterAllReactions(this);
  Broken("relay stream ended");
  delete this;
}

void RelayReactor::Broken(const std::string& reason) {
  if (relay_id_.empty() || broken_.exchange(true)) return;
  SHOAL_LOG(INFO) << "relay " << relay_id_ << " gone (" << reason
                  << "); its members keep their lease until they re-open a session";
  service_->RemoveRelay(this);
}

CoordinatorService::BidiReactor* CoordinatorService::OpenRelay(grpc::CallbackServerContext* ctx) {
  return new RelayReactor(this, ctx);
}

bool CoordinatorService::AddRelay(RelayReactor* relay) {
  absl::MutexLock lock(&mu_);
  if (closing_) {
    relay->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
    return false;
  }
  relays_[relay];
  return true;
}

void CoordinatorService::RemoveRelay(RelayReactor* relay) {
  absl::MutexLock lock(&mu_);
  RemoveRelayLocked(relay);
}

void CoordinatorService::RemoveRelayLocked(RelayReactor* relay) {
  auto it = relays_.find(relay);
  if (it == relays_.end()) return;
  // Not Disconnect: the members stay in the run with the lease of their
  // last heartbeat, and directives for them wait in pending_ until they
  // re-open a session, directly or through another relay.
  for (const std::string& id : it->second) relayed_.erase(id);
  relays_.erase(it);
}

void CoordinatorService::EndRelayed(RelayReactor* relay, const std::string& worker_id,
                                    grpc::StatusCode code, const std::string& message) {
  RelayDownBuilder down;
  auto* ended = down.rest().add_ended();
  ended->set_worker_id(worker_id);
  ended->set_code(static_cast<int32_t>(code));
  ended->set_message(message);
  relay->Enqueue(down.Build());
}

absl::Status CoordinatorService::OpenRelayed(RelayReactor* relay, const shoal::v1::Hello& hello,
                                             SharedMessage first) {
  const std::string& worker_id = hello.worker_id();
  absl::MutexLock lock(&mu_);
  auto members = relays_.find(relay);
  if (members == relays_.end()) return absl::UnavailableError("the relay stream is closing");
  auto current = relayed_.find(worker_id);
  const bool here = current != relayed_.end() && current->second == relay;
  if (!here && members->second.size() >= relay_limits_.max_members) {
    return absl::ResourceExhaustedError(
        absl::StrCat("relay ", relay->relay_id(), " carries ", members->second.size(),
                     " members (--relay_max_members=", relay_limits_.max_members,
                     "); open this member's session directly or through another relay"));
  }
  CloseDirectLocked(worker_id, grpc::Status(grpc::StatusCode::ABORTED,
                                            absl::StrCat("superseded by a session through relay ",
                                                         relay->relay_id())));
  if (current != relayed_.end() && !here) {
    relays_[current->second].erase(worker_id);
    EndRelayed(current->second, worker_id, grpc::StatusCode::ABORTED,
               absl::StrCat("superseded by a session through relay ", relay->relay_id()));
  }
  if (!engine_->IsActive(worker_id)) {
    if (current != relayed_.end()) relayed_.erase(worker_id);
    members->second.erase(worker_id);
    return absl::NotFoundError("worker was removed from the run; Join again");
  }
  relayed_[worker_id] = relay;
  members->second.insert(worker_id);
  // The member list first, then what its last relayed session did not
  // deliver, then what was kept for the member while it had no session (as
  // a direct session's Register does). All of it is this session's, logged.
  std::vector<grpc::ByteBuffer> resent = ResumeLocked(worker_id, hello);
  if (hello.session() != 0) relayed_logs_[worker_id].session = hello.session();
  grpc::ByteBuffer first_bytes;
  std::vector<grpc::ByteBuffer> kept;
  RelayDownBuilder down;
  if (first != nullptr) {
    first_bytes = SerializeMessage(*first);
    down.AddDirective(&first_bytes, worker_id);
    LogRelayedLocked(worker_id, {first, {}, false});
  }
  if (auto pending = pending_.find(worker_id); pending != pending_.end()) {
    kept.assign(std::make_move_iterator(pending->second.begin()),
                std::make_move_iterator(pending->second.end()));
    pending_.erase(pending);
  }
  for (std::vector<grpc::ByteBuffer>* list : {&resent, &kept}) {
    for (const grpc::ByteBuffer& bytes : *list) {
      down.AddDirective(&bytes, worker_id);
      LogRelayedLocked(worker_id, {nullptr, bytes, true});
    }
  }
  if (!down.empty()) relay->Enqueue(down.Build());
  return absl::OkStatus();
}

void CoordinatorService::LogRelayedLocked(const std::string& worker_id, LoggedDirective entry) {
  auto it = relayed_logs_.find(worker_id);
  if (it == relayed_logs_.end()) return;
  RelayedLog& log = it->second;
  log.entries.push_back(std::move(entry));
  if (log.entries.size() > kMaxRelayedLog) {
    log.entries.pop_front();
    ++log.base;
  }
}

std::vector<grpc::ByteBuffer> CoordinatorService::ResumeLocked(const std::string& worker_id,
                                                               const shoal::v1::Hello& hello) {
  std::vector<grpc::ByteBuffer> out;
  auto it = relayed_logs_.find(worker_id);
  if (it == relayed_logs_.end()) return out;
  RelayedLog log = std::move(it->second);
  relayed_logs_.erase(it);
  const shoal::v1::SessionResume* taken = nullptr;
  for (const shoal::v1::SessionResume& r : hello.resume()) {
    if (r.session() == log.session) taken = &r;
  }
  // A Hello that does not count that session (a worker without the
  // relay's resume, or one whose count belongs to another session): the
  // session's directives are not sent again.
  if (taken == nullptr) return out;
  const uint64_t received = taken->received();
  const uint64_t sent = log.base + log.entries.size();
  if (received < log.base) {
    SHOAL_LOG(WARNING) << worker_id << " took " << received << " directives of its relayed "
                       << "session; the first " << log.base - received << " it missed are past the "
                       << kMaxRelayedLog << " kept and are not sent again";
  }
  for (uint64_t i = std::max(received, log.base); i < sent; ++i) {
    const LoggedDirective& entry = log.entries[i - log.base];
    if (!entry.resend) continue;
    if (entry.message == nullptr) {
      out.push_back(entry.bytes);
      continue;
    }
    // The open of the new session sends the current member list and route.
    if (entry.message->has_member_update() || entry.message->has_use_relay()) continue;
    out.push_back(SerializeMessage(*entry.message));
  }
  if (received < sent) {
    SHOAL_LOG(INFO) << worker_id << "'s relayed session ended with " << sent - received
                    << " directives undelivered; " << out.size()
                    << " go out again on its new session";
  }
  return out;
}

bool CoordinatorService::RoutedThrough(RelayReactor* relay, const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = relayed_.find(worker_id);
  return it != relayed_.end() && it->second == relay;
}

bool CoordinatorService::DropRelayed(RelayReactor* relay, const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = relayed_.find(worker_id);
  if (it == relayed_.end() || it->second != relay) return false;
  relayed_.erase(it);
  relays_[relay].erase(worker_id);
  return true;
}

void CoordinatorService::HandleRelayBatch(RelayReactor* relay, const RelayUp& up) {
  RelayDownBuilder down;  // results and ended sessions for this relay
  auto end = [&down](const std::string& id, const absl::Status& s) {
    auto* ended = down.rest().add_ended();
    ended->set_worker_id(id);
    ended->set_code(static_cast<int32_t>(s.code()));
    ended->set_message(std::string(s.message()));
  };
  Directives out;
  for (const shoal::v1::RelayedSessionMessage& m : up.sessions()) {
    const std::string& id = m.worker_id();
    // The limits hold on the relay path as on the direct one
    // (core/request_limits.h): the entry is refused, the stream goes on.
    if (absl::Status s = CheckRequestText(m); !s.ok()) {
      end(id, s);
      continue;
    }
    if (m.message().has_hello()) {
      if (id.empty() || m.message().hello().worker_id() != id) {
        end(id, absl::InvalidArgumentError(
                    "a relayed Hello must name the member it comes from (worker_id)"));
        continue;
      }
      absl::Status s = engine_->Connect(id);
      if (s.ok()) s = OpenRelayed(relay, m.message().hello(), engine_->MemberList(id));
      if (!s.ok()) {
        end(id, s);
        continue;
      }
      if (SharedMessage finished = engine_->FinishedNotice(id)) out.push_back({id, finished});
      SHOAL_VLOG(1) << "session of " << id << " opened through relay " << relay->relay_id();
    } else if (m.message().has_heartbeat()) {
      if (!RoutedThrough(relay, id)) {
        end(id,
            absl::PermissionDeniedError(absl::StrCat(id, " has no session through relay ",
                                                     relay->relay_id(), "; send its Hello first")));
        continue;
      }
      absl::Status s = engine_->Heartbeat(id, m.message().heartbeat());
      if (!s.ok()) {
        DropRelayed(relay, id);
        end(id, s);
      }
    }
  }
  for (const RelayedCall& call : up.calls()) {
    *down.rest().add_results() = HandleRelayedCall(relay, call, &out);
  }
  for (const shoal::v1::RelayedMemberGone& gone : up.gone()) {
    if (absl::Status s = CheckRequestText(gone); !s.ok()) {
      SHOAL_VLOG(1) << "relay " << relay->relay_id() << ": gone notice refused: " << s;
      continue;
    }
    // Only the route that currently speaks for the member counts.
    if (!DropRelayed(relay, gone.worker_id())) continue;
    // A member the coordinator has routed away from this relay (a new
    // supernode, or direct) ends its stream here on purpose as it moves: it
    // keeps its lease and re-opens on its new route, as the members of a
    // relay that goes away do. Without this, a supernode elected while its
    // own session ran through the old one was removed as lost.
    if (SharedMessage route = engine_->RelayRoute(gone.worker_id());
        route != nullptr && route->use_relay().relay_id() != relay->relay_id()) {
      SHOAL_LOG(INFO) << "relayed session of " << gone.worker_id() << " through "
                      << relay->relay_id() << " ended as it moves to "
                      << (route->use_relay().relay_id().empty() ? std::string("direct")
                                                                : route->use_relay().relay_id())
                      << "; it keeps its lease";
      continue;
    }
    Directives left = engine_->Disconnect(
        gone.worker_id(), gone.reason().empty() ? "its link to the relay broke" : gone.reason(),
        RoundEngine::SessionEnd::kBroken);
    out.insert(out.end(), std::make_move_iterator(left.begin()),
               std::make_move_iterator(left.end()));
  }
  // The whole batch's directives at once (one RelayDown per relay), then
  // the results: a call's directives reach the relay before its result.
  if (down.empty()) {
    Deliver(out);
    return;
  }
  Deliver(out, [this, relay, results = down.Build()] {
    // Perhaps later, on the record's writer thread: only to a relay still
    // open (a relay is forgotten under mu_ before its reactor goes).
    absl::MutexLock lock(&mu_);
    if (relays_.contains(relay)) relay->Enqueue(results);
  });
}

RelayedCallResult CoordinatorService::HandleRelayedCall(RelayReactor* relay,
                                                        const RelayedCall& call, Directives* out) {
  RelayedCallResult result;
  result.set_call_id(call.call_id());
  const std::string& id = call.worker_id();
  // Its worker_id and method (its request's fields when the table runs it).
  if (absl::Status s = CheckRequestText(call); !s.ok()) {
    SetStatus(s, &result);
    return result;
  }
  if (!RoutedThrough(relay, id) || !engine_->IsActive(id)) {
    SetStatus(absl::PermissionDeniedError(
                  absl::StrCat("'", id, "' is not a current member with a session through relay ",
                               relay->relay_id(), "; open its session (Hello) through it first")),
              &result);
    return result;
  }
  if (call.method().empty()) {
    SetStatus(absl::InvalidArgumentError("a RelayedCall names no method"), &result);
    return result;
  }
  const google::protobuf::MethodDescriptor* method =
      CoordinatorDescriptor().FindMethodByName(call.method());
  if (method == nullptr || !IsRelayed(*method)) {
    SetStatus(absl::UnimplementedError(
                  absl::StrCat("the relay carries the calls of relayed methods only; ",
                               method == nullptr ? "there is no Coordinator method " : "",
                               call.method(), method == nullptr ? "" : " is made directly")),
              &result);
    return result;
  }
  // The same work as the direct RPC (the table's entry; CheckMethods made
  // sure a relayed method has a unary one), after checking that the
  // request is the member's own.
  grpc::ByteBuffer response;
  absl::Status s = Methods()[method->index()].unary(this, StringToByteBuffer(call.request()), id,
                                                    &response, out);
  SetStatus(s, &result);
  if (s.ok()) result.set_response(ByteBufferToString(response));
  // The member left (Leave): its route goes (Tick would drop it at the
  // next departure anyway).
  if (s.ok() && !engine_->IsActive(id)) DropRelayed(relay, id);
  return result;
}

}  // namespace shoal::coordinator
