// coordinator: N simulated workers (light clients in this process speaking
// the real protocol over gRPC: Join, Session with Hello and heartbeats,
// JoinRound, ReportReady, ConnectionsReady, ReportRoundDone) run rounds
// against a real shoal-coordinator process. Measured per round: the
// coordinator's CPU-seconds (/proc/PID/stat, divided by N: the per-worker
// cost) and the wall time from the last ReportReady sent to the last
// RoundPlan delivered; GetRunStatus latency is sampled while rounds run.
// Run at --small workers (the baseline) and at --large workers.
//
//   shoal-bench-coordinator --coordinator_bin=build/bin/shoal-coordinator
//       [--small=10] [--large=1000] [--reps=3] [--rounds_small=300]
//       [--rounds_large=10] [--status_rounds=3] [--log_dir=DIR]
//
// --web_requests=K (bash bench/run.sh web): the coordinator also serves
// --http_listen (with /metrics on the same server); after the large run
// finished (its N workers still listed, the run's rounds in the history), K
// GETs of /metrics and K of /api/status back to back, and K/5 of
// /api/status 0.6 s apart (each one a fresh build: the page's JSON is
// cached for 0.5 s), each timed, sized, and the CPU they cost the
// coordinator: the schedstat of its HTTP threads (named shoal-http), where
// the status is built and rendered for the page and the scrape.
//
// The per-round CPU is taken over rounds without heartbeats or status calls;
// heartbeat cost is measured separately (idle sessions), GetRunStatus latency
// during extra rounds at the large size.
//
// --relayed=N (with --relays=R, --rounds_relayed, --relayed_reps): the
// supernode relay (docs/SUPERNODES.md "Relay"). N simulated workers behind R
// simulated supernodes: every worker Joins directly (in parallel; setup, not
// measured), then each supernode opens ONE Relay stream carrying its N/R
// members' sessions and unary calls, batched per RelayDown it receives.
// Measured the same way as the direct runs (coordinator CPU per round / N,
// rounds without heartbeats); relayed_ratio = that per-worker cost / the
// direct one at --small workers.
#include <arpa/inet.h>
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/common/bench_util.h"
#include "common/grpc_util.h"
#include "shoal/v1/coordinator.grpc.pb.h"

namespace shoal::bench {
namespace {

using shoal::v1::CoordinatorMessage;
using shoal::v1::WorkerMessage;

constexpr uint64_t kTotalElements = 1000000;
const char kHash[] = "abababababababababababababababababababababababababababababababab";

int64_t NowNs() { return absl::GetCurrentTimeNanos(); }

void AtomicMax(std::atomic<int64_t>* a, int64_t v) {
  int64_t cur = a->load();
  while (v > cur && !a->compare_exchange_weak(cur, v)) {
  }
}

// What happened in one round, across all simulated workers.
struct RoundStats {
  std::atomic<int64_t> last_ready_sent{0};
  std::atomic<int64_t> last_plan{0};
  std::atomic<int64_t> first_start{0};
  std::atomic<int> completes{0};
};

struct Run {
  int n = 0;
  pid_t coordinator = 0;
  uint64_t warmup = 2;
  uint64_t rounds = 0;         // measured rounds, after the warm-up
  uint64_t status_rounds = 0;  // then rounds with GetRunStatus sampled
  std::vector<std::unique_ptr<RoundStats>> per_round;
  std::atomic<int> errors{0};
  std::atomic<int> finished{0};
  // CPU-seconds of the coordinator when the warm-up ended and at the end.
  std::atomic<double> cpu_start{0}, cpu_end{0};
  std::atomic<int64_t> t_start{0}, t_end{0};
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> measuring{false};  // the measured rounds run (heartbeats paused)
  std::atomic<bool> polling{false};    // the status rounds run

  void Error(const std::string& what, const grpc::Status& s) {
    if (errors++ < 5) {
      std::fprintf(stderr, "coordinator bench: %s failed: %s\n", what.c_str(),
                   s.error_message().c_str());
    }
  }
};

class SimWorker;

// The worker's session: writes Hello then heartbeats, reads directives.
class Session : public grpc::ClientBidiReactor<WorkerMessage, CoordinatorMessage> {
 public:
  Session(shoal::v1::Coordinator::Stub* stub, SimWorker* owner) : owner_(owner) {
    stub->async()->Session(&ctx_, this);
    StartRead(&in_);
    StartCall();
  }
  void Write(WorkerMessage msg) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    if (writing_) {
      // Only heartbeats are queued after Hello; one pending is enough.
      if (queue_.empty()) queue_.push_back(std::move(msg));
      return;
    }
    out_ = std::move(msg);
    writing_ = true;
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    status_ = s;
    cv_.notify_all();
  }
  bool hello_sent() {
    std::lock_guard<std::mutex> lock(mu_);
    return hello_sent_;
  }
  void Cancel() { ctx_.TryCancel(); }
  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  SimWorker* const owner_;
  grpc::ClientContext ctx_;
  CoordinatorMessage in_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WorkerMessage> queue_;
  WorkerMessage out_;
  bool writing_ = false;
  bool hello_sent_ = false;
  bool done_ = false;
  grpc::Status status_;
};

class SimWorker {
 public:
  SimWorker(int index, shoal::v1::Coordinator::Stub* stub, Run* run)
      : index_(index), stub_(stub), run_(run) {}

