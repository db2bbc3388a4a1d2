#include "services/coordinator/coordinator_service.h"

#include <deque>
#include <set>

#include "common/logging.h"
#include "common/status_util.h"

namespace shoal::coordinator {

using shoal::v1::CoordinatorMessage;
using shoal::v1::WorkerMessage;

// One worker's session stream. Reads Hello then heartbeats; writes the
// directives queued by Enqueue, one at a time. Deletes itself in OnDone.
class SessionReactor : public grpc::ServerBidiReactor<WorkerMessage, CoordinatorMessage> {
 public:
  SessionReactor(CoordinatorService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx) {
    StartRead(&in_);
  }

  // Thread-safe.
  void Enqueue(CoordinatorMessage msg) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    queue_.push_back(std::move(msg));
    if (!writing_) WriteNextLocked();
  }

  // Thread-safe; ends the stream with `status` once queued writes are out.
  void Close(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    close_status_ = status;
    closing_ = true;
    if (!writing_) FinishLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker closed its side or the connection broke.
      Lost("session stream closed");
      Close(grpc::Status::OK);
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
      worker_id_ = in_.hello().worker_id();
      service_->Register(worker_id_, this);
      SHOAL_VLOG(1) << "session opened by " << worker_id_ << " from " << ctx_->peer();
    } else if (in_.has_heartbeat()) {
      absl::Status s = service_->engine_->Heartbeat(worker_id_, in_.heartbeat());
      if (!s.ok()) {
        Close(ToGrpcStatus(s));
        return;
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      // The stream is broken; OnReadDone(false) will follow and clean up.
      queue_.clear();
      return;
    }
    if (!queue_.empty()) {
      WriteNextLocked();
    } else if (closing_) {
      FinishLocked();
    }
  }

  void OnCancel() override { Lost("session cancelled"); }

  void OnDone() override {
    if (!worker_id_.empty()) service_->Unregister(worker_id_, this);
    delete this;
  }

  const std::string& worker_id() const { return worker_id_; }

 private:
  void Lost(const std::string& reason) {
    if (worker_id_.empty() || lost_.exchange(true)) return;
    // Only the session currently registered for the worker speaks for it.
    if (service_->Unregister(worker_id_, this)) {
      service_->Deliver(service_->engine_->Disconnect(worker_id_, reason));
    }
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    out_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    StartWrite(&out_);
  }

  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(close_status_);
  }

  CoordinatorService* const service_;
  grpc::CallbackServerContext* const ctx_;
  WorkerMessage in_;
  std::string worker_id_;  // set once by the read path
  std::atomic<bool> lost_{false};

  absl::Mutex mu_;
  std::deque<CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
  CoordinatorMessage out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
};

CoordinatorService::~CoordinatorService() { CloseAllSessions(); }

void CoordinatorService::Register(const std::string& worker_id, SessionReactor* session) {
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
    // Directives sent before the Hello was processed go out now.
    auto pending = pending_.find(worker_id);
    if (pending != pending_.end()) {
      for (auto& msg : pending->second) session->Enqueue(std::move(msg));
      pending_.erase(pending);
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

void CoordinatorService::Deliver(const Directives& directives) {
  if (on_change_) on_change_();
  absl::MutexLock lock(&mu_);
  for (const Directive& d : directives) {
    auto it = sessions_.find(d.worker_id);
    if (it == sessions_.end()) {
      // A worker may call JoinRound before its session's Hello is processed:
      // keep its directives until the session registers (bounded).
      if (engine_->IsActive(d.worker_id)) {
        auto& queue = pending_[d.worker_id];
        queue.push_back(d.message);
        if (queue.size() > kMaxPending) queue.pop_front();
      } else {
        SHOAL_VLOG(1) << "no session for " << d.worker_id << "; directive dropped";
      }
      continue;
    }
    it->second->Enqueue(d.message);
  }
}

void CoordinatorService::Tick() {
  Deliver(engine_->Tick());
  // Close the sessions of workers the engine no longer knows (evicted).
  absl::MutexLock lock(&mu_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    it = engine_->IsActive(it->first) ? std::next(it) : pending_.erase(it);
  }
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!engine_->IsActive(it->first)) {
      it->second->Close(
          grpc::Status(grpc::StatusCode::NOT_FOUND, "worker was removed from the run; Join again"));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

void CoordinatorService::CloseAllSessions() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  for (auto& [id, session] : sessions_) {
    session->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
  }
  sessions_.clear();
}

grpc::ServerBidiReactor<WorkerMessage, CoordinatorMessage>* CoordinatorService::Session(
    grpc::CallbackServerContext* ctx) {
  return new SessionReactor(this, ctx);
}

grpc::ServerUnaryReactor* CoordinatorService::Join(grpc::CallbackServerContext* ctx,
                                                   const shoal::v1::JoinRequest* request,
                                                   shoal::v1::JoinResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<JoinResult> result = engine_->Join(*request);
  if (!result.ok()) {
    reactor->Finish(ToGrpcStatus(result.status()));
    return reactor;
  }
  Deliver(result->directives);
  *response = std::move(result->response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::JoinRound(grpc::CallbackServerContext* ctx,
                                                        const shoal::v1::JoinRoundRequest* request,
                                                        shoal::v1::JoinRoundResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  Directives out;
  absl::StatusOr<uint64_t> admitted =
      engine_->JoinRound(request->worker_id(), request->round(), &out);
  Deliver(out);
  if (admitted.ok()) response->set_admitted_round(*admitted);
  reactor->Finish(ToGrpcStatus(admitted.status()));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ReportReady(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReportReadyRequest* request,
    shoal::v1::ReportReadyResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  Directives out;
  absl::Status s = engine_->ReportReady(*request, &out);
  Deliver(out);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ConnectionsReady(
    grpc::CallbackServerContext* ctx, const shoal::v1::ConnectionsReadyRequest* request,
    shoal::v1::ConnectionsReadyResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  Directives out;
  absl::Status s = engine_->ConnectionsReady(*request, &out);
  Deliver(out);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ReportRoundDone(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReportRoundDoneRequest* request,
    shoal::v1::ReportRoundDoneResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  Directives out;
  absl::Status s = engine_->ReportRoundDone(*request, &out);
  Deliver(out);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ReportCheckpoint(
    grpc::CallbackServerContext* ctx, const shoal::v1::ReportCheckpointRequest* request,
    shoal::v1::ReportCheckpointResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  Directives out;
  absl::Status s = engine_->ReportCheckpoint(*request, &out);
  Deliver(out);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Leave(grpc::CallbackServerContext* ctx,
                                                    const shoal::v1::LeaveRequest* request,
                                                    shoal::v1::LeaveResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  Directives out;
  // NOT_FOUND for unknown ids.
  absl::Status s = engine_->Heartbeat(request->worker_id(), shoal::v1::Heartbeat());
  if (s.ok()) {
    Deliver(engine_->Disconnect(request->worker_id(),
                                request->reason().empty() ? "left" : request->reason()));
  }
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetRunStatus(
    grpc::CallbackServerContext* ctx, const shoal::v1::GetRunStatusRequest* request,
    shoal::v1::RunStatus* response) {
  auto* reactor = ctx->DefaultReactor();
  *response = engine_->Status();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace shoal::coordinator
