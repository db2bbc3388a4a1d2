#include "services/worker/uplink_pacer.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

#ifndef SO_MAX_PACING_RATE
#define SO_MAX_PACING_RATE 47
#endif

namespace shoal::worker {

uint64_t PacingBytesPerSecond(double uplink_mbps, int flows) {
  const double rate = uplink_mbps * 1e6 / 8 / std::max(1, flows);
  // The kernel takes 32 bits on older releases; ~0U means unpaced.
  constexpr double kMax = std::numeric_limits<uint32_t>::max() - 1.0;
  return static_cast<uint64_t>(std::clamp(std::floor(rate), 1.0, kMax));
}

absl::StatusOr<int> PaceConnectedTcpSockets(uint64_t bytes_per_second) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list /proc/self/fd to pace the sockets: ", std::strerror(errno)));
  }
  const uint32_t rate = static_cast<uint32_t>(
      std::min<uint64_t>(bytes_per_second, std::numeric_limits<uint32_t>::max() - 1));
  int paced = 0;
  while (const dirent* entry = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(dir)) continue;
    int value = 0;
    socklen_t len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &value, &len) != 0 || value != SOCK_STREAM) continue;
    len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &value, &len) != 0 || value != IPPROTO_TCP) {
      continue;
    }
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    // Listening and not yet connected sockets have no peer.
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) == 0) ++paced;
  }
  closedir(dir);
  return paced;
}

void UplinkPacer::Share(int flows) {
  flows = std::max(1, flows);
  const uint64_t rate = PacingBytesPerSecond(uplink_mbps_, flows);
  absl::StatusOr<int> paced = PaceConnectedTcpSockets(rate);
  absl::MutexLock lock(&mu_);
  if (!paced.ok()) {
    if (last_flows_ != -1) SHOAL_LOG(WARNING) << "--uplink_mbps: " << paced.status();
    last_flows_ = -1;
    return;
  }
  if (flows != last_flows_) {
    SHOAL_LOG(INFO) << "uplink " << uplink_mbps_ << " Mbit/s shared by " << flows
                    << (flows == 1 ? " flow" : " flows") << ": " << *paced
                    << " connections paced at " << rate * 8 / 1e6 << " Mbit/s each";
    last_flows_ = flows;
  }
}

}  // namespace shoal::worker