  // Join (blocking for simplicity: done once, before anything is measured).
  bool Join() {
    shoal::v1::JoinRequest request;
    request.set_peer_address(absl::StrCat("127.0.0.1:", 10000 + index_));
    request.set_name(absl::StrCat("sim-", index_));
    shoal::v1::JoinResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(60)));
    grpc::Status s = stub_->Join(&ctx, request, &response);
    if (!s.ok()) {
      run_->Error("Join", s);
      return false;
    }
    id_ = response.worker_id();
    next_round_ = response.next_round();
    return true;
  }
  void OpenSession() {
    session_ = std::make_unique<Session>(stub_, this);
    WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(id_);
    session_->Write(std::move(hello));
  }
  bool hello_sent() { return session_->hello_sent(); }
  void JoinRound() {
    auto* call = new Call<shoal::v1::JoinRoundRequest, shoal::v1::JoinRoundResponse>();
    call->request.set_worker_id(id_);
    call->request.set_round(next_round_);
    stub_->async()->JoinRound(&call->ctx, &call->request, &call->response,
                              [this, call](grpc::Status s) {
                                if (!s.ok()) run_->Error("JoinRound", s);
                                delete call;
                              });
  }
  void Heartbeat() {
    WorkerMessage hb;
    hb.mutable_heartbeat()->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
    session_->Write(std::move(hb));
  }
  void Stop() {
    session_->Cancel();
    session_->WaitDone();
  }

  // A directive from the session.
  void On(const CoordinatorMessage& m) {
    const int64_t now = NowNs();
    if (m.has_round_start()) {
      const uint64_t r = m.round_start().round();
      RoundStats* rs = Stats(r);
      if (rs != nullptr) {
        int64_t zero = 0;
        rs->first_start.compare_exchange_strong(zero, now);
      }
      auto* call = new Call<shoal::v1::ReportReadyRequest, shoal::v1::ReportReadyResponse>();
      call->request.set_worker_id(id_);
      call->request.set_round(r);
      call->request.set_train_loss(0.5);
      call->request.set_total_elements(kTotalElements);
      if (rs != nullptr) AtomicMax(&rs->last_ready_sent, NowNs());
      stub_->async()->ReportReady(&call->ctx, &call->request, &call->response,
                                  [this, call](grpc::Status s) {
                                    if (!s.ok()) run_->Error("ReportReady", s);
                                    delete call;
                                  });
    } else if (m.has_round_plan()) {
      RoundStats* rs = Stats(m.round_plan().round());
      if (rs != nullptr) AtomicMax(&rs->last_plan, now);
      auto* call =
          new Call<shoal::v1::ConnectionsReadyRequest, shoal::v1::ConnectionsReadyResponse>();
      call->request.set_worker_id(id_);
      call->request.set_round(m.round_plan().round());
      call->request.set_attempt(m.round_plan().attempt());
      stub_->async()->ConnectionsReady(&call->ctx, &call->request, &call->response,
                                       [this, call](grpc::Status s) {
                                         if (!s.ok()) run_->Error("ConnectionsReady", s);
                                         delete call;
                                       });
    } else if (m.has_start_sharing()) {
      auto* call =
          new Call<shoal::v1::ReportRoundDoneRequest, shoal::v1::ReportRoundDoneResponse>();
      call->request.set_worker_id(id_);
      call->request.set_round(m.start_sharing().round());
      call->request.set_model_hash(kHash);
      call->request.set_exchange_seconds(0.01);
      call->request.set_train_seconds(0.1);
      stub_->async()->ReportRoundDone(&call->ctx, &call->request, &call->response,
                                      [this, call](grpc::Status s) {
                                        if (!s.ok()) run_->Error("ReportRoundDone", s);
                                        delete call;
                                      });
    } else if (m.has_round_complete()) {
      const uint64_t r = m.round_complete().round();
      RoundStats* rs = Stats(r);
      if (rs != nullptr && ++rs->completes == run_->n) {
        // Every simulated worker has seen round r complete.
        if (r == run_->warmup) {
          run_->cpu_start = ProcessCpuSeconds(run_->coordinator);
          run_->t_start = NowNs();
          run_->measuring = true;
        } else if (r == run_->warmup + run_->rounds) {
          run_->cpu_end = ProcessCpuSeconds(run_->coordinator);
          run_->t_end = NowNs();
          run_->measuring = false;
          run_->polling = true;
        } else if (r == run_->warmup + run_->rounds + run_->status_rounds) {
          run_->polling = false;
        }
      }
    } else if (m.has_run_finished() || m.has_leave_requested() || m.has_connection_fail() ||
               m.has_round_missed() || m.has_round_aborted()) {
      if (!m.has_run_finished()) {
        run_->Error(absl::StrCat("round (", m.DebugString(), ")"), grpc::Status::OK);
      }
      if (m.has_run_finished()) {
        std::lock_guard<std::mutex> lock(run_->mu);
        ++run_->finished;
        run_->cv.notify_all();
      }
    }
  }

 private:
  template <typename Req, typename Resp>
  struct Call {
    grpc::ClientContext ctx;
    Req request;
    Resp response;
    Call() { ctx.set_deadline(DeadlineIn(absl::Seconds(120))); }
  };
  RoundStats* Stats(uint64_t round) {
    if (round == 0 || round > run_->per_round.size()) return nullptr;
    return run_->per_round[round - 1].get();
  }

  const int index_;
  shoal::v1::Coordinator::Stub* const stub_;
  Run* const run_;
  std::string id_;
  uint64_t next_round_ = 0;
  std::unique_ptr<Session> session_;
};

