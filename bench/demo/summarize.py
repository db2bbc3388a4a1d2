#!/usr/bin/env python3
"""Share of each training round spent communicating in the 3-worker demo.

Reads the output of scripts/demo.sh (the `shoalctl watch` round lines:
"round R/N ... time=Ts exchange=Es ...", where time is the round's wall time
from its start to its completion at the coordinator and exchange the
participants' mean exchange time) and the workers' logs ("round R: ...
train=Ts exchange=Es ..."). Prints the table and the `demo: ... ratio=...`
line; ratio = median over rounds of exchange / round time.
"""
import glob
import os
import re
import statistics
import sys

ROUND = re.compile(r"^round (\d+)/\d+ .*time=([\d.]+)s\s+exchange=([\d.]+)s")
WORKER = re.compile(r"round (\d+): .*train=([\d.]+)s exchange=([\d.]+)s")


def main():
    out_path, logs_dir = sys.argv[1], sys.argv[2]
    rounds = {}
    with open(out_path) as f:
        for line in f:
            m = ROUND.search(line.strip())
            if m:
                rounds[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    train = {}
    for path in glob.glob(os.path.join(logs_dir, "worker-*.log")):
        with open(path) as f:
            for line in f:
                m = WORKER.search(line)
                if m:
                    train.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    if not rounds:
        print("demo: no round lines found", file=sys.stderr)
        sys.exit(1)
    shares = [e / t for (t, e) in rounds.values() if t > 0]
    round_s = statistics.median(t for (t, _) in rounds.values())
    exch_s = statistics.median(e for (_, e) in rounds.values())
    train_s = statistics.median(statistics.mean(v) for v in train.values()) if train else 0.0
    cores = os.cpu_count()
    load = os.getloadavg()[0]
    print(f"== demo: scripts/demo.sh, 3 workers, {len(rounds)} rounds, medians over rounds  "
          f"(cores={cores}, load1={load:.2f} at the end)")
    print(f"{'figure':<34}  {'value':>8}  note")
    print(f"{'round wall time s':<34}  {round_s:8.3f}  baseline: round start -> complete "
          f"(coordinator)")
    print(f"{'exchange s':<34}  {exch_s:8.3f}  mean over the participants")
    print(f"{'local training s':<34}  {train_s:8.3f}  from the workers' logs")
    other = round_s - exch_s - train_s
    print(f"{'rest s':<34}  {other:8.3f}  plan barrier, probes, hashing, evaluation, "
          f"snapshot, reports")
    print(f"{'exchange / round':<34}  {statistics.median(shares):8.3f}  per-round shares: "
          + " ".join(f"{s:.3f}" for s in shares))
    print(f"demo: rounds={len(rounds)} round_s={round_s:.3f} exchange_s={exch_s:.3f} "
          f"train_s={train_s:.3f} cores={cores} ratio={statistics.median(shares):.3f}")


if __name__ == "__main__":
    main()
