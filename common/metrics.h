// Prometheus metrics: typed handles for the code that counts, and the HTTP
// endpoint (`GET /metrics`) that serves them in the text format (registry
// and format from Debian's prometheus-cpp; the endpoint is http_endpoint.h,
// see metrics.cc for why not its civetweb exposer). No prometheus header leaks out of this file:
// core and service code include this one only.
//
// The handles register on one registry per process, the way Prometheus
// client libraries keep a default registry: the checkpoint service, the
// worker loop and the coordinator's poller each ask for their own handles by
// name, without an Options path from main.cc to every call site. A process
// that never calls Metrics::Start() still counts (an atomic add per update)
// but serves nothing. Asking twice for the same name and labels gives the same
// series, so two servers of one test process share their series.
//
// Thread-safe: handles may be used from any thread; Start() and the
// destructor from one.
#ifndef SHOAL_COMMON_METRICS_H_
#define SHOAL_COMMON_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/http_endpoint.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace shoal {

using MetricLabels = std::map<std::string, std::string>;

// A monotonic counter (`*_total`). Default-constructed handles do nothing.
class MetricCounter {
 public:
  MetricCounter() = default;
  void Add(double v = 1) const;

 private:
  friend class Metrics;
  explicit MetricCounter(prometheus::Counter* c) : c_(c) {}
  prometheus::Counter* c_ = nullptr;
};

// A value that goes up and down.
class MetricGauge {
 public:
  MetricGauge() = default;
  void Set(double v) const;
  void Add(double v) const;

 private:
  friend class Metrics;
  explicit MetricGauge(prometheus::Gauge* g) : g_(g) {}
  prometheus::Gauge* g_ = nullptr;
};

// Observations in fixed buckets (`*_bucket`, `*_sum`, `*_count`).
class MetricHistogram {
 public:
  MetricHistogram() = default;
  void Observe(double v) const;

 private:
  friend class Metrics;
  explicit MetricHistogram(prometheus::Histogram* h) : h_(h) {}
  prometheus::Histogram* h_ = nullptr;
};

class Metrics {
 public:
  // Serves the process's metrics at http://`listen`/metrics ("host:port" with
  // a numeric IPv4 host; port 0 = any free port). INVALID_ARGUMENT for a malformed
  // address, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen);
  // Stops serving (the series stay in the process).
  ~Metrics();

  int port() const;
  // "host:port" with the port actually bound.
  const std::string& address() const;

  // Answers GET /metrics; for a server that serves other paths too (the
  // coordinator's --http_listen).
  static HttpResponse Handle(const HttpRequest& request);

  // Handles on the process's registry. Names follow Prometheus conventions
  // (`shoal_` prefix, base units in the name: `_seconds`, `_bytes`,
  // `_total` for counters); the same name must keep one type.
  static MetricCounter Counter(absl::string_view name, absl::string_view help,
                               const MetricLabels& labels = {});
  static MetricGauge Gauge(absl::string_view name, absl::string_view help,
                           const MetricLabels& labels = {});
  static MetricHistogram Histogram(absl::string_view name, absl::string_view help,
                                   const std::vector<double>& buckets,
                                   const MetricLabels& labels = {});

  // `shoal_build_info{component, version, commit} 1`: which build serves
  // (each binary's main() calls it with common/version.h's values).
  static void SetBuildInfo(absl::string_view component, absl::string_view version,
                           absl::string_view commit);
  // `shoal_run_info{run_id} 1`: the run this process serves (the
  // coordinator at start, a worker when it joins); the run it served before
  // drops to 0. Join other series to it by instance for a per-run view.
  static void SetRunInfo(absl::string_view run_id);

  // Bucket bounds for durations, 5 ms .. 10 min.
  static std::vector<double> SecondsBuckets();
  // Bucket bounds for sizes, 1 KiB .. 4 GiB (powers of 4).
  static std::vector<double> BytesBuckets();

  // The text exposition of every series (what /metrics returns), with the
  // process metrics of Prometheus' client libraries read from /proc at that
  // moment: process_cpu_seconds_total, process_resident_memory_bytes,
  // process_virtual_memory_bytes, process_open_fds, process_max_fds,
  // process_threads, process_start_time_seconds.
  static std::string Render();

 private:
  Metrics() = default;
  std::unique_ptr<HttpEndpoint> server_;
};

}  // namespace shoal

#endif  // SHOAL_COMMON_METRICS_H_
