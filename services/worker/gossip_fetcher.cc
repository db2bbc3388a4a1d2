#include "services/worker/gossip_fetcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/retry.h"
#include "common/tensor_wire_grpc.h"
#include "services/worker/blob_reader.h"
#include "services/worker/core/transfer_checks.h"

namespace shoal::worker {

// One fetch: GetPeerInfo, then the model (raw chunks or the encoded blob),
// then behind NAT the push back, each step started from the previous one's
// callback. Alive while a call's callback holds a reference (and while the
// caller of Begin keeps one). Cancelled with the fetcher's token (a
// registration, not a child token: nothing here touches the fetcher once
// the fetch has ended) or by Cancel().
class GossipFetcher::Fetch : public std::enable_shared_from_this<Fetch> {
 public:
  struct Spec {
    PeerClient* peers;
    const Clock* clock;
    const Codec* codec;  // null or fp32: float32 reads
    std::string reader_id;
    std::string peer_id;
    std::string address;
    uint64_t elements;
    absl::Duration timeout;
    bool push;
  };

  Fetch(Spec spec, std::shared_ptr<const GossipCopy> base, CancellationToken* parent,
        std::vector<float>* incoming, std::shared_ptr<State> state,
        std::function<void(GossipFetchResult)> done)
      : spec_(std::move(spec)),
        base_(std::move(base)),
        parent_(parent),
        incoming_(incoming),
        state_(std::move(state)),
        done_(std::move(done)) {}

  void Start() {
    std::weak_ptr<Fetch> weak = weak_from_this();
    // Runs at once when the fetcher's token is cancelled already.
    parent_id_ = parent_->Register([weak] {
      if (std::shared_ptr<Fetch> self = weak.lock()) self->Cancel();
    });
    t0_ = spec_.clock->Now();
    deadline_ = t0_ + spec_.timeout;
    result_.peer_id = spec_.peer_id;
    result_.address = spec_.address;
    result_.base = base_;
    // GetPeerInfo is tiny: at most 2 s of the budget, so that a peer that
    // stopped answering costs no more than that here.
    std::shared_ptr<Fetch> self = shared_from_this();
    spec_.peers->StartProbe(
        spec_.address, std::min(spec_.timeout, absl::Seconds(2)), &cancel_,
        [self](absl::StatusOr<shoal::v1::PeerInfo> info) { self->OnInfo(std::move(info)); });
  }

  // Ends the fetch at once (CANCELLED, or ABORTED from the blob read).
  void Cancel() { cancel_.Cancel(); }

 private:
  void OnInfo(absl::StatusOr<shoal::v1::PeerInfo> info) {
    if (!info.ok()) return Fail(info.status());
    if (absl::Status s = CheckGossipPeerInfo(*info, spec_.elements); !s.ok()) return Fail(s);
    const absl::Duration left = deadline_ - spec_.clock->Now();
    if (left <= absl::ZeroDuration()) {
      return Fail(absl::DeadlineExceededError("no time left after GetPeerInfo"));
    }
    if (cancel_.cancelled()) return Fail(absl::CancelledError("gossip fetch cancelled"));
    info_ = std::move(*info);
    incoming_->resize(spec_.elements);
    if (spec_.codec != nullptr && !spec_.codec->raw()) return ReadEncoded();
    ReadRaw(left);
  }

  void ReadRaw(absl::Duration left) {
    float* dst = incoming_->data();
    ChunkStreamCallbacks callbacks;
    // ChunkReceiver keeps chunks within [0, elements).
    callbacks.on_chunk = [dst](const ChunkView& v) {
      v.CopyTo(dst + v.begin);
      return ChunkNext::kRead;
    };
    std::shared_ptr<Fetch> self = shared_from_this();
    callbacks.on_done = [self](absl::Status s, uint64_t) { self->OnRead(std::move(s)); };
    std::shared_ptr<ChunkStreamCall> call = spec_.peers->StartReadSlice(
        spec_.address, GossipReadRequest(info_, spec_.elements, spec_.reader_id), left,
        std::move(callbacks));
    // Cancels at once when the fetch is cancelled already. The
    // registration holds the call; OnRead lets it go.
    const uint64_t id = cancel_.Register([call] { call->Cancel(); });
    bool over;
    {
      absl::MutexLock lock(&mu_);
      over = read_over_;
      if (!over) read_cancel_id_ = id;
    }
    if (over) cancel_.Unregister(id);
  }

