// A real Prometheus server (Debian's `prometheus`) scrapes the coordinator,
// two workers and the checkpoint store of a small run on 127.0.0.1 (issue 15):
// the run's series reach its HTTP API within 30 s.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "common/tls.h"
#include "tests/e2e/cluster_fixture.h"
#include "tests/support/http_get.h"

namespace shoal {
namespace {

using ::shoal::testing::HttpGet;
using ::shoal::testing::HttpsExchange;

constexpr char kPrometheus[] = "/usr/bin/prometheus";

// A port that was free a moment ago (Prometheus cannot report a port 0 it
// bound; the race with another process taking it is negligible on loopback).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// "HOST:PORT" from the process's "metrics on HOST:PORT" line, or "".
std::string WaitForMetricsAddress(testing::Process* p) {
  static const std::regex kMetrics("metrics on ([0-9.]+:[0-9]+)");
  std::string address;
  WaitUntil(
      [&] {
        std::smatch m;
        const std::string log = p->Log();
        if (std::regex_search(log, m, kMetrics)) address = m[1];
        return !address.empty() || !p->Running();
      },
      absl::Seconds(20));
  return address;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// The sample values of an instant-query answer ("value":[time,"v"]).
std::vector<double> Values(const std::string& json) {
  static const std::regex kValue("\"value\":\\[[0-9.e+]+,\"([^\"]+)\"\\]");
  std::vector<double> out;
  for (std::sregex_iterator it(json.begin(), json.end(), kValue), end; it != end; ++it) {
    out.push_back(std::stod((*it)[1]));
  }
  return out;
}

class PrometheusTest : public ClusterTest {
 protected:
  std::string Query(const std::string& promql) {
    return HttpGet(prometheus_port_, "/api/v1/query?query=" + UrlEncode(promql));
  }

  int prometheus_port_ = 0;
  std::unique_ptr<Process> store_;
  std::unique_ptr<Process> prometheus_;
};

TEST_F(PrometheusTest, ScrapesEveryServerOfARun) {
  if (access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " not installed (scripts/install-deps.sh installs it)";
  }
  store_ = Process::Start({BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0",
                           "--metrics_listen=127.0.0.1:0", "--data_dir=" + dir_.path() + "/store"},
                          dir_.path() + "/store.log");
  const std::string store = store_->WaitForListenAddress(absl::Seconds(60));
  ASSERT_FALSE(store.empty()) << store_->Log();
  const std::string addr =
      StartCoordinator({"--metrics_listen=127.0.0.1:0", "--min_participants=2", "--local_steps=5",
                        "--checkpoint_store=" + store, "--checkpoint_every=2", "--run_id=prom"});
  ASSERT_FALSE(addr.empty());
  StartWorker(addr, {"--metrics_listen=127.0.0.1:0"});
  StartWorker(addr, {"--metrics_listen=127.0.0.1:0"});

  const std::string store_metrics = WaitForMetricsAddress(store_.get());
  const std::string coordinator_metrics = WaitForMetricsAddress(coordinator_.get());
  std::vector<std::string> worker_metrics;
  for (auto& w : workers_) worker_metrics.push_back(WaitForMetricsAddress(w.get()));
  ASSERT_FALSE(store_metrics.empty()) << store_->Log();
  ASSERT_FALSE(coordinator_metrics.empty()) << Logs();
  for (const std::string& w : worker_metrics) ASSERT_FALSE(w.empty()) << Logs();

  const std::string config = dir_.path() + "/prometheus.yml";
  {
    std::ofstream out(config);
    out << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        << "scrape_configs:\n"
        << "  - job_name: coordinator\n    static_configs:\n      - targets: ['"
        << coordinator_metrics << "']\n"
        << "  - job_name: worker\n    static_configs:\n      - targets: ['"
        << absl::StrJoin(worker_metrics, "', '") << "']\n"
        << "  - job_name: checkpoint\n    static_configs:\n      - targets: ['" << store_metrics
        << "']\n";
  }
  prometheus_port_ = FreePort();
  ASSERT_GT(prometheus_port_, 0);
  const absl::Time start = absl::Now();
  prometheus_ = Process::Start(
      {kPrometheus, "--config.file=" + config, "--storage.tsdb.path=" + dir_.path() + "/tsdb",
       absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port_),
       "--storage.tsdb.retention.time=1h", "--log.level=warn"},
      dir_.path() + "/prometheus.log");

  // Every target up, the coordinator's round, and the exchange histogram
  // of both workers with at least one exchange each.
  std::string up, round, exchanges;
  const bool ok = WaitUntil(
      [&] {
        up = Query("up == 1");
        round = Query("shoal_round");
        exchanges = Query("shoal_exchange_duration_seconds_count");
        const std::vector<double> rounds = Values(round);
        const std::vector<double> counts = Values(exchanges);
        return Values(up).size() == 4 && rounds.size() == 1 && rounds[0] >= 1 &&
               counts.size() == 2 && counts[0] > 0 && counts[1] > 0;
      },
      absl::Seconds(30));
  EXPECT_TRUE(ok) << "after " << absl::Now() - start << "\nup: " << up << "\nshoal_round: " << round
                  << "\nexchanges: " << exchanges << "\n--- prometheus ---\n"
                  << prometheus_->Log() << Logs();
  EXPECT_NE(round.find("\"job\":\"coordinator\""), std::string::npos) << round;
  // The store's series are there too.
  EXPECT_FALSE(Values(Query("shoal_checkpoint_store_checkpoints")).empty());
  // What a scrape costs each server, as Prometheus measured it.
  const std::string cost = Query("scrape_duration_seconds");
  const std::string samples = Query("scrape_samples_scraped");
  std::cout << "series found after " << absl::Now() - start << "\nscrape_duration_seconds: " << cost
            << "\nscrape_samples_scraped: " << samples << "\n";
  const std::string body = HttpGet(
      std::stoi(coordinator_metrics.substr(coordinator_metrics.rfind(':') + 1)), "/metrics");
  std::cout << "coordinator /metrics: " << body.size() << " bytes\n";
  EXPECT_NE(body.find("shoal_phase{phase=\"training\"}"), std::string::npos) << body;

  // Every server says which build it runs, its process figures, and the
  // coordinator and the workers the run they serve.
  std::string build_info, rss, run_info;
  EXPECT_TRUE(WaitUntil(
      [&] {
        build_info = Query("shoal_build_info == 1");
        rss = Query("process_resident_memory_bytes > 0");
        run_info = Query("shoal_run_info{run_id=\"prom\"} == 1");
        return Values(build_info).size() == 4 && Values(rss).size() == 4 &&
               Values(run_info).size() == 3;
      },
      absl::Seconds(20)))
      << build_info << "\n"
      << rss << "\n"
      << run_info;
  for (const char* component : {"coordinator", "worker", "checkpoint"}) {
    EXPECT_NE(build_info.find(absl::StrCat("\"component\":\"", component, "\"")), std::string::npos)
        << build_info;
  }
  EXPECT_NE(build_info.find("\"commit\":\""), std::string::npos) << build_info;
  for (const char* process_metric : {"process_cpu_seconds_total", "process_open_fds",
                                     "process_threads", "process_start_time_seconds"}) {
    EXPECT_EQ(Values(Query(process_metric)).size(), 4u) << process_metric;
  }

  // Every query of the Grafana dashboard names metrics the servers export.
  std::set<std::string> exported;
  for (const std::string& address :
       std::vector<std::string>{coordinator_metrics, store_metrics, worker_metrics[0]}) {
    const std::string text = HttpGet(std::stoi(address.substr(address.rfind(':') + 1)), "/metrics");
    static const std::regex kType("# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) ([a-z]+)");
    for (std::sregex_iterator it(text.begin(), text.end(), kType), end; it != end; ++it) {
      const std::string name = (*it)[1];
      exported.insert(name);
      if ((*it)[2] == "histogram") {
        for (const char* suffix : {"_bucket", "_sum", "_count"}) exported.insert(name + suffix);
      }
    }
  }
  std::ifstream in(std::string(SHOAL_SOURCE_DIR) + "/deploy/grafana/shoal-dashboard.json");
  const std::string dashboard(std::istreambuf_iterator<char>(in), {});
  ASSERT_FALSE(dashboard.empty());
  static const std::regex kExpr("\"expr\": *\"((?:[^\"\\\\]|\\\\.)*)\"");
  static const std::regex kName("\\b(shoal_[a-z0-9_]+|process_[a-z0-9_]+)\\b");
  int queries = 0;
  for (std::sregex_iterator it(dashboard.begin(), dashboard.end(), kExpr), end; it != end; ++it) {
    ++queries;
    const std::string expr = (*it)[1];
    for (std::sregex_iterator n(expr.begin(), expr.end(), kName), nend; n != nend; ++n) {
      EXPECT_TRUE(exported.count((*n)[1])) << "the dashboard's query " << expr << " names "
                                           << (*n)[1] << ", which no server exports";
    }
  }
  EXPECT_GT(queries, 10);
}

// With TLS and a run token, every server serves /metrics over HTTPS with its
// certificate and wants the token: the real Prometheus scrapes with its
// `tls_config` and `authorization` settings, and a job without the token
// gets 401 (`up` 0).
class PrometheusSecureTest : public PrometheusTest {
 protected:
  void SetUp() override {
    PrometheusTest::SetUp();
    if (IsSkipped()) return;
    const std::string command = std::string("bash ") + SHOAL_SOURCE_DIR +
                                "/scripts/make-certs.sh " + dir_.path() +
                                "/pki 127.0.0.1 localhost >/dev/null";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    std::ofstream(dir_.path() + "/run.token") << kToken << "\n";
    auto tls = LoadTls({Pki("shoal.pem"), Pki("shoal.key"), Pki("ca.pem"), ""});
    ASSERT_TRUE(tls.ok()) << tls.status();
    // The fixture's status calls are a member's.
    SetProcessTls(*tls);
    SetProcessToken(kToken);
  }
  void TearDown() override {
    SetProcessTls(TlsConfig());
    SetProcessToken("");
  }
  std::string Pki(const std::string& file) { return dir_.path() + "/pki/" + file; }
  std::vector<std::string> Secure() {
    return {"--tls_cert=" + Pki("shoal.pem"), "--tls_key=" + Pki("shoal.key"),
            "--tls_ca=" + Pki("ca.pem"), "--token_file=" + dir_.path() + "/run.token",
            "--metrics_listen=127.0.0.1:0"};
  }
  static constexpr char kToken[] = "prometheus-run-token-0123456789";
};

TEST_F(PrometheusSecureTest, ScrapesOverTlsWithTheRunToken) {
  if (access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " not installed (scripts/install-deps.sh installs it)";
  }
  std::vector<std::string> store_argv = {BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0",
                                         "--data_dir=" + dir_.path() + "/store"};
  for (const std::string& f : Secure()) store_argv.push_back(f);
  store_ = Process::Start(store_argv, dir_.path() + "/store.log");
  ASSERT_FALSE(store_->WaitForListenAddress(absl::Seconds(60)).empty()) << store_->Log();
  std::vector<std::string> flags = {"--min_participants=1", "--local_steps=5", "--run_id=prom-tls"};
  for (const std::string& f : Secure()) flags.push_back(f);
  const std::string addr = StartCoordinator(flags);
  ASSERT_FALSE(addr.empty());
  StartWorker(addr, Secure());
  std::vector<std::string> targets = {WaitForMetricsAddress(coordinator_.get()),
                                      WaitForMetricsAddress(workers_[0].get()),
                                      WaitForMetricsAddress(store_.get())};
  for (const std::string& t : targets) ASSERT_FALSE(t.empty()) << Logs() << store_->Log();
  // Plain HTTP to an HTTPS port gets no answer.
  EXPECT_EQ(HttpGet(std::stoi(targets[0].substr(targets[0].rfind(':') + 1)), "/metrics"), "");

  const std::string config = dir_.path() + "/prometheus.yml";
  const std::string all = absl::StrJoin(targets, "', '");
  {
    std::ofstream out(config);
    out << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        << "scrape_configs:\n"
        << "  - job_name: shoal\n    scheme: https\n"
        << "    tls_config:\n      ca_file: " << Pki("ca.pem") << "\n"
        << "    authorization:\n      type: Bearer\n      credentials_file: " << dir_.path()
        << "/run.token\n"
        << "    static_configs:\n      - targets: ['" << all << "']\n"
        << "  - job_name: stranger\n    scheme: https\n"
        << "    tls_config:\n      ca_file: " << Pki("ca.pem") << "\n"
        << "    static_configs:\n      - targets: ['" << all << "']\n";
  }
  prometheus_port_ = FreePort();
  ASSERT_GT(prometheus_port_, 0);
  prometheus_ = Process::Start(
      {kPrometheus, "--config.file=" + config, "--storage.tsdb.path=" + dir_.path() + "/tsdb",
       absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port_),
       "--storage.tsdb.retention.time=1h", "--log.level=warn"},
      dir_.path() + "/prometheus.log");
  std::string up, down, build;
  const bool ok = WaitUntil(
      [&] {
        up = Query("up{job=\"shoal\"} == 1");
        down = Query("up{job=\"stranger\"} == 0");
        build = Query("shoal_build_info{job=\"shoal\"}");
        return Values(up).size() == 3 && Values(down).size() == 3 && Values(build).size() == 3;
      },
      absl::Seconds(40));
  EXPECT_TRUE(ok) << "up: " << up << "\nstranger: " << down << "\nbuild_info: " << build
                  << "\n--- prometheus ---\n"
                  << prometheus_->Log() << Logs();
  // Why the stranger's scrapes fail, as Prometheus reports it.
  const std::string targets_json = HttpGet(prometheus_port_, "/api/v1/targets");
  EXPECT_NE(targets_json.find("401"), std::string::npos) << targets_json;
}

// The coordinator's page under TLS and a token: HTTPS with the process's
// certificate, 401 and a sign-in form for a browser without the token,
// /login sets the cookie that opens the page and /api/status; a Bearer
// header opens them too.
TEST_F(PrometheusSecureTest, ThePageWantsTheTokenOverHttps) {
  std::vector<std::string> flags = {"--min_participants=1", "--local_steps=5", "--run_id=page-tls",
                                    "--http_listen=127.0.0.1:0"};
  for (const std::string& f : Secure()) flags.push_back(f);
  const std::string addr = StartCoordinator(flags);
  ASSERT_FALSE(addr.empty());
  std::smatch m;
  std::string log;
  static const std::regex kWeb("web page on https://[0-9.]+:([0-9]+)/");
  ASSERT_TRUE(WaitUntil(
      [&] {
        log = coordinator_->Log();
        return std::regex_search(log, m, kWeb);
      },
      absl::Seconds(20)))
      << log;
  const int port = std::stoi(m[1]);
  std::ifstream in(Pki("ca.pem"));
  const std::string ca((std::istreambuf_iterator<char>(in)), {});
  const auto get = [&](const std::string& path, const std::string& headers) {
    return HttpsExchange(port, ca, "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
  };
  EXPECT_EQ(HttpGet(port, "/api/status"), "") << "plain HTTP answered";
  const std::string anonymous = get("/api/status", "");
  EXPECT_EQ(anonymous.rfind("HTTP/1.1 401", 0), 0u) << anonymous;
  const std::string form = get("/", "Accept: text/html\r\n");
  EXPECT_EQ(form.rfind("HTTP/1.1 401", 0), 0u) << form;
  EXPECT_NE(form.find("action=\"/login\""), std::string::npos) << form;
  const std::string login = get(std::string("/login?token=") + kToken, "");
  EXPECT_EQ(login.rfind("HTTP/1.1 303", 0), 0u) << login;
  EXPECT_NE(login.find("; Secure"), std::string::npos) << login;
  const std::string page = get("/", std::string("Cookie: shoal_token=") + kToken + "\r\n");
  EXPECT_EQ(page.rfind("HTTP/1.1 200", 0), 0u) << page.substr(0, 300);
  const std::string status =
      get("/api/status", std::string("Authorization: Bearer ") + kToken + "\r\n");
  EXPECT_EQ(status.rfind("HTTP/1.1 200", 0), 0u) << status.substr(0, 300);
  EXPECT_NE(status.find("page-tls"), std::string::npos);
}

}  // namespace
}  // namespace shoal
