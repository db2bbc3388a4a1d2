// Coordinator replicas on real etcd members (Debian's etcd-server) on
// 127.0.0.1: kill -9 of the leader mid-round, a three-member etcd losing one
// member, and all of etcd stopped for 10 s. Every process (etcd members,
// coordinators, workers) is started and stopped by PID.
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "common/worker_state.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

constexpr char kEtcd[] = "/usr/bin/etcd";

// A port the kernel reports free now. etcd cannot report a port it bound
// itself (it has no "listening on :0" readback), so the members take these;
// a collision makes the member fail to start and the test retries.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

struct EtcdMember {
  std::string name;
  int client_port = 0;
  int peer_port = 0;
  std::string data_dir;
  std::unique_ptr<testing::Process> process;
  std::string client() const { return absl::StrCat("127.0.0.1:", client_port); }
};

class ReplicaTest : public ClusterTest {
 public:
  void SetUp() override {
    ClusterTest::SetUp();
    if (IsSkipped()) return;
    if (access(kEtcd, X_OK) != 0) GTEST_SKIP() << "etcd-server is not installed";
  }

  // Starts an etcd cluster of `n` members and waits until it serves.
  void StartEtcd(int n) {
    for (int i = 0; i < n; ++i) {
      EtcdMember m;
      m.name = absl::StrCat("m", i);
      m.client_port = FreePort();
      m.peer_port = FreePort();
      m.data_dir = absl::StrCat(dir_.path(), "/etcd-", i);
      etcd_.push_back(std::move(m));
    }
    for (int i = 0; i < n; ++i) StartMember(i);
    ASSERT_TRUE(WaitUntil([&] { return EtcdHealthy(); }, absl::Seconds(60)))
        << etcd_[0].process->Log();
  }

  void StartMember(int i) {
    std::vector<std::string> cluster;
    for (const EtcdMember& m : etcd_) {
      cluster.push_back(absl::StrCat(m.name, "=http://127.0.0.1:", m.peer_port));
    }
    EtcdMember& m = etcd_[i];
    const std::string client = absl::StrCat("http://", m.client());
    const std::string peer = absl::StrCat("http://127.0.0.1:", m.peer_port);
    m.process = testing::Process::Start(
        {kEtcd, "--name=" + m.name, "--data-dir=" + m.data_dir, "--listen-client-urls=" + client,
         "--advertise-client-urls=" + client, "--listen-peer-urls=" + peer,
         "--initial-advertise-peer-urls=" + peer,
         "--initial-cluster=" + absl::StrJoin(cluster, ","), "--initial-cluster-state=new",
         "--initial-cluster-token=shoal-test", "--heartbeat-interval=100",
         "--election-timeout=1000", "--log-level=warn"},
        absl::StrCat(dir_.path(), "/etcd-", i, ".log"));
  }

  bool EtcdHealthy() {
    int code = -1;
    Run(absl::StrCat("ETCDCTL_API=3 etcdctl --dial-timeout=1s --command-timeout=2s --endpoints=",
                     EtcdEndpoints(), " put /shoal-test/probe ok >/dev/null 2>&1"),
        &code);
    return code == 0;
  }

  std::string EtcdEndpoints() const {
    std::vector<std::string> e;
    for (const EtcdMember& m : etcd_) e.push_back(m.client());
    return absl::StrJoin(e, ",");
  }

