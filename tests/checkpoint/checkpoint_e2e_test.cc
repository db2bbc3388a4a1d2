// End-to-end: the real shoal-checkpoint binary as a process, killed with
// SIGKILL in the middle of an upload and restarted on the same directory;
// `shoalctl checkpoints` against it; the export opened by Python's torch.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/tensor_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/checkpoint/checkpoint_client.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/support/test_support.h"
#include "tools/shoalctl/checkpoints_cmd.h"

namespace shoal::checkpoint {
namespace {

using ::shoal::checkpoint::testing::CountEntries;
using ::shoal::checkpoint::testing::MakeLayer;
using ::shoal::checkpoint::testing::MakeManifest;
using ::shoal::checkpoint::testing::TestLayer;
using ::shoal::testing::BinDir;
using ::shoal::testing::Process;
using ::shoal::testing::TempDir;
using ::shoal::testing::WaitUntil;
using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";

// Runs a shell command; returns stdout and stderr, `code` gets the exit code.
std::string RunShell(const std::string& command, int* code) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

bool PythonHasTorch() {
  int code = -1;
  RunShell(absl::StrCat(kPython, " -c 'import torch'"), &code);
  return code == 0;
}

std::vector<ByteSpan> Spans(const std::vector<TestLayer>& layers) {
  std::vector<ByteSpan> spans;
  for (const auto& l : layers) spans.emplace_back(l.data(), l.bytes());
  return spans;
}

// An MLP's parameters for Fashion-MNIST (784 -> 512 -> 10), round `r`;
// fc1.weight spans two 1 MiB chunks.
std::vector<TestLayer> Model(float r) {
  return {MakeLayer("fc1.weight", {512, 784}, r), MakeLayer("fc1.bias", {512}, r + 0.5f),
          MakeLayer("fc2.weight", {10, 512}, r + 0.25f), MakeLayer("fc2.bias", {10}, r + 0.75f)};
}

class CheckpointE2eTest : public ::testing::Test {
 protected:
  std::string StartServer(std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0",
                                     "--data_dir=" + data_dir()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    server_ = Process::Start(argv, absl::StrCat(dir_.path(), "/checkpoint-", ++starts_, ".log"));
    const std::string address = server_->WaitForListenAddress(absl::Seconds(60));
    EXPECT_FALSE(address.empty()) << server_->Log();
    return address;
  }

  // `shoalctl checkpoints ARGS` through the command's entry point, as the
  // binary runs it; returns stdout, `err` gets stderr.
  static int Ctl(const std::vector<std::string>& args, std::string* out,
                 std::string* err = nullptr) {
    std::ostringstream o, e;
    const int code = ctl::RunCheckpointsCommand(
        args,
        [](const std::string& store, absl::Duration timeout) {
          CheckpointClientOptions options;
          options.call_timeout = timeout;
          return std::make_unique<GrpcCheckpointClient>(store, options);
        },
        o, e);
    *out = o.str();
    if (err != nullptr) *err = e.str();
    return code;
  }

  std::string data_dir() { return dir_.path() + "/data"; }

  TempDir dir_;
  int starts_ = 0;
  std::unique_ptr<Process> server_;
};

TEST_F(CheckpointE2eTest, KillNineMidUploadLosesOnlyThePartialCheckpoint) {
  std::string address = StartServer();
  ASSERT_FALSE(address.empty());
  const std::vector<TestLayer> r1 = Model(1), r2 = Model(2), r3 = Model(3);
  {
    GrpcCheckpointClient client(address);
    ASSERT_TRUE(client.Upload(MakeManifest("e2e", 1, r1), Spans(r1)).ok());
    ASSERT_TRUE(client.Upload(MakeManifest("e2e", 2, r2), Spans(r2)).ok());
  }

  // The third upload: the manifest and the first chunks, then the server
  // dies while the stream is open.
  {
    auto stub = v1::Checkpoint::NewStub(MakeChannel(address));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(30)));
    v1::CheckpointInfo info;
    auto writer = stub->Upload(&ctx, &info);
    v1::UploadChunk msg;
    *msg.mutable_manifest() = MakeManifest("e2e", 3, r3);
    ASSERT_TRUE(writer->Write(msg));
    const std::string l0 = r3[0].str();
    for (size_t off = 0; off < l0.size() / 2; off += kChunkBytes / 4) {
      auto* c = msg.mutable_data();
      c->set_layer(0);
      c->set_offset(off);
      c->set_data(l0.substr(off, kChunkBytes / 4));
      c->set_crc32c(Crc32c(c->data().data(), c->data().size()));
      ASSERT_TRUE(writer->Write(msg));
    }
    // The server has written part of it to tmp/.
    ASSERT_TRUE(WaitUntil([&] { return testing::CountTmp(data_dir()) > 0; }, absl::Seconds(10)));
    server_->Signal(SIGKILL);
    EXPECT_EQ(server_->Wait(absl::Seconds(10)), 128 + SIGKILL);
    EXPECT_FALSE(writer->Finish().ok());
  }
  EXPECT_GT(testing::CountTmp(data_dir()), 0u);  // the partial upload is on disk

