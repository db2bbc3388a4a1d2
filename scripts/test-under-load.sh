#!/usr/bin/env bash
# The test suite on a busy machine (issue 30): builds once, starts
# scripts/cpu-hog.sh (one busy process per core unless HOGS says otherwise),
# runs the suite RUNS times in a row (default 3) with the same ctest command
# as `make test`, stops the hog by its PID at the end (also on failure and on
# SIGINT/SIGTERM), and prints one line per run and a last summary line:
#
#   under-load run 1/3: passed=822 failed=1 total=823 seconds=641 load=4.12 failed_tests=Foo.Bar
#   under-load: runs=3 green=2 hogs=2 result=FAIL
#
#   bash scripts/test-under-load.sh [RUNS]
#
# Environment: BUILD (default build), HOGS (default nproc), TEST_FILTER (a
# ctest -R regex: a subset, e.g. to check this script), CTEST_JOBS (default 2,
# as `make test`), SKIP_BUILD=1 (run the build as it is), OUT (logs; default
# a new /tmp/shoal-under-load-XXXXXX).
# The machine should otherwise be idle: the hog is the load.
set -euo pipefail

runs="${1:-3}"
if ! [[ "$runs" =~ ^[0-9]+$ ]] || [[ "$runs" -lt 1 ]]; then
  echo "usage: $0 [RUNS]   (RUNS a positive integer)" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-build}"
[[ "$build" = /* ]] || build="$here/$build"
hogs="${HOGS:-$(nproc)}"
jobs="${CTEST_JOBS:-2}"
out="${OUT:-$(mktemp -d /tmp/shoal-under-load-XXXXXX)}"
mkdir -p "$out"

hog_pid=""
stop_hog() {
  if [[ -n "$hog_pid" ]]; then
    # cpu-hog.sh stops its hogs by PID in its own trap.
    kill -TERM "$hog_pid" 2>/dev/null || true
    wait "$hog_pid" 2>/dev/null || true
    hog_pid=""
  fi
}
trap stop_hog EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Built before the hog starts (what `make test` would build first); the
# build is not what is measured. SKIP_BUILD=1 uses the build as it is.
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  echo "under-load: building $build" >&2
  if [[ -f "$build/build.ninja" ]]; then
    ninja -C "$build" > "$out/build.log" 2>&1
  else
    (cd "$here" && make build BUILD="$build") > "$out/build.log" 2>&1
  fi || { tail -50 "$out/build.log" >&2; exit 1; }
fi

bash "$here/scripts/cpu-hog.sh" "$hogs" --pidfile "$out/hog.pids" 2> "$out/hog.log" &
hog_pid=$!
# The hogs are running once their pid file exists.
for _ in $(seq 1 100); do
  [[ -s "$out/hog.pids" ]] && break
  kill -0 "$hog_pid" 2>/dev/null || { cat "$out/hog.log" >&2; exit 1; }
  sleep 0.1
done
[[ -s "$out/hog.pids" ]] || { echo "under-load: the hog did not start" >&2; exit 1; }

ctest_args=(--output-on-failure -j"$jobs" --timeout 900)
[[ -n "${TEST_FILTER:-}" ]] && ctest_args+=(-R "$TEST_FILTER")
echo "under-load: $runs run(s) of ctest ${ctest_args[*]} with $hogs hog(s); logs in $out" >&2

green=0
for ((r = 1; r <= runs; r++)); do
  log="$out/run-$r.log"
  start=$(date +%s)
  set +e
  (cd "$build" && ctest "${ctest_args[@]}") > "$log" 2>&1
  code=$?
  set -e
  seconds=$(( $(date +%s) - start ))
  load=$(cut -d' ' -f1 /proc/loadavg)
  # "97% tests passed, 3 tests failed out of 823"
  summary=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)
  total=$(sed -nE 's/.* out of ([0-9]+).*/\1/p' <<< "$summary")
  failed=$(sed -nE 's/.*passed, ([0-9]+) tests? failed.*/\1/p' <<< "$summary")
  total=${total:-0}
  failed=${failed:-0}
  passed=$(( total - failed ))
  # The names after "The following tests FAILED:", comma-separated.
  names=$(sed -n '/The following tests FAILED:/,$p' "$log" | sed -nE 's/^[[:space:]]+[0-9]+ - ([^ ]+) .*/\1/p' |
          paste -sd, - || true)
  [[ "$code" -eq 0 && "$total" -gt 0 ]] && green=$(( green + 1 ))
  echo "under-load run $r/$runs: passed=$passed failed=$failed total=$total seconds=$seconds" \
       "load=$load exit=$code${names:+ failed_tests=$names}"
done
stop_hog
result=PASS
[[ "$green" -eq "$runs" ]] || result=FAIL
echo "under-load: runs=$runs green=$green hogs=$hogs result=$result (logs in $out)"
[[ "$result" == PASS ]]
