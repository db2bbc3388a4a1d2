// Unit tests of `shoalctl checkpoints`: argument handling, output formats
// and export, against an in-memory fake store (no sockets).
#include "tools/shoalctl/checkpoints_cmd.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/support/test_support.h"

namespace shoal::ctl {
namespace {

using ::shoal::checkpoint::ByteSpan;
using ::shoal::checkpoint::CheckpointClient;
using ::shoal::checkpoint::LayerSink;
using ::shoal::checkpoint::testing::MakeLayer;
using ::shoal::checkpoint::testing::MakeManifest;
using ::shoal::checkpoint::testing::TestLayer;
using ::testing::HasSubstr;

// An in-memory store: the test decides what it holds; it records the calls.
class FakeCheckpointClient : public CheckpointClient {
 public:
  struct Stored {
    v1::Manifest manifest;
    std::vector<std::string> layers;
    std::string damage;
  };
  std::map<std::string, Stored> checkpoints;
  std::vector<std::string> calls;

  absl::StatusOr<v1::CheckpointInfo> Upload(const v1::Manifest&,
                                            const std::vector<ByteSpan>&) override {
    return absl::UnimplementedError("not used");
  }
  absl::StatusOr<std::vector<v1::CheckpointInfo>> List(const std::string& run_id) override {
    calls.push_back("List " + run_id);
    std::vector<v1::CheckpointInfo> out;
    for (const auto& [id, c] : checkpoints) {
      if (!run_id.empty() && c.manifest.run_id() != run_id) continue;
      v1::CheckpointInfo info;
      info.set_id(id);
      info.set_run_id(c.manifest.run_id());
      info.set_round(c.manifest.round());
      info.set_created_unix_ms(c.manifest.created_unix_ms());
      for (const auto& l : c.manifest.layers()) info.set_bytes(info.bytes() + l.bytes());
      info.set_layers(c.manifest.layers_size());
      info.set_damage(c.damage);
      out.push_back(info);
    }
    return out;
  }
  absl::StatusOr<v1::Manifest> GetManifest(const std::string& id) override {
    calls.push_back("GetManifest " + id);
    auto it = checkpoints.find(id);
    if (it == checkpoints.end())
      return absl::NotFoundError(absl::StrCat("no checkpoint '", id, "'"));
    return it->second.manifest;
  }
  absl::Status ReadLayer(const std::string& id, uint32_t layer, uint64_t offset, uint64_t length,
                         const LayerSink& sink) override {
    calls.push_back(absl::StrCat("ReadLayer ", id, " ", layer));
    auto it = checkpoints.find(id);
    if (it == checkpoints.end()) return absl::NotFoundError("no checkpoint");
    const std::string& bytes = it->second.layers.at(layer);
    const uint64_t end = length == 0 ? bytes.size() : offset + length;
    for (uint64_t at = offset; at < end; at += 1000) {
      const uint64_t n = std::min<uint64_t>(1000, end - at);
      if (!sink(at, ByteSpan(reinterpret_cast<const uint8_t*>(bytes.data() + at), n))) {
        return absl::CancelledError("cancelled");
      }
    }
    return absl::OkStatus();
  }
  absl::Status Delete(const std::string& id) override {
    calls.push_back("Delete " + id);
    if (checkpoints.erase(id) == 0)
      return absl::NotFoundError(absl::StrCat("no checkpoint '", id, "'"));
    return absl::OkStatus();
  }
};

// What the command's factory hands out: forwards to the test's fake, which
// outlives the command.
class Forwarding : public CheckpointClient {
 public:
  explicit Forwarding(FakeCheckpointClient* fake) : fake_(fake) {}
  absl::StatusOr<v1::CheckpointInfo> Upload(const v1::Manifest& m,
                                            const std::vector<ByteSpan>& l) override {
    return fake_->Upload(m, l);
  }
  absl::StatusOr<std::vector<v1::CheckpointInfo>> List(const std::string& r) override {
    return fake_->List(r);
  }
  absl::StatusOr<v1::Manifest> GetManifest(const std::string& id) override {
    return fake_->GetManifest(id);
  }
  absl::Status ReadLayer(const std::string& id, uint32_t layer, uint64_t offset, uint64_t length,
                         const LayerSink& sink) override {
    return fake_->ReadLayer(id, layer, offset, length, sink);
  }
  absl::Status Delete(const std::string& id) override { return fake_->Delete(id); }