  // Starts replica `i` of the coordinator; returns its address.
  std::string StartReplica(int i, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {
        BinDir() + "/shoal-coordinator", "--listen=127.0.0.1:0", "--etcd=" + EtcdEndpoints(),
        "--etcd_prefix=/shoal/e2e/", "--lease_ttl=2s", "--run_id=replica-e2e",
        "--min_participants=3", "--local_steps=20", "--eval_every=1000", "--heartbeat_lease=5s",
        // Every worker in every round (the interrupted round's participants
        // are counted): no adaptive deadline leaves a loaded worker out.
        "--adaptive_deadline=false"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (static_cast<int>(replicas_.size()) <= i) replicas_.resize(i + 1);
    replicas_[i] = testing::Process::Start(
        argv, absl::StrCat(dir_.path(), "/replica-", i, "-", ++replica_starts_, ".log"));
    const std::string address = replicas_[i]->WaitForListenAddress(absl::Seconds(60));
    EXPECT_FALSE(address.empty()) << replicas_[i]->Log();
    if (static_cast<int>(addresses_.size()) <= i) addresses_.resize(i + 1);
    addresses_[i] = address;
    return address;
  }

  void KillTheLeaderMidRound(const std::vector<std::string>& flags);

  bool StatusOf(int i, v1::RunStatus* status) {
    if (!replicas_[i] || !replicas_[i]->Running()) return false;
    auto stub = v1::Coordinator::NewStub(MakeChannel(addresses_[i]));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(3)));
    return stub->GetRunStatus(&ctx, v1::GetRunStatusRequest(), status).ok();
  }

  // Index of the replica whose status says it leads (-1 when none); counts
  // the leaders seen in `leaders`.
  int Leader(int* leaders = nullptr) {
    int found = -1;
    int n = 0;
    for (int i = 0; i < static_cast<int>(replicas_.size()); ++i) {
      v1::RunStatus s;
      if (StatusOf(i, &s) && s.replica_role() == "leader") {
        found = i;
        ++n;
      }
    }
    if (leaders != nullptr) *leaders = n;
    return found;
  }

  std::string Coordinators() const { return absl::StrJoin(addresses_, ","); }

  // Waits for the leader's last completed round to reach `round` with every
  // live worker agreeing; returns the leader's status.
  v1::RunStatus WaitForRound(uint64_t round, absl::Duration timeout, int* leader_out = nullptr) {
    v1::RunStatus status;
    int leader = -1;
    const bool ok = WaitUntil(
        [&] {
          leader = Leader();
          if (leader < 0 || !StatusOf(leader, &status)) return false;
          size_t agreeing = 0;
          for (const auto& w : status.workers()) {
            agreeing += w.model_round() == status.last_completed_round() &&
                        w.model_hash() == status.model_hash();
          }
          return status.last_completed_round() >= round && agreeing >= 3;
        },
        timeout);
    EXPECT_TRUE(ok) << "round " << round << " not reached; last status:\n"
                    << status.DebugString() << ReplicaLogs();
    if (leader_out != nullptr) *leader_out = leader;
    return status;
  }

  std::string ReplicaLogs() {
    std::string out;
    for (auto& r : replicas_) {
      if (r) out += "\n--- " + r->log_path() + " ---\n" + r->Log();
    }
    for (auto& m : etcd_) {
      if (m.process) out += "\n--- " + m.process->log_path() + " ---\n" + m.process->Log();
    }
    return out + Logs();
  }

  // Round the replica resumed after when it became the leader (its log).
  static int64_t ResumedAfter(const std::string& log) {
    static const std::regex kResumed("leader: resuming run \\S+ after round ([0-9]+)");
    std::smatch m;
    int64_t round = -1;
    std::string rest = log;
    while (std::regex_search(rest, m, kResumed)) {
      (void)absl::SimpleAtoi(std::string(m[1]), &round);
      rest = m.suffix();
    }
    return round;
  }

  void TearDown() override {
    for (auto& w : workers_) w->Stop();
    for (auto& r : replicas_) {
      if (r) r->Stop();
    }
    for (auto& m : etcd_) {
      if (m.process) m.process->Stop();
    }
  }

  std::vector<EtcdMember> etcd_;
  std::vector<std::unique_ptr<testing::Process>> replicas_;
  std::vector<std::string> addresses_;
  int replica_starts_ = 0;
};

