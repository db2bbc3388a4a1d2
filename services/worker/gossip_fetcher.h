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
// Threads: Start(), Take(), FetchNow() and the destructor are called from
// the worker's main thread (the runner, which polls Take()). A fetch has no
// thread of its own: GetPeerInfo, then the read (PeerClient::StartReadSlice)
// or the encoded blob (StartBlobRead) and, behind NAT, the push back
// (StartPush) are gRPC callback calls, each started from the previous one's
// callback; decoding an encoded pull runs on the callback thread of its last
// piece. At most one background fetch at a time; FetchNow waits for its
// own. The received model lives in a buffer of the fetcher, valid until the
// next Start() or FetchNow(). The destructor cancels the fetches in flight
// and waits until they have ended (at once when cancelled; each call has
// its deadline).
#ifndef SHOAL_SERVICES_WORKER_GOSSIP_FETCHER_H_
#define SHOAL_SERVICES_WORKER_GOSSIP_FETCHER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
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
  ~GossipFetcher();  // cancels the fetches in flight and waits for their end

  // Starts fetching the model of `peer_id` at `address` (`elements`
  // float32) within `timeout`. False when a fetch is still in flight or
  // its result was not taken yet.
  bool Start(const std::string& peer_id, const std::string& address, uint64_t elements,
             absl::Duration timeout, std::shared_ptr<const GossipCopy> base);
  // The result of the finished fetch, once; nullopt while one runs or none
  // was started.
  std::optional<GossipFetchResult> Take();
  // The same fetch, waited for on the calling thread (the late joiner's
  // first model, the consensus evaluation, the final average).
  GossipFetchResult FetchNow(const std::string& peer_id, const std::string& address,
                             uint64_t elements, absl::Duration timeout);
  bool idle() const;
  // Behind NAT: after each successful background fetch, push the base copy
  // (our published model) to the same partner (Peer.Push, gossip). Set
  // before the first Start().
  void set_push_own(bool push) { push_own_ = push; }
  // The run's codec (outlives the fetcher; null or fp32: float32 reads).
  // Set before the first Start().
  void set_codec(const Codec* codec) { codec_ = codec; }

 private:
  class Fetch;  // one fetch in flight (gossip_fetcher.cc)
  // Shared with the fetches' callbacks, which may still be leaving its lock
  // when the fetcher goes.
  struct State {
    absl::Mutex mu;
    int in_flight ABSL_GUARDED_BY(mu) = 0;     // fetches that have not ended
    bool running ABSL_GUARDED_BY(mu) = false;  // the background fetch
    // The background fetch's result, until taken.
    std::optional<GossipFetchResult> result ABSL_GUARDED_BY(mu);
  };
  // Starts a fetch; `done` hears its result once, on any thread, after
  // which the fetch touches neither the fetcher nor `incoming_`. `push`
  // with `base`: push `base` back after a successful fetch.
  std::shared_ptr<Fetch> Begin(const std::string& peer_id, const std::string& address,
                               uint64_t elements, absl::Duration timeout, bool push,
                               std::shared_ptr<const GossipCopy> base,
                               std::function<void(GossipFetchResult)> done);

  PeerClient* const peers_;
  const std::string reader_id_;
  const Clock* const clock_;
  CancellationToken token_;
  bool push_own_ = false;
  const Codec* codec_ = nullptr;
  // Written by a fetch's callbacks while it runs, read by the caller once
  // its result was handed over.
  std::vector<float> incoming_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_GOSSIP_FETCHER_H_
