#include "services/worker/peer_service.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/member_credentials_grpc.h"
#include "common/model_file.h"
#include "common/reactor_handoff.h"
#include "common/status_util.h"
#include "common/tensor_wire_grpc.h"
#include "services/worker/core/transfer_checks.h"

namespace shoal::worker {
namespace {

using Buffer = ModelState::Buffer;

// Destroy functions of the slices that point into model memory: gRPC calls
// them when it drops its last reference, i.e. when it will not read the
// bytes again (after they were written to the socket, or were dropped by a
// cancelled stream).
void ReturnParameterChunk(void* state) {
  static_cast<const ModelState*>(state)->ReturnChunk(Buffer::kParameters);
}
void ReturnSnapshotChunk(void* state) {
  static_cast<const ModelState*>(state)->ReturnChunk(Buffer::kSnapshot);
}

// Serves one ReadSlice call: checks it against ModelState (parking an
// AVERAGED read until its slice is averaged), then writes the range chunk
// by chunk, one chunk in flight at a time, each lent by ModelState.
//
// Lifetime: reference-counted. gRPC holds one reference until OnDone,
// ModelState one while the reactor is registered as an observer (and one
// during each notification), each pending alarm one. So a notification or
// an alarm never runs on a deleted reactor.
class ReadSliceReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                               public ModelState::Observer {
 public:
  ReadSliceReactor(const ModelState* state, RateLimiter* limiter, const PeerServiceOptions& options,
                   grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw_request,
                   PeerSentBytes* sent, std::shared_ptr<void> slot)
      : slot_(std::move(slot)),
        sent_(sent),
        state_(state),
        limiter_(limiter),
        ctx_(ctx),
        clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
        created_(clock_->Now()),
        averaged_wait_(options.averaged_wait) {
    ReactionScope reaction(this);
    if (absl::Status s = DecodeReadSliceRequest(*raw_request, &request_); !s.ok()) {
      FinishOnce(ToGrpcStatus(s));
      return;
    }
    next_ = request_.begin();
    end_ = request_.end();
    snapshot_ = request_.kind() == shoal::v1::SNAPSHOT;
    // Park at most `averaged_wait`, and end before the reader's deadline so
    // that it hears why rather than DEADLINE_EXCEEDED: a quarter of the time
    // left, up to 500 ms, ahead of it (room for a busy machine's scheduling).
    const absl::Time now = clock_->Now();
    // The reader's deadline is wall-clock time; read it on the injected clock.
    reader_deadline_ = now + (absl::FromChrono(ctx->deadline()) - RealClock::Get()->Now());
    park_until_ = ParkUntil(now);
    // Registered before the first check, so that no change between that
    // check and the park can go unnoticed.
    state_->AddObserver(this);
    Check(/*timer_expired=*/false);
  }

  // ModelState::Observer
  void AddRef() override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Release() override {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  void OnServingChange(bool revoke) override {
    if (!revoke) {
      bool waiting;
      {
        absl::MutexLock lock(&mu_);
        waiting = phase_ == Phase::kStarting || phase_ == Phase::kParked;
      }
      if (waiting) Check(/*timer_expired=*/false);
      return;
    }
    // The worker waits to rewrite a buffer whose window closed, and this
    // stream still has a chunk of it in gRPC's hands (its reader stopped
    // reading): cancelling the call makes gRPC drop the chunk. Under mu_, so
    // that OnDone (after which ctx_ is gone) cannot run meanwhile; gRPC runs
    // reactions on its own threads, never inside TryCancel.
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kStreaming && write_pending_ && !done_ && !state_->IsCurrent(grant_)) {
      SHOAL_VLOG(1) << "ReadSlice from " << request_.reader_id()
                    << ": cancelled, its reader holds a chunk of a closed window";
      ctx_->TryCancel();
    }
  }