// Found by the soak (issue 30): a coordinator with --token_file sent the run
// token to etcd too (every channel carried it as `authorization`), etcd
// refused each call with "invalid auth token", and no replica ever led.
// The run token now stays on Shoal's channels.
TEST_F(ReplicaTest, RunTokenStaysOffTheEtcdChannel) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(1));
  const std::string token_file = dir_.path() + "/run.token";
  const std::string token = "soak-regression-token-0123456789abcdef";
  std::ofstream(token_file) << token << "\n";
  StartReplica(0, {"--token_file=" + token_file});
  auto status = [&](v1::RunStatus* s) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(addresses_[0]));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(3)));
    ctx.AddMetadata(kAuthMetadataKey, std::string(kBearerPrefix) + token);
    return stub->GetRunStatus(&ctx, v1::GetRunStatusRequest(), s).ok();
  };
  v1::RunStatus s;
  ASSERT_TRUE(
      WaitUntil([&] { return status(&s) && s.replica_role() == "leader"; }, absl::Seconds(60)))
      << s.DebugString() << ReplicaLogs();
  // Workers holding the token train a round under it.
  for (int i = 0; i < 3; ++i) StartWorker(addresses_[0], {"--token_file=" + token_file});
  EXPECT_TRUE(
      WaitUntil([&] { return status(&s) && s.last_completed_round() >= 1; }, absl::Seconds(180)))
      << s.DebugString() << ReplicaLogs() << Logs();
}

