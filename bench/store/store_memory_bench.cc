// The checkpoint store's memory under bursts (issue 30's RSS goal):
// shoal-checkpoint processes side by side, by default one with
// --trim_interval=0 (the heap keeps what a burst freed) and one with the
// store's default, get the same load: uploaders sending a checkpoint every
// --upload_every_s (the soak's model with its optimizer state, changed every
// round so no blob is shared), a reader exporting the newest one every
// --read_every_s, and all stores SIGSTOPped together for
// --stop_s every --stop_every_s, so that uploads and reads queue and land
// at once when they resume (what the soak's stop_store does). Each store's
// RSS, anonymous memory, threads and open fds are sampled every
// --sample_s; growth is the median of the samples in the first
// --window_minutes after --warmup_minutes against the median of the last
// --window_minutes (a store's memory swings with the transfers in flight).
// --trim_intervals=0,default,1s runs a store per value. Last line:
//   store-memory: minutes=M stops=N trim_off_anon_growth=X% trim_off_rss_growth=..
//                 trim_off_anon_max_mib=.. trim_on_... uploads=N
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/common/bench_tls.h"
#include "bench/common/bench_util.h"
#include "services/checkpoint/checkpoint_client.h"

namespace shoal::bench {
namespace {

using checkpoint::ByteSpan;
using checkpoint::GrpcCheckpointClient;

// A free loopback port (bound to 0, read back, released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::fprintf(stderr, "store-memory: cannot find a free port\n");
    std::exit(1);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

struct Sample {
  double minute = 0;
  double rss_mib = 0;
  double anon_mib = 0;
  int threads = 0;
  int fds = 0;
};

// /proc/PID/status's VmRSS, RssAnon and Threads, and /proc/PID/fd's count.
bool ReadSample(pid_t pid, double minute, Sample* s) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  if (!status) return false;
  s->minute = minute;
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      status >> s->rss_mib;
      s->rss_mib /= 1024;
    } else if (key == "RssAnon:") {
      status >> s->anon_mib;
      s->anon_mib /= 1024;
    } else if (key == "Threads:") {
      status >> s->threads;
    }
    status.ignore(1 << 12, '\n');
  }
  s->fds = 0;
  if (DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (readdir(dir) != nullptr) ++s->fds;
    closedir(dir);
    s->fds -= 2;  // . and ..
  }
  return true;
}

// One store under test, with its load.
struct Store {
  std::string name;
  std::string key;
  std::unique_ptr<Child> process;
  double cpu_seconds = 0;  // at the end
  std::string address;
  std::unique_ptr<GrpcCheckpointClient> client;
  std::atomic<int64_t> uploads{0};
  std::atomic<int64_t> upload_errors{0};
  std::atomic<int64_t> reads{0};
  std::atomic<int64_t> read_errors{0};
  absl::Mutex mu;
  std::vector<Sample> samples ABSL_GUARDED_BY(mu);
};

// The soak's model (a 784-256-10 MLP) and its Nesterov momentum, as
// float32 layers.
std::vector<std::vector<uint8_t>> ModelLayers() {
  const std::vector<size_t> floats = {784 * 256, 256, 256 * 10, 10};
  std::vector<std::vector<uint8_t>> layers;
  for (int copy = 0; copy < 2; ++copy) {
    for (size_t n : floats) {
      std::vector<uint8_t> bytes(n * 4);
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + copy);
      layers.push_back(std::move(bytes));
    }
  }
  return layers;
}

void Upload(Store* store, int uploader, absl::Time end, absl::Duration every) {
  std::vector<std::vector<uint8_t>> layers = ModelLayers();
  const std::vector<std::string> names = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  for (uint64_t round = 1; absl::Now() < end; ++round) {
    const absl::Time next = absl::Now() + every;
    // Each round's layers differ (their first 8 bytes), as a model's do.
    for (auto& layer : layers) std::memcpy(layer.data(), &round, sizeof(round));
    shoal::v1::Manifest manifest;
    manifest.set_run_id(absl::StrCat("bench-u", uploader));
    manifest.set_round(round);
    manifest.set_model("mlp");
    std::vector<ByteSpan> spans;
    for (size_t i = 0; i < layers.size(); ++i) {
      shoal::v1::LayerEntry* entry = manifest.add_layers();
      entry->set_name(i < names.size() ? names[i] : "outer.momentum." + names[i - names.size()]);
      entry->set_dtype("float32");
      entry->add_shape(static_cast<int64_t>(layers[i].size() / 4));
      entry->set_optimizer_state(i >= names.size());
      spans.emplace_back(layers[i].data(), layers[i].size());
    }
    if (!checkpoint::CompleteManifest(&manifest, spans).ok()) std::abort();
    if (store->client->Upload(manifest, spans).ok()) {
      store->uploads.fetch_add(1);
    } else {
      store->upload_errors.fetch_add(1);
    }
    absl::SleepFor(std::max(absl::ZeroDuration(), std::min(next, end) - absl::Now()));
  }
}

