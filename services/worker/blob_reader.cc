#include "services/worker/blob_reader.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "common/tensor_wire.h"

namespace shoal::worker {

absl::StatusOr<std::string> ReadBlobWithRetry(PeerClient* peers, const std::string& address,
                                              const shoal::v1::ReadEncodedRequest& request,
                                              BlobLimits limits, RetryPolicy policy,
                                              absl::Time deadline, const Clock* clock,
                                              CancellationToken* stop, std::atomic<int>* retries) {
  policy.deadline = deadline - clock->Now();
  policy.clock = clock;
  const std::string what = absl::StrCat(
      "encoded ", shoal::v1::SliceKind_Name(request.kind()), " [", request.begin(), ", ",
      request.end(), ")", request.stage() > 0 ? absl::StrCat(" of stage ", request.stage()) : "",
      " from ", address);
  std::string bytes;
  uint64_t total = 0;
  bool known = false;
  absl::Status s = Retry(
      policy, stop,
      [&](absl::Duration left) -> absl::Status {
        while (!known || bytes.size() < total) {
          if (stop->cancelled()) return absl::AbortedError("round aborted");
          shoal::v1::ReadEncodedRequest r = request;
          r.set_offset(bytes.size());
          absl::StatusOr<shoal::v1::EncodedPiece> piece =
              peers->ReadEncoded(address, r, left, stop);
          if (!piece.ok()) return piece.status();
          if (piece->round() != request.round()) {
            return absl::FailedPreconditionError(absl::StrCat(
                what, ": piece of round ", piece->round(), ", asked ", request.round()));
          }
          const bool bad_size = limits.exact ? piece->total_bytes() != limits.max_bytes
                                             : piece->total_bytes() > limits.max_bytes;
          if (bad_size || (known && piece->total_bytes() != total)) {
            return absl::InvalidArgumentError(
                absl::StrCat(what, ": announces ", piece->total_bytes(), " bytes (",
                             limits.exact ? "expected " : "at most ", limits.max_bytes,
                             known ? absl::StrCat(", earlier ", total) : std::string(), ")"));
          }
          if (piece->offset() != bytes.size() ||
              piece->data().size() > piece->total_bytes() - bytes.size() ||
              (piece->data().empty() && bytes.size() < piece->total_bytes())) {
            return absl::InvalidArgumentError(
                absl::StrCat(what, ": piece of ", piece->data().size(), " bytes at offset ",
                             piece->offset(), ", expected offset ", bytes.size()));
          }
          RETURN_IF_ERROR(CheckChunkCrc(piece->crc32c(), piece->data().data(), piece->data().size(),
                                        absl::StrCat(what, " at byte ", piece->offset())));
          total = piece->total_bytes();
          known = true;
          bytes += piece->data();
        }
        return absl::OkStatus();
      },
      [&](const absl::Status&, int) {
        if (retries != nullptr) ++*retries;
      });
  if (stop->cancelled()) return absl::AbortedError("round aborted");
  if (absl::IsDeadlineExceeded(s) || (!s.ok() && clock->Now() >= deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "exchange of round ", request.round(), " timed out reading the ", what, ": ", s.message()));
  }
  if (!s.ok()) return s;
  return bytes;
}

}  // namespace shoal::worker
