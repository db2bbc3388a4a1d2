#!/usr/bin/env bash
# bench/run.sh quality (issue 16): final test accuracy of the Fashion-MNIST MLP
# after the same number of training samples, seen by one process and by 4
# workers averaging every round, with IID and Dirichlet label-skew data, each
# with outer optimizer none and nesterov.
#
# Same samples: every arm runs ROUNDS rounds with the same batch size. The one
# process is one Shoal worker with min_participants=1 (so data_shards=1: the
# whole training set) and 4 x STEPS local steps per round; each of the 4
# workers runs STEPS local steps on its quarter. Both see
# ROUNDS x 4 x STEPS x batch samples; the one process takes 4x the
# optimizer steps, the 4 workers average 4 models every round.
# The last line: `quality: ... ratio=<4 workers IID accuracy / one process accuracy>`
# (both with outer optimizer none). The adaptive deadline is off: on a loaded
# machine it could drop a slow worker's round and change what is measured;
# the table says how many rounds had all 4 workers.
# Usage: quality.sh BIN OUT [ROUNDS] [STEPS]
# Environment: QUALITY_SKEW (default label_skew:0.3), QUALITY_OUTER_LR (0.7),
# QUALITY_OUTER_MOMENTUM (0.9), QUALITY_ARMS (subset of the arm names below).
set -euo pipefail
BIN=$1
OUT=$2
ROUNDS=${3:-20}
STEPS=${4:-50}
SKEW=${QUALITY_SKEW:-label_skew:0.3}
OUTER_LR=${QUALITY_OUTER_LR:-0.7}
OUTER_MOMENTUM=${QUALITY_OUTER_MOMENTUM:-0.9}
BATCH=64
ARMS=${QUALITY_ARMS:-"one/none one/nesterov iid/none iid/nesterov skew/none skew/nesterov"}
mkdir -p "$OUT/quality"

# PIDS, stop_all (by PID, also at exit).
source "$(dirname "${BASH_SOURCE[0]}")/../common/procs.sh"

# run_one ARM: ARM is DATA/OUTER, DATA one of one (1 process), iid, skew.
run_one() {
  local arm=$1 data=${1%/*} outer=${1#*/} dir="$OUT/quality/${1//\//_}"
  local workers=4 steps=$STEPS split=iid
  case "$data" in
    one) workers=1 steps=$((4 * STEPS)) ;;
    iid) ;;
    skew) split=$SKEW ;;
    *) echo "quality: unknown arm $arm" >&2; return 1 ;;
  esac
  mkdir -p "$dir"
  local start=$(date +%s)
  "$BIN/shoal-coordinator" --listen=127.0.0.1:0 --min_participants=$workers \
    --local_steps="$steps" --rounds="$ROUNDS" --eval_every="$ROUNDS" --batch_size=$BATCH \
    --data_split="$split" --outer_optimizer="$outer" --outer_lr="$OUTER_LR" \
    --outer_momentum="$OUTER_MOMENTUM" --adaptive_deadline=false \
    >"$dir/coordinator.log" 2>&1 &
  PIDS+=($!)
  local addr=""
  for _ in $(seq 100); do
    addr=$(grep -o 'listening on 127\.0\.0\.1:[0-9]*' "$dir/coordinator.log" 2>/dev/null |
      head -1 | cut -d' ' -f3) || true
    [[ -n "$addr" ]] && break
    sleep 0.1
  done
  [[ -n "$addr" ]] || { echo "quality: coordinator did not start" >&2; cat "$dir/coordinator.log" >&2; return 1; }
  local wpids=()
  for i in $(seq $workers); do
    "$BIN/shoal-worker" --coordinator="$addr" --listen=127.0.0.1:0 --name="w$i" \
      >"$dir/worker-$i.log" 2>&1 &
    PIDS+=($!)
    wpids+=($!)
  done
  # Workers leave by themselves when the run is finished (capped at 20 min).
  local deadline=$(( $(date +%s) + 1200 ))
  for pid in "${wpids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [[ $(date +%s) -lt $deadline ]]; do sleep 1; done
  done
  stop_all
  echo "$arm $workers $steps $split $(( $(date +%s) - start ))" >>"$OUT/quality/arms.txt"
}

rm -f "$OUT/quality/arms.txt"
for a in $ARMS; do run_one "$a"; done
/usr/bin/python3 - "$OUT/quality" "$ROUNDS" "$STEPS" "$BATCH" "$SKEW" "$OUTER_LR" "$OUTER_MOMENTUM" <<'PY'
import glob, os, re, statistics, sys
root, rounds, steps, batch, skew, outer_lr, outer_momentum = sys.argv[1:8]
rounds, steps, batch = int(rounds), int(steps), int(batch)
LINE = re.compile(r"round (\d+): .*test_accuracy=([\d.]+)")
FULL = re.compile(r"round \d+ complete: participants=(\d+)")
SPLIT = re.compile(r"top label (\d+) holds ([\d.]+)%")
rows = {}
for line in open(os.path.join(root, "arms.txt")):
    arm, workers, arm_steps, split, secs = line.split()
    d = os.path.join(root, arm.replace("/", "_"))
    acc, top = [], []
    for p in sorted(glob.glob(os.path.join(d, "worker-*.log"))):
        for l in open(p):
            m = LINE.search(l)
            if m and int(m.group(1)) == rounds: acc.append(float(m.group(2)))
            s = SPLIT.search(l)
            if s: top.append(float(s.group(2)))
    if not acc:
        print(f"quality: no final accuracy for {arm} (logs in {d})", file=sys.stderr); sys.exit(1)
    full = sum(1 for l in open(os.path.join(d, "coordinator.log"))
               if (m := FULL.search(l)) and int(m.group(1)) == int(workers))
    samples = rounds * int(workers) * int(arm_steps) * batch
    rows[arm] = (int(workers), int(arm_steps), split, statistics.mean(acc),
                 statistics.mean(top) if top else float("nan"), samples, int(secs), full)
base = rows.get("one/none")
print(f"Fashion-MNIST MLP, {rounds} rounds, batch {batch}, nesterov lr {outer_lr} momentum "
      f"{outer_momentum}; "
      "same samples per arm; accuracy on the 10000 test images after the last round")
print(f"{'arm':<14} {'workers':>7} {'steps/rnd':>9} {'split':<16} {'top label':>9} "
      f"{'samples':>8} {'full rnds':>9} {'test_acc':>9} {'vs one':>8} {'secs':>5}")
for arm, (w, s, split, acc, top, samples, secs, full) in rows.items():
    vs = f"{100 * (acc - base[3]):+.2f}pt" if base else "n/a"
    print(f"{arm:<14} {w:>7} {s:>9} {split:<16} {top:>8.1f}% {samples:>8} {full:>9} {acc:>9.4f} "
          f"{vs:>8} {secs:>5}")
parts = " ".join(f"{a}={r[3]:.4f}" for a, r in rows.items())
ratio = rows["iid/none"][3] / base[3] if base and "iid/none" in rows else float("nan")
print(f"quality: {parts} ratio={ratio:.4f}")
PY
