#include "services/worker/relay_frontend.h"

#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/coordinator_methods.h"
#include "common/logging.h"
#include "common/member_credentials_grpc.h"
#include "common/queued_stream.h"
#include "common/reactor_handoff.h"
#include "common/status_util.h"
#include "services/worker/coordinator_client.h"

namespace shoal::worker {

namespace {

using shoal::v1::CoordinatorMessage;
using shoal::v1::RelayDown;
using shoal::v1::RelayedCall;
using shoal::v1::RelayedCallResult;
using shoal::v1::RelayUp;
using shoal::v1::WorkerMessage;

grpc::ByteBuffer Serialize(const google::protobuf::MessageLite& message) {
  grpc::ByteBuffer out;
  bool own = false;
  grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::MessageLite>(message, &out,
                                                                                 &own);
  return out;
}

// The worker id of an x-shoal-member value "<worker_id>:<credential>".
std::string CredentialWorker(const grpc::CallbackServerContext* ctx) {
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kMemberMetadataKey);
  if (it == metadata.end()) return "";
  absl::string_view value(it->second.data(), it->second.size());
  return std::string(value.substr(0, value.find(':')));
}

// How long the reader lets a write in flight return after the coordinator
// ended the stream before it cancels the call.
constexpr absl::Duration kWriteDrainTimeout = absl::Seconds(2);

grpc::Status Unavailable(const std::string& why) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, why);
}

}  // namespace

// One Relay stream with the coordinator. The pump writes (under write_mu),
// the reader thread reads, then finishes under write_mu.
struct RelayFrontend::Uplink {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<RelayUp, RelayDown>> stream;
  absl::Mutex write_mu;
  bool finished ABSL_GUARDED_BY(write_mu) = false;
  // Set by the pump around its Write (inside write_mu): the reader waits on
  // it without taking write_mu.
  absl::Mutex writing_mu;
  bool writing ABSL_GUARDED_BY(writing_mu) = false;
  bool ended ABSL_GUARDED_BY(writing_mu) = false;  // the reader saw the end
  bool hello_sent = false;                         // pump only, under RelayFrontend::mu_
  size_t target = 0;                               // set before the reader starts
  std::thread reader;
};

// A member's Session, served here: its Hello opens the member's relayed
// session, its heartbeats follow it; directives come back through the
// QueuedStream. Deletes itself in OnDone.
class RelayFrontend::MemberStream : public QueuedStream {
 public:
  MemberStream(RelayFrontend* frontend, std::string credential_worker)
      : frontend_(frontend), credential_worker_(std::move(credential_worker)) {
    ReactionScope reaction(this);
    BeforeStart(&in_);
    StartRead(&in_);
  }

  const std::string& worker_id() const { return worker_id_; }

  void OnReadDone(bool ok) override {
    ReactionScope reaction(this, &in_);
    if (!ok) {
      frontend_->MemberBroken(this, "its stream to the relay ended");
      Close(grpc::Status::OK);
      return;
    }
    WorkerMessage message;
    grpc::Status parsed =
        grpc::GenericDeserialize<grpc::ProtoBufferReader, WorkerMessage>(&in_, &message);
    if (!parsed.ok()) {
      frontend_->MemberBroken(this, "it sent a malformed message");
      Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "malformed WorkerMessage on the relayed session"));
      return;
    }
    if (worker_id_.empty()) {
      grpc::Status opened = OpenWith(message);
      if (!opened.ok()) {
        Close(opened);
        return;
      }
    } else {
      frontend_->FromMember(this, std::move(message));
    }
    BeforeStart(&in_);
    StartRead(&in_);
  }

  void OnCancel() override {
    ReactionScope reaction(this);
    frontend_->MemberBroken(this, "its stream to the relay was cancelled");
    Close(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    AfterAllReactions(this);
    frontend_->MemberDone(this);
    delete this;
  }

 private:
  grpc::Status OpenWith(const WorkerMessage& message) {
    if (!message.has_hello() || message.hello().worker_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "the first message of a session must be a Hello with a worker_id");
    }
    const std::string& id = message.hello().worker_id();
    if (!credential_worker_.empty() && credential_worker_ != id) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("a member speaks only for itself: the credential is ",
                                       credential_worker_, "'s, the Hello names ", id));
    }
    // Set before OpenMember: a directive may be routed to this stream as
    // soon as it is in the map.
    worker_id_ = id;
    grpc::Status s = frontend_->OpenMember(this, message.hello());
    if (!s.ok()) worker_id_.clear();
    return s;
  }

  RelayFrontend* const frontend_;
  // The worker the call's credential names (empty: credentials off).
  const std::string credential_worker_;
  grpc::ByteBuffer in_;    // read path only
  std::string worker_id_;  // read path only, set once by the Hello
};

