#!/usr/bin/env bash
# Runs Shoal's benchmarks (issue #6). Each prints a small table (figures,
# baseline, repetitions, cores, load) and ends with one line
# `NAME: <figures> ratio=<value>`.
#   bench/run.sh NAME     NAME: stream | exchange | latejoin | coordinator | web | micro | demo | tls | straggler | failover | compress | quality | wan | hier | hetero | python | scale | sigterm | audit | etcd | store | junk_joins | all
# Environment:
#   BUILD=build           build directory (bench binaries in $BUILD/bin; `make build` first)
#   BENCH_OUT=DIR         where outputs and logs go (default: a new /tmp/shoal-bench-XXXXXX)
#   BENCH_QUICK=1         fewer repetitions / smaller runs (a smoke run, not for RESULTS.md)
#   BENCH_RECORD=0        do not record the results (default: each arm's last line goes
#                         into bench/results.jsonl and bench/RESULTS.md's table is rendered
#                         again; with BENCH_QUICK=1 into $BENCH_OUT/results.jsonl only)
#   BENCH_RESULTS=FILE    record into FILE instead (the table is not rendered then)
# Nothing here asserts on time; a benchmark fails only when its result is wrong
# (a bad average, a failed pull) or a process does not start.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
BIN="$BUILD/bin"
OUT=${BENCH_OUT:-$(mktemp -d /tmp/shoal-bench-XXXXXX)}
mkdir -p "$OUT"
QUICK=${BENCH_QUICK:-0}
NAME=${1:-}
RESULTS=${BENCH_RESULTS:-}
if [[ -z "$RESULTS" && "$QUICK" == 1 ]]; then RESULTS="$OUT/results.jsonl"; fi
# The commit the results name, taken before any arm runs (a commit made
# meanwhile is not what was measured).
COMMIT=$(/usr/bin/python3 bench/results.py commit)
START_DATE="" START_LOAD=""

usage() {
  echo "usage: bench/run.sh stream|exchange|latejoin|coordinator|web|micro|demo|tls|straggler|failover|compress|quality|wan|hier|hetero|python|scale|sigterm|audit|etcd|store|junk_joins|all" >&2
  exit 2
}
[[ -n "$NAME" ]] || usage

build() {
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    echo "bench: no build in $BUILD; run 'make build' first" >&2
    exit 2
  fi
  # Not `ninja ... | grep -q`: grep stops at the first match, ninja dies of
  # SIGPIPE on a long target list, and pipefail turns that into a failure.
  local targets
  targets=$(ninja -C "$BUILD" -t targets all 2>/dev/null || true)
  if ! grep -q '^bench_binaries:' <<<"$targets"; then
    echo "bench: $BUILD has no bench targets; the top-level CMakeLists.txt needs" >&2
    echo "  add_subdirectory(bench EXCLUDE_FROM_ALL)   (then re-run cmake or make build)" >&2
    exit 2
  fi
  ninja -C "$BUILD" bench_binaries shoal-coordinator shoal-worker shoalctl >"$OUT/build.log" 2>&1 ||
    { tail -n 30 "$OUT/build.log"; exit 1; }
}

header() {
  START_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
  echo
  echo "bench $1: $START_DATE, $(nproc) cores, load average $START_LOAD, logs in $OUT"
}

# Records an arm's result: the last line of $OUT/NAME.txt, with the arm's
# start (date, load average), the commit and the machine, as one line of
# bench/results.jsonl; then bench/RESULTS.md's table is rendered again
# (bench/results.py). A failure to record is said, not fatal: the run's
# figures are in $OUT either way.
record_result() {
  [[ "${BENCH_RECORD:-1}" == 0 ]] && return 0
  local args=(add "$1" --from "$OUT/$1.txt" --date "$START_DATE" --load "$START_LOAD"
              --commit "$COMMIT" --logs "$OUT" --source run.sh)
  [[ -n "$RESULTS" ]] && args+=(--results "$RESULTS" --no-render)
  /usr/bin/python3 bench/results.py "${args[@]}" ||
    echo "bench: $1 not recorded; by hand: /usr/bin/python3 bench/results.py add $1 --from $OUT/$1.txt" >&2
}

