#include "services/worker/peer_client.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/status_util.h"

namespace shoal::worker {

shoal::v1::Peer::Stub* GrpcPeerClient::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) stub = shoal::v1::Peer::NewStub(MakeChannel(address));
  return stub.get();
}

absl::Status GrpcPeerClient::ReadSlice(const std::string& address,
                                       const shoal::v1::ReadSliceRequest& request,
                                       absl::Duration timeout,
                                       const std::function<bool(const ChunkView&)>& on_chunk) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  auto reader = StubFor(address)->ReadSlice(&ctx, request);
  ChunkReceiver receiver(request.round(), request.begin(), request.end());
  shoal::v1::TensorChunk chunk;
  absl::Status bad;
  while (reader->Read(&chunk)) {
    absl::StatusOr<ChunkView> view = receiver.Accept(chunk);
    if (!view.ok()) {
      bad = Annotate(view.status(), absl::StrCat("from peer ", address));
      break;
    }
    if (!on_chunk(*view)) {
      bad = absl::CancelledError("read cancelled by the caller");
      break;
    }
  }
  if (!bad.ok()) {
    ctx.TryCancel();
    (void)reader->Finish();
    return bad;
  }
  absl::Status s = FromGrpcStatus(reader->Finish());
  if (!s.ok()) return Annotate(s, absl::StrCat("peer ", address));
  return Annotate(receiver.Finish(), absl::StrCat("from peer ", address));
}

absl::StatusOr<shoal::v1::PeerInfo> GrpcPeerClient::Probe(const std::string& address,
                                                          absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  ctx.set_wait_for_ready(true);  // connect within the timeout, not fail fast
  shoal::v1::PeerInfo info;
  absl::Status s =
      FromGrpcStatus(StubFor(address)->GetPeerInfo(&ctx, shoal::v1::GetPeerInfoRequest(), &info));
  if (!s.ok()) return Annotate(s, absl::StrCat("peer ", address));
  return info;
}

}  // namespace shoal::worker
