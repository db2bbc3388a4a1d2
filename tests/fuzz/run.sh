#!/usr/bin/env bash
# Runs every fuzzer of BUILD_DIR for SECONDS each (make fuzz), starting from
# the committed corpus (tests/fuzz/corpus/<target>, read only: new inputs go
# to BUILD_DIR/fuzz-corpus/<target>), crashers to BUILD_DIR/fuzz-crashes/<target>/.
# Prints one line per target: wall and CPU seconds, executions, corpus size,
# crashes.
# Environment:
#   FUZZ_TARGETS  the targets to run (default all);
#   FUZZ_JOBS     targets run at once, one core each (default 1);
#   FUZZ_MERGE=1  afterwards, merge each target's new inputs that add coverage
#                 into the committed corpus (libFuzzer -merge=1), to commit.
set -uo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS}
seconds=${2:-60}
jobs=${FUZZ_JOBS:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: FUZZ_JOBS must be a number of jobs (1 or more), got '$jobs'" >&2
  exit 2
fi
# Every target has a corpus directory (fuzz_corpus_test requires one), so
# the corpus directories are the list; FUZZ_TARGETS="a b" runs a subset.
if [[ -n "${FUZZ_TARGETS:-}" ]]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=()
  for d in "$root"/tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi
# UBSan's reports stop the fuzzer (by default UBSan prints and goes on, and
# libFuzzer never sees undefined behaviour as a crash).
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

# One target; its summary line goes to $build/fuzz-$t.summary.
run_one() {
  local t=$1
  local bin="$build/bin/fuzz_$t" work="$build/fuzz-corpus/$t" crashes="$build/fuzz-crashes/$t"
  local log="$build/fuzz-$t.log"
  mkdir -p "$work" "$crashes"
  local started=$SECONDS
  # -close_fd_mask=2: the services' log lines stay out of the way (libFuzzer
  # keeps its own output and sanitizer reports on a copy of stderr).
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -close_fd_mask=2 -print_final_stats=1 -artifact_prefix="$crashes/" \
    "$work" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1 &
  echo $! >"$build/fuzz-$t.pid"
  wait $!
  local rc=$?
  rm -f "$build/fuzz-$t.pid"
  # The fuzzer's CPU time (user + system; this subshell's only child so
  # far): -max_total_time counts wall time, and a busy machine gives less.
  # `times` runs in this shell (in $(...) it would count a new subshell's).
  local cpu
  times >"$build/fuzz-$t.times"
  cpu=$(tail -1 "$build/fuzz-$t.times" | awk '{ t = 0; for (i = 1; i <= 2; ++i) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] } printf "%d", t }')
  rm -f "$build/fuzz-$t.times"
  local execs n_crash n_corpus merged=""
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  n_crash=$(find "$crashes" -type f | wc -l)
  n_corpus=$(find "$work" -type f | wc -l)
  if [[ "${FUZZ_MERGE:-0}" == 1 && $rc -eq 0 && $n_crash -eq 0 ]]; then
    local before after
    before=$(find "$root/tests/fuzz/corpus/$t" -type f | wc -l)
    "$bin" -merge=1 -timeout=10 -rss_limit_mb=2048 -max_len=8192 -close_fd_mask=2 \
      "$root/tests/fuzz/corpus/$t" "$work" >"$build/fuzz-$t.merge.log" 2>&1
    after=$(find "$root/tests/fuzz/corpus/$t" -type f | wc -l)
    merged=" merged=$((after - before))"
  fi
  echo "fuzz: $t seconds=$((SECONDS - started)) cpu_seconds=$cpu execs=${execs:-0} corpus=$n_corpus" \
    "crashes=$n_crash exit=$rc$merged (log: $log)" >"$build/fuzz-$t.summary"
}

# Interrupted: stop every fuzzer still running, by its PID.
stop_all() {
  for t in "${targets[@]}"; do
    [[ -f "$build/fuzz-$t.pid" ]] && kill "$(cat "$build/fuzz-$t.pid")" 2>/dev/null
  done
  exit 130
}
trap stop_all INT TERM

running=0
for t in "${targets[@]}"; do
  if [[ ! -x "$build/bin/fuzz_$t" ]]; then
    echo "fuzz: $t has no fuzzer in $build/bin (build the fuzzers target)" >&2
    exit 2
  fi
  rm -f "$build/fuzz-$t.summary"
  run_one "$t" &
  running=$((running + 1))
  if [[ $running -ge $jobs ]]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=0
for t in "${targets[@]}"; do
  line=$(cat "$build/fuzz-$t.summary" 2>/dev/null || echo "fuzz: $t did not finish exit=1")
  echo "$line"
  [[ "$line" == *" crashes=0 exit=0"* ]] || failed=1
done
if [[ $failed -ne 0 ]]; then
  echo "fuzz: crashes found: reproduce with BUILD/bin/fuzz_<target> <file>; make each a unit test"
  exit 1
fi
echo "fuzz: no crashes"
