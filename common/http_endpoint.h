// The process's HTTP endpoint: GET /metrics on every server (metrics.h) and
// the coordinator's web page, /api/*, /login (services/coordinator/
// web_page.h), served by cpp-httplib, Debian's libcpp-httplib-dev (built
// with OpenSSL): the request parsing, keep-alive, timeouts and the TLS
// handshake are the library's; this file holds only Shoal's rules on top.
// Why that library and not civetweb: docs/SECURITY.md "The HTTP endpoint".
//
// It runs on its own threads (the library's listener and a pool of
// answering threads named kHttpThreadName), so a slow or stalled client
// never holds a gRPC thread or a lock of the caller. A client that sends
// nothing for read_timeout is cut; a connection carries one request (the
// answer closes it), so an idle browser connection holds no thread. When
// every answering thread is busy and `queue` connections wait, the
// listener answers the next one itself, and new connections wait in the
// kernel's backlog meanwhile. GET and HEAD only (405 otherwise); a request
// the library cannot parse gets 400; the server keeps serving.
//
// Security follows the process's gRPC servers (common/tls.h, common/auth.h):
// with a certificate (--tls_cert/--tls_key) it speaks HTTPS only, and with a
// token (--token_file) every request must carry it, as
// `Authorization: Bearer TOKEN` (Prometheus' `authorization` scrape setting,
// curl -H) or as the cookie a browser gets from the login form: a request
// without it gets 401, with the form when a browser asks for a page.
// GET /login?token=... checks a token and sets the cookie
// (`HttpOnly; SameSite=Strict`, and `Secure` over HTTPS).
//
// Thread-safe: handlers run on the answering threads, concurrently.
#ifndef SHOAL_COMMON_HTTP_ENDPOINT_H_
#define SHOAL_COMMON_HTTP_ENDPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

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

// The name of the answering threads (/proc/PID/task/TID/comm): the bench
// sums their CPU to tell what the pages and scrapes cost.
inline constexpr char kHttpThreadName[] = "shoal-http";

class HttpEndpoint {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  struct Options {
    // A client that sends nothing (no request, or a stalled part of one)
    // for this long is cut; an answer it does not take within
    // write_timeout too.
    absl::Duration read_timeout = absl::Seconds(5);
    absl::Duration write_timeout = absl::Seconds(10);
    // Answering threads, and accepted connections waiting for one.
    int threads = 4;
    int queue = 64;
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
  // for a malformed address, FAILED_PRECONDITION for a certificate or key
  // that cannot be used, UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& listen,
                                                             const std::string& flag,
                                                             std::map<std::string, Handler> routes,
                                                             Options options);
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& listen, const std::string& flag, std::map<std::string, Handler> routes) {
    return Start(listen, flag, std::move(routes), Options());
  }
  // Stops accepting, finishes (or cuts at their timeouts) the connections
  // being answered.
  ~HttpEndpoint();

  int port() const { return port_; }
  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }
  // "https" or "http".
  const char* scheme() const { return tls_ ? "https" : "http"; }

 private:
  class Impl;
  HttpEndpoint() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  bool tls_ = false;
  std::string address_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_HTTP_ENDPOINT_H_
