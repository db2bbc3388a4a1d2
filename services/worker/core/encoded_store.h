// What the peer service serves on Peer.ReadEncoded (docs/COMPRESSION.md):
// the encoded slices of a round's change that this worker published (its
// contributions to every owner, the average of the slice it owns) and the
// outer optimizer's state of its agreed model (for workers catching up).
// Blobs are immutable and shared, so serving copies a piece out of one
// without holding the lock while gRPC writes it.
//
// Thread-safe: the exchange publishes, gRPC threads read.
#ifndef SHOAL_SERVICES_WORKER_CORE_ENCODED_STORE_H_
#define SHOAL_SERVICES_WORKER_CORE_ENCODED_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "shoal/v1/peer.pb.h"

namespace shoal::worker {

using Blob = std::shared_ptr<const std::string>;

class EncodedStore {
 public:
  // The exchange of `round` (attempt) starts: what older rounds or other
  // attempts of this one published is dropped, except the averages of the
  // previous round (slow readers may still be gathering them). A second
  // start of the same round and attempt is another plan (a new leader
  // numbers the round it resumes as the old one did): what the first
  // published is dropped too.
  void BeginRound(uint64_t round, uint32_t attempt);
  // The plan this worker published for is void (its coordinator session was
  // lost, or its pending average voided): everything of the current round
  // is dropped and reads of it wait (UNAVAILABLE) until the next
  // BeginRound, so no reader of a later plan with the same round and
  // attempt gets the old plan's bytes. The previous round's averages stay.
  void Withdraw();
  // Publishes a blob for [begin, end) of `kind` (CONTRIBUTION, AVERAGED)
  // of the current round and attempt; ignored for any other.
  // `stage`: the stage of a hierarchical round (from 1) the blob belongs
  // to; 0 for the flat exchange.
  void Publish(uint64_t round, uint32_t attempt, shoal::v1::SliceKind kind, uint64_t begin,
               uint64_t end, Blob blob, uint32_t stage = 0);
  // Hierarchical round: this worker has reached `stage` of the current
  // round and attempt (stages only go up; ignored for another round or
  // attempt). Reads of a later stage wait (UNAVAILABLE) until it does.
  void ReachStage(uint64_t round, uint32_t attempt, uint32_t stage);
  // The outer optimizer's state of the agreed model of `round` (SNAPSHOT).
  void SetState(uint64_t round, Blob state);

  // The blob a request asks for. UNAVAILABLE: not published yet (a later
  // round or attempt, or this one before it is there: ask again);
  // FAILED_PRECONDITION: an older round or attempt, or a slice this worker
  // does not publish (in a hierarchical round: a stage it has passed and
  // published nothing of the kind there); INVALID_ARGUMENT: no kind, a kind
  // this store never holds (GOSSIP, unknown values), an empty range. Stage gating
  // (ReadEncodedRequest.stage): what a stage published stays served until the next round or
  // attempt, even after the worker moved on to a later stage, because a slower member of the group
  // may still be reading it; the blobs are immutable copies, so the worker
  // rewrites its parameters freely meanwhile.
  absl::StatusOr<Blob> Find(const shoal::v1::ReadEncodedRequest& request) const;

  // A read that waits for its blob instead of asking again (Peer.ReadEncoded
  // parks on it). `done` runs once with what Find returns as soon as that
  // is anything but UNAVAILABLE: at once, on this thread, if it is so now
  // (Await then returns 0); else from the Publish, ReachStage, BeginRound
  // or SetState that changes it, on that thread, outside the store's lock.
  // Returns the wait's ticket for CancelWait.
  using Waiter = std::function<void(absl::StatusOr<Blob>)>;
  uint64_t Await(const shoal::v1::ReadEncodedRequest& request, Waiter done) const;
  // Drops a pending wait: true if it was still pending (its `done` never
  // runs), false if `done` has run or is running.
  bool CancelWait(uint64_t ticket) const;
  // Waits pending (tests).
  size_t waiting() const;

 private:
  // Drops every blob but the averages of the round before `round`.
  void DropLocked(uint64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Blob> FindLocked(const shoal::v1::ReadEncodedRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the waits whose answer is no longer UNAVAILABLE; the caller runs
  // them after releasing mu_.
  using Answered = std::vector<std::pair<Waiter, absl::StatusOr<Blob>>>;
  Answered TakeAnsweredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Deliver(Answered answered);

  // round, attempt, stage, kind, begin, end.
  using Key = std::tuple<uint64_t, uint32_t, uint32_t, int, uint64_t, uint64_t>;
  mutable absl::Mutex mu_;
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t stage_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<Key, Blob> blobs_ ABSL_GUARDED_BY(mu_);
  uint64_t state_round_ ABSL_GUARDED_BY(mu_) = 0;
  Blob state_ ABSL_GUARDED_BY(mu_);
  struct Wait {
    shoal::v1::ReadEncodedRequest request;
    Waiter done;
  };
  mutable uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  mutable std::map<uint64_t, Wait> waits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_CORE_ENCODED_STORE_H_
