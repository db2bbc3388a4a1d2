// Contributions pushed to this worker by participants behind NAT
// (docs/SUPERNODES.md "NAT"). Such a participant cannot be read, so it sends
// each owner its copy of the owner's slice (Peer.Push); the Peer service
// puts a push here once it has arrived whole and checked, and the owner's
// reduce takes it instead of reading it. Nothing half-received is ever
// stored. Bounded: pushes of rounds older than the current one are dropped
// (DropBefore) and the bytes kept are capped.
#ifndef SHOAL_SERVICES_WORKER_CORE_PUSH_BOX_H_
#define SHOAL_SERVICES_WORKER_CORE_PUSH_BOX_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"

namespace shoal::worker {

struct PushKey {
  uint64_t round = 0;
  uint32_t attempt = 0;
  std::string pusher;
  uint64_t begin = 0;
  uint64_t end = 0;
  bool encoded = false;
  bool operator<(const PushKey& o) const {
    return std::tie(round, attempt, pusher, begin, end, encoded) <
           std::tie(o.round, o.attempt, o.pusher, o.begin, o.end, o.encoded);
  }
};

// A whole model pushed in gossip mode by a partner behind NAT.
struct GossipPush {
  std::string pusher;
  uint64_t publication = 0;
  double clock = 0;
  double loss = 0;
  std::string bytes;  // float32, the whole model
};

class PushBox {
 public:
  // `max_bytes`: the most kept at once; `clock` (the real one when null)
  // times Take's deadline.
  explicit PushBox(uint64_t max_bytes, const Clock* clock = nullptr);

  // Keeps a whole push. FAILED_PRECONDITION for a round older than the
  // oldest kept (DropBefore), RESOURCE_EXHAUSTED past max_bytes; a second
  // push of the same key replaces the first (a retried push).
  absl::Status Put(const PushKey& key, std::string bytes);

  // Waits until the push of `key` is here, then hands it over (and forgets
  // it). DEADLINE_EXCEEDED at `deadline`, ABORTED when `cancel` fires.
  absl::StatusOr<std::string> Take(const PushKey& key, absl::Time deadline,
                                   CancellationToken* cancel);

  // Gossip: keeps the newest model each pusher sent (one per pusher, within
  // the same byte cap); TakeGossip hands over one of them (the oldest
  // arrival first), or nullopt.
  absl::Status PutGossip(GossipPush push);
  std::optional<GossipPush> TakeGossip();

  // Forgets every push of a round before `round`, and refuses them from now.
  void DropBefore(uint64_t round);

  uint64_t bytes() const;
  // A new cap (the worker sets it once it knows the model's size).
  void SetMaxBytes(uint64_t max_bytes);

 private:
  uint64_t max_bytes_ ABSL_GUARDED_BY(mu_);
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<PushKey, std::string> pushes_ ABSL_GUARDED_BY(mu_);
  std::deque<GossipPush> gossip_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t oldest_round_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar arrived_;  // a Put, or a Take's cancel fired
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_PUSH_BOX_H_
