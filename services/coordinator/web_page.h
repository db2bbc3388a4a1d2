// The coordinator's live web page (--http_listen, issue 15): GET / (the page),
// /app.js and /app.css (served from the binary: no CDN, nothing from the
// internet), /api/status (the RunStatus as `shoalctl status --json` prints
// it), /api/history (every completed round the page's curves need, and the
// checkpoints seen) and /metrics when the metrics share the server.
//
// RunStatus.recent_rounds keeps the last 100 rounds only, so the curves'
// history is kept here: the ticker calls Update() and each newly completed
// round is appended (at most kMaxRounds, oldest dropped) with what the page
// needs and RoundSummary lacks: the bytes of its exchange (the workers'
// WorkerStatus.bytes_received of that wire_round, as the snapshots saw them)
// and when this coordinator saw it complete. The status and its
// JSON are built at most once per status change or kMaxAge, whatever the
// number of pages polling (each build is O(workers)). Both answers carry a
// Date header: the page measures the run's elapsed time on the
// coordinator's clock, not the browser's.
//
// Thread-safe.
#ifndef SHOAL_SERVICES_COORDINATOR_WEB_PAGE_H_
#define SHOAL_SERVICES_COORDINATOR_WEB_PAGE_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/http_endpoint.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

class WebPage {
 public:
  // `version` is the status version of the source (0 = unknown: rebuilt
  // after kMaxAge); `status` builds the status and sets its version.
  struct Source {
    std::function<uint64_t()> version;
    std::function<shoal::v1::RunStatus(uint64_t*)> status;
  };
  static constexpr size_t kMaxRounds = 10000;
  static constexpr size_t kMaxCheckpoints = 100;
  static constexpr absl::Duration kMaxAge = absl::Milliseconds(500);

  WebPage(Source source, const Clock* clock);

  // Picks up newly completed rounds and checkpoints (from the ticker).
  void Update();
  // The routes of the page; `with_metrics` adds GET /metrics.
  std::map<std::string, HttpEndpoint::Handler> Routes(bool with_metrics);

  HttpResponse Status();
  // ?after=N: only rounds after N (the page asks for what it lacks).
  HttpResponse History(const HttpRequest& request);

 private:
  const Clock* const clock_;
  struct Snapshot {
    uint64_t version = 0;
    absl::Time built;
    shoal::v1::RunStatus status;
    std::string json;  // built on the first /api/status of this snapshot
  };
  // A completed round as the history keeps it.
  struct Round {
    shoal::v1::RoundSummary summary;  // model_hash cut to kHashChars
    // Bytes the participants received in its exchange (-1 = unknown: no
    // member reported this round's wire when the round was first seen).
    int64_t wire_bytes = -1;
    // When this coordinator saw it complete (within a tick); 0 = unknown
    // (a round of the status a restarted coordinator resumed).
    int64_t unix_ms = 0;
  };
  static constexpr size_t kHashChars = 12;
  struct Checkpoint {
    std::string id;
    uint64_t round = 0;
    int64_t seen_unix_ms = 0;
  };
  // The current snapshot, rebuilt when stale (and the history extended).
  std::shared_ptr<Snapshot> Current() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Source source_;
  absl::Mutex mu_;
  std::shared_ptr<Snapshot> snapshot_ ABSL_GUARDED_BY(mu_);
  std::deque<Round> rounds_ ABSL_GUARDED_BY(mu_);
  // Bytes received by worker, by wire round, for rounds not yet in rounds_.
  std::map<uint64_t, std::map<std::string, uint64_t>> wire_ ABSL_GUARDED_BY(mu_);
  std::deque<Checkpoint> checkpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_WEB_PAGE_H_
