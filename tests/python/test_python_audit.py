"""Audits from Python (docs/PYTHON.md, "Audits"): Python workers that hand
Shoal their step (shoal.Worker(step=, optimizer=) and w.run()) replay each
other's rounds bit for bit, a module with dropout and BatchNorm included;
one that trains on shuffled labels is caught, banned and told to leave
while the honest ones go on with one hash a round; a worker that hands no
step is refused at join in an audited run; and the step() of a user's own
loop is refused in one."""
import re

from conftest import ROOT, round_hashes, wait_until

AUDIT_MAIN = ROOT / "tests" / "python" / "audit_main.py"


def test_python_workers_replay_each_other_and_a_cheater_is_banned(cluster):
    cluster.coordinator("--model=module", "--min_participants=3", "--local_steps=4",
                        "--batch_size=32", "--audit_rate=1", "--audit_seed=py-audits",
                        "--rounds=12", "--round_timeout=120s", "--adaptive_deadline=false",
                        "--heartbeat_lease=20s")
    honest = [cluster.python(AUDIT_MAIN, name) for name in ("a", "b", "c")]
    cheater = cluster.python(AUDIT_MAIN, "cheater", "--shuffle_labels")
    for w in honest + [cheater]:
        m = w.wait_for(r"^joined as w\d+: audited (\w+) threads (\d+)", 300)
        assert m.group(1) == "True" and m.group(2) == "1", w.log()

    # Caught as a participant (two honest replays disagree with it) or as
    # an auditor (a second opinion outvotes its replay): banned either way.
    status = wait_until(lambda: (lambda s: s if s.get("bans") else None)(cluster.status()),
                        300, "a ban")
    assert [b["name"] for b in status["bans"]] == ["cheater"], status["bans"]
    assert "failed audit" in status["bans"][0]["reason"], status["bans"][0]
    assert int(status.get("audits_failed", 0)) >= 1, status
    cheater.wait_for(r"^result FAILED_PRECONDITION: .*banned", 120)

    for w in honest:
        w.wait_for(r"^done after \d+ rounds", 600)
        assert w.wait(60) == 0, w.log()
    status = cluster.status()
    assert status["phase"] == "FINISHED", status
    # The honest members' replays of each other agreed: audits passed and
    # none of theirs failed.
    members = {m["name"]: m for m in status["workers"]}
    for name in ("a", "b", "c"):
        assert int(members[name].get("audits_failed", 0)) == 0, members[name]
    assert sum(int(members[n].get("audits_passed", 0)) for n in ("a", "b", "c")) >= 6, members
    assert int(status["audits_performed"]) > int(status.get("audits_failed", 0))
    # One model per round on every honest worker, and one at the end.
    logs = [w.log() for w in honest]
    hashes = [round_hashes(text) for text in logs]
    for r in set().union(*hashes):
        seen = {h[r] for h in hashes if r in h}
        assert len(seen) == 1, f"round {r}: {seen}"
    finals = {re.search(r"^done after \d+ rounds: hash ([0-9a-f]{64})", text, re.M).group(1)
              for text in logs}
    assert len(finals) == 1, finals
    assert "cannot replay" not in "".join(logs), "a replay that could not run"


def test_an_audited_run_refuses_a_python_worker_without_its_step(cluster):
    cluster.coordinator("--model=module", "--min_participants=1", "--local_steps=2",
                        "--audit_rate=1")
    w = cluster.python(AUDIT_MAIN, "nostep", "--no_step")
    m = w.wait_for(r"^error (\w+): (.*)$", 120)
    assert m.group(1) == "FAILED_PRECONDITION", w.log()
    assert "replayable" in m.group(2) and "step=" in m.group(2), m.group(2)
    assert w.wait(30) == 3
    # One that hands its step but steps in a loop of its own: step() says
    # to use run().
    own = cluster.python(AUDIT_MAIN, "own", "--own_loop")
    m = own.wait_for(r"^own loop: (.*)$", 120)
    assert m.group(1).startswith("error FAILED_PRECONDITION: this run is audited"), own.log()
    assert "w.run(dataset)" in m.group(1), m.group(1)
