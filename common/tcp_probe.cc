#include "common/tcp_probe.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shoal {
namespace {

// "host:port", "[v6]:port" -> host, port.
bool SplitHostPort(const std::string& s, std::string* host, std::string* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 >= s.size()) return false;
  *host = s.substr(0, colon);
  *port = s.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty();
}

}  // namespace

absl::Status ProbeTcp(const std::string& host_port, absl::Duration timeout) {
  std::string host, port;
  if (!SplitHostPort(host_port, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("not host:port: ", host_port));
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat(host_port, ": ", gai_strerror(rc)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no address";
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
        const int ready = ms > 0 ? poll(&p, 1, static_cast<int>(ms)) : 0;
        if (ready <= 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof(err);
          if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
    }
    close(fd);
    if (err == 0) {
      freeaddrinfo(found);
      return absl::OkStatus();
    }
    last = std::strerror(err);
    code = err == ETIMEDOUT ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable;
  }
  freeaddrinfo(found);
  return absl::Status(code, absl::StrCat("cannot connect to ", host_port, ": ", last));
}

}  // namespace shoal
