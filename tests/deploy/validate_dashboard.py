#!/usr/bin/python3
"""Offline check of deploy/grafana/shoal-dashboard.json: valid JSON with
panels, every panel has a title and at least one query, every query names
shoal_* series, and each of them is a metric docs/OPERATIONS.md lists (so
the dashboard never graphs a series no server exports). Histograms may be
queried through _bucket, _sum or _count."""
import argparse
import json
import re
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    args = parser.parse_args()
    with open(f"{args.repo}/deploy/grafana/shoal-dashboard.json") as f:
        dashboard = json.load(f)
    with open(f"{args.repo}/docs/OPERATIONS.md") as f:
        documented = set(re.findall(r"^\| `(shoal_[a-z0-9_]+)`", f.read(), re.M))
    errors = []
    panels = []

    def walk(items):
        for p in items:
            panels.append(p)
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    if not panels:
        errors.append("the dashboard has no panels")
    queried = 0
    for p in panels:
        if p.get("type") == "row":
            continue
        title = p.get("title", "")
        if not title:
            errors.append(f"panel {p.get('id')} has no title")
        targets = p.get("targets", [])
        if not targets:
            errors.append(f"panel '{title}' has no query")
        for t in targets:
            expr = t.get("expr", "")
            names = re.findall(r"\b(shoal_[a-z0-9_]+)", expr)
            if not names:
                errors.append(f"panel '{title}': query '{expr}' names no shoal_ series")
            for n in names:
                base = re.sub(r"_(bucket|sum|count)$", "", n)
                if n not in documented and base not in documented:
                    errors.append(f"panel '{title}': {n} is not a metric docs/OPERATIONS.md lists")
            queried += 1
    for e in errors:
        print("ERROR:", e)
    print(f"{len(panels)} panels, {queried} queries, {len(documented)} documented metrics, "
          f"{len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