// A forwarded unary call: finished by whoever removes it from calls_, or by
// its own cancellation. Deletes itself in OnDone.
class RelayFrontend::CallReactor : public grpc::ServerUnaryReactor {
 public:
  explicit CallReactor(RelayFrontend* frontend) : frontend_(frontend) {}
  void set_call_id(uint64_t id) { call_id_.store(id); }
  void OnCancel() override {
    ReactionScope reaction(this);
    if (uint64_t id = call_id_.load(); id != 0) frontend_->CancelCall(id);
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }

 private:
  RelayFrontend* const frontend_;
  std::atomic<uint64_t> call_id_{0};
};

std::vector<RelayFrontend::Target> RelayFrontend::Targets(const RelayFrontendOptions& options) {
  std::vector<Target> targets;
  for (const auto& [address, channel] : options.replicas) {
    targets.push_back({address, shoal::v1::Coordinator::NewStub(channel)});
  }
  if (targets.empty())
    targets.push_back({"", shoal::v1::Coordinator::NewStub(options.coordinator)});
  return targets;
}

RelayFrontend::RelayFrontend(RelayFrontendOptions options)
    : options_(std::move(options)), targets_(Targets(options_)) {
  pump_ = std::thread([this] { Pump(); });
}

RelayFrontend::~RelayFrontend() { Shutdown(); }

void RelayFrontend::SetRelayId(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  relay_id_ = worker_id;
}

size_t RelayFrontend::members() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

grpc::Status RelayFrontend::Allowed(const grpc::CallbackServerContext* ctx,
                                    const std::string& worker_id) const {
  if (grpc::Status s = options_.gate.Check(ctx, Access::kMember); !s.ok()) return s;
  if (options_.members == nullptr || !options_.members->enabled()) return grpc::Status::OK;
  if (grpc::Status s = CheckMember(*options_.members, ctx); !s.ok()) return s;
  const std::string holder = CredentialWorker(ctx);
  if (!worker_id.empty() && holder != worker_id) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("a member speaks only for itself: the credential is ", holder,
                                     "'s, the call is for ", worker_id));
  }
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- members

RelayFrontend::BidiReactor* RelayFrontend::Stream(const MethodDescriptor& method,
                                                  grpc::CallbackServerContext* ctx) {
  // Member sessions only: a supernode does not relay a relay.
  static const MethodDescriptor* const session =
      CoordinatorDescriptor().FindMethodByName("Session");
  if (&method != session) {
    return new FinishedStream(
        grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                     absl::StrCat("a relay carries member sessions and relayed calls only; call ",
                                  method.name(), " at the coordinator")));
  }
  grpc::Status allowed = Allowed(ctx, "");
  const bool checked = options_.members != nullptr && options_.members->enabled();
  auto* stream = new MemberStream(this, checked ? CredentialWorker(ctx) : "");
  if (!allowed.ok()) stream->Close(allowed);
  return stream;
}

grpc::Status RelayFrontend::OpenMember(MemberStream* stream, const shoal::v1::Hello& hello) {
  const std::string& worker_id = hello.worker_id();
  absl::MutexLock lock(&mu_);
  if (stop_) return Unavailable("the relay is shutting down");
  if (relay_id_.empty()) return Unavailable("the relay has not joined the run yet");
  auto [it, inserted] = sessions_.try_emplace(worker_id, stream);
  if (!inserted && it->second != stream) {
    // The member opened again (its old stream here is stale).
    it->second->Close(grpc::Status(grpc::StatusCode::ABORTED,
                                   "superseded by a newer session of the same member"));
    it->second = stream;
  }
  auto* entry = outbox_.add_sessions();
  entry->set_worker_id(worker_id);
  *entry->mutable_message()->mutable_hello() = hello;
  SHOAL_VLOG(1) << "relay: " << worker_id << " opened its session here";
  return grpc::Status::OK;
}

