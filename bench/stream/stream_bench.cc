// stream: one 256 MiB tensor between two processes over Shoal's peer stream
// (PeerService serving a ModelState-bound buffer; GrpcPeerClient::ReadSlice
// into a preallocated, pre-touched buffer) vs. a plain TCP socket
// sender/receiver (1 MiB writes, recv straight into a preallocated buffer).
// Variants: shoal, tcp (the baseline), tcp_crc (TCP plus CRC-32C of every
// 1 MiB on both ends: the floor of any checksummed stream). Both processes
// set up glibc malloc as shoal-worker does (TuneMallocForTensorStreams).
// Every variant runs once per repetition, in alternating order, so load
// changes hit all alike.
//
//   shoal-bench-stream [--mib=256] [--reps=7] [--variants=shoal,tcp,tcp_crc]
//   shoal-bench-stream --role=server|client ...   (started by the driver)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "bench/common/bench_tls.h"
#include "bench/common/bench_util.h"
#include "common/crc32c.h"
#include "common/grpc_util.h"
#include "common/mutex_mode.h"
#include "services/worker/core/model_state.h"
#include "services/worker/malloc_tuning.h"
#include "services/worker/peer_client.h"
#include "services/worker/peer_service.h"

namespace shoal::bench {

// "--tls_dir=DIR" when this run uses TLS (bench_tls.h), handed to children.
std::string tls_arg;
namespace {

constexpr size_t kTcpChunk = 1 << 20;  // same piece size as Shoal's chunks

void Fill(float* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 1000003) * 0.25f;
}

bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= w;
  }
  return true;
}

bool RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= r;
  }
  return true;
}

constexpr uint64_t kWithCrc = uint64_t{1} << 63;  // request flag: CRC-32C per chunk

// Serves requests of 8 bytes (size, plus kWithCrc): the bytes in 1 MiB
// writes, each followed by its CRC-32C (4 bytes) when asked.
void ServeTcpConnection(int fd, const char* data, size_t size) {
  uint64_t want = 0;
  while (RecvAll(fd, reinterpret_cast<char*>(&want), sizeof(want))) {
    const bool crc = (want & kWithCrc) != 0;
    want = std::min<uint64_t>(want & ~kWithCrc, size);
    for (uint64_t off = 0; off < want; off += kTcpChunk) {
      const uint64_t n = std::min<uint64_t>(kTcpChunk, want - off);
      if (!SendAll(fd, data + off, n)) break;
      if (crc) {
        const uint32_t c = Crc32c(data + off, n);
        if (!SendAll(fd, reinterpret_cast<const char*>(&c), sizeof(c))) break;
      }
    }
  }
  close(fd);
}

int RunServer(Flags& flags) {
  worker::TuneMallocForTensorStreams();  // as shoal-worker's main() does
  DisableMutexDeadlockDetection();       // likewise
  const uint64_t mib = flags.Int("mib", 256);
  flags.CheckAllUsed();
  const uint64_t total = mib * (1 << 20) / sizeof(float);
  auto* params = static_cast<float*>(AllocTouched(total * sizeof(float)));
  Fill(params, total);

  worker::ModelState state(params, total, "bench");
  state.SetWorkerId("w1");
  state.BeginTraining(1);
  // CONTRIBUTION reads of round 1 may be served. As in a round, the chunks'
  // CRCs are computed here, when the contribution becomes readable.
  const absl::Time crc_start = absl::Now();
  state.SetReady(1);
  const double set_ready_s = absl::ToDoubleSeconds(absl::Now() - crc_start);
  worker::PeerService service(&state);
  auto server = GrpcServer::Start("127.0.0.1:0", {&service});
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return 2;
  }

  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(lfd, 8) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    perror("tcp listen");
    return 2;
  }
  std::thread([lfd, params, total] {
    while (true) {
      const int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::thread(ServeTcpConnection, fd, reinterpret_cast<const char*>(params),
                  total * sizeof(float))
          .detach();
    }
  }).detach();

  std::printf("ready grpc=%s tcp=%d setready=%.6f\n", (*server)->address().c_str(),
              ntohs(addr.sin_port), set_ready_s);
  std::fflush(stdout);
  char buf[256];
  while (fgets(buf, sizeof(buf), stdin) != nullptr) {
  }
  (*server)->Shutdown(absl::Seconds(1));
  std::_Exit(0);  // detached TCP threads may still be blocked in recv
}

bool Check(const float* got, uint64_t total) {
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, total / 3, total / 2, total - 1}) {
    if (got[i] != static_cast<float>(i % 1000003) * 0.25f) {
      std::fprintf(stderr, "wrong element %lu: %f\n", static_cast<unsigned long>(i), got[i]);
      return false;
    }
  }
  return true;
}

