// exchange: one round's sharded average of a 64 MiB model (tensors of mixed
// sizes, one flat float32 vector as in Shoal) across N worker processes on
// loopback with the real Exchanger + PeerService + GrpcPeerClient, vs.
// torch.distributed.all_reduce with gloo on the same bytes and process count
// (bench/exchange/gloo_allreduce.py). The driver hands every worker the
// round plan (no coordinator, no training) and alternates Shoal and gloo
// repetitions. Time of a repetition = the slowest process's own time.
//
// The worker processes set up glibc malloc as shoal-worker does
// (TuneMallocForTensorStreams) and, like a worker at the end of training,
// make their contribution readable (ModelState::SetReady, which computes its
// chunks' CRCs) before the timed exchange; that step's time is reported on
// its own.
//
//   shoal-bench-exchange [--workers=4] [--mib=64] [--reps=5]
//                        [--gloo=bench/exchange/gloo_allreduce.py] [--log=FILE]
//   shoal-bench-exchange --role=worker ...   (started by the driver)
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/common/bench_tls.h"
#include "bench/common/bench_util.h"
#include "common/grpc_util.h"
#include "common/mutex_mode.h"
#include "common/sha256.h"
#include "services/worker/core/model_state.h"
#include "services/worker/exchanger.h"
#include "services/worker/malloc_tuning.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"

namespace shoal::bench {

// "--tls_dir=DIR" when this run uses TLS (bench_tls.h), handed to children.
std::string tls_arg;
namespace {

// Tensor sizes (elements) of the benchmark model; the last one is sized so
// the model has exactly `mib` MiB.
std::vector<uint64_t> LayerSizes(uint64_t mib) {
  const uint64_t total = mib * (1 << 20) / sizeof(float);
  std::vector<uint64_t> sizes = {total * 3 / 8, total / 4, total / 8, total / 16, total / 32,
                                 250000,        100000,    50000,     4096,       1024,
                                 512,           128,       10};
  uint64_t used = 0;
  for (uint64_t s : sizes) used += s;
  sizes.push_back(total - used);
  return sizes;
}

// Contribution of worker `k` in round `round`: known values, so the driver
// can check the average.
float Value(uint64_t i, int k, uint64_t round) {
  return static_cast<float>(i % 1000) * 0.001f + static_cast<float>(k) +
         static_cast<float>(round % 3);
}

shoal::v1::RoundPlan MakePlan(uint64_t round, uint64_t total,
                              const std::vector<std::string>& addresses) {
  shoal::v1::RoundPlan plan;
  plan.set_round(round);
  plan.set_attempt(1);
  plan.set_total_elements(total);
  const uint64_t n = addresses.size();
  for (uint64_t k = 0; k < n; ++k) {
    auto* s = plan.add_slices();
    s->set_worker_id(absl::StrCat("w", k + 1));
    s->set_peer_address(addresses[k]);
    s->set_begin(k * total / n);  // as the coordinator's shard planner
    s->set_end((k + 1) * total / n);
  }
  return plan;
}

int RunWorker(Flags& flags) {
  worker::TuneMallocForTensorStreams();  // as shoal-worker's main() does
  DisableMutexDeadlockDetection();       // likewise
  const int index = static_cast<int>(flags.Int("index", 0));
  const uint64_t mib = flags.Int("mib", 64);
  flags.CheckAllUsed();
  const uint64_t rss_base = CurrentRssBytes();
  const std::vector<uint64_t> sizes = LayerSizes(mib);
  const uint64_t total = mib * (1 << 20) / sizeof(float);
  auto* params = static_cast<float*>(AllocTouched(total * sizeof(float)));

  worker::ModelState state(params, total, "bench");
  std::vector<worker::LayerSpan> layers;
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    layers.push_back({absl::StrCat("layer", i), offset, sizes[i]});
    offset += sizes[i];
  }
  (void)state.SetLayers(layers);
  const std::string self = absl::StrCat("w", index + 1);
  state.SetWorkerId(self);
  worker::PeerService service(&state);
  auto server = GrpcServer::Start("127.0.0.1:0", {&service});
  if (!server.ok()) return 2;
  std::printf("ready %s %lu\n", (*server)->address().c_str(), static_cast<unsigned long>(rss_base));
  std::fflush(stdout);