 private:
  FakeCheckpointClient* const fake_;
};

class CheckpointsCmdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::Manifest m = MakeManifest("run-1", 3, layers_);
    m.set_id("run-1-r3");
    m.set_created_unix_ms(1700000000123);
    FakeCheckpointClient::Stored s{m, {}, ""};
    for (const auto& l : layers_) s.layers.push_back(l.str());
    fake_.checkpoints["run-1-r3"] = s;
  }

  int Run(const std::vector<std::string>& args) {
    std::ostringstream out, err;
    const int code = RunCheckpointsCommand(
        args,
        [this](const std::string& store, absl::Duration timeout) {
          store_ = store;
          timeout_ = timeout;
          return std::make_unique<Forwarding>(&fake_);
        },
        out, err);
    out_ = out.str();
    err_ = err.str();
    return code;
  }

  const std::vector<TestLayer> layers_ = {MakeLayer("fc1.weight", {8, 5}, 1),
                                          MakeLayer("fc1.bias", {8}, 2)};
  FakeCheckpointClient fake_;
  std::string out_, err_, store_;
  absl::Duration timeout_;
  shoal::testing::TempDir dir_;
};

TEST_F(CheckpointsCmdTest, ListTable) {
  ASSERT_EQ(Run({"list", "--store=h:1"}), 0) << err_;
  EXPECT_EQ(store_, "h:1");
  EXPECT_EQ(timeout_, absl::Seconds(10));
  EXPECT_THAT(out_, HasSubstr("ID"));
  EXPECT_THAT(out_, HasSubstr("run-1-r3"));
  EXPECT_THAT(out_, HasSubstr("2023-11-14T22:13:20.123Z"));
  EXPECT_THAT(out_, HasSubstr(" ok"));
  fake_.checkpoints.clear();
  ASSERT_EQ(Run({"list"}), 0);
  EXPECT_EQ(store_, "127.0.0.1:50052");
  EXPECT_EQ(out_, "no checkpoints\n");
}

TEST_F(CheckpointsCmdTest, ListJson) {
  ASSERT_EQ(Run({"list", "--store=h:1", "--json", "--run_id=run-1", "--rpc_timeout=2s"}), 0)
      << err_;
  EXPECT_EQ(fake_.calls.back(), "List run-1");
  EXPECT_EQ(timeout_, absl::Seconds(2));
  EXPECT_EQ(out_,
            "[\n  {\"id\": \"run-1-r3\", \"run_id\": \"run-1\", \"round\": 3, \"created\": "
            "\"2023-11-14T22:13:20.123Z\", \"created_unix_ms\": 1700000000123, \"bytes\": 192, "
            "\"layers\": 2, \"damage\": \"\"}\n]\n");
  fake_.checkpoints.clear();
  ASSERT_EQ(Run({"list", "--json=true"}), 0);
  EXPECT_EQ(out_, "[]\n");
}

TEST_F(CheckpointsCmdTest, JsonEscapesStrings) {
  std::vector<v1::CheckpointInfo> list(1);
  list[0].set_id("a\"b\\c");
  list[0].set_damage("line\nbreak\x01");
  const std::string json = FormatCheckpointsJson(list);
  EXPECT_THAT(json, HasSubstr("\"id\": \"a\\\"b\\\\c\""));
  EXPECT_THAT(json, HasSubstr("\"damage\": \"line\\nbreak\\u0001\""));
}