# Runs a benchmark: its table and final line on stdout (also in $OUT/NAME.txt),
# its diagnostics in $OUT/NAME.log.
run_stream() {
  header stream
  local reps=9 mib=256
  [[ "$QUICK" == 1 ]] && reps=3 mib=64
  "$BIN/shoal-bench-stream" --mib=$mib --reps=$reps --variants=shoal,tcp,tcp_crc \
    --log="$OUT/stream.log" 2>>"$OUT/stream.log" | tee "$OUT/stream.txt"
}

# One round's average against gloo's all_reduce, at 64 MiB and at 400 MB
# (issue 47: the exchange at gloo's speed at any size). The last line is the
# 64 MiB run's with the 400 MB one's ratio added (ratio_400mb=).
run_exchange() {
  header exchange
  local reps=7 big_reps=3 big_mib=382
  [[ "$QUICK" == 1 ]] && reps=2 big_reps=1 big_mib=128
  "$BIN/shoal-bench-exchange" --workers=4 --mib=64 --reps=$reps \
    --gloo="$ROOT/bench/exchange/gloo_allreduce.py" --python=/usr/bin/python3 \
    --log="$OUT/exchange.log" 2>>"$OUT/exchange.log" | tee "$OUT/exchange-64.txt"
  "$BIN/shoal-bench-exchange" --workers=4 --mib=$big_mib --reps=$big_reps \
    --gloo="$ROOT/bench/exchange/gloo_allreduce.py" --python=/usr/bin/python3 \
    --log="$OUT/exchange.log" 2>>"$OUT/exchange.log" | tee "$OUT/exchange-400.txt"
  local small big
  small=$(grep '^exchange:' "$OUT/exchange-64.txt" | tail -n 1)
  big=$(grep '^exchange:' "$OUT/exchange-400.txt" | tail -n 1 | sed -n 's/.* ratio=\([0-9.]*\).*/\1/p')
  echo "$small ratio_400mb=$big mib_400mb=$big_mib" | tee "$OUT/exchange.txt"
}

# Models of real size (issue 47, bench/scale/scale.py): per size the loop
# alone and with Shoal (plain and --overlap=on), memory, utilization, round
# time and the exchange against its loopback bound; at the largest size a
# late joiner, a checkpoint and its export. SCALE_ARGS passes more flags.
run_scale() {
  header scale
  # 500 M: the loop alone and the big run (two workers, a late joiner, a
  # checkpoint, an export); three 500 M workers with --overlap would not fit.
  local args=(--sizes=1m,10m,100m --big --big_size=500m)
  [[ "$QUICK" == 1 ]] && args=(--sizes=1m,10m --rounds=3)
  # The plot: Debian's matplotlib (scripts/install-deps.sh --bench).
  bash scripts/install-deps.sh --bench >>"$OUT/scale.log" 2>&1 || true
  mkdir -p "$OUT/scale"
  /usr/bin/python3 bench/scale/scale.py --bin="$BIN" --pythonpath="$BUILD/python" \
    --out="$OUT/scale" "${args[@]}" ${SCALE_ARGS:-} 2>>"$OUT/scale.log" | tee "$OUT/scale.txt"
}