void Session::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  hello_sent_ = true;
  writing_ = false;
  if (!ok || queue_.empty()) return;
  out_ = std::move(queue_.front());
  queue_.pop_front();
  writing_ = true;
  StartWrite(&out_);
}

void Session::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  owner_->On(in_);
  StartRead(&in_);
}

std::string WaitForAddress(const std::string& log, pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string key = "listening on ";
  while (absl::Now() < deadline) {
    std::ifstream f(log);
    std::string line;
    while (std::getline(f, line)) {
      const size_t at = line.find(key);
      if (at == std::string::npos) continue;
      std::string rest = line.substr(at + key.size());
      return rest.substr(0, rest.find(' '));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return "";
}

struct Result {
  double heartbeat_cpu = 0;    // coordinator CPU-seconds per worker-second of heartbeats
  double cpu_per_round = 0;    // coordinator CPU-seconds per round
  double ready_to_plan_s = 0;  // median over rounds
  double round_s = 0;          // wall per round (measured rounds)
  std::vector<double> status_ms;
  // --web_requests: per path, "ms p50", bytes, CPU ms per request.
  struct Web {
    std::string what;
    double ms_p50 = 0, ms_p99 = 0, bytes = 0, cpu_ms_per_request = 0;
    int requests = 0;
  };
  std::vector<Web> web;
  bool ok = false;
};

// GET http://127.0.0.1:port/path; the body size (-1 on an error or a non-200).
int64_t HttpGetSize(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char buf[65536];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.compare(0, 12, "HTTP/1.1 200") != 0 || body == std::string::npos) return -1;
  return static_cast<int64_t>(response.size() - body - 4);
}

// CPU-seconds of the process's threads named `name` (schedstat, ns).
double ThreadsCpuSeconds(pid_t pid, const std::string& name) {
  double total = 0;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat(dir, "/", e->d_name, "/comm"));
    std::string c;
    std::getline(comm, c);
    if (c != name) continue;
    std::ifstream sched(absl::StrCat(dir, "/", e->d_name, "/schedstat"));
    double ns = 0;
    sched >> ns;
    total += ns / 1e9;
  }
  closedir(d);
  return total;
}

// The --web_requests measurement (see the top of the file).
std::vector<Result::Web> MeasureWeb(pid_t coordinator, int port, int k) {
  std::vector<Result::Web> out;
  struct Case {
    std::string what, path;
    int n;
    absl::Duration gap;
  };
  for (const Case& c :
       {Case{"/metrics", "/metrics", k, absl::ZeroDuration()},
        Case{"/api/status (cached)", "/api/status", k, absl::ZeroDuration()},
        Case{"/api/status (fresh)", "/api/status", std::max(1, k / 5), absl::Milliseconds(600)},
        Case{"/api/history", "/api/history?after=0", k, absl::ZeroDuration()}}) {
    std::vector<double> ms;
    double bytes = 0;
    absl::SleepFor(absl::Milliseconds(600));  // any cached status is stale
    const double cpu0 = ThreadsCpuSeconds(coordinator, "shoal-http");
    for (int i = 0; i < c.n; ++i) {
      if (i > 0) absl::SleepFor(c.gap);
      const int64_t a = NowNs();
      const int64_t size = HttpGetSize(port, c.path);
      if (size < 0) {
        std::fprintf(stderr, "coordinator bench: GET %s failed\n", c.path.c_str());
        return {};
      }
      ms.push_back((NowNs() - a) / 1e6);
      bytes = static_cast<double>(size);
    }
    const double cpu = ThreadsCpuSeconds(coordinator, "shoal-http") - cpu0;
    out.push_back({c.what, Percentile(ms, 50), Percentile(ms, 99), bytes, cpu * 1e3 / c.n, c.n});
  }
  return out;
}