  void OnRead(absl::Status s) {
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      read_over_ = true;
      id = read_cancel_id_;
    }
    cancel_.Unregister(id);
    if (!s.ok()) return Fail(std::move(s));
    result_.wire_bytes = spec_.elements * sizeof(float);
    Fetched();
  }

  void ReadEncoded() {
    // Whole or nothing, like the float32 read: one attempt within the
    // deadline, every piece checked, then decoded (nothing is written on a
    // bad encoding).
    RetryPolicy once;
    once.max_attempts = 1;
    std::shared_ptr<Fetch> self = shared_from_this();
    StartBlobRead(spec_.peers, spec_.address,
                  GossipEncodedRequest(info_, spec_.elements, spec_.reader_id),
                  {spec_.codec->MaxEncodedBytes(spec_.elements), false}, once, deadline_,
                  spec_.clock, &cancel_, nullptr,
                  [self](absl::StatusOr<std::string> bytes) { self->OnBlob(std::move(bytes)); });
  }

  void OnBlob(absl::StatusOr<std::string> bytes) {
    if (!bytes.ok()) return Fail(bytes.status());
    // On this gRPC callback thread: the pull is over, the model's decode
    // is the last step (the worker's main thread keeps training).
    absl::Status d = spec_.codec->DecodeSlice(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
        spec_.elements, incoming_->data());
    if (!d.ok()) return Fail(d);
    result_.wire_bytes = bytes->size();
    Fetched();
  }

  // The peer's model is in `incoming_`: the result, after the push back
  // when there is one.
  void Fetched() {
    result_.publication = info_.gossip_publication();
    result_.peer_clock = info_.gossip_clock();
    result_.peer_loss = info_.gossip_loss();
    result_.peer_params = incoming_->data();
    result_.elements = spec_.elements;
    result_.took = spec_.clock->Now() - t0_;
    if (!spec_.push || base_ == nullptr) return Finish();
    // Behind NAT nobody fetches from us: the partner gets our model in the
    // same outbound exchange, within what is left of the deadline. Its
    // failure does not undo the fetch.
    const GossipCopy& base = *base_;
    shoal::v1::PushHeader header;
    header.set_gossip(true);
    header.set_round(base.publication);
    header.set_begin(0);
    header.set_end(spec_.elements);
    header.set_pusher_id(spec_.reader_id);
    header.set_total_bytes(spec_.elements * sizeof(float));
    header.set_gossip_clock(base.clock);
    header.set_gossip_loss(base.loss);
    std::shared_ptr<Fetch> self = shared_from_this();
    // base_ (the bytes) is let go only in Finish.
    spec_.peers->StartPush(spec_.address, header,
                           absl::string_view(reinterpret_cast<const char*>(base.params.data()),
                                             spec_.elements * sizeof(float)),
                           std::max(deadline_ - spec_.clock->Now(), absl::Milliseconds(1)),
                           &cancel_, [self](absl::Status s) {
                             self->result_.push_status = std::move(s);
                             self->result_.pushed = self->result_.push_status.ok();
                             self->Finish();
                           });
  }

  void Fail(absl::Status s) {
    result_.not_answering = absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s);
    result_.status = absl::Status(s.code(), absl::StrCat("gossip fetch from ", spec_.peer_id, " (",
                                                         spec_.address, "): ", s.message()));
    result_.took = spec_.clock->Now() - t0_;
    Finish();
  }

  // The steps never overlap: each runs after the previous one's call ended,
  // so result_ needs no lock.
  void Finish() {
    // Not under any lock of ours: the fetcher's token may be running our
    // registration (Cancel), which Unregister waits for.
    parent_->Unregister(parent_id_);
    base_.reset();  // the result holds it (and the board may reuse it once free)
    done_(std::move(result_));
    std::shared_ptr<State> state = state_;
    absl::MutexLock lock(&state->mu);
    --state->in_flight;  // the last touch of the fetcher
  }

  const Spec spec_;
  std::shared_ptr<const GossipCopy> base_;
  CancellationToken* const parent_;
  std::vector<float>* const incoming_;
  const std::shared_ptr<State> state_;
  const std::function<void(GossipFetchResult)> done_;
  // This fetch's own token: every call of it hears it.
  CancellationToken cancel_;
  uint64_t parent_id_ = 0;
  absl::Time t0_;
  absl::Time deadline_;
  shoal::v1::PeerInfo info_;
  GossipFetchResult result_;

  absl::Mutex mu_;
  bool read_over_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t read_cancel_id_ ABSL_GUARDED_BY(mu_) = 0;
};

