#!/usr/bin/python3
"""Benchmark results (issue 51): one record per run in bench/results.jsonl,
rendered into the table of bench/RESULTS.md.

  results.py add NAME (--line LINE | --from FILE) [--date ISO] [--commit C]
                 [--load "L1 L5 L15"] [--logs DIR] [--note TEXT] [--no-render]
      appends a record and renders the table again (bench/run.sh calls it
      after each arm; call it by hand for a figure taken elsewhere)
  results.py render [--check]
      writes the table into RESULTS.md (--check: exit 1 if it is stale)
  results.py commit
      the commit a record names: git's short HEAD, with -dirty when a tracked
      file has changes (the two results files aside)
  --results FILE and --readme FILE (before or after the command) choose
  other files than bench/results.jsonl and bench/RESULTS.md.

A record is one JSON object per line:
  {"name": "stream", "date": "2026-11-22T11:12Z", "commit": "255fb3f",
   "machine": {"cores": 2, "mem_gib": 23.5, "load": "2.10 1.80 1.50"},
   "line": "stream: shoal_MBps=4151 ... ratio=0.936",
   "figures": {"shoal_MBps": "4151", ..., "ratio": "0.936"},
   "source": "run.sh", "logs": "/tmp/shoal-bench-x", "note": "..."}
`figures` are the line's key=value pairs as printed (units kept: "2.84s",
"3.3%"); `load` is the load average when the arm started. Records taken from
the diary RESULTS.md was until issue 51 say "source": "imported", and
"recorded_in" (the commit that wrote the figure down) where the diary named
no commit. For each goal the table shows the newest record of the benchmark
that has the goal's figure, so arms run apart (wan's) fill one row.

Standard library only; run with /usr/bin/python3.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results.jsonl")
README = os.path.join(ROOT, "bench", "RESULTS.md")
BEGIN = ("<!-- results table: begin (bench/results.py renders it from bench/results.jsonl; "
         "edit those) -->")
END = "<!-- results table: end -->"
SOURCES = ("run.sh", "manual", "imported")


class Goal(NamedTuple):
    key: str     # a figure of the benchmark's last line (or of DERIVED)
    op: str      # "<=", ">=", "<", ">" or "=="
    target: object
    source: str  # who set it
    what: str = ""  # a few words when the key does not say it


# Each benchmark's goals, from the issues that set them. Every arm of
# bench/run.sh has an entry here or in NO_GOAL (tests/bench/test_results.py).
GOALS = {
    "stream": [Goal("ratio", ">=", 0.9, "issue 6", "Shoal MB/s / TCP")],
    "exchange": [Goal("ratio", "<=", 1.0, "issue 47", "Shoal / gloo time, 64 MiB"),
                 Goal("ratio_400mb", "<=", 1.0, "issue 47", "the same at 400 MB")],
    "latejoin": [Goal("ratio", ">=", 0.9, "issue 6", "speed-up from 3 holders / 3")],
    "coordinator": [Goal("ratio", "<=", 1.5, "issue 6", "CPU per worker, 1,000 / 10"),
                    Goal("relayed_ratio", "<=", 1.5, "issue 12", "10,000 relayed / 10 direct")],
    "straggler": [Goal("ratio", "<=", 0.5, "issue 11", "gossip / today, time to 0.85"),
                  Goal("fold_ratio", "<=", 0.6, "issue 11", "fold / today")],
    "failover": [Goal("ratio", "<=", 1.5, "issue 13", "failover / lease TTL"),
                 Goal("overhead", "<=", 1.05, "issue 13", "round time etcd / state_dir")],
    "compress": [Goal("ratio", "<=", 0.26, "issue 16", "int8 bytes / fp32"),
                 Goal("int8_pt", ">=", -0.3, "issue 16", "int8 accuracy - fp32, points"),
                 Goal("topk_pt", ">=", -1.0, "issue 16", "topk:0.01 accuracy - fp32, points"),
                 Goal("sparse_ratio", "<=", 0.01333, "issue 27",
                      "sparse:0.06 bytes / fp32: >= 75x fewer"),
                 Goal("sparse_pt", ">=", -0.5, "issue 27", "sparse:0.06 accuracy - fp32, points"),
                 Goal("sparse2_ratio", "<=", 0.00685, "issue 52",
                      "the second sparse arm's bytes / fp32: >= 146x fewer"),
                 Goal("sparse2_pt", ">=", -0.5, "issue 52",
                      "the second sparse arm's accuracy - fp32, points")],
    "quality": [Goal("iid_gap_pt", "<=", 0.5, "issue 16", "one process - 4 workers IID, points"),
                Goal("skew_gap_pt", "<=", 1.0, "issue 52; issue 16 asked 2",
                     "one process - 4 workers, label skew 0.3, points")],
    "wan": [Goal("ratio", "<=", 0.1, "issue 16", "int8 + Nesterov / DDP, time to 0.87"),
            Goal("paced_exchange_over_bound", "<=", 1.15, "issue 27",
                 "one paced fp32 exchange / line rate"),
            Goal("fragments_utilization", ">=", 0.90, "issue 27",
                 "overlap + 4 fragments at 10 Mbit/s"),
            Goal("fragments_ratio_2mbit", "<=", 0.7, "issue 27",
                 "overlap + fragments / plain at 2 Mbit/s"),
            Goal("sparse_slow_link", "<=", 1.15, "issue 27",
                 "10 Mbit/s / unshaped, sparse:0.06, seeds summed"),
            Goal("int8_slow_link", "<=", 1.15, "issue 52", "the same with int8")],
    "hier": [Goal("ratio", "<=", 0.4, "issue 12", "hierarchical / flat exchange time"),
             Goal("bytes_ratio", "<=", 0.34, "issue 12", "link bytes"),
             Goal("int8_ratio", "<=", 0.12, "issue 25", "int8 + Nesterov arm, time"),
             Goal("int8_bytes_ratio", "<=", 0.09, "issue 25", "int8 + Nesterov arm, bytes")],
    "hetero": [Goal("ratio", "<=", 0.5, "issue 49",
                    "exchange, bandwidth-proportional / equal slices, one link at 10 Mbit/s"),
               Goal("bound_ratio", "<=", 1.2, "issue 49",
                    "exchange, bandwidth-proportional / the bandwidth-weighted bound")],
    "python": [Goal("ratio", "<=", 1.10, "issue 26", "Python / C++ worker round time"),
               Goal("lm_loss_ratio", "<=", 1.02, "issue 26", "char LM, 3 workers / 1 process")],
    "scale": [Goal("extra_memory", "<=", 1.25, "issue 47", "(Shoal - loop alone) / model, 100 M"),
              Goal("utilization", ">=", 0.90, "issue 47", "overlapped Python loop, 100 M"),
              Goal("big_params", ">=", 500_000_000, "issue 47",
                   "the big run's model: 2 workers + a late joiner, a checkpoint, an export"),
              Goal("big_export_loaded", "==", "true", "issue 47",
                   "the big run's export loads into the Python class")],
    "sigterm": [Goal("slowest_s", "<", 5, "issue 29", "SIGTERM to exit, slowest state")],
    "audit": [Goal("extra_0.05", "<=", 0.07, "issue 28", "extra compute at rate R: <= R + 0.02"),
              Goal("extra_0.1", "<=", 0.12, "issue 28"),
              Goal("extra_0.2", "<=", 0.22, "issue 28")],
    "junk_joins": [Goal("status_bytes_after_flood", "<", 1048576, "issue 50",
                        "status after 10,000 junk Joins: < 1 MiB")],
    "soak": [Goal("hash_mismatches", "==", 0, "issue 30"),
             Goal("rounds_lost", "==", 0, "issue 30"),
             Goal("rss_growth_max", "<=", 10, "issue 30", "RSS growth after the warm-up, %")],
}

# Benchmarks without a goal: why, and the figures the table shows.
NO_GOAL = {
    "web": ("issue 15 set none", ("status_fresh_cpu_ms", "metrics_cpu_ms")),
    "micro": ("a profile", ("ratio",)),
    "demo": ("a profile", ("ratio",)),
    "tls": ("issue 14 set none", ("ratio",)),
    "etcd": ("issue 30's goal is the soak's", ("ratio", "rss_growth_max")),
    "store": ("issue 30's goal is the soak's", ("trim_on_rss_growth", "trim_off_rss_growth")),
}

# Figures computed from a line's own figures when it does not print them.
DERIVED = {
    ("compress", "int8_pt"): lambda f: _pt(f, "int8", "fp32"),
    ("compress", "topk_pt"): lambda f: _pt(f, "topk:0.01", "fp32"),
    ("quality", "iid_gap_pt"): lambda f: _gap(f, "one/none", "iid/none"),
    ("quality", "skew_gap_pt"): lambda f: _gap(f, "one/none", "skew/none"),
}

# The table's order: bench/run.sh's, then what runs elsewhere.
ORDER = ("stream", "exchange", "latejoin", "coordinator", "web", "micro", "demo", "tls",
         "straggler", "failover", "compress", "quality", "wan", "hier", "hetero", "python", "scale",
         "sigterm", "audit", "etcd", "store", "junk_joins", "soak")

PAIR = re.compile(r'([A-Za-z0-9_.:/+\-]+)=("[^"]*"|\S+)')
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def shown_path(path):
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def known():
    return set(GOALS) | set(NO_GOAL)


def num(text):
    """The number a printed figure starts with ("2.84s" -> 2.84), or None."""
    if isinstance(text, (int, float)):
        return float(text)
    m = NUMBER.match(str(text).strip())
    return float(m.group(0)) if m else None


def _part(f, key, index):
    v = f.get(key)
    return num(v.split("/")[index]) if v and "/" in v else None


def _pt(f, codec, base):
    a, b = _part(f, codec, 1), _part(f, base, 1)
    return None if a is None or b is None else (a - b) * 100


def _gap(f, base, arm):
    a, b = num(f.get(base, "")), num(f.get(arm, ""))
    return None if a is None or b is None else (a - b) * 100


def figures_of(line):
    """The key=value pairs of a benchmark's last line, values as printed."""
    return {k: v.strip('"') for k, v in PAIR.findall(line)}