  address = StartServer();
  ASSERT_FALSE(address.empty());
  EXPECT_EQ(CountEntries(data_dir() + "/tmp"), 0u);
  GrpcCheckpointClient client(address);
  auto list = client.List("");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].id(), "e2e-r2");
  EXPECT_EQ((*list)[1].id(), "e2e-r1");
  EXPECT_TRUE(absl::IsNotFound(client.GetManifest("e2e-r3").status()));
  for (const auto& [id, model] : {std::pair{"e2e-r1", &r1}, std::pair{"e2e-r2", &r2}}) {
    auto m = client.GetManifest(id);
    ASSERT_TRUE(m.ok()) << m.status();
    for (uint32_t i = 0; i < model->size(); ++i) {
      std::vector<uint8_t> bytes;
      ASSERT_TRUE(ReadWholeLayer(&client, id, *m, i, &bytes).ok());
      EXPECT_EQ(std::string(bytes.begin(), bytes.end()), (*model)[i].str()) << id << " " << i;
    }
  }
  // The restarted server still takes uploads; SIGTERM stops it cleanly.
  ASSERT_TRUE(client.Upload(MakeManifest("e2e", 3, r3), Spans(r3)).ok());
  EXPECT_EQ(server_->Stop(), 0) << server_->Log();
}