GossipFetcher::GossipFetcher(PeerClient* peers, std::string reader_id, const Clock* clock,
                             CancellationToken* stop)
    : peers_(peers),
      reader_id_(std::move(reader_id)),
      clock_(clock != nullptr ? clock : RealClock::Get()),
      token_(stop) {}

GossipFetcher::~GossipFetcher() {
  token_.Cancel();
  // Cancelled calls end at once, and every call has its deadline: this
  // wait ends. Until it does, a fetch may still write into incoming_.
  const absl::Time since = absl::Now();
  absl::MutexLock lock(&state_->mu);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) { return state_->in_flight == 0; };
  while (!state_->mu.AwaitWithTimeout(absl::Condition(&none), absl::Seconds(10))) {
    SHOAL_LOG(WARNING) << "gossip: " << state_->in_flight
                       << " cancelled fetches have not ended after "
                       << absl::FormatDuration(absl::Now() - since) << "; still waiting";
  }
}

std::shared_ptr<GossipFetcher::Fetch> GossipFetcher::Begin(
    const std::string& peer_id, const std::string& address, uint64_t elements,
    absl::Duration timeout, bool push, std::shared_ptr<const GossipCopy> base,
    std::function<void(GossipFetchResult)> done) {
  {
    absl::MutexLock lock(&state_->mu);
    ++state_->in_flight;
  }
  Fetch::Spec spec{peers_, clock_, codec_, reader_id_, peer_id, address, elements, timeout, push};
  auto fetch = std::make_shared<Fetch>(std::move(spec), std::move(base), &token_, &incoming_,
                                       state_, std::move(done));
  fetch->Start();
  return fetch;
}

bool GossipFetcher::Start(const std::string& peer_id, const std::string& address, uint64_t elements,
                          absl::Duration timeout, std::shared_ptr<const GossipCopy> base) {
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->running || state_->result.has_value()) return false;
    state_->running = true;
  }
  Begin(peer_id, address, elements, timeout, push_own_, std::move(base),
        [state = state_](GossipFetchResult r) {
          absl::MutexLock lock(&state->mu);
          state->result = std::move(r);
          state->running = false;
        });
  return true;
}

std::optional<GossipFetchResult> GossipFetcher::Take() {
  absl::MutexLock lock(&state_->mu);
  if (state_->running || !state_->result.has_value()) return std::nullopt;
  std::optional<GossipFetchResult> r = std::move(state_->result);
  state_->result.reset();
  return r;
}

bool GossipFetcher::idle() const {
  absl::MutexLock lock(&state_->mu);
  return !state_->running && !state_->result.has_value();
}

GossipFetchResult GossipFetcher::FetchNow(const std::string& peer_id, const std::string& address,
                                          uint64_t elements, absl::Duration timeout) {
  struct Waited {
    absl::Mutex mu;
    std::optional<GossipFetchResult> result ABSL_GUARDED_BY(mu);
  };
  auto waited = std::make_shared<Waited>();
  std::shared_ptr<Fetch> fetch = Begin(peer_id, address, elements, timeout, /*push=*/false, nullptr,
                                       [waited](GossipFetchResult r) {
                                         absl::MutexLock lock(&waited->mu);
                                         waited->result = std::move(r);
                                       });
  absl::MutexLock lock(&waited->mu);
  auto done = [&waited]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(waited->mu) { return waited->result.has_value(); };
  // Every call of the fetch is bounded by what is left of `timeout`; a
  // margin, then cancel it and wait for its end (it writes into incoming_).
  const absl::Time wall = absl::Now() + timeout + absl::Seconds(5);
  if (!waited->mu.AwaitWithDeadline(absl::Condition(&done), wall)) {
    waited->mu.Unlock();
    fetch->Cancel();
    waited->mu.Lock();
    waited->mu.Await(absl::Condition(&done));
  }
  return std::move(*waited->result);
}

}  // namespace shoal::worker
