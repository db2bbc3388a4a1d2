// Checkpoints in gossip mode end to end (issue 11): the real store,
// coordinator and workers on 127.0.0.1.
//  - 3 gossiping workers; the coordinator's checkpointer uploads every
//    --gossip_checkpoint_every local steps; killed with -9, another worker
//    takes the uploads over;
//  - the latest checkpoint exports to a state dict that torch.load reads,
//    whose bytes hash to the checkpoint's model hash;
//  - the run is stopped and started again against the store: the workers
//    start from the latest checkpoint (its model hash and clock), not from
//    the seed's model, and uploads go on numbered after it;
//  - with --gossip_steps the checkpointer's final model is kept.
// Waits are hang guards; nothing asserts a speed.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

class GossipCheckpointTest : public ClusterTest {
 protected:
  // The value of "key": in shoalctl's JSON (a string or a number), or "".
  static std::string JsonValue(const std::string& json, const std::string& key) {
    const std::string k = absl::StrCat("\"", key, "\": ");
    const size_t at = json.find(k);
    if (at == std::string::npos) return "";
    size_t begin = at + k.size();
    if (json[begin] == '"') {
      const size_t end = json.find('"', begin + 1);
      return json.substr(begin + 1, end - begin - 1);
    }
    size_t end = begin;
    while (end < json.size() && json[end] != ',' && json[end] != '\n' && json[end] != '}') ++end;
    return json.substr(begin, end - begin);
  }

  std::string Show(const std::string& store, const std::string& id) {
    int code = -1;
    const std::string show =
        Run(BinDir() + "/shoalctl checkpoints show --json --id=" + id + " --store=" + store, &code);
    EXPECT_EQ(code, 0) << show;
    return show;
  }
};

