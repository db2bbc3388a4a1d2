#include "services/worker/peer_client.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/member_credentials_grpc.h"
#include "common/retry.h"
#include "common/status_util.h"
#include "common/tensor_wire_grpc.h"

namespace shoal::worker {
namespace {

bool Cancelled(const shoal::CancellationToken* canceller) {
  return canceller != nullptr && canceller->cancelled();
}

}  // namespace

absl::Status PeerClient::ReadSliceCancellable(
    const std::string& address, const shoal::v1::ReadSliceRequest& request, absl::Duration timeout,
    shoal::CancellationToken* canceller, const std::function<bool(const ChunkView&)>& on_chunk) {
  if (Cancelled(canceller)) return absl::CancelledError("read cancelled");
  return ReadSlice(address, request, timeout,
                   [&](const ChunkView& c) { return !Cancelled(canceller) && on_chunk(c); });
}

namespace {

// PeerClient's default StartReadSlice: the synchronous ReadSlice on a thread
// of its own, paused on a condition. Fakes only (GrpcPeerClient overrides).
class ThreadedChunkRead final : public ChunkStreamCall {
 public:
  ~ThreadedChunkRead() override {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // the read's own last reference, in its on_done
    } else if (thread_.joinable()) {
      thread_.join();
    }
  }
  void Start(PeerClient* peers, std::string address, shoal::v1::ReadSliceRequest request,
             absl::Duration timeout, ChunkStreamCallbacks callbacks,
             std::shared_ptr<ThreadedChunkRead> self) {
    thread_ = std::thread([this, peers, address = std::move(address), request, timeout,
                           callbacks = std::move(callbacks), self = std::move(self)]() mutable {
      uint64_t until = request.begin();
      absl::Status s =
          peers->ReadSliceCancellable(address, request, timeout, &cancel_, [&](const ChunkView& c) {
            const ChunkNext next = callbacks.on_chunk(c);
            until = c.begin + c.count;
            if (next == ChunkNext::kStop) return false;
            if (next == ChunkNext::kPause) {
              absl::MutexLock lock(&mu_);
              paused_ = true;
              auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !paused_; };
              mu_.Await(absl::Condition(&go));
            }
            return !cancel_.cancelled();
          });
      callbacks.on_done(std::move(s), until);
      self.reset();  // may delete this: nothing after
    });
  }
  void Resume() override {
    absl::MutexLock lock(&mu_);
    paused_ = false;
  }
  void Cancel() override {
    cancel_.Cancel();
    Resume();
  }