Result RunOnce(int n, uint64_t rounds, uint64_t status_rounds, const std::string& bin,
               const std::string& log_dir, int status_poll_ms, int web_requests) {
  Result result;
  Run run;
  run.n = n;
  run.rounds = rounds;
  run.status_rounds = status_rounds;
  for (uint64_t r = 0; r < run.warmup + rounds + status_rounds; ++r) {
    run.per_round.push_back(std::make_unique<RoundStats>());
  }
  const std::string log = absl::StrCat(log_dir, "/coordinator-", n, "-", NowNs(), ".log");
  std::vector<std::string> argv = {
      bin, "--listen=127.0.0.1:0", absl::StrCat("--min_participants=", n),
      absl::StrCat("--rounds=", run.warmup + rounds + status_rounds), "--round_timeout=600s",
      "--connection_timeout=300s", "--heartbeat_lease=120s", "--eval_every=1000000",
      // Every simulated worker joins before any opens its
      // session (not measured): no cap on pending joins.
      "--max_pending_joins=0"};
  if (web_requests > 0) {
    argv.push_back("--http_listen=127.0.0.1:0");
    argv.push_back("--metrics_listen=127.0.0.1:0");  // the same string: one server
    // Only the finished run's status is measured here: a loaded machine
    // must not cut slow simulated workers out of its rounds.
    argv.push_back("--adaptive_deadline=false");
  }
  Child coordinator(argv, log);
  run.coordinator = coordinator.pid();
  const std::string address = WaitForAddress(log, coordinator.pid(), absl::Seconds(30));
  if (address.empty()) {
    std::fprintf(stderr, "coordinator bench: the coordinator did not start (log: %s)\n",
                 log.c_str());
    return result;
  }
  // One connection per simulated worker, as real workers have.
  std::vector<std::unique_ptr<shoal::v1::Coordinator::Stub>> stubs;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stubs.push_back(shoal::v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
  }
  std::vector<std::unique_ptr<SimWorker>> sims;
  for (int i = 0; i < n; ++i) sims.push_back(std::make_unique<SimWorker>(i, stubs[i].get(), &run));
  // Joins in a few threads (blocking calls; not measured).
  {
    std::vector<std::thread> joiners;
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    for (int t = 0; t < 8; ++t) {
      joiners.emplace_back([&] {
        for (int i; (i = next++) < n;) {
          if (!sims[i]->Join()) failed = true;
        }
      });
    }
    for (auto& t : joiners) t.join();
    if (failed) return result;
  }
  for (auto& s : sims) s->OpenSession();
  for (auto& s : sims) {
    while (!s->hello_sent()) absl::SleepFor(absl::Milliseconds(1));
  }
  absl::SleepFor(absl::Milliseconds(200));  // the sessions are registered
  std::atomic<bool> stop{false};
  // Heartbeats every second, spread over the second like unsynchronized
  // workers; paused while the measured rounds run (the sims answer at once,
  // so at 1,000 workers a round takes about a second and at 10 a few
  // milliseconds: heartbeats per round would depend on that, not on the
  // protocol). Their cost is measured on their own below.
  std::thread heartbeats([&] {
    while (!stop) {
      for (auto& s : sims) {
        if (stop) break;
        if (!run.measuring) s->Heartbeat();
        absl::SleepFor(absl::Seconds(1) / n);
      }
    }
  });
  // Heartbeat cost: the coordinator's CPU over 3 idle seconds of sessions.
  {
    // schedstat (ns) rather than /proc/PID/stat ticks: 10 workers cost a
    // few ticks in 3 s.
    const double cpu0 = ProcessSchedSeconds(coordinator.pid());
    absl::SleepFor(absl::Seconds(3));
    result.heartbeat_cpu = (ProcessSchedSeconds(coordinator.pid()) - cpu0) / (3.0 * n);
  }
  std::thread status([&] {
    auto stub = shoal::v1::Coordinator::NewStub(MakeChannel(address));
    while (!stop) {
      if (run.polling) {
        grpc::ClientContext ctx;
        ctx.set_deadline(DeadlineIn(absl::Seconds(30)));
        shoal::v1::RunStatus st;
        const int64_t t0 = NowNs();
        grpc::Status s = stub->GetRunStatus(&ctx, shoal::v1::GetRunStatusRequest(), &st);
        if (s.ok()) result.status_ms.push_back((NowNs() - t0) / 1e6);
      }
      absl::SleepFor(absl::Milliseconds(status_poll_ms));
    }
  });
  for (auto& s : sims) s->JoinRound();
  {
    std::unique_lock<std::mutex> lock(run.mu);
    run.cv.wait_for(lock, std::chrono::seconds(900), [&] { return run.finished == n; });
  }
  stop = true;
  heartbeats.join();
  status.join();
  if (web_requests > 0 && run.finished == n) {
    std::ifstream f(log);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::smatch m;
    static const std::regex kWeb("web page on http://[0-9.]+:([0-9]+)/");
    if (std::regex_search(text, m, kWeb)) {
      result.web = MeasureWeb(coordinator.pid(), std::stoi(m[1]), web_requests);
    }
    if (result.web.empty()) {
      std::fprintf(stderr, "coordinator bench: the web measurement failed (log %s)\n", log.c_str());
      return result;
    }
  }
  for (auto& s : sims) s->Stop();
  coordinator.Terminate(absl::Seconds(10));
  if (run.finished != n || run.errors > 0 || run.t_end == 0) {
    std::fprintf(stderr,
                 "coordinator bench: run with %d workers failed (%d finished, %d errors; log %s)\n",
                 n, run.finished.load(), run.errors.load(), log.c_str());
    return result;
  }
  std::vector<double> ready_to_plan;
  for (uint64_t r = run.warmup; r < run.warmup + rounds; ++r) {
    const RoundStats& rs = *run.per_round[r];
    ready_to_plan.push_back((rs.last_plan - rs.last_ready_sent) / 1e9);
  }
  result.cpu_per_round = (run.cpu_end - run.cpu_start) / rounds;
  result.round_s = (run.t_end - run.t_start) / 1e9 / rounds;
  result.ready_to_plan_s = Median(ready_to_plan);
  result.ok = true;
  return result;
}

// One simulated supernode: one Relay stream for its members. Everything a
// RelayDown asks of its members goes back in one RelayUp.
class SimRelay : public grpc::ClientBidiReactor<shoal::v1::RelayUp, shoal::v1::RelayDown> {
 public:
  SimRelay(shoal::v1::Coordinator::Stub* stub, Run* run, std::vector<std::string> members,
           std::vector<uint64_t> next_rounds)
      : run_(run), members_(std::move(members)) {
    stub->async()->Relay(&ctx_, this);
    StartRead(&in_);
    StartCall();
    // The hello, every member's session and its JoinRound in one message
    // (handled in that order).
    shoal::v1::RelayUp up;
    up.mutable_hello()->set_worker_id(members_.front());
    for (size_t i = 0; i < members_.size(); ++i) {
      auto* s = up.add_sessions();
      s->set_worker_id(members_[i]);
      s->mutable_message()->mutable_hello()->set_worker_id(members_[i]);
      // Numbered, as a real member's is: the coordinator keeps the
      // session's directives for a resume (its cost is measured too).
      s->mutable_message()->mutable_hello()->set_session(i + 1);
      shoal::v1::JoinRoundRequest q;
      q.set_worker_id(members_[i]);
      q.set_round(next_rounds[i]);
      AddCall(&up, members_[i], "JoinRound", q);
    }
    Send(std::move(up));
  }

