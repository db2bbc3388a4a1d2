"""The sample ledger from Python (docs/PYTHON.md, "The sample ledger"):
Python workers train the samples the coordinator names, through
w.batches() and w.sampler(); every sample is trained exactly once in the
epoch across a kill -9 and a late joiner, counted from the workers' ledger
lines (as tests/e2e/ledger_test.cc does) and from what the loops say they
trained; a C++ and a Python worker share one ledger run."""
import re
import signal
import time
from collections import Counter

from conftest import ROOT, round_hashes, wait_until

LEDGER_MAIN = ROOT / "tests" / "python" / "ledger_main.py"
REFUSAL_MAIN = ROOT / "tests" / "python" / "refusal_main.py"


def ledger_lines(text):
    """{round: [(epoch, begin, end), ...]} of a worker's "ledger: round R
    trained samples ..." lines (WorkerProtocol::Settle)."""
    out = {}
    for m in re.finditer(r"ledger: round (\d+) trained samples ([^\n]*)", text):
        out[int(m.group(1))] = [(int(e), int(b), int(x)) for e, b, x in
                                re.findall(r"e(\d+):\[(\d+),(\d+)\)", m.group(2))]
    return out


def positions(logs, n):
    """How often each position of epoch 0 is in the ledger lines of `logs`."""
    seen = [0] * n
    for text in logs:
        for ranges in ledger_lines(text).values():
            for epoch, begin, end in ranges:
                assert epoch == 0 and end <= n, ranges
                for p in range(begin, end):
                    seen[p] += 1
    return seen


def trained_indices(record_path):
    """{round: [dataset indices]} a loop trained (ledger_main.py --record)."""
    out = {}
    if not record_path.exists():
        return out
    for line in record_path.read_text().splitlines():
        r, *idx = line.split()
        out.setdefault(int(r), []).extend(int(i) for i in idx)
    return out


def assert_each_once(counts, what):
    wrong = {i: c for i, c in enumerate(counts) if c != 1}
    assert not wrong, \
        f"{len(wrong)} {what} not trained exactly once, e.g. {list(wrong.items())[:10]}"


def test_python_workers_train_every_sample_once_across_a_kill_and_a_late_joiner(cluster,
                                                                                 tmp_path):
    n = 19200
    cluster.coordinator("--model=module", "--min_participants=2", "--sample_ledger",
                        "--epochs=1", "--local_steps=10", "--batch_size=32",
                        "--heartbeat_lease=3s")
    records = {name: tmp_path / f"{name}.rec" for name in ("a", "b", "c", "late")}

    def start(name, *extra):
        return cluster.python(LEDGER_MAIN, name, f"--train_samples={n}",
                              f"--record={records[name]}", *extra)

    # The victim joins first (it trains from round 1), and slowly once it
    # trained 2 rounds: it is killed while it trains a round, once the
    # ledger line of its round before is out.
    c = start("c", "--slow_after=2")
    cluster.coordinator_proc.wait_for(r"member joined: w1 ", 120)
    a = start("a")
    b = start("b", "--api=sampler")  # a DataLoader over w.sampler()
    gate = tmp_path / "join"
    late = start("late", f"--join_after={gate}")
    for w in (a, b, c):
        m = w.wait_for(r"^joined as w\d+: ledger (\w+) batch_size (\d+) ", 300)
        assert m.group(1) == "True" and m.group(2) == "32", w.log()
    c.wait_for(r"^slow from round \d+$", 300)
    time.sleep(1.0)  # its log lines of the round before, through Python's logging
    c.signal(signal.SIGKILL)
    c.wait(30)
    killed_at = max(ledger_lines(c.log()), default=0)
    # The others go on; then a late joiner (its data loaded) joins.
    wait_until(lambda: max(round_hashes(a.log()), default=0) >= killed_at + 2, 120,
               "rounds after the kill")
    gate.touch()
    late.wait_for(r"^joined as w\d+", 120)
    for w in (a, b, late):
        w.wait_for(r"^done after \d+ rounds", 300)
        assert w.wait(60) == 0, w.log()

    status = cluster.status()
    assert status["phase"] == "FINISHED", status
    ledger = status["ledger"]
    assert int(ledger["dataset_samples"]) == n
    assert int(ledger["epochs_done"]) == 1
    assert int(ledger["samples_trained"]) == n
    assert int(ledger.get("samples_lost", 0)) > 0, "the killed worker's round went back"
    assert int(ledger.get("samples_redone", 0)) == int(ledger["samples_lost"])
    # The status from Python: the epoch's progress.
    assert f"status ledger: epochs_done 1 trained {n} " in a.log(), a.log()

    # The workers' own record: every position of the epoch exactly once.
    workers = {"a": a, "b": b, "c": c, "late": late}
    logs = {name: w.log() for name, w in workers.items()}
    assert_each_once(positions(logs.values(), n), "positions")
    assert ledger_lines(logs["late"]), "the late joiner trained rounds of the epoch"
    assert ledger_lines(logs["c"]), "the killed worker trained rounds before its kill"
    # What the loops trained: in each round a worker recorded in the ledger,
    # as many samples as the ledger names, and over all of them every index
    # of the training set exactly once.
    indices = [0] * n
    for name in workers:
        mine = trained_indices(records[name])
        for r, ranges in ledger_lines(logs[name]).items():
            assert len(mine.get(r, [])) == sum(e - b for _, b, e in ranges), (name, r)
            for i in mine.get(r, []):
                indices[i] += 1
    assert_each_once(indices, "indices")
    # One model per round on every worker, and one at the end.
    hashes = [round_hashes(logs[name]) for name in workers]
    for r in set().union(*hashes):
        seen = {h[r] for h in hashes if r in h}
        assert len(seen) == 1, f"round {r}: {seen}"
    finals = {re.search(r"^done after \d+ rounds: hash ([0-9a-f]{64})", logs[name], re.M).group(1)
              for name in ("a", "b", "late")}
    assert len(finals) == 1, finals


