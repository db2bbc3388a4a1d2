// shoalctl against a live run (the real store, coordinator and two workers
// on 127.0.0.1): each read command in each output format. JSON and YAML are
// parsed by Debian's Python (json, python3-yaml) and must carry the same
// document; watch -o json prints one parseable object per line; the
// endpoints come from SHOAL_COORDINATOR / SHOAL_STORE as well as from flags.
#include <signal.h>

#include <fstream>
#include <iostream>
#include <map>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "tests/e2e/cluster_fixture.h"

namespace shoal {
namespace {

class ShoalctlE2eTest : public ClusterTest {
 protected:
  // Runs `shoalctl ARGS` (a shell line) with its stdout into FILE; returns
  // the exit code.
  int CtlTo(const std::string& args, const std::string& file) {
    int code = -1;
    Run(absl::StrCat(BinDir(), "/shoalctl ", args, " > ", dir_.path(), "/", file, " 2>&1"), &code);
    return code;
  }

  std::string Read(const std::string& file) {
    std::ifstream in(dir_.path() + "/" + file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Python's verdict on files of this test's directory: `expr` over json
  // (j), yaml (y) loaded from the two files; exit 0 when true.
  bool PythonSays(const std::string& json_file, const std::string& yaml_file,
                  const std::string& expr) {
    const std::string script = dir_.path() + "/check.py";
    std::ofstream(script) << "import json, sys, yaml\n"
                          << "j = json.load(open(sys.argv[1]))\n"
                          << "y = yaml.safe_load(open(sys.argv[2]))\n"
                          << "sys.exit(0 if (" << expr << ") else 1)\n";
    int code = -1;
    Run(absl::StrCat("/usr/bin/python3 ", script, " ", dir_.path(), "/", json_file, " ",
                     dir_.path(), "/", yaml_file, " 2>&1"),
        &code);
    return code == 0;
  }
};

TEST_F(ShoalctlE2eTest, EveryReadCommandInEveryFormat) {
  const std::string store = StartStore();
  const std::string addr =
      StartCoordinator({"--min_participants=2", "--local_steps=20", "--rounds=3",
                        "--checkpoint_store=" + store, "--checkpoint_every=1", "--run_id=ctl-a"});
  StartWorker(addr);
  StartWorker(addr);

  // watch -o json: one JSON object per line, rounds then the finished run.
  ASSERT_EQ(CtlTo("watch -o json --timeout=4m --coordinator=" + addr, "watch.jsonl"), 0)
      << Read("watch.jsonl") << Logs();
  const std::string watch = Read("watch.jsonl");
  std::vector<std::string> lines = absl::StrSplit(watch, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 4u) << watch;
  EXPECT_THAT(lines.back(), ::testing::HasSubstr("{\"event\":\"finished\",\"run_id\":\"ctl-a\""));
  EXPECT_THAT(watch,
              ::testing::HasSubstr("{\"event\":\"round\",\"total_rounds\":3,\"round\":\"3\""));
  {
    std::ofstream(dir_.path() + "/none.yaml") << "{}\n";
    const std::string script = dir_.path() + "/lines.py";
    std::ofstream(script) << "import json, sys\n"
                          << "events = [json.loads(l)['event'] for l in open(sys.argv[1]) if "
                             "l.strip()]\n"
                          << "sys.exit(0 if events.count('round') == 3 and events[-1] == "
                             "'finished' else 1)\n";
    int code = -1;
    const std::string out = Run(
        absl::StrCat("/usr/bin/python3 ", script, " ", dir_.path(), "/watch.jsonl 2>&1"), &code);
    EXPECT_EQ(code, 0) << out << watch;
  }
  WaitForStatus([](const v1::RunStatus& s) { return s.checkpoint_round() == 3; },
                absl::Seconds(60));

  // status: json and yaml are one document; the table has its sections.
  ASSERT_EQ(CtlTo("status -o json --coordinator=" + addr, "status.json"), 0) << Read("status.json");
  ASSERT_EQ(CtlTo("--coordinator=" + addr + " -o yaml status", "status.yaml"), 0)
      << Read("status.yaml");
  EXPECT_TRUE(PythonSays("status.json", "status.yaml",
                         "j['run_id'] == 'ctl-a' and j['phase'] == 'FINISHED' and "
                         "j['last_completed_round'] == '3' and len(j['workers']) == 2"))
      << Read("status.json");
  // Equal except the ms-ago figures that moved between the two calls.
  EXPECT_TRUE(PythonSays(
      "status.json", "status.yaml",
      "[{k: v for k, v in w.items() if k != 'last_seen_ms_ago'} for w in j['workers']] == "
      "[{k: v for k, v in w.items() if k != 'last_seen_ms_ago'} for w in y['workers']] and "
      "j['config'] == y['config'] and j['recent_rounds'] == y['recent_rounds'] and "
      "set(j) == set(y)"))
      << Read("status.yaml");
  ASSERT_EQ(CtlTo("status --coordinator=" + addr, "status.txt"), 0);
  const std::string table = Read("status.txt");
  EXPECT_THAT(table, ::testing::HasSubstr("phase FINISHED"));
  EXPECT_THAT(table, ::testing::HasSubstr("\nworkers:\nID "));
  EXPECT_THAT(table, ::testing::HasSubstr("checkpoint ctl-a-r3 (round 3)"));
  ASSERT_EQ(CtlTo("status -o wide --coordinator=" + addr, "status-wide.txt"), 0);
  EXPECT_THAT(Read("status-wide.txt"), ::testing::HasSubstr("ADDRESS"));

  // config: json (a --config file) and the same as yaml.
  ASSERT_EQ(CtlTo("config --coordinator=" + addr, "config.json"), 0) << Read("config.json");
  ASSERT_EQ(CtlTo("config -o yaml --coordinator=" + addr, "config.yaml"), 0);
  EXPECT_TRUE(PythonSays("config.json", "config.yaml", "j == y and len(j) > 3"))
      << Read("config.json") << Read("config.yaml");
  EXPECT_EQ(CtlTo("config -o table --coordinator=" + addr, "config.err"), 2);
  EXPECT_THAT(Read("config.err"), ::testing::HasSubstr("config prints json, yaml"));

  // The endpoints from the environment.
  int code = -1;
  Run(absl::StrCat("SHOAL_COORDINATOR=", addr, " ", BinDir(), "/shoalctl status -o json > ",
                   dir_.path(), "/env-status.json"),
      &code);
  EXPECT_EQ(code, 0) << Read("env-status.json");
  EXPECT_TRUE(PythonSays("env-status.json", "none.yaml", "j['run_id'] == 'ctl-a'"));

  // checkpoints list and show: json and yaml agree; the store from SHOAL_STORE.
  Run(absl::StrCat("SHOAL_STORE=", store, " ", BinDir(), "/shoalctl checkpoints list -o json > ",
                   dir_.path(), "/list.json"),
      &code);
  ASSERT_EQ(code, 0) << Read("list.json");
  ASSERT_EQ(CtlTo("checkpoints list -o yaml --store " + store, "list.yaml"), 0);
  EXPECT_TRUE(
      PythonSays("list.json", "list.yaml", "j == y and [c['id'] for c in j][:1] == ['ctl-a-r3']"))
      << Read("list.json") << Read("list.yaml");
  ASSERT_EQ(CtlTo("checkpoints show ctl-a-r3 -o json --store=" + store, "show.json"), 0);
  ASSERT_EQ(CtlTo("checkpoints show --id=ctl-a-r3 -o yaml --store=" + store, "show.yaml"), 0);
  EXPECT_TRUE(PythonSays("show.json", "show.yaml",
                         "j == y and j['round'] == 3 and j['layers'][0]['name'] == 'fc1.weight'"))
      << Read("show.json") << Read("show.yaml");
  ASSERT_EQ(CtlTo("checkpoints list -o wide --store=" + store, "list.txt"), 0);
  EXPECT_THAT(Read("list.txt"), ::testing::HasSubstr("ctl-a-r3"));
}

// explain and doctor on a run with a frozen worker (SIGSTOP), a worker
// behind NAT (--outbound_only) and one whose advertised address nobody can
// reach: each finding is named, and doctor exits 1.
TEST_F(ShoalctlE2eTest, ExplainAndDoctorNameEachFinding) {
  const std::string store = StartStore();
  const std::string addr = StartCoordinator(
      // The frozen worker stays a member however long the checks take: no
      // eviction for missed rounds, a long lease.
      {"--min_participants=2", "--local_steps=10", "--rounds=100000", "--heartbeat_lease=120s",
       "--max_missed_rounds=0", "--checkpoint_store=" + store, "--checkpoint_every=5",
       "--run_id=ctl-b"});
  StartWorker(addr, {"--name=steady"});
  Process* frozen = StartWorker(addr, {"--name=frozen"});
  StartWorker(addr, {"--name=natted", "--outbound_only=true"});
  // A port nobody listens on (bound and closed again): its advertised
  // address refuses every connection.
  StartWorker(addr, {"--name=hidden", "--advertise=127.0.0.1:1"});
  const v1::RunStatus running = WaitForStatus(
      [](const v1::RunStatus& s) {
        int active = 0;
        for (const auto& w : s.workers()) active += w.state() != "syncing" && !w.address().empty();
        return s.last_completed_round() >= 2 && active == 4;
      },
      absl::Minutes(3));
  ASSERT_GE(running.last_completed_round(), 2u) << Logs();
  std::map<std::string, std::string> id_of;
  for (const auto& w : running.workers()) id_of[w.name()] = w.id();

  frozen->Signal(SIGSTOP);
  WaitForStatus(
      [&](const v1::RunStatus& s) {
        for (const auto& w : s.workers()) {
          if (w.name() == "frozen") return w.last_seen_ms_ago() > 4000;
        }
        return false;
      },
      absl::Seconds(60));

  int code = -1;
  const std::string explain_frozen =
      Run(absl::StrCat(BinDir(), "/shoalctl explain frozen --coordinator=", addr, " 2>&1"), &code);
  EXPECT_EQ(code, 1) << explain_frozen;
  EXPECT_THAT(explain_frozen, ::testing::HasSubstr("PROBLEM"));
  EXPECT_THAT(explain_frozen, ::testing::HasSubstr("not heard from for"));
  EXPECT_THAT(explain_frozen, ::testing::HasSubstr("frozen (SIGSTOP)"));

  const std::string explain_nat = Run(absl::StrCat(BinDir(), "/shoalctl explain ", id_of["natted"],
                                                   " --coordinator=", addr, " 2>&1"),
                                      &code);
  EXPECT_THAT(explain_nat, ::testing::HasSubstr("behind NAT, in push mode"));

  const std::string explain_hidden =
      Run(absl::StrCat(BinDir(), "/shoalctl explain hidden --coordinator=", addr, " 2>&1"), &code);
  EXPECT_THAT(explain_hidden, ::testing::HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(explain_hidden, ::testing::HasSubstr("not reachable from this host"));

  const std::string unknown =
      Run(absl::StrCat(BinDir(), "/shoalctl explain nobody --coordinator=", addr, " 2>&1"), &code);
  EXPECT_EQ(code, 1);
  EXPECT_THAT(unknown, ::testing::HasSubstr("no worker 'nobody' in run ctl-b; workers: "));

  const std::string doctor =
      Run(absl::StrCat(BinDir(), "/shoalctl doctor --coordinator=", addr, " 2>&1"), &code);
  EXPECT_EQ(code, 1) << doctor;
  std::cout << "shoalctl explain frozen:\n" << explain_frozen << "shoalctl doctor:\n" << doctor;
  EXPECT_THAT(doctor, ::testing::HasSubstr("answers: run ctl-b"));
  EXPECT_THAT(doctor, ::testing::ContainsRegex("PROBLEM +" + id_of["frozen"] +
                                               " \\(frozen\\) +not heard from"));
  EXPECT_THAT(doctor, ::testing::ContainsRegex(id_of["natted"] + " \\(natted\\) +behind NAT"));
  EXPECT_THAT(doctor, ::testing::HasSubstr("advertised address 127.0.0.1:1 is not reachable"));
  EXPECT_THAT(doctor, ::testing::ContainsRegex("ok +store +" + store + " answers"));
  EXPECT_THAT(doctor, ::testing::HasSubstr("doctor: something is wrong"));
  // The findings as JSON and YAML (the run moves on between the calls: each
  // document's "problem" matches its own exit code).
  const int json_code = CtlTo("doctor -o json --coordinator=" + addr, "doctor.json");
  const int yaml_code = CtlTo("doctor -o yaml --coordinator=" + addr, "doctor.yaml");
  EXPECT_TRUE(PythonSays(
      "doctor.json", "doctor.yaml",
      absl::StrCat("j['problem'] == ", json_code == 1 ? "True" : "False",
                   " and y['problem'] == ", yaml_code == 1 ? "True" : "False",
                   " and j['findings'][0]['subject'] == 'coordinator' and "
                   "all(set(f) == {'level', 'subject', 'text'} for f in y['findings'])")))
      << Read("doctor.json") << Read("doctor.yaml");
  frozen->Signal(SIGCONT);

  // A coordinator address with nothing behind it: one PROBLEM naming it.
  const std::string nobody = Run(
      absl::StrCat(BinDir(), "/shoalctl doctor --rpc_timeout=2s --coordinator=127.0.0.1:1 2>&1"),
      &code);
  EXPECT_EQ(code, 1) << nobody;
  EXPECT_THAT(nobody, ::testing::HasSubstr("127.0.0.1:1 is not reachable"));
}

}  // namespace
}  // namespace shoal
