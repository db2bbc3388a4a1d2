// exchange: one round's sharded average of a 64 MiB model (tensors of mixed
// sizes, one flat float32 vector as in Shoal) across N worker processes on
// loopback with the real Exchanger + PeerService + GrpcPeerClient, vs.
// torch.distributed.all_reduce with gloo on the same bytes and process count
// (bench/exchange/gloo_allreduce.py). The driver hands every worker the
// round plan (no coordinator, no training) and alternates Shoal and gloo
// repetitions. Time of a repetition = the slowest process's own time.
//
// Variants: shoal (as is), zc (bench/proto_zc zero-copy stream), and either
// with "+malloc" (worker processes that called TuneMalloc()).
//
//   shoal-bench-exchange [--workers=4] [--mib=64] [--reps=5]
//   [--variants=shoal,shoal+malloc,zc+malloc]
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

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "bench/common/bench_util.h"
#include "bench/proto_zc/zc_peer.h"
#include "common/grpc_util.h"
#include "common/sha256.h"
#include "services/worker/core/model_state.h"
#include "services/worker/exchanger.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"

namespace shoal::bench {
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
  const int index = static_cast<int>(flags.Int("index", 0));
  const uint64_t mib = flags.Int("mib", 64);
  const bool tune = flags.Int("malloc", 0) != 0;
  flags.CheckAllUsed();
  if (tune) TuneMalloc();
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
  ZcPeerService zc_service(&state);
  auto server = GrpcServer::Start("127.0.0.1:0", {&service});
  auto zc_server = GrpcServer::Start("127.0.0.1:0", {&zc_service});
  if (!server.ok() || !zc_server.ok()) return 2;
  std::printf("ready %s %s %lu\n", (*server)->address().c_str(), (*zc_server)->address().c_str(),
              static_cast<unsigned long>(rss_base));
  std::fflush(stdout);

