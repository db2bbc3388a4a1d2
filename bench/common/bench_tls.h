// --tls_dir=DIR for the network benchmarks (issue 14's TLS cost): DIR holds
// what scripts/make-certs.sh makes, and every server and channel of the
// process then uses mutual TLS with that CA and certificate.
#ifndef SHOAL_BENCH_COMMON_BENCH_TLS_H_
#define SHOAL_BENCH_COMMON_BENCH_TLS_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "bench/common/bench_util.h"
#include "common/tls.h"

namespace shoal::bench {

// Reads --tls_dir and makes it the process's TLS configuration. Returns the
// argument to hand on to child processes ("" when TLS is off).
inline std::string ApplyBenchTls(Flags& flags) {
  const std::string dir = flags.Str("tls_dir", "");
  if (dir.empty()) return "";
  auto tls = LoadTls({dir + "/shoal.pem", dir + "/shoal.key", dir + "/ca.pem", ""});
  if (!tls.ok()) {
    std::fprintf(stderr, "--tls_dir: %s\n", tls.status().ToString().c_str());
    std::exit(2);
  }
  SetProcessTls(*std::move(tls));
  return "--tls_dir=" + dir;
}

}  // namespace shoal::bench

#endif  // SHOAL_BENCH_COMMON_BENCH_TLS_H_
