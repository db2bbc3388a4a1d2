#include "services/worker/slice_io.h"

#include "absl/strings/str_cat.h"
#include "common/retry.h"
#include "common/status_util.h"

namespace shoal::worker {
namespace {

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

absl::Status ReadRawSlice(const SliceIo& io, const std::string& address, shoal::v1::SliceKind kind,
                          uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end,
                          const std::string& self_id, absl::Time deadline, CancellationToken* stop,
                          const std::function<absl::Status(const ChunkView&)>& apply,
                          std::atomic<int>* retries) {
  uint64_t next = begin;
  absl::Status s = Retry(
      ReadPolicy(io, deadline), stop,
      [&](absl::Duration left) {
        shoal::v1::ReadSliceRequest request;
        request.set_round(round);
        request.set_begin(next);
        request.set_end(end);
        request.set_kind(kind);
        request.set_reader_id(self_id);
        request.set_attempt(attempt);
        absl::Status applied;
        absl::Status read = io.peers->ReadSliceCancellable(address, request, left, stop,
                                                           [&](const ChunkView& chunk) {
                                                             applied = apply(chunk);
                                                             if (!applied.ok()) return false;
                                                             next = chunk.begin + chunk.count;
                                                             return !stop->cancelled();
                                                           });
        // A chunk the codec refuses is final (bad data would fail again).
        if (!applied.ok()) return applied;
        return read;
      },
      [&](const absl::Status&, int) { ++*retries; });
  if (absl::IsDataLoss(s) && io.bad_chunks != nullptr) io.bad_chunks->Note(address);
  if (stop->cancelled()) return absl::AbortedError("round aborted");
  if (absl::IsDeadlineExceeded(s) || (!s.ok() && io.clock->Now() >= deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("exchange of round ", round,
                                                    " timed out reading [", next, ", ", end,
                                                    ") from ", address, ": ", s.message()));
  }
  return s;
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

}  // namespace shoal::worker
