#include "services/worker/core/transfer_checks.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/tensor_wire.h"

namespace shoal::worker {

EncodedAssembly::EncodedAssembly(uint64_t round, uint64_t max_bytes,
                                 std::optional<uint64_t> exact_bytes, std::string what)
    : round_(round), max_bytes_(max_bytes), exact_bytes_(exact_bytes), what_(std::move(what)) {}

absl::Status EncodedAssembly::Add(const shoal::v1::EncodedPiece& piece) {
  if (piece.round() != round_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what_, ": piece of round ", piece.round(), ", asked ", round_));
  }
  if (piece.total_bytes() > max_bytes_ || (known_ && piece.total_bytes() != total_) ||
      (exact_bytes_.has_value() && piece.total_bytes() != *exact_bytes_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what_, ": announces ", piece.total_bytes(), " bytes (at most ", max_bytes_,
        exact_bytes_.has_value() ? absl::StrCat(", exactly ", *exact_bytes_) : std::string(),
        known_ ? absl::StrCat(", earlier ", total_) : std::string(), ")"));
  }
  // total_bytes() >= offset() here: it equals total_ once known, and the
  // first piece arrives at offset 0.
  if (piece.offset() != bytes_.size() ||
      piece.data().size() > piece.total_bytes() - bytes_.size() ||
      (piece.data().empty() && bytes_.size() < piece.total_bytes())) {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": piece of ", piece.data().size(),
                                                   " bytes at offset ", piece.offset(),
                                                   ", expected offset ", bytes_.size()));
  }
  if (absl::Status s = CheckChunkCrc(piece.crc32c(), piece.data().data(), piece.data().size(),
                                     absl::StrCat(what_, " at byte ", piece.offset()));
      !s.ok()) {
    return s;
  }
  total_ = piece.total_bytes();
  known_ = true;
  bytes_ += piece.data();
  return absl::OkStatus();
}

absl::Status CheckGossipPeerInfo(const shoal::v1::PeerInfo& info, uint64_t elements) {
  if (info.gossip_publication() == 0) {
    return absl::FailedPreconditionError("the peer has published no model yet");
  }
  if (info.total_elements() != elements) {
    return absl::InvalidArgumentError(absl::StrCat("the peer's model has ", info.total_elements(),
                                                   " elements, this one ", elements));
  }
  if (!std::isfinite(info.gossip_clock()) || info.gossip_clock() < 0 ||
      !std::isfinite(info.gossip_loss())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the peer's state (clock ", info.gossip_clock(), ", loss ", info.gossip_loss(),
                     ") is not a finite clock >= 0 and a finite loss"));
  }
  return absl::OkStatus();
}

shoal::v1::ReadSliceRequest GossipReadRequest(const shoal::v1::PeerInfo& info, uint64_t elements,
                                              const std::string& reader_id) {
  shoal::v1::ReadSliceRequest req;
  req.set_kind(shoal::v1::GOSSIP);
  req.set_round(info.gossip_publication());
  req.set_begin(0);
  req.set_end(elements);
  req.set_reader_id(reader_id);
  return req;
}

shoal::v1::ReadEncodedRequest GossipEncodedRequest(const shoal::v1::PeerInfo& info,
                                                   uint64_t elements,
                                                   const std::string& reader_id) {
  shoal::v1::ReadEncodedRequest req;
  req.set_kind(shoal::v1::GOSSIP);
  req.set_round(info.gossip_publication());
  req.set_begin(0);
  req.set_end(elements);
  req.set_reader_id(reader_id);
  return req;
}

absl::StatusOr<shoal::v1::EncodedPiece> ServeEncodedPiece(
    const std::string& blob, const shoal::v1::ReadEncodedRequest& request, size_t max_piece) {
  if (request.offset() > blob.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset ", request.offset(), " past the end of an encoding of ", blob.size(), " bytes"));
  }
  const size_t n = std::min<uint64_t>(max_piece, blob.size() - request.offset());
  shoal::v1::EncodedPiece piece;
  piece.set_round(request.round());
  piece.set_total_bytes(blob.size());
  piece.set_offset(request.offset());
  piece.set_data(blob.data() + request.offset(), n);
  piece.set_crc32c(Crc32c(piece.data().data(), n));
  return piece;
}

absl::Status CheckGossipRange(const shoal::v1::ReadSliceRequest& request, uint64_t elements) {
  if (request.begin() >= request.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty or reversed range [", request.begin(), ", ", request.end(), ")"));
  }
  if (request.end() > elements) {
    return absl::OutOfRangeError(
        absl::StrCat("range end ", request.end(), " past the model's ", elements, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace shoal::worker
