#!/usr/bin/env bash
# Starts a local Shoal cluster on 127.0.0.1 (a coordinator and 3 workers),
# trains the MLP on Fashion-MNIST, prints one line per round and ends with a
# summary line containing test_accuracy=<value>. Stops everything it started,
# by PID, on exit or Ctrl-C.
#   scripts/demo.sh [BIN_DIR]
# Environment: SHOAL_DEMO_ROUNDS (30), SHOAL_DEMO_WORKERS (3),
# SHOAL_DEMO_LOCAL_STEPS (100), SHOAL_DEMO_MODEL (mlp), SHOAL_DEMO_LOGS,
# SHOAL_DEMO_MODE (sync, or gossip: no rounds, pair-wise averaging; each
# worker trains ROUNDS x LOCAL_STEPS steps, see docs/GOSSIP.md).
set -euo pipefail

BIN=${1:-build/bin}
ROUNDS=${SHOAL_DEMO_ROUNDS:-30}
WORKERS=${SHOAL_DEMO_WORKERS:-3}
STEPS=${SHOAL_DEMO_LOCAL_STEPS:-100}
MODEL=${SHOAL_DEMO_MODEL:-mlp}
MODE=${SHOAL_DEMO_MODE:-sync}
LOGS=${SHOAL_DEMO_LOGS:-$(mktemp -d /tmp/shoal-demo-XXXXXX)}
case "$MODE" in
  sync) MODE_FLAGS=(--mode=sync) ;;
  gossip) MODE_FLAGS=(--mode=gossip --gossip_every=10 --eval_every=10
                      --gossip_steps=$((ROUNDS * STEPS))) ;;
  *) echo "demo: SHOAL_DEMO_MODE=$MODE is not one of sync, gossip"; exit 2 ;;
esac
mkdir -p "$LOGS"

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap cleanup EXIT
trap 'echo "demo: interrupted, stopping the cluster"; exit 130' INT TERM

"$BIN/shoal-coordinator" --listen=127.0.0.1:0 --min_participants="$WORKERS" \
  --local_steps="$STEPS" --rounds="$ROUNDS" --model="$MODEL" "${MODE_FLAGS[@]}" \
  >"$LOGS/coordinator.log" 2>&1 &
PIDS+=($!)

ADDR=""
for _ in $(seq 100); do
  ADDR=$(grep -o 'listening on 127\.0\.0\.1:[0-9]*' "$LOGS/coordinator.log" 2>/dev/null |
    head -1 | cut -d' ' -f3) || true
  [[ -n "$ADDR" ]] && break
  kill -0 "${PIDS[0]}" 2>/dev/null || { cat "$LOGS/coordinator.log"; exit 1; }
  sleep 0.1
done
[[ -n "$ADDR" ]] || { echo "demo: coordinator did not start"; cat "$LOGS/coordinator.log"; exit 1; }

if [[ "$MODE" == gossip ]]; then
  echo "demo: coordinator on $ADDR, $WORKERS workers, model=$MODEL, gossip mode: $((ROUNDS * STEPS)) steps per worker, no rounds"
else
  echo "demo: coordinator on $ADDR, $WORKERS workers, model=$MODEL, $ROUNDS rounds of $STEPS local steps"
fi
echo "demo: logs in $LOGS; status any time with: $BIN/shoalctl status --coordinator=$ADDR"
for i in $(seq "$WORKERS"); do
  "$BIN/shoal-worker" --coordinator="$ADDR" --listen=127.0.0.1:0 --name="worker-$i" \
    >"$LOGS/worker-$i.log" 2>&1 &
  PIDS+=($!)
done

set +e
"$BIN/shoalctl" watch --coordinator="$ADDR" --timeout=9m
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
  echo "demo: the run did not finish cleanly (shoalctl exit $rc); last worker log lines:"
  tail -n 5 "$LOGS"/worker-*.log
fi
exit $rc
