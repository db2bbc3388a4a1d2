// Integration tests of the asynchronous reachability probe (common/
// tcp_prober.h) against real sockets on 127.0.0.1: a listening port, a
// refusing one, one whose handshakes never complete (tests/support/
// silent_listener.h), a name to resolve, and a shutdown with probes in
// flight. Waiting is polling with a deadline; nothing asserts a duration.
#include "common/tcp_prober.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/silent_listener.h"
#include "tests/support/test_support.h"

namespace shoal {
namespace {

using ::shoal::testing::RefusingPort;
using ::shoal::testing::SilentListener;
using ::shoal::testing::WaitUntil;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);
// Longer than any test waits: a probe of a silent port stays in flight.
constexpr absl::Duration kForever = absl::Seconds(120);

// A port that accepts connections (the kernel completes the handshake; no
// one needs to call accept).
class OpenPort {
 public:
  OpenPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 && listen(fd_, 64) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~OpenPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The outcome of one probe, set by its callback.
class Outcome {
 public:
  TcpProber::Callback Callback() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu_);
      status_ = std::move(s);
    };
  }
  std::optional<absl::Status> Get() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // Waits for the callback; UNKNOWN "no outcome" when it did not run.
  absl::Status Wait() const {
    std::optional<absl::Status> s;
    WaitUntil([&] { return (s = Get()).has_value(); }, kWait);
    return s.value_or(absl::UnknownError("no outcome"));
  }

 private:
  mutable absl::Mutex mu_;
  std::optional<absl::Status> status_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<TcpProber> StartProber() {
  auto prober = TcpProber::Start(RealClock::Get());
  EXPECT_TRUE(prober.ok()) << prober.status();
  return prober.ok() ? std::move(*prober) : nullptr;
}

TEST(TcpProberTest, TellsReachableRefusedSilentAndMalformedAddressesApart) {
  OpenPort open;
  RefusingPort refusing;
  SilentListener silent;
  ASSERT_GT(open.port(), 0);
  ASSERT_GT(refusing.port(), 0);
  ASSERT_GT(silent.port(), 0);
  std::unique_ptr<TcpProber> prober = StartProber();
  ASSERT_NE(prober, nullptr);

  Outcome reachable, refused, dropped, malformed, named;
  prober->Probe(absl::StrCat("127.0.0.1:", open.port()), kWait, reachable.Callback());
  prober->Probe(refusing.address(), kWait, refused.Callback());
  prober->Probe(silent.address(), absl::Milliseconds(300), dropped.Callback());
  prober->Probe("no-port-here", kWait, malformed.Callback());
  // A name goes through the resolver thread.
  prober->Probe(absl::StrCat("localhost:", open.port()), kWait, named.Callback());

  EXPECT_TRUE(reachable.Wait().ok()) << reachable.Wait();
  EXPECT_TRUE(named.Wait().ok()) << named.Wait();
  EXPECT_TRUE(absl::IsUnavailable(refused.Wait())) << refused.Wait();
  EXPECT_THAT(std::string(refused.Wait().message()), HasSubstr("refused"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(dropped.Wait())) << dropped.Wait();
  EXPECT_THAT(std::string(dropped.Wait().message()), HasSubstr(silent.address()));
  EXPECT_TRUE(absl::IsInvalidArgument(malformed.Wait())) << malformed.Wait();
  ASSERT_TRUE(WaitUntil([&] { return prober->in_flight() == 0; }, kWait));
}

// One thread serves every probe: many silent ones wait together, and a
// reachable address probed after them is answered while they all still wait.
TEST(TcpProberTest, SilentProbesDoNotHoldUpOthersAndShutdownCancelsThem) {
  SilentListener silent;
  OpenPort open;
  ASSERT_GT(silent.port(), 0);
  ASSERT_GT(open.port(), 0);
  std::unique_ptr<TcpProber> prober = StartProber();
  ASSERT_NE(prober, nullptr);

  constexpr int kSilent = 64;
  std::vector<Outcome> waiting(kSilent);
  for (Outcome& o : waiting) prober->Probe(silent.address(), kForever, o.Callback());
  Outcome reachable;
  prober->Probe(absl::StrCat("127.0.0.1:", open.port()), kForever, reachable.Callback());
  EXPECT_TRUE(reachable.Wait().ok()) << reachable.Wait();
  // (An answered probe leaves the count just after its callback.)
  EXPECT_TRUE(WaitUntil([&] { return prober->in_flight() == kSilent; }, kWait));
  for (const Outcome& o : waiting) EXPECT_FALSE(o.Get().has_value());

  // Shutdown runs every callback (CANCELLED) before it returns; later
  // probes finish at once.
  prober->Shutdown();
  EXPECT_EQ(prober->in_flight(), 0);
  for (const Outcome& o : waiting) {
    ASSERT_TRUE(o.Get().has_value());
    EXPECT_TRUE(absl::IsCancelled(*o.Get())) << *o.Get();
  }
  Outcome late;
  prober->Probe(silent.address(), kForever, late.Callback());
  ASSERT_TRUE(late.Get().has_value());
  EXPECT_TRUE(absl::IsCancelled(*late.Get())) << *late.Get();
}

// A callback may start the next probe (it runs outside the prober's locks).
TEST(TcpProberTest, ACallbackMayProbeAgain) {
  OpenPort open;
  ASSERT_GT(open.port(), 0);
  std::unique_ptr<TcpProber> prober = StartProber();
  ASSERT_NE(prober, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", open.port());
  Outcome second;
  prober->Probe(address, kWait, [&](absl::Status first) {
    EXPECT_TRUE(first.ok()) << first;
    prober->Probe(address, kWait, second.Callback());
  });
  EXPECT_TRUE(second.Wait().ok()) << second.Wait();
}

}  // namespace
}  // namespace shoal
