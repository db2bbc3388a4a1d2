#include "services/worker/slice_io.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/retry.h"
#include "common/status_util.h"

namespace shoal::worker {
namespace {

// The policy of a push: retried as a read is.
RetryPolicy ReadPolicy(const SliceIo& io, absl::Time deadline) {
  RetryPolicy policy;
  policy.initial_backoff = io.initial_backoff;
  policy.max_backoff = io.max_backoff;
  policy.deadline = deadline - io.clock->Now();
  policy.clock = io.clock;
  // A peer refuses a read past its --max_reads_per_peer before sending
  // anything: come back after a backoff.
  policy.also_retry = {absl::StatusCode::kResourceExhausted};
  return policy;
}

}  // namespace

std::shared_ptr<SliceRead> SliceRead::Start(const SliceIo& io, SliceReadSpec spec, Apply apply,
                                            Done done) {
  auto read = std::make_shared<SliceRead>(io, std::move(spec), std::move(apply), std::move(done));
  read->Begin();
  return read;
}

SliceRead::SliceRead(const SliceIo& io, SliceReadSpec spec, Apply apply, Done done)
    : io_(io),
      spec_(std::move(spec)),
      apply_(std::move(apply)),
      done_(std::move(done)),
      backoff_(io.initial_backoff, io.max_backoff) {
  absl::MutexLock lock(&mu_);
  next_ = spec_.begin;
}

SliceRead::~SliceRead() = default;

void SliceRead::Begin() {
  // The registration holds a weak reference: a read that ended is let go.
  std::weak_ptr<SliceRead> weak = weak_from_this();
  cancel_id_ = spec_.stop->Register([weak] {
    if (std::shared_ptr<SliceRead> self = weak.lock()) self->Cancel();
  });
  StartCall();
}

uint64_t SliceRead::next() const {
  absl::MutexLock lock(&mu_);
  return next_;
}

void SliceRead::StartCall() {
  shoal::v1::ReadSliceRequest request;
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    waiting_ = false;
    cancelled = cancelled_;
    request.set_begin(next_);
  }
  // Cancelled while the backoff ran: its alarm fires at once.
  if (cancelled || spec_.stop->cancelled()) {
    Finish(absl::AbortedError("round aborted"));
    return;
  }
  const absl::Duration left = spec_.deadline - io_.clock->Now();
  if (left <= absl::ZeroDuration()) {
    absl::Status last;
    {
      absl::MutexLock lock(&mu_);
      last = last_failure_;
    }
    OnCallDone(last.ok() ? absl::DeadlineExceededError("no time left for another attempt") : last);
    return;
  }
  request.set_round(spec_.round);
  request.set_end(spec_.end);
  request.set_kind(spec_.kind);
  request.set_reader_id(spec_.self_id);
  request.set_attempt(spec_.attempt);
  ChunkStreamCallbacks callbacks;
  std::shared_ptr<SliceRead> self = shared_from_this();
  callbacks.on_chunk = [self](const ChunkView& chunk) {
    ChunkNext next = ChunkNext::kRead;
    absl::Status applied = self->apply_(chunk, &next);
    absl::MutexLock lock(&self->mu_);
    if (!applied.ok()) {
      self->chunk_error_ = std::move(applied);
      return ChunkNext::kStop;
    }
    self->next_ = chunk.begin + chunk.count;
    return self->cancelled_ ? ChunkNext::kStop : next;
  };
  callbacks.on_done = [self](absl::Status status, uint64_t) {
    self->OnCallDone(std::move(status));
  };
  std::shared_ptr<ChunkStreamCall> call =
      io_.peers->StartReadSlice(spec_.address, request, left, std::move(callbacks));
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    call_ = call;
    cancel = cancelled_;
  }
  if (cancel) call->Cancel();
}

void SliceRead::Resume() {
  std::shared_ptr<ChunkStreamCall> call;
  {
    absl::MutexLock lock(&mu_);
    call = call_;
  }
  if (call != nullptr) call->Resume();
}

void SliceRead::Cancel() {
  std::shared_ptr<ChunkStreamCall> call;
  bool waiting;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finished_) return;
    cancelled_ = true;
    call = call_;
    waiting = waiting_;
  }
  // The backoff alarm's callback then runs at once (not here) and ends it.
  if (waiting) alarm_.Cancel();
  if (call != nullptr) call->Cancel();
}

