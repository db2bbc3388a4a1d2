#!/usr/bin/env bash
# bench/run.sh compress: 4 workers train the Fashion-MNIST MLP for fixed
# rounds and local steps with each codec; per codec the mean bytes a worker
# received per round (its round log's wire_in) and the final test accuracy,
# against fp32. The last line: `compress: ... ratio=<int8 bytes / fp32 bytes>
# sparse_ratio=<sparse:F bytes / fp32 bytes> sparse_pt=<its accuracy - fp32's,
# in points> sparse2_ratio=... sparse2_pt=...` (issue 27's goal: sparse_ratio
# <= 0.01333, i.e. 75x fewer bytes, and sparse_pt >= -0.5; sparse2 is the
# second `sparse:` codec of the list, sparse:0.028 by default, for issue 52's
# goal: sparse2_ratio <= 0.00685, i.e. 146x fewer, and sparse2_pt >= -0.5).
# Usage: compress.sh BIN OUT [ROUNDS] [STEPS]
set -euo pipefail
BIN=$1
OUT=$2
ROUNDS=${3:-10}
STEPS=${4:-50}
WORKERS=4
CODECS=${COMPRESS_CODECS:-"fp32 fp16 bf16 int8 topk:0.01 randomk:0.01 sparse:0.06 sparse:0.028"}
OUTER=${COMPRESS_OUTER:-none}
# The run's seed (model initialisation and data order); 1 is the default.
SEED=${COMPRESS_SEED:-1}
mkdir -p "$OUT/compress"

# PIDS, stop_all (by PID, also at exit).
source "$(dirname "${BASH_SOURCE[0]}")/../common/procs.sh"

run_one() {
  local codec=$1 dir="$OUT/compress/${1//:/_}"
  mkdir -p "$dir"
  # A log left by an earlier run in the same OUT would name its port.
  rm -f "$dir"/*.log
  "$BIN/shoal-coordinator" --listen=127.0.0.1:0 --min_participants=$WORKERS \
    --local_steps="$STEPS" --rounds="$ROUNDS" --eval_every="$ROUNDS" --codec="$codec" \
    --outer_optimizer="$OUTER" --seed="$SEED" --adaptive_deadline=false --fold_late_work=false \
    >"$dir/coordinator.log" 2>&1 &
  PIDS+=($!)
  local addr=""
  for _ in $(seq 100); do
    addr=$(grep -o 'listening on 127\.0\.0\.1:[0-9]*' "$dir/coordinator.log" 2>/dev/null |
      head -1 | cut -d' ' -f3) || true
    [[ -n "$addr" ]] && break
    sleep 0.1
  done
  [[ -n "$addr" ]] || { echo "compress: coordinator did not start" >&2; cat "$dir/coordinator.log" >&2; return 1; }
  local workers=()
  for i in $(seq $WORKERS); do
    "$BIN/shoal-worker" --coordinator="$addr" --listen=127.0.0.1:0 --name="w$i" \
      >"$dir/worker-$i.log" 2>&1 &
    PIDS+=($!)
    workers+=($!)
  done
  # Workers leave by themselves when the run is finished (capped at 20 min).
  local deadline=$(( $(date +%s) + 1200 ))
  for pid in "${workers[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [[ $(date +%s) -lt $deadline ]]; do sleep 1; done
  done
  stop_all
}

for c in $CODECS; do run_one "$c"; done
/usr/bin/python3 - "$OUT/compress" "$ROUNDS" "$STEPS" $CODECS <<'PY'
import glob, os, re, statistics, sys
root, rounds, steps, codecs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
LINE = re.compile(r"round (\d+): .* wire_in=(\d+) wire_out=(\d+) ratio=([\d.]+)")
ACC = re.compile(r"test_accuracy=([\d.]+)")
rows = {}
for c in codecs:
    wire, ratio, acc = [], [], []
    for p in glob.glob(os.path.join(root, c.replace(":", "_"), "worker-*.log")):
        for line in open(p):
            m = LINE.search(line)
            if not m: continue
            if int(m.group(2)) > 0:  # not a round it sat out (nothing read)
                wire.append(int(m.group(2)))
                ratio.append(float(m.group(4)))
            a = ACC.search(line)
            if a and int(m.group(1)) == int(rounds): acc.append(float(a.group(1)))
    if not wire or not acc:
        print(f"compress: no results for {c}", file=sys.stderr); sys.exit(1)
    rows[c] = (statistics.mean(wire), statistics.mean(acc), statistics.mean(ratio))
base_b, base_a, _ = rows[codecs[0]]
# "vs fp32" is each round's own ratio as the worker logs it: bytes received
# over the same slices as float32. Mean bytes per round depend on how many
# workers took part (a worker that sat a round out sends nothing), so the
# ratio of the means can drift from the codec's ratio on a loaded machine.
print(f"4 workers, MLP, {rounds} rounds x {steps} local steps; bytes = mean received per worker and round it took part in")
print(f"{'codec':<14} {'bytes/round':>12} {'vs fp32':>8} {'test_acc':>9} {'vs fp32':>8}")
for c in codecs:
    b, a, r = rows[c]
    print(f"{c:<14} {b:>12.0f} {r:>8.4f} {a:>9.4f} {100 * (a - base_a):>+7.2f}pt")
parts = " ".join(f"{c}={rows[c][2]:.4f}/{rows[c][1]:.4f}" for c in codecs)
ratio = rows["int8"][2] if "int8" in rows else float("nan")
sparse = [c for c in codecs if c.startswith("sparse:")]
extra = ""
for key, c in zip(("sparse", "sparse2"), sparse):
    _, a, r = rows[c]
    extra += f" {key}_ratio={r:.4f} {key}_pt={100 * (a - base_a):+.2f}"
print(f"compress: {parts} ratio={ratio:.4f}{extra}")
PY