void RelayFrontend::FromMember(MemberStream* stream, WorkerMessage message) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(stream->worker_id());
  if (it == sessions_.end() || it->second != stream) return;  // ended here already
  auto* entry = outbox_.add_sessions();
  entry->set_worker_id(stream->worker_id());
  *entry->mutable_message() = std::move(message);
}

void RelayFrontend::MemberBroken(MemberStream* stream, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(stream->worker_id());
  if (it == sessions_.end() || it->second != stream) return;
  sessions_.erase(it);
  // The coordinator removes the member at once, as when its direct stream
  // breaks (ignored there when the member has moved to another route).
  auto* gone = outbox_.add_gone();
  gone->set_worker_id(stream->worker_id());
  gone->set_reason(reason);
}

void RelayFrontend::MemberDone(MemberStream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(stream->worker_id());
  if (it != sessions_.end() && it->second == stream) sessions_.erase(it);
}

// ---------------------------------------------------------------- calls

grpc::ServerUnaryReactor* RelayFrontend::Unary(const MethodDescriptor& method,
                                               grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  if (!IsRelayed(method)) {
    return FinishUnary(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                         absl::StrCat(method.name(),
                                                      " is not relayed: call it at the "
                                                      "coordinator")));
  }
  return Forward(method, ctx, *request, response);
}

grpc::ServerUnaryReactor* RelayFrontend::Forward(const MethodDescriptor& method,
                                                 grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer& request,
                                                 grpc::ByteBuffer* response) {
  auto* reactor = new CallReactor(this);
  // The token before the request is even decoded.
  if (grpc::Status s = options_.gate.Check(ctx, Access::kMember); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  RelayedCall call;
  call.set_method(method.name());
  call.set_request(ByteBufferToString(request));
  // The member the call is for: the request's worker_id (the coordinator
  // checks it against the route; here, against the caller's credential).
  absl::StatusOr<std::string> worker_id = RequestMember(method, call.request());
  if (!worker_id.ok()) {
    reactor->Finish(ToGrpcStatus(worker_id.status()));
    return reactor;
  }
  if (grpc::Status allowed = Allowed(ctx, *worker_id); !allowed.ok()) {
    reactor->Finish(allowed);
    return reactor;
  }
  if (worker_id->empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker_id is empty"));
    return reactor;
  }
  absl::Time deadline = options_.clock->Now() + options_.call_timeout;
  deadline = std::min(deadline, absl::FromChrono(ctx->deadline()));
  {
    mu_.Lock();
    if (stop_ || relay_id_.empty()) {
      const grpc::Status refused = Unavailable(stop_ ? "the relay is shutting down"
                                                     : "the relay has not joined the run yet");
      mu_.Unlock();
      reactor->Finish(refused);
      return reactor;
    }
    const uint64_t id = ++next_call_id_;
    call.set_call_id(id);
    call.set_worker_id(*worker_id);
    *outbox_.add_calls() = std::move(call);
    calls_[id] = PendingCall{reactor, response, deadline};
    reactor->set_call_id(id);
    mu_.Unlock();
  }
  return reactor;
}

void RelayFrontend::CancelCall(uint64_t call_id) {
  CallReactor* reactor = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(call_id);
    if (it == calls_.end()) return;
    reactor = it->second.reactor;
    calls_.erase(it);
  }
  reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the member cancelled the call"));
}

// ---------------------------------------------------------------- the stream

bool RelayFrontend::OutboxEmptyLocked() const {
  return outbox_.sessions_size() == 0 && outbox_.calls_size() == 0 && outbox_.gone_size() == 0;
}

void RelayFrontend::TakeBatchLocked(RelayUp* batch) {
  const size_t total = outbox_.sessions_size() + outbox_.calls_size() + outbox_.gone_size();
  if (total <= options_.max_batch) {
    batch->Swap(&outbox_);
    return;
  }
  // Sessions first (a Hello before the calls of its member), then calls,
  // then gone notices, as the coordinator handles a batch.
  size_t room = options_.max_batch;
  RelayUp rest;
  for (auto& s : *outbox_.mutable_sessions()) {
    if (room > 0) {
      *batch->add_sessions() = std::move(s);
      --room;
    } else {
      *rest.add_sessions() = std::move(s);
    }
  }
  for (auto& c : *outbox_.mutable_calls()) {
    if (room > 0) {
      *batch->add_calls() = std::move(c);
      --room;
    } else {
      *rest.add_calls() = std::move(c);
    }
  }
  for (auto& g : *outbox_.mutable_gone()) {
    if (room > 0) {
      *batch->add_gone() = std::move(g);
      --room;
    } else {
      *rest.add_gone() = std::move(g);
    }
  }
  outbox_.Swap(&rest);
}

