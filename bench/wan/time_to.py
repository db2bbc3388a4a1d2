#!/usr/bin/python3
"""Time to several accuracies of a finished Shoal arm, from its worker logs
(bench/wan/wan.py writes them to OUT/ARM/worker-*.log).

Per worker: seconds from its first log line that names the model or the
join to the first round line whose test_accuracy reaches the threshold;
per arm the slower worker. Usage: time_to.py DIR... [--at=0.84,0.85,0.86]
"""
import glob
import os
import re
import sys

STAMP = re.compile(r"^[IWE](\d\d):(\d\d):(\d\d\.\d+) ")
ROUND = re.compile(r"round (\d+): .*test_accuracy=([\d.]+)")


def seconds(line):
    m = STAMP.match(line)
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) if m else None


def main():
    at = [0.84, 0.85, 0.86]
    dirs = []
    for a in sys.argv[1:]:
        if a.startswith("--at="):
            at = [float(x) for x in a[5:].split(",")]
        else:
            dirs.append(a)
    for d in dirs:
        cells = []
        for x in at:
            worst = None
            for f in sorted(glob.glob(os.path.join(d, "worker-*.log"))):
                t0 = hit = None
                for line in open(f, errors="replace"):
                    s = seconds(line)
                    if s is None:
                        continue
                    if t0 is None and ("joined" in line or "model" in line):
                        t0 = s
                    m = ROUND.search(line)
                    if m and hit is None and t0 is not None and float(m.group(2)) >= x:
                        hit = (s - t0, int(m.group(1)))
                if hit and (worst is None or hit[0] > worst[0]):
                    worst = hit
            cells.append(f"{x}: {worst[0]:.0f} s (round {worst[1]})" if worst else f"{x}: -")
        print(f"{os.path.basename(d.rstrip('/'))}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
