// The reads and pushes the averaging pipeline's transports share
// (services/worker/fan_out.h): a raw slice read that resumes where it
// stopped, a push to an owner from behind NAT, and the owner's side of a
// push. Each retries what may be retried (common/retry.h) until the
// exchange's deadline and ends at once when its token is cancelled.
#ifndef SHOAL_SERVICES_WORKER_SLICE_IO_H_
#define SHOAL_SERVICES_WORKER_SLICE_IO_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/tensor_wire.h"
#include "services/worker/core/bad_chunk_log.h"
#include "services/worker/core/push_box.h"
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

// Reads [begin, end) of `kind` from `address` (Peer.ReadSlice), resuming
// after failures; `apply` gets each checked chunk (an error from it is
// final: bad data would fail again). ABORTED once `stop` is cancelled,
// DEADLINE_EXCEEDED naming the range at `deadline`.
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

// The owner's side: the contribution `pusher` pushed for [begin, end).
// FAILED_PRECONDITION without a push box; a raw push of the wrong size is
// INVALID_ARGUMENT.
absl::StatusOr<std::string> TakePushed(const SliceIo& io, const std::string& pusher, uint64_t round,
                                       uint32_t attempt, uint64_t begin, uint64_t end, bool encoded,
                                       absl::Time deadline, CancellationToken* stop);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_SLICE_IO_H_
