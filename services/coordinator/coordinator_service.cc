#include "services/coordinator/coordinator_service.h"

#include <deque>
#include <map>
#include <set>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/coordinator_methods.h"
#include "common/logging.h"
#include "common/model_file.h"
#include "common/queued_stream.h"
#include "common/raw_service.h"
#include "common/reactor_handoff.h"
#include "common/status_util.h"
#include "services/coordinator/core/request_limits.h"
#include "services/coordinator/relay_reactor.h"
#include "services/coordinator/stream_wire.h"

namespace shoal::coordinator {
namespace {

using shoal::v1::CoordinatorMessage;
using shoal::v1::WorkerMessage;

}  // namespace

// One worker's session stream. Reads Hello then heartbeats; writes the
// directives queued by Enqueue, one at a time (QueuedStream). Deletes itself
// in OnDone. Raw: reads parse WorkerMessages here, writes send bytes
// serialized once per broadcast by Deliver.
class SessionReactor : public QueuedStream {
 public:
  SessionReactor(CoordinatorService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx) {
    ReactionScope reaction(this);
    BeforeStart(&in_bytes_);
    StartRead(&in_bytes_);
  }

  void OnReadDone(bool ok) override {
    ReactionScope reaction(this, &in_bytes_);
    // A message that does not parse ends the stream like a broken one (the
    // typed API reports it as a failed read).
    if (ok) ok = ParseMessage(&in_bytes_, &in_);
    if (!ok) {
      // The worker closed its side or the connection broke.
      Lost("session stream closed");
      Close(grpc::Status::OK);
      return;
    }
    // What a stranger may send (core/request_limits.h): a Hello or a
    // heartbeat over the limits ends the session, as a malformed one does.
    if (absl::Status s = CheckRequestText(in_); !s.ok()) {
      Lost("session message over the limits");
      Close(ToGrpcStatus(s));
      return;
    }
    if (worker_id_.empty()) {
      if (!in_.has_hello() || in_.hello().worker_id().empty()) {
        Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "the first session message must be a Hello with the worker_id"));
        return;
      }
      absl::Status s = service_->engine_->Connect(in_.hello().worker_id());
      if (!s.ok()) {
        Close(ToGrpcStatus(s));
        return;
      }
      {
        // OnCancel (Lost) may read it meanwhile, on another thread.
        absl::MutexLock lock(&id_mu_);
        worker_id_ = in_.hello().worker_id();
      }
      // Member credentials: the current list first (updates after it may
      // arrive in any order; docs/SECURITY.md).
      if (SharedMessage list = service_->engine_->MemberList(worker_id_))
        Enqueue(SerializeMessage(*list));
      // --relay=on: where this member's control plane should go.
      if (SharedMessage route = service_->engine_->RelayRoute(worker_id_))
        Enqueue(SerializeMessage(*route));
      if (SharedMessage finished = service_->engine_->FinishedNotice(worker_id_))
        Enqueue(SerializeMessage(*finished));
      service_->Register(worker_id_, in_.hello(), this);
      SHOAL_VLOG(1) << "session opened by " << worker_id_ << " from " << ctx_->peer();
    } else if (in_.has_heartbeat()) {
      absl::Status s = service_->engine_->Heartbeat(worker_id_, in_.heartbeat());
      if (!s.ok()) {
        Close(ToGrpcStatus(s));
        return;
      }
    }
    BeforeStart(&in_bytes_);
    StartRead(&in_bytes_);
  }

  void OnCancel() override {
    ReactionScope reaction(this);
    Lost("session cancelled");
  }

  void OnDone() override {
    AfterAllReactions(this);
    if (!worker_id_.empty()) service_->Unregister(worker_id_, this);
    delete this;
  }

 private:
  void Lost(const std::string& reason) {
    std::string worker_id;
    {
      absl::MutexLock lock(&id_mu_);
      worker_id = worker_id_;
    }
    if (worker_id.empty() || lost_.exchange(true)) return;
    // Only the session currently registered for the worker speaks for it.
    if (service_->Unregister(worker_id, this)) {
      service_->Deliver(
          service_->engine_->Disconnect(worker_id, reason, RoundEngine::SessionEnd::kBroken));
    }
  }

  CoordinatorService* const service_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer in_bytes_;  // read path only
  WorkerMessage in_;
  // Set once by the read path (under id_mu_, which Lost reads it under;
  // the read path itself reads it without).
  absl::Mutex id_mu_;
  std::string worker_id_;
  std::atomic<bool> lost_{false};
};

