// A TCP proxy on 127.0.0.1:0 for tests: forwards each connection to one
// upstream address, and can hold back what comes down (Freeze: bytes from
// upstream stay unread, as on a link that stalled) and cut every
// connection at once (Stop). Used to lose directives in flight between a
// relay and its member deterministically (relay_frontend_test).
#ifndef SHOAL_TESTS_SUPPORT_TCP_PROXY_H_
#define SHOAL_TESTS_SUPPORT_TCP_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shoal::testing {

class TcpProxy {
 public:
  // Forwards to 127.0.0.1:`upstream_port`.
  explicit TcpProxy(int upstream_port) : upstream_port_(upstream_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 16) != 0) {
      close(listen_fd_);
      listen_fd_ = -1;
      return;
    }
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    threads_.emplace_back([this] { Accept(); });
  }
  ~TcpProxy() { Stop(); }

  // 0 when the listening socket could not be made.
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  // From now on nothing read from upstream is passed down.
  void Freeze() { frozen_ = true; }

  // Closes the listener and every connection (both sides), and waits for
  // the threads.
  void Stop() {
    if (stopped_.exchange(true)) return;
    for (std::thread& t : threads_) t.join();
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) close(fd);
    fds_.clear();
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
  }

 private:
  static constexpr int kPollMs = 20;

  void Accept() {
    while (!stopped_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, kPollMs) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int upstream = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(upstream_port_));
      if (connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(upstream);
        close(client);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        fds_.push_back(client);
        fds_.push_back(upstream);
      }
      pumps_.emplace_back([this, client, upstream] { Pump(client, upstream); });
    }
    for (std::thread& t : pumps_) t.join();
  }

  // Both directions of one connection until either side ends or Stop.
  void Pump(int client, int upstream) {
    char buf[16384];
    while (!stopped_) {
      pollfd p[2] = {{client, POLLIN, 0}, {upstream, static_cast<short>(frozen_ ? 0 : POLLIN), 0}};
      if (poll(p, 2, kPollMs) <= 0) continue;
      if (p[0].revents != 0 && !Copy(client, upstream, buf, sizeof(buf))) break;
      if (p[1].revents == 0) continue;
      if (frozen_) {
        // Upstream hung up: the connection goes, with what was held back.
        if ((p[1].revents & (POLLHUP | POLLERR)) != 0) break;
        continue;
      }
      if (!Copy(upstream, client, buf, sizeof(buf))) break;
    }
    shutdown(client, SHUT_RDWR);
    shutdown(upstream, SHUT_RDWR);
  }

  static bool Copy(int from, int to, char* buf, size_t size) {
    const ssize_t n = read(from, buf, size);
    if (n <= 0) return false;
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t w = write(to, buf + sent, static_cast<size_t>(n - sent));
      if (w <= 0) return false;
      sent += w;
    }
    return true;
  }

  const int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stopped_{false};
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;  // the acceptor
  std::vector<std::thread> pumps_;    // acceptor thread only
};

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_TCP_PROXY_H_
