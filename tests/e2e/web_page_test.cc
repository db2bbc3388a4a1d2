// The coordinator's web page (--http_listen, issues 15 and 29) in a real
// headless Chromium (Debian's `chromium`):
//  - a coordinator and 3 workers run 4 rounds, then the page's DOM, after
//    its scripts ran, has one point per completed round on every per-round
//    curve (loss, accuracy, round duration, samples/s), a row per worker,
//    where each one's time goes, a hash mark per round (all agreed), the
//    config, the header's figures, no zone tree (a flat run) and no
//    departed table;
//  - a live run of 4 workers in zones "eu" and "us" with the relay on, one
//    stopped with SIGTERM: the zone tree with supernodes and a standby, the
//    stopped worker in the departed table and not among the members, the
//    header's elapsed time, round time, samples/s, bytes/s, ETA and hash
//    agreement, times with date and zone.
// Every axis's ticks are round numbers (1, 2 or 5 x 10^k apart) labelled as
// such. Nothing asserts on how long anything took: the tests wait for
// states. Each keeps a screenshot as an artifact: $SHOAL_ARTIFACT_DIR/
// web_page_test/ (default build/artifacts/web_page_test/): web-page.png (the
// finished run) and web-page-live.png (the live run, docs/web-page.png).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/e2e/cluster_fixture.h"
#include "tests/support/http_get.h"

