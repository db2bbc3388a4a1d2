// Reads one whole blob of Peer.ReadEncoded (an encoded slice of the flat
// exchange, a stage's copy of the hierarchical one) piece by piece: checks
// each piece (round, announced size, offset, CRC-32C) and resumes after a
// failure where it stopped, retrying what `policy` allows until `deadline`.
// The one such loop of the worker: the blob transport (blob_transport.h) and
// gossip's pulls call it.
#ifndef SHOAL_SERVICES_WORKER_BLOB_READER_H_
#define SHOAL_SERVICES_WORKER_BLOB_READER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/clock.h"
#include "common/retry.h"
#include "services/worker/peer_client.h"
#include "shoal/v1/peer.pb.h"

namespace shoal::worker {

struct BlobLimits {
  // The blob may announce at most this many bytes...
  size_t max_bytes = 0;
  // ...or exactly that many when true.
  bool exact = false;
};

// Reads the blob piece by piece, each piece a callback call
// (PeerClient::StartReadEncoded), retried after a backoff on a gRPC alarm:
// no thread waits for it. `done` hears the whole blob or the error below,
// once, on a gRPC thread.
void StartBlobRead(PeerClient* peers, const std::string& address,
                   const shoal::v1::ReadEncodedRequest& request, BlobLimits limits,
                   RetryPolicy policy, absl::Time deadline, const Clock* clock,
                   CancellationToken* stop, std::atomic<int>* retries,
                   std::function<void(absl::StatusOr<std::string>)> done);

// `request` names the blob (its offset is ignored). `policy.deadline` is
// overridden by `deadline`. ABORTED once `stop` is cancelled;
// DEADLINE_EXCEEDED (naming the blob) when the deadline passes;
// INVALID_ARGUMENT / DATA_LOSS / FAILED_PRECONDITION for a bad piece; the
// peer's own final error otherwise. `retries` (may be null) counts retries.
// The same, waited for on the calling thread.
absl::StatusOr<std::string> ReadBlobWithRetry(PeerClient* peers, const std::string& address,
                                              const shoal::v1::ReadEncodedRequest& request,
                                              BlobLimits limits, RetryPolicy policy,
                                              absl::Time deadline, const Clock* clock,
                                              CancellationToken* stop, std::atomic<int>* retries);

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_BLOB_READER_H_
