// Compressed exchanges and the outer optimizer (issue 16,
// docs/COMPRESSION.md) with the real binaries on 127.0.0.1: workers that
// exchange int8-encoded changes and step with Nesterov (or sparse:F ones)
// agree on the model hash every round, report their bytes on the wire, a
// late joiner takes the outer momentum with the model and agrees too, and
// a restart of the whole run from the checkpoint store resumes the stored
// momentum.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

class CompressTest : public ClusterTest {};

TEST_F(CompressTest, Int8AndNesterovAgreeEveryRound) {
  const std::string addr = StartCoordinator(
      {"--min_participants=3", "--local_steps=30", "--rounds=4", "--learning_rate=0.05",
       "--codec=int8", "--outer_optimizer=nesterov", "--outer_lr=0.7", "--outer_momentum=0.9",
       // Every worker in every round (what the counts below assert): a
       // worker slowed by a loaded machine is waited for, not left out.
       "--adaptive_deadline=false"});
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(5));
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  EXPECT_EQ(status.last_completed_round(), 4u);
  for (const auto& r : status.recent_rounds()) EXPECT_EQ(r.participants(), 3u) << Logs();
  for (const auto& w : status.workers()) {
    EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
    // int8: one byte per element and a float32 scale per 256.
    EXPECT_EQ(w.wire_round(), 4u) << w.id();
    EXPECT_GT(w.bytes_received(), 0u) << w.id();
    EXPECT_GT(w.compression_ratio(), 0.25) << w.id();
    EXPECT_LT(w.compression_ratio(), 0.26) << w.id();
  }
  // Every round, every worker logged the same hash.
  for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(20)), 0) << w->Log();
  std::map<uint64_t, std::set<std::string>> hashes;
  for (auto& w : workers_) {
    const auto mine = RoundHashes(w->Log());
    EXPECT_EQ(mine.size(), 4u) << w->Log();
    for (const auto& [round, hash] : mine) hashes[round].insert(hash);
  }
  EXPECT_EQ(hashes.size(), 4u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round;
  // Training works through the codec and the outer step.
  const auto& last = status.recent_rounds(status.recent_rounds_size() - 1);
  EXPECT_TRUE(last.evaluated());
  EXPECT_GT(last.test_accuracy(), 0.5) << Logs();

  int code = -1;
  const std::string table = Run(BinDir() + "/shoalctl status --coordinator=" + addr, &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(table.find("BYTES_IN"), std::string::npos) << table;
}

// sparse:F decodes through a DCT and an arithmetic decoder: every worker
// must still get the same bits from the same bytes.
TEST_F(CompressTest, SparseCodecAgreesEveryRound) {
  const std::string addr = StartCoordinator({"--min_participants=3", "--local_steps=20",
                                             "--rounds=3", "--learning_rate=0.05",
                                             "--codec=sparse:0.06", "--adaptive_deadline=false"});
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(5));
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  for (const auto& w : status.workers()) {
    EXPECT_EQ(w.model_hash(), status.model_hash()) << w.id();
    // About 1/80 of fp32 on the MLP's slices.
    EXPECT_GT(w.compression_ratio(), 0.0) << w.id();
    EXPECT_LT(w.compression_ratio(), 0.02) << w.id();
  }
  for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(20)), 0) << w->Log();
  std::map<uint64_t, std::set<std::string>> hashes;
  for (auto& w : workers_) {
    const auto mine = RoundHashes(w->Log());
    EXPECT_EQ(mine.size(), 3u) << w->Log();
    for (const auto& [round, hash] : mine) hashes[round].insert(hash);
  }
  EXPECT_EQ(hashes.size(), 3u);
  for (const auto& [round, set] : hashes) EXPECT_EQ(set.size(), 1u) << "round " << round;
  const auto& last = status.recent_rounds(status.recent_rounds_size() - 1);
  EXPECT_TRUE(last.evaluated());
  EXPECT_GT(last.test_accuracy(), 0.4) << Logs();
}

