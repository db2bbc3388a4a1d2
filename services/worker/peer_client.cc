#include "services/worker/peer_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
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

void GrpcPeerClient::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(DeadlineIn(timeout));
  if (credential_ != nullptr) AddMemberCredential(*credential_, ctx);
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
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  ScopedCancelCallback cancel_call(canceller, [&ctx] { ctx.TryCancel(); });
  absl::Status s = ReadChunkStream(PeerFor(address).generic.get(), &ctx, request,
                                   absl::StrCat("peer ", address), on_chunk);
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