def current_commit(root=ROOT):
    """git's short HEAD, with -dirty when a tracked file has changes; the
    results files are left out, since this tool writes them."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True, timeout=30).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
             ":(exclude)bench/results.jsonl", ":(exclude)bench/RESULTS.md"],
            cwd=root, text=True, capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if status.strip() else "")


def machine(load=None):
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for row in f:
                if row.startswith("MemTotal:"):
                    mem = round(int(row.split()[1]) / 1024 / 1024, 1)
        if load is None:
            with open("/proc/loadavg") as f:
                load = " ".join(f.read().split()[:3])
    except OSError:
        pass
    return {"cores": os.cpu_count(), "mem_gib": mem, "load": load}


def load_records(path):
    records = []
    with open(path) as f:
        for n, row in enumerate(f, 1):
            if not row.strip():
                continue
            try:
                records.append(json.loads(row))
            except json.JSONDecodeError as e:
                raise SystemExit(f"results: {path}:{n}: not JSON: {e}")
    return records


def value_of(record, key):
    """A record's figure for a key (printed, else derived), or None."""
    f = record.get("figures", {})
    v = f.get(key)
    if v is not None and str(v).strip() not in ("", "n/a", "-", "nan"):
        return v
    derive = DERIVED.get((record["name"], key))
    if derive is not None:
        d = derive(f)
        return None if d is None else f"{d:.2f}"
    return None


