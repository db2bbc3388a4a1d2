"""The benchmark results table (issue 51): bench/RESULTS.md's table is what
bench/results.py renders from bench/results.jsonl, every arm of bench/run.sh
has a goal entry or is marked as having none, and `results.py add` records a
line as bench/run.sh asks it to. Unit tier: reads the tree and runs the
script on copies in a temporary directory; builds and benchmarks nothing."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
SCRIPT = os.path.join(BENCH, "results.py")
sys.path.insert(0, BENCH)
import results  # noqa: E402


def run_sh_arms():
    """The arms bench/run.sh's usage names (`all` runs some of them)."""
    text = open(os.path.join(BENCH, "run.sh")).read()
    usage = re.search(r'echo "usage: bench/run.sh ([a-z_|]+)"', text)
    assert usage, "bench/run.sh has no usage line"
    arms = usage.group(1).split("|")
    assert "all" in arms
    return [a for a in arms if a != "all"]


def records():
    return results.load_records(results.RESULTS)


def test_the_table_in_results_md_is_the_one_rendered_from_results_jsonl():
    text = open(results.README).read()
    assert text.count(results.BEGIN) == 1 and text.count(results.END) == 1
    table = text[text.index(results.BEGIN):text.index(results.END) + len(results.END) + 1]
    assert table == results.render_table(records()), (
        "bench/RESULTS.md's table is stale: run `make results` "
        "(/usr/bin/python3 bench/results.py render)")


def test_every_arm_of_run_sh_has_a_goal_entry_or_is_marked_as_having_none():
    arms = run_sh_arms()
    missing = [a for a in arms if a not in results.GOALS and a not in results.NO_GOAL]
    assert not missing, f"no entry in bench/results.py GOALS or NO_GOAL for: {missing}"
    both = set(results.GOALS) & set(results.NO_GOAL)
    assert not both, f"both a goal and none: {both}"
    for name, goals in results.GOALS.items():
        assert goals, f"{name}: an empty goal list; say why in NO_GOAL instead"
    # No entry for an arm that is gone (the soak runs from `make soak`).
    assert set(results.known()) - set(arms) == {"soak"}
    assert sorted(results.ORDER) == sorted(results.known())


def test_run_sh_names_its_arms_alike_in_its_header_and_usage_and_readme_lists_them():
    text = open(os.path.join(BENCH, "run.sh")).read()
    header = re.search(r"#   bench/run.sh NAME +NAME: ([a-z_ |]+)\n", text)
    assert header
    assert [a.strip() for a in header.group(1).split("|")] == run_sh_arms() + ["all"]
    readme = open(os.path.join(BENCH, "README.md")).read()
    line = re.search(r"bash bench/run.sh NAME +# one: ([a-z_ |]+)\n", readme)
    assert line, "bench/README.md lists no arms"
    assert [a.strip() for a in line.group(1).split("|")] == run_sh_arms() + ["all"]


def test_every_goal_is_well_formed_and_every_row_has_a_history():
    for name, goals in results.GOALS.items():
        for g in goals:
            assert g.op in ("<=", ">=", "<", ">", "=="), (name, g)
            assert isinstance(g.target, (int, float, str)), (name, g)
            assert g.source, (name, g)
    for name in results.ORDER:
        assert os.path.isfile(os.path.join(BENCH, "history", name + ".md")), name


def test_every_record_is_complete():
    recs = records()
    assert recs
    for r in recs:
        assert r["name"] in results.known(), r
        assert re.match(r"\d{4}-\d\d-\d\d", r["date"]), r
        assert r["source"] in results.SOURCES, r
        assert r["figures"], r
        assert set(r["machine"]) == {"cores", "mem_gib", "load"}, r
        # A recorded line's figures are the line's own.
        if r["source"] != "imported":
            assert r["figures"] == results.figures_of(r["line"]), r
        if r["source"] == "imported" and not r.get("commit"):
            assert r.get("recorded_in"), f"{r['name']} {r['date']}: no commit and no recorded_in"


def test_figures_and_goals():
    f = results.figures_of('web: workers=1000 path="/api/status (fresh)" p50_ms=142.3 '
                           "topk:0.01=0.0127/0.8305 one/none=0.8665 rss_growth_max=3.3% ratio=n/a")
    assert f == {"workers": "1000", "path": "/api/status (fresh)", "p50_ms": "142.3",
                 "topk:0.01": "0.0127/0.8305", "one/none": "0.8665", "rss_growth_max": "3.3%",
                 "ratio": "n/a"}
    assert results.num("2.84s") == 2.84 and results.num("3.3%") == 3.3
    assert results.num("n/a") is None
    le = results.Goal("ratio", "<=", 1.0, "issue 47")
    assert results.met(le, "1.0") is True and results.met(le, "1.001") is False
    assert results.met(le, "n/a") is None
    lt = results.Goal("slowest_s", "<", 5, "issue 29")
    assert results.met(lt, "5.00") is False and results.met(lt, "4.99") is True
    # A printed "n/a" is no figure: the table takes an older record's.
    older = {"name": "exchange", "date": "2026-01-01", "figures": {"ratio": "0.9"}}
    newer = {"name": "exchange", "date": "2026-01-02", "figures": {"ratio": "n/a"}}
    assert results.newest([older, newer], "exchange", "ratio") is older
    # Derived figures: the quality gaps from the arms' accuracies.
    q = {"name": "quality", "date": "x", "figures": {"one/none": "0.8665", "skew/none": "0.8318"}}
    assert results.value_of(q, "skew_gap_pt") == "3.47"


