#include "services/worker/coordinator_client.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/retry.h"
#include "common/status_util.h"

namespace shoal::worker {

struct GrpcCoordinatorClient::Session {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<shoal::v1::WorkerMessage, shoal::v1::CoordinatorMessage>>
      stream;
  absl::Mutex write_mu;
  absl::Notification stop;
  std::thread reader;
  std::thread heartbeat;
};

GrpcCoordinatorClient::GrpcCoordinatorClient(CoordinatorClientOptions options)
    : options_(std::move(options)),
      stub_(shoal::v1::Coordinator::NewStub(MakeChannel(options_.address))) {}

GrpcCoordinatorClient::~GrpcCoordinatorClient() { CloseSession(); }

absl::Status GrpcCoordinatorClient::CallWithRetry(
    const std::function<grpc::Status(grpc::ClientContext*)>& call, absl::Duration window) {
  // Idempotent calls only; UNAVAILABLE only (a DEADLINE_EXCEEDED report may
  // have been applied, and its caller decides).
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.max_backoff = absl::Seconds(2);
  policy.deadline = window;
  policy.unavailable_only = true;
  return Retry(
      policy, nullptr,
      [&](absl::Duration left) -> absl::Status {
        grpc::ClientContext ctx;
        // Never wait past the retry window.
        ctx.set_deadline(
            DeadlineIn(std::max(absl::Milliseconds(100), std::min(options_.rpc_timeout, left))));
        return FromGrpcStatus(call(&ctx));
      },
      [](const absl::Status& s, int) {
        SHOAL_VLOG(1) << "coordinator unavailable (" << s.message() << "), retrying";
      });
}

absl::StatusOr<shoal::v1::JoinResponse> GrpcCoordinatorClient::Join(
    const shoal::v1::JoinRequest& request) {
  shoal::v1::JoinResponse response;
  absl::Status s =
      CallWithRetry([&](grpc::ClientContext* ctx) { return stub_->Join(ctx, request, &response); },
                    options_.retry_window);
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<uint64_t> GrpcCoordinatorClient::JoinRound(const std::string& worker_id,
                                                          uint64_t round) {
  shoal::v1::JoinRoundRequest request;
  request.set_worker_id(worker_id);
  request.set_round(round);
  shoal::v1::JoinRoundResponse response;
  absl::Status s = CallWithRetry(
      [&](grpc::ClientContext* ctx) { return stub_->JoinRound(ctx, request, &response); },
      options_.retry_window);
  if (!s.ok()) return s;
  return response.admitted_round();
}

absl::Status GrpcCoordinatorClient::ReportReady(const shoal::v1::ReportReadyRequest& request) {
  shoal::v1::ReportReadyResponse response;
  return CallWithRetry(
      [&](grpc::ClientContext* ctx) { return stub_->ReportReady(ctx, request, &response); },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::ConnectionsReady(
    const shoal::v1::ConnectionsReadyRequest& request) {
  shoal::v1::ConnectionsReadyResponse response;
  return CallWithRetry(
      [&](grpc::ClientContext* ctx) { return stub_->ConnectionsReady(ctx, request, &response); },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::ReportCheckpoint(
    const shoal::v1::ReportCheckpointRequest& request) {
  shoal::v1::ReportCheckpointResponse response;
  return CallWithRetry(
      [&](grpc::ClientContext* ctx) { return stub_->ReportCheckpoint(ctx, request, &response); },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::ReportRoundDone(
    const shoal::v1::ReportRoundDoneRequest& request) {
  shoal::v1::ReportRoundDoneResponse response;
  return CallWithRetry(
      [&](grpc::ClientContext* ctx) { return stub_->ReportRoundDone(ctx, request, &response); },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::Leave(const std::string& worker_id, const std::string& reason) {
  shoal::v1::LeaveRequest request;
  request.set_worker_id(worker_id);
  request.set_reason(reason);
  shoal::v1::LeaveResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(std::min(options_.rpc_timeout, absl::Seconds(3))));
  return FromGrpcStatus(stub_->Leave(&ctx, request, &response));
}

absl::Status GrpcCoordinatorClient::OpenSession(const std::string& worker_id,
                                                absl::Duration heartbeat, MessageHandler on_message,
                                                ClosedHandler on_closed, HeartbeatFiller fill) {
  CloseSession();
  auto session = std::make_unique<Session>();
  // The session is long-lived by design: no deadline. It is bounded by the
  // coordinator's heartbeat lease on one side and by CloseSession (cancel) on
  // ours.
  session->stream = stub_->Session(&session->ctx);
  shoal::v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(worker_id);
  if (!session->stream->Write(hello)) {
    session->ctx.TryCancel();
    grpc::Status s = session->stream->Finish();
    return absl::UnavailableError(
        absl::StrCat("cannot open a session with the coordinator: ", s.error_message()));
  }
  Session* raw = session.get();
  raw->reader = std::thread([raw, on_message, on_closed] {
    shoal::v1::CoordinatorMessage msg;
    while (raw->stream->Read(&msg)) on_message(msg);
    absl::Status status = FromGrpcStatus(raw->stream->Finish());
    raw->stop.Notify();
    if (status.ok()) status = absl::UnavailableError("coordinator closed the session");
    on_closed(status);
  });
  raw->heartbeat = std::thread([raw, heartbeat, fill] {
    while (!raw->stop.WaitForNotificationWithTimeout(heartbeat)) {
      shoal::v1::WorkerMessage hb;
      hb.mutable_heartbeat()->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
      if (fill) fill(hb.mutable_heartbeat());
      absl::MutexLock lock(&raw->write_mu);
      if (!raw->stream->Write(hb)) break;  // the reader sees the end
    }
  });
  absl::MutexLock lock(&mu_);
  session_ = std::move(session);
  return absl::OkStatus();
}

void GrpcCoordinatorClient::CloseSession() {
  std::unique_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    session = std::move(session_);
  }
  if (session == nullptr) return;
  session->ctx.TryCancel();
  if (session->reader.joinable()) session->reader.join();
  if (!session->stop.HasBeenNotified()) session->stop.Notify();
  if (session->heartbeat.joinable()) session->heartbeat.join();
}

}  // namespace shoal::worker
