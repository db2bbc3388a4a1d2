#include "common/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int CountOpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n - 3;  // ".", ".." and the directory's own descriptor
}

// The standard process series, read from /proc/self when /metrics is asked.
void UpdateProcessMetrics() {
  static std::mutex mu;
  static double reported_cpu = 0;
  std::lock_guard<std::mutex> lock(mu);
  const std::string stat = ReadFile("/proc/self/stat");
  // Fields after the command name (which may hold spaces) in parentheses.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return;
  const std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  // f[0] is field 3 (state): field N is f[N - 3].
  if (f.size() < 22) return;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double cpu = (std::stod(f[14 - 3]) + std::stod(f[15 - 3])) / ticks;
  static const MetricCounter cpu_total = Metrics::Counter(
      "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.");
  if (cpu > reported_cpu) {
    cpu_total.Add(cpu - reported_cpu);
    reported_cpu = cpu;
  }
  Metrics::Gauge("process_threads", "Number of OS threads in the process.")
      .Set(std::stod(f[20 - 3]));
  Metrics::Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.")
      .Set(std::stod(f[23 - 3]));
  Metrics::Gauge("process_resident_memory_bytes", "Resident memory size in bytes.")
      .Set(std::stod(f[24 - 3]) * page);
  double boot = 0;
  for (absl::string_view line : absl::StrSplit(ReadFile("/proc/stat"), '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) boot = std::stod(std::string(line));
  }
  Metrics::Gauge("process_start_time_seconds",
                 "Start time of the process since unix epoch in seconds.")
      .Set(boot + std::stod(f[22 - 3]) / ticks);
  Metrics::Gauge("process_open_fds", "Number of open file descriptors.").Set(CountOpenFds());
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    Metrics::Gauge("process_max_fds", "Maximum number of open file descriptors.")
        .Set(static_cast<double>(limit.rlim_cur));
  }
}

}  // namespace

// Why not prometheus-cpp's pull Exposer: Debian builds its civetweb with a
// 100 KiB thread stack (USE_STACK_SIZE=102400), and glibc puts the static TLS
// of every loaded library on each thread's stack. The worker's (OpenBLAS
// 60 KiB, glog 30 KiB, LibTorch 10 KiB) leaves no room, so civetweb's
// pthread_create fails with EINVAL in shoal-worker. The process's HTTP
// endpoint (http_endpoint.h, cpp-httplib on std::threads) serves it; the
// registry and the text format are prometheus-cpp's.
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
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> server =
      HttpEndpoint::Start(listen, "metrics_listen", {{"/metrics", &Metrics::Handle}});
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

void Metrics::SetBuildInfo(absl::string_view component, absl::string_view version,
                           absl::string_view commit) {
  Gauge("shoal_build_info", "1 for the build this process runs: its version and commit.",
        {{"component", std::string(component)},
         {"version", std::string(version)},
         {"commit", std::string(commit)}})
      .Set(1);
}

void Metrics::SetRunInfo(absl::string_view run_id) {
  static std::mutex mu;
  static std::string* current = new std::string;
  std::lock_guard<std::mutex> lock(mu);
  if (*current == run_id) return;
  constexpr char kHelp[] = "1 for the run this process serves (0 for one it served before).";
  if (!current->empty()) Gauge("shoal_run_info", kHelp, {{"run_id", *current}}).Set(0);
  *current = std::string(run_id);
  Gauge("shoal_run_info", kHelp, {{"run_id", *current}}).Set(1);
}

std::string Metrics::Render() {
  UpdateProcessMetrics();
  return prometheus::TextSerializer().Serialize(ProcessRegistry().Collect());
}

}  // namespace shoal