def newest(records, name, key):
    """The newest record of a benchmark with a figure for the key (dates
    compare as ISO text, "2026-11-22T11:12Z" before "...T11:12:30Z"; a later
    line wins a tie)."""
    best = None
    for i, r in enumerate(records):
        if r["name"] == name and value_of(r, key) is not None:
            order = (r["date"].rstrip("Z"), i)
            if best is None or order >= best[0]:
                best = (order, r)
    return best[1] if best else None


def met(goal, value):
    if goal.op == "==" and isinstance(goal.target, str):
        return str(value) == goal.target
    v = num(value)
    if v is None:
        return None
    t = float(goal.target)
    return {"<=": v <= t, ">=": v >= t, "<": v < t, ">": v > t, "==": v == t}[goal.op]


def shown(target):
    if isinstance(target, str):
        return target
    return str(int(target)) if float(target).is_integer() else repr(target)


def cell(text):
    return str(text).replace("|", "\\|")


def commit_of(record):
    if record.get("commit"):
        return record["commit"]
    if record.get("recorded_in"):
        return f"recorded in {record['recorded_in']}"
    return "-"


def rows(records):
    """One row per benchmark: (cells, goals met, goals, goals measured)."""
    out, n_met, n_goals, n_measured = [], 0, 0, 0
    for name in ORDER:
        lines = []  # (figure, goal, met, date, commit)
        if name in GOALS:
            for g in GOALS[name]:
                n_goals += 1
                op = {"<=": "≤", ">=": "≥", "<": "<", ">": ">", "==": "="}[g.op]
                goal = f"{op} {shown(g.target)} ({g.source})" + (f": {g.what}" if g.what else "")
                r = newest(records, name, g.key)
                if r is None:
                    lines.append((f"`{g.key}` -", goal, "not measured", "-", "-"))
                    continue
                v = value_of(r, g.key)
                ok = met(g, v)
                n_measured += 1
                n_met += bool(ok)
                lines.append((f"`{g.key}` {v}", goal, {True: "yes", False: "**no**"}.get(ok, "?"),
                              r["date"][:10], commit_of(r)))
        else:
            why, show = NO_GOAL[name]
            for key in show:
                r = newest(records, name, key)
                if r is None:
                    lines.append((f"`{key}` -", f"none ({why})", "-", "-", "-"))
                else:
                    lines.append((f"`{key}` {value_of(r, key)}", f"none ({why})", "-",
                                  r["date"][:10], commit_of(r)))
        columns = list(zip(*lines))
        # A column whose lines agree is said once.
        cells = [("<br>".join(cell(x) for x in c) if len(set(c)) > 1 else cell(c[0]))
                 for c in columns]
        link = f"[{name}](history/{name}.md)"
        out.append([f"**{name}**"] + cells + [link])
    return out, n_met, n_goals, n_measured


