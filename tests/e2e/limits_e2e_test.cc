// What strangers send is bounded before an operator sees it (issue 50), with
// the real coordinator, workers and shoalctl as processes on 127.0.0.1:
// Joins over the limits are refused naming the field; a flood of junk Joins
// (no session ever follows) leaves the status under its bound while two
// real workers go on training; `shoalctl status -o wide` of members with
// odd but valid names prints them and no control byte.
//
// SHOAL_JUNK_JOINS sets the flood's size (default 2,000; bench/run.sh
// junk_joins runs 10,000 and keeps the line this test prints).
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/printable.h"
#include "gmock/gmock.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

using ::testing::HasSubstr;

class LimitsE2eTest : public ClusterTest {
 protected:
  grpc::Status Join(const v1::JoinRequest& request, v1::JoinResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    return stub_->Join(&ctx, request, response);
  }
};

TEST_F(LimitsE2eTest, JoinsOverTheLimitsAreRefusedNamingTheField) {
  StartCoordinator({"--min_participants=2", "--probe_joiners_timeout=0"});
  v1::JoinRequest join;
  join.set_peer_address("127.0.0.1:9");
  v1::JoinResponse response;

  join.set_name(std::string(100000, 'n'));
  grpc::Status s = Join(join, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("JoinRequest.name is 100000 bytes; at most 128"));

  join.set_name("\x1b]0;owned\x07\x1b[2J");
  s = Join(join, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("JoinRequest.name holds U+001B at byte 0"));
  EXPECT_FALSE(FindUnprintable(s.error_message()).has_value()) << s.error_message();

  join.set_name("fine");
  join.set_zone("eu/\x1b[2J");
  s = Join(join, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("JoinRequest.zone"));

  // Nobody got in, and a valid join still does.
  v1::RunStatus status;
  ASSERT_TRUE(Status(&status));
  EXPECT_EQ(status.members(), 0u);
  join.clear_zone();
  ASSERT_TRUE(Join(join, &response).ok());
  v1::LeaveRequest leave;
  leave.set_worker_id(response.worker_id());
  leave.set_reason("bye\xe2\x80\xae");
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
  v1::LeaveResponse left;
  s = stub_->Leave(&ctx, leave, &left);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("LeaveRequest.reason holds U+202E"));
}

TEST_F(LimitsE2eTest, AFloodOfJunkJoinsLeavesTheStatusBoundedAndRoundsGoOn) {
  size_t junk = 2000;
  if (const char* env = std::getenv("SHOAL_JUNK_JOINS")) (void)absl::SimpleAtoi(env, &junk);
  const std::string addr = StartCoordinator({"--min_participants=2", "--local_steps=20"});
  StartWorker(addr);
  StartWorker(addr);
  const uint64_t before = ExpectRoundsGoOn(0, 1, 2).last_completed_round();

  // Junk: the longest name allowed, an address of its own, never a session.
  std::atomic<size_t> next{0}, accepted{0}, busy{0}, other{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto stub = v1::Coordinator::NewStub(MakeChannel(addr));
      for (size_t i = next++; i < junk; i = next++) {
        v1::JoinRequest j;
        j.set_peer_address(absl::StrCat("127.0.0.", 2 + i % 250, ":", 1024 + i));
        j.set_name(std::string(128, 'j'));
        v1::JoinResponse r;
        grpc::ClientContext ctx;
        ctx.set_deadline(DeadlineIn(absl::Seconds(30)));
        const grpc::Status s = stub->Join(&ctx, j, &r);
        if (s.ok()) {
          ++accepted;
        } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
          ++busy;
        } else {
          ++other;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double flood_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_EQ(other.load(), 0u);
  EXPECT_GT(busy.load(), 0u) << "the flood never reached --max_pending_joins";

  // Right after the flood: the most the status holds of it.
  v1::RunStatus status;
  ASSERT_TRUE(Status(&status));
  const size_t bytes = status.ByteSizeLong();
  EXPECT_LE(status.pending_joins(), 256u);
  EXPECT_LT(bytes, 1u << 20) << "status of " << bytes << " bytes after " << junk << " junk joins";
  // Rounds went on, with both real workers agreeing.
  const v1::RunStatus after = ExpectRoundsGoOn(before, 2, 2);
  // Once the session grace removed the junk, the departed are folded into a
  // count.
  const v1::RunStatus settled = WaitForStatus(
      [](const v1::RunStatus& s) { return s.pending_joins() == 0; }, absl::Seconds(60));
  EXPECT_LE(settled.workers_size(), 2 + 50);
  EXPECT_GT(settled.departed_not_shown(), 0u);
  std::cout << "junk_joins=" << junk << " accepted=" << accepted << " refused_busy=" << busy
            << " flood_seconds=" << flood_seconds << " status_bytes_after_flood=" << bytes
            << " status_bytes_settled=" << settled.ByteSizeLong()
            << " rounds_during=" << after.last_completed_round() - before << std::endl;
}

TEST_F(LimitsE2eTest, WideStatusOfOddButValidNamesPrintsNoControlByte) {
  const std::string addr =
      StartCoordinator({"--min_participants=2", "--local_steps=20", "--rounds=2"});
  const std::string odd1 = "ünï 名前 \"q\" $(rm -rf /) %s%n";
  const std::string odd2 = "<b>🐟</b> \\x1b[2J a'b";
  StartWorker(addr, {"--name=" + odd1});
  StartWorker(addr, {"--name=" + odd2});
  ExpectRoundsGoOn(0, 1, 2);
  int code = -1;
  const std::string out =
      Run(absl::StrCat(BinDir(), "/shoalctl status -o wide --coordinator=", addr), &code);
  EXPECT_EQ(code, 0) << out;
  for (const char c : out) {
    const unsigned char b = static_cast<unsigned char>(c);
    EXPECT_TRUE(c == '\n' || (b >= 0x20 && b != 0x7f)) << "byte " << int(b) << " in\n" << out;
  }
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    EXPECT_FALSE(FindUnprintable(line).has_value()) << line;
  }
  // The names as they are (printable text is not escaped).
  EXPECT_THAT(out, HasSubstr(odd1));
  EXPECT_THAT(out, HasSubstr(odd2));
}

}  // namespace
}  // namespace shoal