# The cost of TLS (issue 14): the stream and exchange benchmarks in plain
# text and over mutual TLS (certificates from scripts/make-certs.sh), one after
# the other in one run. Last line: tls: ... ratio=<stream MB/s TLS / plain>.
run_tls() {
  header tls
  local reps=5 mib=128 xreps=3
  [[ "$QUICK" == 1 ]] && reps=2 mib=32 xreps=1
  local pki="$OUT/pki"
  bash "$ROOT/scripts/make-certs.sh" "$pki" 127.0.0.1 localhost >>"$OUT/tls.log"
  local -A line
  local mode arg
  for mode in plain tls; do
    arg=()
    [[ $mode == tls ]] && arg=(--tls_dir="$pki")
    line[stream_$mode]=$("$BIN/shoal-bench-stream" --mib=$mib --reps=$reps --variants=shoal \
      "${arg[@]}" --log="$OUT/tls.log" 2>>"$OUT/tls.log" | tail -n 1)
    line[exchange_$mode]=$("$BIN/shoal-bench-exchange" --workers=4 --mib=64 --reps=$xreps \
      "${arg[@]}" --log="$OUT/tls.log" 2>>"$OUT/tls.log" | tail -n 1)
  done
  field() { grep -o "$2=[0-9.]*" <<<"${line[$1]}" | head -n 1 | cut -d= -f2; }
  local sp st sc tc xp xt
  sp=$(field stream_plain shoal_MBps) st=$(field stream_tls shoal_MBps)
  sc=$(field stream_plain shoal_cpu_s_per_GB) tc=$(field stream_tls shoal_cpu_s_per_GB)
  xp=$(field exchange_plain shoal_s) xt=$(field exchange_tls shoal_s)
  if [[ -z "$sp" || -z "$st" || -z "$xp" || -z "$xt" ]]; then
    echo "tls: a run failed (log: $OUT/tls.log)" >&2
    return 1
  fi
  {
    echo "tls: plain text vs mutual TLS on loopback (stream: $mib MiB x $reps; exchange: 4 processes, 64 MiB x $xreps)"
    printf '  %-34s %12s %12s %8s\n' figure plain tls tls/plain
    printf '  %-34s %12s %12s %8s\n' "stream MB/s (median)" "$sp" "$st" "$(awk -v a="$st" -v b="$sp" 'BEGIN{printf "%.3f", a/b}')"
    printf '  %-34s %12s %12s %8s\n' "stream CPU s per GB (both ends)" "$sc" "$tc" "$(awk -v a="$tc" -v b="$sc" 'BEGIN{printf "%.3f", a/b}')"
    printf '  %-34s %12s %12s %8s\n' "exchange s (slowest process)" "$xp" "$xt" "$(awk -v a="$xt" -v b="$xp" 'BEGIN{printf "%.3f", a/b}')"
    echo "tls: stream_plain_MBps=$sp stream_tls_MBps=$st exchange_plain_s=$xp exchange_tls_s=$xt cores=$(nproc) ratio=$(awk -v a="$st" -v b="$sp" 'BEGIN{printf "%.3f", a/b}')"
  } | tee "$OUT/tls.txt"
}

run_latejoin() {
  header latejoin
  local reps=3
  [[ "$QUICK" == 1 ]] && reps=1
  "$BIN/shoal-bench-latejoin" --mb=150 --rate_mbps=400 --reps=$reps \
    --log="$OUT/latejoin.log" 2>>"$OUT/latejoin.log" | tee "$OUT/latejoin.txt"
}

run_coordinator() {
  header coordinator
  local reps=3 large=1000 rounds_small=2000 rounds_large=8
  # The relayed run: 10,000 workers behind 100 supernodes (one Relay stream
  # each; docs/SUPERNODES.md "Relay"), once (its joins take ~20 s).
  local relayed=10000 relays=100 rounds_relayed=20
  [[ "$QUICK" == 1 ]] && reps=1 large=200 rounds_small=300 rounds_large=4 relayed=2000 relays=20
  mkdir -p "$OUT/coordinator"
  # SHOAL_BENCH_OTHER_COORDINATOR=PATH: also measure another shoal-coordinator
  # binary (e.g. one built from an older commit) in the same run, as "other".
  "$BIN/shoal-bench-coordinator" --coordinator_bin="$BIN/shoal-coordinator" \
    --proto_bin="${SHOAL_BENCH_OTHER_COORDINATOR:-}" --small=10 \
    --large=$large --reps=$reps --rounds_small=$rounds_small --rounds_large=$rounds_large \
    --relayed=$relayed --relays=$relays --rounds_relayed=$rounds_relayed \
    --log_dir="$OUT/coordinator" 2>>"$OUT/coordinator.log" | tee "$OUT/coordinator.txt"
}

