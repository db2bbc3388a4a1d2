#!/usr/bin/env bash
# bench/run.sh audit (issue 28): audits by replay (docs/SECURITY.md "Audits,
# scores and bans"), what they cost and how fast they catch a cheater.
#
# 1. Cost: 3 honest workers, ROUNDS rounds x STEPS local steps, at each
#    --audit_rate of AUDIT_RATES (0 = audits off, the baseline; the audited
#    runs have a fixed --audit_seed each, so the draw is reproducible). Extra
#    compute = the workers' summed audit seconds over their summed train
#    seconds: from their round and replay log lines (every round), and from
#    shoal_worker_seconds_total{part=...} of their /metrics (scraped every
#    second; the last scrape before a worker leaves at the run's end, so it
#    can miss the last round). Goal per rate: extra <= rate + 0.02. An honest
#    run with a failed audit or a ban fails the benchmark.
# 2. Time to ban: 3 honest workers + 1 worker trained on shuffled labels
#    (a real shoal-worker given Fashion-MNIST with its training labels
#    permuted, as tests/e2e/audit_test.cc does), --audit_rate=0.2, CHEAT_ROUNDS
#    rounds, one run per --audit_seed (SEEDS of them; the draw also hashes
#    the worker ids, which depend on the join order). Per run: the cheater's
#    first bad round (the first it trained in, from its own log: a worker
#    admitted to a round already running trains nothing in it), the round of
#    its ban (the ban reason's "after round N"), rounds between (0 = banned
#    in its first), the seconds from that round's start (or its admission,
#    if later) to the ban's log line, whether it was caught as a participant
#    (its replay failed) or as an auditor (its replay of an honest member was
#    outvoted by a second opinion), and how many rounds' averages took its
#    work. A cheater run that bans an honest worker, fails an honest worker's
#    audit or bans nobody fails the benchmark. The run's status is read from
#    the coordinator's /api/status.
# The last line: `audit: extra_0.05=... extra_0.1=... extra_0.2=...
# ban_rounds_median=... ban_seconds_median=... ratio=<extra at 0.2 / 0.2>`.
# Usage: audit.sh BIN OUT [ROUNDS] [STEPS] [SEEDS] [CHEAT_ROUNDS]
# Environment: AUDIT_RATES (default "0 0.05 0.1 0.2"; must hold 0.2 for the
# ratio), AUDIT_DATA (default /usr/share/datasets/fashion-mnist).
set -euo pipefail
BIN=$1
OUT=$2
ROUNDS=${3:-100}
STEPS=${4:-50}
SEEDS=${5:-5}
CHEAT_ROUNDS=${6:-40}
RATES=${AUDIT_RATES:-"0 0.05 0.1 0.2"}
DATA=${AUDIT_DATA:-/usr/share/datasets/fashion-mnist}
CHEAT_RATE=0.2
ROOT="$OUT/audit"
mkdir -p "$ROOT"

ADDR=""
WEB=""
# PIDS, stop_all (by PID, also at exit).
source "$(dirname "${BASH_SOURCE[0]}")/../common/procs.sh"
trap 'exit 130' INT TERM

# wait_for_line FILE REGEX SECONDS: prints the first match of REGEX in FILE
# (grep -o), or nothing after SECONDS.
wait_for_line() {
  local file=$1 re=$2 got=""
  for _ in $(seq $(( $3 * 10 ))); do
    got=$(grep -oE "$re" "$file" 2>/dev/null | head -1) || true
    [[ -n "$got" ]] && break
    sleep 0.1
  done
  echo "$got"
}