TEST_F(CheckpointE2eTest, ShoalctlListsShowsDeletesAndExportsForTorch) {
  const std::string address = StartServer({"--retain=2"});
  ASSERT_FALSE(address.empty());
  const std::vector<TestLayer> model = Model(4);
  {
    GrpcCheckpointClient client(address);
    for (int r = 1; r <= 3; ++r) {
      ASSERT_TRUE(client.Upload(MakeManifest("run-x", r, model), Spans(model)).ok());
    }
  }
  const std::string store = "--store=" + address;
  std::string out, err;

  // list: retention kept rounds 3 and 2; JSON that Python parses.
  ASSERT_EQ(Ctl({"list", store}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("run-x-r3"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("run-x-r1")));
  ASSERT_EQ(Ctl({"list", store, "--json", "--run_id=run-x"}, &out, &err), 0) << err;
  const std::string json_path = dir_.path() + "/list.json";
  std::ofstream(json_path) << out;
  int code = -1;
  std::string py =
      RunShell(absl::StrCat(kPython,
                            " -c 'import json,sys; a=json.load(open(sys.argv[1])); "
                            "print(len(a), a[0][\"id\"], a[0][\"run_id\"], a[0][\"round\"], "
                            "a[0][\"bytes\"], a[0][\"created\"][:2])' ",
                            json_path),
               &code);
  ASSERT_EQ(code, 0) << py << out;
  uint64_t total = 0;
  for (const auto& l : model) total += l.bytes();
  EXPECT_THAT(py, HasSubstr(absl::StrCat("2 run-x-r3 run-x 3 ", total, " 20")));

  // show, text and JSON.
  ASSERT_EQ(Ctl({"show", store, "--id=run-x-r3"}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("fc1.weight"));
  EXPECT_THAT(out, HasSubstr("[512, 784]"));
  EXPECT_THAT(out, HasSubstr("status      ok"));
  ASSERT_EQ(Ctl({"show", store, "--id=run-x-r3", "--json"}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("\"shape\": [512, 784]"));

  // Errors: unknown id (1), missing --id (2).
  EXPECT_EQ(Ctl({"show", store, "--id=nope"}, &out, &err), 1);
  EXPECT_THAT(err, HasSubstr("NOT_FOUND"));
  EXPECT_EQ(Ctl({"show", store}, &out, &err), 2);

  // export, then torch.load in Python compares every tensor with the bytes.
  const std::string pt = dir_.path() + "/run-x-r3.pt";
  ASSERT_EQ(Ctl({"export", store, "--id=run-x-r3", "--out=" + pt}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("4 layers"));
  // Progress on stderr (not a terminal here): a line per layer, the last at 100%.
  EXPECT_THAT(err, HasSubstr("export run-x-r3: layer '"));
  EXPECT_THAT(err, HasSubstr("(100%), done in"));
  std::cout << "export progress:\n" << err;
  if (!PythonHasTorch()) {
    GTEST_SKIP() << kPython << " cannot import torch (apt-get install python3-torch)";
  }
  std::vector<std::string> checks;
  for (size_t i = 0; i < model.size(); ++i) {
    const std::string raw = absl::StrCat(dir_.path(), "/layer-", i, ".bin");
    std::ofstream(raw, std::ios::binary) << model[i].str();
    checks.push_back(absl::StrCat("('", model[i].name, "', [", absl::StrJoin(model[i].shape, ","),
                                  "], '", raw, "')"));
  }
  const std::string script_path = dir_.path() + "/check.py";
  std::ofstream(script_path) << "import sys, torch\n"
                             << "d = torch.load(sys.argv[1])\n"
                             << "expected = [" << absl::StrJoin(checks, ", ") << "]\n"
                             << "assert isinstance(d, dict), type(d)\n"
                             << "assert list(d.keys()) == [n for n, _, _ in expected], list(d)\n"
                             << "for name, shape, raw in expected:\n"
                             << "    t = d[name]\n"
                             << "    assert t.dtype == torch.float32, (name, t.dtype)\n"
                             << "    assert list(t.shape) == shape, (name, t.shape)\n"
                             << "    want = torch.frombuffer(bytearray(open(raw, 'rb').read()),"
                             << " dtype=torch.float32).reshape(shape)\n"
                             << "    assert torch.equal(t, want), name\n"
                             << "print('torch.load OK', len(d))\n";
  py = RunShell(absl::StrCat(kPython, " ", script_path, " ", pt), &code);
  EXPECT_EQ(code, 0) << py;
  EXPECT_THAT(py, HasSubstr("torch.load OK 4"));

  // delete.
  ASSERT_EQ(Ctl({"delete", store, "--id=run-x-r2"}, &out, &err), 0) << err;
  ASSERT_EQ(Ctl({"list", store, "--json"}, &out, &err), 0) << err;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("run-x-r2")));
  EXPECT_EQ(Ctl({"delete", store, "--id=run-x-r2"}, &out, &err), 1);
}

// The same through the shoalctl binary.
TEST_F(CheckpointE2eTest, ShoalctlBinaryRunsCheckpointsCommands) {
  int code = -1;
  const std::string shoalctl = BinDir() + "/shoalctl";
  std::string out = RunShell(shoalctl + " help checkpoints", &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("checkpoints export"));
  const std::string address = StartServer();
  ASSERT_FALSE(address.empty());
  const std::vector<TestLayer> model = Model(5);
  GrpcCheckpointClient client(address);
  ASSERT_TRUE(client.Upload(MakeManifest("bin", 1, model), Spans(model)).ok());
  out = RunShell(absl::StrCat(shoalctl, " checkpoints list --store=", address, " --json"), &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("\"id\": \"bin-r1\""));
  const std::string pt = dir_.path() + "/bin.pt";
  out = RunShell(
      absl::StrCat(shoalctl, " checkpoints export --store=", address, " --id=bin-r1 --out=", pt),
      &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(std::filesystem::exists(pt));
}

TEST_F(CheckpointE2eTest, StartupErrorsAreClear) {
  // Processes (stopped by PID when the test ends), so that a server that
  // wrongly starts cannot hang the test.
  auto no_dir = Process::Start({BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0"},
                               dir_.path() + "/no-dir.log");
  EXPECT_EQ(no_dir->Wait(absl::Seconds(20)), 2);
  EXPECT_THAT(no_dir->Log(), HasSubstr("--data_dir is required"));
  // A second server on the same directory is refused.
  ASSERT_FALSE(StartServer().empty());
  auto second = Process::Start(
      {BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0", "--data_dir=" + data_dir()},
      dir_.path() + "/second.log");
  EXPECT_EQ(second->Wait(absl::Seconds(20)), 2);
  EXPECT_THAT(second->Log(), HasSubstr("in use by another checkpoint store"));
}

}  // namespace
}  // namespace shoal::checkpoint
