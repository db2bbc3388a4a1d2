// latejoin: a joiner pulls a 150 MB model with the real ModelSyncer
// (its public Sync entry point) from 3 holders, each capped by the worker's
// upload rate limit (RateLimiter + PeerService(state, limiter), as
// --upload_rate_mbps does), vs. from 1 such holder; and from 3 holders one of
// which runs at half the rate, vs. the ideal sum of the rates.
// Holders are separate processes; the driver is the joiner. Configurations
// alternate within each repetition.
//
//   shoal-bench-latejoin [--mb=150] [--rate_mbps=400] [--reps=3] [--log=FILE]
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/common/bench_util.h"
#include "common/grpc_util.h"
#include "common/rate_limiter.h"
#include "common/sha256.h"
#include "services/worker/core/model_state.h"
#include "services/worker/model_syncer.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"

namespace shoal::bench {
namespace {

constexpr uint64_t kRound = 5;

// A model of `elements` floats in tensors of mixed sizes (a few big ones,
// many small ones), so the syncer splits some and groups none.
std::vector<worker::LayerSpan> Layers(uint64_t elements) {
  std::vector<uint64_t> sizes = {elements * 3 / 10, elements / 5, elements / 10, elements / 10,
                                 elements / 20};
  for (int i = 0; i < 40; ++i) sizes.push_back(elements / 400);
  uint64_t used = 0;
  for (uint64_t s : sizes) used += s;
  sizes.push_back(elements - used);
  std::vector<worker::LayerSpan> layers;
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    layers.push_back({absl::StrCat("layer", i), offset, sizes[i]});
    offset += sizes[i];
  }
  return layers;
}

void Fill(float* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 65521) * 1e-4f - 3.0f;
}

int RunHolder(Flags& flags) {
  const uint64_t bytes = flags.Int("mb", 150) * 1000000;
  const double rate_mbps = flags.Double("rate_mbps", 400);
  flags.CheckAllUsed();
  const uint64_t total = bytes / sizeof(float);
  auto* model = static_cast<float*>(AllocTouched(total * sizeof(float)));
  Fill(model, total);
  const std::string hash = Sha256Hex(model, total * sizeof(float));
  // A holder between rounds: its snapshot is the averaged model of kRound.
  worker::ModelState state(model, total, "bench");
  state.SetWorkerId("holder");
  (void)state.SetLayers(Layers(total));
  state.BindSnapshot(model);
  state.SetModel(kRound, hash);
  state.SetSnapshot(kRound);
  RateLimiter limiter(rate_mbps * 1e6 / 8);  // as the worker's --upload_rate_mbps
  worker::PeerService service(&state, &limiter);
  auto server = GrpcServer::Start("127.0.0.1:0", {&service});
  if (!server.ok()) return 2;
  std::printf("ready %s %s\n", (*server)->address().c_str(), hash.c_str());
  std::fflush(stdout);
  char buf[256];
  while (fgets(buf, sizeof(buf), stdin) != nullptr) {
  }
  (*server)->Shutdown(absl::Seconds(1));
  return 0;
}

