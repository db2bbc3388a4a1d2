// The servers are inspectable the way operators do it: server reflection
// plus a generic client (shoal-reflect-call, and grpcurl when installed),
// with no Shoal protos compiled into the client.
#include <fcntl.h>
#include <grpc/grpc.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/checkpoint/checkpoint_server.h"
#include "services/coordinator/coordinator_server.h"
#include "services/worker/core/model_state.h"
#include "services/worker/peer_service.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tests/support/coordinator_fixture.h"
#include "tests/support/test_support.h"

extern char** environ;

namespace shoal {
namespace {

using ::shoal::coordinator::CoordinatorServer;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Keeps gRPC initialised for the whole test binary. Otherwise gRPC 1.51 tears
// the library down whenever a test's last server or channel goes away, and
// that teardown sometimes blocks ~10 s joining an executor thread that sits
// in a 10 s poll. Never shut down: process exit cleans up.
[[maybe_unused]] const bool kGrpcKeptInitialised = [] {
  grpc_init();
  return true;
}();

constexpr absl::Duration kCommandTimeout = absl::Seconds(30);

struct CommandResult {
  int exit_code = -1;  // -1: killed (timeout or signal)
  std::string out;
  std::string err;
};

// Runs `argv` (no shell) and captures stdout and stderr. The child is killed
// if it runs longer than kCommandTimeout, so a hung client cannot hang the
// test and nothing outlives it.
CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult result;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return result;
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (spawned != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    result.err = "cannot spawn " + argv[0];
    return result;
  }
  const absl::Time deadline = absl::Now() + kCommandTimeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      timed_out = true;
      break;
    }
    const int n = poll(fds, 2, static_cast<int>(left_ms));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        sinks[i]->append(buf, got);
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& fd : fds) {
    if (fd.fd >= 0) close(fd.fd);
  }
  if (timed_out) kill(pid, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (!timed_out && WIFEXITED(wstatus)) result.exit_code = WEXITSTATUS(wstatus);
  return result;
}

std::string ReflectCall() { return testing::BinDir() + "/shoal-reflect-call"; }

// Path of `name` on $PATH, or "".
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    if (dir.empty()) continue;
    std::string candidate = std::string(dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::vector<std::string> Lines(const std::string& s) {
  return absl::StrSplit(s, '\n', absl::SkipEmpty());
}

class ReflectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::StartTestCoordinator(testing::TestCoordinatorOptions("run-reflection"));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }

  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(ReflectionTest, ReflectCallListsTheServices) {
  ASSERT_EQ(access(ReflectCall().c_str(), X_OK), 0)
      << ReflectCall() << " missing (set SHOAL_BIN_DIR; build shoal-reflect-call)";
  CommandResult r = RunCommand({ReflectCall(), server_->address(), "list"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(Lines(r.out),
              ::testing::IsSupersetOf({"shoal.v1.Coordinator", "grpc.health.v1.Health",
                                       "grpc.reflection.v1alpha.ServerReflection"}))
      << r.out;
}

TEST_F(ReflectionTest, ReflectCallGetsTheRunStatusAsJson) {
  CommandResult r =
      RunCommand({ReflectCall(), server_->address(), "shoal.v1.Coordinator/GetRunStatus"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"phase\""), HasSubstr("\"WAITING_FOR_MEMBERS\""),
                           HasSubstr("\"round\""), HasSubstr("\"minParticipants\""),
                           HasSubstr("\"run-reflection\""), Not(HasSubstr("min_participants"))))
      << r.out;
}

TEST_F(ReflectionTest, ReflectCallSendsAJsonRequest) {
  CommandResult r = RunCommand({ReflectCall(), server_->address(), "shoal.v1.Coordinator/Join",
                                R"({"peerAddress": "127.0.0.1:4242", "name": "from-json"})"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"workerId\": \"w1\""), HasSubstr("\"runId\"")));
  const v1::RunStatus status = server_->engine().Status();
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_EQ(status.workers(0).address(), "127.0.0.1:4242");

  // proto field names are accepted too, as grpcurl does.
  r = RunCommand({ReflectCall(), server_->address(), "shoal.v1.Coordinator/JoinRound",
                  R"({"worker_id": "w1", "round": "1"})"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"admittedRound\": \"1\""));
}

