// TLS on Shoal's channels (common/tls.h): certificates made by
// scripts/make-certs.sh with the real openssl, a real checkpoint service
// behind GrpcServer, real stubs through MakeChannel.
#include "common/tls.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "common/grpc_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/checkpoint/core/checkpoint_store.h"
#include "shoal/v1/checkpoint.grpc.pb.h"
#include "tests/support/test_support.h"

namespace shoal {
namespace {

using ::testing::HasSubstr;

// A CA and a certificate for `names` in `dir` (scripts/make-certs.sh).
void MakeCerts(const std::string& dir, const std::string& names) {
  const std::string script = std::string(SHOAL_SOURCE_DIR) + "/scripts/make-certs.sh";
  const std::string command = "bash " + script + " " + dir + " " + names + " >/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

TlsConfig Load(const std::string& dir, bool with_cert, bool with_ca,
               const std::string& server_name = "") {
  TlsFiles files;
  if (with_cert) {
    files.cert = dir + "/shoal.pem";
    files.key = dir + "/shoal.key";
  }
  if (with_ca) files.ca = dir + "/ca.pem";
  files.server_name = server_name;
  auto config = LoadTls(files);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : TlsConfig();
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeCerts(dir_.path() + "/run", "127.0.0.1 localhost");
    // Another run's CA and certificate: valid, but not ours.
    MakeCerts(dir_.path() + "/rogue", "127.0.0.1 localhost");
    // A certificate that names a service, not the address called.
    MakeCerts(dir_.path() + "/named", "shoal.test");
    checkpoint::StoreOptions options;
    options.data_dir = dir_.path() + "/store";
    auto store = checkpoint::CheckpointStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    service_ = std::make_unique<checkpoint::CheckpointService>(store_.get());
  }

  void Serve(const TlsConfig& tls) {
    auto server = GrpcServer::Start("127.0.0.1:0", {service_.get()}, tls);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // One List call from a client with `tls`.
  grpc::Status Call(const TlsConfig& tls) {
    auto stub = v1::Checkpoint::NewStub(MakeChannel(server_->address(), tls));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(10)));
    v1::ListCheckpointsResponse response;
    return stub->List(&ctx, v1::ListCheckpointsRequest(), &response);
  }

  std::string Dir(const std::string& name) { return dir_.path() + "/" + name; }

  testing::TempDir dir_;
  std::unique_ptr<checkpoint::CheckpointStore> store_;
  std::unique_ptr<checkpoint::CheckpointService> service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(TlsTest, ServerAuthenticatedChannelWorks) {
  Serve(Load(Dir("run"), /*with_cert=*/true, /*with_ca=*/false));
  grpc::Status s = Call(Load(Dir("run"), /*with_cert=*/false, /*with_ca=*/true));
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(TlsTest, ClientWithTheWrongCaCannotConnect) {
  Serve(Load(Dir("run"), true, true));
  grpc::Status s = Call(Load(Dir("rogue"), true, true));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // The server goes on serving its own.
  EXPECT_TRUE(Call(Load(Dir("run"), true, true)).ok());
}

TEST_F(TlsTest, MutualTlsRejectsAClientWithoutCertificate) {
  Serve(Load(Dir("run"), true, true));
  grpc::Status s = Call(Load(Dir("run"), /*with_cert=*/false, /*with_ca=*/true));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  grpc::Status ok = Call(Load(Dir("run"), true, true));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(TlsTest, MutualTlsRejectsAClientCertificateOfAnotherCa) {
  Serve(Load(Dir("run"), true, true));
  // Trusts our server, but presents the rogue run's certificate.
  TlsConfig mixed = Load(Dir("rogue"), true, false);
  mixed.ca_pem = Load(Dir("run"), false, true).ca_pem;
  grpc::Status s = Call(mixed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(TlsTest, PlainTextClientCannotTalkToATlsServer) {
  Serve(Load(Dir("run"), true, true));
  grpc::Status s = Call(TlsConfig());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(TlsTest, ServerNameOverrideChecksTheNamedService) {
  Serve(Load(Dir("named"), true, true));
  // The certificate is for shoal.test, the address called is 127.0.0.1.
  grpc::Status s = Call(Load(Dir("named"), true, true));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  grpc::Status ok = Call(Load(Dir("named"), true, true, "shoal.test"));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST(TlsLoadTest, ErrorsNameTheFileAndTheProblem) {
  testing::TempDir dir;
  MakeCerts(dir.path() + "/a", "127.0.0.1");
  MakeCerts(dir.path() + "/b", "127.0.0.1");
  const std::string a = dir.path() + "/a";
  const std::string b = dir.path() + "/b";

  auto only_cert = LoadTls({a + "/shoal.pem", "", "", ""});
  EXPECT_EQ(only_cert.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(only_cert.status().message(), HasSubstr("go together"));

  auto missing = LoadTls({a + "/nope.pem", a + "/shoal.key", "", ""});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.pem"));

  auto other_key = LoadTls({a + "/shoal.pem", b + "/shoal.key", "", ""});
  EXPECT_EQ(other_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other_key.status().message(), HasSubstr("is not the key of the certificate"));

  {
    std::ofstream junk(dir.path() + "/junk.pem");
    junk << "not a certificate\n";
  }
  auto junk = LoadTls({"", "", dir.path() + "/junk.pem", ""});
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(junk.status().message(), HasSubstr("junk.pem"));

  // A key where the CA should be: PEM, but not a certificate.
  auto key_as_ca = LoadTls({"", "", a + "/shoal.key", ""});
  EXPECT_EQ(key_as_ca.status().code(), absl::StatusCode::kInvalidArgument);

  auto name_without_tls = LoadTls({"", "", "", "shoal.test"});
  EXPECT_EQ(name_without_tls.status().code(), absl::StatusCode::kInvalidArgument);

  auto ok = LoadTls({a + "/shoal.pem", a + "/shoal.key", a + "/ca.pem", ""});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->mutual());
}

TEST(TlsLoadTest, AServerNeedsACertificate) {
  testing::TempDir dir;
  MakeCerts(dir.path(), "127.0.0.1");
  auto client_only = LoadTls({"", "", dir.path() + "/ca.pem", ""});
  ASSERT_TRUE(client_only.ok()) << client_only.status();
  auto server = GrpcServer::Start("127.0.0.1:0", {}, *client_only);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(server.status().message(), HasSubstr("--tls_cert"));
}

TEST(TlsLoadTest, LoopbackHosts) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("[::1]"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.7"));
  EXPECT_FALSE(IsLoopbackHost("[::]"));
  EXPECT_FALSE(IsLoopbackHost("shoal-coordinator"));
}

}  // namespace
}  // namespace shoal
