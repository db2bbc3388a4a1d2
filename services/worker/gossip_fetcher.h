// The Tx side of gossip mode (dpwa): fetches one peer's published model
// (Peer.GetPeerInfo for its publication and state, then a GOSSIP ReadSlice
// of the whole model through the wire module: chunks, CRC, receiver
// checks; or, with the run's codec other than fp32, the publication's
// encoding through Peer.ReadEncoded, checked piece by piece and decoded)
// in the background while the worker keeps training, within one deadline
// for both calls. The result is whole or nothing: a corrupt,
// truncated, refused or late transfer yields an error and its bytes are
// never handed over, so nothing is half-applied.
//
// Threads: Start() and Take() are called from the worker's main thread; one
// background thread runs at most one fetch. The received model lives in a
// buffer of the fetcher, valid until the next Start().
#ifndef SHOAL_SERVICES_WORKER_GOSSIP_FETCHER_H_
#define SHOAL_SERVICES_WORKER_GOSSIP_FETCHER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "services/worker/core/codec.h"
#include "services/worker/core/gossip_board.h"
#include "services/worker/peer_client.h"

namespace shoal::worker {

struct GossipFetchResult {
  std::string peer_id;
  std::string address;
  // OK, or why the fetch was dropped.
  absl::Status status;
  // The peer did not answer in time or at all (DEADLINE_EXCEEDED or
  // UNAVAILABLE): its flow-control score goes down.
  bool not_answering = false;
  uint64_t publication = 0;
  double peer_clock = 0;
  double peer_loss = 0;
  // The worker's own copy when the fetch started (the base of the
  // interpolation), as given to Start().
  std::shared_ptr<const GossipCopy> base;
  // The peer's model (status OK only); valid until the next Start().
  const float* peer_params = nullptr;
  uint64_t elements = 0;
  // Bytes that came over the wire (the encoding's size with a codec).
  uint64_t wire_bytes = 0;
  absl::Duration took;
  // Behind NAT (set_push_own): whether our base model was pushed to the
  // partner after the fetch, and why not.
  bool pushed = false;
  absl::Status push_status;
};

class GossipFetcher {
 public:
  // `stop` (may be null) cancels a fetch in flight (shutdown).
  GossipFetcher(PeerClient* peers, std::string reader_id, const Clock* clock,
                CancellationToken* stop);
  ~GossipFetcher();  // cancels and joins a fetch in flight

  // Starts fetching the model of `peer_id` at `address` (`elements`
  // float32) within `timeout`. False when a fetch is still in flight or
  // its result was not taken yet.
  bool Start(const std::string& peer_id, const std::string& address, uint64_t elements,
             absl::Duration timeout, std::shared_ptr<const GossipCopy> base);
  // The result of the finished fetch, once; nullopt while one runs or none
  // was started.
  std::optional<GossipFetchResult> Take();
  // The same fetch on the calling thread (the late joiner's first model).
  GossipFetchResult FetchNow(const std::string& peer_id, const std::string& address,
                             uint64_t elements, absl::Duration timeout);
  bool idle() const { return !running_.load() && !has_result_.load(); }
  // Behind NAT: after each successful background fetch, push the base copy
  // (our published model) to the same partner (Peer.Push, gossip). Set
  // before the first Start().
  void set_push_own(bool push) { push_own_ = push; }
  // The run's codec (outlives the fetcher; null or fp32: float32 reads).
  // Set before the first Start().
  void set_codec(const Codec* codec) { codec_ = codec; }

 private:
  GossipFetchResult Fetch(const std::string& peer_id, const std::string& address, uint64_t elements,
                          absl::Duration timeout);
  void Join();

  PeerClient* const peers_;
  const std::string reader_id_;
  const Clock* const clock_;
  CancellationToken token_;
  bool push_own_ = false;
  const Codec* codec_ = nullptr;
  std::vector<float> incoming_;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<bool> has_result_{false};
  GossipFetchResult result_;  // written by the fetch thread before running_ = false
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_GOSSIP_FETCHER_H_
