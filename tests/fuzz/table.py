#!/usr/bin/env python3
"""Prints a Markdown table of a fuzz campaign from tests/fuzz/run.sh's files.

Usage: tests/fuzz/table.py BUILD_DIR TARGET...

For each target it reads BUILD_DIR/fuzz-TARGET.summary (run.sh's line: wall
and CPU seconds, crashes, inputs merged) and BUILD_DIR/fuzz-TARGET.log
(libFuzzer's output: executions, rate, coverage at start and end). This is
the table in bench/RESULTS.md and docs/SECURITY.md.
"""
import os
import re
import sys


def field(text, key):
    m = re.search(r"\b%s=(\d+)" % key, text)
    return int(m.group(1)) if m else None


def row(build, target):
    summary = open(os.path.join(build, "fuzz-%s.summary" % target)).read()
    log = open(os.path.join(build, "fuzz-%s.log" % target), errors="replace").read()
    execs = re.findall(r"stat::number_of_executed_units: *(\d+)", log)
    rate = re.findall(r"stat::average_exec_per_sec: *(\d+)", log)
    start = re.search(r"INITED cov: (\d+) ft: (\d+)", log)
    seen = re.findall(r"(?:DONE|REDUCE|NEW|pulse)\s+cov: (\d+) ft: (\d+)", log)
    end = seen[-1] if seen else None
    cpu = field(summary, "cpu_seconds")
    merged = field(summary, "merged")
    return "| %s | %s | %s | %s | %s | %s → %s | %s | %s |" % (
        target,
        field(summary, "seconds"),
        "-" if cpu is None else cpu,
        "{:,}".format(int(execs[-1])) if execs else "-",
        "{:,}".format(int(rate[-1])) if rate else "-",
        "%s, %s" % start.groups() if start else "-",
        "%s, %s" % end if end else "-",
        field(summary, "crashes"),
        "-" if merged is None else merged,
    )


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    build, targets = argv[1], argv[2:]
    print("| target | seconds | CPU seconds | executions | per second "
          "| coverage (edges, features) at start → end | crashes | inputs merged |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in targets:
        try:
            print(row(build, t))
        except OSError as e:
            sys.stderr.write("table: %s: %s (run tests/fuzz/run.sh first)\n" % (t, e))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
