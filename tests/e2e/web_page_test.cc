// The coordinator's web page (--http_listen, issue 15) in a real headless
// Chromium (Debian's `chromium`): a coordinator and 3 workers run 4 rounds,
// then the page's DOM, after its scripts ran, has one point per completed
// round on the loss and accuracy curves and a row per worker. The test
// keeps a screenshot as an artifact: $SHOAL_ARTIFACT_DIR/web_page_test/
// (default build/artifacts/web_page_test/web-page.png).
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>

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
                  const std::string& name) {
    const std::string profile = dir_.path() + "/profile-" + name;
    mkdir(profile.c_str(), 0700);
    const std::string cmd = absl::StrCat(
        "exec ", kChromium,
        " --headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run"
        " --disable-dev-shm-usage --user-data-dir=",
        profile, " --window-size=1280,900 --virtual-time-budget=6000 ", mode, " ", url, " 2>",
        dir_.path(), "/chromium-", name, ".log");
    chromium_ = Process::Start({"/bin/sh", "-c", cmd}, out);
    const int code = chromium_->Wait(absl::Seconds(90));
    if (code == -1) chromium_->Stop(absl::Seconds(2));
    return code;
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
                        absl::StrCat("--rounds=", kRounds), "--eval_every=1", "--run_id=web"});
  ASSERT_FALSE(addr.empty());
  for (int i = 0; i < 3; ++i) StartWorker(addr);

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

  const std::string url = absl::StrCat("http://127.0.0.1:", port, "/");
  const std::string dom_path = dir_.path() + "/dom.html";
  ASSERT_EQ(RunChromium(url, "--dump-dom", dom_path, "dom"), 0)
      << ReadFile(dir_.path() + "/chromium-dom.log");
  const std::string dom = ReadFile(dom_path);
  EXPECT_EQ(Count(dom, "data-series=\"train_loss\""), static_cast<size_t>(kRounds)) << dom;
  EXPECT_EQ(Count(dom, "data-series=\"test_accuracy\""), static_cast<size_t>(kRounds)) << dom;
  for (int r = 1; r <= kRounds; ++r) {
    EXPECT_NE(dom.find(absl::StrCat("data-series=\"train_loss\" data-round=\"", r, "\"")),
              std::string::npos)
        << "round " << r;
  }
  for (const std::string& id : ids) {
    EXPECT_NE(dom.find(absl::StrCat("data-worker=\"", id, "\"")), std::string::npos)
        << id << " not in the workers table:\n"
        << dom;
  }
  EXPECT_NE(dom.find("FINISHED"), std::string::npos);

  const std::string shot = ArtifactDir() + "/web-page.png";
  unlink(shot.c_str());
  EXPECT_EQ(RunChromium(url, "--screenshot=" + shot, dir_.path() + "/shot.log", "shot"), 0)
      << ReadFile(dir_.path() + "/chromium-shot.log");
  struct stat st {};
  ASSERT_EQ(stat(shot.c_str(), &st), 0) << "no screenshot at " << shot;
  EXPECT_GT(st.st_size, 10000) << shot;
  std::cout << "screenshot: " << shot << " (" << st.st_size << " bytes)\n";
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