# The web page's and /metrics' cost at 1,000 simulated workers (issue 15):
# a short coordinator run with --http_listen, then timed GETs of /metrics,
# /api/status and /api/history against its finished run. Last line: the
# `web:` line of each request in one, web: workers=N metrics_p50_ms= ...
# metrics_cpu_ms= ... status_fresh_cpu_ms= ... history_bytes=.
run_web() {
  header web
  local large=1000
  [[ "$QUICK" == 1 ]] && large=200
  mkdir -p "$OUT/web"
  "$BIN/shoal-bench-coordinator" --coordinator_bin="$BIN/shoal-coordinator" --small=10 \
    --large=$large --reps=1 --rounds_small=20 --rounds_large=8 --web_requests=100 \
    --log_dir="$OUT/web" 2>>"$OUT/web.log" | tee "$OUT/web.txt"
  awk '/^web: workers=/ {
         match($0, /path="[^"]*"/); path = substr($0, RSTART + 6, RLENGTH - 7)
         if (path == "/metrics") key = "metrics"
         else if (path == "/api/status (fresh)") key = "status_fresh"
         else if (path == "/api/status (cached)") key = "status_cached"
         else if (path == "/api/history") key = "history"
         else next
         keys[++n] = key
         for (i = 2; i <= NF; i++) {
           split($i, kv, "=")
           if (kv[1] == "workers") workers = kv[2]
           else if (kv[1] == "p50_ms") v[key "_p50_ms"] = kv[2]
           else if (kv[1] == "cpu_ms_per_request") v[key "_cpu_ms"] = kv[2]
           else if (kv[1] == "bytes") v[key "_bytes"] = kv[2]
         }
       }
       END {
         if (n == 0) exit 1
         printf "web: workers=%s", workers
         for (j = 1; j <= n; j++)
           printf " %s_p50_ms=%s %s_cpu_ms=%s %s_bytes=%s", keys[j], v[keys[j] "_p50_ms"], keys[j],
                  v[keys[j] "_cpu_ms"], keys[j], v[keys[j] "_bytes"]
         printf "\n"
       }' "$OUT/web.txt" | tee -a "$OUT/web.txt"
}

run_micro() {
  header micro
  local reps=5
  [[ "$QUICK" == 1 ]] && reps=2
  "$BIN/shoal-bench-micro" --benchmark_repetitions=$reps --benchmark_report_aggregates_only=true \
    --benchmark_min_time=0.2 --benchmark_out="$OUT/micro.json" --benchmark_out_format=json \
    >"$OUT/micro.log" 2>&1
  /usr/bin/python3 bench/micro/summarize.py "$OUT/micro.json" | tee "$OUT/micro.txt"
}

run_demo() {
  header demo
  local rounds=10
  [[ "$QUICK" == 1 ]] && rounds=3
  mkdir -p "$OUT/demo"
  SHOAL_DEMO_ROUNDS=$rounds SHOAL_DEMO_LOGS="$OUT/demo" bash scripts/demo.sh "$BIN" \
    >"$OUT/demo.out" 2>&1 || { tail -n 20 "$OUT/demo.out"; return 1; }
  /usr/bin/python3 bench/demo/summarize.py "$OUT/demo.out" "$OUT/demo" | tee "$OUT/demo.txt"
}

# Issue 16: each codec, 4 workers, fixed rounds and steps (bench/compress).
run_compress() {
  header compress
  local rounds=10 steps=50
  [[ "$QUICK" == 1 ]] && rounds=3 steps=20
  bash bench/compress/compress.sh "$BIN" "$OUT" $rounds $steps | tee "$OUT/compress.txt"
}

# Issue 16: final accuracy at equal samples, one process vs 4 workers, IID
# and label_skew:0.3, outer optimizer none and nesterov (bench/quality).
run_quality() {
  header quality
  local rounds=20 steps=50
  [[ "$QUICK" == 1 ]] && rounds=5 steps=25
  bash bench/quality/quality.sh "$BIN" "$OUT" $rounds $steps | tee "$OUT/quality.txt"
}