// The leader killed while a round trains: the standby takes the run over
// and completes the round from the work trained before the kill. `flags`
// are the run's (both replicas).
void ReplicaTest::KillTheLeaderMidRound(const std::vector<std::string>& flags) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(1));
  // Rounds long enough that the kill below lands in the training of the
  // round under way.
  std::vector<std::string> run = {"--local_steps=200"};
  run.insert(run.end(), flags.begin(), flags.end());
  StartReplica(0, run);
  StartReplica(1, run);
  ASSERT_TRUE(WaitUntil([&] { return Leader() >= 0; }, absl::Seconds(30))) << ReplicaLogs();
  int leaders = 0;
  const int first = Leader(&leaders);
  EXPECT_EQ(leaders, 1);
  // The standby refuses the worker protocol and names the leader.
  {
    const int standby = 1 - first;
    v1::RunStatus s;
    ASSERT_TRUE(StatusOf(standby, &s));
    EXPECT_EQ(s.replica_role(), "standby");
    EXPECT_EQ(s.leader(), addresses_[first]);
    auto stub = v1::Coordinator::NewStub(MakeChannel(addresses_[standby]));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(absl::Seconds(3)));
    v1::JoinRequest req;
    req.set_peer_address("127.0.0.1:1");
    v1::JoinResponse resp;
    grpc::Status st = stub->Join(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
    auto hint = ctx.GetServerTrailingMetadata().find("shoal-leader");
    ASSERT_NE(hint, ctx.GetServerTrailingMetadata().end());
    EXPECT_EQ(std::string(hint->second.data(), hint->second.size()), addresses_[first]);
  }
  // Workers know both replicas; the standby comes first for half of them.
  // They log each action they run (SHOAL_VERBOSE=2): the kill below waits
  // for every worker's "action train round N", not only the coordinator's
  // view of the round.
  const std::string both = Coordinators();
  const std::string reversed = absl::StrCat(addresses_[1], ",", addresses_[0]);
  setenv("SHOAL_VERBOSE", "2", 1);
  StartWorker(both);
  StartWorker(reversed);
  StartWorker(both);
  unsetenv("SHOAL_VERBOSE");
  v1::RunStatus before = WaitForRound(2, absl::Seconds(120));
  std::set<std::string> ids;
  for (const auto& w : before.workers()) ids.insert(w.id());
  ASSERT_EQ(ids.size(), 3u) << before.DebugString();
  // Mid-round: wait for the next round to be training on every worker,
  // then kill -9. The coordinator's TRAINING alone is not enough: on a
  // loaded machine a worker training ahead (--overlap) handled its
  // RoundStart more than 0.5 s later, the kill fell before it, and it had
  // no work of that round to carry (found beside the soak).
  v1::RunStatus now;
  ASSERT_TRUE(WaitUntil(
      [&] {
        if (!StatusOf(first, &now) || now.phase() != v1::TRAINING ||
            now.round() <= now.last_completed_round()) {
          return false;
        }
        const std::string training = absl::StrCat("action train round ", now.round(), "\n");
        for (auto& w : workers_) {
          if (w->Log().find(training) == std::string::npos) return false;
        }
        return true;
      },
      absl::Seconds(60)))
      << now.DebugString() << Logs();
  const uint64_t killed_at = now.last_completed_round();
  replicas_[first]->Signal(SIGKILL);
  replicas_[first]->Wait(absl::Seconds(10));
  const int second = 1 - first;
  v1::RunStatus after = WaitForRound(killed_at + 3, absl::Seconds(180));
  ASSERT_EQ(Leader(), second) << ReplicaLogs();
  // Round numbering continues with no gap or repeat: the new leader resumed
  // after the last round the record holds, and its rounds follow on.
  const int64_t resumed = ResumedAfter(replicas_[second]->Log());
  ASSERT_EQ(resumed, static_cast<int64_t>(killed_at)) << ReplicaLogs();
  ASSERT_FALSE(after.recent_rounds().empty());
  uint64_t expect = static_cast<uint64_t>(resumed) + 1;
  for (const auto& r : after.recent_rounds()) {
    EXPECT_EQ(r.round(), expect) << after.DebugString();
    expect = r.round() + 1;
  }
  // The interrupted round was completed by the new leader with every
  // worker, from the work trained before the kill: each worker re-joined
  // carrying it and its ready report was accepted without training again.
  const uint64_t interrupted = killed_at + 1;
  EXPECT_EQ(after.recent_rounds(0).round(), interrupted);
  EXPECT_EQ(after.recent_rounds(0).participants(), 3u) << after.DebugString();
  const std::string accepted =
      absl::StrCat("round ", interrupted,
                   ": ready report accepted for the work trained before the coordinator "
                   "session was lost");
  const std::string retrained = absl::StrCat("local work of round ", interrupted, " dropped");
  for (auto& w : workers_) {
    const std::string log = w->Log();
    EXPECT_NE(log.find(accepted), std::string::npos) << w->log_path() << ReplicaLogs();
    EXPECT_NE(log.find(absl::StrCat("carrying the trained work of round ", interrupted)),
              std::string::npos)
        << w->log_path();
    EXPECT_EQ(log.find(retrained), std::string::npos) << w->log_path() << ReplicaLogs();
  }
  // Same workers (ids), all holding the agreed model.
  std::set<std::string> ids_after;
  for (const auto& w : after.workers()) {
    if (!DepartedState(w.state())) ids_after.insert(w.id());
    EXPECT_EQ(w.model_hash(), after.model_hash()) << w.id();
  }
  EXPECT_EQ(ids_after, ids) << after.DebugString();
}

TEST_F(ReplicaTest, KillingTheLeaderMidRoundHandsTheRunToTheStandby) { KillTheLeaderMidRound({}); }

// The same with overlapped rounds, 4 streaming fragments, int8 and
// Nesterov (issue 27): the work carried across the failover is the
// contribution, and the agreed model stays the same on every worker.
TEST_F(ReplicaTest, TheFailoverKeepsOverlappedFragmentRounds) {
  KillTheLeaderMidRound(
      {"--overlap=on", "--fragments=4", "--codec=int8", "--outer_optimizer=nesterov"});
}

