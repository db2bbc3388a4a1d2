// The process's HTTP endpoint of /metrics and the coordinator's web page,
// on cpp-httplib: routes, 404/405/4xx, HEAD, HTTPS with the process's
// certificate, the token as a Bearer header or the /login cookie, and that
// a stalled client neither blocks others nor holds a thread past the read
// timeout.
#include "common/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/support/http_get.h"

namespace shoal {
namespace {

using ::shoal::testing::HttpsExchange;

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  return out;
}

// Sends `request` as is and returns the whole answer.
std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out = ReadAll(fd);
  close(fd);
  return out;
}

std::unique_ptr<HttpEndpoint> Serve(HttpEndpoint::Options options = {}) {
  auto s = HttpEndpoint::Start("127.0.0.1:0", "test_listen",
                               {{"/hello",
                                 [](const HttpRequest& r) {
                                   HttpResponse out;
                                   out.body = "hello " + r.query;
                                   return out;
                                 }}},
                               options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(HttpEndpointTest, ServesRoutesAndAnswersErrors) {
  auto s = Serve();
  ASSERT_NE(s, nullptr);
  const std::string ok = Exchange(s->port(), "GET /hello?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("\r\n\r\nhello x=1"), std::string::npos) << ok;
  const std::string head = Exchange(s->port(), "HEAD /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_EQ(head.find("hello"), std::string::npos) << head;
  EXPECT_EQ(Exchange(s->port(), "GET /other HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  const std::string post = Exchange(s->port(), "POST /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD"), std::string::npos) << post;
  const std::string with_body =
      Exchange(s->port(), "PUT /hello HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(with_body.rfind("HTTP/1.1 405", 0), 0u) << with_body;
  // What the library cannot parse is refused (400) or dropped, never served.
  for (const std::string& bad : std::vector<std::string>{
           "garbage\r\n\r\n", "GET\r\n\r\n", "GET / SPDY\r\n\r\n", "get / HTTP/1.1\r\n\r\n",
           std::string("GET /a\x01 HTTP/1.1\r\n\r\n"),
           "GET /hello HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n"}) {
    const std::string answer = Exchange(s->port(), bad);
    EXPECT_TRUE(answer.empty() || answer.rfind("HTTP/1.1 4", 0) == 0) << bad << " -> " << answer;
  }
  // Still serving after all that.
  EXPECT_EQ(Exchange(s->port(), "GET /hello HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
}

TEST(HttpEndpointTest, AStalledClientIsCutAndDoesNotBlockOthers) {
  // States, not durations: the other client is answered while the stalled
  // one is still connected (not cut yet), and the stalled one is then cut
  // with no page. The read timeout only has to outlast one loopback
  // exchange.
  HttpEndpoint::Options options;
  options.read_timeout = absl::Seconds(3);
  options.threads = 2;
  auto s = Serve(options);
  ASSERT_NE(s, nullptr);
  // Sends half a request head and then nothing.
  const int stalled = Connect(s->port());
  ASSERT_GE(stalled, 0);
  timeval hang_guard{60, 0};
  setsockopt(stalled, SOL_SOCKET, SO_RCVTIMEO, &hang_guard, sizeof(hang_guard));
  send(stalled, "GET /hel", 8, MSG_NOSIGNAL);
  EXPECT_EQ(Exchange(s->port(), "GET /hello HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  char byte;
  const ssize_t early = recv(stalled, &byte, 1, MSG_DONTWAIT);
  const int early_errno = errno;
  EXPECT_TRUE(early < 0 && (early_errno == EAGAIN || early_errno == EWOULDBLOCK))
      << "the stalled client was answered or cut before the other was served";
  const std::string cut = ReadAll(stalled);
  close(stalled);
  EXPECT_EQ(cut.find("HTTP/1.1 200"), std::string::npos) << cut;
}

TEST(HttpEndpointTest, RejectsMalformedAddresses) {
  for (const char* bad : {"", "127.0.0.1", "localhost:80", "127.0.0.1:99999", ":80"}) {
    auto s = HttpEndpoint::Start(bad, "http_listen", {});
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("--http_listen"), std::string::npos);
  }
}

// A self-signed certificate and its key, made in memory (PEM).
struct SelfSigned {
  std::string cert_pem, key_pem;
};

SelfSigned MakeSelfSigned() {
  SelfSigned out;
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  BIO* b = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(b, cert);
  char* data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  out.cert_pem.assign(data, n);
  BIO_free(b);
  b = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr);
  n = BIO_get_mem_data(b, &data);
  out.key_pem.assign(data, n);
  BIO_free(b);
  X509_free(cert);
  EVP_PKEY_free(key);
  return out;
}

TEST(HttpEndpointTest, ServesHttpsWithItsCertificate) {
  const SelfSigned pki = MakeSelfSigned();
  HttpEndpoint::Options options;
  options.tls_cert_pem = pki.cert_pem;
  options.tls_key_pem = pki.key_pem;
  auto s = Serve(options);
  ASSERT_NE(s, nullptr);
  EXPECT_STREQ(s->scheme(), "https");
  const std::string ok = HttpsExchange(s->port(), pki.cert_pem, "GET /hello?x=2 HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("hello x=2"), std::string::npos) << ok;
  // Plain text gets no HTTP answer from a TLS port.
  const std::string plain = Exchange(s->port(), "GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(plain.find("HTTP/1.1 200"), std::string::npos) << plain;
  // A client trusting another CA refuses the server.
  EXPECT_EQ(HttpsExchange(s->port(), MakeSelfSigned().cert_pem, "GET /hello HTTP/1.1\r\n\r\n"), "");
  // Still serving.
  EXPECT_EQ(HttpsExchange(s->port(), pki.cert_pem, "GET /hello HTTP/1.1\r\n\r\n")
                .rfind("HTTP/1.1 200", 0),
            0u);
  EXPECT_STREQ(Serve()->scheme(), "http");
  // A key that is not the certificate's: refused at start.
  options.tls_key_pem = MakeSelfSigned().key_pem;
  auto bad = HttpEndpoint::Start("127.0.0.1:0", "metrics_listen", {}, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("--metrics_listen over TLS"), std::string::npos);
}

TEST(HttpEndpointTest, RequiresTheTokenAsBearerOrLoginCookie) {
  const std::string token = "0123456789abcdef-token";
  HttpEndpoint::Options options;
  options.token = token;
  auto s = Serve(options);
  ASSERT_NE(s, nullptr);
  const std::string none = Exchange(s->port(), "GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_EQ(none.rfind("HTTP/1.1 401", 0), 0u) << none;
  EXPECT_NE(none.find("WWW-Authenticate: Bearer"), std::string::npos) << none;
  EXPECT_NE(none.find("needs the run's token"), std::string::npos) << none;
  const std::string wrong = Exchange(
      s->port(), "GET /hello HTTP/1.1\r\nAuthorization: Bearer nope-nope-nope-nope\r\n\r\n");
  EXPECT_EQ(wrong.rfind("HTTP/1.1 401", 0), 0u) << wrong;
  EXPECT_NE(wrong.find("not the run's"), std::string::npos) << wrong;
  const std::string right =
      Exchange(s->port(),
               absl::StrCat("GET /hello?y HTTP/1.1\r\nAuthorization: Bearer ", token, "\r\n\r\n"));
  EXPECT_EQ(right.rfind("HTTP/1.1 200", 0), 0u) << right;
  EXPECT_NE(right.find("hello y"), std::string::npos) << right;
  // A browser: the form, then /login sets the cookie, which opens the page.
  const std::string form =
      Exchange(s->port(), "GET /hello HTTP/1.1\r\nAccept: text/html,*/*\r\n\r\n");
  EXPECT_EQ(form.rfind("HTTP/1.1 401", 0), 0u) << form;
  EXPECT_NE(form.find("<form method=\"get\" action=\"/login\">"), std::string::npos) << form;
  const std::string bad_login = Exchange(s->port(), "GET /login?token=guess HTTP/1.1\r\n\r\n");
  EXPECT_EQ(bad_login.rfind("HTTP/1.1 401", 0), 0u) << bad_login;
  EXPECT_EQ(bad_login.find("Set-Cookie"), std::string::npos) << bad_login;
  const std::string login =
      Exchange(s->port(), absl::StrCat("GET /login?token=", token, " HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(login.rfind("HTTP/1.1 303", 0), 0u) << login;
  EXPECT_NE(login.find("Location: /\r\n"), std::string::npos) << login;
  EXPECT_NE(login.find(absl::StrCat("Set-Cookie: shoal_token=", token, "; Path=/; HttpOnly")),
            std::string::npos)
      << login;
  const std::string with_cookie =
      Exchange(s->port(),
               absl::StrCat("GET /hello HTTP/1.1\r\nCookie: a=b; shoal_token=", token, "\r\n\r\n"));
  EXPECT_EQ(with_cookie.rfind("HTTP/1.1 200", 0), 0u) << with_cookie;
  // No token configured: everything is open, /login is just another path.
  auto open = Serve();
  EXPECT_EQ(Exchange(open->port(), "GET /hello HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(Exchange(open->port(), "GET /login HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
}

}  // namespace
}  // namespace shoal