# Issue 11: 4 workers on Fashion-MNIST, one throttled to 1/4 speed from
# outside (SIGSTOP/SIGCONT duty cycle); time to 0.85 test accuracy for today's
# sync (fixed deadline, late work dropped), adaptive deadline + folding, and
# gossip (when the coordinator has --mode=gossip); accuracy at equal samples
# without a straggler. Each arm capped (10 min; BENCH_QUICK: 4 min).
run_straggler() {
  header straggler
  local cap=600 equal=10
  [[ "$QUICK" == 1 ]] && cap=240 equal=4
  mkdir -p "$OUT/straggler"
  /usr/bin/python3 bench/straggler/straggler.py --bin="$BIN" --out="$OUT/straggler" \
    --cap_seconds=$cap --equal_rounds=$equal ${STRAGGLER_ARGS:-} \
    2>>"$OUT/straggler.log" | tee "$OUT/straggler.txt"
}

# Coordinator replicas on etcd (issue 13): kills of the leader, failover time
# against the lease TTL, rounds lost, round time with --etcd vs --state_dir.
run_failover() {
  header failover
  local kills=20
  [[ "$QUICK" == 1 ]] && kills=3
  mkdir -p "$OUT/failover"
  /usr/bin/python3 bench/failover/failover.py --bin="$BIN" --kills=$kills \
    --out="$OUT/failover" 2>>"$OUT/failover.log" | tee "$OUT/failover.txt"
}

# Issue 16: 4 workers in network namespaces behind tc tbf 20 Mbit/s links;
# time to 0.87 test accuracy for PyTorch DDP (gloo), Shoal fp32 and Shoal
# int8 + Nesterov, and one fp32 exchange against the line-rate bound
# (bench/wan/wan.py). Needs root, ip and tc. Each arm capped (10 min;
# BENCH_QUICK: 3 min). WAN_ARGS: extra wan.py flags.
# Flat against hierarchical averaging over two sites joined by a 20 Mbit/s
# link (issue 12): namespaces from tests/support/two_sites.sh, a 4 MiB model.
run_hier() {
  header hier
  local rounds=8
  [[ "$QUICK" == 1 ]] && rounds=5
  mkdir -p "$OUT/hier"
  /usr/bin/python3 bench/hier/hier.py --bin="$BIN" --out="$OUT/hier" --rounds=$rounds \
    ${HIER_ARGS:-} 2>>"$OUT/hier.log" | tee "$OUT/hier.txt"
}

# Issue 49: 4 workers in network namespaces (bench/wan's), one behind a
# 10 Mbit/s link, three at 100 Mbit/s (tc tbf both ways), a 21 MB model:
# the exchange time with --slice_sizing=bandwidth / =equal, and / the
# bandwidth-weighted bound (bench/hetero/hetero.py). Needs root, ip and tc.
# HETERO_ARGS: extra hetero.py flags.
run_hetero() {
  header hetero
  local rounds=8
  [[ "$QUICK" == 1 ]] && rounds=5
  mkdir -p "$OUT/hetero"
  /usr/bin/python3 bench/hetero/hetero.py --bin="$BIN" --out="$OUT/hetero" --rounds=$rounds \
    ${HETERO_ARGS:-} 2>>"$OUT/hetero.log" | tee "$OUT/hetero.txt"
}

run_wan() {
  header wan
  local cap=600
  [[ "$QUICK" == 1 ]] && cap=180
  mkdir -p "$OUT/wan"
  /usr/bin/python3 bench/wan/wan.py --bin="$BIN" --out="$OUT/wan" --cap_seconds=$cap \
    ${WAN_ARGS:-} 2>>"$OUT/wan.log" | tee "$OUT/wan.txt"
}

