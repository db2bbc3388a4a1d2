#include "services/worker/gossip_fetcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/retry.h"
#include "services/worker/blob_reader.h"
#include "services/worker/core/transfer_checks.h"

namespace shoal::worker {

GossipFetcher::GossipFetcher(PeerClient* peers, std::string reader_id, const Clock* clock,
                             CancellationToken* stop)
    : peers_(peers),
      reader_id_(std::move(reader_id)),
      clock_(clock != nullptr ? clock : RealClock::Get()),
      token_(stop) {}

GossipFetcher::~GossipFetcher() {
  token_.Cancel();
  Join();
}

void GossipFetcher::Join() {
  if (thread_.joinable()) thread_.join();
}

bool GossipFetcher::Start(const std::string& peer_id, const std::string& address, uint64_t elements,
                          absl::Duration timeout, std::shared_ptr<const GossipCopy> base) {
  if (running_.load() || has_result_.load()) return false;
  Join();
  running_ = true;
  thread_ = std::thread([this, peer_id, address, elements, timeout, base = std::move(base)] {
    const absl::Time deadline = clock_->Now() + timeout;
    GossipFetchResult r = Fetch(peer_id, address, elements, timeout);
    r.base = base;
    // Behind NAT nobody fetches from us: the partner gets our model in the
    // same outbound exchange, within what is left of the deadline. Its
    // failure does not undo the fetch.
    if (push_own_ && r.status.ok() && base != nullptr) {
      shoal::v1::PushHeader header;
      header.set_gossip(true);
      header.set_round(base->publication);
      header.set_begin(0);
      header.set_end(elements);
      header.set_pusher_id(reader_id_);
      header.set_total_bytes(elements * sizeof(float));
      header.set_gossip_clock(base->clock);
      header.set_gossip_loss(base->loss);
      r.push_status =
          peers_->Push(address, header,
                       absl::string_view(reinterpret_cast<const char*>(base->params.data()),
                                         elements * sizeof(float)),
                       std::max(deadline - clock_->Now(), absl::Milliseconds(1)), &token_);
      r.pushed = r.push_status.ok();
    }
    result_ = std::move(r);
    has_result_ = true;
    running_ = false;
  });
  return true;
}

std::optional<GossipFetchResult> GossipFetcher::Take() {
  if (running_.load() || !has_result_.load()) return std::nullopt;
  Join();
  has_result_ = false;
  return std::move(result_);
}

GossipFetchResult GossipFetcher::FetchNow(const std::string& peer_id, const std::string& address,
                                          uint64_t elements, absl::Duration timeout) {
  return Fetch(peer_id, address, elements, timeout);
}

GossipFetchResult GossipFetcher::Fetch(const std::string& peer_id, const std::string& address,
                                       uint64_t elements, absl::Duration timeout) {
  GossipFetchResult r;
  r.peer_id = peer_id;
  r.address = address;
  const absl::Time t0 = clock_->Now();
  const absl::Time deadline = t0 + timeout;
  auto fail = [&](absl::Status s) {
    r.not_answering = absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s);
    r.status = absl::Status(
        s.code(), absl::StrCat("gossip fetch from ", peer_id, " (", address, "): ", s.message()));
    r.took = clock_->Now() - t0;
    return r;
  };
  // GetPeerInfo is tiny: at most 2 s of the budget, so that a peer that
  // stopped answering (and a worker shutting down, which cannot cancel
  // this call) waits no longer than that here.
  absl::StatusOr<shoal::v1::PeerInfo> info =
      peers_->Probe(address, std::min(timeout, absl::Seconds(2)));
  if (!info.ok()) return fail(info.status());
  if (absl::Status s = CheckGossipPeerInfo(*info, elements); !s.ok()) return fail(s);
  const absl::Duration left = deadline - clock_->Now();
  if (left <= absl::ZeroDuration()) {
    return fail(absl::DeadlineExceededError("no time left after GetPeerInfo"));
  }
  incoming_.resize(elements);
  float* dst = incoming_.data();
  if (codec_ != nullptr && !codec_->raw()) {
    // Whole or nothing, like the float32 read: one attempt within the
    // deadline, every piece checked, then decoded (nothing is written on
    // a bad encoding).
    RetryPolicy once;
    once.max_attempts = 1;
    absl::StatusOr<std::string> bytes = ReadBlobWithRetry(
        peers_, address, GossipEncodedRequest(*info, elements, reader_id_),
        {codec_->MaxEncodedBytes(elements), false}, once, deadline, clock_, &token_, nullptr);
    if (!bytes.ok()) return fail(bytes.status());
    absl::Status d = codec_->DecodeSlice(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
        elements, dst);
    if (!d.ok()) return fail(d);
    r.wire_bytes = bytes->size();
  } else {
    const shoal::v1::ReadSliceRequest req = GossipReadRequest(*info, elements, reader_id_);
    absl::Status s =
        peers_->ReadSliceCancellable(address, req, left, &token_, [&](const ChunkView& v) {
          v.CopyTo(dst + v.begin);
          return true;
        });
    if (!s.ok()) return fail(s);
    r.wire_bytes = elements * sizeof(float);
  }
  r.publication = info->gossip_publication();
  r.peer_clock = info->gossip_clock();
  r.peer_loss = info->gossip_loss();
  r.peer_params = incoming_.data();
  r.elements = elements;
  r.took = clock_->Now() - t0;
  return r;
}

}  // namespace shoal::worker