  void Heartbeat() {
    shoal::v1::RelayUp up;
    for (const std::string& id : members_) {
      auto* s = up.add_sessions();
      s->set_worker_id(id);
      s->mutable_message()->mutable_heartbeat()->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
    }
    Send(std::move(up));
  }
  void Stop() {
    ctx_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok || queue_.empty()) return;
    out_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    StartWrite(&out_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    On(in_);
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    if (!s.ok() && !stopping_) run_->Error("Relay stream", s);
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void set_stopping() { stopping_ = true; }

 private:
  void Send(shoal::v1::RelayUp up) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    if (writing_) {
      queue_.push_back(std::move(up));
      return;
    }
    out_ = std::move(up);
    writing_ = true;
    StartWrite(&out_);
  }

  RoundStats* Stats(uint64_t round) {
    if (round == 0 || round > run_->per_round.size()) return nullptr;
    return run_->per_round[round - 1].get();
  }

  // A relayed call: the method's name and the request's bytes.
  void AddCall(shoal::v1::RelayUp* up, const std::string& id, const char* method,
               const google::protobuf::Message& request) {
    auto* c = up->add_calls();
    c->set_call_id(next_call_++);
    c->set_worker_id(id);
    c->set_method(method);
    request.SerializeToString(c->mutable_request());
  }

  // What the members do on what came down (SimWorker::On for many ids).
  void On(const shoal::v1::RelayDown& down) {
    const int64_t now = NowNs();
    shoal::v1::RelayUp up;
    for (const auto& d : down.directives()) {
      const CoordinatorMessage& m = d.message();
      if (m.has_round_start()) {
        const uint64_t r = m.round_start().round();
        RoundStats* rs = Stats(r);
        if (rs != nullptr) {
          int64_t zero = 0;
          rs->first_start.compare_exchange_strong(zero, now);
        }
        for (const std::string& id : d.worker_ids()) {
          shoal::v1::ReportReadyRequest q;
          q.set_worker_id(id);
          q.set_round(r);
          q.set_train_loss(0.5);
          q.set_total_elements(kTotalElements);
          AddCall(&up, id, "ReportReady", q);
        }
        if (rs != nullptr) AtomicMax(&rs->last_ready_sent, NowNs());
      } else if (m.has_round_plan()) {
        RoundStats* rs = Stats(m.round_plan().round());
        if (rs != nullptr) AtomicMax(&rs->last_plan, now);
        for (const std::string& id : d.worker_ids()) {
          shoal::v1::ConnectionsReadyRequest q;
          q.set_worker_id(id);
          q.set_round(m.round_plan().round());
          q.set_attempt(m.round_plan().attempt());
          AddCall(&up, id, "ConnectionsReady", q);
        }
      } else if (m.has_start_sharing()) {
        for (const std::string& id : d.worker_ids()) {
          shoal::v1::ReportRoundDoneRequest q;
          q.set_worker_id(id);
          q.set_round(m.start_sharing().round());
          q.set_model_hash(kHash);
          q.set_exchange_seconds(0.01);
          q.set_train_seconds(0.1);
          AddCall(&up, id, "ReportRoundDone", q);
        }
      } else if (m.has_round_complete()) {
        const uint64_t r = m.round_complete().round();
        RoundStats* rs = Stats(r);
        if (rs != nullptr && (rs->completes += d.worker_ids_size()) == run_->n) {
          if (r == run_->warmup) {
            run_->cpu_start = ProcessCpuSeconds(run_->coordinator);
            run_->t_start = NowNs();
            run_->measuring = true;
          } else if (r == run_->warmup + run_->rounds) {
            run_->cpu_end = ProcessCpuSeconds(run_->coordinator);
            run_->t_end = NowNs();
            run_->measuring = false;
          }
        }
      } else if (m.has_run_finished()) {
        std::lock_guard<std::mutex> lock(run_->mu);
        run_->finished += d.worker_ids_size();
        run_->cv.notify_all();
      } else if (m.has_leave_requested() || m.has_connection_fail() || m.has_round_missed() ||
                 m.has_round_aborted()) {
        run_->Error(absl::StrCat("round (", m.DebugString(), ")"), grpc::Status::OK);
      }
    }
    for (const auto& r : down.results()) {
      if (r.code() != 0) {
        run_->Error("relayed call",
                    grpc::Status(static_cast<grpc::StatusCode>(r.code()), r.message()));
      }
    }
    for (const auto& e : down.ended()) {
      run_->Error(absl::StrCat("relayed session of ", e.worker_id()),
                  grpc::Status(static_cast<grpc::StatusCode>(e.code()), e.message()));
    }
    if (up.calls_size() > 0) Send(std::move(up));
  }

  Run* const run_;
  const std::vector<std::string> members_;
  grpc::ClientContext ctx_;
  shoal::v1::RelayDown in_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<shoal::v1::RelayUp> queue_;
  shoal::v1::RelayUp out_;
  bool writing_ = false;
  bool done_ = false;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_call_{1};
};