 private:
  shoal::CancellationToken cancel_;
  absl::Mutex mu_;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

std::shared_ptr<ChunkStreamCall> PeerClient::StartReadSlice(
    const std::string& address, const shoal::v1::ReadSliceRequest& request, absl::Duration timeout,
    ChunkStreamCallbacks callbacks) {
  auto read = std::make_shared<ThreadedChunkRead>();
  read->Start(this, address, request, timeout, std::move(callbacks), read);
  return read;
}

absl::StatusOr<shoal::v1::ModelManifest> PeerClient::GetManifest(
    const std::string& address, uint64_t round, const std::string& reader_id,
    absl::Duration timeout, shoal::CancellationToken* canceller) {
  return absl::UnimplementedError("this PeerClient cannot ask for manifests");
}

absl::StatusOr<shoal::v1::EncodedPiece> PeerClient::ReadEncoded(
    const std::string&, const shoal::v1::ReadEncodedRequest&, absl::Duration,
    shoal::CancellationToken*) {
  return absl::UnimplementedError("this PeerClient cannot read encoded slices");
}

void PeerClient::StartReadEncoded(const std::string& address,
                                  const shoal::v1::ReadEncodedRequest& request,
                                  absl::Duration timeout, shoal::CancellationToken* canceller,
                                  PieceDone done) {
  // Fakes only: their ReadEncoded may wait (a piece not published yet).
  std::thread([this, address, request, timeout, canceller, done = std::move(done)] {
    done(ReadEncoded(address, request, timeout, canceller));
  }).detach();
}

void PeerClient::StartGetManifest(const std::string& address, uint64_t round,
                                  const std::string& reader_id, absl::Duration timeout,
                                  shoal::CancellationToken* canceller, ManifestDone done) {
  // Fakes only: their GetManifest answers from memory.
  std::thread([this, address, round, reader_id, timeout, canceller, done = std::move(done)] {
    done(GetManifest(address, round, reader_id, timeout, canceller));
  }).detach();
}

void PeerClient::StartProbe(const std::string& address, absl::Duration timeout,
                            shoal::CancellationToken*, InfoDone done) {
  // Fakes only (GrpcPeerClient overrides).
  std::thread([this, address, timeout, done = std::move(done)] {
    done(Probe(address, timeout));
  }).detach();
}

void PeerClient::StartPush(const std::string& address, const shoal::v1::PushHeader& header,
                           absl::string_view bytes, absl::Duration timeout,
                           shoal::CancellationToken* canceller, StatusDone done) {
  // Fakes only (GrpcPeerClient overrides).
  std::thread([this, address, header, bytes, timeout, canceller, done = std::move(done)] {
    done(Push(address, header, bytes, timeout, canceller));
  }).detach();
}

std::vector<absl::Status> PeerClient::ProbeAll(const std::vector<std::string>& addresses,
                                               absl::Duration timeout) {
  std::vector<absl::Status> results;
  for (const std::string& address : addresses) results.push_back(Probe(address, timeout).status());
  return results;
}

absl::Status PeerClient::Push(const std::string&, const shoal::v1::PushHeader&, absl::string_view,
                              absl::Duration, shoal::CancellationToken*) {
  return absl::UnimplementedError("this PeerClient cannot push");
}

absl::Status GrpcPeerClient::Push(const std::string& address, const shoal::v1::PushHeader& header,
                                  absl::string_view bytes, absl::Duration timeout,
                                  shoal::CancellationToken* canceller) {
  grpc::ClientContext ctx;
  // The deadline and this worker's member credential, as every Peer call:
  // with --token_file peers refuse a push without it (PERMISSION_DENIED),
  // which kept a worker behind NAT from ever completing a round (the soak).
  Prepare(&ctx, timeout);
  ScopedCancelCallback cancel_call(canceller, [&ctx] { ctx.TryCancel(); });
  shoal::v1::PushResponse response;
  std::unique_ptr<grpc::ClientWriter<shoal::v1::PushMessage>> writer =
      PeerFor(address).stub->Push(&ctx, &response);
  shoal::v1::PushMessage message;
  *message.mutable_header() = header;
  bool ok = writer->Write(message);
  constexpr size_t kPiece = size_t{1} << 20;
  for (size_t at = 0; ok && at < bytes.size(); at += kPiece) {
    const absl::string_view data = bytes.substr(at, kPiece);
    shoal::v1::EncodedPiece* piece = message.mutable_piece();
    piece->set_round(header.round());
    piece->set_total_bytes(bytes.size());
    piece->set_offset(at);
    piece->set_data(data.data(), data.size());
    piece->set_crc32c(Crc32c(data.data(), data.size()));
    ok = writer->Write(message);
  }
  if (ok) writer->WritesDone();
  absl::Status s = FromGrpcStatus(writer->Finish());
  if (Cancelled(canceller)) {
    return absl::CancelledError(absl::StrCat("push to peer ", address, " cancelled"));
  }
  if (!s.ok()) return Annotate(s, absl::StrCat("push to peer ", address));
  return absl::OkStatus();
}

absl::StatusOr<shoal::v1::EncodedPiece> GrpcPeerClient::ReadEncoded(
    const std::string& address, const shoal::v1::ReadEncodedRequest& request,
    absl::Duration timeout, shoal::CancellationToken* canceller) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  ScopedCancelCallback cancel_call(canceller, [&ctx] { ctx.TryCancel(); });
  shoal::v1::EncodedPiece piece;
  absl::Status s = FromGrpcStatus(PeerFor(address).stub->ReadEncoded(&ctx, request, &piece));
  if (Cancelled(canceller)) {
    return absl::CancelledError(absl::StrCat("encoded read from peer ", address, " cancelled"));
  }
  if (!s.ok()) return Annotate(s, absl::StrCat("peer ", address));
  return piece;
}