  worker::GrpcPeerClient grpc_client;
  ZcPeerClient zc_client;
  std::map<std::string, std::vector<std::string>> peers;  // variant -> addresses
  std::string line;
  uint64_t round = 0;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> w = absl::StrSplit(line, ' ');
    if (w[0] == "peers") {  // peers VARIANT addr...
      peers[w[1]].assign(w.begin() + 2, w.end());
    } else if (w[0] == "prepare") {  // prepare ROUND: the trained model of this round
      (void)absl::SimpleAtoi(w[1], &round);
      for (uint64_t i = 0; i < total; ++i) params[i] = Value(i, index, round);
      state.BeginTraining(round);
      state.SetReady(round);
      std::printf("prepared %lu\n", static_cast<unsigned long>(round));
    } else if (w[0] == "go") {  // go VARIANT
      const std::string& variant = w[1];
      worker::PeerClient* client =
          variant == "zc" ? static_cast<worker::PeerClient*>(&zc_client) : &grpc_client;
      worker::Exchanger exchanger(client, &state, params, worker::ExchangeOptions());
      const shoal::v1::RoundPlan plan = MakePlan(round, total, peers[variant]);
      worker::ExchangeStats stats;
      const double cpu0 = SelfCpuSeconds();
      const absl::Time start = absl::Now();
      absl::Status s = exchanger.Run(plan, self, nullptr, &stats);
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
      const int n = static_cast<int>(peers[variant].size());
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
  (*zc_server)->Shutdown(absl::Seconds(1));
  return 0;
}

int RunDriver(Flags& flags) {
  const int n = static_cast<int>(flags.Int("workers", 4));
  const int64_t mib = flags.Int("mib", 64);
  const int reps = static_cast<int>(flags.Int("reps", 5));
  const std::string variants_flag = flags.Str("variants", "shoal");
  const std::string gloo = flags.Str("gloo", "");
  const std::string python = flags.Str("python", "/usr/bin/python3");
  const std::string log = flags.Str("log", "/dev/null");
  flags.CheckAllUsed();
  const std::vector<std::string> variants = absl::StrSplit(variants_flag, ',');
  const std::vector<uint64_t> sizes = LayerSizes(mib);
  const double model_bytes = mib * 1048576.0;

  // One set of N worker processes per malloc setting (variants ending in
  // "+malloc" run in processes that called TuneMalloc()).
  struct WorkerSet {
    std::vector<std::unique_ptr<Child>> procs;
    std::vector<uint64_t> rss_base;
  };
  std::map<int, WorkerSet> sets;
  for (const std::string& v : variants) {
    const int tuned = absl::EndsWith(v, "+malloc") ? 1 : 0;
    if (sets.count(tuned)) continue;
    WorkerSet& set = sets[tuned];
    for (int k = 0; k < n; ++k) {
      set.procs.push_back(std::make_unique<Child>(
          std::vector<std::string>{SelfExe(), "--role=worker", absl::StrCat("--index=", k),
                                   absl::StrCat("--mib=", mib), absl::StrCat("--malloc=", tuned)},
          log));
    }
    std::vector<std::string> grpc_addrs, zc_addrs;
    for (auto& w : set.procs) {
      std::string rest;
      if (!w->Expect("ready ", &rest, absl::Seconds(60))) {
        std::fprintf(stderr, "exchange: a worker did not start (log: %s)\n", log.c_str());
        return 2;
      }
      std::vector<std::string> p = absl::StrSplit(rest, ' ');
      grpc_addrs.push_back(p[0]);
      zc_addrs.push_back(p[1]);
      uint64_t base = 0;
      (void)absl::SimpleAtoi(p[2], &base);
      set.rss_base.push_back(base);
    }
    for (auto& w : set.procs) {
      w->Send("peers shoal " + absl::StrJoin(grpc_addrs, " "));
      w->Send("peers zc " + absl::StrJoin(zc_addrs, " "));
    }
  }

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
  std::map<std::string, uint64_t> peak_rss, peak_above_base;  // per variant
  std::map<std::string, std::vector<double>> retries;         // per variant, per rep
  std::map<std::string, std::vector<double>> cpu;             // CPU-s of all processes, per rep
  bool all_ok = true;
  // One Shoal repetition: returns the slowest worker's time.
  auto shoal_rep = [&](const std::string& name) -> double {
    const bool tuned = absl::EndsWith(name, "+malloc");
    const std::string variant(absl::StripSuffix(name, "+malloc"));
    WorkerSet& set = sets[tuned ? 1 : 0];
    auto& workers = set.procs;
    double rep_retries = 0, rep_cpu = 0;
    ++round;
    for (auto& w : workers) w->Send(absl::StrCat("prepare ", round));
    for (auto& w : workers) w->Expect("prepared", nullptr, absl::Seconds(60));
    for (auto& w : workers) w->Send("go " + variant);
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
      peak_rss[name] = std::max(peak_rss[name], rss);
      peak_above_base[name] = std::max(peak_above_base[name], rss - set.rss_base[k]);
    }
    retries[name].push_back(rep_retries / n);
    cpu[name].push_back(rep_cpu);
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

  std::vector<std::string> all = variants;
  if (gloo_proc) {
    all.push_back("gloo_flat");
    all.push_back("gloo_per_tensor");
  }
  auto run = [&](const std::string& v) {
    if (v == "gloo_flat") return gloo_rep("flat", v);
    if (v == "gloo_per_tensor") return gloo_rep("per_tensor", v);
    return shoal_rep(v);
  };
  for (const std::string& v : all) run(v);  // warm-up: connections, caches
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
  sets.clear();

  double baseline = 0;
  std::string baseline_name = "none";
  for (const std::string& g : {"gloo_flat", "gloo_per_tensor"}) {
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
    if (retries.count(v)) {
      absl::StrAppend(&note, "  UNAVAILABLE retries/worker ", Fmt(Median(retries[v]), 1));
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
  for (const std::string& v : variants) {
    rows.push_back({absl::StrCat(v, ": peak RSS / model"), Fmt(peak_rss[v] / model_bytes, 2),
                    absl::StrCat("largest VmHWM of a worker ", Fmt(peak_rss[v] / 1048576.0, 0),
                                 " MiB (", Fmt(peak_above_base[v] / model_bytes, 2),
                                 " x model above its RSS before the model was allocated)")});
  }
  PrintTable(
      absl::StrCat("exchange: one round's average of a ", mib, " MiB model (", sizes.size(),
                   " tensors) across ", n, " processes on loopback, slowest process's time, ", reps,
                   " repetitions (after 1 warm-up)"),
      rows);
  const double shoal = Median(secs[variants.front()]);
  auto key = [](const std::string& v) { return absl::StrReplaceAll(v, {{"+", "_"}}); };
  std::string figures = absl::StrCat(key(variants.front()), "_s=", Fmt(shoal, 3));
  for (size_t i = 1; i < variants.size(); ++i) {
    absl::StrAppend(&figures, " ", key(variants[i]), "_s=", Fmt(Median(secs[variants[i]]), 3));
  }
  if (baseline > 0) absl::StrAppend(&figures, " gloo_s=", Fmt(baseline, 3));
  absl::StrAppend(&figures, " ", key(variants.front()),
                  "_cpu_s=", Fmt(Median(cpu[variants.front()]), 3));
  if (baseline > 0) absl::StrAppend(&figures, " gloo_cpu_s=", Fmt(baseline_cpu, 3));
  absl::StrAppend(&figures, " rss_over_model=", Fmt(peak_rss[variants.front()] / model_bytes, 2));
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
  const std::string role = flags.Str("role", "driver");
  if (role == "worker") return shoal::bench::RunWorker(flags);
  return shoal::bench::RunDriver(flags);
}