namespace shoal {
namespace {

using ::shoal::testing::HttpGet;

constexpr char kChromium[] = "/usr/bin/chromium";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// The text of the element with id `id`'s first `class="v..."` child (a
// header figure), tags stripped.
std::string StatText(const std::string& dom, const std::string& id) {
  const size_t at = dom.find(absl::StrCat("id=\"", id, "\""));
  if (at == std::string::npos) return "";
  const size_t v = dom.find("class=\"v", at);
  if (v == std::string::npos) return "";
  const size_t open = dom.find('>', v);
  const size_t close = dom.find("</span>", open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return std::regex_replace(dom.substr(open + 1, close - open - 1), std::regex("<[^>]*>"), "");
}

// A tick label's value: "0.25", "20k", "1.5M".
double LabelValue(const std::string& label) {
  char* end = nullptr;
  double v = std::strtod(label.c_str(), &end);
  if (end != nullptr && *end == 'k') v *= 1e3;
  if (end != nullptr && *end == 'M') v *= 1e6;
  if (end != nullptr && *end == 'G') v *= 1e9;
  return v;
}

// One axis: its ticks are evenly spaced by 1, 2 or 5 x 10^k, each a
// multiple of that step, and each labelled with its value.
::testing::AssertionResult NiceAxis(const std::vector<std::pair<double, std::string>>& ticks) {
  if (ticks.size() < 2) return ::testing::AssertionFailure() << ticks.size() << " ticks";
  const double step = ticks[1].first - ticks[0].first;
  if (!(step > 0)) return ::testing::AssertionFailure() << "step " << step;
  const double p = std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  const double m = step / p;
  if (std::fabs(m - 1) > 1e-6 && std::fabs(m - 2) > 1e-6 && std::fabs(m - 5) > 1e-6) {
    return ::testing::AssertionFailure() << "step " << step << " is not 1, 2 or 5 x 10^k";
  }
  for (size_t i = 0; i < ticks.size(); ++i) {
    const double v = ticks[i].first;
    if (i > 0 && std::fabs(v - ticks[i - 1].first - step) > 1e-6 * step) {
      return ::testing::AssertionFailure() << "uneven ticks at " << v << " (step " << step << ")";
    }
    if (std::fabs(v / step - std::round(v / step)) > 1e-6) {
      return ::testing::AssertionFailure() << v << " is not a multiple of " << step;
    }
    if (std::fabs(LabelValue(ticks[i].second) - v) > 1e-6 * std::max(1.0, std::fabs(v))) {
      return ::testing::AssertionFailure() << "tick " << v << " labelled " << ticks[i].second;
    }
  }
  return ::testing::AssertionSuccess();
}

// Every chart with points has nice y and x (round) ticks; returns the
// number of charts checked.
int ExpectNiceTicks(const std::string& dom) {
  static const std::regex kTick(
      "<text class=\"(ytick|xtick)\" data-value=\"([^\"]+)\"[^>]*>([^<]*)</text>");
  int charts = 0;
  for (size_t at = dom.find("<svg"); at != std::string::npos; at = dom.find("<svg", at + 1)) {
    const std::string svg = dom.substr(at, dom.find("</svg>", at) - at);
    if (svg.find("data-points=\"0\"") != std::string::npos) continue;
    std::map<std::string, std::vector<std::pair<double, std::string>>> axes;
    for (std::sregex_iterator it(svg.begin(), svg.end(), kTick), end; it != end; ++it) {
      axes[(*it)[1]].push_back({std::stod((*it)[2]), (*it)[3]});
    }
    EXPECT_TRUE(NiceAxis(axes["ytick"])) << "y axis of\n" << svg;
    EXPECT_TRUE(NiceAxis(axes["xtick"])) << "x axis of\n" << svg;
    for (const auto& t : axes["xtick"]) EXPECT_EQ(t.first, std::round(t.first)) << "round tick";
    ++charts;
  }
  return charts;
}

// Every <time> on the page shows a date, a time and a zone
// ("2026-11-28 17:31:26 UTC"); returns how many there are.
int ExpectDatedTimes(const std::string& dom) {
  static const std::regex kTime("<time datetime=\"[^\"]+\">([^<]*)</time>");
  static const std::regex kDated(
      "\\d{4}-\\d{2}-\\d{2} \\d{2}:\\d{2}:\\d{2} UTC([+-]\\d{2}:\\d{2})?");
  int n = 0;
  for (std::sregex_iterator it(dom.begin(), dom.end(), kTime), end; it != end; ++it, ++n) {
    EXPECT_TRUE(std::regex_match(std::string((*it)[1]), kDated)) << (*it)[1];
  }
  return n;
}

std::string ArtifactDir() {
  const char* env = getenv("SHOAL_ARTIFACT_DIR");
  std::string dir = env != nullptr && *env != '\0' ? env : SHOAL_DEFAULT_ARTIFACT_DIR;
  dir += "/web_page_test";
  mkdir(std::string(dir, 0, dir.rfind('/')).c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  return dir;
}

class WebPageTest : public ClusterTest {
 protected:
  // Runs headless Chromium on `url` with `mode` (--dump-dom or
  // --screenshot=...) and a fresh profile; its stdout goes to `out`.
  // Returns its exit code. Stopped by PID (the shell execs chromium).
  int RunChromium(const std::string& url, const std::string& mode, const std::string& out,
                  const std::string& name, const std::string& window) {
    const std::string profile = dir_.path() + "/profile-" + name;
    mkdir(profile.c_str(), 0700);
    const std::string cmd = absl::StrCat(
        "exec ", kChromium,
        " --headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run"
        " --disable-dev-shm-usage --user-data-dir=",
        profile, " --window-size=", window, " --virtual-time-budget=6000 ", mode, " ", url, " 2>",
        dir_.path(), "/chromium-", name, ".log");
    chromium_ = Process::Start({"/bin/sh", "-c", cmd}, out);
    const int code = chromium_->Wait(absl::Seconds(90));
    if (code == -1) chromium_->Stop(absl::Seconds(2));
    return code;
  }

  // The web page's port, from the coordinator's log (0 if it never said).
  int WebPort() {
    static const std::regex kWeb("web page on http://([0-9.]+):([0-9]+)/");
    int port = 0;
    WaitUntil(
        [&] {
          std::smatch m;
          const std::string log = coordinator_->Log();
          if (std::regex_search(log, m, kWeb)) port = std::stoi(m[2]);
          return port != 0 || !coordinator_->Running();
        },
        absl::Seconds(20));
    return port;
  }

  // The page's DOM after its scripts ran (first poll drawn).
  std::string Dom(int port, const std::string& name) {
    const std::string path = dir_.path() + "/" + name + ".html";
    const int code = RunChromium(absl::StrCat("http://127.0.0.1:", port, "/"), "--dump-dom", path,
                                 name, "1280,900");
    EXPECT_EQ(code, 0) << ReadFile(dir_.path() + "/chromium-" + name + ".log");
    return ReadFile(path);
  }

  // A screenshot of the page in the artifact directory.
  void Screenshot(int port, const std::string& file, const std::string& window) {
    const std::string shot = ArtifactDir() + "/" + file;
    unlink(shot.c_str());
    EXPECT_EQ(RunChromium(absl::StrCat("http://127.0.0.1:", port, "/"), "--screenshot=" + shot,
                          dir_.path() + "/" + file + ".log", file, window),
              0)
        << ReadFile(dir_.path() + "/chromium-" + file + ".log");
    struct stat st {};
    ASSERT_EQ(stat(shot.c_str(), &st), 0) << "no screenshot at " << shot;
    EXPECT_GT(st.st_size, 10000) << shot;
    std::cout << "screenshot: " << shot << " (" << st.st_size << " bytes)\n";
  }

  std::unique_ptr<Process> chromium_;
};

TEST_F(WebPageTest, ChromiumDrawsEveryRoundAndListsEveryWorker) {
  if (access(kChromium, X_OK) != 0) {
    GTEST_SKIP() << kChromium << " not installed (scripts/install-deps.sh installs it)";
  }
  constexpr int kRounds = 4;
  const std::string addr =
      StartCoordinator({"--http_listen=127.0.0.1:0", "--min_participants=3", "--local_steps=5",
                        absl::StrCat("--rounds=", kRounds), "--eval_every=1", "--run_id=web",
                        // Every round audited: the page shows scores and audit counts.
                        "--audit_rate=1"});
  ASSERT_FALSE(addr.empty());
  for (int i = 0; i < 3; ++i) StartWorker(addr);
  const int port = WebPort();
  ASSERT_NE(port, 0) << coordinator_->Log();

  // The run finishes; the page then shows a state that no longer moves.
  std::string status;
  const bool finished = WaitUntil(
      [&] {
        status = HttpGet(port, "/api/status");
        return status.find("\"phase\": \"FINISHED\"") != std::string::npos;
      },
      absl::Seconds(180));
  ASSERT_TRUE(finished) << status << Logs();
  std::set<std::string> ids;
  static const std::regex kId("\"id\": \"([^\"]+)\"");
  for (std::sregex_iterator it(status.begin(), status.end(), kId), end; it != end; ++it) {
    ids.insert((*it)[1]);
  }
  ASSERT_EQ(ids.size(), 3u) << status;
  EXPECT_NE(status.find(absl::StrCat("\"last_completed_round\": \"", kRounds, "\"")),
            std::string::npos)
      << status;
  // /api/status is `shoalctl status --json`: the same run, the same fields.
  EXPECT_NE(status.find("\"run_id\": \"web\""), std::string::npos);
  // The history has what RoundSummary lacks: each round's wire bytes (or
  // null), a short hash and when it completed.
  const std::string history = HttpGet(port, "/api/history");
  EXPECT_EQ(Count(history, "\"model_hash\":\""), static_cast<size_t>(kRounds)) << history;
  EXPECT_EQ(Count(history, "\"wire_bytes\":"), static_cast<size_t>(kRounds)) << history;
  EXPECT_EQ(Count(history, "\"unix_ms\":"), static_cast<size_t>(kRounds)) << history;

  const std::string dom = Dom(port, "dom");
  EXPECT_EQ(Count(dom, "data-series=\"train_loss\""), static_cast<size_t>(kRounds)) << dom;
  EXPECT_EQ(Count(dom, "data-series=\"test_accuracy\""), static_cast<size_t>(kRounds)) << dom;
  for (int r = 1; r <= kRounds; ++r) {
    EXPECT_NE(dom.find(absl::StrCat("data-series=\"train_loss\" data-round=\"", r, "\"")),
              std::string::npos)
        << "round " << r;
  }
  // Round duration and samples/s of every round; bytes/s of the rounds
  // whose wire the coordinator saw (a round may be too quick for it).
  EXPECT_EQ(Count(dom, "data-series=\"round_seconds\""), static_cast<size_t>(kRounds)) << dom;
  EXPECT_EQ(Count(dom, "data-series=\"exchange_seconds\""), static_cast<size_t>(kRounds));
  EXPECT_EQ(Count(dom, "data-series=\"samples_per_second\""), static_cast<size_t>(kRounds));
  EXPECT_GE(Count(dom, "data-series=\"wire_bytes_per_second\""), 1u) << history;
  EXPECT_LE(Count(dom, "data-series=\"wire_bytes_per_second\""), static_cast<size_t>(kRounds));
  EXPECT_EQ(ExpectNiceTicks(dom), 5) << dom;
  for (const std::string& id : ids) {
    EXPECT_NE(dom.find(absl::StrCat("data-worker=\"", id, "\"")), std::string::npos)
        << id << " not in the workers table:\n"
        << dom;
    // Where its time goes: a bar with its training time.
    static const std::regex kTrain("data-part=\"train\" data-seconds=\"([0-9.]+)\"");
    const size_t row = dom.find(absl::StrCat("data-worker-time=\"", id, "\""));
    ASSERT_NE(row, std::string::npos) << id << " has no time bar:\n" << dom;
    std::smatch m;
    const std::string bar = dom.substr(row, dom.find("</div>", row) - row);
    ASSERT_TRUE(std::regex_search(bar, m, kTrain)) << bar;
    EXPECT_GT(std::stod(m[1]), 0) << bar;
    // Its score and audits (issue 28): every contribution was replayed.
    const size_t score = dom.find(absl::StrCat("data-score=\"", id, "\""));
    ASSERT_NE(score, std::string::npos) << id << " has no score:\n" << dom;
    const std::string cell = dom.substr(score, dom.find("</td>", score) - score);
    EXPECT_NE(cell.find("1.00"), std::string::npos) << cell;
    EXPECT_NE(cell.find("audited, 0 failed"), std::string::npos) << cell;
    // Its shares of the rounds' wall time (WorkerStatus.train_share...).
    static const std::regex kShares("time: training ([0-9]+)%, exchange ([0-9]+)%, idle ([0-9]+)%");
    ASSERT_TRUE(std::regex_search(bar, m, kShares)) << bar;
    EXPECT_GT(std::stoi(m[1]), 0) << bar;
    EXPECT_NEAR(std::stoi(m[1]) + std::stoi(m[2]) + std::stoi(m[3]), 100, 2) << bar;
  }
  static const std::regex kAudits("Audits \\(rate 1\\): <b>([0-9]+)</b> performed");
  std::smatch audits;
  ASSERT_TRUE(std::regex_search(dom, audits, kAudits)) << dom;
  EXPECT_GE(std::stoi(audits[1]), kRounds * 3 - 3);
  EXPECT_NE(dom.find("Median round"), std::string::npos);
  EXPECT_NE(dom.find("Most of the round"), std::string::npos);
  EXPECT_NE(dom.find("FINISHED"), std::string::npos);
  // The header: a finished run has no ETA; every figure is shown.
  EXPECT_EQ(StatText(dom, "stat-eta"), "done");
  for (const char* stat : {"stat-elapsed", "stat-round-time", "stat-samples", "stat-bytes"}) {
    EXPECT_NE(StatText(dom, stat), "-") << stat;
    EXPECT_NE(StatText(dom, stat), "") << stat;
  }
  EXPECT_NE(StatText(dom, "stat-bytes").find("/s"), std::string::npos);
  EXPECT_NE(StatText(dom, "stat-hash").find(absl::StrCat("round ", kRounds, ": 3 of 3 agree")),
            std::string::npos)
      << StatText(dom, "stat-hash");
  // A hash mark per round, every one agreed, and the rounds table says so.
  EXPECT_EQ(Count(dom, "data-hash-round="), static_cast<size_t>(kRounds)) << dom;
  EXPECT_EQ(Count(dom, "data-agreed=\"true\""), 2u * kRounds) << dom;
  EXPECT_EQ(Count(dom, "data-agreed=\"false\""), 0u);
  // The config, as key/value rows.
  EXPECT_NE(dom.find("data-key=\"training.local_steps\"><span class=\"k\">training.local_steps"
                     "</span> <span class=\"v\">5</span>"),
            std::string::npos)
      << dom;
  EXPECT_NE(dom.find("data-key=\"sync.rounds\""), std::string::npos);
  // A flat run: no zone tree; nobody departed (finished workers are the
  // run's members).
  EXPECT_NE(dom.find("id=\"zones-section\" hidden"), std::string::npos);
  EXPECT_NE(dom.find("id=\"departed-section\" hidden"), std::string::npos);
  EXPECT_EQ(Count(dom, "data-departed="), 0u);
  EXPECT_GE(ExpectDatedTimes(dom), 1 + kRounds);  // started, and each round

  Screenshot(port, "web-page.png", "1280,900");
}

// A live run in two zones, the relay on, one worker stopped: the zone tree,
// the departed apart, the header's figures of a run that goes on.
TEST_F(WebPageTest, LiveRunShowsZonesDepartedAndWhereTheTimeGoes) {
  if (access(kChromium, X_OK) != 0) {
    GTEST_SKIP() << kChromium << " not installed (scripts/install-deps.sh installs it)";
  }
  // Enough rounds that the run goes on while Chromium looks; no challenger
  // takes a zone over (--supernode_switch_factor), so the tree holds still.
  const std::string addr = StartCoordinator(
      {"--http_listen=127.0.0.1:0", "--min_participants=3", "--local_steps=20", "--rounds=100000",
       "--eval_every=2", "--relay=on", "--supernode_switch_factor=100", "--run_id=web-live"});
  ASSERT_FALSE(addr.empty());
  for (const char* zone : {"eu", "eu", "us", "us"})
    StartWorker(addr, {absl::StrCat("--zone=", zone)});
  const int port = WebPort();
  ASSERT_NE(port, 0) << coordinator_->Log();

  auto zone = [](const v1::RunStatus& s, const std::string& path) -> const v1::ZoneStatus* {
    for (const auto& z : s.zones()) {
      if (z.path() == path) return &z;
    }
    return nullptr;
  };
  // Four members, each zone headed, with a standby.
  const v1::RunStatus before = WaitForStatus(
      [&](const v1::RunStatus& s) {
        const v1::ZoneStatus* eu = zone(s, "eu");
        const v1::ZoneStatus* us = zone(s, "us");
        return s.last_completed_round() >= 2 && s.members() == 4 && eu != nullptr &&
               us != nullptr && !eu->standby().empty() && !us->standby().empty();
      },
      absl::Minutes(3));
  ASSERT_NE(zone(before, "eu"), nullptr) << Logs();
  // The standby of "eu" stops (SIGTERM): "left", and the three others go on
  // (for a few rounds, so the screenshot has curves).
  const std::string leaver = zone(before, "eu")->standby();
  // A member is elected as soon as its Join is answered, before it has
  // logged "joined run ... as <id>" (it builds its model first): the last
  // of the four to join may be the standby.
  Process* p = nullptr;
  ASSERT_TRUE(WaitUntil([&] { return (p = WorkerById(leaver)) != nullptr; }, absl::Seconds(60)))
      << leaver << Logs();
  p->Signal(SIGTERM);
  EXPECT_EQ(p->Wait(absl::Seconds(20)), 0) << p->Log();
  const v1::RunStatus after = WaitForStatus(
      [&](const v1::RunStatus& s) {
        const v1::WorkerStatus* w = FindWorker(s, leaver);
        const v1::ZoneStatus* us = zone(s, "us");
        return w != nullptr && w->state() == "left" && s.members() == 3 &&
               s.last_completed_round() >= before.last_completed_round() + 8 && us != nullptr &&
               !us->standby().empty() && s.phase() != v1::FINISHED;
      },
      absl::Minutes(3));
  ASSERT_EQ(FindWorker(after, leaver)->state(), "left") << Logs();
  std::vector<std::string> members;
  for (const auto& w : after.workers()) {
    if (w.id() != leaver) members.push_back(w.id());
  }
  ASSERT_EQ(members.size(), 3u);

  const std::string status = HttpGet(port, "/api/status");
  const std::string dom = Dom(port, "live");
  // The header of a live run: when it started (date and zone), elapsed,
  // round time, samples/s, bytes/s, ETA, hash agreement.
  static const std::regex kDated(
      "\\d{4}-\\d{2}-\\d{2} \\d{2}:\\d{2}:\\d{2} UTC([+-]\\d{2}:\\d{2})?");
  EXPECT_TRUE(std::regex_match(StatText(dom, "stat-started"), kDated))
      << StatText(dom, "stat-started");
  for (const char* stat :
       {"stat-elapsed", "stat-round-time", "stat-samples", "stat-bytes", "stat-eta", "stat-hash"}) {
    EXPECT_NE(StatText(dom, stat), "-") << stat << "\n" << dom;
    EXPECT_NE(StatText(dom, stat), "") << stat;
  }
  EXPECT_NE(StatText(dom, "stat-round-time").find("median"), std::string::npos);
  EXPECT_NE(StatText(dom, "stat-eta").find("rounds left"), std::string::npos)
      << StatText(dom, "stat-eta");
  EXPECT_NE(dom.find("data-disagree=\"0\""), std::string::npos) << StatText(dom, "stat-hash");
  EXPECT_GE(ExpectNiceTicks(dom), 5);
  for (const char* series : {"round_seconds", "samples_per_second", "wire_bytes_per_second"}) {
    EXPECT_GE(Count(dom, absl::StrCat("data-series=\"", series, "\"")), 2u) << series;
  }
  EXPECT_GE(Count(dom, "data-hash-round="), 4u);
  EXPECT_EQ(Count(dom, "data-agreed=\"false\""), 0u);
  EXPECT_NE(dom.find("data-key=\"topology.relay\"><span class=\"k\">topology.relay</span> "
                     "<span class=\"v\">true</span>"),
            std::string::npos);

  // Departed apart: the leaver in the departed table (with why), not among
  // the members; the members each with a row and a time bar.
  EXPECT_EQ(dom.find("id=\"departed-section\" hidden"), std::string::npos);
  EXPECT_NE(dom.find("Departed: 1 (1 left)"), std::string::npos) << dom;
  const size_t departed = dom.find(absl::StrCat("data-departed=\"", leaver, "\""));
  ASSERT_NE(departed, std::string::npos) << dom;
  EXPECT_NE(dom.find("shut down", departed), std::string::npos);
  EXPECT_EQ(dom.find(absl::StrCat("data-worker=\"", leaver, "\"")), std::string::npos);
  EXPECT_EQ(dom.find(absl::StrCat("data-worker-time=\"", leaver, "\"")), std::string::npos);
  EXPECT_EQ(dom.find(absl::StrCat("data-zone-member=\"", leaver, "\"")), std::string::npos);
  for (const std::string& id : members) {
    EXPECT_NE(dom.find(absl::StrCat("data-worker=\"", id, "\"")), std::string::npos) << id;
    EXPECT_NE(dom.find(absl::StrCat("data-worker-time=\"", id, "\"")), std::string::npos) << id;
    EXPECT_NE(dom.find(absl::StrCat("data-zone-member=\"", id, "\"")), std::string::npos) << id;
  }
  EXPECT_NE(dom.find("3 members, 1 departed"), std::string::npos);

  // The zone tree: both zones under the root, each headed by a member; the
  // standby of "us".
  EXPECT_EQ(dom.find("id=\"zones-section\" hidden"), std::string::npos);
  static const std::regex kZoneRow(
      "<tr data-zone=\"(eu|us)\">.*?<td class=\"zs\">([^<]*)</td><td class=\"zb\">([^<]*)</td>");
  std::map<std::string, std::pair<std::string, std::string>> heads;
  for (std::sregex_iterator it(dom.begin(), dom.end(), kZoneRow), end; it != end; ++it) {
    heads[(*it)[1]] = {(*it)[2], (*it)[3]};
  }
  ASSERT_EQ(heads.size(), 2u) << dom;
  for (const auto& [path, h] : heads) {
    EXPECT_NE(std::find(members.begin(), members.end(), h.first), members.end())
        << path << " headed by " << h.first;
  }
  EXPECT_NE(heads["us"].second, "-");
  EXPECT_NE(dom.find("<tr data-zone=\"\">"), std::string::npos);  // the root
  // Relayed members are marked when the status names their relay.
  if (status.find("\"relayed_by\": \"w") != std::string::npos) {
    EXPECT_NE(dom.find("class=\"relay\">→"), std::string::npos) << status;
  }
  // Times: the start, each zone's election, each round's completion.
  EXPECT_GE(ExpectDatedTimes(dom), 4);

  Screenshot(port, "web-page-live.png", "1280,2000");
}

// Unknown paths, wrong methods and a malformed request on the real server.
TEST_F(WebPageTest, AnswersErrorsAndKeepsServing) {
  const std::string addr =
      StartCoordinator({"--http_listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                        "--min_participants=2", "--run_id=web-errors"});
  ASSERT_FALSE(addr.empty());
  static const std::regex kWeb("web page on http://([0-9.]+):([0-9]+)/");
  int port = 0;
  WaitUntil(
      [&] {
        std::smatch m;
        const std::string log = coordinator_->Log();
        if (std::regex_search(log, m, kWeb)) port = std::stoi(m[2]);
        return port != 0 || !coordinator_->Running();
      },
      absl::Seconds(20));
  ASSERT_NE(port, 0) << coordinator_->Log();
  EXPECT_NE(HttpGet(port, "/").find("<script src=\"/app.js\">"), std::string::npos);
  EXPECT_NE(HttpGet(port, "/app.js").find("function chart("), std::string::npos);
  EXPECT_NE(HttpGet(port, "/metrics").find("shoal_round"), std::string::npos);
  EXPECT_NE(HttpGet(port, "/api/history").find("\"rounds\":[]"), std::string::npos);
  EXPECT_EQ(HttpGet(port, "/nope"), "");
  EXPECT_NE(HttpGet(port, "/api/status").find("\"run_id\": \"web-errors\""), std::string::npos);
}

}  // namespace
}  // namespace shoal