TEST_F(CompressTest, LateJoinerTakesTheMomentumAndAgrees) {
  const std::string addr =
      StartCoordinator({"--min_participants=2", "--local_steps=20", "--rounds=0",
                        "--learning_rate=0.05", "--codec=int8", "--outer_optimizer=nesterov"});
  StartWorker(addr);
  StartWorker(addr);
  const v1::RunStatus before = WaitForStatus(
      [](const v1::RunStatus& s) { return s.last_completed_round() >= 2; }, absl::Minutes(3));
  Process* late = StartWorker(addr);
  // Three workers complete rounds together with one hash: the joiner's
  // model and momentum are the others'.
  ExpectRoundsGoOn(before.last_completed_round(), 3, 3, absl::Minutes(4));
  EXPECT_NE(late->Log().find("outer momentum of round "), std::string::npos) << late->Log();
}

// The JSON string value of `key` in the first object of `json` that holds
// `anchor` after it ("" when absent).
std::string JsonValueAfter(const std::string& json, const std::string& anchor,
                           const std::string& key) {
  const size_t a = json.find(anchor);
  if (a == std::string::npos) return "";
  const size_t k = json.find("\"" + key + "\": \"", a);
  if (k == std::string::npos) return "";
  const size_t begin = k + key.size() + 5;
  const size_t end = json.find('"', begin);
  return end == std::string::npos ? "" : json.substr(begin, end - begin);
}

TEST_F(CompressTest, RestartFromTheStoreResumesTheMomentum) {
  auto store_proc = Process::Start({BinDir() + "/shoal-checkpoint", "--listen=127.0.0.1:0",
                                    "--data_dir=" + dir_.path() + "/store"},
                                   dir_.path() + "/store.log");
  const std::string store = store_proc->WaitForListenAddress(absl::Seconds(60));
  ASSERT_FALSE(store.empty()) << store_proc->Log();
  const std::vector<std::string> flags = {"--min_participants=3",        "--local_steps=20",
                                          "--learning_rate=0.05",        "--codec=int8",
                                          "--outer_optimizer=nesterov",  "--outer_lr=0.7",
                                          "--outer_momentum=0.9",        "--checkpoint_every=2",
                                          "--checkpoint_store=" + store, "--run_id=outer-a"};
  std::string addr = StartCoordinator(flags);
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  WaitForStatus([](const v1::RunStatus& s) { return s.checkpoint_round() >= 2; }, absl::Minutes(3));
  // Everything but the store dies.
  KillCoordinatorAndWorkers();
  workers_.clear();

  addr = StartCoordinator(flags);
  const v1::RunStatus resumed = WaitForStatus(
      [](const v1::RunStatus& s) { return s.last_completed_round() > 0; }, absl::Seconds(20));
  const uint64_t from = resumed.checkpoint_round();
  ASSERT_GE(from, 2u) << Logs();
  const std::string id = resumed.checkpoint_id();

  // The checkpoint carries the momentum as a flagged layer after the model.
  int code = -1;
  const std::string show =
      Run(BinDir() + "/shoalctl checkpoints show --json --id=" + id + " --store=" + store, &code);
  ASSERT_EQ(code, 0) << show;
  const std::string sha = JsonValueAfter(show, "\"outer.momentum\"", "sha256");
  ASSERT_EQ(sha.size(), 64u) << show;
  EXPECT_NE(show.find("\"optimizer_state\": true"), std::string::npos) << show;
  // After two Nesterov rounds the momentum is not zero.
  const std::string bytes_key = "\"bytes\": ";
  const size_t at = show.find(bytes_key, show.find("\"outer.momentum\""));
  ASSERT_NE(at, std::string::npos) << show;
  uint64_t bytes = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      show.substr(at + bytes_key.size(), show.find(',', at) - at - bytes_key.size()), &bytes));
  const std::string zeros(bytes, '\0');
  EXPECT_NE(sha, Sha256Hex(zeros.data(), zeros.size())) << show;

  // Export writes the model alone.
  const std::string out = dir_.path() + "/model.pt";
  const std::string exported = Run(
      BinDir() + "/shoalctl checkpoints export --id=" + id + " --out=" + out + " --store=" + store,
      &code);
  EXPECT_EQ(code, 0) << exported;
  EXPECT_NE(exported.find(": 6 layers"), std::string::npos) << exported;  // the MLP's

  for (int i = 0; i < 3; ++i) StartWorker(addr);
  const v1::RunStatus after = ExpectRoundsGoOn(from, 3, 3, absl::Minutes(4));
  for (const auto& r : after.recent_rounds()) EXPECT_GT(r.round(), from);

  // Every worker resumed with the stored momentum: loaded from the store
  // (its SHA-256 is the checkpoint's) or pulled from a worker that did.
  int loaded = 0;
  for (auto& w : workers_) {
    const std::string log = w->Log();
    const std::string from_store =
        absl::StrCat("outer momentum of round ", from, " loaded from checkpoint ", id, " (sha256 ");
    const size_t l = log.find(from_store);
    if (l != std::string::npos) {
      ++loaded;
      EXPECT_EQ(log.substr(l + from_store.size(), 64), sha) << log;
    } else {
      EXPECT_NE(log.find(absl::StrCat("outer momentum of round ", from, " pulled from ")),
                std::string::npos)
          << log;
    }
    EXPECT_EQ(log.find("no outer momentum"), std::string::npos) << log;
  }
  EXPECT_GE(loaded, 1) << Logs();
  // Every round after the restart, the workers that logged it agree.
  std::map<uint64_t, std::set<std::string>> hashes;
  for (auto& w : workers_) {
    for (const auto& [round, hash] : RoundHashes(w->Log())) hashes[round].insert(hash);
  }
  EXPECT_GE(hashes.size(), 3u);
  for (const auto& [round, set] : hashes) {
    EXPECT_GT(round, from);
    EXPECT_EQ(set.size(), 1u) << "round " << round;
  }
  coordinator_->Stop();
  for (auto& w : workers_) w->Stop();
  store_proc->Stop();
}