TEST_F(GossipCheckpointTest, CheckpointerTakeoverExportAndResume) {
  const std::string store = StartStore();
  const std::vector<std::string> flags = {"--mode=gossip",
                                          "--gossip_every=10",
                                          "--eval_every=5",
                                          "--gossip_timeout=10s",
                                          "--heartbeat_interval=500ms",
                                          "--learning_rate=0.05",
                                          "--checkpoint_store=" + store,
                                          "--gossip_checkpoint_every=50",
                                          "--run_id=gossip-ckpt"};
  std::string addr = StartCoordinator(flags);
  for (int i = 0; i < 3; ++i) StartWorker(addr);

  // At least two checkpoints by the first checkpointer.
  v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& st) {
        return st.checkpoint_round() >= 2 && !st.checkpointer().empty() &&
               st.checkpoint_worker() == st.checkpointer();
      },
      absl::Minutes(3));
  const std::string first = s.checkpointer();
  const uint64_t before_kill = s.checkpoint_round();
  EXPECT_EQ(s.checkpoint_id(), absl::StrCat("gossip-ckpt-r", before_kill));
  EXPECT_GT(s.checkpoint_clock(), 0.0);
  EXPECT_GE(s.checkpoint_steps(), 50u);
  {
    const std::string show = Show(store, s.checkpoint_id());
    EXPECT_EQ(JsonValue(show, "gossip"), "true") << show;
    EXPECT_EQ(JsonValue(show, "worker_id"), first) << show;
  }
  int code = -1;
  const std::string table = Run(BinDir() + "/shoalctl status --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(absl::StrContains(table, "checkpointer " + first)) << table;

  // The checkpointer dies: another worker takes the uploads over.
  Process* victim = WorkerById(first);
  ASSERT_NE(victim, nullptr) << Logs();
  victim->Signal(SIGKILL);
  victim->Wait(absl::Seconds(10));
  s = WaitForStatus(
      [&](const v1::RunStatus& st) {
        return !st.checkpointer().empty() && st.checkpointer() != first &&
               st.checkpoint_worker() == st.checkpointer() && st.checkpoint_round() > before_kill;
      },
      absl::Minutes(3));
  const std::string second = s.checkpointer();
  EXPECT_NE(second, first);

  // The latest checkpoint exports to a state dict PyTorch loads, holding
  // exactly the checkpoint's model bytes.
  const std::string id = s.checkpoint_id();
  const std::string show = Show(store, id);
  const std::string model_hash = JsonValue(show, "model_sha256");
  ASSERT_EQ(model_hash.size(), 64u) << show;
  EXPECT_EQ(JsonValue(show, "worker_id"), second) << show;
  const std::string pt = dir_.path() + "/gossip.pt";
  const std::string exported =
      Run(absl::StrCat(BinDir(), "/shoalctl checkpoints export --store=", store, " --id=", id,
                       " --out=", pt, " 2>&1"),
          &code);
  ASSERT_EQ(code, 0) << exported;
  EXPECT_TRUE(absl::StrContains(exported, ": 6 layers")) << exported;  // the MLP's
  const std::string loaded = Run(
      absl::StrCat("/usr/bin/python3 -c 'import hashlib, sys, torch; sd = torch.load(sys.argv[1]); "
                   "h = hashlib.sha256(); [h.update(t.contiguous().numpy().tobytes()) for t in "
                   "sd.values()]; print(len(sd), \"tensors\", h.hexdigest())' ",
                   pt, " 2>&1"),
      &code);
  ASSERT_EQ(code, 0) << loaded;
  EXPECT_TRUE(absl::StrContains(loaded, absl::StrCat("6 tensors ", model_hash))) << loaded;

  // Stop the run, then start it again against the store.
  for (auto& w : workers_) w->Stop();
  coordinator_->Stop();
  const size_t first_resumed = workers_.size();  // the logs of the resumed run's workers
  addr = StartCoordinator(flags);
  v1::RunStatus resumed;
  ASSERT_TRUE(Status(&resumed));
  ASSERT_FALSE(resumed.checkpoint_id().empty()) << coordinator_->Log();
  EXPECT_GE(resumed.checkpoint_round(), s.checkpoint_round());
  EXPECT_EQ(resumed.last_completed_round(), 0u);  // still no rounds
  const std::string from = resumed.checkpoint_id();
  const std::string from_show = Show(store, from);
  const std::string from_hash = JsonValue(from_show, "model_sha256");
  const double from_clock = std::stod(JsonValue(from_show, "gossip_clock"));
  ASSERT_GT(from_clock, 0.0) << from_show;

  for (int i = 0; i < 3; ++i) StartWorker(addr);
  s = WaitForStatus(
      [&](const v1::RunStatus& st) {
        int n = 0;
        for (const auto& w : st.workers()) n += w.gossip() && w.eval_clock() > 0;
        return n == 3 && st.checkpoint_round() > resumed.checkpoint_round();
      },
      absl::Minutes(3));
  // Every worker started from the checkpoint: loaded it from the store (its
  // model hash and clock are the checkpoint's) or took the model of a peer
  // that had (a late join from a trained peer).
  int from_store = 0;
  const std::string line = absl::StrCat("started from checkpoint ", from, " (model sha256 ");
  for (size_t i = first_resumed; i < workers_.size(); ++i) {
    const std::string log = workers_[i]->Log();
    const size_t at = log.find(line);
    if (at != std::string::npos) {
      ++from_store;
      EXPECT_EQ(log.substr(at + line.size(), 64), from_hash) << log;
      // The log prints the clock rounded to an integer, `show` with 6
      // significant digits: they agree within one.
      const size_t clock_at = log.find(", clock ", at);
      ASSERT_NE(clock_at, std::string::npos) << log;
      double logged_clock = -1;
      EXPECT_TRUE(absl::SimpleAtod(log.substr(clock_at + 8, log.find(';', clock_at) - clock_at - 8),
                                   &logged_clock))
          << log;
      EXPECT_NEAR(logged_clock, from_clock, 1.0) << log;
    } else {
      EXPECT_TRUE(absl::StrContains(log, "late join: started from")) << log;
    }
  }
  EXPECT_GE(from_store, 1) << Logs();
  printf(
      "gossip checkpoints e2e: %s uploaded %llu checkpoints, %s took over after the kill; "
      "resumed from %s (clock %.0f): %d of 3 workers loaded it from the store\n",
      first.c_str(), static_cast<unsigned long long>(before_kill), second.c_str(), from.c_str(),
      from_clock, from_store);
  // Their clocks went on from the checkpoint's, not from 0.
  for (const auto& w : s.workers()) EXPECT_GT(w.gossip_clock(), from_clock) << w.id();
  // Uploads went on, numbered after the checkpoint the run resumed from.
  EXPECT_EQ(s.checkpoint_id(), absl::StrCat("gossip-ckpt-r", s.checkpoint_round()));
  for (size_t i = first_resumed; i < workers_.size(); ++i) {
    EXPECT_EQ(workers_[i]->Stop(), 0) << workers_[i]->Log();
  }
}

