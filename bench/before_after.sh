#!/usr/bin/env bash
# Before and after in one run: alternates `bench/run.sh stream` and
# `bench/run.sh exchange` between an old build and this one RUNS times, then
# runs the fp32 arms of the hier benchmark once per build. The old build is
# any build directory of an older commit (e.g. a git worktree built with
# `make build`).
#
#   bench/before_after.sh OLD_BUILD_DIR [RUNS]      (RUNS default 3)
#
# One line per benchmark run: "<run> <old|new> <name> <its last line>".
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: bench/before_after.sh OLD_BUILD_DIR [RUNS]}
RUNS=${2:-3}
NEW=${BUILD:-build}
for i in $(seq 1 "$RUNS"); do
  for side in old new; do
    b=$NEW
    [[ $side == old ]] && b=$OLD
    for name in stream exchange; do
      echo "$i $side $name $(BUILD=$b bash bench/run.sh "$name" 2>/dev/null | tail -1)"
    done
  done
done
for side in old new; do
  b=$NEW
  [[ $side == old ]] && b=$OLD
  out=$(mktemp -d /tmp/shoal-before-after-XXXXXX)
  echo "hier $side $(/usr/bin/python3 bench/hier/hier.py --bin="$b/bin" --out="$out" \
    --arms=flat,hier 2>"$out/hier.log" | tail -1)"
done