  // gRPC reactions
  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this, &buffer_);
    buffer_.Clear();  // our reference to the lent slice
    if (ok) {
      (snapshot_ ? sent_->snapshot : sent_->exchange)
          .fetch_add(writing_bytes_, std::memory_order_relaxed);
    }
    {
      absl::MutexLock lock(&mu_);
      write_pending_ = false;
    }
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken while writing"));
    } else if (snapshot_ && !state_->IsCurrent(grant_)) {
      // As before zero-copy: a read during which the snapshot was replaced
      // ends ABORTED even after its last chunk (the reader starts over).
      FinishOnce(grpc::Status(grpc::StatusCode::ABORTED,
                              "the snapshot was replaced by a newer round during the read"));
    } else if (next_ < end_) {
      WriteNext();
    } else {
      FinishOnce(grpc::Status::OK);
    }
  }

  void OnCancel() override {
    ReactionScope reaction(this);
    bool parked;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      parked = phase_ == Phase::kParked;
    }
    // Pending timers fire at once (ok=false) and finish the call.
    absl::MutexLock lock(&alarm_mu_);
    if (parked && park_alarm_ != nullptr) park_alarm_->Cancel();
    if (pace_armed_) pace_alarm_.Cancel();
  }

  void OnDone() override {
    AfterAllReactions(this);
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    state_->RemoveObserver(this);
    Release();  // gRPC's reference
  }

 private:
  enum class Phase { kStarting, kParked, kStreaming, kFinished };

  ~ReadSliceReactor() override = default;

  // Decides what to do with the request (from the constructor, a ModelState
  // change, or the park timer): stream it, keep it parked, or refuse it.
  void Check(bool timer_expired) {
    {
      // A park timer that fired just as the read was decided otherwise may
      // run after OnDone, when ModelState may be gone: decided reads never
      // look at it again.
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kStarting && phase_ != Phase::kParked) return;
    }
    ModelState::ReadGrant grant;
    bool may_wait = false;
    // Parked in the middle of the stream: what is left of it.
    shoal::v1::ReadSliceRequest rest = request_;
    {
      absl::MutexLock lock(&mu_);
      if (mid_stream_) rest.set_begin(next_);
    }
    const absl::Status s = state_->CheckRead(rest, &grant, &may_wait);
    enum class Action { kNone, kPark, kStream, kFinish } action = Action::kNone;
    bool leave_park = false;
    uint64_t park_gen = 0;
    grpc::Status refusal;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kStarting && phase_ != Phase::kParked) return;  // decided already
      const bool parked = phase_ == Phase::kParked;
      // The park timer is cancelled when the park ends for another reason
      // (its callback then finds the phase changed and only lets go).
      if (s.ok()) {
        // A stream that parked keeps the window it started in.
        if (!mid_stream_) grant_ = grant;
        phase_ = Phase::kStreaming;
        action = Action::kStream;
        leave_park = parked && !timer_expired;
      } else if (may_wait && request_.kind() == shoal::v1::AVERAGED && !timer_expired &&
                 !cancelled_ && clock_->Now() < park_until_) {
        if (!parked) {
          phase_ = Phase::kParked;
          park_gen = ++park_gen_;
          action = Action::kPark;
        }
      } else {
        phase_ = Phase::kFinished;
        action = Action::kFinish;
        leave_park = parked && !timer_expired;
        refusal = ToGrpcStatus(s);
        if (timer_expired && may_wait) {
          refusal = grpc::Status(
              grpc::StatusCode::UNAVAILABLE,
              absl::StrCat(s.message(), " (waited ", absl::FormatDuration(clock_->Now() - created_),
                           " on the server)"));
        }
      }
    }
    switch (action) {
      case Action::kNone:
        return;
      case Action::kPark:
        SHOAL_VLOG(2) << "ReadSlice from " << request_.reader_id() << " parked: " << s;
        ArmPark(park_gen);
        return;
      case Action::kStream:
        if (leave_park) CancelParkAlarm();
        WriteNext();
        return;
      case Action::kFinish:
        if (leave_park) CancelParkAlarm();
        SHOAL_VLOG(1) << "ReadSlice from " << request_.reader_id() << " refused: " << s;
        FinishOnce(refusal);
        return;
    }
  }

  // How long a park may last from `now` (see the constructor).
  absl::Time ParkUntil(absl::Time now) const {
    absl::Time until = now + averaged_wait_;
    if (reader_deadline_ < until) {
      until = reader_deadline_ - std::min((reader_deadline_ - now) / 4, absl::Milliseconds(500));
    }
    return until;
  }

  // An AVERAGED stream reached the end of what its owner has averaged so
  // far (the reduce publishes the slice cell by cell): it waits for more,
  // parked as a read that has not started is.
  void ParkMidStream() {
    uint64_t gen;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kStreaming) return;
      phase_ = Phase::kParked;
      mid_stream_ = true;
      park_until_ = ParkUntil(clock_->Now());
      gen = ++park_gen_;
    }
    ArmPark(gen);
    // A change between the last look and the park must not go unheard.
    Check(/*timer_expired=*/false);
  }

  // The timer of park number `gen`: a new alarm each time, so that a
  // cancelled one whose callback has not run yet is never set again (its
  // callback then only finds its park over: OnParkTimer).
  void ArmPark(uint64_t gen) {
    absl::MutexLock lock(&alarm_mu_);
    {
      // The park may be over already (a change let the stream go on, and
      // it may even have parked again, with a newer timer: keep that one).
      absl::MutexLock state_lock(&mu_);
      if (phase_ != Phase::kParked || gen != park_gen_) return;
    }
    park_alarm_ = std::make_unique<grpc::Alarm>();  // the last one is cancelled, if pending
    AddRef();                                       // the alarm's
    // gRPC's alarms run on wall-clock time: the same distance ahead.
    park_alarm_->Set(absl::ToChronoTime(RealClock::Get()->Now() + (park_until_ - clock_->Now())),
                     [this, gen](bool ok) {
                       OnParkTimer(ok, gen);
                       Release();
                     });
  }

  void CancelParkAlarm() {
    absl::MutexLock lock(&alarm_mu_);
    if (park_alarm_ != nullptr) park_alarm_->Cancel();
  }

  void OnParkTimer(bool expired, uint64_t gen) {
    {
      // A park that is over (the stream went on, or parked again since).
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kParked || gen != park_gen_) return;
    }
    if (expired) {
      Check(/*timer_expired=*/true);
      return;
    }
    // Cancelled by OnCancel while still parked.
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kParked || gen != park_gen_) return;
      phase_ = Phase::kFinished;
    }
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED,
                            "read cancelled while waiting for the slice's average"));
  }

  void WriteNext() {
    uint64_t until = end_;
    if (request_.kind() == shoal::v1::AVERAGED) {
      // Only what the owner has averaged so far.
      until = std::min(until, state_->AveragedLimit(request_.round(), request_.attempt()));
      if (until <= next_) {
        ParkMidStream();
        return;
      }
    }
    // On the wire module's grid: a chunk is a whole cell (with its
    // precomputed CRC) whenever the range allows.
    const uint64_t count = NextChunk(next_, until).count;
    if (limiter_ != nullptr && limiter_->limited()) {
      const absl::Time when = limiter_->Reserve(count * kBytesPerElement);
      // The limiter reads the real clock, as the alarm below does.
      if (when > RealClock::Get()->Now()) {
        // Wait on a timer, not on this gRPC thread (nothing is lent yet).
        absl::MutexLock lock(&alarm_mu_);
        AddRef();  // the alarm's
        pace_armed_ = true;
        pace_alarm_.Set(absl::ToChronoTime(when), [this, count](bool ok) {
          // Captures copied first: once WriteChunk has started the write,
          // the next chunk's pacing may re-set this alarm (and so replace
          // this function) before we return.
          ReadSliceReactor* const self = this;
          const uint64_t n = count;
          {
            absl::MutexLock lock(&self->alarm_mu_);
            self->pace_armed_ = false;
          }
          if (!ok) {
            self->FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "upload pacing cancelled"));
          } else {
            self->WriteChunk(n);
          }
          self->Release();
        });
        return;
      }
    }
    WriteChunk(count);
  }

  void WriteChunk(uint64_t count) {
    absl::StatusOr<ModelState::LentChunk> lent = state_->LendChunk(grant_, next_, count);
    if (!lent.ok()) {
      SHOAL_VLOG(1) << "ReadSlice from " << request_.reader_id() << " stopped: " << lent.status();
      FinishOnce(ToGrpcStatus(lent.status()));
      return;
    }
    const size_t bytes = count * kBytesPerElement;
    {
      // Whole cells come with their CRC; a partial one (the ends of the
      // range) or a snapshot chunk is checksummed here, from the same
      // immutable bytes gRPC will send.
      const uint32_t crc = lent->has_crc ? lent->crc : Crc32c(lent->data, bytes);
      buffer_ = LentChunkBuffer(
          request_.round(), next_, lent->data, count, crc,
          grant_.buffer == Buffer::kSnapshot ? &ReturnSnapshotChunk : &ReturnParameterChunk,
          const_cast<ModelState*>(state_));
    }
    next_ += count;
    writing_bytes_ = bytes;
    {
      absl::MutexLock lock(&mu_);
      write_pending_ = true;
    }
    BeforeStart(&buffer_);
    StartWrite(&buffer_);
  }

  void FinishOnce(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      phase_ = Phase::kFinished;
    }
    Finish(std::move(status));
  }

  // This read's place under max_reads_per_peer, released with the reactor.
  const std::shared_ptr<void> slot_;
  PeerSentBytes* const sent_;
  uint64_t writing_bytes_ = 0;  // of the write in flight (one at a time)
  const ModelState* const state_;
  RateLimiter* const limiter_;
  grpc::CallbackServerContext* const ctx_;
  const Clock* const clock_;
  const absl::Time created_;
  std::atomic<int> refs_{1};  // gRPC's, until OnDone

  shoal::v1::ReadSliceRequest request_;
  bool snapshot_ = false;
  const absl::Duration averaged_wait_;
  absl::Time reader_deadline_;
  absl::Time park_until_;
  // Position of the stream: touched by one write step at a time.
  uint64_t next_ = 0;
  uint64_t end_ = 0;
  grpc::ByteBuffer buffer_;

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kStarting;
  ModelState::ReadGrant grant_;  // set when streaming starts, then constant
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  // Parked after streaming part of an AVERAGED slice (ParkMidStream).
  bool mid_stream_ ABSL_GUARDED_BY(mu_) = false;
  // Parks so far: a park timer of an earlier one is ignored.
  uint64_t park_gen_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;

  // Alarms are set and cancelled from different threads: serialized here.
  absl::Mutex alarm_mu_;
  std::unique_ptr<grpc::Alarm> park_alarm_ ABSL_GUARDED_BY(alarm_mu_);
  grpc::Alarm pace_alarm_;
  bool pace_armed_ ABSL_GUARDED_BY(alarm_mu_) = false;
};

