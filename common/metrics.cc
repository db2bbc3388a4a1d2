#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace shoal {
namespace {

// The process's registry (see the header). Never destroyed: handles may be
// used by threads that outlive main's locals.
const std::shared_ptr<prometheus::Registry>& SharedRegistry() {
  static auto* registry = new std::shared_ptr<prometheus::Registry>(
      std::make_shared<prometheus::Registry>(prometheus::Registry::InsertBehavior::Merge));
  return *registry;
}

prometheus::Registry& ProcessRegistry() { return *SharedRegistry(); }

}  // namespace

// Why not prometheus-cpp's pull Exposer: Debian builds its civetweb with a
// 100 KiB thread stack (USE_STACK_SIZE=102400), and glibc puts the static TLS
// of every loaded library on each thread's stack. The worker's (OpenBLAS
// 60 KiB, glog 30 KiB, LibTorch 10 KiB) leaves no room, so civetweb's
// pthread_create fails with EINVAL in shoal-worker. One thread that answers
// one scrape at a time is all /metrics needs; the registry and the text
// format are prometheus-cpp's.
class Metrics::HttpServer {
 public:
  HttpServer(int fd) : fd_(fd), thread_([this] { Serve(); }) {}
  ~HttpServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      Answer(conn);
      close(conn);
    }
  }

  // Reads the request head (at most 8 KiB, 2 s) and answers GET /metrics.
  static void Answer(int conn) {
    timeval tv{2, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    std::string head;
    char buf[2048];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 8192) {
      const ssize_t n = recv(conn, buf, sizeof(buf), 0);
      if (n <= 0) return;
      head.append(buf, n);
    }
    absl::string_view line(head.data(), head.find("\r\n"));
    std::string status = "404 Not Found", type = "text/plain", body = "not found\n";
    if (absl::ConsumePrefix(&line, "GET ")) {
      absl::string_view path = line.substr(0, line.find(' '));
      path = path.substr(0, path.find('?'));
      if (path == "/metrics") {
        status = "200 OK";
        type = "text/plain; version=0.0.4; charset=utf-8";
        body = Metrics::Render();
      }
    } else {
      status = "405 Method Not Allowed";
      body = "GET only\n";
    }
    const std::string out =
        absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                     "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
    size_t sent = 0;
    while (sent < out.size()) {
      const ssize_t n = send(conn, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += n;
    }
  }

  const int fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void MetricCounter::Add(double v) const {
  if (c_ != nullptr) c_->Increment(v);
}
void MetricGauge::Set(double v) const {
  if (g_ != nullptr) g_->Set(v);
}
void MetricGauge::Add(double v) const {
  if (g_ != nullptr) g_->Increment(v);
}
void MetricHistogram::Observe(double v) const {
  if (h_ != nullptr) h_->Observe(v);
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  in_addr host{};
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535 ||
      inet_pton(AF_INET, listen.substr(0, colon).c_str(), &host) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen must be IPV4:PORT (port 0 = any free port), got '", listen, "'"));
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
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", error));
  }
  std::unique_ptr<Metrics> m(new Metrics());
  m->port_ = ntohs(addr.sin_port);
  m->address_ = absl::StrCat(listen.substr(0, colon), ":", m->port_);
  m->server_ = std::make_unique<HttpServer>(fd);
  return m;
}

Metrics::~Metrics() = default;

MetricCounter Metrics::Counter(absl::string_view name, absl::string_view help,
                               const MetricLabels& labels) {
  auto& family = prometheus::BuildCounter()
                     .Name(std::string(name))
                     .Help(std::string(help))
                     .Register(ProcessRegistry());
  return MetricCounter(&family.Add(labels));
}

MetricGauge Metrics::Gauge(absl::string_view name, absl::string_view help,
                           const MetricLabels& labels) {
  auto& family = prometheus::BuildGauge()
                     .Name(std::string(name))
                     .Help(std::string(help))
                     .Register(ProcessRegistry());
  return MetricGauge(&family.Add(labels));
}

MetricHistogram Metrics::Histogram(absl::string_view name, absl::string_view help,
                                   const std::vector<double>& buckets, const MetricLabels& labels) {
  auto& family = prometheus::BuildHistogram()
                     .Name(std::string(name))
                     .Help(std::string(help))
                     .Register(ProcessRegistry());
  return MetricHistogram(&family.Add(labels, prometheus::Histogram::BucketBoundaries(buckets)));
}

std::vector<double> Metrics::SecondsBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

std::vector<double> Metrics::BytesBuckets() {
  std::vector<double> b;
  for (double v = 1024; v <= 4.0 * 1024 * 1024 * 1024; v *= 4) b.push_back(v);
  return b;
}

std::string Metrics::Render() {
  return prometheus::TextSerializer().Serialize(ProcessRegistry().Collect());
}

}  // namespace shoal
