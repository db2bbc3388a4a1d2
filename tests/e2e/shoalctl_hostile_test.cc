// The real shoalctl binary against a coordinator and a store that answer
// with terminal control sequences in every string (an older coordinator
// that let them in, or a hostile one): every command in every output form
// prints no character that acts on a terminal, on stdout or stderr
// (tools/shoalctl/terminal_text.h). The servers are in-process fakes on
// 127.0.0.1:0; shoalctl runs as a process.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_util.h"
#include "common/printable.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shoal/v1/checkpoint.grpc.pb.h"
#include "shoal/v1/coordinator.grpc.pb.h"
#include "tests/support/test_support.h"

namespace shoal {
namespace {

using ::testing::HasSubstr;

constexpr char kRetitle[] = "\x1b]0;pwned\x07";
constexpr char kClear[] = "\x1b[2J\x1b[H";
constexpr char kBidi[] =
    "\xe2\x80\xae"
    "txt";
constexpr char kCsi8[] =
    "\xc2\x9b"
    "31m";

std::string Hostile(const std::string& base) {
  return absl::StrCat(base, kRetitle, "\n", kClear, kBidi, kCsi8);
}

v1::RunStatus HostileStatus() {
  v1::RunStatus s;
  s.set_run_id(Hostile("run"));
  s.set_phase(v1::FINISHED);
  s.set_round(2);
  s.set_last_completed_round(2);
  s.set_detail(Hostile("detail"));
  s.set_error(Hostile("error"));
  s.set_model_hash(Hostile("ab"));
  s.mutable_config()->mutable_sync()->set_rounds(2);
  s.mutable_config()->mutable_checkpoints()->set_store(Hostile("store"));
  s.mutable_config()->mutable_model()->set_name(Hostile("mlp"));
  for (int i = 1; i <= 3; ++i) {
    v1::WorkerStatus* w = s.add_workers();
    w->set_id(i == 1 ? "w1" : Hostile("w"));
    w->set_name(Hostile("name"));
    w->set_address(Hostile("127.0.0.1:1"));
    w->set_state(i == 3 ? "lost" : "waiting");
    w->set_reason(Hostile("reason"));
    w->set_zone(Hostile("eu"));
    w->set_role("member");
    w->set_model_round(2);
    w->set_model_hash(Hostile("cd"));
    w->set_outbound_only(true);
    w->set_outbound_reason(Hostile("nat"));
    w->add_score_reasons(Hostile("audit"));
    w->set_relayed_by(Hostile("w9"));
  }
  v1::ZoneStatus* z = s.add_zones();
  z->set_path(Hostile("eu"));
  z->set_supernode("w1");
  z->set_reason(Hostile("why"));
  v1::Ban* b = s.add_bans();
  b->set_worker_id(Hostile("w7"));
  b->set_name(Hostile("mallory"));
  b->set_reason(Hostile("ban"));
  v1::RoundSummary* r = s.add_recent_rounds();
  r->set_round(2);
  r->set_model_hash(Hostile("ef"));
  r->set_evaluated(true);
  return s;
}

class HostileCoordinator final : public v1::Coordinator::CallbackService {
  grpc::ServerUnaryReactor* GetRunStatus(grpc::CallbackServerContext* ctx,
                                         const v1::GetRunStatusRequest*,
                                         v1::RunStatus* response) override {
    *response = HostileStatus();
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

class HostileStore final : public v1::Checkpoint::CallbackService {
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx,
                                 const v1::ListCheckpointsRequest*,
                                 v1::ListCheckpointsResponse* response) override {
    v1::CheckpointInfo* c = response->add_checkpoints();
    c->set_id(Hostile("ck"));
    c->set_run_id(Hostile("run"));
    c->set_damage(Hostile("damage"));
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* ctx,
                                        const v1::GetManifestRequest*,
                                        v1::Manifest* response) override {
    response->set_id(Hostile("ck"));
    response->set_run_id(Hostile("run"));
    response->set_worker_id(Hostile("w1"));
    v1::LayerEntry* l = response->add_layers();
    l->set_name(Hostile("fc"));
    l->set_dtype(Hostile("float32"));
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const v1::DeleteCheckpointRequest*,
                                   v1::DeleteCheckpointResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, Hostile("no such checkpoint")));
    return r;
  }
};

std::string RunShell(const std::string& command, int* code) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(ShoalctlHostileTest, EveryCommandAndFormatPrintsNoControlCharacter) {
  HostileCoordinator coordinator;
  HostileStore store;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&coordinator);
  builder.RegisterService(&store);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  const std::string addr = absl::StrCat("127.0.0.1:", port);
  const std::string ctl = absl::StrCat(testing::BinDir(), "/shoalctl ");
  const std::string coord = " --coordinator=" + addr;
  const std::string st = " --store=" + addr;
  const std::vector<std::string> commands = {
      "status" + coord,
      "status -o wide" + coord,
      "status -o json" + coord,
      "status -o yaml" + coord,
      "watch --timeout=20s" + coord,
      "watch -o json --timeout=20s" + coord,
      "config" + coord,
      "config -o yaml" + coord,
      "explain w1" + coord,
      "explain w1 -o json" + coord,
      "explain w1 -o yaml" + coord,
      "explain nobody" + coord,
      "doctor" + coord,
      "doctor -o json" + coord,
      "checkpoints list" + st,
      "checkpoints list -o wide" + st,
      "checkpoints list -o json" + st,
      "checkpoints list -o yaml" + st,
      "checkpoints show ck" + st,
      "checkpoints show ck -o json" + st,
      "checkpoints delete ck" + st,
  };
  for (const std::string& command : commands) {
    SCOPED_TRACE(command);
    int code = -1;
    const std::string out = RunShell(ctl + command + " 2>&1", &code);
    EXPECT_NE(code, -1);
    EXPECT_FALSE(out.empty());
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      EXPECT_FALSE(FindUnprintable(line).has_value()) << line;
    }
  }
  // The escapes are there to be read.
  int code = -1;
  const std::string wide = RunShell(ctl + "status -o wide" + coord, &code);
  EXPECT_THAT(wide, HasSubstr("name\\x1b]0;pwned\\x07\\x0a\\x1b[2J"));
  const std::string json = RunShell(ctl + "status -o json" + coord, &code);
  EXPECT_THAT(json, HasSubstr("name\\u001b]0;pwned\\u0007\\n\\u001b[2J"));
  server->Shutdown(DeadlineIn(absl::Seconds(5)));
}

}  // namespace
}  // namespace shoal