// Each chunk of a gossip copy lent to gRPC holds a reference to the copy;
// gRPC drops it with the slice.
void ReleaseGossipCopy(void* arg) { delete static_cast<std::shared_ptr<const GossipCopy>*>(arg); }

// Serves one GOSSIP read: the whole (or a range of a) published copy, one
// chunk in flight at a time. The copy never changes (the board rewrites
// only copies nobody holds), so no window or revocation is needed.
// Deleted in OnDone.
class GossipReadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GossipReadReactor(const GossipBoard* board, const shoal::v1::ReadSliceRequest& request,
                    std::shared_ptr<void> slot)
      : slot_(std::move(slot)), request_(request) {
    ReactionScope reaction(this);
    if (board == nullptr) {
      FinishOnce(grpc::Status(grpc::StatusCode::NOT_FOUND,
                              "this worker does not gossip (the run is not in gossip mode)"));
      return;
    }
    absl::StatusOr<std::shared_ptr<const GossipCopy>> copy = board->Find(request.round());
    if (!copy.ok()) {
      FinishOnce(ToGrpcStatus(copy.status()));
      return;
    }
    copy_ = *std::move(copy);
    const uint64_t n = copy_->params.size();
    if (absl::Status s = CheckGossipRange(request, n); !s.ok()) {
      FinishOnce(ToGrpcStatus(s));
      return;
    }
    next_ = request.begin();
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this, &buffer_);
    buffer_.Clear();
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken while writing"));
    } else if (next_ < request_.end()) {
      WriteNext();
    } else {
      FinishOnce(grpc::Status::OK);
    }
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }

 private:
  void WriteNext() {
    const uint64_t count = NextChunk(next_, request_.end()).count;
    const float* data = copy_->params.data() + next_;
    const size_t bytes = count * kBytesPerElement;
    const uint32_t crc = Crc32c(data, bytes);
    buffer_ = LentChunkBuffer(request_.round(), next_, data, count, crc, &ReleaseGossipCopy,
                              new std::shared_ptr<const GossipCopy>(copy_));
    next_ += count;
    BeforeStart(&buffer_);
    StartWrite(&buffer_);
  }
  void FinishOnce(grpc::Status status) {
    if (finished_.exchange(true)) return;
    Finish(std::move(status));
  }

  const std::shared_ptr<void> slot_;  // as ReadSliceReactor's
  const shoal::v1::ReadSliceRequest request_;
  std::shared_ptr<const GossipCopy> copy_;
  uint64_t next_ = 0;
  grpc::ByteBuffer buffer_;
  std::atomic<bool> finished_{false};
};