@pytest.fixture
def copies(tmp_path):
    shutil.copy(results.RESULTS, tmp_path / "results.jsonl")
    shutil.copy(results.README, tmp_path / "RESULTS.md")
    return tmp_path


def script(*args, cwd=ROOT):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_add_appends_a_record_and_renders_the_table_again(copies):
    out = copies / "exchange.txt"
    out.write_text("a table\nexchange: shoal_s=0.120 gloo_s=0.125 reps=7 ratio=0.960 "
                   "ratio_400mb=1.020 mib_400mb=382\n")
    before = (copies / "results.jsonl").read_text()
    done = script("add", "exchange", "--from", str(out), "--date", "2099-01-02T03:04:05Z",
                  "--load", "0.50 0.40 0.30", "--logs", str(copies), "--source", "run.sh",
                  "--results", str(copies / "results.jsonl"),
                  "--readme", str(copies / "RESULTS.md"))
    assert done.returncode == 0, done.stderr
    assert "ratio 0.960: met; ratio_400mb 1.020: NOT met" in done.stdout
    after = (copies / "results.jsonl").read_text()
    assert after.startswith(before)
    rec = json.loads(after[len(before):])
    assert rec["name"] == "exchange" and rec["date"] == "2099-01-02T03:04:05Z"
    assert rec["figures"]["ratio_400mb"] == "1.020" and rec["source"] == "run.sh"
    assert rec["machine"]["load"] == "0.50 0.40 0.30" and rec["machine"]["cores"] >= 1
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", rec["commit"]), rec["commit"]
    table = (copies / "RESULTS.md").read_text()
    row = next(r for r in table.splitlines() if r.startswith("| **exchange**"))
    assert "`ratio` 0.960<br>`ratio_400mb` 1.020" in row and "yes<br>**no**" in row
    assert "2099-01-02" in row
    assert script("render", "--check", "--results", str(copies / "results.jsonl"),
                  "--readme", str(copies / "RESULTS.md")).returncode == 0
    # What the lead's README said of the rest is left alone.
    assert table.split(results.END)[1] == open(results.README).read().split(results.END)[1]


def test_render_check_fails_when_the_table_is_stale(copies):
    with open(copies / "results.jsonl", "a") as f:
        f.write(json.dumps({"name": "stream", "date": "2099-01-01", "commit": "abc1234",
                            "machine": {"cores": 2, "mem_gib": 1, "load": "0"}, "line": "",
                            "figures": {"ratio": "0.95"}, "source": "manual"}) + "\n")
    args = ["--results", str(copies / "results.jsonl"), "--readme", str(copies / "RESULTS.md")]
    stale = script("render", "--check", *args)
    assert stale.returncode == 1 and "make results" in stale.stderr
    assert script("render", *args).returncode == 0
    assert script("render", "--check", *args).returncode == 0


def test_add_refuses_an_unknown_benchmark_and_a_line_without_figures(copies):
    args = ["--results", str(copies / "results.jsonl"), "--readme", str(copies / "RESULTS.md")]
    before = (copies / "results.jsonl").read_text()
    bad_name = script("add", "streem", "--line", "streem: ratio=1", *args)
    assert bad_name.returncode == 2 and "unknown benchmark" in bad_name.stderr
    no_figures = script("add", "stream", "--line", "bench: a process did not start", *args)
    assert no_figures.returncode == 2 and "no key=value" in no_figures.stderr
    missing = script("add", "stream", "--from", str(copies / "none.txt"), *args)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert (copies / "results.jsonl").read_text() == before


def test_run_sh_records_once_per_arm_through_record_result():
    """Every arm runs through the one call after the case (or `all`'s loop)
    and record_result hands its last line to results.py."""
    text = open(os.path.join(BENCH, "run.sh")).read()
    body = text[text.index('case "$NAME" in'):]
    assert body.count("record_result") == 2, "one call after the case, one in all's loop"
    assert not re.search(r"^\s+run_[a-z_]+\s*$", body, re.M), "an arm runs inside the case"
    assert body.rstrip().endswith('"run_$NAME"\nrecord_result "$NAME"')
    fn = re.search(r"^record_result\(\) \{\n(.*?)^\}", text, re.M | re.S).group(1)
    assert 'bench/results.py' in fn and '--from "$OUT/$1.txt"' in fn
    assert '--date "$START_DATE"' in fn and '--load "$START_LOAD"' in fn


def test_record_result_in_bash_appends_a_line(tmp_path):
    """run.sh's header and record_result, run by bash against a fake arm."""
    shutil.copy(results.RESULTS, tmp_path / "results.jsonl")
    text = open(os.path.join(BENCH, "run.sh")).read()
    functions = "\n".join(re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", text, re.M | re.S).group(0)
                          for name in ("header", "record_result"))
    arm = f"""set -euo pipefail
cd {ROOT}
OUT={tmp_path} RESULTS={tmp_path}/results.jsonl COMMIT=abc1234 START_DATE= START_LOAD=
{functions}
header demo
echo "demo: rounds=10 round_s=0.245 exchange_s=0.005 cores=2 ratio=0.017" > "$OUT/demo.txt"
record_result demo
"""
    done = subprocess.run(["bash", "-c", arm], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rec = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])
    assert rec["name"] == "demo" and rec["commit"] == "abc1234" and rec["source"] == "run.sh"
    assert rec["figures"]["ratio"] == "0.017" and rec["logs"] == str(tmp_path)
    assert re.fullmatch(r"\S+ \S+ \S+", rec["machine"]["load"])
