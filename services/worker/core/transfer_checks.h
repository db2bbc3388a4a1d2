// The checks of what a peer sends back when this worker reads from it
// outside the chunked ReadSlice stream (docs/SECURITY.md "Fuzzing"): the
// pieces of an encoded blob (Peer.ReadEncoded: codec slices, snapshots,
// the outer momentum) and the peer's published state before a gossip fetch
// (Peer.GetPeerInfo). Pure: no gRPC, clock or threads, so that the fuzz
// targets (tests/fuzz) drive the same code the exchanger, the worker and
// the gossip fetcher run.
#ifndef SHOAL_SERVICES_WORKER_CORE_TRANSFER_CHECKS_H_
#define SHOAL_SERVICES_WORKER_CORE_TRANSFER_CHECKS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/v1/peer.pb.h"

namespace shoal::worker {

// Assembles one encoded blob from its Peer.ReadEncoded pieces, asked for in
// order (offset() is the next request's offset). A piece is refused, and
// nothing of it kept, when it belongs to another round
// (FAILED_PRECONDITION), announces a size above `max_bytes`, another size
// than `exact_bytes` (when given) or than an earlier piece
// (INVALID_ARGUMENT), does not start at offset(), runs past the announced
// size or is empty before the end (INVALID_ARGUMENT), or fails its CRC-32C
// (DATA_LOSS). Pieces accepted before a refusal stay, so a retry resumes
// at offset(). Not thread-safe.
class EncodedAssembly {
 public:
  // `what` names the blob in messages ("encoded AVERAGED [0, 10) from
  // host:port").
  EncodedAssembly(uint64_t round, uint64_t max_bytes, std::optional<uint64_t> exact_bytes,
                  std::string what);

  // Offset of the next piece to ask for.
  uint64_t offset() const { return bytes_.size(); }
  // True once a piece announced the size and every byte of it arrived.
  bool done() const { return known_ && bytes_.size() == total_; }
  // Checks `piece` and appends its bytes.
  absl::Status Add(const shoal::v1::EncodedPiece& piece);
  // The bytes so far (the whole blob once done()).
  const std::string& bytes() const { return bytes_; }
  std::string Take() { return std::move(bytes_); }

 private:
  const uint64_t round_;
  const uint64_t max_bytes_;
  const std::optional<uint64_t> exact_bytes_;
  const std::string what_;
  std::string bytes_;
  uint64_t total_ = 0;
  bool known_ = false;
};

// A peer's answer to GetPeerInfo before this worker fetches its gossip
// publication of a model of `elements` float32: FAILED_PRECONDITION when it
// has published nothing yet, INVALID_ARGUMENT when its model has another
// size or its state (clock: samples trained, finite and >= 0; loss:
// finite) cannot be interpolated with (the clock and loss weigh the peer's
// model in InterpolationFactor).
absl::Status CheckGossipPeerInfo(const shoal::v1::PeerInfo& info, uint64_t elements);

// The GOSSIP ReadSlice of the whole model (`elements`) the fetcher sends
// after an accepted `info`; the ChunkReceiver of the stream bounds every
// chunk to [0, elements).
shoal::v1::ReadSliceRequest GossipReadRequest(const shoal::v1::PeerInfo& info, uint64_t elements,
                                              const std::string& reader_id);
// The same publication as an encoded blob (a run with a codec): a
// ReadEncoded of kind GOSSIP, round = the publication, [0, elements).
shoal::v1::ReadEncodedRequest GossipEncodedRequest(const shoal::v1::PeerInfo& info,
                                                   uint64_t elements, const std::string& reader_id);

// The serving side of the same reads. The piece of `blob` that `request`
// asks for: at most `max_piece` bytes from request.offset(), with the
// blob's size, the request's round and the CRC-32C. INVALID_ARGUMENT for an
// offset past the end (an offset equal to the size gives an empty piece).
absl::StatusOr<shoal::v1::EncodedPiece> ServeEncodedPiece(
    const std::string& blob, const shoal::v1::ReadEncodedRequest& request, size_t max_piece);

// A GOSSIP ReadSlice of a published copy of `elements` float32:
// INVALID_ARGUMENT for an empty or reversed range, OUT_OF_RANGE past the
// end.
absl::Status CheckGossipRange(const shoal::v1::ReadSliceRequest& request, uint64_t elements);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_TRANSFER_CHECKS_H_
