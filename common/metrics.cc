#include "common/metrics.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace shoal {
namespace {

// The process's registry (see the header). Never destroyed: handles may be
// used by threads that outlive main's locals.
const std::shared_ptr<prometheus::Registry>& SharedRegistry() {
  static auto* registry = new std::shared_ptr<prometheus::Registry>(
      std::make_shared<prometheus::Registry>(prometheus::Registry::InsertBehavior::Merge));
  return *registry;
}

prometheus::Registry& ProcessRegistry() { return *SharedRegistry(); }

}  // namespace

// Why not prometheus-cpp's pull Exposer: Debian builds its civetweb with a
// 100 KiB thread stack (USE_STACK_SIZE=102400), and glibc puts the static TLS
// of every loaded library on each thread's stack. The worker's (OpenBLAS
// 60 KiB, glog 30 KiB, LibTorch 10 KiB) leaves no room, so civetweb's
// pthread_create fails with EINVAL in shoal-worker. Our own small server
// (http_server.h) serves it; the registry and the text format are
// prometheus-cpp's.
HttpResponse Metrics::Handle(const HttpRequest&) {
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = Render();
  return r;
}

void MetricCounter::Add(double v) const {
  if (c_ != nullptr) c_->Increment(v);
}
void MetricGauge::Set(double v) const {
  if (g_ != nullptr) g_->Set(v);
}
void MetricGauge::Add(double v) const {
  if (g_ != nullptr) g_->Increment(v);
}
void MetricHistogram::Observe(double v) const {
  if (h_ != nullptr) h_->Observe(v);
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(listen, "metrics_listen", {{"/metrics", &Metrics::Handle}});
  if (!server.ok()) return server.status();
  std::unique_ptr<Metrics> m(new Metrics());
  m->server_ = std::move(*server);
  return m;
}

int Metrics::port() const { return server_->port(); }
const std::string& Metrics::address() const { return server_->address(); }

Metrics::~Metrics() = default;

MetricCounter Metrics::Counter(absl::string_view name, absl::string_view help,
                               const MetricLabels& labels) {
  auto& family = prometheus::BuildCounter()
                     .Name(std::string(name))
                     .Help(std::string(help))
                     .Register(ProcessRegistry());
  return MetricCounter(&family.Add(labels));
}

MetricGauge Metrics::Gauge(absl::string_view name, absl::string_view help,
                           const MetricLabels& labels) {
  auto& family = prometheus::BuildGauge()
                     .Name(std::string(name))
                     .Help(std::string(help))
                     .Register(ProcessRegistry());
  return MetricGauge(&family.Add(labels));
}

MetricHistogram Metrics::Histogram(absl::string_view name, absl::string_view help,
                                   const std::vector<double>& buckets, const MetricLabels& labels) {
  auto& family = prometheus::BuildHistogram()
                     .Name(std::string(name))
                     .Help(std::string(help))
                     .Register(ProcessRegistry());
  return MetricHistogram(&family.Add(labels, prometheus::Histogram::BucketBoundaries(buckets)));
}

std::vector<double> Metrics::SecondsBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

std::vector<double> Metrics::BytesBuckets() {
  std::vector<double> b;
  for (double v = 1024; v <= 4.0 * 1024 * 1024 * 1024; v *= 4) b.push_back(v);
  return b;
}

std::string Metrics::Render() {
  return prometheus::TextSerializer().Serialize(ProcessRegistry().Collect());
}

}  // namespace shoal