// A read refused before it starts (no or a wrong token). Deletes itself.
class RefusedRead final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedRead(grpc::Status status) {
    ReactionScope reaction(this);
    Finish(std::move(status));
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* PeerService::ReadSlice(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  if (grpc::Status allowed = Allowed(ctx); !allowed.ok()) {
    return new RefusedRead(std::move(allowed));
  }
  std::shared_ptr<void> slot = read_slots_.Acquire(CallerHost(ctx->peer()));
  if (slot == nullptr) {
    return new RefusedRead(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("too many reads from ", CallerHost(ctx->peer()),
                     " at once (--max_reads_per_peer=", read_slots_.max(), "); retry")));
  }
  shoal::v1::ReadSliceRequest decoded;
  if (DecodeReadSliceRequest(*request, &decoded).ok() && decoded.kind() == shoal::v1::GOSSIP) {
    return new GossipReadReactor(gossip_board_.load(), decoded, std::move(slot));
  }
  return new ReadSliceReactor(state_, limiter_, options_, ctx, request, &sent_, std::move(slot));
}

grpc::ServerUnaryReactor* PeerService::GetManifest(
    grpc::CallbackServerContext* ctx, const shoal::v1::GetModelManifestRequest* request,
    shoal::v1::ModelManifest* response) {
  auto* reactor = ctx->DefaultReactor();
  if (grpc::Status allowed = Allowed(ctx); !allowed.ok()) {
    reactor->Finish(allowed);
    return reactor;
  }
  const std::string reader = request->reader_id();
  state_->GetManifest(
      request->round(), [reactor, response, reader](absl::StatusOr<shoal::v1::ModelManifest> m) {
        if (!m.ok()) {
          SHOAL_VLOG(1) << "GetManifest from " << reader << " refused: " << m.status();
          reactor->Finish(ToGrpcStatus(m.status()));
          return;
        }
        *response = *std::move(m);
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

absl::StatusOr<Blob> PeerService::FindGossipEncoding(
    const shoal::v1::ReadEncodedRequest& request) const {
  const GossipBoard* board = gossip_board_.load();
  if (board == nullptr) {
    return absl::NotFoundError("this worker does not gossip (the run is not in gossip mode)");
  }
  absl::StatusOr<std::shared_ptr<const GossipCopy>> copy = board->Find(request.round());
  if (!copy.ok()) return copy.status();
  if ((*copy)->encoded == nullptr) {
    return absl::FailedPreconditionError(
        "this worker's run gossips float32 models: read them with ReadSlice");
  }
  if (request.begin() != 0 || request.end() != (*copy)->params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an encoded gossip read is of the whole model [0, ", (*copy)->params.size(),
                     "), not [", request.begin(), ", ", request.end(), ")"));
  }
  return (*copy)->encoded;
}

namespace {

// Serves one ReadEncoded of the encoded exchange. A piece its owner has not
// published yet (UNAVAILABLE from the store) waits on the server, as a
// parked AVERAGED ReadSlice does, instead of the reader asking again with
// backoff: the store answers the wait when the piece is published, a timer
// ends it UNAVAILABLE after `wait` (less than the reader's deadline), and a
// cancelled call ends it at once. No thread is blocked meanwhile.
//
// Whichever of the three comes first decides, under the shared Decision's
// mutex, and finishes the call; the others find it decided and do nothing.
// The store's callback and the timer hold the Decision, never the reactor,
// so neither runs on a deleted reactor. Deleted in OnDone.
class ReadEncodedReactor final : public grpc::ServerUnaryReactor {
 public:
  ReadEncodedReactor(const EncodedStore* store, const shoal::v1::ReadEncodedRequest& request,
                     shoal::v1::EncodedPiece* response, absl::Duration wait, const Clock* clock,
                     absl::Time reader_deadline)
      : store_(store), decision_(std::make_shared<Decision>()) {
    ReactionScope reaction(this);
    decision_->reactor = this;
    decision_->request = request;
    decision_->response = response;
    // End a quarter of the time left (up to 500 ms) ahead of the reader's
    // deadline, so that it hears why rather than DEADLINE_EXCEEDED.
    const absl::Time now = clock->Now();
    absl::Time until = now + wait;
    if (reader_deadline < until) {
      until = reader_deadline - std::min((reader_deadline - now) / 4, absl::Milliseconds(500));
    }
    if (until <= now) {
      Decide(decision_, store_->Find(request));
      return;
    }
    std::shared_ptr<Decision> decision = decision_;
    const uint64_t ticket = store_->Await(
        request, [decision](absl::StatusOr<Blob> blob) { Decide(decision, std::move(blob)); });
    if (ticket == 0) return;  // answered at once
    ticket_ = ticket;
    SHOAL_VLOG(2) << "ReadEncoded from " << request.reader_id() << " parked";
    // gRPC's alarms run on wall-clock time: the same distance ahead.
    alarm_.Set(
        absl::ToChronoTime(RealClock::Get()->Now() + (until - now)),
        [decision, store = store_, ticket, clock, now](bool expired) {
          const shoal::v1::ReadEncodedRequest& r = decision->request;
          Abandon(decision, store, ticket,
                  expired
                      ? absl::UnavailableError(absl::StrCat(
                            "encoded ", shoal::v1::SliceKind_Name(r.kind()), " [", r.begin(), ", ",
                            r.end(), ") of round ", r.round(), " not encoded here yet (waited ",
                            absl::FormatDuration(clock->Now() - now), " on the server)"))
                      : absl::CancelledError("read cancelled while waiting for the piece"));
        });
  }

  void OnCancel() override {
    ReactionScope reaction(this);
    if (ticket_ != 0) {
      Abandon(decision_, store_, ticket_,
              absl::CancelledError("read cancelled while waiting for the piece"));
    }
  }

  void OnDone() override {
    AfterAllReactions(this);
    // Decided, so the store holds no wait of ours; ~Alarm cancels a pending
    // timer, whose callback then finds the decision taken.
    delete this;
  }

 private:
  struct Decision {
    absl::Mutex mu;
    bool decided ABSL_GUARDED_BY(mu) = false;
    ReadEncodedReactor* reactor = nullptr;  // alive until the decider's Finish
    shoal::v1::ReadEncodedRequest request;
    shoal::v1::EncodedPiece* response = nullptr;
  };

  // The store's answer (it has dropped the wait already).
  static void Decide(const std::shared_ptr<Decision>& decision, absl::StatusOr<Blob> blob) {
    {
      absl::MutexLock lock(&decision->mu);
      if (decision->decided) return;
      decision->decided = true;
    }
    Answer(decision, std::move(blob));
  }

  // The timer or a cancel: only while the store still holds the wait (the
  // store is alive while the call is undecided: it outlives the service's
  // calls).
  static void Abandon(const std::shared_ptr<Decision>& decision, const EncodedStore* store,
                      uint64_t ticket, absl::Status why) {
    {
      absl::MutexLock lock(&decision->mu);
      if (decision->decided || !store->CancelWait(ticket)) return;
      decision->decided = true;
    }
    Answer(decision, std::move(why));
  }

  static void Answer(const std::shared_ptr<Decision>& decision, absl::StatusOr<Blob> blob) {
    grpc::Status status;
    if (!blob.ok()) {
      SHOAL_VLOG(2) << "ReadEncoded from " << decision->request.reader_id() << ": "
                    << blob.status();
      status = ToGrpcStatus(blob.status());
    } else {
      absl::StatusOr<shoal::v1::EncodedPiece> piece =
          ServeEncodedPiece(**blob, decision->request, kChunkBytes);
      if (piece.ok()) {
        *decision->response = *std::move(piece);
      } else {
        status = ToGrpcStatus(piece.status());
      }
    }
    decision->reactor->Finish(status);
  }

  const EncodedStore* const store_;
  const std::shared_ptr<Decision> decision_;
  uint64_t ticket_ = 0;  // set in the constructor, then constant
  grpc::Alarm alarm_;
};

}  // namespace

grpc::ServerUnaryReactor* PeerService::ReadEncoded(grpc::CallbackServerContext* ctx,
                                                   const shoal::v1::ReadEncodedRequest* request,
                                                   shoal::v1::EncodedPiece* response) {
  if (request->kind() != shoal::v1::GOSSIP && encoded_ != nullptr) {
    if (grpc::Status allowed = Allowed(ctx); !allowed.ok()) {
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(allowed);
      return reactor;
    }
    const Clock* clock = options_.clock != nullptr ? options_.clock : RealClock::Get();
    // The reader's deadline is wall-clock time; read it on the injected clock.
    const absl::Time deadline =
        clock->Now() + (absl::FromChrono(ctx->deadline()) - RealClock::Get()->Now());
    return new ReadEncodedReactor(encoded_, *request, response, options_.averaged_wait, clock,
                                  deadline);
  }
  auto* reactor = ctx->DefaultReactor();
  if (grpc::Status allowed = Allowed(ctx); !allowed.ok()) {
    reactor->Finish(allowed);
    return reactor;
  }
  absl::StatusOr<Blob> blob =
      absl::UnimplementedError("this worker's run does not use the encoded exchange");
  if (request->kind() == shoal::v1::GOSSIP) blob = FindGossipEncoding(*request);
  if (!blob.ok()) {
    SHOAL_VLOG(2) << "ReadEncoded from " << request->reader_id() << ": " << blob.status();
    reactor->Finish(ToGrpcStatus(blob.status()));
    return reactor;
  }
  absl::StatusOr<shoal::v1::EncodedPiece> piece = ServeEncodedPiece(**blob, *request, kChunkBytes);
  if (!piece.ok()) {
    reactor->Finish(ToGrpcStatus(piece.status()));
    return reactor;
  }
  *response = *std::move(piece);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {

// Receives one Push stream: a header, then pieces in order, each checked
// (offset, size, CRC-32C); the whole goes into the box at the end or not at
// all.
class PushReactor : public grpc::ServerReadReactor<shoal::v1::PushMessage> {
 public:
  explicit PushReactor(PushBox* box) : box_(box) {
    ReactionScope reaction(this);
    BeforeStart(&message_);
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    ReactionScope reaction(this, &message_);
    if (!ok) {  // the client's end of the stream
      Done();
      return;
    }
    absl::Status s = Take();
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    BeforeStart(&message_);
    StartRead(&message_);
  }
  void OnDone() override {
    AfterAllReactions(this);
    delete this;
  }

 private:
  absl::Status Take() {
    if (message_.has_header()) {
      if (have_header_) return absl::InvalidArgumentError("a second push header");
      const shoal::v1::PushHeader& h = message_.header();
      if (h.begin() >= h.end() || (h.gossip() && (h.begin() != 0 || h.encoded()))) {
        return absl::InvalidArgumentError(
            absl::StrCat("empty or reversed slice [", h.begin(), ", ", h.end(), ")"));
      }
      if (h.pusher_id().empty() || h.pusher_id().size() > 64) {
        return absl::InvalidArgumentError("pusher_id must be 1-64 bytes");
      }
      // Raw: exactly the slice's float32 bytes. Encoded: no codec's
      // encoding exceeds 8 bytes per element (topk's index + value) plus a
      // small header.
      const uint64_t count = h.end() - h.begin();
      const uint64_t limit = h.encoded() ? count * 8 + 4096 : count * sizeof(float);
      if (count > (uint64_t{1} << 40) || h.total_bytes() > limit ||
          (!h.encoded() && h.total_bytes() != limit)) {
        return absl::InvalidArgumentError(
            absl::StrCat("push of ", h.total_bytes(), " bytes for ", count, " elements (",
                         h.encoded() ? "at most " : "exactly ", limit, ")"));
      }
      header_ = h;
      have_header_ = true;
      bytes_.reserve(h.total_bytes());
      return absl::OkStatus();
    }
    if (!have_header_) return absl::InvalidArgumentError("push without a header first");
    const shoal::v1::EncodedPiece& p = message_.piece();
    if (p.offset() != bytes_.size() || p.data().size() > header_.total_bytes() - bytes_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece of ", p.data().size(), " bytes at offset ", p.offset(),
                       ", expected offset ", bytes_.size(), " of ", header_.total_bytes()));
    }
    if (Crc32c(p.data().data(), p.data().size()) != p.crc32c()) {
      return absl::InvalidArgumentError(absl::StrCat("CRC-32C mismatch at byte ", p.offset()));
    }
    bytes_ += p.data();
    return absl::OkStatus();
  }

  void Done() {
    if (!have_header_) {
      Finish(ToGrpcStatus(absl::InvalidArgumentError("empty push")));
      return;
    }
    if (bytes_.size() != header_.total_bytes()) {
      Finish(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "push ended after ", bytes_.size(), " of ", header_.total_bytes(), " bytes"))));
      return;
    }
    if (header_.gossip()) {
      Finish(ToGrpcStatus(box_->PutGossip({.pusher = header_.pusher_id(),
                                           .publication = header_.round(),
                                           .clock = header_.gossip_clock(),
                                           .loss = header_.gossip_loss(),
                                           .bytes = std::move(bytes_)})));
      return;
    }
    PushKey key{.round = header_.round(),
                .attempt = header_.attempt(),
                .pusher = header_.pusher_id(),
                .begin = header_.begin(),
                .end = header_.end(),
                .encoded = header_.encoded()};
    Finish(ToGrpcStatus(box_->Put(key, std::move(bytes_))));
  }

  PushBox* const box_;
  shoal::v1::PushMessage message_;
  shoal::v1::PushHeader header_;
  bool have_header_ = false;
  std::string bytes_;
};

}  // namespace

