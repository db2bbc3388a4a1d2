// The uplink pacer (services/worker/uplink_pacer.h) against real sockets on
// 127.0.0.1: which descriptors it paces, and at what rate. What pacing does
// to a shaped link's exchange time is bench/run.sh wan's figure.
#include "services/worker/uplink_pacer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

#include "gtest/gtest.h"

#ifndef SO_MAX_PACING_RATE
#define SO_MAX_PACING_RATE 47
#endif

namespace shoal::worker {
namespace {

// A socket closed at the end of the test.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

uint32_t PacingOf(int fd) {
  uint32_t rate = 0;
  socklen_t len = sizeof(rate);
  EXPECT_EQ(getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, &len), 0);
  return rate;
}

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

TEST(UplinkPacerTest, PacesConnectedTcpSocketsAndLeavesTheOthers) {
  Fd listener(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr = Loopback(0);
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener.get(), 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  Fd client(socket(AF_INET, SOCK_STREAM, 0));
  ASSERT_EQ(connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  Fd accepted(accept(listener.get(), nullptr, nullptr));
  ASSERT_GE(accepted.get(), 0);
  Fd unconnected(socket(AF_INET, SOCK_STREAM, 0));
  Fd udp(socket(AF_INET, SOCK_DGRAM, 0));
  const uint32_t unpaced = PacingOf(listener.get());

  // 20 Mbit/s shared by 3 flows: 833,333 bytes per second each.
  const uint64_t rate = PacingBytesPerSecond(20, 3);
  EXPECT_EQ(rate, 833333u);
  absl::StatusOr<int> paced = PaceConnectedTcpSockets(rate);
  ASSERT_TRUE(paced.ok()) << paced.status();
  // Both ends of the connection (this process holds both), at least; the
  // test binary's other sockets, if any, count too.
  EXPECT_GE(*paced, 2);
  EXPECT_EQ(PacingOf(client.get()), rate);
  EXPECT_EQ(PacingOf(accepted.get()), rate);
  EXPECT_EQ(PacingOf(listener.get()), unpaced);
  EXPECT_EQ(PacingOf(unconnected.get()), unpaced);
  EXPECT_EQ(PacingOf(udp.get()), unpaced);

  // The share follows the flows of the step.
  UplinkPacer pacer(20);
  pacer.Share(1);
  EXPECT_EQ(PacingOf(client.get()), 2500000u);
  pacer.Share(4);
  EXPECT_EQ(PacingOf(accepted.get()), 625000u);
  pacer.Share(0);  // a group of one: the whole uplink
  EXPECT_EQ(PacingOf(accepted.get()), 2500000u);
}

TEST(UplinkPacerTest, RatesStayInsideWhatTheKernelTakes) {
  EXPECT_EQ(PacingBytesPerSecond(8, 1), 1000000u);
  EXPECT_EQ(PacingBytesPerSecond(8, -3), 1000000u);
  EXPECT_EQ(PacingBytesPerSecond(1e-9, 1), 1u);  // never 0, which would stop sending
  // Never ~0U, which the kernel reads as unpaced.
  EXPECT_LT(PacingBytesPerSecond(1e9, 1), 0xffffffffu);
}

}  // namespace
}  // namespace shoal::worker