CoordinatorService::~CoordinatorService() { CloseAllSessions(); }

void CoordinatorService::Register(const std::string& worker_id, const shoal::v1::Hello& hello,
                                  SessionReactor* session) {
  SessionReactor* old = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) {
      session->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
      return;
    }
    auto& slot = sessions_[worker_id];
    old = slot;
    slot = session;
    if (old != nullptr) {
      old->Close(grpc::Status(grpc::StatusCode::ABORTED, "superseded by a newer session"));
    }
    // A member that re-opens directly (its relay broke, or it left it).
    if (auto relayed = relayed_.find(worker_id); relayed != relayed_.end()) {
      RelayReactor* relay = relayed->second;
      relays_[relay].erase(worker_id);
      relayed_.erase(relayed);
      EndRelayed(relay, worker_id, grpc::StatusCode::ABORTED, "superseded by a direct session");
    }
    // What its last relayed session did not deliver, then the directives
    // sent while it had no session, before the Hello was processed.
    for (grpc::ByteBuffer& bytes : ResumeLocked(worker_id, hello)) session->Enqueue(bytes);
    auto pending = pending_.find(worker_id);
    if (pending != pending_.end()) {
      for (auto& msg : pending->second) session->Enqueue(std::move(msg));
      pending_.erase(pending);
    }
    // Removed between its Hello and now: Tick only looks again after the
    // next departure, so close it here (what Tick would have done).
    if (!engine_->IsActive(worker_id)) {
      sessions_.erase(worker_id);
      session->Close(
          grpc::Status(grpc::StatusCode::NOT_FOUND, "worker was removed from the run; Join again"));
    }
  }
}

bool CoordinatorService::Unregister(const std::string& worker_id, SessionReactor* session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end() || it->second != session) return false;
  sessions_.erase(it);
  return true;
}

void CoordinatorService::Deliver(const Directives& directives, std::function<void()> then) {
  if (record_.writer == nullptr) {
    // No writer thread (tests): the record is written here, as before.
    if (record_.write) record_.write();
    Send(directives);
    if (then) then();
    return;
  }
  {
    absl::MutexLock lock(&order_mu_);
    if (!waiting_.empty() || (record_.current && !record_.current())) {
      // The record that produced these directives is not written yet (or
      // directives queued before wait for it): they and the answer wait on
      // the writer's thread.
      waiting_.push_back({directives, std::move(then)});
      if (waiting_.size() == 1) record_.writer->Post([this] { SendWaiting(); });
      return;
    }
    // Under order_mu_: nothing queued after this overtakes it.
    Send(directives);
  }
  if (then) then();
}

void CoordinatorService::SendWaiting() {
  std::deque<Waiting> batch;
  for (;;) {
    if (record_.write) record_.write();
    absl::MutexLock lock(&order_mu_);
    // Changed again while it was written: directives queued meanwhile may
    // come from that change, so the write comes first again.
    if (record_.current && !record_.current()) continue;
    batch.swap(waiting_);
    for (const Waiting& w : batch) Send(w.directives);
    break;
  }
  for (Waiting& w : batch) {
    if (w.then) w.then();
  }
}