int RunDriver(Flags& flags) {
  const int64_t mb = flags.Int("mb", 150);
  const double rate_mbps = flags.Double("rate_mbps", 400);
  const int reps = static_cast<int>(flags.Int("reps", 3));
  const std::string log = flags.Str("log", "/dev/null");
  flags.CheckAllUsed();
  const uint64_t total = mb * 1000000 / sizeof(float);
  const double bytes = total * sizeof(float);
  const double rate = rate_mbps * 1e6 / 8;  // bytes per second

  // Holders: three at the rate, one at half of it.
  struct Holder {
    std::unique_ptr<Child> child;
    std::string address;
  };
  std::vector<Holder> holders(4);
  std::string hash;
  for (int i = 0; i < 4; ++i) {
    const double r = i < 3 ? rate_mbps : rate_mbps / 2;
    holders[i].child = std::make_unique<Child>(
        std::vector<std::string>{SelfExe(), "--role=holder", absl::StrCat("--mb=", mb),
                                 absl::StrCat("--rate_mbps=", r)},
        log);
  }
  for (Holder& h : holders) {
    std::string rest;
    if (!h.child->Expect("ready ", &rest, absl::Seconds(120))) {
      std::fprintf(stderr, "latejoin: a holder did not start (log: %s)\n", log.c_str());
      return 2;
    }
    std::vector<std::string> p = absl::StrSplit(rest, ' ');
    h.address = p[0];
    hash = p[1];
  }

  auto* dst = static_cast<float*>(AllocTouched(total * sizeof(float)));
  worker::GrpcPeerClient client;
  worker::SyncOptions options;
  worker::ModelSyncer syncer(&client, options);
  const std::map<std::string, std::vector<std::string>> configs = {
      {"1 peer", {holders[0].address}},
      {"3 peers", {holders[0].address, holders[1].address, holders[2].address}},
      {"3 peers, one at half rate", {holders[0].address, holders[1].address, holders[3].address}},
  };
  const std::vector<std::string> order = {"1 peer", "3 peers", "3 peers, one at half rate"};
  bool ok = true;
  std::map<std::string, std::string> shares;
  auto run = [&](const std::string& name) -> double {
    std::memset(dst, 0, total * sizeof(float));
    worker::SyncProgress progress;
    worker::SyncStats stats;
    const absl::Time start = absl::Now();
    absl::Status s =
        syncer.Sync(kRound, hash, configs.at(name), dst, total, "w99", &progress, {}, &stats);
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    if (!s.ok()) {
      std::fprintf(stderr, "latejoin: sync from %s failed: %s\n", name.c_str(),
                   s.ToString().c_str());
      ok = false;
    }
    std::string share;
    for (const auto& p : stats.peers) absl::StrAppend(&share, Fmt(p.bytes / 1e6, 0), "MB ");
    shares[name] = share;
    return secs;
  };
  // Warm-up: connections, and each holder hashes its manifest once.
  run("3 peers, one at half rate");
  run("3 peers");
  std::map<std::string, std::vector<double>> secs;
  for (int r = 0; r < reps; ++r) {
    for (const std::string& name : order) secs[name].push_back(run(name));
  }
  for (Holder& h : holders) h.child->Stop(absl::Seconds(3));

  const double t1 = Median(secs["1 peer"]);
  const double t3 = Median(secs["3 peers"]);
  const double th = Median(secs["3 peers, one at half rate"]);
  const double ideal1 = bytes / rate, ideal3 = bytes / (3 * rate), idealh = bytes / (2.5 * rate);
  std::vector<Row> rows;
  for (const std::string& name : order) {
    const double ideal = name == "1 peer" ? ideal1 : name == "3 peers" ? ideal3 : idealh;
    const double m = Median(secs[name]);
    rows.push_back({absl::StrCat(name, " s"), Fmt(m, 2),
                    absl::StrCat("median of ", reps, " [", Join(secs[name], 2), "]  ideal ",
                                 Fmt(ideal, 2), " s (", Fmt(ideal / m * 100, 0),
                                 "% of the rate sum)  bytes per holder: ", shares[name])});
  }
  rows.push_back({"speed-up 1 -> 3 peers", Fmt(t1 / t3, 2), "(baseline: 1 peer; ideal 3.00)"});
  rows.push_back(
      {"half-rate run vs ideal", Fmt(idealh / th, 2), "ideal time (rates 1 + 1 + 0.5) / measured"});
  PrintTable(
      absl::StrCat("latejoin: pull a ", mb, " MB model with ModelSyncer, each holder capped at ",
                   Fmt(rate_mbps, 0), " Mbit/s (", Fmt(rate / 1e6, 1), " MB/s), ", reps,
                   " repetitions (after 2 warm-ups)"),
      rows);
  std::printf(
      "latejoin: one_peer_s=%s three_peers_s=%s half_rate_s=%s half_rate_vs_ideal=%s "
      "reps=%d cores=%d ratio=%s\n",
      Fmt(t1, 2).c_str(), Fmt(t3, 2).c_str(), Fmt(th, 2).c_str(), Fmt(idealh / th, 2).c_str(), reps,
      Cores(), Fmt(t1 / t3 / 3, 3).c_str());
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace shoal::bench

int main(int argc, char** argv) {
  shoal::bench::Flags flags(argc, argv);
  const std::string role = flags.Str("role", "driver");
  if (role == "holder") return shoal::bench::RunHolder(flags);
  return shoal::bench::RunDriver(flags);
}
