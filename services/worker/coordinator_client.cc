#include "services/worker/coordinator_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/member_credentials_grpc.h"
#include "common/retry.h"
#include "common/status_util.h"

namespace shoal::worker {
namespace {
// How often a call that keeps finding the coordinator unavailable says so.
constexpr absl::Duration kWaitingNoteEvery = absl::Seconds(5);
}  // namespace

struct GrpcCoordinatorClient::Session {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<shoal::v1::WorkerMessage, shoal::v1::CoordinatorMessage>>
      stream;
  absl::Mutex write_mu;
  // The heartbeat thread waits on hb_mu for its period, the end of the
  // session, or a heartbeat asked for now (SendHeartbeatNow).
  absl::Mutex hb_mu;
  bool ended ABSL_GUARDED_BY(hb_mu) = false;
  // Heartbeats asked for, and the count the latest written one answered.
  uint64_t wanted ABSL_GUARDED_BY(hb_mu) = 0;
  uint64_t written ABSL_GUARDED_BY(hb_mu) = 0;
  std::thread reader;
  std::thread heartbeat;

  void End() {
    absl::MutexLock lock(&hb_mu);
    ended = true;
  }
};

GrpcCoordinatorClient::GrpcCoordinatorClient(CoordinatorClientOptions options)
    : options_(std::move(options)) {
  for (absl::string_view a : absl::StrSplit(options_.address, ',', absl::SkipWhitespace())) {
    addresses_.emplace_back(a);
  }
  if (addresses_.empty()) addresses_.push_back(options_.address);
  absl::MutexLock lock(&stubs_mu_);
  current_ = addresses_.front();
}

shoal::v1::Coordinator::Stub* GrpcCoordinatorClient::stub() {
  absl::MutexLock lock(&stubs_mu_);
  auto& stub = stubs_[current_];
  if (stub == nullptr) stub = shoal::v1::Coordinator::NewStub(MakeChannel(current_));
  return stub.get();
}

void GrpcCoordinatorClient::MoveOn(shoal::v1::Coordinator::Stub* used,
                                   const grpc::ClientContext& ctx) {
  std::string hint;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find(kLeaderHintKey); it != trailers.end()) {
    hint.assign(it->second.data(), it->second.size());
  }
  absl::MutexLock lock(&stubs_mu_);
  auto cur = stubs_.find(current_);
  if (cur == stubs_.end() || cur->second.get() != used) return;  // another call moved on
  std::string next = current_;
  if (!hint.empty() && hint != current_) {
    next = hint;
  } else if (addresses_.size() > 1) {
    auto it = std::find(addresses_.begin(), addresses_.end(), current_);
    next = it == addresses_.end() || it + 1 == addresses_.end() ? addresses_.front() : *(it + 1);
  }
  if (next != current_) {
    SHOAL_LOG(INFO) << "coordinator " << current_ << " unavailable; trying " << next
                    << (hint.empty() ? "" : " (leader hint)");
    current_ = next;
  }
}

GrpcCoordinatorClient::~GrpcCoordinatorClient() { CloseSession(); }

absl::Status GrpcCoordinatorClient::CallWithRetry(
    const std::function<grpc::Status(shoal::v1::Coordinator::Stub*, grpc::ClientContext*)>& call,
    absl::Duration window) {
  // Idempotent calls only; UNAVAILABLE only (a DEADLINE_EXCEEDED report may
  // have been applied, and its caller decides). The backoff stays short: an
  // UNAVAILABLE comes from a standby (a cheap refusal) or a dead address
  // (refused at once), and during a failover every wait here adds to the
  // time the run stands still once the new leader is up.
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(50);
  policy.max_backoff = options_.max_backoff;
  policy.deadline = window;
  policy.unavailable_only = true;
  // Say what it waits for, every few seconds, rather than nothing until the
  // window ends.
  const absl::Time started = options_.clock->Now();
  absl::Time next_note = started + kWaitingNoteEvery;
  return Retry(
      policy, options_.stop,
      [&](absl::Duration left) -> absl::Status {
        grpc::ClientContext ctx;
        if (options_.credential != nullptr) AddMemberCredential(*options_.credential, &ctx);
        // Never wait past the retry window.
        ctx.set_deadline(
            DeadlineIn(std::max(absl::Milliseconds(100), std::min(options_.rpc_timeout, left))));
        shoal::v1::Coordinator::Stub* used = stub();
        absl::Status s = FromGrpcStatus(call(used, &ctx));
        if (absl::IsUnavailable(s)) MoveOn(used, ctx);
        return s;
      },
      [&](const absl::Status& s, int attempt) {
        SHOAL_VLOG(1) << "coordinator unavailable (" << s.message() << "), retrying";
        const absl::Time now = options_.clock->Now();
        if (now < next_note) return;
        next_note = now + kWaitingNoteEvery;
        std::string at;
        {
          absl::MutexLock lock(&stubs_mu_);
          at = current_;
        }
        SHOAL_LOG(WARNING) << "waiting for the coordinator at " << at << " for "
                           << absl::FormatDuration(absl::Trunc(now - started, absl::Seconds(1)))
                           << " (" << attempt << " attempts; " << s.message()
                           << "); still trying for up to "
                           << absl::FormatDuration(
                                  absl::Trunc(window - (now - started), absl::Seconds(1)))
                           << ": is it running, and is --coordinator its address?";
      });
}

