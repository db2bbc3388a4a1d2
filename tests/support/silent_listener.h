// Addresses on 127.0.0.1 for reachability probes in tests, without root or
// network namespaces:
//   - SilentListener: a port whose handshakes never complete. It listens
//     with a backlog of 0 and one connection that is never accepted fills
//     its accept queue; Linux then drops every further SYN (the client
//     retransmits and times out, as with a firewall that drops packets).
//   - RefusingPort: a port nobody listens on (connects are refused at once).
#ifndef SHOAL_TESTS_SUPPORT_SILENT_LISTENER_H_
#define SHOAL_TESTS_SUPPORT_SILENT_LISTENER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace shoal::testing {

class SilentListener {
 public:
  SilentListener() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listen_fd_, 0) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
    // The connection that fills the accept queue (a blocking connect on
    // loopback completes at once while the queue has room).
    filler_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (filler_fd_ < 0 || connect(filler_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      port_ = 0;
      return;
    }
    // It is in the accept queue: the listener is readable.
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) port_ = 0;
  }
  ~SilentListener() {
    if (filler_fd_ >= 0) close(filler_fd_);
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;

  // 0 when the set-up failed.
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int listen_fd_ = -1;
  int filler_fd_ = -1;
  int port_ = 0;
};

// A loopback port bound but not listening: connects are refused at once
// (RST), and the port stays taken while this object lives, so nobody else
// starts listening there meanwhile.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~RefusingPort() {
    if (fd_ >= 0) close(fd_);
  }
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;

  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_SILENT_LISTENER_H_