void CoordinatorService::Send(const Directives& directives) {
  if (directives.empty()) return;
  // Each distinct message once, before taking the lock: a broadcast's
  // recipients share one message object, and now its bytes as well.
  absl::flat_hash_map<const CoordinatorMessage*, grpc::ByteBuffer> wire;
  for (const Directive& d : directives) {
    auto [it, inserted] = wire.try_emplace(d.message.get());
    if (inserted) it->second = SerializeMessage(*d.message);
  }
  absl::MutexLock lock(&mu_);
  // One RelayDown per relay (a node map: the builders hold pointers into
  // their own maps).
  absl::node_hash_map<RelayReactor*, RelayDownBuilder> downs;
  for (const Directive& d : directives) {
    const grpc::ByteBuffer& bytes = wire.at(d.message.get());
    auto it = sessions_.find(d.worker_id);
    if (it == sessions_.end() && !relayed_.empty()) {
      if (auto relayed = relayed_.find(d.worker_id); relayed != relayed_.end()) {
        downs[relayed->second].AddDirective(&bytes, d.worker_id);
        LogRelayedLocked(d.worker_id, {d.message, {}, true});
        continue;
      }
    }
    if (it == sessions_.end()) {
      // A worker may call JoinRound before its session's Hello is processed:
      // keep its directives until the session registers (bounded).
      if (engine_->IsActive(d.worker_id)) {
        auto& queue = pending_[d.worker_id];
        queue.push_back(bytes);
        if (queue.size() > kMaxPending) queue.pop_front();
      } else {
        SHOAL_VLOG(1) << "no session for " << d.worker_id << "; directive dropped";
      }
      continue;
    }
    it->second->Enqueue(bytes);
  }
  for (auto& [relay, down] : downs) relay->Enqueue(down.Build());
}

void CoordinatorService::Tick() {
  // The sessions of departed members close after the tick's directives went
  // out (a stream closes after what was queued on it).
  Deliver(engine_->Tick(), [this] { CloseDeparted(); });
}

void CoordinatorService::CloseDeparted() {
  // Close the sessions of workers the engine no longer knows (evicted).
  // Only after a departure: otherwise every tick took the engine lock once
  // per session (1,000 times every 250 ms at 1,000 workers) to find none.
  const uint64_t departures = engine_->departures();
  absl::MutexLock lock(&mu_);
  if (departures == departures_seen_) return;
  departures_seen_ = departures;
  for (auto it = pending_.begin(); it != pending_.end();) {
    // absl's erase(iterator) invalidates only the erased element.
    if (engine_->IsActive(it->first)) {
      ++it;
    } else {
      pending_.erase(it++);
    }
  }
  for (auto it = relayed_logs_.begin(); it != relayed_logs_.end();) {
    if (engine_->IsActive(it->first)) {
      ++it;
    } else {
      relayed_logs_.erase(it++);
    }
  }
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!engine_->IsActive(it->first)) {
      it->second->Close(
          grpc::Status(grpc::StatusCode::NOT_FOUND, "worker was removed from the run; Join again"));
      sessions_.erase(it++);
    } else {
      ++it;
    }
  }
  // Relays whose own worker left end (their members' routes go with them;
  // the members keep their lease); relayed members that left end.
  std::vector<RelayReactor*> gone_relays;
  for (const auto& [relay, members] : relays_) {
    if (!engine_->IsActive(relay->relay_id())) gone_relays.push_back(relay);
  }
  for (RelayReactor* relay : gone_relays) {
    RemoveRelayLocked(relay);
    relay->Close(grpc::Status(grpc::StatusCode::NOT_FOUND,
                              "the relay's worker was removed from the run; Join again"));
  }
  for (auto it = relayed_.begin(); it != relayed_.end();) {
    if (!engine_->IsActive(it->first)) {
      relays_[it->second].erase(it->first);
      EndRelayed(it->second, it->first, grpc::StatusCode::NOT_FOUND,
                 "worker was removed from the run; Join again");
      relayed_.erase(it++);
    } else {
      ++it;
    }
  }
}

void CoordinatorService::CloseDirectLocked(const std::string& worker_id,
                                           const grpc::Status& status) {
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end()) return;
  it->second->Close(status);
  sessions_.erase(it);
}

void CoordinatorService::CloseAllSessions() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  for (auto& [id, session] : sessions_) {
    session->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
  }
  sessions_.clear();
  for (auto& [relay, members] : relays_) {
    relay->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
  }
  relays_.clear();
  relayed_.clear();
}

// ---------------------------------------------------------------- the table

namespace {

// The request and response types of a unary work function.
template <typename T>
struct WorkOf;
template <typename Req, typename Resp>
struct WorkOf<absl::Status (CoordinatorService::*)(const Req&, Resp*, Directives*)> {
  using Request = Req;
  using Response = Resp;
};

}  // namespace