void GrpcPeerClient::StartReadEncoded(const std::string& address,
                                      const shoal::v1::ReadEncodedRequest& request,
                                      absl::Duration timeout, shoal::CancellationToken* canceller,
                                      PieceDone done) {
  // What the call writes into, alive until its callback has run.
  struct Call {
    std::unique_ptr<grpc::ClientContext> ctx;
    shoal::v1::ReadEncodedRequest request;
    shoal::v1::EncodedPiece piece;
    uint64_t cancel_id = 0;
  };
  auto call = std::make_shared<Call>();
  call->ctx = NewContext(timeout);
  call->request = request;
  grpc::ClientContext* const ctx = call->ctx.get();
  if (canceller != nullptr) {
    // Unregistered by the completion, which gRPC never runs inside
    // TryCancel (client callbacks are not inlined): no lock order issue.
    call->cancel_id = canceller->Register([ctx] { ctx->TryCancel(); });
  }
  PeerFor(address).stub->async()->ReadEncoded(
      ctx, &call->request, &call->piece,
      [call, address, canceller, done = std::move(done)](grpc::Status status) {
        if (canceller != nullptr) canceller->Unregister(call->cancel_id);
        // The context holds a reference to the channel: let it go before
        // the caller hears the end and may destroy the client (the last
        // reference to a channel must not go on a callback queue's thread).
        call->ctx.reset();
        if (!status.ok()) {
          done(Annotate(FromGrpcStatus(status), absl::StrCat("peer ", address)));
        } else {
          done(std::move(call->piece));
        }
      });
}

void GrpcPeerClient::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(DeadlineIn(timeout));
  if (credential_ != nullptr) AddMemberCredential(*credential_, ctx);
}

std::unique_ptr<grpc::ClientContext> GrpcPeerClient::NewContext(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  Prepare(ctx.get(), timeout);
  return ctx;
}

std::shared_ptr<ChunkStreamCall> GrpcPeerClient::StartReadSlice(
    const std::string& address, const shoal::v1::ReadSliceRequest& request, absl::Duration timeout,
    ChunkStreamCallbacks callbacks) {
  return StartChunkStream(PeerFor(address).generic.get(), NewContext(timeout), request,
                          absl::StrCat("peer ", address), std::move(callbacks));
}

const GrpcPeerClient::Peer& GrpcPeerClient::PeerFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  Peer& peer = peers_[address];
  if (peer.channel == nullptr) {
    peer.channel = MakeChannel(address);
    peer.stub = shoal::v1::Peer::NewStub(peer.channel);
    peer.generic = std::make_unique<grpc::GenericStub>(peer.channel);
  }
  return peer;
}

absl::Status GrpcPeerClient::ReadSlice(const std::string& address,
                                       const shoal::v1::ReadSliceRequest& request,
                                       absl::Duration timeout,
                                       const std::function<bool(const ChunkView&)>& on_chunk) {
  return ReadSliceCancellable(address, request, timeout, nullptr, on_chunk);
}

absl::Status GrpcPeerClient::ReadSliceCancellable(
    const std::string& address, const shoal::v1::ReadSliceRequest& request, absl::Duration timeout,
    shoal::CancellationToken* canceller, const std::function<bool(const ChunkView&)>& on_chunk) {
  absl::Status s = ReadChunkStream(PeerFor(address).generic.get(), NewContext(timeout), request,
                                   absl::StrCat("peer ", address), canceller, on_chunk);
  if (!s.ok() && Cancelled(canceller)) {
    return absl::CancelledError(absl::StrCat("read from peer ", address, " cancelled"));
  }
  return s;
}