void SliceRead::OnCallDone(absl::Status s) {
  absl::Status chunk_error;
  uint64_t next;
  {
    absl::MutexLock lock(&mu_);
    call_.reset();
    chunk_error = chunk_error_;
    next = next_;
  }
  // A chunk the consumer refuses is final (bad data would fail again).
  if (!chunk_error.ok()) return Finish(std::move(chunk_error));
  if (s.ok() || spec_.stop->cancelled()) return Finish(std::move(s));
  RetryPolicy policy;
  // A peer refuses a read past its --max_reads_per_peer before sending
  // anything: come back after a backoff.
  policy.also_retry = {absl::StatusCode::kResourceExhausted};
  const absl::Time now = io_.clock->Now();
  if (!ShouldRetry(policy, s) || now >= spec_.deadline) {
    if (absl::IsDataLoss(s) && io_.bad_chunks != nullptr) io_.bad_chunks->Note(spec_.address);
    if (absl::IsDeadlineExceeded(s) || now >= spec_.deadline) {
      return Finish(absl::DeadlineExceededError(
          absl::StrCat("exchange of round ", spec_.round, " timed out reading [", next, ", ",
                       spec_.end, ") from ", spec_.address, ": ", s.message())));
    }
    return Finish(std::move(s));
  }
  if (spec_.retries != nullptr) ++*spec_.retries;
  {
    absl::MutexLock lock(&mu_);
    last_failure_ = s;
  }
  const absl::Duration pause = std::min(backoff_.Next(), spec_.deadline - now);
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      // Cancel() saw a call that had just ended: nobody else ends the read.
    } else {
      waiting_ = true;
      // The alarm keeps its function after it ran: it holds no reference,
      // keep_ does until it fires. gRPC's alarms run on wall-clock time:
      // the same distance ahead.
      keep_ = shared_from_this();
      alarm_.Set(absl::ToChronoTime(absl::Now() + pause), [this](bool) {
        std::shared_ptr<SliceRead> self;
        {
          absl::MutexLock lock(&mu_);
          self = std::move(keep_);
        }
        StartCall();
      });
      return;
    }
  }
  Finish(absl::AbortedError("round aborted"));
}

void SliceRead::Finish(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
  }
  if (spec_.stop->cancelled() && !status.ok()) status = absl::AbortedError("round aborted");
  // Not under mu_: the token's callback (Cancel) takes it.
  spec_.stop->Unregister(cancel_id_);
  done_(std::move(status));
}

absl::Status ReadRawSlice(const SliceIo& io, const std::string& address, shoal::v1::SliceKind kind,
                          uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end,
                          const std::string& self_id, absl::Time deadline, CancellationToken* stop,
                          const std::function<absl::Status(const ChunkView&)>& apply,
                          std::atomic<int>* retries) {
  struct Result {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  CancellationToken local(stop);
  SliceReadSpec spec{address, kind, round, attempt, begin, end, self_id, deadline, &local, retries};
  std::shared_ptr<SliceRead> read = SliceRead::Start(
      io, std::move(spec), [&apply](const ChunkView& c, ChunkNext*) { return apply(c); },
      [result](absl::Status s) {
        absl::MutexLock lock(&result->mu);
        result->status = std::move(s);
        result->done = true;
      });
  absl::MutexLock lock(&result->mu);
  // The read ends by its deadline (each call is bounded by what is left of
  // it, and no backoff passes it); a margin, then wait for the end: `apply`
  // refers to the caller's frame.
  const absl::Time wall_deadline = absl::Now() + (deadline - io.clock->Now()) + absl::Seconds(5);
  if (!result->mu.AwaitWithDeadline(absl::Condition(&result->done), wall_deadline)) {
    result->mu.Unlock();
    local.Cancel();
    result->mu.Lock();
    result->mu.Await(absl::Condition(&result->done));
  }
  return result->status;
}

absl::Status PushToOwner(const SliceIo& io, const std::string& owner_id, const std::string& address,
                         uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end,
                         const std::string& self_id, bool encoded, absl::string_view bytes,
                         absl::Time deadline, CancellationToken* stop, std::atomic<int>* retries) {
  shoal::v1::PushHeader header;
  header.set_round(round);
  header.set_attempt(attempt);
  header.set_begin(begin);
  header.set_end(end);
  header.set_pusher_id(self_id);
  header.set_encoded(encoded);
  header.set_total_bytes(bytes.size());
  absl::Status s = Retry(
      ReadPolicy(io, deadline), stop,
      [&](absl::Duration left) { return io.peers->Push(address, header, bytes, left, stop); },
      [&](const absl::Status&, int) { ++*retries; });
  if (stop->cancelled()) return absl::AbortedError("round aborted");
  if (!s.ok()) {
    return Annotate(
        s, absl::StrCat("round ", round, ": pushing [", begin, ", ", end, ") to ", owner_id));
  }
  return s;
}

absl::StatusOr<std::string> TakePushed(const SliceIo& io, const std::string& pusher, uint64_t round,
                                       uint32_t attempt, uint64_t begin, uint64_t end, bool encoded,
                                       absl::Time deadline, CancellationToken* stop) {
  if (io.push_box == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(pusher, " is behind NAT and this worker takes no pushes"));
  }
  PushKey key{.round = round,
              .attempt = attempt,
              .pusher = pusher,
              .begin = begin,
              .end = end,
              .encoded = encoded};
  absl::StatusOr<std::string> bytes = io.push_box->Take(key, deadline, stop);
  if (!bytes.ok() && stop->cancelled()) return absl::AbortedError("round aborted");
  if (bytes.ok() && !encoded && bytes->size() != (end - begin) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("push of ", pusher, " has ", bytes->size(),
                                                   " bytes for ", end - begin, " elements"));
  }
  return bytes;
}

void StartTakePushed(const SliceIo& io, const std::string& pusher, uint64_t round, uint32_t attempt,
                     uint64_t begin, uint64_t end, bool encoded, absl::Time deadline,
                     CancellationToken* stop,
                     std::function<void(absl::StatusOr<std::string>)> done) {
  // Detached: its last act is `done`, which the exchange waits for.
  std::thread([io, pusher, round, attempt, begin, end, encoded, deadline, stop,
               done = std::move(done)] {
    done(TakePushed(io, pusher, round, attempt, begin, end, encoded, deadline, stop));
  }).detach();
}

}  // namespace shoal::worker