TEST_F(ReflectionTest, ReflectCallReportsErrors) {
  CommandResult r = RunCommand({ReflectCall(), server_->address(), "shoal.v1.Coordinator/JoinRound",
                                R"({"workerId": "nobody", "round": "1"})"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(r.err, HasSubstr("nobody"));

  r = RunCommand({ReflectCall(), server_->address(), "shoal.v1.Coordinator/NoSuchMethod"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));

  r = RunCommand({ReflectCall(), server_->address(), "shoal.v1.NoSuchService/Get"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));

  r = RunCommand({ReflectCall(), server_->address(), "shoal.v1.Coordinator/GetRunStatus",
                  R"({"noSuchField": 1})"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
}

TEST_F(ReflectionTest, ReflectCallLinksNoShoalProtos) {
  // Everything it knows about shoal.v1 came over the wire: the binary has
  // no generated Shoal descriptors.
  const std::string nm = FindOnPath("nm");
  if (nm.empty()) GTEST_SKIP() << "nm not on PATH";
  CommandResult r = RunCommand({nm, "-C", ReflectCall()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("shoal::v1::")));
  EXPECT_THAT(r.out, Not(HasSubstr("descriptor_table_shoal")));
}

// A real grpcurl (1.8.5, as seen in issue 10) prints the proto field names (snake_case) and,
// as proto3 JSON maps them, 64-bit integers as strings; zero values are left
// out unless -emit-defaults is given. shoal-reflect-call prints lowerCamelCase
// JSON names instead (see ReflectCallGetsTheRunStatusAsJson).
TEST_F(ReflectionTest, GrpcurlIfInstalled) {
  const std::string grpcurl = FindOnPath("grpcurl");
  if (grpcurl.empty()) {
    GTEST_SKIP() << "grpcurl not on PATH (neither Debian bookworm nor npm packages it; "
                    "shoal-reflect-call stands in for it in the other tests)";
  }
  CommandResult r = RunCommand({grpcurl, "-plaintext", server_->address(), "list"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(Lines(r.out),
              ::testing::IsSupersetOf({"shoal.v1.Coordinator", "grpc.health.v1.Health",
                                       "grpc.reflection.v1alpha.ServerReflection"}))
      << r.out;
  r = RunCommand({grpcurl, "-plaintext", server_->address(), "shoal.v1.Coordinator/GetRunStatus"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"run_id\": \"run-reflection\""),
                           HasSubstr("\"phase\": \"WAITING_FOR_MEMBERS\""),
                           // uint64: a string; uint32: a number.
                           HasSubstr("\"round\": \"1\""), HasSubstr("\"min_participants\": 2"),
                           // int64
                           HasSubstr("\"started_unix_ms\": \""), Not(HasSubstr("minParticipants"))))
      << r.out;
  r = RunCommand({grpcurl, "-plaintext", server_->address(), "grpc.health.v1.Health/Check"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"status\": \"SERVING\"")) << r.out;
}

// grpcurl's `grpc.health.v1.Health/Check` needs reflection to describe the
// health service, which gRPC implements without a linked .proto; every
// server starts through GrpcServer::Start, which makes it describable. Checked
// on each kind of server with a client that knows no proto but reflection's.
CommandResult HealthCheck(const std::string& address) {
  return RunCommand({ReflectCall(), address, "grpc.health.v1.Health/Check"});
}

TEST_F(ReflectionTest, HealthCheckThroughReflectionOnTheCoordinator) {
  CommandResult r = HealthCheck(server_->address());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"status\": \"SERVING\"")) << r.out;
}

TEST(HealthReflectionTest, HealthCheckThroughReflectionOnAWorkersPeerServer) {
  // What a worker serves: its PeerService on GrpcServer (as Worker does).
  worker::ModelState state;
  worker::PeerService service(&state);
  auto server = GrpcServer::Start("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  CommandResult r = HealthCheck((*server)->address());
  (*server)->Shutdown(absl::Seconds(1));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"status\": \"SERVING\"")) << r.out;
}

TEST(HealthReflectionTest, HealthCheckThroughReflectionOnTheCheckpointServer) {
  testing::TempDir dir;
  checkpoint::CheckpointServerOptions options;
  options.listen = "127.0.0.1:0";
  options.store.data_dir = dir.path() + "/store";
  auto server = checkpoint::CheckpointServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  CommandResult r = HealthCheck((*server)->address());
  (*server)->Shutdown(absl::Seconds(1));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"status\": \"SERVING\"")) << r.out;
}

// A client pointed at the wrong server (a worker's Peer port given as the
// coordinator) hears what answered and what to check, not an empty
// UNIMPLEMENTED.
TEST(UnknownMethodTest, AWorkersServerNamesWhatItDoesNotServe) {
  worker::ModelState state;
  worker::PeerService service(&state);
  auto server = GrpcServer::Start("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Coordinator::NewStub(MakeChannel((*server)->address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetRunStatusRequest request;
  v1::RunStatus response;
  const grpc::Status status = stub->GetRunStatus(&ctx, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("does not serve shoal.v1.Coordinator"),
                    HasSubstr("/shoal.v1.Coordinator/GetRunStatus"), HasSubstr("--coordinator")));
  // It keeps serving what it has.
  CommandResult r = HealthCheck((*server)->address());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace shoal