grpc::ServerReadReactor<shoal::v1::PushMessage>* PeerService::Push(
    grpc::CallbackServerContext* ctx, shoal::v1::PushResponse* /*response*/) {
  // Only current members may write into an owner's reduce.
  if (grpc::Status allowed = Allowed(ctx); !allowed.ok() || push_box_ == nullptr) {
    // A reactor that refuses at once.
    class Refuse : public grpc::ServerReadReactor<shoal::v1::PushMessage> {
     public:
      explicit Refuse(grpc::Status s) {
        ReactionScope reaction(this);
        Finish(s);
      }
      void OnDone() override {
        AfterAllReactions(this);
        delete this;
      }
    };
    return new Refuse(!allowed.ok() ? allowed
                                    : grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                                   "this worker takes no pushes"));
  }
  return new PushReactor(push_box_);
}

grpc::ServerUnaryReactor* PeerService::GetPeerInfo(grpc::CallbackServerContext* ctx,
                                                   const shoal::v1::GetPeerInfoRequest* request,
                                                   shoal::v1::PeerInfo* response) {
  auto* reactor = ctx->DefaultReactor();
  if (grpc::Status allowed = options_.gate.Check(ctx, Access::kMember); !allowed.ok()) {
    reactor->Finish(allowed);
    return reactor;
  }
  *response = state_->Info();
  if (const GossipBoard* board = gossip_board_.load(); board != nullptr) {
    if (std::shared_ptr<const GossipCopy> c = board->Current(); c != nullptr) {
      response->set_gossip_publication(c->publication);
      response->set_gossip_clock(c->clock);
      response->set_gossip_loss(c->loss);
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::GetModelFile(grpc::CallbackServerContext* ctx,
                                                    const shoal::v1::GetModelFileRequest* request,
                                                    shoal::v1::ModelFileChunk* response) {
  auto* reactor = ctx->DefaultReactor();
  if (grpc::Status allowed = Allowed(ctx); !allowed.ok()) {
    reactor->Finish(allowed);
    return reactor;
  }
  std::shared_ptr<const ModelFileCopy> file;
  {
    absl::MutexLock lock(&file_mu_);
    file = model_file_;
  }
  absl::StatusOr<shoal::v1::ModelFileChunk> piece =
      file == nullptr ? absl::NotFoundError("this worker does not hold the run's model file (yet)")
                      : ServeModelFilePiece(file->bytes, file->sha256, *request);
  if (piece.ok()) {
    sent_.model_file.fetch_add(piece->data().size(), std::memory_order_relaxed);
    *response = std::move(*piece);
  }
  reactor->Finish(ToGrpcStatus(piece.status()));
  return reactor;
}

grpc::Status PeerService::Allowed(const grpc::CallbackServerContext* ctx) const {
  if (grpc::Status allowed = options_.gate.Check(ctx, Access::kMember); !allowed.ok()) {
    return allowed;
  }
  if (options_.members == nullptr) return grpc::Status::OK;
  grpc::Status member = CheckMember(*options_.members, ctx);
  if (!member.ok()) {
    SHOAL_VLOG(1) << "read from " << ctx->peer() << " refused: " << member.error_message();
  }
  return member;
}

std::shared_ptr<void> ReadSlots::Acquire(const std::string& host) {
  if (max_ == 0) return std::shared_ptr<void>(this, [](void*) {});
  absl::MutexLock lock(&counts_->mu);
  uint32_t& running = counts_->running[host];
  if (running >= max_) return nullptr;
  ++running;
  return std::shared_ptr<void>(counts_.get(),
                               [counts = counts_, host](void*) { counts->Release(host); });
}

void ReadSlots::Counts::Release(const std::string& host) {
  absl::MutexLock lock(&mu);
  auto it = running.find(host);
  if (it != running.end() && --it->second == 0) running.erase(it);
}

}  // namespace shoal::worker