def test_a_cpp_and_a_python_worker_share_one_ledger_run(cluster, tmp_path):
    # --model=mlp: shoal-worker trains its built-in MLP on Fashion-MNIST's
    # 60000 training images; the Python worker's module has its layout and
    # declares the same training set, whose positions both map through the
    # run's permutation.
    n = 60000
    cluster.coordinator("--model=mlp", "--min_participants=2", "--sample_ledger", "--epochs=1",
                        "--local_steps=50", "--batch_size=100")
    cpp = cluster.cpp_worker("cpp")
    record = tmp_path / "py.rec"
    py = cluster.python(LEDGER_MAIN, "py", f"--train_samples={n}", f"--record={record}")
    py.wait_for(r"^done after \d+ rounds", 300)
    assert py.wait(60) == 0, py.log()
    assert cpp.wait(120) == 0, cpp.log()
    status = cluster.status()
    assert status["phase"] == "FINISHED", status
    assert int(status["ledger"]["epochs_done"]) == 1
    assert int(status["ledger"]["samples_trained"]) == n
    logs = [cpp.log(), py.log()]
    assert ledger_lines(logs[0]) and ledger_lines(logs[1]), "both trained"
    assert_each_once(positions(logs, n), "positions")
    mine = trained_indices(record)
    trained = Counter()
    for r, ranges in ledger_lines(logs[1]).items():
        assert len(mine.get(r, [])) == sum(e - b for _, b, e in ranges), r
        trained.update(mine.get(r, []))
    assert max(trained.values()) == 1
    # The Python worker's models are the run's agreed ones.
    agreed = {int(r["round"]): r["model_hash"] for r in status["recent_rounds"]}
    mine_hashes = round_hashes(logs[1])
    assert mine_hashes
    for r, h in mine_hashes.items():
        assert agreed[r] == h, f"round {r}"
    for r in status["recent_rounds"]:
        assert int(r["participants"]) == 2, r


def test_without_a_ledger_the_samples_are_the_workers_shard(cluster, tmp_path):
    # The same loops in a run without the ledger: each pass is an epoch of
    # the worker's shard (rank, shards), shuffled; any batch size.
    n = 1200
    cluster.coordinator("--model=module", "--min_participants=2", "--rounds=4",
                        "--local_steps=10", "--batch_size=32")
    records = {api: tmp_path / f"{api}.rec" for api in ("batches", "sampler")}
    workers = {api: cluster.python(LEDGER_MAIN, api, f"--train_samples={n}", f"--api={api}",
                                   f"--record={records[api]}") for api in records}
    for api, w in workers.items():
        m = w.wait_for(r"^joined as w\d+: ledger (\w+) batch_size \d+ rank (\d+) shards (\d+)",
                       300)
        assert m.group(1) == "False", w.log()
        rank, shards = int(m.group(2)), int(m.group(3))
        assert shards == 2
        w.wait_for(r"^done after 4 rounds", 300)
        assert w.wait(60) == 0, w.log()
        assert "ledger: round" not in w.log()
        trained = [i for idx in trained_indices(records[api]).values() for i in idx]
        # 4 rounds of 10 steps; an epoch's last batch is short (600 = 18 x 32 + 24).
        assert len(records[api].read_text().splitlines()) == 4 * 10, api
        shard = list(range(rank % shards, n, shards))
        # An epoch of the shard, then the next, each in its own order.
        assert sorted(trained[:len(shard)]) == shard, api
        assert sorted(trained[len(shard):2 * len(shard)]) == shard, api
        assert trained[:len(shard)] != trained[len(shard):2 * len(shard)], "reshuffled"


def test_a_python_worker_that_declares_no_training_set_is_refused_in_a_ledger_run(cluster):
    cluster.coordinator("--model=module", "--min_participants=2", "--sample_ledger")
    w = cluster.python(REFUSAL_MAIN, "first")
    assert w.wait(120) == 3, w.log()
    assert "error FAILED_PRECONDITION" in w.log(), w.log()
    assert "shoal.Worker(..., train_samples=len(dataset))" in w.log(), w.log()
