#!/usr/bin/env bash
# Runs every fuzzer of BUILD_DIR for SECONDS each (make fuzz), starting from
# the committed corpus (tests/fuzz/corpus/<target>, read only: new inputs go
# to BUILD_DIR/fuzz-corpus/<target>), crashers to BUILD_DIR/fuzz-crashes/<target>/.
# Prints one line per target: executions, corpus size, crashes.
# FUZZ_TARGETS (environment): the targets to run, default all.
set -uo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS}
seconds=${2:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
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
failed=0
for t in "${targets[@]}"; do
  bin="$build/bin/fuzz_$t"
  work="$build/fuzz-corpus/$t"
  crashes="$build/fuzz-crashes/$t"
  mkdir -p "$work" "$crashes"
  log="$build/fuzz-$t.log"
  # -close_fd_mask=2: the services' log lines stay out of the way (libFuzzer
  # keeps its own output and sanitizer reports on a copy of stderr).
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -close_fd_mask=2 -print_final_stats=1 -artifact_prefix="$crashes/" \
    "$work" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  n_crash=$(find "$crashes" -type f | wc -l)
  n_corpus=$(find "$work" -type f | wc -l)
  echo "fuzz: $t execs=${execs:-0} corpus=$n_corpus crashes=$n_crash exit=$rc (log: $log)"
  if [[ $rc -ne 0 || $n_crash -ne 0 ]]; then failed=1; fi
done
if [[ $failed -ne 0 ]]; then
  echo "fuzz: crashes found: reproduce with BUILD/bin/fuzz_<target> <file>; make each a unit test"
  exit 1
fi
echo "fuzz: no crashes"