def render_table(records):
    body, n_met, n_goals, n_measured = rows(records)
    text = [BEGIN,
            f"{n_met} of {n_goals} goals met; {n_goals - n_measured} not measured yet. "
            "Each figure is the newest of its benchmark's records in "
            f"[results.jsonl](results.jsonl) that has it ({len(records)} records).",
            "",
            "| benchmark | figure | goal | met | date | commit | history |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    text += ["| " + " | ".join(r) + " |" for r in body]
    text.append(END)
    return "\n".join(text) + "\n"


def rendered(readme_text, table):
    start, end = readme_text.find(BEGIN), readme_text.find(END)
    if start < 0 or end < start:
        raise SystemExit("results: RESULTS.md has no results table markers (" + BEGIN + ")")
    return readme_text[:start] + table + readme_text[end + len(END) + 1:]


def render(results, readme, check=False):
    with open(readme) as f:
        old = f.read()
    new = rendered(old, render_table(load_records(results)))
    if check:
        return 0 if new == old else 1
    if new != old:
        with open(readme, "w") as f:
            f.write(new)
    return 0


def add(args):
    if args.name not in known():
        print(f"results: unknown benchmark {args.name!r} (known: {', '.join(ORDER)})",
              file=sys.stderr)
        return 2
    line = args.line
    if line is None:
        try:
            with open(args.from_file) as f:
                lines = [x.strip() for x in f if x.strip()]
        except OSError as e:
            print(f"results: cannot read {args.from_file}: {e.strerror}", file=sys.stderr)
            return 2
        line = lines[-1] if lines else ""
    figures = figures_of(line)
    if not figures:
        print(f"results: no key=value figure in {line!r}; nothing recorded", file=sys.stderr)
        return 2
    record = {
        "name": args.name,
        "date": args.date or datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"),
        "commit": args.commit if args.commit is not None else current_commit(),
        "machine": machine(args.load or None),
        "line": line,
        "figures": figures,
        "source": args.source,
    }
    if args.logs:
        record["logs"] = args.logs
    if args.note:
        record["note"] = args.note
    with open(args.results, "a") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    said = []
    for g in GOALS.get(args.name, []):
        v = value_of(record, g.key)
        said.append(f"{g.key} {v}: " + ("no figure" if v is None else
                                         {True: "met", False: "NOT met"}.get(met(g, v), "?")))
    print(f"results: {args.name} recorded in {shown_path(args.results)}"
          + (f" ({'; '.join(said)})" if said else ""))
    if not args.no_render:
        render(args.results, args.readme)
        print(f"results: {shown_path(args.readme)} rendered again")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=RESULTS, help="the records (default bench/results.jsonl)")
    p.add_argument("--readme", default=README, help="the file with the table (bench/RESULTS.md)")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="append a record and render the table")
    a.add_argument("name", help="an arm of bench/run.sh, or soak")
    src = a.add_mutually_exclusive_group(required=True)
    src.add_argument("--line", help="the benchmark's last line")
    src.add_argument("--from", dest="from_file", help="a file whose last line is it (OUT/NAME.txt)")
    a.add_argument("--date", help="when the arm started, ISO 8601 UTC (default: now)")
    a.add_argument("--commit", help="default: this tree's (results.py commit)")
    a.add_argument("--load", help='load average at the start, "1 5 15" (default: now)')
    a.add_argument("--logs", help="where the run's outputs are")
    a.add_argument("--note", help="a few words a reader of the record needs")
    a.add_argument("--source", default="manual", choices=SOURCES)
    a.add_argument("--no-render", action="store_true", help="append only")
    r = sub.add_parser("render", help="write the table into RESULTS.md")
    r.add_argument("--check", action="store_true", help="exit 1 if RESULTS.md's table is stale")
    sub.add_parser("commit", help="print the commit a record would name")
    # --results / --readme may also follow the command.
    for s in (a, r):
        s.add_argument("--results", default=argparse.SUPPRESS)
        s.add_argument("--readme", default=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.command == "add":
        return add(args)
    if args.command == "render":
        status = render(args.results, args.readme, args.check)
        if status:
            print("results: bench/RESULTS.md's table is stale: run `make results`",
                  file=sys.stderr)
        return status
    print(current_commit() or "unknown")
    return 0


if __name__ == "__main__":
    sys.exit(main())