// Reads from the server at the addresses in `ready` on request: each "run
// VARIANT" line on stdin is answered with "result MBPS".
int RunClient(Flags& flags) {
  worker::TuneMallocForTensorStreams();  // as shoal-worker's main() does
  DisableMutexDeadlockDetection();       // likewise
  const int64_t mib = flags.Int("mib", 256);
  const std::string ready = flags.Str("server", "");
  flags.CheckAllUsed();
  std::map<std::string, std::string> addr;
  for (absl::string_view kv : absl::StrSplit(ready, ' ')) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    addr[p.first] = p.second;
  }
  const uint64_t total = mib * (1 << 20) / sizeof(float);
  const uint64_t bytes = total * sizeof(float);
  auto* dst = static_cast<float*>(AllocTouched(bytes));

  worker::GrpcPeerClient client;
  const int tfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int port = 0;
  (void)absl::SimpleAtoi(addr["tcp"], &port);
  sa.sin_port = htons(port);
  if (connect(tfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    perror("connect");
    return 2;
  }

  shoal::v1::ReadSliceRequest request;
  request.set_round(1);
  request.set_begin(0);
  request.set_end(total);
  request.set_kind(shoal::v1::CONTRIBUTION);
  request.set_reader_id("bench");

  char line[256];
  while (fgets(line, sizeof(line), stdin) != nullptr) {
    std::string v(line);
    v = v.substr(0, v.find_first_of("\r\n"));
    if (v.rfind("run ", 0) != 0) continue;
    v = v.substr(4);
    std::memset(dst, 0, 64);  // the check below must see fresh bytes
    dst[total - 1] = 0;
    const absl::Time start = absl::Now();
    absl::Status s;
    if (v == "shoal") {
      // What the Exchanger does with an AVERAGED chunk: one copy, straight
      // from gRPC's receive buffers into place.
      s = client.ReadSlice(addr["grpc"], request, absl::Seconds(120), [&](const ChunkView& c) {
        c.CopyTo(dst + c.begin);
        return true;
      });
    } else if (v == "tcp") {
      const uint64_t want = bytes;
      if (!SendAll(tfd, reinterpret_cast<const char*>(&want), sizeof(want)) ||
          !RecvAll(tfd, reinterpret_cast<char*>(dst), bytes)) {
        s = absl::UnavailableError("tcp read failed");
      }
    } else if (v == "tcp_crc") {
      // The floor of any checksummed stream: TCP plus CRC-32C (3 lanes) of
      // every 1 MiB on both ends, no framing, no extra copy.
      const uint64_t want = bytes | kWithCrc;
      if (!SendAll(tfd, reinterpret_cast<const char*>(&want), sizeof(want))) {
        s = absl::UnavailableError("tcp read failed");
      }
      auto* out = reinterpret_cast<char*>(dst);
      for (uint64_t off = 0; s.ok() && off < bytes; off += kTcpChunk) {
        const uint64_t n = std::min<uint64_t>(kTcpChunk, bytes - off);
        uint32_t crc = 0;
        if (!RecvAll(tfd, out + off, n) ||
            !RecvAll(tfd, reinterpret_cast<char*>(&crc), sizeof(crc))) {
          s = absl::UnavailableError("tcp read failed");
        } else if (Crc32c(out + off, n) != crc) {
          s = absl::DataLossError("checksum mismatch");
        }
      }
    } else {
      s = absl::InvalidArgumentError("unknown variant " + v);
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    if (!s.ok() || !Check(dst, total)) {
      std::fprintf(stderr, "%s read failed: %s\n", v.c_str(), s.ToString().c_str());
      std::printf("failed\n");
    } else {
      std::printf("result %.3f\n", bytes / secs / 1e6);
    }
    std::fflush(stdout);
  }
  return 0;
}

int RunDriver(Flags& flags) {
  const int64_t mib = flags.Int("mib", 256);
  const int reps = static_cast<int>(flags.Int("reps", 7));
  const std::string variants_flag = flags.Str("variants", "shoal,tcp,tcp_crc");
  const std::string log = flags.Str("log", "/dev/null");
  flags.CheckAllUsed();
  const std::vector<std::string> variants = absl::StrSplit(variants_flag, ',');
  for (const std::string& v : variants) {
    if (v != "shoal" && v != "tcp" && v != "tcp_crc") {
      std::fprintf(stderr, "stream: unknown variant %s (shoal, tcp, tcp_crc)\n", v.c_str());
      return 2;
    }
  }

  std::vector<std::string> server_argv = {SelfExe(), "--role=server", absl::StrCat("--mib=", mib)};
  if (!tls_arg.empty()) server_argv.push_back(tls_arg);
  Child server(server_argv, log);
  std::string ready;
  if (!server.Expect("ready ", &ready, absl::Seconds(60))) {
    std::fprintf(stderr, "stream: the server did not start (log: %s)\n", log.c_str());
    return 2;
  }
  double set_ready_s = 0;
  for (absl::string_view kv : absl::StrSplit(ready, ' ')) {
    if (absl::ConsumePrefix(&kv, "setready=")) (void)absl::SimpleAtod(kv, &set_ready_s);
  }
  std::vector<std::string> client_argv = {SelfExe(), "--role=client", absl::StrCat("--mib=", mib),
                                          "--server=" + ready};
  if (!tls_arg.empty()) client_argv.push_back(tls_arg);
  Child client(client_argv, log);
  // CPU-seconds of both processes per GB moved, per variant (all reps).
  std::map<std::string, double> cpu_total, gb_total;
  auto run = [&](const std::string& v) -> double {
    const double cpu0 = ProcessSchedSeconds(server.pid()) + ProcessSchedSeconds(client.pid());
    client.Send("run " + v);
    std::string rest;
    if (!client.Expect("result ", &rest, absl::Seconds(300))) {
      std::fprintf(stderr, "stream: variant %s failed (log: %s)\n", v.c_str(), log.c_str());
      std::exit(1);
    }
    double mbps = 0;
    (void)absl::SimpleAtod(rest, &mbps);
    cpu_total[v] += ProcessSchedSeconds(server.pid()) + ProcessSchedSeconds(client.pid()) - cpu0;
    gb_total[v] += mib * 1048576.0 / 1e9;
    return mbps;
  };

  for (const std::string& v : variants) run(v);  // warm-up: connections, caches
  cpu_total.clear();
  gb_total.clear();
  std::map<std::string, std::vector<double>> mbps;
  for (int r = 0; r < reps; ++r) {
    // Alternate the order so no variant always runs first.
    if (r % 2 == 0) {
      for (auto it = variants.begin(); it != variants.end(); ++it) mbps[*it].push_back(run(*it));
    } else {
      for (auto it = variants.rbegin(); it != variants.rend(); ++it) mbps[*it].push_back(run(*it));
    }
  }
  client.Stop(absl::Seconds(5));
  server.Stop(absl::Seconds(5));

  const bool has_tcp = mbps.count("tcp") > 0;
  const double tcp = has_tcp ? Median(mbps["tcp"]) : 0;
  const double tcp_cpu = has_tcp ? cpu_total["tcp"] / gb_total["tcp"] : 0;
  std::vector<Row> rows;
  for (const std::string& v : variants) {
    const double m = Median(mbps[v]);
    rows.push_back({absl::StrCat(v, " MB/s"), Fmt(m, 0),
                    absl::StrCat("median of ", reps, " [", Join(mbps[v], 0), "]",
                                 v == "tcp" ? "  (baseline)"
                                 : has_tcp  ? absl::StrCat("  ratio vs tcp ", Fmt(m / tcp, 3))
                                            : "")});
  }
  // CPU per GB: both processes, every thread (schedstat); less sensitive to
  // other load on the machine than throughput.
  for (const std::string& v : variants) {
    const double c = cpu_total[v] / gb_total[v];
    rows.push_back({absl::StrCat(v, " CPU-s/GB"), Fmt(c, 3),
                    absl::StrCat("server + client, all threads",
                                 v == "tcp" ? "  (baseline)"
                                 : has_tcp  ? absl::StrCat("  ratio vs tcp ", Fmt(c / tcp_cpu, 2))
                                            : "")});
  }
  rows.push_back({"shoal SetReady ms", Fmt(set_ready_s * 1e3, 1),
                  absl::StrCat("CRCs of the ", mib,
                               " MiB contribution, computed once when it becomes readable "
                               "(before the reads, not in the figures above)")});
  PrintTable(absl::StrCat("stream: ", mib, " MiB between two processes on loopback, ", reps,
                          " repetitions (after 1 warm-up)"),
             rows);
  std::string figures;
  for (const std::string& v : variants) {
    absl::StrAppend(&figures, v, "_MBps=", Fmt(Median(mbps[v]), 0), " ");
  }
  const std::string main_variant = mbps.count("shoal") ? "shoal" : variants.front();
  absl::StrAppend(&figures,
                  "shoal_cpu_s_per_GB=", Fmt(cpu_total[main_variant] / gb_total[main_variant], 3),
                  " tcp_cpu_s_per_GB=", Fmt(tcp_cpu, 3), " ");
  std::printf("stream: %sreps=%d cores=%d ratio=%s\n", figures.c_str(), reps, Cores(),
              has_tcp ? Fmt(Median(mbps[main_variant]) / tcp, 3).c_str() : "n/a");
  return 0;
}

}  // namespace
}  // namespace shoal::bench

int main(int argc, char** argv) {
  shoal::bench::Flags flags(argc, argv);
  shoal::bench::tls_arg = shoal::bench::ApplyBenchTls(flags);
  const std::string role = flags.Str("role", "driver");
  if (role == "server") return shoal::bench::RunServer(flags);
  if (role == "client") return shoal::bench::RunClient(flags);
  return shoal::bench::RunDriver(flags);
}