TEST_F(CheckpointsCmdTest, ShowTextAndJson) {
  fake_.checkpoints["run-1-r3"].damage = "layer 'fc1.bias': blob is missing";
  ASSERT_EQ(Run({"show", "--store=h:1", "--id=run-1-r3"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("checkpoint  run-1-r3"));
  EXPECT_THAT(out_, HasSubstr("round       3"));
  EXPECT_THAT(out_, HasSubstr("model       mlp"));
  EXPECT_THAT(out_, HasSubstr("192 bytes) in 2 layers"));
  EXPECT_THAT(out_, HasSubstr("DAMAGED: layer 'fc1.bias'"));
  EXPECT_THAT(out_, HasSubstr("fc1.weight  float32  [8, 5]"));
  EXPECT_THAT(out_, HasSubstr(fake_.checkpoints["run-1-r3"].manifest.layers(0).sha256()));
  ASSERT_EQ(Run({"show", "--id=run-1-r3", "--json"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("\"id\": \"run-1-r3\""));
  EXPECT_THAT(out_,
              HasSubstr("{\"name\": \"fc1.weight\", \"dtype\": \"float32\", \"shape\": [8, 5], "
                        "\"bytes\": 160, \"sha256\": \""));
  EXPECT_THAT(out_, HasSubstr("\"damage\": \"layer 'fc1.bias': blob is missing\""));
}

TEST_F(CheckpointsCmdTest, ShowsAGossipCheckpointsMetadata) {
  v1::Manifest& m = fake_.checkpoints["run-1-r3"].manifest;
  m.set_gossip(true);
  m.set_gossip_clock(9600);
  m.set_gossip_steps(300);
  m.set_worker_id("w2");
  ASSERT_EQ(Run({"show", "--store=h:1", "--id=run-1-r3"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("sequence    3 (gossip)"));
  EXPECT_THAT(out_, HasSubstr("gossip      worker w2, clock 9600, 300 steps"));
  ASSERT_EQ(Run({"show", "--store=h:1", "--id=run-1-r3", "--json"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("\"gossip\": true, \"worker_id\": \"w2\", \"gossip_clock\": 9600, "
                              "\"gossip_steps\": 300,\n  \"layers\": ["));
}

TEST_F(CheckpointsCmdTest, DeleteAndNotFound) {
  ASSERT_EQ(Run({"delete", "--id=run-1-r3"}), 0) << err_;
  EXPECT_EQ(out_, "deleted run-1-r3\n");
  EXPECT_EQ(Run({"delete", "--id=run-1-r3"}), 1);
  EXPECT_THAT(err_, HasSubstr("NOT_FOUND"));
  EXPECT_EQ(Run({"show", "--id=nope"}), 1);
  EXPECT_THAT(err_, HasSubstr("no checkpoint 'nope'"));
}

TEST_F(CheckpointsCmdTest, UsageErrorsExitTwo) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"frobnicate"},
      {"list", "--colour=red"},
      {"list", "extra", "args"},
      {"list", "--json=maybe"},
      {"list", "--rpc_timeout=soon"},
      {"list", "--timeout=2s"},  // watch's flag
      {"list", "-o", "xml"},
      {"export", "-o", "json", "--id=run-1-r3", "--out=x.pt"},
      {"show", "a", "--id=b"},
      {"show"},
      {"delete", "--id="},
      {"export", "--id=run-1-r3"},
  };
  for (const auto& args : bad) {
    EXPECT_EQ(Run(args), 2) << ::testing::PrintToString(args);
    EXPECT_THAT(err_, HasSubstr("Run 'shoalctl help checkpoints")) << "usage named";
    EXPECT_TRUE(fake_.calls.empty()) << "no call made";
  }
  EXPECT_EQ(Run({"list", "--help"}), 0);
  EXPECT_THAT(out_, HasSubstr("--run_id=RUN"));
}

TEST_F(CheckpointsCmdTest, OperandsAndYaml) {
  ASSERT_EQ(Run({"show", "run-1-r3", "-o", "yaml"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("id: run-1-r3\nrun_id: run-1\nround: 3\n"));
  EXPECT_THAT(out_, HasSubstr("layers:\n  - name: fc1.weight\n    dtype: float32\n"));
  ASSERT_EQ(Run({"list", "-o", "yaml"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("- id: run-1-r3\n  run_id: run-1\n"));
  ASSERT_EQ(Run({"list", "-o", "wide"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("CREATED"));
}

TEST_F(CheckpointsCmdTest, ExportWritesAZipAndChecksHashes) {
  const std::string path = dir_.path() + "/out.pt";
  ASSERT_EQ(Run({"export", "--id=run-1-r3", "--out=" + path}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("exported run-1-r3: 2 layers"));
  // Progress: not a terminal, so a line per layer on stderr, the last at 100%.
  EXPECT_THAT(err_, HasSubstr("export run-1-r3: layer 'fc1.weight' done; 160 B of 192 B (83%)"));
  EXPECT_THAT(err_,
              HasSubstr("export run-1-r3: layer 'fc1.bias' done; 192 B of 192 B (100%), done in"));
  std::ifstream in(path, std::ios::binary);
  char magic[2] = {};
  in.read(magic, 2);
  EXPECT_EQ(std::string(magic, 2), "PK");  // PyTorch's zip format
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // Bytes that do not match the manifest: DATA_LOSS, no file.
  fake_.checkpoints["run-1-r3"].layers[1][3] ^= 1;
  const std::string bad = dir_.path() + "/bad.pt";
  EXPECT_EQ(Run({"export", "--id=run-1-r3", "--out=" + bad}), 1);
  EXPECT_THAT(err_, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(err_, HasSubstr("fc1.bias"));
  EXPECT_FALSE(std::filesystem::exists(bad));
}

TEST_F(CheckpointsCmdTest, ExportLeavesTheOptimizerStateOut) {
  // A checkpoint of a nesterov run: the outer momentum follows the model.
  const TestLayer momentum = MakeLayer("outer.momentum", {48}, 3);
  std::vector<TestLayer> layers = layers_;
  layers.push_back(momentum);
  v1::Manifest m = MakeManifest("run-1", 4, layers);
  m.set_id("run-1-r4");
  m.mutable_layers(2)->set_optimizer_state(true);
  FakeCheckpointClient::Stored s{m, {}, ""};
  for (const auto& l : layers) s.layers.push_back(l.str());
  fake_.checkpoints["run-1-r4"] = s;

  const std::string path = dir_.path() + "/out.pt";
  ASSERT_EQ(Run({"export", "--id=run-1-r4", "--out=" + path}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("exported run-1-r4: 2 layers"));
  for (const std::string& call : fake_.calls) EXPECT_NE(call, "ReadLayer run-1-r4 2");
  // Byte for byte the file of the same model without the momentum.
  const std::string plain = dir_.path() + "/plain.pt";
  ASSERT_EQ(Run({"export", "--id=run-1-r3", "--out=" + plain}), 0) << err_;
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(path), read(plain));

  ASSERT_EQ(Run({"show", "--id=run-1-r4"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("outer.momentum"));
  EXPECT_THAT(out_, HasSubstr("(optimizer state, not exported)"));
  ASSERT_EQ(Run({"show", "--id=run-1-r4", "--json"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("\"optimizer_state\": true}"));
}

TEST_F(CheckpointsCmdTest, ExportToAnUnwritablePathFails) {
  EXPECT_EQ(Run({"export", "--id=run-1-r3", "--out=" + dir_.path() + "/no/such/dir/x.pt"}), 1);
  EXPECT_THAT(err_, HasSubstr("cannot create"));
}

}  // namespace
}  // namespace shoal::ctl