template <auto Work>
absl::Status CoordinatorService::RunUnary(CoordinatorService* service,
                                          const grpc::ByteBuffer& bytes, const std::string& member,
                                          grpc::ByteBuffer* response, Directives* out) {
  using Request = typename WorkOf<decltype(Work)>::Request;
  using Response = typename WorkOf<decltype(Work)>::Response;
  Request request;
  grpc::ByteBuffer copy(bytes);  // parsing consumes it; copies share the slices
  if (!ParseMessage(&copy, &request)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse the request as ", Request::descriptor()->full_name()));
  }
  // The limits of what a client sends, for the direct and the relayed call
  // alike (core/request_limits.h).
  RETURN_IF_ERROR(CheckRequestText(request));
  // A relayed call: the relay speaks for `member` only.
  if (!member.empty() && RequestMember(request) != member) {
    return absl::InvalidArgumentError(absl::StrCat("the request's worker_id '",
                                                   RequestMember(request),
                                                   "' is not the relayed call's '", member, "'"));
  }
  if constexpr (std::is_same_v<Response, grpc::ByteBuffer>) {
    return (service->*Work)(request, response, out);
  } else {
    Response typed;
    absl::Status s = (service->*Work)(request, &typed, out);
    if (s.ok()) *response = SerializeMessage(typed);
    return s;
  }
}

const std::map<std::string, CoordinatorService::Method>& CoordinatorService::MethodsByName() {
  static const std::map<std::string, Method>* const by_name = [] {
    // Adding an RPC: the proto, an entry here and its work below.
    auto unary = [](Method::Unary work, bool read_only = false) {
      Method m;
      m.unary = work;
      m.read_only = read_only;
      return m;
    };
    auto stream = [](Method::Stream open) {
      Method m;
      m.stream = open;
      return m;
    };
    Method join;
    join.async = &CoordinatorService::StartJoin;
    join.counts_as_join = true;
    Method status = unary(&RunUnary<&CoordinatorService::DoGetRunStatus>, /*read_only=*/true);
    status.standby_answers = true;
    return new std::map<std::string, Method>{
        {"Join", join},
        {"Session", stream(&CoordinatorService::OpenSession)},
        {"JoinRound", unary(&RunUnary<&CoordinatorService::DoJoinRound>)},
        {"ReportReady", unary(&RunUnary<&CoordinatorService::DoReportReady>)},
        {"ReportRoundDone", unary(&RunUnary<&CoordinatorService::DoReportRoundDone>)},
        {"ConnectionsReady", unary(&RunUnary<&CoordinatorService::DoConnectionsReady>)},
        {"ReportCheckpoint", unary(&RunUnary<&CoordinatorService::DoReportCheckpoint>)},
        {"ReportAudit", unary(&RunUnary<&CoordinatorService::DoReportAudit>)},
        {"Leave", unary(&RunUnary<&CoordinatorService::DoLeave>)},
        {"Relay", stream(&CoordinatorService::OpenRelay)},
        {"GetRunStatus", status},
        {"GetModelFile", unary(&RunUnary<&CoordinatorService::DoGetModelFile>, /*read_only=*/true)},
    };
  }();
  return *by_name;
}

const std::vector<CoordinatorService::Method>& CoordinatorService::Methods() {
  static const std::vector<Method>* const table = [] {
    const google::protobuf::ServiceDescriptor& service = CoordinatorDescriptor();
    // A method without an entry stays empty (UNIMPLEMENTED; CheckMethods
    // refuses to start with one).
    auto* table = new std::vector<Method>(service.method_count());
    for (int i = 0; i < service.method_count(); ++i) {
      auto it = MethodsByName().find(service.method(i)->name());
      if (it != MethodsByName().end()) (*table)[i] = it->second;
    }
    return table;
  }();
  return *table;
}

absl::Status CoordinatorService::CheckMethods() {
  const google::protobuf::ServiceDescriptor& service = CoordinatorDescriptor();
  RETURN_IF_ERROR(CheckRelayedMethods(service));
  for (const auto& [name, method] : MethodsByName()) {
    if (service.FindMethodByName(name) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("CoordinatorService's method table serves ",
                                                        name, ", which ", service.full_name(),
                                                        " does not have"));
    }
  }
  for (int i = 0; i < service.method_count(); ++i) {
    const MethodDescriptor& method = *service.method(i);
    const Method& m = Methods()[i];
    const bool bidi = method.client_streaming() && method.server_streaming();
    const bool unary = !method.client_streaming() && !method.server_streaming();
    if ((unary && m.unary == nullptr && m.async == nullptr) || (bidi && m.stream == nullptr) ||
        (!unary && !bidi)) {
      return absl::FailedPreconditionError(absl::StrCat(
          method.full_name(), " has no entry of its kind in CoordinatorService's method table"));
    }
    if (IsRelayed(method) && m.unary == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(method.full_name(),
                       " is relayed but not served by a unary work function (a relayed call "
                       "is answered within its batch)"));
    }
  }
  return absl::OkStatus();
}

