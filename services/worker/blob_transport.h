// The blob transport of the averaging pipeline (services/worker/fan_out.h):
// every slice travels as an immutable blob encoded by the run's Codec
// (core/codec.h), published in the EncodedStore under the round, attempt,
// stage and range, and read by peers through Peer.ReadEncoded. Used by every
// round but the raw flat one (memory_transport.h): a lossy codec, an outer
// optimizer (changes travel, not models) and every stage of a hierarchical
// round, so a codec applies at every level.
//
// Bit-identity: the owner of a slice decodes every contribution, combines,
// encodes the average once and replaces its own copy with what that
// encoding decodes to; everyone else decodes the same bytes. A broadcast
// forwards the very blobs the head holds its model as (the averages of the
// level above), so the members decode the head's bits exactly: nothing is
// encoded twice.
//
// Error feedback (lossy codecs): what an encoding leaves out is kept and
// added to the next round's input of the same stage: for our contributions
// over the whole vector, for the averages we own over our slice only (a
// slice we no longer own does not carry its leftover to a later owner; the
// part of a moved slice we still own keeps it).
//
// Because peers read copies, the step's `in` and `out` may be the same
// buffer, and model memory is never read by peers.
//
// Not thread-safe: one step at a time (its reads end on gRPC's threads,
// which this class serializes where they share state).
#ifndef SHOAL_SERVICES_WORKER_BLOB_TRANSPORT_H_
#define SHOAL_SERVICES_WORKER_BLOB_TRANSPORT_H_

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/encoded_store.h"
#include "services/worker/fan_out.h"
#include "services/worker/slice_io.h"

namespace shoal::worker {

// A range of the vector and the blob it travels as.
struct HeldPiece {
  SliceRange range;
  Blob blob;
};

// What a step published (republished as is when a later attempt of the
// round carries the step).
struct PublishedBlob {
  shoal::v1::SliceKind kind = shoal::v1::SLICE_KIND_UNSPECIFIED;
  SliceRange range;
  Blob blob;
};

// Error feedback of one stage (see the file comment); empty vectors = none
// yet (zeros).
struct StageFeedback {
  // Of our contributions, over the whole vector.
  std::vector<float> contribution;
  // Of the averages we own: our slice [owner_range) only.
  SliceRange owner_range;
  std::vector<float> owner;
};

class BlobTransport final : public StepTransport {
 public:
  // `feedback` (null for a lossless codec) outlives this; `total` is the
  // vector's length.
  BlobTransport(SliceIo io, EncodedStore* store, const Codec* codec, StageFeedback* feedback,
                uint64_t total);

  absl::Status Publish(const GroupStep& step, const float* in, const StepCall& call) override;
  absl::Status PushContribution(const GroupStep& step, int k, const float* in, const StepCall& call,
                                CancellationToken* stop) override;
  const float* OwnContribution(const GroupStep& step, const float* in) override;
  std::shared_ptr<ResumeHandle> StartReadContribution(const GroupStep& step, int k,
                                                      const StepCall& call, CancellationToken* stop,
                                                      ChunkSink sink, ReadDone done) override;
  absl::Status PublishAverage(const GroupStep& step, float* avg, const StepCall& call) override;
  void StartReadAverage(const GroupStep& step, int k, float* dst, const StepCall& call,
                        CancellationToken* stop, ReadDone done) override;
  bool SumsInArrivalOrder() const override { return false; }

  // A kBroadcast step. The head publishes `held` (the pieces it holds its
  // model as; they must be the step's pieces); a member reads every piece
  // from the head into `model` and returns them in `*held`.
  absl::Status Broadcast(const GroupStep& step, float* model, std::vector<HeldPiece>* held,
                         const StepCall& call, CancellationToken* cancel);

  // After a kAverage step: every slice's average as its owner published it,
  // in range order (what this worker now holds its vector as).
  std::vector<HeldPiece> TakePieces();
  // What this step published.
  const std::vector<PublishedBlob>& published() const { return published_; }

  // randomk's choice of elements for a slice: the same for every worker in
  // a slice of a stage of a round (contributions and average share them).
  static uint64_t SliceSeed(uint64_t round, uint32_t stage, uint64_t begin);

 private:
  // Encodes `n` elements at `src` (with error feedback into `residual`
  // when the codec is lossy and there is one).
  Blob Encode(const float* src, size_t n, uint64_t seed, float* residual) const;
  // Starts reading the blob of `range` (`kind`, `stage`) from `address`;
  // `done` gets its bytes.
  void StartRead(const std::string& address, shoal::v1::SliceKind kind, uint32_t stage,
                 SliceRange range, const StepCall& call, CancellationToken* stop,
                 std::function<void(absl::StatusOr<std::string>)> done) const;
  absl::Status Decode(const std::string& bytes, SliceRange range, float* out) const;
  void Record(shoal::v1::SliceKind kind, SliceRange range, Blob blob, const StepCall& call,
              uint32_t stage);

  const SliceIo io_;
  EncodedStore* const store_;
  const Codec* const codec_;
  StageFeedback* const feedback_;
  const uint64_t total_;
  // Our contribution to member k's slice, as published (pushed from
  // behind NAT).
  std::vector<Blob> contributions_;
  // Our own contribution to our slice as the others would decode it
  // (lossy codecs only).
  std::vector<float> own_decoded_;
  std::vector<PublishedBlob> published_;
  absl::Mutex pieces_mu_;
  std::vector<HeldPiece> pieces_ ABSL_GUARDED_BY(pieces_mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_BLOB_TRANSPORT_H_
