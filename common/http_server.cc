#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
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

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "common/tls.h"

namespace shoal {
namespace {

constexpr size_t kMaxHead = 8192;

const char* Reason(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 303:
      return "See Other";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
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

// One accepted connection, plain or TLS; the socket is non-blocking either
// way, and each call says which readiness to wait for when it would block.
class Conn {
 public:
  Conn(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ~Conn() {
    if (ssl_ != nullptr) {
      SSL_shutdown(ssl_);  // best effort: one close_notify, no wait
      SSL_free(ssl_);
    }
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool tls() const { return ssl_ != nullptr; }

  // > 0: bytes; 0: closed; -1: would block (wait for *events); -2: failed.
  ssize_t Recv(char* buf, size_t n, short* events) {
    if (ssl_ == nullptr) {
      const ssize_t r = recv(fd_, buf, n, 0);
      if (r >= 0) return r;
      *events = POLLIN;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -1 : -2;
    }
    const int r = SSL_read(ssl_, buf, static_cast<int>(n));
    if (r > 0) return r;
    if (SSL_get_error(ssl_, r) == SSL_ERROR_ZERO_RETURN) return 0;
    return TlsWouldBlock(r, events) ? -1 : -2;
  }
  ssize_t Send(const char* buf, size_t n, short* events) {
    if (ssl_ == nullptr) {
      const ssize_t r = send(fd_, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r >= 0) return r;
      *events = POLLOUT;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -1 : -2;
    }
    const int r = SSL_write(ssl_, buf, static_cast<int>(n));
    if (r > 0) return r;
    return TlsWouldBlock(r, events) ? -1 : -2;
  }
  // The TLS handshake by `deadline`; false when it failed or ran out.
  bool Handshake(const Clock* clock, absl::Time deadline, const std::atomic<bool>& stop) {
    if (ssl_ == nullptr) return true;
    while (true) {
      const int r = SSL_accept(ssl_);
      if (r == 1) return true;
      short events = 0;
      if (!TlsWouldBlock(r, &events)) return false;
      if (!Wait(clock, deadline, events, stop)) return false;
    }
  }
  // Waits (at most 100 ms at a time) for `events`; false once `deadline`
  // passed or the server stops.
  bool Wait(const Clock* clock, absl::Time deadline, short events, const std::atomic<bool>& stop) {
    const int ms = RemainingMs(clock, deadline);
    if (ms == 0 || stop) return false;
    pollfd p{fd_, events, 0};
    return poll(&p, 1, std::min(ms, 100)) >= 0 || errno == EINTR;
  }

 private:
  bool TlsWouldBlock(int r, short* events) {
    switch (SSL_get_error(ssl_, r)) {
      case SSL_ERROR_WANT_READ:
        *events = POLLIN;
        return true;
      case SSL_ERROR_WANT_WRITE:
        *events = POLLOUT;
        return true;
      default:
        ERR_clear_error();
        return false;
    }
  }

  const int fd_;
  SSL* const ssl_;
};

// Sends all of `data` by `deadline`; false when the client did not take it.
bool SendAll(const Clock* clock, Conn* conn, const std::string& data, absl::Time deadline) {
  static const std::atomic<bool> kNoStop{false};
  size_t sent = 0;
  while (sent < data.size()) {
    short events = POLLOUT;
    const ssize_t n = conn->Send(data.data() + sent, data.size() - sent, &events);
    if (n > 0) {
      sent += n;
      continue;
    }
    if (n != -1) return false;
    if (!conn->Wait(clock, deadline, events, kNoStop)) return false;
  }
  return true;
}

// %XX and '+' decoded (a form's query value).
std::string UrlDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    int v = 0;
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && absl::SimpleHexAtoi(s.substr(i + 1, 2), &v)) {
      out += static_cast<char>(v);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The value of `name` in a query string ("a=1&token=x"), decoded.
std::string QueryValue(absl::string_view query, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(query, '&')) {
    const size_t eq = pair.find('=');
    if (eq != absl::string_view::npos && pair.substr(0, eq) == name) {
      return UrlDecode(pair.substr(eq + 1));
    }
  }
  return "";
}

bool SameToken(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && !a.empty() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

constexpr char kCookie[] = "shoal_token";

// The token a request carries: its Bearer header, else its cookie.
std::string TokenOf(const HttpRequest& r) {
  if (auto it = r.headers.find("authorization"); it != r.headers.end()) {
    absl::string_view v = it->second;
    if (absl::ConsumePrefix(&v, "Bearer ")) return std::string(absl::StripAsciiWhitespace(v));
  }
  if (auto it = r.headers.find("cookie"); it != r.headers.end()) {
    for (absl::string_view c : absl::StrSplit(it->second, ';')) {
      c = absl::StripAsciiWhitespace(c);
      if (absl::ConsumePrefix(&c, kCookie) && absl::ConsumePrefix(&c, "=")) return std::string(c);
    }
  }
  return "";
}

HttpResponse LoginPage(int code, absl::string_view message) {
  HttpResponse r;
  r.code = code;
  r.content_type = "text/html; charset=utf-8";
  r.headers.push_back("WWW-Authenticate: Bearer realm=\"shoal\"");
  r.headers.push_back("Cache-Control: no-store");
  r.body = absl::StrCat(
      "<!doctype html><html><head><meta charset=\"utf-8\"><title>Shoal: token</title></head>"
      "<body style=\"font-family:sans-serif;max-width:32em;margin:4em auto\">"
      "<h1>This run needs its token</h1><p id=\"why\">",
      message,
      "</p><form method=\"get\" action=\"/login\"><input type=\"password\" name=\"token\" "
      "id=\"token\" autofocus size=\"40\" placeholder=\"the run's token (--token_file)\"> "
      "<button type=\"submit\" id=\"sign-in\">Sign in</button></form>"
      "<p>Programs send <code>Authorization: Bearer TOKEN</code> instead.</p></body></html>\n");
  return r;
}

// A TLS server context with `cert_pem` (a chain: the leaf first) and
// `key_pem`; nullptr for plain HTTP when there is no certificate.
absl::StatusOr<SSL_CTX*> ServerContext(const std::string& cert_pem, const std::string& key_pem,
                                       const std::string& flag) {
  if (cert_pem.empty()) return nullptr;
  const auto fail = [&flag](absl::string_view what) {
    ERR_clear_error();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot serve --", flag, " over TLS: ", what));
  };
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return fail("SSL_CTX_new failed");
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  BIO* certs = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* leaf = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr);
  bool ok = leaf != nullptr && SSL_CTX_use_certificate(ctx, leaf) == 1;
  if (leaf != nullptr) X509_free(leaf);
  while (ok) {
    X509* extra = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr);
    if (extra == nullptr) break;
    ok = SSL_CTX_add_extra_chain_cert(ctx, extra) == 1;  // takes ownership
  }
  BIO_free(certs);
  if (!ok) {
    SSL_CTX_free(ctx);
    return fail("the certificate does not parse");
  }
  BIO* keys = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(keys, nullptr, nullptr, nullptr);
  BIO_free(keys);
  ok = key != nullptr && SSL_CTX_use_PrivateKey(ctx, key) == 1 &&
       SSL_CTX_check_private_key(ctx) == 1;
  if (key != nullptr) EVP_PKEY_free(key);
  if (!ok) {
    SSL_CTX_free(ctx);
    return fail("the key does not parse or does not match the certificate");
  }
  ERR_clear_error();
  return ctx;
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
  // Header lines: "Name: value".
  std::map<std::string, std::string> headers;
  for (absl::string_view line : absl::StrSplit(absl::string_view(head).substr(eol + 2), "\r\n")) {
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0) return 400;
    headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  request->headers = std::move(headers);
  request->method = std::string(parts[0]);
  const size_t q = parts[1].find('?');
  request->path = std::string(parts[1].substr(0, q));
  request->query = q == absl::string_view::npos ? "" : std::string(parts[1].substr(q + 1));
  return 0;
}

class HttpServer::Impl {
 public:
  Impl(int fd, std::map<std::string, Handler> routes, Options options, SSL_CTX* ctx,
       std::string token)
      : fd_(fd),
        routes_(std::move(routes)),
        options_(options),
        ctx_(ctx),
        token_(std::move(token)) {
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
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
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
      // Every thread busy: say so at once rather than make it wait (a TLS
      // client cannot read a plain answer: it sees the connection close).
      if (ctx_ == nullptr) {
        Conn plain(conn, nullptr);
        SendAll(options_.clock, &plain, Serialize(Error(503, "busy, try again"), false),
                options_.clock->Now() + absl::Milliseconds(100));
      }
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

  void Answer(int fd) {
    const absl::Time read_deadline = options_.clock->Now() + options_.read_timeout;
    SSL* ssl = nullptr;
    if (ctx_ != nullptr) {
      ssl = SSL_new(ctx_);
      if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
        if (ssl != nullptr) SSL_free(ssl);
        return;
      }
    }
    Conn conn(fd, ssl);
    // A client that does not finish the handshake in time is cut, as one
    // that does not send its request head.
    if (!conn.Handshake(options_.clock, read_deadline, stop_)) return;
    std::string head;
    char buf[2048];
    int error = 0;
    while (head.find("\r\n\r\n") == std::string::npos) {
      if (head.size() > kMaxHead) {
        error = 431;
        break;
      }
      short events = POLLIN;
      const ssize_t n = conn.Recv(buf, sizeof(buf), &events);
      if (n > 0) {
        head.append(buf, n);
        continue;
      }
      if (n != -1) return;  // closed before a full head: nobody to answer
      if (!conn.Wait(options_.clock, read_deadline, events, stop_)) {
        error = 408;
        break;
      }
    }
    HttpRequest request;
    if (error == 0) error = ParseHead(head, &request);
    HttpResponse response;
    if (error != 0) {
      response = Error(error, error == 408   ? "request head not received in time"
                              : error == 431 ? "request head over 8 KiB"
                                             : "malformed request");
    } else if (request.method != "GET" && request.method != "HEAD") {
      response = Error(405, "GET or HEAD only");
      response.headers.push_back("Allow: GET, HEAD");
    } else if (!token_.empty() && request.path == "/login") {
      response = Login(request, conn.tls());
    } else if (!token_.empty() && !SameToken(TokenOf(request), token_)) {
      response = Unauthorized(request);
    } else {
      auto it = routes_.find(request.path);
      if (it == routes_.end()) {
        response = Error(404, absl::StrCat("no ", request.path));
      } else {
        response = it->second(request);
      }
    }
    SendAll(options_.clock, &conn, Serialize(response, request.method == "HEAD"),
            options_.clock->Now() + options_.write_timeout);
  }

  // 401: the login form for a browser asking for a page, a line for others.
  static HttpResponse Unauthorized(const HttpRequest& request) {
    const auto accept = request.headers.find("accept");
    if (accept != request.headers.end() && absl::StrContains(accept->second, "text/html")) {
      return LoginPage(401, "Sign in with the run's token to see this page.");
    }
    const bool tried = request.headers.count("authorization") || request.headers.count("cookie");
    HttpResponse r = Error(401, tried ? "this token is not the run's"
                                      : "this server needs the run's token: Authorization: "
                                        "Bearer TOKEN");
    r.headers.push_back("WWW-Authenticate: Bearer realm=\"shoal\"");
    return r;
  }

  // GET /login?token=...: the right token gets the cookie and goes to the page.
  HttpResponse Login(const HttpRequest& request, bool tls) const {
    const std::string given = QueryValue(request.query, "token");
    if (!SameToken(given, token_)) {
      return LoginPage(401, given.empty() ? "Sign in with the run's token."
                                          : "That is not the run's token. Try again.");
    }
    HttpResponse r;
    r.code = 303;
    r.body = "signed in\n";
    r.headers.push_back("Location: /");
    r.headers.push_back("Cache-Control: no-store");
    r.headers.push_back(absl::StrCat("Set-Cookie: ", kCookie, "=", token_,
                                     "; Path=/; HttpOnly; SameSite=Strict", tls ? "; Secure" : ""));
    return r;
  }

  const int fd_;
  const std::map<std::string, Handler> routes_;
  const Options options_;
  SSL_CTX* const ctx_;  // null: plain HTTP
  const std::string token_;
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
  absl::StatusOr<SSL_CTX*> ctx =
      ServerContext(options.tls_cert_pem.value_or(ProcessTls().cert_pem),
                    options.tls_key_pem.value_or(ProcessTls().key_pem), flag);
  if (!ctx.ok()) {
    close(fd);
    return ctx.status();
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->port_ = ntohs(addr.sin_port);
  s->address_ = absl::StrCat(listen.substr(0, colon), ":", s->port_);
  s->tls_ = *ctx != nullptr;
  s->impl_ = std::make_unique<Impl>(fd, std::move(routes), options, *ctx,
                                    options.token.value_or(ProcessToken()));
  return s;
}

HttpServer::~HttpServer() = default;

const char* HttpServer::scheme() const { return tls_ ? "https" : "http"; }

}  // namespace shoal