// Found by the soak (issue 30): the leader killed while a hierarchical
// int8 + Nesterov round was being shared, with a member of zone a killed
// too. The new leader re-ran the round (same number, same attempt) with
// the other zone-a member alone in its zone; a worker of zone b read the
// old plan's stage average from it before it had published the new one,
// and the run split in two models. A worker whose plan is void now
// withdraws what it published (EncodedStore::Withdraw). Every round after
// the failover completes with the three survivors on one hash.
TEST_F(ReplicaTest, TheFailoverDuringAHierarchicalExchangeKeepsOneModel) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(1));
  const std::vector<std::string> run = {"--hierarchy=on", "--codec=int8",
                                        "--outer_optimizer=nesterov", "--outer_lr=0.7"};
  StartReplica(0, run);
  StartReplica(1, run);
  ASSERT_TRUE(WaitUntil([&] { return Leader() >= 0; }, absl::Seconds(30))) << ReplicaLogs();
  const int first = Leader();
  // Upload caps stretch the exchange to about a second: the kill lands in
  // it.
  for (const std::string zone : {"a", "b", "a", "b"}) {
    StartWorker(Coordinators(), {"--zone=" + zone, "--upload_rate_mbps=6"});
  }
  WaitForRound(2, absl::Seconds(120));
  v1::RunStatus now;
  ASSERT_TRUE(WaitUntil(
      [&] {
        return StatusOf(first, &now) && now.phase() == v1::SHARING &&
               now.participants_size() == 4 &&
               now.detail().find("done sharing") != std::string::npos;
      },
      absl::Seconds(90)))
      << now.DebugString() << ReplicaLogs();
  const uint64_t killed_at = now.last_completed_round();
  replicas_[first]->Signal(SIGKILL);
  workers_[2]->Signal(SIGKILL);  // zone a keeps one member
  replicas_[first]->Wait(absl::Seconds(10));
  workers_[2]->Wait(absl::Seconds(10));
  const v1::RunStatus after = WaitForRound(killed_at + 3, absl::Seconds(240));
  ASSERT_EQ(Leader(), 1 - first) << ReplicaLogs();
  for (const auto& r : after.recent_rounds()) {
    EXPECT_GE(r.participants(), 3u) << after.DebugString();
  }
  for (int k : {0, 1, 3}) {
    const std::string log = workers_[k]->Log();
    EXPECT_EQ(log.find("completed with hash"), std::string::npos) << workers_[k]->log_path();
    EXPECT_EQ(log.find("removed from the run"), std::string::npos) << workers_[k]->log_path();
  }
  const std::string second = replicas_[1 - first]->Log();
  EXPECT_NE(second.find("hierarchical stages"), std::string::npos) << second;
  EXPECT_EQ(second.find("out of sync"), std::string::npos) << second;
}

// With --relay=on a supernode's Relay stream follows the leader as the
// workers' own client does: here every worker lists the standby first,
// which refuses the stream and names the leader (before, the stream kept
// going to the first address and the members stayed direct).
TEST_F(ReplicaTest, TheRelayStreamGoesToTheLeaderTheStandbyNames) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(1));
  // Rounds of a few hundred ms: the election settles on one head.
  StartReplica(0, {"--relay=on", "--local_steps=200"});
  StartReplica(1, {"--relay=on", "--local_steps=200"});
  ASSERT_TRUE(WaitUntil([&] { return Leader() >= 0; }, absl::Seconds(30))) << ReplicaLogs();
  const int leader = Leader();
  const std::string standby_first = absl::StrCat(addresses_[1 - leader], ",", addresses_[leader]);
  for (int i = 0; i < 3; ++i) StartWorker(standby_first, {"--zone=eu"});
  v1::RunStatus status;
  std::string head;
  const bool relayed = WaitUntil(
      [&] {
        // A completed round too: the first one measures the workers and may
        // move the head (on a loaded machine the routes settle first).
        if (!StatusOf(leader, &status) || status.workers_size() < 3 ||
            status.last_completed_round() < 1) {
          return false;
        }
        head.clear();
        for (const auto& z : status.zones()) {
          if (z.path() == "eu") head = z.supernode();
        }
        if (head.empty()) return false;
        int through = 0;
        for (const auto& w : status.workers()) through += w.relayed_by() == head ? 1 : 0;
        return through == 2;
      },
      absl::Minutes(3));
  ASSERT_TRUE(relayed) << status.DebugString() << ReplicaLogs();
  EXPECT_GE(status.last_completed_round(), 1u);
  bool named = false;
  for (auto& w : workers_) {
    named |= w->Log().find(absl::StrCat("the next Relay stream goes to ", addresses_[leader],
                                        " (the leader a standby named)")) != std::string::npos;
  }
  EXPECT_TRUE(named) << Logs();
}