// With --gossip_steps the run ends with the final average (on by default):
// both workers hold the same bits, and the checkpointer uploads that model
// before it leaves, whatever the period: here the period is never reached.
TEST_F(GossipCheckpointTest, AFiniteRunKeepsTheFinalAverage) {
  const std::string store = StartStore();
  const std::string addr = StartCoordinator(
      {"--mode=gossip", "--gossip_every=10", "--eval_every=5", "--gossip_timeout=10s",
       "--heartbeat_interval=500ms", "--gossip_steps=120", "--checkpoint_store=" + store,
       "--gossip_checkpoint_every=100000", "--run_id=gossip-final"});
  for (int i = 0; i < 2; ++i) StartWorker(addr);
  const v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& st) { return st.phase() == v1::FINISHED; }, absl::Minutes(3));
  ASSERT_GE(s.checkpoint_round(), 1u) << Logs();
  EXPECT_EQ(s.checkpoint_steps(), 120u);
  const std::string show = Show(store, s.checkpoint_id());
  EXPECT_EQ(JsonValue(show, "gossip_steps"), "120") << show;
  EXPECT_EQ(JsonValue(show, "worker_id"), s.checkpoint_worker()) << show;
  EXPECT_NE(s.final_average().find("2 final models averaged by 2 workers; hashes agree"),
            std::string::npos)
      << s.final_average() << Logs();
  ASSERT_EQ(s.workers_size(), 2);
  const std::string hash = s.workers(0).model_hash();
  EXPECT_EQ(hash.size(), 64u);
  for (const auto& w : s.workers()) {
    EXPECT_EQ(w.model_hash(), hash) << w.id();
    EXPECT_EQ(w.final_models(), 2u) << w.id();
    EXPECT_EQ(w.final_error(), "") << w.id();
  }
  EXPECT_EQ(JsonValue(show, "model_sha256"), hash) << show;
  for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(30)), 0) << w->Log();
}

// --gossip_final_average=false: each worker leaves with its own model when
// it trained its steps, and the run is finished when the last one left.
// The steps outlast a worker's start by far: a worker that finished before
// the other joined would end the run, and the other's join would be refused.
TEST_F(GossipCheckpointTest, WithoutTheFinalAverageEachWorkerLeavesWithItsOwnModel) {
  const std::string addr = StartCoordinator({"--mode=gossip", "--gossip_every=10", "--eval_every=5",
                                             "--gossip_timeout=10s", "--heartbeat_interval=500ms",
                                             "--gossip_steps=400", "--gossip_final_average=false"});
  for (int i = 0; i < 2; ++i) StartWorker(addr);
  const v1::RunStatus s = WaitForStatus(
      [](const v1::RunStatus& st) { return st.phase() == v1::FINISHED; }, absl::Minutes(3));
  ASSERT_EQ(s.phase(), v1::FINISHED) << Logs();
  EXPECT_EQ(s.final_average(), "");
  for (const auto& w : s.workers()) {
    EXPECT_EQ(w.state(), "finished") << w.id();
    EXPECT_EQ(w.final_models(), 0u) << w.id();
    EXPECT_NE(w.reason().find("finished 400 gossip steps"), std::string::npos) << w.reason();
  }
  for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(30)), 0) << w->Log();
}

}  // namespace
}  // namespace shoal