bool CoordinatorService::CountsAsJoin(const MethodDescriptor& method) {
  return Methods()[method.index()].counts_as_join;
}

bool CoordinatorService::StandbyAnswers(const MethodDescriptor& method) {
  return Methods()[method.index()].standby_answers;
}

grpc::ServerUnaryReactor* CoordinatorService::Call(const MethodDescriptor& method,
                                                   grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  const Method& m = Methods()[method.index()];
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (m.async != nullptr) {
    (this->*m.async)(*request, response, reactor);
    return reactor;
  }
  if (m.unary == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 absl::StrCat(method.full_name(), " is not served")));
    return reactor;
  }
  // The work, then its directives out, then the answer (both after the
  // record's write when the work changed it).
  Directives out;
  const absl::Status s = m.unary(this, *request, /*member=*/"", response, &out);
  if (m.read_only) {
    reactor->Finish(ToGrpcStatus(s));
  } else {
    Deliver(out, [reactor, s] { reactor->Finish(ToGrpcStatus(s)); });
  }
  return reactor;
}

CoordinatorService::BidiReactor* CoordinatorService::Open(const MethodDescriptor& method,
                                                          grpc::CallbackServerContext* ctx) {
  const Method& m = Methods()[method.index()];
  if (m.stream == nullptr) {
    return new FinishedStream(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                           absl::StrCat(method.full_name(), " is not served")));
  }
  return (this->*m.stream)(ctx);
}

// ---------------------------------------------------------------- the methods

CoordinatorService::BidiReactor* CoordinatorService::OpenSession(grpc::CallbackServerContext* ctx) {
  return new SessionReactor(this, ctx);
}

void CoordinatorService::StartJoin(const grpc::ByteBuffer& bytes, grpc::ByteBuffer* response,
                                   grpc::ServerUnaryReactor* reactor) {
  shoal::v1::JoinRequest request;
  grpc::ByteBuffer copy(bytes);
  if (!ParseMessage(&copy, &request)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "cannot parse the request as shoal.v1.JoinRequest"));
    return;
  }
  if (absl::Status s = CheckRequestText(request); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return;
  }
  // Can the others reach it? A worker behind NAT cannot accept connections
  // (docs/SUPERNODES.md "NAT"): it takes part with outbound ones only. A
  // refused or unreachable address answers at once; only a silently
  // dropped one takes the whole timeout, on the prober's thread: this
  // gRPC thread returns now and the probe's completion finishes the call.
  const absl::Duration timeout = engine_->join_probe_timeout();
  if (prober_ == nullptr || timeout <= absl::ZeroDuration() || request.outbound_only()) {
    FinishJoin(request, "", response, reactor);
    return;
  }
  const std::string address = request.peer_address();
  prober_->Probe(
      address, timeout,
      [this, request = std::move(request), response, reactor](absl::Status probe) {
        if (absl::IsCancelled(probe)) {
          reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
          return;
        }
        FinishJoin(request, probe.ok() ? "" : std::string(probe.message()), response, reactor);
      });
}

void CoordinatorService::FinishJoin(const shoal::v1::JoinRequest& request,
                                    const std::string& unreachable, grpc::ByteBuffer* response,
                                    grpc::ServerUnaryReactor* reactor) {
  absl::StatusOr<JoinResult> result = engine_->Join(request, unreachable);
  if (!result.ok()) {
    reactor->Finish(ToGrpcStatus(result.status()));
    return;
  }
  {
    // A worker that joins (again) starts afresh: what its earlier relayed
    // session did not deliver belongs to the membership it had.
    absl::MutexLock lock(&mu_);
    relayed_logs_.erase(result->response.worker_id());
  }
  *response = SerializeMessage(result->response);
  // Answered once the record holds the new member (its id is never given
  // twice, even across a restart).
  Deliver(result->directives, [reactor] { reactor->Finish(grpc::Status::OK); });
}