absl::StatusOr<shoal::v1::ModelManifest> GrpcPeerClient::GetManifest(
    const std::string& address, uint64_t round, const std::string& reader_id,
    absl::Duration timeout, shoal::CancellationToken* canceller) {
  shoal::v1::GetModelManifestRequest request;
  request.set_round(round);
  request.set_reader_id(reader_id);
  shoal::v1::ModelManifest manifest;
  // A worker that just joined asks for manifests at once, possibly before
  // the holder heard of its member credential (it answers UNAVAILABLE then,
  // common/member_credentials.h): retry UNAVAILABLE briefly. Bounded to a
  // second, so a holder that is down costs little more than before.
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(10);
  policy.max_backoff = absl::Milliseconds(200);
  policy.deadline = std::min(timeout, absl::Seconds(1));
  policy.unavailable_only = true;
  const absl::Time end = clock_->Now() + timeout;
  absl::Status s = Retry(policy, canceller, [&](absl::Duration) -> absl::Status {
    grpc::ClientContext ctx;
    Prepare(&ctx, std::max(absl::ZeroDuration(), end - clock_->Now()));
    ScopedCancelCallback cancel_call(canceller, [&ctx] { ctx.TryCancel(); });
    return FromGrpcStatus(PeerFor(address).stub->GetManifest(&ctx, request, &manifest));
  });
  if (Cancelled(canceller)) {
    return absl::CancelledError(absl::StrCat("manifest request to peer ", address, " cancelled"));
  }
  if (!s.ok()) return Annotate(s, absl::StrCat("peer ", address));
  return manifest;
}

namespace {

// GrpcPeerClient::StartGetManifest: Peer.GetManifest as a callback call,
// retried as GetManifest does (UNAVAILABLE only, for at most a second)
// after a backoff on a gRPC alarm: no thread waits for it. Alive while its
// call's callback, or keep_ during a backoff, holds a reference.
class ManifestCall : public std::enable_shared_from_this<ManifestCall> {
 public:
  using NewContext = std::function<std::unique_ptr<grpc::ClientContext>(absl::Duration)>;
  ManifestCall(shoal::v1::Peer::Stub* stub, NewContext new_context, std::string address,
               shoal::v1::GetModelManifestRequest request, absl::Duration timeout,
               const Clock* clock, shoal::CancellationToken* canceller,
               PeerClient::ManifestDone done)
      : stub_(stub),
        new_context_(std::move(new_context)),
        address_(std::move(address)),
        request_(std::move(request)),
        clock_(clock),
        end_(clock->Now() + timeout),
        // Bounded to a second, so a holder that is down costs little.
        retry_until_(clock->Now() + std::min(timeout, absl::Seconds(1))),
        canceller_(canceller),
        done_(std::move(done)),
        backoff_(absl::Milliseconds(10), absl::Milliseconds(200)) {}

  void Start() {
    if (canceller_ != nullptr) {
      // A weak reference: a call that ended is let go. Runs at once (and
      // returns 0) when the token is cancelled already.
      std::weak_ptr<ManifestCall> weak = weak_from_this();
      const uint64_t id = canceller_->Register([weak] {
        if (std::shared_ptr<ManifestCall> self = weak.lock()) self->Cancel();
      });
      absl::MutexLock lock(&mu_);
      cancel_id_ = id;
    }
    Attempt();
  }

 private:
  void Attempt() {
    const absl::Time now = clock_->Now();
    const absl::Duration left = end_ - now;
    grpc::ClientContext* ctx = nullptr;
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      waiting_ = false;
      cancelled = cancelled_;
      // No attempt starts past the retries' second (Retry's rule).
      if (!cancelled && left > absl::ZeroDuration() && (attempts_ == 0 || now < retry_until_)) {
        ctx_ = new_context_(left);
        ctx = ctx_.get();
      }
    }
    if (cancelled) return Finish(CancelledStatus());
    if (ctx == nullptr) {
      return Finish(GaveUp(absl::DeadlineExceededError("no time left for an attempt")));
    }
    ++attempts_;
    manifest_.Clear();
    // A TryCancel from now on (Cancel) cancels the call as soon as it starts.
    std::shared_ptr<ManifestCall> self = shared_from_this();
    stub_->async()->GetManifest(ctx, &request_, &manifest_, [self](grpc::Status status) {
      self->OnDone(FromGrpcStatus(status));
    });
  }

