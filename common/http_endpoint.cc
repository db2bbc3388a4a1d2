#include "common/http_endpoint.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <sys/socket.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "common/auth.h"
#include "common/tls.h"

namespace shoal {
namespace {

constexpr char kCookie[] = "shoal_token";

// The answering threads. httplib hands each accepted connection to
// enqueue(); past `queue` waiting ones, the listener's own thread answers
// it (bounded by the timeouts), which stops accepting meanwhile: the
// connections wait in the kernel's backlog instead of piling up here.
class AnsweringPool : public httplib::TaskQueue {
 public:
  AnsweringPool(int threads, size_t queue) : queue_(std::max<size_t>(1, queue)) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Work(); });
  }
  ~AnsweringPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (jobs_.size() < queue_) {
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void Work() {
    pthread_setname_np(pthread_self(), kHttpThreadName);
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        // Connections accepted before the stop are still answered.
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const size_t queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// The certificate chain (leaf first) and key of the HTTPS endpoint, parsed
// and matched once at start so that a bad pair is refused with a reason.
struct TlsMaterial {
  std::vector<X509*> chain;
  EVP_PKEY* key = nullptr;
  TlsMaterial() = default;
  TlsMaterial(const TlsMaterial&) = delete;
  TlsMaterial& operator=(const TlsMaterial&) = delete;
  ~TlsMaterial() {
    for (X509* c : chain) X509_free(c);
    if (key != nullptr) EVP_PKEY_free(key);
  }
  // Sets up `ctx` (the library's context, made when the server is built).
  bool Apply(SSL_CTX& ctx) const {
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate(&ctx, chain[0]) != 1) return false;
    for (size_t i = 1; i < chain.size(); ++i) {
      X509_up_ref(chain[i]);  // the context takes this reference
      if (SSL_CTX_add_extra_chain_cert(&ctx, chain[i]) != 1) {
        X509_free(chain[i]);
        return false;
      }
    }
    return SSL_CTX_use_PrivateKey(&ctx, key) == 1 && SSL_CTX_check_private_key(&ctx) == 1;
  }
};

absl::StatusOr<std::unique_ptr<TlsMaterial>> LoadTlsMaterial(const std::string& cert_pem,
                                                             const std::string& key_pem,
                                                             const std::string& flag) {
  const auto fail = [&flag](absl::string_view what) {
    ERR_clear_error();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot serve --", flag, " over TLS: ", what));
  };
  auto m = std::make_unique<TlsMaterial>();
  BIO* certs = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  while (X509* c = PEM_read_bio_X509(certs, nullptr, nullptr, nullptr)) m->chain.push_back(c);
  BIO_free(certs);
  if (m->chain.empty()) return fail("the certificate does not parse");
  BIO* keys = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  m->key = PEM_read_bio_PrivateKey(keys, nullptr, nullptr, nullptr);
  BIO_free(keys);
  if (m->key == nullptr || X509_check_private_key(m->chain[0], m->key) != 1) {
    return fail("the key does not parse or does not match the certificate");
  }
  ERR_clear_error();
  return m;
}

bool SameToken(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && !a.empty() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

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

const char* Reason(int code) {
  switch (code) {
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    default:
      return "Error";
  }
}

HttpResponse Error(int code, absl::string_view why) {
  HttpResponse r;
  r.code = code;
  r.body = absl::StrCat(code, " ", Reason(code), ": ", why, "\n");
  return r;
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

// 401: the login form for a browser asking for a page, a line for others.
HttpResponse Unauthorized(const HttpRequest& request) {
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
HttpResponse Login(const httplib::Request& raw, const std::string& token, bool tls) {
  const std::string given = raw.get_param_value("token");
  if (!SameToken(given, token)) {
    return LoginPage(401, given.empty() ? "Sign in with the run's token."
                                        : "That is not the run's token. Try again.");
  }
  HttpResponse r;
  r.code = 303;
  r.body = "signed in\n";
  r.headers.push_back("Location: /");
  r.headers.push_back("Cache-Control: no-store");
  r.headers.push_back(absl::StrCat("Set-Cookie: ", kCookie, "=", token,
                                   "; Path=/; HttpOnly; SameSite=Strict", tls ? "; Secure" : ""));
  return r;
}

HttpRequest FromLibrary(const httplib::Request& raw) {
  HttpRequest r;
  r.method = raw.method;
  r.path = raw.path;
  if (const size_t q = raw.target.find('?'); q != std::string::npos) {
    r.query = raw.target.substr(q + 1);
  }
  for (const auto& [name, value] : raw.headers) r.headers[absl::AsciiStrToLower(name)] = value;
  return r;
}

void ToLibrary(const HttpResponse& r, httplib::Response* out) {
  out->status = r.code;
  for (const std::string& line : r.headers) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    out->set_header(line.substr(0, colon),
                    std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  out->set_content(r.body, r.content_type);
}

}  // namespace

class HttpEndpoint::Impl {
 public:
  Impl(std::unique_ptr<httplib::Server> server, std::map<std::string, Handler> routes,
       std::string token, bool tls)
      : server_(std::move(server)),
        routes_(std::move(routes)),
        token_(std::move(token)),
        tls_(tls) {
    // Shoal's rules before the library routes: the method, then the token.
    server_->set_pre_routing_handler([this](const httplib::Request& raw, httplib::Response& out) {
      return Gate(raw, &out) ? httplib::Server::HandlerResponse::Unhandled
                             : httplib::Server::HandlerResponse::Handled;
    });
    // Every path through one handler: routes are exact paths, not patterns.
    server_->Get(".*", [this](const httplib::Request& raw, httplib::Response& out) {
      const HttpRequest request = FromLibrary(raw);
      auto it = routes_.find(request.path);
      ToLibrary(it == routes_.end() ? Error(404, "no such page") : it->second(request), &out);
    });
  }

  void Serve() {
    listener_ = std::thread([this] {
      pthread_setname_np(pthread_self(), kHttpThreadName);
      server_->listen_after_bind();
      stopped_.Notify();
    });
  }

  ~Impl() {
    // The library's stop() does nothing until its listener runs (a server
    // destroyed right after Start would listen forever), and must be called
    // once (a second call asserts): wait for the listener to run, then stop.
    while (!stopped_.HasBeenNotified()) {
      if (server_->is_running()) {
        server_->stop();
        break;
      }
      stopped_.WaitForNotificationWithTimeout(absl::Milliseconds(1));
    }
    listener_.join();
  }

 private:
  // False when the request was answered here (refused, or /login).
  bool Gate(const httplib::Request& raw, httplib::Response* out) const {
    if (raw.method != "GET" && raw.method != "HEAD") {
      HttpResponse r = Error(405, "GET or HEAD only");
      r.headers.push_back("Allow: GET, HEAD");
      ToLibrary(r, out);
      return false;
    }
    if (token_.empty()) return true;
    if (raw.path == "/login") {
      ToLibrary(Login(raw, token_, tls_), out);
      return false;
    }
    const HttpRequest request = FromLibrary(raw);
    if (SameToken(TokenOf(request), token_)) return true;
    ToLibrary(Unauthorized(request), out);
    return false;
  }

  const std::unique_ptr<httplib::Server> server_;
  const std::map<std::string, Handler> routes_;
  const std::string token_;
  const bool tls_;
  absl::Notification stopped_;
  std::thread listener_;
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& listen, const std::string& flag, std::map<std::string, Handler> routes,
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
  const std::string cert = options.tls_cert_pem.value_or(ProcessTls().cert_pem);
  std::unique_ptr<httplib::Server> server;
  if (cert.empty()) {
    server = std::make_unique<httplib::Server>();
  } else {
    absl::StatusOr<std::unique_ptr<TlsMaterial>> tls =
        LoadTlsMaterial(cert, options.tls_key_pem.value_or(ProcessTls().key_pem), flag);
    if (!tls.ok()) return tls.status();
    std::shared_ptr<TlsMaterial> material = std::move(*tls);
    server = std::make_unique<httplib::SSLServer>(
        [material](SSL_CTX& ctx) { return material->Apply(ctx); });
    if (!server->is_valid()) {
      ERR_clear_error();
      return absl::FailedPreconditionError(
          absl::StrCat("cannot serve --", flag, " over TLS: the library refused the certificate"));
    }
  }
  const auto seconds = [](absl::Duration d) {
    return std::chrono::microseconds(std::max<int64_t>(1000, absl::ToInt64Microseconds(d)));
  };
  server->set_read_timeout(seconds(options.read_timeout));
  server->set_write_timeout(seconds(options.write_timeout));
  // One request per connection: a kept-alive idle connection would hold an
  // answering thread. The wait for the request counts as a read.
  server->set_keep_alive_max_count(1);
  server->set_keep_alive_timeout(std::max<time_t>(
      1, absl::ToInt64Seconds(absl::Ceil(options.read_timeout, absl::Seconds(1)))));
  // SO_REUSEADDR only: the library's default also sets SO_REUSEPORT, with
  // which a second process could bind the same port and take half the
  // connections instead of failing to start.
  server->set_socket_options([](socket_t sock) {
    const int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  // GET and HEAD carry no body worth reading.
  server->set_payload_max_length(8192);
  const int threads = options.threads;
  const size_t queue = static_cast<size_t>(std::max(1, options.queue));
  server->new_task_queue = [threads, queue] { return new AnsweringPool(threads, queue); };
  const std::string bind_host = listen.substr(0, colon);
  int bound = port;
  if (port == 0) {
    bound = server->bind_to_any_port(bind_host);
  } else if (!server->bind_to_port(bind_host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve --", flag, " on ", listen,
                                               ": the address cannot be bound (in use?)"));
  }
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint());
  e->port_ = bound;
  e->address_ = absl::StrCat(bind_host, ":", bound);
  e->tls_ = !cert.empty();
  e->impl_ = std::make_unique<Impl>(std::move(server), std::move(routes),
                                    options.token.value_or(ProcessToken()), e->tls_);
  e->impl_->Serve();
  return e;
}

HttpEndpoint::~HttpEndpoint() = default;

}  // namespace shoal
