// Upload grants through the real protocol (common/upload_grant.h): a
// CheckpointServer on 127.0.0.1:0 with an upload key refuses uploads with no
// grant, a forged one, an expired one or one for another round or run
// (PERMISSION_DENIED, nothing written) and keeps serving: the coordinator's
// grant for the round goes through.
#include "common/upload_grant.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/checkpoint/checkpoint_client.h"
#include "services/checkpoint/checkpoint_server.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/support/test_support.h"

namespace shoal::checkpoint {
namespace {

using ::shoal::checkpoint::testing::CountBlobs;
using ::shoal::checkpoint::testing::MakeLayer;
using ::shoal::checkpoint::testing::MakeManifest;
using ::shoal::checkpoint::testing::TestLayer;
using ::shoal::testing::TempDir;

constexpr char kKey[] = "upload-key-0123456789abcdef";

class UploadGrantServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CheckpointServerOptions o;
    o.listen = "127.0.0.1:0";
    o.store.data_dir = dir_.path() + "/store";
    o.upload_key = kKey;
    auto server = CheckpointServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    client_ = std::make_unique<GrpcCheckpointClient>(server_->address());
  }

  absl::Status Upload(const std::string& run, uint64_t round, const std::string& grant) {
    client_->SetUploadGrant(grant);
    std::vector<ByteSpan> spans;
    for (const auto& l : layers_) spans.emplace_back(l.data(), l.bytes());
    return client_->Upload(MakeManifest(run, round, layers_), spans).status();
  }

  static std::string Grant(const std::string& key, const std::string& run, uint64_t round,
                           absl::Duration valid_for = absl::Minutes(2)) {
    return SignUploadGrant(key, UploadGrant{run, "w1", round, round, absl::Now() + valid_for});
  }

  TempDir dir_;
  std::unique_ptr<CheckpointServer> server_;
  std::unique_ptr<GrpcCheckpointClient> client_;
  std::vector<TestLayer> layers_ = {MakeLayer("fc.weight", {4, 3}, 1.f)};
};

TEST_F(UploadGrantServiceTest, OnlyTheCoordinatorsGrantForTheRoundUploads) {
  struct Case {
    const char* what;
    std::string grant;
  };
  std::string tampered = Grant(kKey, "run", 3);
  tampered.replace(tampered.find("|3|3|"), 5, "|3|9|");  // widen the rounds
  const std::vector<Case> refused = {
      {"no grant", ""},
      {"not a grant", "hello"},
      {"signed with another key", Grant("another-key-0123456789", "run", 3)},
      {"tampered", tampered},
      {"expired", Grant(kKey, "run", 3, -absl::Seconds(1))},
      {"another round", Grant(kKey, "run", 4)},
      {"another run", Grant(kKey, "other", 3)},
  };
  for (const Case& c : refused) {
    const absl::Status s = Upload("run", 3, c.grant);
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << c.what << ": " << s;
    EXPECT_EQ(s.message().find(kKey), std::string::npos) << "never echo the key";
  }
  EXPECT_EQ(CountBlobs(dir_.path() + "/store"), 0u) << "nothing written";
  auto list = client_->List("");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty());
  // The store kept serving: the right grant uploads, and reads need none.
  ASSERT_TRUE(Upload("run", 3, Grant(kKey, "run", 3)).ok());
  client_->SetUploadGrant("");
  auto m = client_->GetManifest("run-r3");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->round(), 3u);
}

}  // namespace
}  // namespace shoal::checkpoint