void RelayFrontend::Pump() {
  for (;;) {
    std::vector<std::shared_ptr<Uplink>> retired;
    std::vector<CallReactor*> expired;
    bool need_stream = false;
    size_t target = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !OutboxEmptyLocked() || !retired_.empty();
      };
      // With calls waiting, it wakes when the first of them expires;
      // otherwise it sleeps until there is work.
      if (calls_.empty()) {
        mu_.Await(absl::Condition(&ready));
      } else {
        absl::Time first = absl::InfiniteFuture();
        for (const auto& [id, call] : calls_) first = std::min(first, call.deadline);
        mu_.AwaitWithTimeout(absl::Condition(&ready),
                             std::max(absl::ZeroDuration(), first - options_.clock->Now()));
      }
      if (stop_) return;
      retired.swap(retired_);
      const absl::Time now = options_.clock->Now();
      for (auto it = calls_.begin(); it != calls_.end();) {
        if (it->second.deadline <= now) {
          expired.push_back(it->second.reactor);
          calls_.erase(it++);
        } else {
          ++it;
        }
      }
      need_stream = uplink_ == nullptr && !OutboxEmptyLocked();
      target = current_;
    }
    for (CallReactor* reactor : expired) {
      reactor->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                   "no answer from the coordinator through the relay in time"));
    }
    for (auto& old : retired) {
      if (old->reader.joinable()) old->reader.join();
    }
    if (need_stream) {
      // Long-lived like a Session: no deadline; it ends by Shutdown's
      // cancel or by the coordinator. Opened outside mu_ (it may block).
      auto fresh = std::make_shared<Uplink>();
      fresh->target = target;
      fresh->stream = targets_[target].stub->Relay(&fresh->ctx);
      absl::MutexLock lock(&mu_);
      if (stop_) {
        fresh->ctx.TryCancel();
        fresh->stream->Finish();
        return;
      }
      uplink_ = fresh;
      streams_opened_.fetch_add(1);
      SHOAL_LOG(INFO) << "relay " << relay_id_ << ": opened its Relay stream"
                      << (targets_.size() > 1 ? absl::StrCat(" to ", targets_[target].address)
                                              : std::string());
      Uplink* raw = fresh.get();
      raw->reader = std::thread([this, raw] { ReadUplink(raw); });
    }
    std::shared_ptr<Uplink> uplink;
    RelayUp batch;
    {
      absl::MutexLock lock(&mu_);
      if (uplink_ == nullptr || OutboxEmptyLocked()) continue;
      uplink = uplink_;
      TakeBatchLocked(&batch);
      if (!uplink->hello_sent) {
        batch.mutable_hello()->set_worker_id(relay_id_);
        uplink->hello_sent = true;
      }
    }
    absl::MutexLock lock(&uplink->write_mu);
    // A failed write: the reader sees the end and fails what is waiting.
    if (uplink->finished || !StartWrite(uplink.get())) continue;
    uplink->stream->Write(batch);
    absl::MutexLock writing(&uplink->writing_mu);
    uplink->writing = false;
  }
}

bool RelayFrontend::StartWrite(Uplink* uplink) {
  absl::MutexLock lock(&uplink->writing_mu);
  if (uplink->ended) return false;
  uplink->writing = true;
  return true;
}

void RelayFrontend::ReadUplink(Uplink* uplink) {
  RelayDown down;
  while (uplink->stream->Read(&down)) Route(down);
  // The coordinator ended the stream. A write in flight returns once gRPC
  // sees the end: wait for it (bounded) so that Finish reads the
  // coordinator's own status, whose trailers name the leader when a standby
  // refused. Cancelling at once would turn that refusal into CANCELLED.
  {
    absl::MutexLock lock(&uplink->writing_mu);
    uplink->ended = true;  // no write starts after this one
    auto idle = [uplink]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(uplink->writing_mu) { return !uplink->writing; };
    if (!uplink->writing_mu.AwaitWithTimeout(absl::Condition(&idle), kWriteDrainTimeout)) {
      uplink->ctx.TryCancel();  // a write stuck past the end returns now
    }
  }
  grpc::Status status;
  {
    absl::MutexLock lock(&uplink->write_mu);
    uplink->finished = true;
    status = uplink->stream->Finish();
  }
  UplinkBroken(uplink, status);
}