// An export of the newest checkpoint every `every` (shoalctl checkpoints
// export, as the soak's checks run it).
void Read(Store* store, absl::Time end, absl::Duration every) {
  while (absl::Now() < end) {
    const absl::Time next = absl::Now() + every;
    bool ok = false;
    auto list = store->client->List("");
    if (list.ok() && !list->empty()) {
      auto manifest = store->client->GetManifest(list->front().id());
      ok = manifest.ok();
      for (int i = 0; ok && i < manifest->layers_size(); ++i) {
        std::vector<uint8_t> bytes;
        ok = checkpoint::ReadWholeLayer(store->client.get(), list->front().id(), *manifest,
                                        static_cast<uint32_t>(i), &bytes)
                 .ok();
      }
    }
    (ok ? store->reads : store->read_errors).fetch_add(1);
    absl::SleepFor(std::max(absl::ZeroDuration(), next - absl::Now()));
  }
}

// Figures of one store after the warm-up: the medians of its samples in
// the first and in the last `window` minutes (a store's memory swings with
// the transfers in flight, so a single sample says little), and the max.
struct Growth {
  Sample first, last, max;
};

Sample MedianOf(const std::vector<Sample>& samples) {
  std::vector<double> rss, anon, threads, fds;
  for (const Sample& s : samples) {
    rss.push_back(s.rss_mib);
    anon.push_back(s.anon_mib);
    threads.push_back(s.threads);
    fds.push_back(s.fds);
  }
  Sample m;
  if (samples.empty()) return m;
  m.rss_mib = Median(rss);
  m.anon_mib = Median(anon);
  m.threads = static_cast<int>(Median(threads));
  m.fds = static_cast<int>(Median(fds));
  return m;
}

Growth GrowthAfter(Store* store, double warmup_minutes, double window_minutes) {
  absl::MutexLock lock(&store->mu);
  Growth g;
  if (store->samples.empty()) return g;
  const double end = store->samples.back().minute;
  std::vector<Sample> first, last;
  bool any = false;
  for (const Sample& s : store->samples) {
    if (s.minute < warmup_minutes) continue;
    if (s.minute < warmup_minutes + window_minutes) first.push_back(s);
    if (s.minute > end - window_minutes) last.push_back(s);
    if (!any) g.max = s;
    any = true;
    g.max.rss_mib = std::max(g.max.rss_mib, s.rss_mib);
    g.max.anon_mib = std::max(g.max.anon_mib, s.anon_mib);
    g.max.threads = std::max(g.max.threads, s.threads);
    g.max.fds = std::max(g.max.fds, s.fds);
  }
  g.first = MedianOf(first);
  g.last = MedianOf(last);
  return g;
}

double Percent(double from, double to) { return from > 0 ? 100.0 * (to - from) / from : 0; }