  void OnDone(absl::Status s) {
    std::unique_ptr<grpc::ClientContext> ctx;
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      ctx = std::move(ctx_);
      cancelled = cancelled_;
    }
    // The context holds a reference to the channel: let it go before the
    // caller hears the end and may destroy the client.
    ctx.reset();
    if (s.ok()) return Finish(std::move(manifest_));
    if (cancelled) return Finish(CancelledStatus());
    RetryPolicy policy;
    policy.unavailable_only = true;
    const absl::Time now = clock_->Now();
    if (!ShouldRetry(policy, s)) return Finish(Annotate(s, absl::StrCat("peer ", address_)));
    last_ = s;
    if (now >= retry_until_ || now >= end_) return Finish(GaveUp(s));
    const absl::Duration pause = std::min(backoff_.Next(), retry_until_ - now);
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) {
        waiting_ = true;
        // The alarm keeps its function after it ran: it holds no
        // reference, keep_ does until it fires. gRPC's alarms run on
        // wall-clock time: the same distance ahead.
        keep_ = shared_from_this();
        alarm_.Set(absl::ToChronoTime(absl::Now() + pause), [this](bool) {
          std::shared_ptr<ManifestCall> self;
          {
            absl::MutexLock lock(&mu_);
            self = std::move(keep_);
          }
          Attempt();
        });
        return;
      }
    }
    Finish(CancelledStatus());
  }

  // Runs under the canceller's lock: quick, and never calls `done_` here.
  void Cancel() {
    bool waiting;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return;
      cancelled_ = true;
      waiting = waiting_;
      // Under mu_, so that OnDone cannot take the context meanwhile; gRPC
      // never runs a client callback inside TryCancel.
      if (ctx_ != nullptr) ctx_->TryCancel();
    }
    // The alarm's callback then runs at once (not here) and ends the call.
    if (waiting) alarm_.Cancel();
  }

  absl::Status CancelledStatus() const {
    return absl::CancelledError(absl::StrCat("manifest request to peer ", address_, " cancelled"));
  }
  // What GetManifest's Retry returns once no attempt may start any more.
  absl::Status GaveUp(const absl::Status& why) const {
    const absl::Status s =
        last_.ok() ? why : Annotate(last_, absl::StrCat("gave up after ", attempts_, " attempts"));
    return Annotate(s, absl::StrCat("peer ", address_));
  }

  void Finish(absl::StatusOr<shoal::v1::ModelManifest> result) {
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      id = cancel_id_;
    }
    // Not under mu_: the token's callback (Cancel) takes it.
    if (canceller_ != nullptr) canceller_->Unregister(id);
    done_(std::move(result));
  }

  shoal::v1::Peer::Stub* const stub_;
  const NewContext new_context_;
  const std::string address_;
  const shoal::v1::GetModelManifestRequest request_;
  const Clock* const clock_;
  const absl::Time end_;
  const absl::Time retry_until_;
  shoal::CancellationToken* const canceller_;
  const PeerClient::ManifestDone done_;
  // Touched by one attempt's completion at a time (attempts never overlap).
  Backoff backoff_;
  shoal::v1::ModelManifest manifest_;
  absl::Status last_;  // the last failure retried
  int attempts_ = 0;
  grpc::Alarm alarm_;

  absl::Mutex mu_;
  std::unique_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);  // taken by OnDone
  uint64_t cancel_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;  // for the backoff alarm
  std::shared_ptr<ManifestCall> keep_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// GrpcPeerClient::StartPush: the Peer.Push stream written by gRPC's
