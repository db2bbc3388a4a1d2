// The reads and pushes the averaging pipeline's transports share
// (services/worker/fan_out.h): a raw slice read that resumes where it
// stopped, a push to an owner from behind NAT, and the owner's side of a
// push. Each retries what may be retried (common/retry.h) until the
// exchange's deadline and ends at once when its token is cancelled.
#ifndef SHOAL_SERVICES_WORKER_SLICE_IO_H_
#define SHOAL_SERVICES_WORKER_SLICE_IO_H_

#include <grpcpp/alarm.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backoff.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/tensor_wire.h"
#include "common/tensor_wire_grpc.h"
#include "services/worker/core/bad_chunk_log.h"
#include "services/worker/core/push_box.h"
#include "services/worker/core/reduce_window.h"
#include "services/worker/peer_client.h"
#include "shoal/v1/peer.pb.h"

namespace shoal::worker {

struct SliceIo {
  PeerClient* peers = nullptr;
  const Clock* clock = nullptr;
  // Backoff between retries of a read (not-yet-averaged, peer unavailable).
  absl::Duration initial_backoff = absl::Milliseconds(1);
  absl::Duration max_backoff = absl::Milliseconds(20);
  // Contributions pushed by participants behind NAT (may be null).
  PushBox* push_box = nullptr;
  // Where the peers that sent bad chunks are noted (may be null).
  BadChunkLog* bad_chunks = nullptr;
};

// What a raw slice read is: [begin, end) of `kind` of (round, attempt) from
// the peer at `address`, on behalf of `self_id`, until `deadline`; `stop`
// (never null) ends it early; `retries` (may be null) counts retries.
struct SliceReadSpec {
  std::string address;
  shoal::v1::SliceKind kind = shoal::v1::CONTRIBUTION;
  uint64_t round = 0;
  uint32_t attempt = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  std::string self_id;
  absl::Time deadline;
  CancellationToken* stop = nullptr;
  std::atomic<int>* retries = nullptr;
};

// One raw slice read that resumes at the first element it lacks after a
// failure (so a retried read never delivers an element twice), retried
// (UNAVAILABLE, DEADLINE_EXCEEDED of one call, RESOURCE_EXHAUSTED) with the
// io's backoff until the deadline, and driven by callbacks
// (PeerClient::StartReadSlice): no thread waits for it. The one reader of
// raw slices: the exchange's reduce and gather, the catch-up's layers and
// gossip's pulls all go through it.
//
// `apply` gets each checked chunk, on a gRPC thread, one at a time: an
// error from it is final (bad data would fail again); it may ask to pause
// (`*next = ChunkNext::kPause`: no further chunk until Resume()), which
// holds the sender through gRPC's flow control. `done` runs once, last:
// OK, ABORTED once `stop` is cancelled, DEADLINE_EXCEEDED naming the range
// at the deadline, or the final error. Thread-safe.
class SliceRead : public ResumeHandle, public std::enable_shared_from_this<SliceRead> {
 public:
  using Apply = std::function<absl::Status(const ChunkView&, ChunkNext* next)>;
  using Done = std::function<void(absl::Status)>;
  static std::shared_ptr<SliceRead> Start(const SliceIo& io, SliceReadSpec spec, Apply apply,
                                          Done done);
  ~SliceRead();

  // After `apply` asked to pause: reads on.
  void Resume() override;
  // The first element not delivered yet.
  uint64_t next() const;

  SliceRead(const SliceIo& io, SliceReadSpec spec, Apply apply, Done done);

 private:
  void Begin();
  void StartCall();
  void OnCallDone(absl::Status status);
  void Cancel();
  void Finish(absl::Status status);

  const SliceIo io_;
  const SliceReadSpec spec_;
  const Apply apply_;
  const Done done_;
  Backoff backoff_;
  grpc::Alarm alarm_;
  uint64_t cancel_id_ = 0;

  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<ChunkStreamCall> call_ ABSL_GUARDED_BY(mu_);
  absl::Status chunk_error_ ABSL_GUARDED_BY(mu_);
  absl::Status last_failure_ ABSL_GUARDED_BY(mu_);  // the last one retried
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;             // for the backoff alarm
  std::shared_ptr<SliceRead> keep_ ABSL_GUARDED_BY(mu_);  // this, meanwhile
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Reads [begin, end) of `kind` from `address` (Peer.ReadSlice), resuming
// after failures; `apply` gets each checked chunk (an error from it is
// final: bad data would fail again). ABORTED once `stop` is cancelled,
// DEADLINE_EXCEEDED naming the range at `deadline`. A SliceRead waited for
// on the calling thread.
absl::Status ReadRawSlice(const SliceIo& io, const std::string& address, shoal::v1::SliceKind kind,
                          uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end,
                          const std::string& self_id, absl::Time deadline, CancellationToken* stop,
                          const std::function<absl::Status(const ChunkView&)>& apply,
                          std::atomic<int>* retries);

// Behind NAT: pushes `bytes` (our contribution of [begin, end), raw float32
// or encoded) to the owner at `address`, retrying until `deadline`.
absl::Status PushToOwner(const SliceIo& io, const std::string& owner_id, const std::string& address,
                         uint64_t round, uint32_t attempt, uint64_t begin, uint64_t end,
                         const std::string& self_id, bool encoded, absl::string_view bytes,
                         absl::Time deadline, CancellationToken* stop, std::atomic<int>* retries);

// The owner's side of a push, waited for on a thread of its own (a push is
// not a read: nothing to drive by callbacks): `done` gets the bytes.
void StartTakePushed(const SliceIo& io, const std::string& pusher, uint64_t round, uint32_t attempt,
                     uint64_t begin, uint64_t end, bool encoded, absl::Time deadline,
                     CancellationToken* stop,
                     std::function<void(absl::StatusOr<std::string>)> done);

// The owner's side: the contribution `pusher` pushed for [begin, end).
// FAILED_PRECONDITION without a push box; a raw push of the wrong size is
// INVALID_ARGUMENT.
absl::StatusOr<std::string> TakePushed(const SliceIo& io, const std::string& pusher, uint64_t round,
                                       uint32_t attempt, uint64_t begin, uint64_t end, bool encoded,
                                       absl::Time deadline, CancellationToken* stop);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_SLICE_IO_H_