struct RelayedResult {
  double cpu_per_round = 0;
  double ready_to_plan_s = 0;
  double round_s = 0;
  double setup_s = 0;  // the joins (not measured)
  bool ok = false;
};

// n workers behind `relays` supernodes (see the top of the file).
RelayedResult RunRelayed(int n, int relays, uint64_t rounds, const std::string& bin,
                         const std::string& log_dir) {
  RelayedResult result;
  Run run;
  run.n = n;
  run.rounds = rounds;
  for (uint64_t r = 0; r < run.warmup + rounds; ++r) {
    run.per_round.push_back(std::make_unique<RoundStats>());
  }
  const std::string log = absl::StrCat(log_dir, "/coordinator-relayed-", n, "-", NowNs(), ".log");
  Child coordinator({bin, "--listen=127.0.0.1:0", absl::StrCat("--min_participants=", n),
                     absl::StrCat("--rounds=", run.warmup + rounds), "--round_timeout=600s",
                     "--connection_timeout=300s", "--heartbeat_lease=120s", "--eval_every=1000000",
                     absl::StrCat("--max_members=", n), "--max_pending_joins=0"},
                    log);
  run.coordinator = coordinator.pid();
  const std::string address = WaitForAddress(log, coordinator.pid(), absl::Seconds(30));
  if (address.empty()) {
    std::fprintf(stderr, "coordinator bench: the coordinator did not start (log: %s)\n",
                 log.c_str());
    return result;
  }
  // Joins: direct, in parallel over a few connections (setup).
  const int64_t setup0 = NowNs();
  std::vector<std::string> ids(n);
  std::vector<uint64_t> next_rounds(n);
  {
    constexpr int kJoiners = 16;
    std::vector<std::thread> joiners;
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    for (int t = 0; t < kJoiners; ++t) {
      joiners.emplace_back([&] {
        auto stub = shoal::v1::Coordinator::NewStub(MakeChannel(address));
        for (int i; (i = next++) < n && !failed;) {
          shoal::v1::JoinRequest request;
          request.set_peer_address(absl::StrCat("127.0.0.1:", 10000 + i));
          request.set_name(absl::StrCat("sim-", i));
          shoal::v1::JoinResponse response;
          grpc::ClientContext ctx;
          ctx.set_deadline(DeadlineIn(absl::Seconds(60)));
          grpc::Status s = stub->Join(&ctx, request, &response);
          if (!s.ok()) {
            run.Error("Join", s);
            failed = true;
            return;
          }
          ids[i] = response.worker_id();
          next_rounds[i] = response.next_round();
        }
      });
    }
    for (auto& t : joiners) t.join();
    if (failed) return result;
  }
  result.setup_s = (NowNs() - setup0) / 1e9;
  // One connection per supernode, as real supernodes have.
  std::vector<std::unique_ptr<shoal::v1::Coordinator::Stub>> stubs;
  std::vector<std::unique_ptr<SimRelay>> sims;
  for (int r = 0; r < relays; ++r) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stubs.push_back(shoal::v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
    std::vector<std::string> members;
    std::vector<uint64_t> rounds_of;
    for (int i = r; i < n; i += relays) {
      members.push_back(ids[i]);
      rounds_of.push_back(next_rounds[i]);
    }
    if (members.empty()) continue;
    sims.push_back(std::make_unique<SimRelay>(stubs.back().get(), &run, std::move(members),
                                              std::move(rounds_of)));
  }
  // Heartbeats every second from each supernode for its members, paused
  // while the measured rounds run (as in the direct runs).
  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    while (!stop) {
      for (auto& s : sims) {
        if (stop) break;
        if (!run.measuring) s->Heartbeat();
        absl::SleepFor(absl::Seconds(1) / sims.size());
      }
    }
  });
  {
    // Errors do not notify: look every second, for at most 30 minutes.
    std::unique_lock<std::mutex> lock(run.mu);
    for (int i = 0; i < 1800 && run.finished != n && run.errors == 0; ++i) {
      run.cv.wait_for(lock, std::chrono::seconds(1), [&] { return run.finished == n; });
    }
  }
  stop = true;
  heartbeats.join();
  for (auto& s : sims) s->set_stopping();
  for (auto& s : sims) s->Stop();
  coordinator.Terminate(absl::Seconds(10));
  if (run.finished != n || run.errors > 0 || run.t_end == 0) {
    std::fprintf(stderr,
                 "coordinator bench: relayed run with %d workers behind %d supernodes failed "
                 "(%d finished, %d errors; log %s)\n",
                 n, relays, run.finished.load(), run.errors.load(), log.c_str());
    return result;
  }
  std::vector<double> ready_to_plan;
  for (uint64_t r = run.warmup; r < run.warmup + rounds; ++r) {
    const RoundStats& rs = *run.per_round[r];
    ready_to_plan.push_back((rs.last_plan - rs.last_ready_sent) / 1e9);
  }
  result.cpu_per_round = (run.cpu_end - run.cpu_start) / rounds;
  result.round_s = (run.t_end - run.t_start) / 1e9 / rounds;
  result.ready_to_plan_s = Median(ready_to_plan);
  result.ok = true;
  return result;
}

