# Process lifetime for the benchmark scripts (sourced): every process a
# script starts goes into PIDS, and stop_all stops them by PID (SIGTERM, up to
# 5 s, then SIGKILL), at exit too. Never pkill or killall.
PIDS=()
stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap stop_all EXIT