absl::Status CoordinatorService::DoJoinRound(const shoal::v1::JoinRoundRequest& request,
                                             shoal::v1::JoinRoundResponse* response,
                                             Directives* out) {
  absl::StatusOr<uint64_t> admitted =
      engine_->JoinRound(request.worker_id(), request.round(), out, request.carried_round());
  if (admitted.ok()) response->set_admitted_round(*admitted);
  return admitted.status();
}

absl::Status CoordinatorService::DoReportReady(const shoal::v1::ReportReadyRequest& request,
                                               shoal::v1::ReportReadyResponse* /*response*/,
                                               Directives* out) {
  return engine_->ReportReady(request, out);
}

absl::Status CoordinatorService::DoConnectionsReady(
    const shoal::v1::ConnectionsReadyRequest& request,
    shoal::v1::ConnectionsReadyResponse* /*response*/, Directives* out) {
  return engine_->ConnectionsReady(request, out);
}

absl::Status CoordinatorService::DoReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request,
                                                   shoal::v1::ReportRoundDoneResponse* /*response*/,
                                                   Directives* out) {
  return engine_->ReportRoundDone(request, out);
}

absl::Status CoordinatorService::DoReportAudit(const shoal::v1::ReportAuditRequest& request,
                                               shoal::v1::ReportAuditResponse* /*response*/,
                                               Directives* out) {
  return engine_->ReportAudit(request, out);
}

absl::Status CoordinatorService::DoReportCheckpoint(
    const shoal::v1::ReportCheckpointRequest& request,
    shoal::v1::ReportCheckpointResponse* /*response*/, Directives* out) {
  return engine_->ReportCheckpoint(request, out);
}

absl::Status CoordinatorService::DoLeave(const shoal::v1::LeaveRequest& request,
                                         shoal::v1::LeaveResponse* /*response*/, Directives* out) {
  // NOT_FOUND for unknown ids.
  absl::Status s = engine_->Heartbeat(request.worker_id(), shoal::v1::Heartbeat());
  if (!s.ok()) return s;
  Directives left = engine_->Disconnect(request.worker_id(),
                                        request.reason().empty() ? "left" : request.reason());
  out->insert(out->end(), std::make_move_iterator(left.begin()),
              std::make_move_iterator(left.end()));
  return absl::OkStatus();
}

absl::Status CoordinatorService::DoGetModelFile(const shoal::v1::GetModelFileRequest& request,
                                                shoal::v1::ModelFileChunk* response,
                                                Directives* /*out*/) {
  absl::StatusOr<shoal::v1::ModelFileChunk> piece =
      ServeModelFilePiece(model_file_, model_file_sha256_, request);
  if (!piece.ok()) return piece.status();
  *response = std::move(*piece);
  return absl::OkStatus();
}

absl::Status CoordinatorService::DoGetRunStatus(const shoal::v1::GetRunStatusRequest& /*request*/,
                                                grpc::ByteBuffer* response, Directives* /*out*/) {
  // A status lists every member (O(N) to build and to serialize, under the
  // engine lock for the build): rebuild it only when the engine reports a
  // change or the cached one is older than kStatusMaxAge, and share its
  // bytes with every caller in between.
  absl::MutexLock lock(&status_mu_);
  const absl::Time now = clock_->Now();
  const grpc::ByteBuffer* cached = status_cache_.Get(engine_->status_version(), now);
  if (cached == nullptr) {
    uint64_t version = 0;
    shoal::v1::RunStatus status = engine_->Status(&version);
    status.MergeFrom(status_extra_);
    FillRelayedBy(&status);
    cached = &status_cache_.Put(version, now, SerializeMessage(status));
  }
  *response = *cached;
  return absl::OkStatus();
}

void CoordinatorService::FillRelayedBy(shoal::v1::RunStatus* status) {
  absl::MutexLock lock(&mu_);
  if (relayed_.empty()) return;
  for (shoal::v1::WorkerStatus& w : *status->mutable_workers()) {
    auto it = relayed_.find(w.id());
    if (it != relayed_.end()) w.set_relayed_by(it->second->relay_id());
  }
}

}  // namespace shoal::coordinator