// callback API, one message in flight: the header, then 1 MiB pieces of
// the caller's bytes with their CRC-32C (as Push writes them). Deletes
// itself once it has reported.
class PushCall final : public grpc::ClientWriteReactor<shoal::v1::PushMessage> {
 public:
  PushCall(std::unique_ptr<grpc::ClientContext> ctx, std::string address,
           const shoal::v1::PushHeader& header, absl::string_view bytes,
           shoal::CancellationToken* canceller, PeerClient::StatusDone done)
      : ctx_(std::move(ctx)),
        address_(std::move(address)),
        round_(header.round()),
        bytes_(bytes),
        canceller_(canceller),
        done_(std::move(done)) {
    *message_.mutable_header() = header;
  }

  void Start(shoal::v1::Peer::Stub* stub) {
    grpc::ClientContext* ctx = ctx_.get();
    // Unregistered in OnDone, which gRPC never runs inside TryCancel.
    if (canceller_ != nullptr) cancel_id_ = canceller_->Register([ctx] { ctx->TryCancel(); });
    stub->async()->Push(ctx, &response_, this);
    StartWrite(&message_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the stream broke: OnDone hears why
    if (at_ >= bytes_.size()) {
      StartWritesDone();
      return;
    }
    constexpr size_t kPiece = size_t{1} << 20;
    const absl::string_view data = bytes_.substr(at_, kPiece);
    shoal::v1::EncodedPiece* piece = message_.mutable_piece();
    piece->set_round(round_);
    piece->set_total_bytes(bytes_.size());
    piece->set_offset(at_);
    piece->set_data(data.data(), data.size());
    piece->set_crc32c(Crc32c(data.data(), data.size()));
    at_ += data.size();
    StartWrite(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    if (canceller_ != nullptr) canceller_->Unregister(cancel_id_);
    const bool cancelled = canceller_ != nullptr && canceller_->cancelled();
    // The channel's reference goes before the caller hears the end.
    ctx_.reset();
    absl::Status s = FromGrpcStatus(status);
    if (cancelled && !s.ok()) {
      s = absl::CancelledError(absl::StrCat("push to peer ", address_, " cancelled"));
    } else {
      s = Annotate(s, absl::StrCat("push to peer ", address_));
    }
    done_(std::move(s));
    delete this;
  }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  const std::string address_;
  const uint64_t round_;
  const absl::string_view bytes_;
  shoal::CancellationToken* const canceller_;
  const PeerClient::StatusDone done_;
  uint64_t cancel_id_ = 0;
  // Touched by one write's completion at a time (writes never overlap).
  shoal::v1::PushMessage message_;
  shoal::v1::PushResponse response_;
  size_t at_ = 0;
};

}  // namespace

void GrpcPeerClient::StartGetManifest(const std::string& address, uint64_t round,
                                      const std::string& reader_id, absl::Duration timeout,
                                      shoal::CancellationToken* canceller, ManifestDone done) {
  shoal::v1::GetModelManifestRequest request;
  request.set_round(round);
  request.set_reader_id(reader_id);
  auto call = std::make_shared<ManifestCall>(
      PeerFor(address).stub.get(), [this](absl::Duration left) { return NewContext(left); },
      address, std::move(request), timeout, clock_, canceller, std::move(done));
  call->Start();
}

void GrpcPeerClient::StartPush(const std::string& address, const shoal::v1::PushHeader& header,
                               absl::string_view bytes, absl::Duration timeout,
                               shoal::CancellationToken* canceller, StatusDone done) {
  // The deadline and the member credential, as Push's.
  auto* call =
      new PushCall(NewContext(timeout), address, header, bytes, canceller, std::move(done));
  call->Start(PeerFor(address).stub.get());
}

void GrpcPeerClient::StartProbe(const std::string& address, absl::Duration timeout,
                                shoal::CancellationToken* canceller, InfoDone done) {
  // What the call writes into, alive until its callback has run.
  struct Call {
    std::unique_ptr<grpc::ClientContext> ctx;
    shoal::v1::GetPeerInfoRequest request;
    shoal::v1::PeerInfo info;
    uint64_t cancel_id = 0;
  };
  auto call = std::make_shared<Call>();
  call->ctx = NewContext(timeout);
  call->ctx->set_wait_for_ready(true);  // connect within the timeout, as Probe
  grpc::ClientContext* const ctx = call->ctx.get();
  if (canceller != nullptr) {
    // Unregistered by the completion, which gRPC never runs inside
    // TryCancel (client callbacks are not inlined).
    call->cancel_id = canceller->Register([ctx] { ctx->TryCancel(); });
  }
  PeerFor(address).stub->async()->GetPeerInfo(
      ctx, &call->request, &call->info,
      [call, address, canceller, done = std::move(done)](grpc::Status status) {
        if (canceller != nullptr) canceller->Unregister(call->cancel_id);
        // The channel's reference goes before the caller hears the end.
        call->ctx.reset();
        if (!status.ok()) {
          done(Annotate(FromGrpcStatus(status), absl::StrCat("peer ", address)));
        } else {
          done(std::move(call->info));
        }
      });
}

absl::StatusOr<shoal::v1::PeerInfo> GrpcPeerClient::Probe(const std::string& address,
                                                          absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  ctx.set_wait_for_ready(true);  // connect within the timeout, not fail fast
  shoal::v1::PeerInfo info;
  absl::Status s = FromGrpcStatus(
      PeerFor(address).stub->GetPeerInfo(&ctx, shoal::v1::GetPeerInfoRequest(), &info));
  if (!s.ok()) return Annotate(s, absl::StrCat("peer ", address));
  return info;
}

std::vector<absl::Status> GrpcPeerClient::ProbeAll(const std::vector<std::string>& addresses,
                                                   absl::Duration timeout) {
  // What the calls' callbacks write into: kept alive by each callback, so a
  // call that outlives this method (it cannot by more than a moment: each
  // has the deadline) writes into memory that is still there.
  struct Call {
    grpc::ClientContext ctx;
    shoal::v1::GetPeerInfoRequest request;
    shoal::v1::PeerInfo info;
  };
  struct Probes {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::vector<absl::Status> results ABSL_GUARDED_BY(mu);
    std::vector<std::unique_ptr<Call>> calls;
  };
  auto probes = std::make_shared<Probes>();
  {
    absl::MutexLock lock(&probes->mu);
    probes->left = addresses.size();
    probes->results.assign(addresses.size(),
                           absl::DeadlineExceededError("no answer within the probe's deadline"));
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    probes->calls.push_back(std::make_unique<Call>());
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    Call* call = probes->calls[i].get();
    Prepare(&call->ctx, timeout);
    call->ctx.set_wait_for_ready(true);  // connect within the timeout, not fail fast
    const std::string address = addresses[i];
    PeerFor(address).stub->async()->GetPeerInfo(
        &call->ctx, &call->request, &call->info, [probes, i, address](grpc::Status status) {
          absl::MutexLock lock(&probes->mu);
          probes->results[i] =
              status.ok() ? absl::OkStatus()
                          : Annotate(FromGrpcStatus(status), absl::StrCat("peer ", address));
          --probes->left;
        });
  }
  std::vector<absl::Status> results;
  bool done = false;
  {
    absl::MutexLock lock(&probes->mu);
    auto all_done = [&probes]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(probes->mu) { return probes->left == 0; };
    // Each call ends by its deadline; the margin covers the callbacks' run.
    done = probes->mu.AwaitWithTimeout(absl::Condition(&all_done), timeout + absl::Seconds(1));
    results = probes->results;
  }
  if (!done) {
    // Outside the lock: a cancelled call's callback may run right away.
    for (auto& call : probes->calls) call->ctx.TryCancel();
  }
  return results;
}

}  // namespace shoal::worker