TEST_F(ReplicaTest, ThreeMemberEtcdLosingOneChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(3));
  StartReplica(0);
  StartReplica(1);
  ASSERT_TRUE(WaitUntil([&] { return Leader() >= 0; }, absl::Seconds(30))) << ReplicaLogs();
  const int leader = Leader();
  for (int i = 0; i < 3; ++i) StartWorker(Coordinators());
  const v1::RunStatus before = WaitForRound(2, absl::Seconds(120));
  // The first member is the one every client talks to first.
  etcd_[0].process->Signal(SIGKILL);
  etcd_[0].process->Wait(absl::Seconds(10));
  int leader_after = -1;
  WaitForRound(before.last_completed_round() + 3, absl::Seconds(120), &leader_after);
  EXPECT_EQ(leader_after, leader) << ReplicaLogs();
  EXPECT_EQ(replicas_[leader]->Log().find("no longer the leader"), std::string::npos)
      << ReplicaLogs();
}

TEST_F(ReplicaTest, EtcdStoppedTenSecondsStopsRoundsThenTheRunContinues) {
  ASSERT_NO_FATAL_FAILURE(StartEtcd(1));
  StartReplica(0);
  StartReplica(1);
  ASSERT_TRUE(WaitUntil([&] { return Leader() >= 0; }, absl::Seconds(30))) << ReplicaLogs();
  for (int i = 0; i < 3; ++i) StartWorker(Coordinators());
  int leader = -1;
  WaitForRound(2, absl::Seconds(120), &leader);
  v1::RunStatus at_stop;
  ASSERT_TRUE(StatusOf(leader, &at_stop));
  etcd_[0].process->Signal(SIGKILL);
  etcd_[0].process->Wait(absl::Seconds(10));
  const absl::Time stopped = absl::Now();
  // Without etcd: the round under way may finish, no later round starts,
  // and there is never more than one leader.
  // round() is the current or next round: after the round in flight
  // completes it names the next one, in WAITING_FOR_MEMBERS while held.
  uint64_t started_after = 0;  // a round past the one in flight under way
  uint64_t completed = 0;
  while (absl::Now() - stopped < absl::Seconds(10)) {
    int leaders = 0;
    Leader(&leaders);
    EXPECT_LE(leaders, 1) << ReplicaLogs();
    v1::RunStatus s;
    if (StatusOf(leader, &s)) {
      completed = std::max(completed, s.last_completed_round());
      if (s.round() > at_stop.round() && s.phase() != v1::WAITING_FOR_MEMBERS) {
        started_after = std::max(started_after, s.round());
      }
    }
    absl::SleepFor(absl::Milliseconds(300));
  }
  // The round in flight at the status read may complete and the next one
  // start while SIGKILL is on its way (its record written just before); no
  // later round starts or completes in 10 s without etcd (a round takes ~2 s).
  EXPECT_LE(started_after, at_stop.round() + 1)
      << "round " << started_after << " started while etcd was down" << ReplicaLogs();
  EXPECT_LE(completed, at_stop.round() + 1) << ReplicaLogs();
  StartMember(0);  // same data directory and ports
  int leader_after = -1;
  WaitForRound(at_stop.last_completed_round() + 3, absl::Seconds(180), &leader_after);
  int leaders = 0;
  Leader(&leaders);
  EXPECT_EQ(leaders, 1);
  // Held at election (until the record is written) and again without etcd.
  const std::string log = replicas_[leader]->Log();
  EXPECT_NE(log.find("rounds held", log.find("rounds released")), std::string::npos)
      << ReplicaLogs();
}

}  // namespace
}  // namespace shoal
