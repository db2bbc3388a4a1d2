// Paces a worker's sending at its uplink rate (--uplink_mbps), in the
// kernel. An exchange step's reads all start at once, so without pacing the
// worker's sockets burst at line speed into the first shaped link on the
// path (a home router, tc tbf in bench/run.sh wan), overflow its queue and
// lose packets: one fp32 exchange took 1.3-1.6 x its line-rate bound over
// 20 Mbit/s links, plain TCP sockets included (bench/RESULTS.md). Paced
// below the link, packet by packet, the queue never fills.
//
// How: SO_MAX_PACING_RATE (Linux) on every connected TCP socket of the
// process, found in /proc/self/fd, at the uplink rate divided by the flows
// that send at once. gRPC opens and accepts its sockets itself, and its
// socket-mutator hook is not public API in the gRPC Debian ships, so the
// sockets are looked up at each step instead: connections opened during a
// step are paced from the next one. Every connection counts, the
// coordinator's and (with hierarchy) a zone's local ones included: the
// setting is for a worker whose connections all cross one uplink.
#ifndef SHOAL_SERVICES_WORKER_UPLINK_PACER_H_
#define SHOAL_SERVICES_WORKER_UPLINK_PACER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace shoal::worker {

// The bytes per second of SO_MAX_PACING_RATE that `flows` sockets share
// `uplink_mbps` with (flows below 1 count as 1).
uint64_t PacingBytesPerSecond(double uplink_mbps, int flows);

// Sets SO_MAX_PACING_RATE to `bytes_per_second` on every connected TCP
// socket of this process; returns how many it set. Listening, unconnected
// and non-TCP descriptors are left alone. FAILED_PRECONDITION when
// /proc/self/fd cannot be read.
absl::StatusOr<int> PaceConnectedTcpSockets(uint64_t bytes_per_second);

// Thread-safe.
class UplinkPacer {
 public:
  explicit UplinkPacer(double uplink_mbps) : uplink_mbps_(uplink_mbps) {}

  double uplink_mbps() const { return uplink_mbps_; }

  // Before an exchange step in which `flows` peers read from this worker at
  // once: paces every connection at the uplink / flows. Logs when the share
  // changes; a failure is logged and the step runs unpaced.
  void Share(int flows);

 private:
  const double uplink_mbps_;
  absl::Mutex mu_;
  int last_flows_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_SERVICES_WORKER_UPLINK_PACER_H_
