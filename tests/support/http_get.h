// A tiny HTTP/1.0 GET over a plain socket for tests that read /metrics or
// Prometheus's API on loopback (no new dependency for one request).
#ifndef SHOAL_TESTS_SUPPORT_HTTP_GET_H_
#define SHOAL_TESTS_SUPPORT_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace shoal::testing {

// A TCP connection to 127.0.0.1:`port` with 5 s send and receive timeouts;
// -1 when refused.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
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

// GETs http://127.0.0.1:`port``path`; returns the body of a 200 answer, or ""
// (connection refused, another status, a timeout of 5 s).
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  std::string response;
  {
    const std::string request =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buf[16384];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.compare(0, 12, "HTTP/1.1 200") != 0 &&
      response.compare(0, 12, "HTTP/1.0 200") != 0) {
    return "";
  }
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// Sends `request` (a whole HTTP request head) to 127.0.0.1:`port` over TLS,
// trusting only the CA certificate(s) in `ca_pem`; the whole answer (head
// and body), or "" when the connection, the handshake or the verification
// failed. 5 s timeouts.
inline std::string HttpsExchange(int port, const std::string& ca_pem, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  std::string out;
  {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    BIO* b = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
    while (X509* ca = PEM_read_bio_X509(b, nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca);
      X509_free(ca);
    }
    ERR_clear_error();
    BIO_free(b);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) == 1) {
      SSL_write(ssl, request.data(), static_cast<int>(request.size()));
      char buf[16384];
      int n;
      while ((n = SSL_read(ssl, buf, sizeof(buf))) > 0) out.append(buf, n);
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
  }
  close(fd);
  return out;
}

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_SUPPORT_HTTP_GET_H_