absl::StatusOr<shoal::v1::JoinResponse> GrpcCoordinatorClient::Join(
    const shoal::v1::JoinRequest& request) {
  shoal::v1::JoinResponse response;
  absl::Status s =
      CallWithRetry([&](shoal::v1::Coordinator::Stub* stub,
                        grpc::ClientContext* ctx) { return stub->Join(ctx, request, &response); },
                    options_.retry_window);
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<uint64_t> GrpcCoordinatorClient::JoinRound(const std::string& worker_id,
                                                          uint64_t round, uint64_t carried_round) {
  shoal::v1::JoinRoundRequest request;
  request.set_worker_id(worker_id);
  request.set_round(round);
  request.set_carried_round(carried_round);
  shoal::v1::JoinRoundResponse response;
  absl::Status s = CallWithRetry(
      [&](shoal::v1::Coordinator::Stub* stub, grpc::ClientContext* ctx) {
        return stub->JoinRound(ctx, request, &response);
      },
      options_.retry_window);
  if (!s.ok()) return s;
  return response.admitted_round();
}

absl::Status GrpcCoordinatorClient::ReportReady(const shoal::v1::ReportReadyRequest& request) {
  shoal::v1::ReportReadyResponse response;
  return CallWithRetry(
      [&](shoal::v1::Coordinator::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ReportReady(ctx, request, &response);
      },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::ConnectionsReady(
    const shoal::v1::ConnectionsReadyRequest& request) {
  shoal::v1::ConnectionsReadyResponse response;
  return CallWithRetry(
      [&](shoal::v1::Coordinator::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ConnectionsReady(ctx, request, &response);
      },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::ReportCheckpoint(
    const shoal::v1::ReportCheckpointRequest& request) {
  shoal::v1::ReportCheckpointResponse response;
  return CallWithRetry(
      [&](shoal::v1::Coordinator::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ReportCheckpoint(ctx, request, &response);
      },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::ReportAudit(const shoal::v1::ReportAuditRequest& request) {
  shoal::v1::ReportAuditResponse response;
  return CallWithRetry(
      [&](shoal::v1::Coordinator::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ReportAudit(ctx, request, &response);
      },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::ReportRoundDone(
    const shoal::v1::ReportRoundDoneRequest& request) {
  shoal::v1::ReportRoundDoneResponse response;
  return CallWithRetry(
      [&](shoal::v1::Coordinator::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ReportRoundDone(ctx, request, &response);
      },
      options_.retry_window);
}

absl::Status GrpcCoordinatorClient::Leave(const std::string& worker_id, const std::string& reason) {
  shoal::v1::LeaveRequest request;
  request.set_worker_id(worker_id);
  request.set_reason(reason);
  shoal::v1::LeaveResponse response;
  grpc::ClientContext ctx;
  if (options_.credential != nullptr) AddMemberCredential(*options_.credential, &ctx);
  ctx.set_deadline(DeadlineIn(std::min(options_.rpc_timeout, absl::Seconds(3))));
  return FromGrpcStatus(stub()->Leave(&ctx, request, &response));
}

absl::Status GrpcCoordinatorClient::OpenSession(const std::string& worker_id,
                                                absl::Duration heartbeat, MessageHandler on_message,
                                                ClosedHandler on_closed, HeartbeatFiller fill) {
  shoal::v1::Hello hello;
  hello.set_worker_id(worker_id);
  return OpenSessionWith(hello, heartbeat, std::move(on_message), std::move(on_closed),
                         std::move(fill));
}

absl::Status GrpcCoordinatorClient::OpenSessionWith(const shoal::v1::Hello& first,
                                                    absl::Duration heartbeat,
                                                    MessageHandler on_message,
                                                    ClosedHandler on_closed, HeartbeatFiller fill) {
  CloseSession();
  auto session = std::make_shared<Session>();
  // The session is long-lived by design: no deadline. It is bounded by the
  // coordinator's heartbeat lease on one side and by CloseSession (cancel) on
  // ours.
  if (options_.credential != nullptr) AddMemberCredential(*options_.credential, &session->ctx);
  shoal::v1::Coordinator::Stub* used = stub();
  session->stream = used->Session(&session->ctx);
  shoal::v1::WorkerMessage hello;
  *hello.mutable_hello() = first;
  if (!session->stream->Write(hello)) {
    session->ctx.TryCancel();
    grpc::Status s = session->stream->Finish();
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) MoveOn(used, session->ctx);
    return absl::UnavailableError(
        absl::StrCat("cannot open a session with the coordinator: ", s.error_message()));
  }
  Session* raw = session.get();
  raw->reader = std::thread([raw, on_message, on_closed] {
    shoal::v1::CoordinatorMessage msg;
    while (raw->stream->Read(&msg)) on_message(msg);
    absl::Status status = FromGrpcStatus(raw->stream->Finish());
    raw->End();
    if (status.ok()) status = absl::UnavailableError("coordinator closed the session");
    on_closed(status);
  });
  raw->heartbeat = std::thread([raw, heartbeat, fill, clock = options_.clock] {
    while (true) {
      uint64_t answers = 0;
      {
        absl::MutexLock lock(&raw->hb_mu);
        auto woken = [raw]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(raw->hb_mu) {
          return raw->ended || raw->wanted > raw->written;
        };
        raw->hb_mu.AwaitWithTimeout(absl::Condition(&woken), heartbeat);
        if (raw->ended) break;
        answers = raw->wanted;
      }
      shoal::v1::WorkerMessage hb;
      hb.mutable_heartbeat()->set_sent_unix_ms(absl::ToUnixMillis(clock->Now()));
      if (fill) fill(hb.mutable_heartbeat());
      bool ok;
      {
        absl::MutexLock lock(&raw->write_mu);
        ok = raw->stream->Write(hb);
      }
      if (!ok) {  // the reader sees the end
        raw->End();
        break;
      }
      absl::MutexLock lock(&raw->hb_mu);
      raw->written = answers;
    }
  });
  // Another thread may have opened a session since our CloseSession (the
  // relay's router falling back while the worker re-joins): the last one
  // opened stays, the one it replaces ends here, its threads joined (a
  // Session dropped with running threads would end the process).
  std::shared_ptr<Session> replaced;
  {
    absl::MutexLock lock(&mu_);
    replaced = std::exchange(session_, std::move(session));
  }
  EndSession(std::move(replaced));
  return absl::OkStatus();
}

void GrpcCoordinatorClient::EndSession(std::shared_ptr<Session> session) {
  if (session == nullptr) return;
  session->ctx.TryCancel();
  if (session->reader.joinable()) session->reader.join();
  session->End();
  if (session->heartbeat.joinable()) session->heartbeat.join();
}

void GrpcCoordinatorClient::CloseSession() {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    session = std::move(session_);
  }
  EndSession(std::move(session));
}

bool GrpcCoordinatorClient::SendHeartbeatNow(absl::Duration timeout) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    session = session_;
  }
  if (session == nullptr) return false;
  absl::MutexLock lock(&session->hb_mu);
  const uint64_t mine = ++session->wanted;
  auto done = [&session, mine]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session->hb_mu) {
    return session->ended || session->written >= mine;
  };
  session->hb_mu.AwaitWithTimeout(absl::Condition(&done), timeout);
  return session->written >= mine;
}

}  // namespace shoal::worker
