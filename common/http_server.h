// A small embedded HTTP/1.1 server for the process's own endpoints: GET
// /metrics on every server (metrics.h) and the coordinator's web page
// (services/coordinator/web_page.h). Not a general web server: GET and HEAD
// only, no request bodies, one request per connection (Connection: close).
//
// It runs on its own threads (one accepts, a few answer), so a slow or
// stalled client never holds a gRPC thread or a lock of the caller; each
// connection has one deadline for reading its request head and one for
// writing the answer (a client that sends a byte a second is cut at the
// first, one that never reads at the second). When every answering thread
// is busy and the queue is full, a new connection gets 503 at once.
// A malformed request gets 400; the server keeps serving.
//
// Security follows the process's gRPC servers (common/tls.h, common/auth.h):
// with a certificate (--tls_cert/--tls_key) it speaks HTTPS only, and with a
// token (--token_file) every request must carry it, as
// `Authorization: Bearer TOKEN` (Prometheus' `authorization` scrape setting,
// curl -H) or as the cookie a browser gets from the login form: a request
// without it gets 401, with the form when a browser asks for a page.
// GET /login?token=... checks a token and sets the cookie.
//
// Thread-safe: handlers run on the answering threads, concurrently.
#ifndef SHOAL_COMMON_HTTP_SERVER_H_
#define SHOAL_COMMON_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace shoal {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD"
  std::string path;    // without the query
  std::string query;   // after '?', undecoded; empty when none
  // Header values by lower-case name (the last of a repeated name).
  std::map<std::string, std::string> headers;
};

struct HttpResponse {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // Extra header lines, each "Name: value" (no CRLF).
  std::vector<std::string> headers;
};

// The name of the server's threads (/proc/PID/task/TID/comm): the bench
// sums their CPU to tell what the pages and scrapes cost.
inline constexpr char kHttpThreadName[] = "shoal-http";

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  struct Options {
    // Whole request head must arrive within this, and the answer must be
    // taken within write_timeout.
    absl::Duration read_timeout = absl::Seconds(5);
    absl::Duration write_timeout = absl::Seconds(10);
    // Answering threads and accepted connections waiting for one.
    int threads = 2;
    int queue = 64;
    // Reads the deadlines above (sockets wait in real time: a fake clock
    // only moves what the server decides from it).
    const Clock* clock = RealClock::Get();
    // HTTPS with this PEM certificate chain and key; unset = the process's
    // (ProcessTls(): plain HTTP when it has no certificate).
    std::optional<std::string> tls_cert_pem;
    std::optional<std::string> tls_key_pem;
    // The token every request must carry; unset = the process's
    // (ProcessToken(): none when empty).
    std::optional<std::string> token;
  };

  // Serves `routes` (exact paths) at `listen` ("IPV4:PORT", port 0 = any
  // free port). `flag` names the flag in error messages. INVALID_ARGUMENT
  // for a malformed address, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           const std::string& flag,
                                                           std::map<std::string, Handler> routes,
                                                           Options options);
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           const std::string& flag,
                                                           std::map<std::string, Handler> routes) {
    return Start(listen, flag, std::move(routes), Options());
  }
  // Stops accepting, finishes (or cuts at their deadlines) the connections
  // being answered.
  ~HttpServer();

  int port() const { return port_; }
  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }
  // "https" or "http".
  const char* scheme() const;

  // Parses a request head (request line and headers, up to the blank line);
  // the 4xx code and the request. Exposed for tests.
  static int ParseHead(const std::string& head, HttpRequest* request);

 private:
  class Impl;
  HttpServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  bool tls_ = false;
  std::string address_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_HTTP_SERVER_H_
