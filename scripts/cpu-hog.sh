#!/usr/bin/env bash
# Keeps the CPU busy: starts N busy-looping processes (default: one per
# core), writes their PIDs (one a line) to --pidfile, and runs until it is
# signalled (SIGTERM, SIGINT, SIGHUP) or --seconds pass; then it stops every
# hog by its PID and removes the pid file. Used by scripts/test-under-load.sh
# (issue 30: the suite must pass on a busy machine).
#
#   scripts/cpu-hog.sh [N] [--pidfile FILE] [--seconds S] [--nice LEVEL]
#
# Each hog also checks, every hundred thousand iterations, that this
# script is still alive (kill -0 on its PID) and exits when it is not, so a
# hog outlives a SIGKILLed parent by well under a second. Nothing here
# signals a process by name.
set -euo pipefail

n=""
pidfile=""
seconds=0
nice_level=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pidfile) pidfile="$2"; shift 2 ;;
    --pidfile=*) pidfile="${1#*=}"; shift ;;
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --nice) nice_level="$2"; shift 2 ;;
    --nice=*) nice_level="${1#*=}"; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    [0-9]*) n="$1"; shift ;;
    *) echo "cpu-hog: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$n" ]] || n=$(nproc)
if ! [[ "$n" =~ ^[0-9]+$ ]] || [[ "$n" -lt 1 ]]; then
  echo "cpu-hog: N must be a positive integer, got '$n'" >&2
  exit 2
fi

self=$$
hogs=()
sleeper=""

stop_hogs() {
  trap - EXIT INT TERM HUP
  local pid
  for pid in "${hogs[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
  [[ -n "$sleeper" ]] && kill -TERM "$sleeper" 2>/dev/null || true
  [[ -n "$pidfile" ]] && rm -f "$pidfile"
  echo "cpu-hog: stopped ${#hogs[@]} hog(s)" >&2
}
trap stop_hogs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

for ((i = 0; i < n; i++)); do
  # A busy loop in its own bash process; it leaves when this script is gone.
  nice -n "$nice_level" bash -c '
    parent=$1
    while :; do
      for ((j = 0; j < 100000; j++)); do :; done
      kill -0 "$parent" 2>/dev/null || exit 0
    done' cpu-hog "$self" &
  hogs+=("$!")
done
if [[ -n "$pidfile" ]]; then
  printf '%s\n' "${hogs[@]}" > "$pidfile.tmp"
  mv "$pidfile.tmp" "$pidfile"
fi
echo "cpu-hog: $n hog(s) running, pids ${hogs[*]} (this script: $self)" >&2

if [[ "$seconds" -gt 0 ]]; then
  # `sleep` in the background + `wait` so that a signal is handled at once.
  sleep "$seconds" &
  sleeper=$!
  wait "$sleeper" || true
else
  # Until signalled: wait returns when a trapped signal arrives.
  while :; do
    sleep 3600 &
    sleeper=$!
    wait "$sleeper" || true
  done
fi