int Main(int argc, char** argv) {
  Flags flags(argc, argv);
  const std::string bin = flags.Str("bin", "build/bin");
  const std::string work = flags.Str("work", "/tmp/shoal-bench-store");
  const double minutes = flags.Double("minutes", 12);
  const double warmup = flags.Double("warmup_minutes", 3);
  const double window = flags.Double("window_minutes", 2);
  const int uploaders = static_cast<int>(flags.Int("uploaders", 3));
  const double stop_every_s = flags.Double("stop_every_s", 75);
  const double stop_s = flags.Double("stop_s", 10);
  const double sample_s = flags.Double("sample_s", 2);
  const double upload_every_s = flags.Double("upload_every_s", 3);
  const double read_every_s = flags.Double("read_every_s", 6);
  const std::string log = flags.Str("log", work + "/stores.log");
  // One store per value, each passed as its --trim_interval ("default":
  // none, the store's own default).
  const std::vector<std::string> intervals =
      absl::StrSplit(flags.Str("trim_intervals", "0,default"), ',');
  const std::string tls_arg = ApplyBenchTls(flags);
  flags.CheckAllUsed();
  const std::string tls_dir = tls_arg.empty() ? "" : tls_arg.substr(std::strlen("--tls_dir="));

  if (std::system(absl::StrCat("rm -rf '", work, "'/store-* && mkdir -p '", work, "'").c_str()) !=
      0) {
    std::fprintf(stderr, "store-memory: cannot prepare %s\n", work.c_str());
    return 1;
  }
  std::vector<std::unique_ptr<Store>> owned;
  for (size_t i = 0; i < intervals.size(); ++i) {
    owned.push_back(std::make_unique<Store>());
    Store& s = *owned.back();
    // The last line's keys: trim_off (0), trim_on (the default), trim_<value>.
    s.key = intervals[i] == "0"         ? "trim_off"
            : intervals[i] == "default" ? "trim_on"
                                        : "trim_" + intervals[i];
    s.name = "--trim_interval=" + intervals[i];
    s.address = absl::StrCat("127.0.0.1:", FreePort());
    std::vector<std::string> argv = {bin + "/shoal-checkpoint", "--listen=" + s.address,
                                     absl::StrCat("--data_dir=", work, "/store-", i),
                                     "--retain=20"};
    if (intervals[i] != "default") argv.push_back("--trim_interval=" + intervals[i]);
    if (!tls_dir.empty()) {
      argv.push_back("--tls_cert=" + tls_dir + "/shoal.pem");
      argv.push_back("--tls_key=" + tls_dir + "/shoal.key");
      argv.push_back("--tls_ca=" + tls_dir + "/ca.pem");
    }
    s.process = std::make_unique<Child>(argv, log);
    checkpoint::CheckpointClientOptions options;
    options.call_timeout = absl::Seconds(5);
    // A stopped store holds an upload for --stop_s; the deadline covers it.
    options.transfer_timeout = absl::Seconds(stop_s + 60);
    s.client = std::make_unique<GrpcCheckpointClient>(s.address, options);
  }
  for (auto& sp : owned) {
    Store& s = *sp;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!s.client->List("").ok()) {
      if (absl::Now() > deadline) {
        std::fprintf(stderr, "store-memory: %s did not answer at %s within 30 s (log: %s)\n",
                     s.name.c_str(), s.address.c_str(), log.c_str());
        return 1;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(minutes * 60);
  std::vector<std::thread> threads;
  for (auto& sp : owned) {
    Store& s = *sp;
    for (int u = 0; u < uploaders; ++u)
      threads.emplace_back(Upload, &s, u, end, absl::Seconds(upload_every_s));
    threads.emplace_back(Read, &s, end, absl::Seconds(read_every_s));
  }
  absl::Notification done;
  std::thread sampler([&] {
    while (!done.WaitForNotificationWithTimeout(absl::Seconds(sample_s))) {
      const double minute = absl::ToDoubleMinutes(absl::Now() - start);
      for (auto& sp : owned) {
        Store& s = *sp;
        Sample sample;
        if (ReadSample(s.process->pid(), minute, &sample)) {
          absl::MutexLock lock(&s.mu);
          s.samples.push_back(sample);
        }
      }
    }
  });
  // The stops: every store at once, so that all see the same bursts.
  int stops = 0;
  for (absl::Time next = start + absl::Seconds(stop_every_s); next + absl::Seconds(stop_s) < end;
       next += absl::Seconds(stop_every_s)) {
    absl::SleepFor(next - absl::Now());
    for (auto& sp : owned) kill(sp->process->pid(), SIGSTOP);
    absl::SleepFor(absl::Seconds(stop_s));
    for (auto& sp : owned) kill(sp->process->pid(), SIGCONT);
    ++stops;
  }
  for (std::thread& t : threads) t.join();
  done.Notify();
  sampler.join();
  for (auto& sp : owned) sp->cpu_seconds = ProcessCpuSeconds(sp->process->pid());

  std::vector<Row> rows;
  std::vector<Growth> g(owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    Store& s = *owned[i];
    g[i] = GrowthAfter(&s, warmup, window);
    const std::string p = s.name + ": ";
    rows.push_back({p + "anonymous MiB, medians: after warm-up -> end (max)",
                    absl::StrCat(Fmt(g[i].first.anon_mib, 1), " -> ", Fmt(g[i].last.anon_mib, 1),
                                 " (", Fmt(g[i].max.anon_mib, 1), ")"),
                    absl::StrCat(Fmt(Percent(g[i].first.anon_mib, g[i].last.anon_mib), 1), " %")});
    rows.push_back({p + "RSS MiB, medians: after warm-up -> end (max)",
                    absl::StrCat(Fmt(g[i].first.rss_mib, 1), " -> ", Fmt(g[i].last.rss_mib, 1),
                                 " (", Fmt(g[i].max.rss_mib, 1), ")"),
                    absl::StrCat(Fmt(Percent(g[i].first.rss_mib, g[i].last.rss_mib), 1), " %")});
    rows.push_back(
        {p + "threads, fds, medians: after warm-up -> end (max)",
         absl::StrCat(g[i].first.threads, " -> ", g[i].last.threads, " (", g[i].max.threads, "), ",
                      g[i].first.fds, " -> ", g[i].last.fds, " (", g[i].max.fds, ")"),
         ""});
    rows.push_back({p + "CPU seconds (user + system)", Fmt(s.cpu_seconds, 1), ""});
    rows.push_back({p + "uploads ok / failed, exports ok / failed",
                    absl::StrCat(s.uploads.load(), " / ", s.upload_errors.load(), ", ",
                                 s.reads.load(), " / ", s.read_errors.load()),
                    ""});
  }
  PrintTable(absl::StrCat("checkpoint store memory: ", Fmt(minutes, 1), " min, ", uploaders,
                          " uploaders (one checkpoint every ", Fmt(upload_every_s, 1),
                          " s each) + 1 reader per store, SIGSTOP ", Fmt(stop_s, 0), " s every ",
                          Fmt(stop_every_s, 0), " s; medians of the first ", Fmt(window, 0),
                          " minutes after a ", Fmt(warmup, 0), "-minute warm-up and of the last ",
                          Fmt(window, 0), tls_dir.empty() ? "" : ", mutual TLS"),
             rows);
  // Per-minute anonymous memory, for the record.
  for (auto& sp : owned) {
    Store& s = *sp;
    absl::MutexLock lock(&s.mu);
    std::string line = "anon MiB by minute (median, max), " + s.name + ":";
    std::vector<Sample> minute_samples;
    for (size_t k = 0; k <= s.samples.size(); ++k) {
      if (!minute_samples.empty() &&
          (k == s.samples.size() || static_cast<int>(s.samples[k].minute) !=
                                        static_cast<int>(minute_samples.front().minute))) {
        double max = 0;
        for (const Sample& m : minute_samples) max = std::max(max, m.anon_mib);
        absl::StrAppend(&line, " ", Fmt(MedianOf(minute_samples).anon_mib, 1), "/", Fmt(max, 1));
        minute_samples.clear();
      }
      if (k < s.samples.size()) minute_samples.push_back(s.samples[k]);
    }
    std::printf("%s\n", line.c_str());
  }
  std::string last = absl::StrCat("store-memory: minutes=", Fmt(minutes, 1), " stops=", stops);
  for (size_t i = 0; i < owned.size(); ++i) {
    absl::StrAppend(&last, " ", owned[i]->key,
                    "_anon_growth=", Fmt(Percent(g[i].first.anon_mib, g[i].last.anon_mib), 1), "% ",
                    owned[i]->key,
                    "_rss_growth=", Fmt(Percent(g[i].first.rss_mib, g[i].last.rss_mib), 1), "% ",
                    owned[i]->key, "_anon_max_mib=", Fmt(g[i].max.anon_mib, 1), " ", owned[i]->key,
                    "_cpu_s=", Fmt(owned[i]->cpu_seconds, 1));
  }
  absl::StrAppend(&last, " uploads=", owned.front()->uploads.load());
  std::printf("%s\n", last.c_str());
  for (auto& sp : owned) sp->process->Terminate(absl::Seconds(10));
  return 0;
}

}  // namespace
}  // namespace shoal::bench

int main(int argc, char** argv) { return shoal::bench::Main(argc, argv); }