// --data_split=label_skew:ALPHA: the coordinator accepts it, the run
// trains, and the workers' shards (as each logs them at start) cover the
// training set label by label: every image on exactly one of them.
TEST_F(CompressTest, LabelSkewSplitRunsAndShardsCoverTheTrainingSet) {
  const std::string addr = StartCoordinator(
      {"--min_participants=2", "--local_steps=10", "--rounds=2", "--data_split=label_skew:0.3"});
  for (int i = 0; i < 2; ++i) StartWorker(addr);
  const v1::RunStatus status = WaitForStatus(
      [](const v1::RunStatus& s) { return s.phase() == v1::FINISHED; }, absl::Minutes(5));
  ASSERT_EQ(status.phase(), v1::FINISHED) << Logs();
  for (auto& w : workers_) EXPECT_EQ(w->Wait(absl::Seconds(20)), 0) << w->Log();
  std::map<int, uint64_t> per_label;
  std::set<std::string> shards;
  for (auto& w : workers_) {
    const std::string log = w->Log();
    const size_t at = log.find("data split label_skew:0.3 shard ");
    ASSERT_NE(at, std::string::npos) << log;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    shards.insert(line.substr(32, 3));  // "0/2" or "1/2"
    const size_t labels = line.find(" labels ");
    const size_t end = line.find(", top label");
    ASSERT_TRUE(labels != std::string::npos && end != std::string::npos) << line;
    for (absl::string_view pair : absl::StrSplit(line.substr(labels + 8, end - labels - 8), ' ')) {
      std::vector<absl::string_view> lc = absl::StrSplit(pair, ':');
      int label = 0;
      uint64_t count = 0;
      ASSERT_TRUE(lc.size() == 2 && absl::SimpleAtoi(lc[0], &label) &&
                  absl::SimpleAtoi(lc[1], &count))
          << line;
      per_label[label] += count;
    }
  }
  EXPECT_EQ(shards, (std::set<std::string>{"0/2", "1/2"}));
  // Fashion-MNIST's training set: 6000 images of each of 10 labels.
  ASSERT_EQ(per_label.size(), 10u) << Logs();
  for (const auto& [label, count] : per_label) EXPECT_EQ(count, 6000u) << "label " << label;
}

TEST_F(CompressTest, CoordinatorRefusesBadCompressionFlags) {
  for (const char* flag :
       {"--codec=int4", "--codec=topk:2", "--codec=sparse:0", "--outer_optimizer=adam",
        "--outer_momentum=1", "--data_split=label_skew:0"}) {
    auto p = Process::Start({BinDir() + "/shoal-coordinator", "--listen=127.0.0.1:0", flag},
                            dir_.path() + "/bad.log");
    EXPECT_NE(p->Wait(absl::Seconds(20)), 0) << flag;
    EXPECT_NE(p->Log().find(std::string(flag).substr(2, std::string(flag).find('=') - 2)),
              std::string::npos)
        << flag << ": " << p->Log();
  }
}

}  // namespace
}  // namespace shoal