# start_coordinator DIR FLAGS...: starts it; its gRPC address in ADDR, its
# web server's (/api/status) in WEB. Not a command substitution: the PID must
# be recorded in this shell.
start_coordinator() {
  local dir=$1
  shift
  "$BIN/shoal-coordinator" --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 "$@" \
    >"$dir/coordinator.log" 2>&1 &
  PIDS+=($!)
  local line
  line=$(wait_for_line "$dir/coordinator.log" 'listening on 127\.0\.0\.1:[0-9]+' 10)
  if [[ -z "$line" ]]; then
    echo "audit: coordinator did not start" >&2
    cat "$dir/coordinator.log" >&2
    return 1
  fi
  ADDR=${line#listening on }
  line=$(wait_for_line "$dir/coordinator.log" 'web page on https?://127\.0\.0\.1:[0-9]+' 10)
  if [[ -z "$line" ]]; then
    echo "audit: coordinator serves no web page" >&2
    cat "$dir/coordinator.log" >&2
    return 1
  fi
  WEB=${line#web page on }
}

# run_workers DIR ADDR CAP NAME[:DATA_DIR]...: starts one worker per
# argument, scrapes each one's /metrics every second into
# DIR/metrics-NAME.txt (the last good scrape) until every worker has left
# (they leave by themselves when the run is finished) or CAP seconds.
run_workers() {
  local dir=$1 addr=$2 cap=$3
  shift 3
  local names=() wpids=() spec name data
  for spec in "$@"; do
    name=${spec%%:*}
    data=$DATA
    [[ "$spec" == *:* ]] && data=${spec#*:}
    "$BIN/shoal-worker" --coordinator="$addr" --listen=127.0.0.1:0 --name="$name" \
      --data_dir="$data" --metrics_listen=127.0.0.1:0 --torch_threads=1 \
      >"$dir/worker-$name.log" 2>&1 &
    PIDS+=($!)
    wpids+=($!)
    names+=("$name")
  done
  local -A maddr=()
  local deadline=$(( $(date +%s) + cap )) alive k line
  while :; do
    alive=0
    for k in "${!names[@]}"; do
      name=${names[$k]}
      kill -0 "${wpids[$k]}" 2>/dev/null || continue
      alive=1
      if [[ -z "${maddr[$name]:-}" ]]; then
        line=$(grep -oE 'metrics on 127\.0\.0\.1:[0-9]+' "$dir/worker-$name.log" 2>/dev/null |
          head -1) || true
        [[ -n "$line" ]] && maddr[$name]=${line#metrics on }
      fi
      if [[ -n "${maddr[$name]:-}" ]] &&
        curl -sf --max-time 2 "http://${maddr[$name]}/metrics" >"$dir/.metrics-$name.tmp" 2>/dev/null; then
        mv "$dir/.metrics-$name.tmp" "$dir/metrics-$name.txt"
      fi
    done
    [[ $alive == 0 ]] && break
    if [[ $(date +%s) -ge $deadline ]]; then
      echo "audit: workers in $dir still running after ${cap}s; stopping them" >&2
      break
    fi
    sleep 1
  done
  rm -f "$dir"/.metrics-*.tmp
}

# status DIR WEB: the run's status (GetRunStatus as JSON, the same rendering
# as `shoalctl status -o json`) from the coordinator's /api/status into
# DIR/status.json. Not shoalctl: one built before issue 28's proto drops the
# audit fields (audits_*, bans, per-worker scores) it does not know.
status() {
  curl -sf --max-time 10 "$2/api/status" >"$1/status.json" ||
    { echo "audit: no status from the coordinator in $1" >&2; return 1; }
}

# --- 1. the cost of auditing, 3 honest workers per rate
run_cost() {
  local rate=$1 dir="$ROOT/cost-$1"
  rm -rf "$dir"
  mkdir -p "$dir"
  local flags=(--min_participants=3 --local_steps="$STEPS" --rounds="$ROUNDS"
    --eval_every="$ROUNDS" --adaptive_deadline=false --fold_late_work=false
    --heartbeat_lease=20s)
  if [[ "$rate" != 0 ]]; then
    flags+=(--audit_rate="$rate" --audit_seed="bench-cost-$rate")
  fi
  start_coordinator "$dir" "${flags[@]}"
  local addr=$ADDR web=$WEB
  run_workers "$dir" "$addr" 900 w1 w2 w3
  status "$dir" "$web"
  stop_all
}

# --- 2. time to ban: 3 honest workers and one on shuffled labels
make_shuffled() {
  local dir=$1
  mkdir -p "$dir"
  local f
  for f in train-images-idx3-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    ln -sf "$DATA/$f" "$dir/$f"
  done
  # Plain IDX under the .gz name (zlib's reader takes both); the labels after
  # the 8-byte header permuted with a fixed seed.
  /usr/bin/python3 - "$DATA/train-labels-idx1-ubyte.gz" "$dir/train-labels-idx1-ubyte.gz" <<'PY'
import gzip, random, sys
b = gzip.open(sys.argv[1]).read()
labels = list(b[8:])
random.Random(7).shuffle(labels)
open(sys.argv[2], "wb").write(b[:8] + bytes(labels))
PY
}

run_cheat() {
  local k=$1 dir="$ROOT/cheat-$1"
  rm -rf "$dir"
  mkdir -p "$dir"
  start_coordinator "$dir" --min_participants=3 --local_steps="$STEPS" \
    --rounds="$CHEAT_ROUNDS" --eval_every="$CHEAT_ROUNDS" --audit_rate=$CHEAT_RATE \
    --audit_seed="bench-cheat-$k" --adaptive_deadline=false --fold_late_work=false \
    --round_timeout=120s --heartbeat_lease=20s
  local addr=$ADDR web=$WEB
  run_workers "$dir" "$addr" 900 w1 w2 w3 "cheater:$ROOT/shuffled"
  status "$dir" "$web"
  stop_all
}

for r in $RATES; do
  echo "audit: cost run at --audit_rate=$r ($ROUNDS rounds x $STEPS steps, 3 workers)" >&2
  run_cost "$r"
done
make_shuffled "$ROOT/shuffled"
for k in $(seq "$SEEDS"); do
  echo "audit: cheater run $k/$SEEDS (--audit_seed=bench-cheat-$k)" >&2
  run_cheat "$k"
done

/usr/bin/python3 - "$ROOT" "$ROUNDS" "$STEPS" "$SEEDS" "$CHEAT_ROUNDS" "$CHEAT_RATE" $RATES <<'PY'
import glob, json, os, re, statistics, sys

root, rounds, steps, seeds, cheat_rounds, cheat_rate = sys.argv[1:7]
rates = sys.argv[7:]
seeds = int(seeds)

TS = re.compile(r"^[IWEF](\d\d):(\d\d):(\d\d\.\d+) ")


def stamped(path):
    """(seconds, line) per line of a log; the clock-only stamps made monotonic."""
    out, last, day = [], None, 0.0
    for line in open(path, errors="replace"):
        m = TS.match(line)
        if not m:
            continue
        t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) + day
        if last is not None and t < last - 43200:  # past midnight
            day += 86400
            t += 86400
        last = t
        out.append((t, line))
    return out


def metric(path, part):
    if not os.path.exists(path):
        return None
    re_part = re.compile(r'^shoal_worker_seconds_total\{[^}]*part="%s"[^}]*\}\s+(\S+)' % part)
    for line in open(path):
        m = re_part.match(line)
        if m:
            return float(m.group(1))
    return 0.0


def num(d, key):
    return int(d.get(key, 0) or 0)


def fail(msg):
    print("audit: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


STARTED = re.compile(r"round (\d+) started with \d+ participants: (\S+)")
COMPLETE = re.compile(r"round (\d+) complete: participants=(\d+) .*seconds=([\d.]+)")
ASSIGNED = re.compile(r"round (\d+): \S+ replays the work of ")
TRAIN = re.compile(r"round \d+: train_loss=\S+ .*train=([\d.]+)s")
REPLAY = re.compile(r"replayed the work of \S+ \(audit \d+\) in ([\d.]+)s")

# ---- 1. cost
cost = {}
for rate in rates:
    d = os.path.join(root, "cost-" + rate)
    st = json.load(open(os.path.join(d, "status.json")))
    log = stamped(os.path.join(d, "coordinator.log"))
    start = next((t for t, l in log if STARTED.search(l) and STARTED.search(l).group(1) == "1"), None)
    done = [(t, COMPLETE.search(l)) for t, l in log if COMPLETE.search(l)]
    if start is None or not done:
        fail(f"rate {rate}: no completed rounds (log {d}/coordinator.log)")
    n_rounds = int(done[-1][1].group(1))
    wall = (done[-1][0] - start) / n_rounds
    assigned = [int(ASSIGNED.search(l).group(1)) for _, l in log if ASSIGNED.search(l)]
    audited = set(assigned)
    secs_a = [float(m.group(3)) for _, m in done if int(m.group(1)) in audited]
    secs_n = [float(m.group(3)) for _, m in done if int(m.group(1)) not in audited]
    train_l = audit_l = 0.0
    n_replays = 0
    train_m = audit_m = 0.0
    have_m = True
    for w in ("w1", "w2", "w3"):
        for line in open(os.path.join(d, f"worker-{w}.log"), errors="replace"):
            m = TRAIN.search(line)
            if m:
                train_l += float(m.group(1))
            m = REPLAY.search(line)
            if m:
                audit_l += float(m.group(1))
                n_replays += 1
        tm = metric(os.path.join(d, f"metrics-{w}.txt"), "train")
        am = metric(os.path.join(d, f"metrics-{w}.txt"), "audit")
        if tm is None:
            have_m = False
        else:
            train_m += tm
            audit_m += am
    performed, failed, dropped = (num(st, "audits_performed"), num(st, "audits_failed"),
                                  num(st, "audits_dropped"))
    if failed or st.get("bans"):
        fail(f"honest run at rate {rate}: audits_failed={failed} bans={st.get('bans')}")
    for w in st.get("workers", []):
        if num(w, "audits_failed"):
            fail(f"honest run at rate {rate}: {w.get('id')} audits_failed={w['audits_failed']}")
    cost[rate] = dict(
        rounds=n_rounds, wall=wall, drawn=len(assigned) / (3 * n_rounds), performed=performed, failed=failed, dropped=dropped,
        replays=n_replays, extra=audit_l / train_l if train_l else float("nan"),
        extra_m=(audit_m / train_m if have_m and train_m else float("nan")),
        train_round=train_l / max(1, 3 * n_rounds),
        replay=audit_l / n_replays if n_replays else 0.0,
        audited_rounds=len(audited & {int(m.group(1)) for _, m in done}),
        round_a=statistics.mean(secs_a) if secs_a else float("nan"),
        round_n=statistics.mean(secs_n) if secs_n else float("nan"))

base_wall = cost[rates[0]]["wall"] if rates and rates[0] == "0" else None
print(f"audit cost: 3 honest workers, MLP, {rounds} rounds x {steps} local steps, batch 64, "
      "one Torch thread each")
print("  drawn = audits assigned / (3 x rounds); extra = sum of audit s / sum of train s over the "
      "workers (logs; their /metrics in brackets) = drawn x replay/train;")
print("  wall = s per round from round 1's start to the last round's end; rd s = mean round "
      "seconds (coordinator) of rounds with / without an audit")
print(f"{'rate':>5} {'rounds':>6} {'drawn':>6} {'audits':>6} {'failed':>6} {'dropped':>7} "
      f"{'extra':>7} {'(metrics)':>9} {'goal':>5} {'met':>4} {'train s':>7} {'replay s':>8} "
      f"{'rpl/trn':>7} {'wall s':>6} {'vs 0':>6} {'rd s aud/not':>13}")
for rate in rates:
    c = cost[rate]
    r = float(rate)
    goal = r + 0.02
    met = "-" if r == 0 else ("yes" if c["extra"] <= goal else "NO")
    vs = f"{c['wall'] / base_wall:.3f}" if base_wall else "-"
    rt = f"{c['replay'] / c['train_round']:.3f}" if c["replays"] else "-"
    print(f"{rate:>5} {c['rounds']:>6} {c['drawn']:>6.3f} {c['performed']:>6} {c['failed']:>6} "
          f"{c['dropped']:>7} {c['extra']:>7.4f} {'(%.4f)' % c['extra_m']:>9} "
          f"{'-' if r == 0 else '%.2f' % goal:>5} {met:>4} {c['train_round']:>7.3f} "
          f"{c['replay']:>8.3f} {rt:>7} {c['wall']:>6.3f} {vs:>6} "
          f"{'%.3f/%.3f' % (c['round_a'], c['round_n']) if c['audited_rounds'] else '-':>13}")
for rate in rates:
    if float(rate) > 0:
        c = cost[rate]
        print(f"  rate {rate}: extra {c['extra']:.4f} <= {float(rate) + 0.02:.2f}: "
              f"{'met' if c['extra'] <= float(rate) + 0.02 else 'NOT met'}")

# ---- 2. time to ban
BAN = re.compile(r"worker (\S+) \(cheater\) banned: (.*)")
AFTER = re.compile(r"after round (\d+)")
JOINED = re.compile(r"joined run \S+ as (\S+)")
CROUND = re.compile(r"\] round (\d+): train_loss=([\d.]+) .*train=([\d.]+)s")
SATOUT = re.compile(r"sat out round (\d+): failed audit")
ADMITTED = re.compile(r"admitted to round (\d+)")
rows = []
for k in range(1, seeds + 1):
    d = os.path.join(root, f"cheat-{k}")
    st = json.load(open(os.path.join(d, "status.json")))
    log = stamped(os.path.join(d, "coordinator.log"))
    cid = None
    for line in open(os.path.join(d, "worker-cheater.log"), errors="replace"):
        m = JOINED.search(line)
        if m:
            cid = m.group(1)
            break
    bans = st.get("bans", [])
    if len(bans) != 1 or bans[0].get("name") != "cheater":
        fail(f"cheater run {k}: bans {bans} (expected the cheater alone; {d})")
    cid = cid or bans[0].get("worker_id")
    reason = bans[0].get("reason", "")
    for w in st.get("workers", []):
        if w.get("name") != "cheater" and num(w, "audits_failed"):
            fail(f"cheater run {k}: honest {w.get('id')} audits_failed={w['audits_failed']}")
    # From the cheater's own log: the rounds it trained and that were averaged
    # (a round line with training in it; a round it was admitted to after the
    # round had started shows train=0.00s and nothing trained), the rounds it
    # sat out on a failed audit, and when it was admitted.
    clog = stamped(os.path.join(d, "worker-cheater.log"))
    averaged, caught, admitted = [], [], None
    for t, l in clog:
        m = CROUND.search(l)
        if m and (float(m.group(2)) > 0 or float(m.group(3)) > 0):
            averaged.append(int(m.group(1)))
        m = SATOUT.search(l)
        if m:
            caught.append(int(m.group(1)))
        m = ADMITTED.search(l)
        if m and admitted is None:
            admitted = (int(m.group(1)), t)
    m = AFTER.search(reason)
    ban_t = next((t for t, l in log if BAN.search(l)), None)
    if ban_t is None or not m or admitted is None:
        fail(f"cheater run {k}: ban line {ban_t}, reason {reason!r}, admitted {admitted}")
    ban_round = int(m.group(1))
    averaged = [r for r in averaged if r < ban_round]
    # Its first bad round: the first it trained in (the ban's round when it
    # was caught as an auditor before any of its own rounds ended).
    first = min(averaged + caught + [ban_round])
    starts = {int(STARTED.search(l).group(1)): t for t, l in log if STARTED.search(l)}
    first_t = starts.get(first)
    if first_t is None:
        fail(f"cheater run {k}: no start of round {first}")
    if admitted[0] == first:
        first_t = max(first_t, admitted[1])
    with_it = len(averaged)
    as_ = "auditor" if "its replay of" in reason else "participant"
    rows.append(dict(seed=f"bench-cheat-{k}", id=cid, first=first, ban=ban_round,
                     rounds=ban_round - first, secs=ban_t - first_t, as_=as_, with_it=with_it,
                     performed=num(st, "audits_performed"), failed=num(st, "audits_failed"),
                     dropped=num(st, "audits_dropped"), reason=reason))

print()
print(f"time to ban: 3 honest workers + 1 on shuffled labels, --audit_rate={cheat_rate}, "
      f"{cheat_rounds} rounds x {steps} local steps, {seeds} seeds")
print("  first = the first round it trained in (a round it was admitted to after its start, "
      "with nothing trained, does not count); rounds = ban round - first (0 = banned in its "
      "first);")
print("  seconds = from its first round's start (or its admission, if later) to the ban's log "
      "line; rds avg w/ it = rounds whose average took its contribution")
print(f"{'audit_seed':<14} {'id':>3} {'first':>5} {'banned':>6} {'rounds':>6} {'seconds':>8} "
      f"{'caught as':>11} {'rds avg w/ it':>13} {'audits':>6} {'failed':>6} {'dropped':>7}")
for r in rows:
    print(f"{r['seed']:<14} {r['id']:>3} {r['first']:>5} {r['ban']:>6} {r['rounds']:>6} "
          f"{r['secs']:>8.2f} {r['as_']:>11} {r['with_it']:>13} {r['performed']:>6} "
          f"{r['failed']:>6} {r['dropped']:>7}")
br = [r["rounds"] for r in rows]
bs = [r["secs"] for r in rows]
print(f"{'median':<14} {'':>3} {'':>5} {'':>6} {statistics.median(br):>6g} "
      f"{statistics.median(bs):>8.2f}")
print(f"{'max':<14} {'':>3} {'':>5} {'':>6} {max(br):>6} {max(bs):>8.2f}")
for r in rows:
    print(f"  {r['seed']}: {r['reason']}")

extras = " ".join(f"extra_{r}={cost[r]['extra']:.4f}" for r in rates if float(r) > 0)
ratio = cost["0.2"]["extra"] / 0.2 if "0.2" in cost else float("nan")
print(f"audit: {extras} ban_rounds_median={statistics.median(br):g} "
      f"ban_seconds_median={statistics.median(bs):.2f} ratio={ratio:.3f}")
PY