void RelayFrontend::Route(const RelayDown& down) {
  std::vector<std::pair<PendingCall, RelayedCallResult>> answered;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& d : down.directives()) {
      // Serialized once; every member's copy shares the slices.
      const grpc::ByteBuffer bytes = Serialize(d.message());
      for (const std::string& id : d.worker_ids()) {
        auto it = sessions_.find(id);
        if (it != sessions_.end()) it->second->Enqueue(bytes);
      }
    }
    for (const RelayedCallResult& r : down.results()) {
      auto it = calls_.find(r.call_id());
      if (it == calls_.end()) continue;  // expired or cancelled meanwhile
      answered.emplace_back(std::move(it->second), r);
      calls_.erase(it);
    }
    for (const auto& e : down.ended()) {
      auto it = sessions_.find(e.worker_id());
      if (it == sessions_.end()) continue;
      it->second->Close(grpc::Status(static_cast<grpc::StatusCode>(e.code()), e.message()));
      sessions_.erase(it);
    }
  }
  for (auto& [call, result] : answered) {
    grpc::Status status(static_cast<grpc::StatusCode>(result.code()), result.message());
    // The response's bytes go to the member as they came (gRPC sends them
    // as the call's response message).
    if (status.ok()) *call.response = StringToByteBuffer(result.response());
    call.reactor->Finish(status);
  }
}

void RelayFrontend::UplinkBroken(Uplink* uplink, const grpc::Status& status) {
  std::vector<CallReactor*> failed;
  const grpc::Status why = Unavailable(
      absl::StrCat("the relay's stream with the coordinator broke (", status.error_message(),
                   "): open the session with the coordinator directly"));
  {
    absl::MutexLock lock(&mu_);
    if (uplink_.get() == uplink) {
      retired_.push_back(std::move(uplink_));
      uplink_.reset();
    } else {
      return;  // Shutdown took it
    }
    if (!stop_) {
      SHOAL_LOG(WARNING) << "relay " << relay_id_ << ": the Relay stream ended ("
                         << status.error_code() << " " << status.error_message() << "); "
                         << sessions_.size() << " member sessions end";
    }
    if (targets_.size() > 1 && !stop_ && current_ == uplink->target &&
        (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::CANCELLED)) {
      // Coordinator replicas: to the leader a standby named, else the next.
      std::string leader;
      const auto& trailers = uplink->ctx.GetServerTrailingMetadata();
      if (auto it = trailers.find(kLeaderHintKey); it != trailers.end()) {
        leader.assign(it->second.data(), it->second.size());
      }
      size_t next = (uplink->target + 1) % targets_.size();
      for (size_t i = 0; i < targets_.size(); ++i) {
        if (!leader.empty() && targets_[i].address == leader) next = i;
      }
      current_ = next;
      SHOAL_LOG(INFO) << "relay " << relay_id_ << ": the next Relay stream goes to "
                      << targets_[next].address
                      << (leader.empty() ? "" : " (the leader a standby named)");
    }
    for (auto& [id, stream] : sessions_) stream->Close(why);
    sessions_.clear();
    for (auto& [id, call] : calls_) failed.push_back(call.reactor);
    calls_.clear();
    outbox_.Clear();  // written for the old stream: members start over
  }
  for (CallReactor* reactor : failed) reactor->Finish(why);
}

void RelayFrontend::Shutdown() {
  std::shared_ptr<Uplink> uplink;
  std::vector<std::shared_ptr<Uplink>> retired;
  std::vector<CallReactor*> failed;
  const grpc::Status why = Unavailable("the relay is shutting down");
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !pump_.joinable()) return;
    stop_ = true;
    uplink = std::move(uplink_);
    uplink_.reset();
    retired.swap(retired_);
    for (auto& [id, stream] : sessions_) stream->Close(why);
    sessions_.clear();
    for (auto& [id, call] : calls_) failed.push_back(call.reactor);
    calls_.clear();
  }
  for (CallReactor* reactor : failed) reactor->Finish(why);
  if (pump_.joinable()) pump_.join();
  if (uplink != nullptr) {
    uplink->ctx.TryCancel();
    retired.push_back(std::move(uplink));
  }
  for (auto& old : retired) {
    if (old->reader.joinable()) old->reader.join();
  }
}

}  // namespace shoal::worker
