// What a gossiping worker serves to its peers (the Rx side of dpwa): a
// consistent copy of its parameters together with its state (clock, loss),
// published every gossip_every steps without stopping training.
//
// Copies are reference-counted: a peer's read holds the copy it started
// (every chunk lent to gRPC holds a reference until gRPC drops the bytes),
// so publishing never waits for readers and a reader never sees a copy
// change under it. A copy is rewritten only when nothing holds it; the
// board keeps at most kMaxCopies, and a publication that finds all of them
// held is skipped (counted), training goes on.
//
// With a codec other than fp32 (the run's, SetCodec) every publication is
// also encoded once, and peers fetch that encoding (Peer.ReadEncoded, kind
// GOSSIP) instead of the float32 copy: docs/GOSSIP.md, "Compressed pulls".
//
// Thread-safe: one mutex; the copy into a buffer happens outside it (the
// buffer is not findable while it is written).
#ifndef SHOAL_SERVICES_WORKER_CORE_GOSSIP_BOARD_H_
#define SHOAL_SERVICES_WORKER_CORE_GOSSIP_BOARD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/worker/core/codec.h"

namespace shoal::worker {

struct GossipCopy {
  uint64_t publication = 0;  // 0 while being written
  double clock = 0;
  double loss = 0;
  std::vector<float> params;
  // The run's codec's encoding of `params` (null with fp32).
  std::shared_ptr<const std::string> encoded;
};

class GossipBoard {
 public:
  static constexpr size_t kMaxCopies = 4;

  // The run's codec (outlives the board); null or fp32: nothing is encoded.
  // Set before the first Publish.
  void SetCodec(const Codec* codec) { codec_ = codec; }
  const Codec* codec() const { return codec_; }

  // Publishes a copy of params[0, n) with its state. Returns the copy (the
  // caller may hold it, e.g. as the base of a fetch) or nullptr when every
  // buffer is held by readers (the publication is skipped).
  std::shared_ptr<const GossipCopy> Publish(const float* params, uint64_t n, double clock,
                                            double loss);
  // The latest publication (nullptr before the first).
  std::shared_ptr<const GossipCopy> Current() const;
  // Publication `publication`, while the board still has it: NOT_FOUND
  // before anything was published, FAILED_PRECONDITION once it was replaced
  // and rewritten.
  absl::StatusOr<std::shared_ptr<const GossipCopy>> Find(uint64_t publication) const;
  // Publications skipped because every buffer was held.
  uint64_t skipped() const;

 private:
  const Codec* codec_ = nullptr;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<GossipCopy>> copies_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<GossipCopy> current_ ABSL_GUARDED_BY(mu_);
  uint64_t next_publication_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_GOSSIP_BOARD_H_