  worker::GrpcPeerClient grpc_client;
  std::vector<std::string> peers;
  std::string line;
  uint64_t round = 0;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> w = absl::StrSplit(line, ' ');
    if (w[0] == "peers") {  // peers addr...
      peers.assign(w.begin() + 1, w.end());
    } else if (w[0] == "prepare") {  // prepare ROUND: the trained model of this round
      (void)absl::SimpleAtoi(w[1], &round);
      // As the worker: close the previous round's window, wait until gRPC
      // has given back what it was sending from it, then "train".
      state.BeginTraining(round);
      (void)state.AwaitReturned(worker::ModelState::Buffer::kParameters, absl::Seconds(5));
      for (uint64_t i = 0; i < total; ++i) params[i] = Value(i, index, round);
      const absl::Time t0 = absl::Now();
      state.SetReady(round);
      std::printf("prepared %lu %.6f\n", static_cast<unsigned long>(round),
                  absl::ToDoubleSeconds(absl::Now() - t0));
    } else if (w[0] == "go") {
      worker::Exchanger exchanger(&grpc_client, &state, worker::ExchangeOptions());
      const shoal::v1::RoundPlan plan = MakePlan(round, total, peers);
      worker::ExchangeStats stats;
      const double cpu0 = SelfCpuSeconds();
      const absl::Time start = absl::Now();
      absl::Status s = exchanger.Average(plan, self, params, nullptr, &stats);
      const double secs = absl::ToDoubleSeconds(absl::Now() - start);
      // Every thread of this process during its exchange: its reads and the
      // gRPC threads serving the others.
      const double cpu = SelfCpuSeconds() - cpu0;
      if (!s.ok()) {
        std::fprintf(stderr, "exchange failed: %s\n", s.ToString().c_str());
        std::printf("failed\n");
        std::fflush(stdout);
        continue;
      }
      // Not timed: what the driver checks.
      const std::string hash = Sha256Hex(params, total * sizeof(float));
      double expect_offset = 0;
      const int n = static_cast<int>(peers.size());
      for (int k = 0; k < n; ++k) expect_offset += k;
      expect_offset = expect_offset / n + static_cast<double>(round % 3);
      bool values_ok = true;
      for (uint64_t i : {uint64_t{0}, total / 3, total / 2, total - 1}) {
        const double want = static_cast<float>(i % 1000) * 0.001f + expect_offset;
        values_ok &= std::fabs(params[i] - want) < 1e-3;
      }
      std::printf("done %.6f %s %d %lu %lu %d %.6f\n", secs, hash.c_str(), values_ok ? 1 : 0,
                  static_cast<unsigned long>(PeakRssBytes()),
                  static_cast<unsigned long>(stats.bytes_received), stats.retries, cpu);
    }
    std::fflush(stdout);
  }
  (*server)->Shutdown(absl::Seconds(1));
  return 0;
}

