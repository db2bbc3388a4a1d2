// etcd: N calls of one kind that a coordinator replica makes, through
// Shoal's own etcd client (common/etcd_client.h), against a running etcd.
// bench/etcd/etcd_bench.py scrapes the member's /metrics before and after
// (go_memstats_alloc_bytes_total) to give what one call costs etcd.
//
//   shoal-bench-etcd-calls --endpoint=127.0.0.1:2379 --kind=get --n=1000
//
// Kinds: get (linearizable read), get_local (serializable read), keepalive
// (a lease renewal: one stream each), campaign (a Txn whose comparison
// fails: a standby's campaign before 2026-11-30), put (a Txn writing 136
// bytes: the per-round record), watch (a delete watch that times out after
// 1 ms). Prints "kind=K n=N seconds=S".
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "common/etcd_client.h"

ABSL_FLAG(std::string, endpoint, "127.0.0.1:2379", "etcd member (host:port)");
ABSL_FLAG(std::string, kind, "get", "get | get_local | keepalive | campaign | put | watch");
ABSL_FLAG(int, n, 1000, "calls");
ABSL_FLAG(std::string, prefix, "/shoal-bench-etcd/", "key prefix");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  shoal::EtcdClientOptions options;
  options.endpoints = {absl::GetFlag(FLAGS_endpoint)};
  options.call_timeout = absl::Seconds(5);
  auto client = shoal::MakeGrpcEtcdClient(options);
  if (!client.ok()) {
    fprintf(stderr, "etcd client: %s\n", client.status().ToString().c_str());
    return 1;
  }
  shoal::EtcdClient& etcd = **client;
  const std::string prefix = absl::GetFlag(FLAGS_prefix);
  const std::string leader = prefix + "leader";
  const std::string record = prefix + "record";
  absl::StatusOr<int64_t> lease = etcd.GrantLease(absl::Seconds(30));
  if (!lease.ok()) {
    fprintf(stderr, "etcd lease: %s\n", lease.status().ToString().c_str());
    return 1;
  }
  // The leader key on this lease, as a leader holds it.
  (void)etcd.Txn({shoal::EtcdCompare::Absent(leader)}, {{leader, "bench", *lease}}, {leader});
  int64_t revision = 0;
  if (auto kv = etcd.Get(leader); kv.ok() && kv->has_value()) revision = (*kv)->read_revision;
  const std::string bytes(136, 'r');
  const std::map<std::string, std::function<absl::Status()>> kinds = {
      {"get", [&] { return etcd.Get(leader).status(); }},
      {"get_local", [&] { return etcd.GetLocal(leader).status(); }},
      {"keepalive", [&] { return etcd.KeepAlive(*lease).status(); }},
      {"campaign",
       [&] {
         return etcd
             .Txn({shoal::EtcdCompare::Absent(leader)}, {{leader, "other", *lease}}, {leader})
             .status();
       }},
      {"put",
       [&] {
         return etcd.Txn({}, {{record, bytes, 0}}, {}).status();
       }},
      {"watch", [&] { return etcd.AwaitDelete(leader, revision, absl::Milliseconds(1)).status(); }},
  };
  const auto it = kinds.find(absl::GetFlag(FLAGS_kind));
  if (it == kinds.end()) {
    fprintf(stderr, "unknown --kind=%s\n", absl::GetFlag(FLAGS_kind).c_str());
    return 2;
  }
  const int n = absl::GetFlag(FLAGS_n);
  const absl::Time start = absl::Now();
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    if (!it->second().ok()) ++failed;
  }
  printf("kind=%s n=%d failed=%d seconds=%.3f\n", it->first.c_str(), n, failed,
         absl::ToDoubleSeconds(absl::Now() - start));
  (void)etcd.RevokeLease(*lease);
  return 0;
}
