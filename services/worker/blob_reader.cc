#include "services/worker/blob_reader.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/backoff.h"
#include "common/status_util.h"
#include "common/tensor_wire.h"

namespace shoal::worker {

namespace {

// One blob read in flight: its pieces so far and where it is. Alive while a
// piece call or the backoff alarm holds a reference.
class BlobRead : public std::enable_shared_from_this<BlobRead> {
 public:
  BlobRead(PeerClient* peers, std::string address, shoal::v1::ReadEncodedRequest request,
           BlobLimits limits, RetryPolicy policy, absl::Time deadline, const Clock* clock,
           CancellationToken* stop, std::atomic<int>* retries,
           std::function<void(absl::StatusOr<std::string>)> done)
      : peers_(peers),
        address_(std::move(address)),
        request_(std::move(request)),
        limits_(limits),
        policy_(std::move(policy)),
        deadline_(deadline),
        clock_(clock),
        stop_(stop),
        retries_(retries),
        done_(std::move(done)),
        backoff_(policy_.initial_backoff, policy_.max_backoff),
        what_(absl::StrCat("encoded ", shoal::v1::SliceKind_Name(request_.kind()), " [",
                           request_.begin(), ", ", request_.end(), ")",
                           request_.stage() > 0 ? absl::StrCat(" of stage ", request_.stage()) : "",
                           " from ", address_)) {}

  void Next() {
    if (stop_->cancelled()) return Finish(absl::AbortedError("round aborted"));
    const absl::Duration left = deadline_ - clock_->Now();
    if (left <= absl::ZeroDuration()) return Fail(absl::DeadlineExceededError("no time left"));
    shoal::v1::ReadEncodedRequest r = request_;
    r.set_offset(bytes_.size());
    std::shared_ptr<BlobRead> self = shared_from_this();
    peers_->StartReadEncoded(
        address_, r, left, stop_,
        [self](absl::StatusOr<shoal::v1::EncodedPiece> piece) { self->OnPiece(std::move(piece)); });
  }

 private:
  void OnPiece(absl::StatusOr<shoal::v1::EncodedPiece> piece) {
    if (!piece.ok()) return Fail(piece.status());
    if (absl::Status s = Check(*piece); !s.ok()) return Finish(std::move(s));
    total_ = piece->total_bytes();
    known_ = true;
    bytes_ += piece->data();
    backoff_.Reset();
    if (bytes_.size() < total_) return Next();
    Finish(std::move(bytes_));
  }

  // The piece's round, size and offset, and its CRC-32C.
  absl::Status Check(const shoal::v1::EncodedPiece& piece) const {
    if (piece.round() != request_.round()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what_, ": piece of round ", piece.round(), ", asked ", request_.round()));
    }
    const bool bad_size = limits_.exact ? piece.total_bytes() != limits_.max_bytes
                                        : piece.total_bytes() > limits_.max_bytes;
    if (bad_size || (known_ && piece.total_bytes() != total_)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, ": announces ", piece.total_bytes(), " bytes (",
                       limits_.exact ? "expected " : "at most ", limits_.max_bytes,
                       known_ ? absl::StrCat(", earlier ", total_) : std::string(), ")"));
    }
    if (piece.offset() != bytes_.size() ||
        piece.data().size() > piece.total_bytes() - bytes_.size() ||
        (piece.data().empty() && bytes_.size() < piece.total_bytes())) {
      return absl::InvalidArgumentError(absl::StrCat(what_, ": piece of ", piece.data().size(),
                                                     " bytes at offset ", piece.offset(),
                                                     ", expected offset ", bytes_.size()));
    }
    return CheckChunkCrc(piece.crc32c(), piece.data().data(), piece.data().size(),
                         absl::StrCat(what_, " at byte ", piece.offset()));
  }

  // A failed piece call: retried after a backoff when the policy allows and
  // time is left, else the read ends.
  void Fail(absl::Status s) {
    if (stop_->cancelled()) return Finish(absl::AbortedError("round aborted"));
    const absl::Time now = clock_->Now();
    if (ShouldRetry(policy_, s) && now < deadline_) {
      if (retries_ != nullptr) ++*retries_;
      const absl::Duration pause = std::min(backoff_.Next(), deadline_ - now);
      // The backoff is short (the exchange's: at most tens of ms): not
      // cancelled early; the next piece call sees the token. The alarm
      // keeps its function after it ran: it holds no reference, waiting_
      // does.
      waiting_ = shared_from_this();
      alarm_.Set(absl::ToChronoTime(absl::Now() + pause), [this](bool) {
        std::shared_ptr<BlobRead> self = std::move(waiting_);
        Next();
      });
      return;
    }
    if (absl::IsDeadlineExceeded(s) || now >= deadline_) {
      return Finish(absl::DeadlineExceededError(absl::StrCat("exchange of round ", request_.round(),
                                                             " timed out reading the ", what_, ": ",
                                                             s.message())));
    }
    Finish(std::move(s));
  }

  void Finish(absl::StatusOr<std::string> result) {
    if (!result.ok() && stop_->cancelled()) result = absl::AbortedError("round aborted");
    done_(std::move(result));
  }

  PeerClient* const peers_;
  const std::string address_;
  const shoal::v1::ReadEncodedRequest request_;
  const BlobLimits limits_;
  const RetryPolicy policy_;
  const absl::Time deadline_;
  const Clock* const clock_;
  CancellationToken* const stop_;
  std::atomic<int>* const retries_;
  const std::function<void(absl::StatusOr<std::string>)> done_;
  Backoff backoff_;
  const std::string what_;
  grpc::Alarm alarm_;
  std::shared_ptr<BlobRead> waiting_;  // this, while the alarm is set
  // Touched by one piece's completion at a time (pieces never overlap).
  std::string bytes_;
  uint64_t total_ = 0;
  bool known_ = false;
};

}  // namespace

void StartBlobRead(PeerClient* peers, const std::string& address,
                   const shoal::v1::ReadEncodedRequest& request, BlobLimits limits,
                   RetryPolicy policy, absl::Time deadline, const Clock* clock,
                   CancellationToken* stop, std::atomic<int>* retries,
                   std::function<void(absl::StatusOr<std::string>)> done) {
  auto read = std::make_shared<BlobRead>(peers, address, request, limits, std::move(policy),
                                         deadline, clock, stop, retries, std::move(done));
  read->Next();
}

absl::StatusOr<std::string> ReadBlobWithRetry(PeerClient* peers, const std::string& address,
                                              const shoal::v1::ReadEncodedRequest& request,
                                              BlobLimits limits, RetryPolicy policy,
                                              absl::Time deadline, const Clock* clock,
                                              CancellationToken* stop, std::atomic<int>* retries) {
  struct Result {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<std::string> blob ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  CancellationToken local(stop);
  StartBlobRead(peers, address, request, limits, std::move(policy), deadline, clock, &local,
                retries, [result](absl::StatusOr<std::string> blob) {
                  absl::MutexLock lock(&result->mu);
                  result->blob = std::move(blob);
                  result->done = true;
                });
  absl::MutexLock lock(&result->mu);
  // Each piece call is bounded by what is left of the deadline; a margin,
  // then cancel and wait for the end (the read refers to `local`).
  const absl::Time wall = absl::Now() + (deadline - clock->Now()) + absl::Seconds(5);
  if (!result->mu.AwaitWithDeadline(absl::Condition(&result->done), wall)) {
    result->mu.Unlock();
    local.Cancel();
    result->mu.Lock();
    result->mu.Await(absl::Condition(&result->done));
  }
  return std::move(result->blob);
}

}  // namespace shoal::worker
