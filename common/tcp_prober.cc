#include "common/tcp_prober.h"

#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
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

// One probe: its target's addresses, tried in turn within one deadline.
// Owned by one thread at a time (the caller, the resolver, the poller).
struct TcpProber::Attempt {
  std::string host_port;
  std::string host;
  std::string port;
  absl::Time deadline;
  Callback done;
  std::vector<std::pair<sockaddr_storage, socklen_t>> addresses;
  size_t next = 0;  // the next address to try
  int fd = -1;      // the connect in flight
  std::string last_error = "no address";
  bool timed_out = false;

  // Takes getaddrinfo's answer.
  void Take(const addrinfo* found) {
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
      sockaddr_storage address{};
      std::memcpy(&address, a->ai_addr, a->ai_addrlen);
      addresses.emplace_back(address, a->ai_addrlen);
    }
  }
};

TcpProber::TcpProber(const Clock* clock) : clock_(clock) {}

absl::StatusOr<std::unique_ptr<TcpProber>> TcpProber::Start(const Clock* clock) {
  std::unique_ptr<TcpProber> prober(new TcpProber(clock));
  prober->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (prober->epoll_fd_ < 0) {
    return absl::InternalError(absl::StrCat("epoll_create1: ", std::strerror(errno)));
  }
  prober->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (prober->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = prober->wake_fd_;
  if (epoll_ctl(prober->epoll_fd_, EPOLL_CTL_ADD, prober->wake_fd_, &event) != 0) {
    return absl::InternalError(absl::StrCat("epoll_ctl: ", std::strerror(errno)));
  }
  TcpProber* raw = prober.get();
  prober->poller_ = std::thread([raw] { raw->PollLoop(); });
  prober->resolver_ = std::thread([raw] { raw->ResolveLoop(); });
  return prober;
}

TcpProber::~TcpProber() {
  Shutdown();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void TcpProber::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      if (wake_fd_ >= 0) Wake();
    }
  }
  if (poller_.joinable()) poller_.join();
  if (resolver_.joinable()) resolver_.join();
}

void TcpProber::Probe(const std::string& host_port, absl::Duration timeout, Callback done) {
  in_flight_.fetch_add(1);
  auto attempt = std::make_unique<Attempt>();
  attempt->host_port = host_port;
  attempt->deadline = clock_->Now() + timeout;
  attempt->done = std::move(done);
  if (!SplitHostPort(host_port, &attempt->host, &attempt->port)) {
    Finish(std::move(attempt),
           absl::InvalidArgumentError(absl::StrCat("not host:port: ", host_port)));
    return;
  }
  // A numeric address needs no resolver (no I/O): straight to the poller.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(attempt->host.c_str(), attempt->port.c_str(), &hints, &found);
  if (rc == 0) {
    attempt->Take(found);
    freeaddrinfo(found);
    Submit(std::move(attempt));
    return;
  }
  if (rc != EAI_NONAME) {
    Finish(std::move(attempt),
           absl::UnavailableError(absl::StrCat(host_port, ": ", gai_strerror(rc))));
    return;
  }
  absl::ReleasableMutexLock lock(&mu_);
  if (stopping_) {
    lock.Release();
    Finish(std::move(attempt), absl::CancelledError("the prober is shutting down"));
    return;
  }
  names_.push_back(std::move(attempt));
}

void TcpProber::Submit(std::unique_ptr<Attempt> attempt) {
  absl::ReleasableMutexLock lock(&mu_);
  if (stopping_) {
    lock.Release();
    Finish(std::move(attempt), absl::CancelledError("the prober is shutting down"));
    return;
  }
  incoming_.push_back(std::move(attempt));
  // Under mu_: Shutdown closes nothing before the threads are joined, and
  // a Submit after stopping_ does not get here.
  Wake();
}

void TcpProber::Wake() {
  const uint64_t one = 1;
  // A full counter (never, in practice) means a wake-up is pending anyway.
  (void)!write(wake_fd_, &one, sizeof(one));
}

void TcpProber::Finish(std::unique_ptr<Attempt> attempt, absl::Status status) {
  if (attempt->fd >= 0) {
    close(attempt->fd);
    attempt->fd = -1;
  }
  Callback done = std::move(attempt->done);
  attempt.reset();
  done(std::move(status));
  in_flight_.fetch_sub(1);
}