int RunDriver(Flags& flags) {
  const int n = static_cast<int>(flags.Int("workers", 4));
  const int64_t mib = flags.Int("mib", 64);
  const int reps = static_cast<int>(flags.Int("reps", 5));
  const std::string gloo = flags.Str("gloo", "");
  const std::string python = flags.Str("python", "/usr/bin/python3");
  const std::string log = flags.Str("log", "/dev/null");
  flags.CheckAllUsed();
  const std::vector<uint64_t> sizes = LayerSizes(mib);
  const double model_bytes = mib * 1048576.0;

  std::vector<std::unique_ptr<Child>> workers;
  std::vector<uint64_t> rss_base;
  for (int k = 0; k < n; ++k) {
    std::vector<std::string> argv = {SelfExe(), "--role=worker", absl::StrCat("--index=", k),
                                     absl::StrCat("--mib=", mib)};
    if (!tls_arg.empty()) argv.push_back(tls_arg);
    workers.push_back(std::make_unique<Child>(argv, log));
  }
  std::vector<std::string> addrs;
  for (auto& w : workers) {
    std::string rest;
    if (!w->Expect("ready ", &rest, absl::Seconds(60))) {
      std::fprintf(stderr, "exchange: a worker did not start (log: %s)\n", log.c_str());
      return 2;
    }
    std::vector<std::string> p = absl::StrSplit(rest, ' ');
    addrs.push_back(p[0]);
    uint64_t base = 0;
    (void)absl::SimpleAtoi(p[1], &base);
    rss_base.push_back(base);
  }
  for (auto& w : workers) w->Send("peers " + absl::StrJoin(addrs, " "));

  std::unique_ptr<Child> gloo_proc;
  if (!gloo.empty()) {
    std::vector<std::string> sizes_s;
    for (uint64_t s : sizes) sizes_s.push_back(absl::StrCat(s));
    gloo_proc = std::make_unique<Child>(
        std::vector<std::string>{python, gloo, absl::StrCat("--world=", n),
                                 absl::StrCat("--sizes=", absl::StrJoin(sizes_s, ","))},
        log);
    if (!gloo_proc->Expect("ready", nullptr, absl::Seconds(180))) {
      std::fprintf(stderr, "exchange: the gloo processes did not start (log: %s)\n", log.c_str());
      return 2;
    }
  }

  uint64_t round = 0;
  uint64_t peak_rss = 0, peak_above_base = 0;
  std::vector<double> retries;                     // per rep, per worker
  std::vector<double> set_ready_ms;                // per rep, slowest worker
  std::map<std::string, std::vector<double>> cpu;  // CPU-s of all processes, per rep
  bool all_ok = true;
  // One Shoal repetition: returns the slowest worker's time.
  auto shoal_rep = [&]() -> double {
    double rep_retries = 0, rep_cpu = 0, rep_set_ready = 0;
    ++round;
    for (auto& w : workers) w->Send(absl::StrCat("prepare ", round));
    for (auto& w : workers) {
      std::string rest;
      w->Expect("prepared ", &rest, absl::Seconds(60));
      std::vector<std::string> p = absl::StrSplit(rest, ' ');
      double secs = 0;
      if (p.size() >= 2) (void)absl::SimpleAtod(p[1], &secs);
      rep_set_ready = std::max(rep_set_ready, secs);
    }
    set_ready_ms.push_back(rep_set_ready * 1e3);
    for (auto& w : workers) w->Send("go");
    double slowest = 0;
    std::string first_hash;
    for (int k = 0; k < n; ++k) {
      std::string rest;
      if (!workers[k]->Expect("done ", &rest, absl::Seconds(300))) {
        std::fprintf(stderr, "exchange: worker %d failed (log: %s)\n", k, log.c_str());
        std::exit(1);
      }
      std::vector<std::string> p = absl::StrSplit(rest, ' ');
      double secs = 0;
      uint64_t rss = 0;
      int worker_retries = 0;
      (void)absl::SimpleAtod(p[0], &secs);
      (void)absl::SimpleAtoi(p[3], &rss);
      (void)absl::SimpleAtoi(p[5], &worker_retries);
      rep_retries += worker_retries;
      double worker_cpu = 0;
      (void)absl::SimpleAtod(p[6], &worker_cpu);
      rep_cpu += worker_cpu;
      slowest = std::max(slowest, secs);
      if (first_hash.empty()) first_hash = p[1];
      if (p[1] != first_hash || p[2] != "1") {
        std::fprintf(stderr, "exchange: worker %d ended with a different or wrong model\n", k);
        all_ok = false;
      }
      peak_rss = std::max(peak_rss, rss);
      peak_above_base = std::max(peak_above_base, rss - rss_base[k]);
    }
    retries.push_back(rep_retries / n);
    cpu["shoal"].push_back(rep_cpu);
    return slowest;
  };
  auto gloo_rep = [&](const std::string& mode, const std::string& name) -> double {
    gloo_proc->Send("go " + mode);
    std::string rest;
    if (!gloo_proc->Expect("done ", &rest, absl::Seconds(300))) {
      std::fprintf(stderr, "exchange: gloo failed (log: %s)\n", log.c_str());
      std::exit(1);
    }
    std::vector<std::string> p = absl::StrSplit(rest, ' ');
    double secs = 0;
    (void)absl::SimpleAtod(p[0], &secs);
    if (p.size() < 3 || p[1] != "1") {
      std::fprintf(stderr, "exchange: gloo result is wrong\n");
      all_ok = false;
    }
    double gloo_cpu = 0;
    if (p.size() >= 3) (void)absl::SimpleAtod(p[2], &gloo_cpu);
    cpu[name].push_back(gloo_cpu);
    return secs;
  };

  std::vector<std::string> all = {"shoal"};
  if (gloo_proc) {
    all.push_back("gloo_flat");
    all.push_back("gloo_per_tensor");
  }
  auto run = [&](const std::string& v) {
    if (v == "gloo_flat") return gloo_rep("flat", v);
    if (v == "gloo_per_tensor") return gloo_rep("per_tensor", v);
    return shoal_rep();
  };
  for (const std::string& v : all) run(v);  // warm-up: connections, caches
  retries.clear();
  set_ready_ms.clear();
  cpu.clear();
  std::map<std::string, std::vector<double>> secs;
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      for (auto it = all.begin(); it != all.end(); ++it) secs[*it].push_back(run(*it));
    } else {
      for (auto it = all.rbegin(); it != all.rend(); ++it) secs[*it].push_back(run(*it));
    }
  }
  if (gloo_proc) gloo_proc->Send("quit");
  gloo_proc.reset();
  workers.clear();

  double baseline = 0;
  std::string baseline_name = "none";
  for (const char* g : {"gloo_flat", "gloo_per_tensor"}) {
    if (secs.count(g) && (baseline == 0 || Median(secs[g]) < baseline)) {
      baseline = Median(secs[g]);
      baseline_name = g;
    }
  }
  std::vector<Row> rows;
  for (const std::string& v : all) {
    const double m = Median(secs[v]);
    std::string note = absl::StrCat("median of ", reps, " [", Join(secs[v], 3), "]");
    if (v == baseline_name) {
      absl::StrAppend(&note, "  (baseline: the faster gloo way)");
    } else if (baseline > 0) {
      absl::StrAppend(&note, "  ratio vs baseline ", Fmt(m / baseline, 2));
    }
    if (v == "shoal") {
      absl::StrAppend(&note, "  UNAVAILABLE retries/worker ", Fmt(Median(retries), 1));
    }
    rows.push_back({absl::StrCat(v, " s"), Fmt(m, 3), note});
  }
  // CPU-seconds per round over all processes: less sensitive to other load
  // on the machine than wall time.
  const double baseline_cpu = baseline > 0 ? Median(cpu[baseline_name]) : 0;
  for (const std::string& v : all) {
    const double c = Median(cpu[v]);
    rows.push_back(
        {absl::StrCat(v, " CPU-s"), Fmt(c, 3),
         absl::StrCat("all ", n, " processes, median",
                      v == baseline_name || baseline_cpu <= 0
                          ? ""
                          : absl::StrCat("  ratio vs baseline ", Fmt(c / baseline_cpu, 2)))});
  }
  rows.push_back({"shoal SetReady ms", Fmt(Median(set_ready_ms), 1),
                  "CRCs of the contribution, computed when training ends (before the exchange, "
                  "not in its time); slowest worker, median"});
  rows.push_back({"shoal: peak RSS / model", Fmt(peak_rss / model_bytes, 2),
                  absl::StrCat("largest VmHWM of a worker ", Fmt(peak_rss / 1048576.0, 0), " MiB (",
                               Fmt(peak_above_base / model_bytes, 2),
                               " x model above its RSS before the model was allocated)")});
  PrintTable(
      absl::StrCat("exchange: one round's average of a ", mib, " MiB model (", sizes.size(),
                   " tensors) across ", n, " processes on loopback, slowest process's time, ", reps,
                   " repetitions (after 1 warm-up)"),
      rows);
  const double shoal = Median(secs["shoal"]);
  std::string figures = absl::StrCat("shoal_s=", Fmt(shoal, 3));
  if (baseline > 0) absl::StrAppend(&figures, " gloo_s=", Fmt(baseline, 3));
  absl::StrAppend(&figures, " shoal_cpu_s=", Fmt(Median(cpu["shoal"]), 3));
  if (baseline > 0) absl::StrAppend(&figures, " gloo_cpu_s=", Fmt(baseline_cpu, 3));
  absl::StrAppend(&figures, " rss_over_model=", Fmt(peak_rss / model_bytes, 2));
  std::printf("exchange: %s reps=%d cores=%d ratio=%s\n", figures.c_str(), reps, Cores(),
              baseline > 0 ? Fmt(shoal / baseline, 3).c_str() : "n/a");
  if (!all_ok) {
    std::fprintf(stderr, "exchange: a result was wrong (see above)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shoal::bench

int main(int argc, char** argv) {
  shoal::bench::Flags flags(argc, argv);
  shoal::bench::tls_arg = shoal::bench::ApplyBenchTls(flags);
  const std::string role = flags.Str("role", "driver");
  if (role == "worker") return shoal::bench::RunWorker(flags);
  return shoal::bench::RunDriver(flags);
}