int RunDriver(Flags& flags) {
  const std::string bin = flags.Str("coordinator_bin", "build/bin/shoal-coordinator");
  // Optional: another coordinator binary (e.g. built from an older commit)
  // measured the same way in the same run, reported as "other".
  const std::string proto_bin = flags.Str("proto_bin", "");
  const int small = static_cast<int>(flags.Int("small", 10));
  const int large = static_cast<int>(flags.Int("large", 1000));
  const int reps = static_cast<int>(flags.Int("reps", 3));
  const uint64_t rounds_small = flags.Int("rounds_small", 300);
  const uint64_t rounds_large = flags.Int("rounds_large", 10);
  const int status_poll_ms = static_cast<int>(flags.Int("status_poll_ms", 20));
  const uint64_t status_rounds = flags.Int("status_rounds", 3);
  const std::string log_dir = flags.Str("log_dir", "/tmp");
  const int web_requests = static_cast<int>(flags.Int("web_requests", 0));
  // The relayed run (0 = none).
  const int relayed = static_cast<int>(flags.Int("relayed", 0));
  const int relays = static_cast<int>(flags.Int("relays", 100));
  const uint64_t rounds_relayed = flags.Int("rounds_relayed", 5);
  const int relayed_reps = static_cast<int>(flags.Int("relayed_reps", 1));
  flags.CheckAllUsed();

  struct Series {
    std::vector<double> cpu_per_worker, ready_to_plan, round_s, heartbeat_us;
    std::vector<double> status_ms;
  };
  std::map<int, Series> series, proto;
  std::vector<Row> web_rows;
  for (int rep = 0; rep < reps; ++rep) {
    for (const bool is_proto : {false, true}) {
      if (is_proto && proto_bin.empty()) continue;
      for (int n : {small, large}) {
        const Result r =
            RunOnce(n, n == small ? rounds_small : rounds_large, n == small ? 0 : status_rounds,
                    is_proto ? proto_bin : bin, log_dir, status_poll_ms,
                    n == large && rep == 0 && !is_proto ? web_requests : 0);
        if (!r.ok) return 1;
        for (const Result::Web& w : r.web) {
          web_rows.push_back(
              {absl::StrCat(n, " workers: GET ", w.what), absl::StrCat(Fmt(w.ms_p50, 2), " ms"),
               absl::StrCat("p99 ", Fmt(w.ms_p99, 2), " ms, ", Fmt(w.bytes / 1024, 1),
                            " KiB, coordinator CPU ", Fmt(w.cpu_ms_per_request, 3),
                            " ms/request = ", Fmt(w.cpu_ms_per_request / 10, 3),
                            " CPU-s per 100 requests (", w.requests, " requests)")});
          std::printf(
              "web: workers=%d path=\"%s\" p50_ms=%s p99_ms=%s bytes=%.0f "
              "cpu_ms_per_request=%s requests=%d\n",
              n, w.what.c_str(), Fmt(w.ms_p50, 3).c_str(), Fmt(w.ms_p99, 3).c_str(), w.bytes,
              Fmt(w.cpu_ms_per_request, 4).c_str(), w.requests);
        }
        Series& s = is_proto ? proto[n] : series[n];
        s.cpu_per_worker.push_back(r.cpu_per_round / n);
        s.ready_to_plan.push_back(r.ready_to_plan_s);
        s.round_s.push_back(r.round_s);
        s.heartbeat_us.push_back(r.heartbeat_cpu * 1e6);
        s.status_ms.insert(s.status_ms.end(), r.status_ms.begin(), r.status_ms.end());
      }
    }
  }
  std::vector<double> relayed_cpu, relayed_ready, relayed_round, relayed_setup;
  for (int rep = 0; relayed > 0 && rep < relayed_reps; ++rep) {
    const RelayedResult r = RunRelayed(relayed, relays, rounds_relayed, bin, log_dir);
    if (!r.ok) return 1;
    relayed_cpu.push_back(r.cpu_per_round / relayed);
    relayed_ready.push_back(r.ready_to_plan_s);
    relayed_round.push_back(r.round_s);
    relayed_setup.push_back(r.setup_s);
  }
  std::vector<Row> rows = web_rows;
  for (int n : {small, large}) {
    const Series& s = series[n];
    const uint64_t rounds = n == small ? rounds_small : rounds_large;
    rows.push_back(
        {absl::StrCat(n, " workers: CPU us/worker/round"), Fmt(Median(s.cpu_per_worker) * 1e6, 1),
         absl::StrCat(
             "coordinator CPU per round / ", n, "; median of ", reps, " runs of ", rounds,
             " rounds [",
             Join(std::vector<double>(s.cpu_per_worker.begin(), s.cpu_per_worker.end()), 7), " s]",
             n == small ? "  (baseline)" : "")});
    rows.push_back({absl::StrCat(n, " workers: last ready -> last plan ms"),
                    Fmt(Median(s.ready_to_plan) * 1e3, 2),
                    absl::StrCat("per worker ", Fmt(Median(s.ready_to_plan) * 1e6 / n, 1),
                                 " us; median over runs of the per-run median")});
    rows.push_back({absl::StrCat(n, " workers: round wall ms"), Fmt(Median(s.round_s) * 1e3, 1),
                    "whole round, simulated workers answer at once"});
    rows.push_back({absl::StrCat(n, " workers: idle CPU ms/s"),
                    Fmt(Median(s.heartbeat_us) * n / 1e3, 1),
                    "3 idle seconds: sessions open, 1 heartbeat per worker per second, the "
                    "coordinator's tick (not in the per-round figure)"});
    if (!s.status_ms.empty()) {
      rows.push_back(
          {absl::StrCat(n, " workers: GetRunStatus p50/p99 ms"),
           absl::StrCat(Fmt(Percentile(s.status_ms, 50), 2), "/",
                        Fmt(Percentile(s.status_ms, 99), 2)),
           absl::StrCat(s.status_ms.size(), " calls every ", status_poll_ms, " ms during ",
                        status_rounds, " more rounds with heartbeats (not in the CPU figures)")});
    }
  }
  const double ratio = Median(series[large].cpu_per_worker) / Median(series[small].cpu_per_worker);
  const double wall_ratio =
      (Median(series[large].ready_to_plan) / large) / (Median(series[small].ready_to_plan) / small);
  const double per_heartbeat_us =
      (Median(series[large].heartbeat_us) * large - Median(series[small].heartbeat_us) * small) /
      (large - small);
  rows.push_back({"CPU per heartbeat us", Fmt(per_heartbeat_us, 1),
                  absl::StrCat("(idle CPU at ", large, " - at ", small, ") / ", large - small,
                               " heartbeats per second")});
  rows.push_back({"CPU per worker ratio", Fmt(ratio, 2),
                  absl::StrCat(large, " vs ", small, " workers (goal <= 1.5)")});
  if (!proto.empty()) {
    for (int n : {small, large}) {
      rows.push_back({absl::StrCat("other, ", n, " workers: CPU us/worker/round"),
                      Fmt(Median(proto[n].cpu_per_worker) * 1e6, 1),
                      absl::StrCat("--proto_bin; last ready -> last plan ",
                                   Fmt(Median(proto[n].ready_to_plan) * 1e3, 2), " ms")});
    }
    if (!proto[large].status_ms.empty()) {
      rows.push_back({absl::StrCat("other, ", large, " workers: GetRunStatus p50/p99 ms"),
                      absl::StrCat(Fmt(Percentile(proto[large].status_ms, 50), 2), "/",
                                   Fmt(Percentile(proto[large].status_ms, 99), 2)),
                      absl::StrCat(proto[large].status_ms.size(), " calls")});
    }
    rows.push_back(
        {"other: CPU per worker ratio",
         Fmt(Median(proto[large].cpu_per_worker) / Median(proto[small].cpu_per_worker), 2),
         absl::StrCat(large, " vs ", small, " workers")});
  }
  rows.push_back({"ready->plan per worker ratio", Fmt(wall_ratio, 2),
                  absl::StrCat(large, " vs ", small, " workers")});
  double relayed_ratio = 0;
  if (!relayed_cpu.empty()) {
    relayed_ratio = Median(relayed_cpu) / Median(series[small].cpu_per_worker);
    rows.push_back(
        {absl::StrCat(relayed, " relayed workers: CPU us/worker/round"),
         Fmt(Median(relayed_cpu) * 1e6, 1),
         absl::StrCat("behind ", relays, " supernodes (one Relay stream each); median of ",
                      relayed_reps, " runs of ", rounds_relayed, " rounds [", Join(relayed_cpu, 7),
                      " s]; joins (setup, not measured) ", Fmt(Median(relayed_setup), 1), " s")});
    rows.push_back({absl::StrCat(relayed, " relayed workers: last ready -> last plan ms"),
                    Fmt(Median(relayed_ready) * 1e3, 2), "median over runs of the per-run median"});
    rows.push_back({absl::StrCat(relayed, " relayed workers: round wall ms"),
                    Fmt(Median(relayed_round) * 1e3, 1),
                    "whole round, simulated workers answer at once"});
    rows.push_back({"relayed CPU per worker ratio", Fmt(relayed_ratio, 2),
                    absl::StrCat(relayed, " relayed vs ", small, " direct workers (goal <= 1.5)")});
  }
  PrintTable(absl::StrCat("coordinator: simulated workers against a real shoal-coordinator, ", reps,
                          " repetitions"),
             rows);
  const Series& L = series[large];
  std::printf(
      "coordinator: cpu_us_per_worker_round_%d=%s cpu_us_per_worker_round_%d=%s "
      "ready_to_plan_ms_%d=%s ready_to_plan_ms_%d=%s status_p50_ms=%s status_p99_ms=%s "
      "reps=%d cores=%d%s ratio=%s\n",
      small, Fmt(Median(series[small].cpu_per_worker) * 1e6, 1).c_str(), large,
      Fmt(Median(L.cpu_per_worker) * 1e6, 1).c_str(), small,
      Fmt(Median(series[small].ready_to_plan) * 1e3, 2).c_str(), large,
      Fmt(Median(L.ready_to_plan) * 1e3, 2).c_str(), Fmt(Percentile(L.status_ms, 50), 2).c_str(),
      Fmt(Percentile(L.status_ms, 99), 2).c_str(), reps, Cores(),
      relayed_cpu.empty() ? ""
                          : absl::StrCat(" cpu_us_per_worker_round_relayed_", relayed, "=",
                                         Fmt(Median(relayed_cpu) * 1e6, 1), " relays=", relays,
                                         " relayed_ratio=", Fmt(relayed_ratio, 3))
                                .c_str(),
      Fmt(ratio, 3).c_str());
  return 0;
}

}  // namespace
}  // namespace shoal::bench

int main(int argc, char** argv) {
  shoal::bench::Flags flags(argc, argv);
  return shoal::bench::RunDriver(flags);
}
