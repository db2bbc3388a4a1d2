// Can this process open a TCP connection to "host:port" within a timeout?
// The coordinator asks it of each joining worker's advertised Peer address
// (docs/SUPERNODES.md, "NAT"): a worker nobody can reach takes part with
// outbound connections only. Only the TCP handshake: no bytes are sent, so
// it works the same with TLS and tokens.
//
// Asynchronous, so that no gRPC thread waits on a handshake: Probe starts a
// non-blocking connect and returns at once; one thread watches every connect
// in flight with epoll, each with its own deadline, and runs the probe's
// callback when the handshake completes, fails or runs out of time. A host
// name (not a numeric address) is resolved on a second thread, since
// getaddrinfo blocks: a slow resolver delays other names, never the
// deadlines of the connects in flight.
#ifndef SHOAL_COMMON_TCP_PROBER_H_
#define SHOAL_COMMON_TCP_PROBER_H_

#include <sys/socket.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shoal {

// Thread-safe. Callbacks run on the prober's thread (or on the caller's,
// for a probe refused at once), outside its locks: they must not block, and
// they may call Probe. Shutdown (or the destructor) runs the callbacks of
// every probe still in flight with CANCELLED before it returns.
class TcpProber {
 public:
  // OK when the handshake completed; UNAVAILABLE (refused, unreachable, no
  // such host), DEADLINE_EXCEEDED (no answer in time), INVALID_ARGUMENT
  // (not host:port) or CANCELLED (the prober shut down), with the reason.
  using Callback = std::function<void(absl::Status)>;

  // Starts the threads. `clock` (not owned) dates the deadlines.
  static absl::StatusOr<std::unique_ptr<TcpProber>> Start(const Clock* clock);
  ~TcpProber();

  // Tries "host:port" ("[v6]:port" too) until `timeout` from now: each of
  // the name's addresses in turn, within that one deadline.
  void Probe(const std::string& host_port, absl::Duration timeout, Callback done);

  // Probes started and not finished yet.
  int in_flight() const { return in_flight_.load(); }

  // Cancels what is in flight (its callbacks run before this returns; one
  // getaddrinfo in progress is waited for) and joins the threads. Later
  // probes finish at once with CANCELLED. Idempotent.
  void Shutdown();

 private:
  struct Attempt;
  explicit TcpProber(const Clock* clock);

  // Hands a resolved probe to the epoll thread (or finishes it).
  void Submit(std::unique_ptr<Attempt> attempt);
  void Finish(std::unique_ptr<Attempt> attempt, absl::Status status);
  void Wake();
  void PollLoop();
  void ResolveLoop();

  const Clock* const clock_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd in the epoll set: new probes, shutdown
  std::atomic<int> in_flight_{0};

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Resolved probes for the epoll thread, and names for the resolver.
  std::vector<std::unique_ptr<Attempt>> incoming_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Attempt>> names_ ABSL_GUARDED_BY(mu_);

  std::thread poller_;
  std::thread resolver_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_TCP_PROBER_H_