run_python() {
  header python
  local args=()
  [[ "$QUICK" == 1 ]] && args=(--rounds=6 --local_steps=50 --lm_rounds=6 --lm_steps=10)
  mkdir -p "$OUT/python"
  /usr/bin/python3 bench/python/python_bench.py --bin="$BIN" --pythonpath="$BUILD/python" \
    --out="$OUT/python" "${args[@]}" 2>>"$OUT/python.log" | tee "$OUT/python.txt"
}

# SIGTERM to exit per binary and state (tests/e2e/shutdown_test.cc prints a
# `sigterm:` line per case); goal: every one under 5 s. Last line:
# sigterm: cases=N slowest_s=S goal_s=5 met=yes|no ratio=<S / 5>.
run_sigterm() {
  header sigterm
  (cd "$BUILD" && SHOAL_BIN_DIR="$PWD/bin" ./bin/shutdown_test) >"$OUT/sigterm.log" 2>&1 ||
    { tail -n 40 "$OUT/sigterm.log"; return 1; }
  grep '^sigterm:' "$OUT/sigterm.log" | tee "$OUT/sigterm.txt"
  awk '/^sigterm:/ { s = $(NF); sub(/s$/, "", s); if (s + 0 > max) max = s + 0; n++ }
       END { printf "sigterm: cases=%d slowest_s=%.2f goal_s=5 met=%s ratio=%.3f\n", n, max,
             (max < 5 ? "yes" : "no"), max / 5 }' "$OUT/sigterm.log" | tee -a "$OUT/sigterm.txt"
}

# A status that cannot be inflated (issue 50): a real coordinator and two
# real workers training while 10,000 junk Joins (the longest name allowed,
# an address each, never a session) arrive from 8 callers; the status's
# size right after the flood and once the session grace removed the junk,
# and the rounds completed meanwhile (tests/e2e/limits_e2e_test.cc). Last
# line: junk_joins: ... status_bytes_after_flood=B ... ratio=<B / 1 MiB>.
run_junk_joins() {
  header junk_joins
  local joins=10000
  [[ "$QUICK" == 1 ]] && joins=2000
  (cd "$BUILD" && SHOAL_BIN_DIR="$PWD/bin" SHOAL_JUNK_JOINS=$joins ./bin/limits_e2e_test \
    --gtest_filter='*JunkJoins*') >"$OUT/junk_joins.log" 2>&1 ||
    { tail -n 40 "$OUT/junk_joins.log"; return 1; }
  grep '^junk_joins=' "$OUT/junk_joins.log" | tee "$OUT/junk_joins.txt"
  awk -F'[ =]' '/^junk_joins=/ { for (i = 1; i < NF; i += 2) v[$i] = $(i + 1) }
       END { printf "junk_joins: joins=%d accepted=%d refused_busy=%d status_bytes_after_flood=%d status_bytes_settled=%d rounds_during=%d goal_bytes=1048576 met=%s ratio=%.4f\n",
             v["junk_joins"], v["accepted"], v["refused_busy"], v["status_bytes_after_flood"],
             v["status_bytes_settled"], v["rounds_during"],
             (v["status_bytes_after_flood"] < 1048576 ? "yes" : "no"),
             v["status_bytes_after_flood"] / 1048576 }' \
    "$OUT/junk_joins.log" | tee -a "$OUT/junk_joins.txt"
}

# Audits by replay (issue 28): their extra compute at --audit_rate 0.05, 0.1
# and 0.2 against 0 (3 honest workers), and the time from a shuffled-labels
# worker's first round to its ban over 5 audit seeds (bench/audit).
run_audit() {
  header audit
  local rounds=100 steps=50 seeds=5 cheat_rounds=40
  [[ "$QUICK" == 1 ]] && rounds=20 steps=20 seeds=2 cheat_rounds=20
  bash bench/audit/audit.sh "$BIN" "$OUT" $rounds $steps $seeds $cheat_rounds \
    2>>"$OUT/audit.log" | tee "$OUT/audit.txt"
}

