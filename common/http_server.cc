#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shoal {
namespace {

constexpr size_t kMaxHead = 8192;

const char* Reason(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

int RemainingMs(const Clock* clock, absl::Time deadline) {
  const absl::Duration left = deadline - clock->Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left)));
}

// Sends all of `data` by `deadline`; false when the client did not take it.
bool SendAll(const Clock* clock, int fd, const std::string& data, absl::Time deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += n;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    const int ms = RemainingMs(clock, deadline);
    if (ms == 0) return false;
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, ms) < 0 && errno != EINTR) return false;
  }
  return true;
}

std::string Serialize(const HttpResponse& r, bool head_only) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", r.code, " ", Reason(r.code), "\r\nContent-Type: ", r.content_type,
                   "\r\nContent-Length: ", r.body.size(), "\r\nConnection: close\r\n");
  for (const std::string& h : r.headers) absl::StrAppend(&out, h, "\r\n");
  out += "\r\n";
  if (!head_only) out += r.body;
  return out;
}

HttpResponse Error(int code, absl::string_view why) {
  HttpResponse r;
  r.code = code;
  r.body = absl::StrCat(code, " ", Reason(code), ": ", why, "\n");
  return r;
}

}  // namespace

int HttpServer::ParseHead(const std::string& head, HttpRequest* request) {
  const size_t eol = head.find("\r\n");
  if (eol == std::string::npos) return 400;
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(head).substr(0, eol), ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[1][0] != '/' ||
      !absl::StartsWith(parts[2], "HTTP/1.")) {
    return 400;
  }
  for (char c : parts[0]) {
    if (c < 'A' || c > 'Z') return 400;
  }
  for (char c : parts[1]) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return 400;
  }
  // Header lines: "Name: value"; their values are not used.
  for (absl::string_view line : absl::StrSplit(absl::string_view(head).substr(eol + 2), "\r\n")) {
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0) return 400;
  }
  request->method = std::string(parts[0]);
  const size_t q = parts[1].find('?');
  request->path = std::string(parts[1].substr(0, q));
  request->query = q == absl::string_view::npos ? "" : std::string(parts[1].substr(q + 1));
  return 0;
}

class HttpServer::Impl {
 public:
  Impl(int fd, std::map<std::string, Handler> routes, Options options)
      : fd_(fd), routes_(std::move(routes)), options_(options) {
    for (int i = 0; i < std::max(1, options_.threads); ++i) {
      workers_.emplace_back([this] { Work(); });
    }
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~Impl() {
    stop_ = true;
    acceptor_.join();
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    for (int conn : queue_) close(conn);
    close(fd_);
  }

 private:
  void Accept() {
    pthread_setname_np(pthread_self(), kHttpThreadName);
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) continue;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.size() < static_cast<size_t>(std::max(1, options_.queue))) {
          queue_.push_back(conn);
          cv_.notify_one();
          continue;
        }
      }
      // Every thread busy: say so at once rather than make it wait.
      SendAll(options_.clock, conn, Serialize(Error(503, "busy, try again"), false),
              options_.clock->Now() + absl::Milliseconds(100));
      close(conn);
    }
  }

  void Work() {
    pthread_setname_np(pthread_self(), kHttpThreadName);
    while (true) {
      int conn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(100),
                     [this] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        if (queue_.empty()) continue;
        conn = queue_.front();
        queue_.pop_front();
      }
      Answer(conn);
      close(conn);
    }
  }

  void Answer(int conn) {
    const absl::Time read_deadline = options_.clock->Now() + options_.read_timeout;
    std::string head;
    char buf[2048];
    int error = 0;
    while (head.find("\r\n\r\n") == std::string::npos) {
      if (head.size() > kMaxHead) {
        error = 431;
        break;
      }
      const ssize_t n = recv(conn, buf, sizeof(buf), 0);
      if (n > 0) {
        head.append(buf, n);
        continue;
      }
      if (n == 0) return;  // closed before a full head: nobody to answer
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
      const int ms = RemainingMs(options_.clock, read_deadline);
      if (ms == 0 || stop_) {
        error = 408;
        break;
      }
      pollfd p{conn, POLLIN, 0};
      poll(&p, 1, std::min(ms, 100));
    }
    HttpRequest request;
    if (error == 0) error = ParseHead(head, &request);
    HttpResponse response;
    if (error != 0) {
      response = Error(error, error == 408   ? "request head not received in time"
                              : error == 431 ? "request head over 8 KiB"
                                             : "malformed request");
    } else {
      auto it = routes_.find(request.path);
      if (it == routes_.end()) {
        response = Error(404, absl::StrCat("no ", request.path));
      } else if (request.method != "GET" && request.method != "HEAD") {
        response = Error(405, "GET or HEAD only");
        response.headers.push_back("Allow: GET, HEAD");
      } else {
        response = it->second(request);
      }
    }
    SendAll(options_.clock, conn, Serialize(response, request.method == "HEAD"),
            options_.clock->Now() + options_.write_timeout);
  }

  const int fd_;
  const std::map<std::string, Handler> routes_;
  const Options options_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  std::vector<std::thread> workers_;
  std::thread acceptor_;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                              const std::string& flag,
                                                              std::map<std::string, Handler> routes,
                                                              Options options) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  in_addr host{};
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535 ||
      inet_pton(AF_INET, listen.substr(0, colon).c_str(), &host) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " must be IPV4:PORT (port 0 = any free port), got '", listen, "'"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr = host;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error = strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve --", flag, " on ", listen, ": ", error));
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->port_ = ntohs(addr.sin_port);
  s->address_ = absl::StrCat(listen.substr(0, colon), ":", s->port_);
  s->impl_ = std::make_unique<Impl>(fd, std::move(routes), options);
  return s;
}

HttpServer::~HttpServer() = default;

}  // namespace shoal
