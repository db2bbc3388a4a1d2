// Can this process open a TCP connection to "host:port" within `timeout`?
// The coordinator asks it of each joining worker's advertised Peer address
// (docs/SUPERNODES.md, "NAT"): a worker nobody can reach takes part with
// outbound connections only. Only the TCP handshake: no bytes are sent, so
// it works the same with TLS and tokens.
#ifndef SHOAL_COMMON_TCP_PROBE_H_
#define SHOAL_COMMON_TCP_PROBE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shoal {

// OK when the handshake completed; UNAVAILABLE (refused, unreachable, no
// such host) or DEADLINE_EXCEEDED otherwise, with the reason.
absl::Status ProbeTcp(const std::string& host_port, absl::Duration timeout);

}  // namespace shoal

#endif  // SHOAL_COMMON_TCP_PROBE_H_