# etcd under the coordinator replicas (issue 30): what each kind of call a
# replica makes costs an etcd member, and two replicas' effect on a 3-member
# cluster's memory against a cluster without them (bench/etcd).
run_etcd() {
  header etcd
  local minutes=20 n=1000
  [[ "$QUICK" == 1 ]] && minutes=3 n=200
  /usr/bin/python3 bench/etcd/etcd_bench.py --bin="$BIN" --minutes=$minutes --n=$n \
    --out="$OUT" 2>>"$OUT/etcd.log" | tee "$OUT/etcd.txt"
}

# The checkpoint store's memory under bursts (issue 30): two stores, with
# and without --trim_interval, under the same uploads, exports and SIGSTOPs,
# over mutual TLS as the soak runs them (bench/store).
run_store() {
  header store
  local minutes=15 warmup=3
  [[ "$QUICK" == 1 ]] && minutes=3 warmup=1
  local pki="$OUT/store-pki"
  bash "$ROOT/scripts/make-certs.sh" "$pki" 127.0.0.1 localhost >>"$OUT/store.log"
  "$BIN/shoal-bench-store-memory" --bin="$BIN" --work="$OUT/store" --minutes=$minutes \
    --warmup_minutes=$warmup --tls_dir="$pki" 2>>"$OUT/store.log" | tee "$OUT/store.txt"
}

case "$NAME" in
  store)
    ninja -C "$BUILD" shoal-checkpoint shoal-bench-store-memory >"$OUT/build.log" 2>&1 ||
      { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  etcd)
    ninja -C "$BUILD" shoal-coordinator shoal-bench-etcd-calls >"$OUT/build.log" 2>&1 ||
      { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  audit)
    # The coordinator and the worker only (the status comes from the
    # coordinator's /api/status): no bench binaries needed.
    ninja -C "$BUILD" shoal-coordinator shoal-worker >"$OUT/build.log" 2>&1 ||
      { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  junk_joins)
    ninja -C "$BUILD" shoal-coordinator shoal-worker shoalctl limits_e2e_test \
      >"$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  sigterm)
    ninja -C "$BUILD" shoal-coordinator shoal-worker shoal-checkpoint shoalctl shutdown_test \
      >"$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  python)
    ninja -C "$BUILD" shoal-coordinator shoal-worker shoalctl _shoal >"$OUT/build.log" 2>&1 ||
      { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  scale)
    ninja -C "$BUILD" shoal-coordinator shoal-checkpoint shoalctl _shoal shoal-bench-stream \
      >"$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  failover | wan | hier | hetero)
    if [[ ! -x "$BIN/shoal-coordinator" ]]; then
      echo "bench: no $BIN/shoal-coordinator; run 'make build' first" >&2
      exit 2
    fi
    ninja -C "$BUILD" shoal-coordinator shoal-worker shoalctl >"$OUT/build.log" 2>&1 ||
      { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  quality)
    # Only the coordinator and the worker: no bench binaries needed.
    ninja -C "$BUILD" shoal-coordinator shoal-worker >"$OUT/build.log" 2>&1 ||
      { tail -n 30 "$OUT/build.log"; exit 1; }
    ;;
  stream | exchange | latejoin | coordinator | web | micro | demo | tls | straggler | compress)
    build
    ;;
  all)
    build
    start=$(date +%s)
    failed=()
    for n in micro stream exchange latejoin coordinator demo; do
      if "run_$n"; then record_result "$n"; else failed+=("$n"); fi
    done
    echo
    echo "bench all: $(( $(date +%s) - start )) s, load average $(cut -d' ' -f1-3 /proc/loadavg), outputs in $OUT"
    for n in micro stream exchange latejoin coordinator demo; do
      if [[ -s "$OUT/$n.txt" ]]; then tail -n 1 "$OUT/$n.txt"; fi
    done
    if [[ ${#failed[@]} -gt 0 ]]; then
      echo "bench all: FAILED: ${failed[*]} (logs in $OUT)"
      exit 1
    fi
    exit 0
    ;;
  *) usage ;;
esac
# The case above built what the arm needs; the arm runs, then is recorded.
"run_$NAME"
record_result "$NAME"
