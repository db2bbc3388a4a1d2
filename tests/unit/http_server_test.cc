// The embedded HTTP server of /metrics and the coordinator's web page:
// routes, 404/405/400, HEAD, and that a stalled client neither blocks
// others nor holds a thread past the read timeout.
#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace shoal {
namespace {

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

std::unique_ptr<HttpServer> Serve(HttpServer::Options options = {}) {
  auto s = HttpServer::Start("127.0.0.1:0", "test_listen",
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

TEST(HttpServerTest, ServesRoutesAndAnswersErrors) {
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
  for (const std::string& bad : std::vector<std::string>{
           "garbage\r\n\r\n", "GET\r\n\r\n", "GET hello HTTP/1.1\r\n\r\n", "GET / SPDY\r\n\r\n",
           "get / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\nno colon here\r\n\r\n",
           std::string("GET /a\x01 HTTP/1.1\r\n\r\n")}) {
    EXPECT_EQ(Exchange(s->port(), bad).rfind("HTTP/1.1 400", 0), 0u) << bad;
  }
  const std::string huge = "GET /hello HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n";
  EXPECT_EQ(Exchange(s->port(), huge).rfind("HTTP/1.1 431", 0), 0u);
  // Still serving after all that.
  EXPECT_EQ(Exchange(s->port(), "GET /hello HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
}

TEST(HttpServerTest, AStalledClientIsCutAndDoesNotBlockOthers) {
  // States, not durations: the other client is answered while the stalled
  // one is still connected (not cut yet), and the stalled one then gets 408.
  // The read timeout only has to outlast one loopback exchange.
  HttpServer::Options options;
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
  EXPECT_EQ(cut.rfind("HTTP/1.1 408", 0), 0u) << cut;
}

TEST(HttpServerTest, RejectsMalformedAddresses) {
  for (const char* bad : {"", "127.0.0.1", "localhost:80", "127.0.0.1:99999", ":80"}) {
    auto s = HttpServer::Start(bad, "http_listen", {});
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("--http_listen"), std::string::npos);
  }
}

}  // namespace
}  // namespace shoal
