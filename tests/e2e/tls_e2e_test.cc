// A whole run over mutual TLS (issue 14): coordinator, checkpoint store,
// workers and shoalctl as real processes with certificates from
// scripts/make-certs.sh; a worker of another CA cannot join.
#include <cstdlib>

#include "common/tls.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

class TlsRunTest : public ClusterTest {
 protected:
  void SetUp() override {
    ClusterTest::SetUp();
    if (IsSkipped()) return;
    for (const char* run : {"run", "rogue"}) {
      const std::string command = std::string("bash ") + SHOAL_SOURCE_DIR +
                                  "/scripts/make-certs.sh " + Pki(run) +
                                  " 127.0.0.1 localhost >/dev/null";
      ASSERT_EQ(std::system(command.c_str()), 0) << command;
    }
    // The fixture's status stub is a member of the run too.
    auto tls =
        LoadTls({Pki("run") + "/shoal.pem", Pki("run") + "/shoal.key", Pki("run") + "/ca.pem", ""});
    ASSERT_TRUE(tls.ok()) << tls.status();
    SetProcessTls(*tls);
  }

  void TearDown() override { SetProcessTls(TlsConfig()); }

  std::string Pki(const std::string& run) { return dir_.path() + "/pki-" + run; }

  std::vector<std::string> TlsFlags(const std::string& run) {
    return {"--tls_cert=" + Pki(run) + "/shoal.pem", "--tls_key=" + Pki(run) + "/shoal.key",
            "--tls_ca=" + Pki(run) + "/ca.pem"};
  }

  std::string TlsArgs(const std::string& run) {
    std::string out;
    for (const std::string& f : TlsFlags(run)) out += " " + f;
    return out;
  }

  std::unique_ptr<Process> store_;
};

TEST_F(TlsRunTest, ARunOverMutualTlsTrainsAndChecksEveryCaller) {
  std::vector<std::string> store_argv = {BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0",
                                         "--data_dir=" + dir_.path() + "/store"};
  for (const std::string& f : TlsFlags("run")) store_argv.push_back(f);
  store_ = Process::Start(store_argv, dir_.path() + "/store.log");
  const std::string store = store_->WaitForListenAddress(absl::Seconds(60));
  ASSERT_FALSE(store.empty()) << store_->Log();

  std::vector<std::string> flags = {"--min_participants=2", "--local_steps=20", "--rounds=4",
                                    "--checkpoint_store=" + store, "--checkpoint_every=2",
                                    "--run_id=tls-run",
                                    // both workers in the last round (checked)
                                    // however loaded the machine
                                    "--adaptive_deadline=false"};
  for (const std::string& f : TlsFlags("run")) flags.push_back(f);
  const std::string addr = StartCoordinator(flags);
  ASSERT_FALSE(addr.empty());
  StartWorker(addr, TlsFlags("run"));
  StartWorker(addr, TlsFlags("run"));
  // A worker with another run's CA and certificate: the handshake fails both
  // ways, it never joins and gives up after its connect timeout.
  std::vector<std::string> rogue = TlsFlags("rogue");
  rogue.push_back("--connect_timeout=5s");
  Process* stranger = StartWorker(addr, rogue);

  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED && s.checkpoint_round() == 4; },
      absl::Minutes(3));
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  EXPECT_EQ(status.workers_size(), 2) << status.DebugString();
  for (const auto& w : status.workers()) {
    EXPECT_EQ(w.model_round(), 4u) << w.id();
    EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
  }
  EXPECT_NE(stranger->Wait(absl::Seconds(60)), 0) << stranger->Log();

  // shoalctl with the run's certificate reads status and checkpoints...
  int code = -1;
  const std::string table =
      Run(BinDir() + "/shoalctl status --coordinator=" + addr + TlsArgs("run"), &code);
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find("FINISHED"), std::string::npos) << table;
  const std::string list =
      Run(BinDir() + "/shoalctl checkpoints list --store=" + store + TlsArgs("run"), &code);
  EXPECT_EQ(code, 0) << list;
  EXPECT_NE(list.find("tls-run-r4"), std::string::npos) << list;
  // ...and without a certificate, or in plain text, it cannot.
  Run(BinDir() + "/shoalctl status --coordinator=" + addr + " --tls_ca=" + Pki("run") +
          "/ca.pem 2>&1",
      &code);
  EXPECT_NE(code, 0);
  Run(BinDir() + "/shoalctl status --coordinator=" + addr + " 2>&1", &code);
  EXPECT_NE(code, 0);
  Run(BinDir() + "/shoalctl checkpoints list --store=" + store + " 2>&1", &code);
  EXPECT_NE(code, 0);
  store_->Signal(SIGTERM);
  store_->Wait(absl::Seconds(20));
}

TEST_F(TlsRunTest, ABadCertificateFileStopsTheBinaryAtStart) {
  std::unique_ptr<Process> p = Process::Start(
      {BinDir() + "/shoal-coordinator", "--listen=127.0.0.1:0",
       "--tls_cert=" + Pki("run") + "/shoal.pem", "--tls_key=" + Pki("rogue") + "/shoal.key"},
      dir_.path() + "/bad-key.log");
  EXPECT_EQ(p->Wait(absl::Seconds(20)), 2) << p->Log();
  EXPECT_NE(p->Log().find("is not the key of the certificate"), std::string::npos) << p->Log();
}

}  // namespace
}  // namespace shoal