void TcpProber::ResolveLoop() {
  for (;;) {
    std::unique_ptr<Attempt> attempt;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !names_.empty(); };
      // Idle until a name comes or the prober stops (Shutdown wakes it).
      mu_.Await(absl::Condition(&ready));
      if (stopping_) break;
      attempt = std::move(names_.front());
      names_.pop_front();
    }
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(attempt->host.c_str(), attempt->port.c_str(), &hints, &found);
    if (rc != 0) {
      const std::string why = absl::StrCat(attempt->host_port, ": ", gai_strerror(rc));
      Finish(std::move(attempt), absl::UnavailableError(why));
      continue;
    }
    attempt->Take(found);
    freeaddrinfo(found);
    if (clock_->Now() >= attempt->deadline) {
      const std::string why = absl::StrCat("cannot connect to ", attempt->host_port,
                                           ": resolving the name took the "
                                           "whole timeout");
      Finish(std::move(attempt), absl::DeadlineExceededError(why));
      continue;
    }
    Submit(std::move(attempt));
  }
  std::deque<std::unique_ptr<Attempt>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(names_);
  }
  for (auto& attempt : left) {
    Finish(std::move(attempt), absl::CancelledError("the prober is shutting down"));
  }
}

void TcpProber::PollLoop() {
  // The connects in flight by socket.
  absl::flat_hash_map<int, std::unique_ptr<Attempt>> active;
  // Starts `attempt`'s next address: in flight (kept in `active`), or
  // finished when no address is left or its deadline passed.
  auto start_next = [&](std::unique_ptr<Attempt> attempt) {
    while (attempt->next < attempt->addresses.size() && clock_->Now() < attempt->deadline) {
      const auto& [address, length] = attempt->addresses[attempt->next++];
      const int fd =
          socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
      if (fd < 0) {
        attempt->last_error = std::strerror(errno);
        continue;
      }
      if (connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
        close(fd);
        Finish(std::move(attempt), absl::OkStatus());
        return;
      }
      if (errno != EINPROGRESS) {
        attempt->last_error = std::strerror(errno);
        close(fd);
        continue;
      }
      epoll_event event{};
      event.events = EPOLLOUT;
      event.data.fd = fd;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
        attempt->last_error = std::strerror(errno);
        close(fd);
        continue;
      }
      attempt->fd = fd;
      active[fd] = std::move(attempt);
      return;
    }
    const bool late = attempt->timed_out || clock_->Now() >= attempt->deadline;
    const std::string why = absl::StrCat("cannot connect to ", attempt->host_port, ": ",
                                         late ? std::strerror(ETIMEDOUT) : attempt->last_error);
    Finish(std::move(attempt),
           late ? absl::DeadlineExceededError(why) : absl::UnavailableError(why));
  };
  // Takes `fd` out of the set; its attempt is returned, its socket closed.
  auto take = [&](int fd) {
    auto it = active.find(fd);
    std::unique_ptr<Attempt> attempt = std::move(it->second);
    active.erase(it);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    attempt->fd = -1;
    return attempt;
  };

  std::vector<epoll_event> events(64);
  for (;;) {
    std::vector<std::unique_ptr<Attempt>> fresh;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      fresh.swap(incoming_);
      stopping = stopping_;
    }
    if (stopping) {
      for (auto& attempt : fresh) {
        Finish(std::move(attempt), absl::CancelledError("the prober is shutting down"));
      }
      std::vector<int> fds;
      for (const auto& [fd, attempt] : active) fds.push_back(fd);
      for (int fd : fds) {
        Finish(take(fd), absl::CancelledError("the prober is shutting down"));
      }
      return;
    }
    for (auto& attempt : fresh) start_next(std::move(attempt));

    // Sleep until a connect completes, a deadline passes or a probe comes.
    absl::Time earliest = absl::InfiniteFuture();
    for (const auto& [fd, attempt] : active) earliest = std::min(earliest, attempt->deadline);
    int timeout_ms = -1;  // nothing in flight: only the wake-up fd ends it
    if (earliest != absl::InfiniteFuture()) {
      const absl::Duration left = earliest - clock_->Now();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 0, 60'000));
    }
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout_ms);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
        continue;
      }
      if (!active.contains(fd)) continue;
      int err = 0;
      socklen_t len = sizeof(err);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      std::unique_ptr<Attempt> attempt = take(fd);
      if (err == 0) {
        Finish(std::move(attempt), absl::OkStatus());
      } else {
        attempt->last_error = std::strerror(err);
        start_next(std::move(attempt));
      }
    }
    const absl::Time now = clock_->Now();
    std::vector<int> late;
    for (const auto& [fd, attempt] : active) {
      if (attempt->deadline <= now) late.push_back(fd);
    }
    for (int fd : late) {
      std::unique_ptr<Attempt> attempt = take(fd);
      attempt->timed_out = true;
      start_next(std::move(attempt));  // past its deadline: finishes it
    }
  }
}

}  // namespace shoal
