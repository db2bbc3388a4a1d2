#!/usr/bin/python3
"""bench/run.sh straggler: what one slow machine costs a synchronous run.

4 workers train the MLP on Fashion-MNIST on 127.0.0.1; one of them is
throttled from outside to 1/4 of its peers' speed by a SIGSTOP/SIGCONT duty
cycle (the same scheme as tests/support/duty_cycle.h), from the moment every
worker has joined and the first round starts. With fewer cores than workers
an unthrottled worker gets cores/(others + duty) of a core, not a whole one,
so the duty is solved for: duty = slow_fraction x min(1, cores / (workers -
1 + duty)) (on 2 cores and 4 workers: 0.158, the peers at 0.61 of a core
each). The slowdown measured in the synchronous arm (the throttled worker's
median training time / its peers') is printed. Time to reach the target test accuracy for:

  today     synchronous, fixed deadline, late work dropped
            (--adaptive_deadline=false --fold_late_work=false)
  fold      synchronous, adaptive deadline + late work folded by staleness
  gossip    coordinator --mode=gossip ("gossip: not available" when the
            coordinator refuses the flag); its accuracy is the consensus
            model's (the average of the workers' current models, which the
            run's final average would be; --consensus_eval_every), as the
            synchronous arms' is the round's averaged model; the time the
            mean of the workers' own evaluations crossed the target is
            printed too

and, with no throttled worker, the test accuracy of sync and gossip after the
same number of samples. round_ratio: the fold arm's median round time over
the no-straggler arm's (what the slow worker costs the others per round).
Every arm is capped (--cap_seconds); a capped arm says
so and counts as its cap. Processes are stopped by PID, always.
Last line: straggler: ... ratio=<gossip / today>.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class DutyCycle:
    """Lets `pid` run for `fraction` of every `period` seconds."""

    def __init__(self, pid, fraction, period=0.2):
        self.pid, self.run, self.stop_s = pid, period * fraction, period * (1 - fraction)
        self.done = threading.Event()
        self.periods = 0
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _signal(self, sig):
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            self.done.set()

    def _loop(self):
        while not self.done.is_set():
            self._signal(signal.SIGCONT)
            if self.done.wait(self.run):
                break
            self._signal(signal.SIGSTOP)
            if self.done.wait(self.stop_s):
                break
            self.periods += 1
        self._signal(signal.SIGCONT)

    def stop(self):
        self.done.set()
        self.thread.join()
        self._signal(signal.SIGCONT)


class Cluster:
    def __init__(self, args, name, coordinator_flags):
        self.args, self.name = args, name
        self.dir = os.path.join(args.out, name)
        os.makedirs(self.dir, exist_ok=True)
        self.procs = []
        self.addr = None
        self.coordinator_flags = coordinator_flags

    def _spawn(self, argv, logname):
        f = open(os.path.join(self.dir, logname), "w")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def start_coordinator(self):
        a = self.args
        argv = [os.path.join(a.bin, "shoal-coordinator"), "--listen=127.0.0.1:0",
                f"--min_participants={a.workers}", f"--local_steps={a.local_steps}",
                f"--batch_size={a.batch_size}",
                "--eval_every=1", "--round_timeout=120s", "--seed=1"] + self.coordinator_flags
        p = self._spawn(argv, "coordinator.log")
        path = os.path.join(self.dir, "coordinator.log")
        deadline = time.time() + 30
        while time.time() < deadline:
            if p.poll() is not None:
                return False, open(path).read()[-600:]
            text = open(path).read()
            i = text.find("listening on 127.0.0.1:")
            if i >= 0:
                self.addr = text[i + len("listening on "):].split()[0]
                return True, ""
            time.sleep(0.1)
        return False, "coordinator did not report its address in 30 s"

    def start_workers(self):
        a = self.args
        for i in range(a.workers):
            self._spawn([os.path.join(a.bin, "shoal-worker"), f"--coordinator={self.addr}",
                         "--listen=127.0.0.1:0", f"--name={self.name}-{i + 1}"],
                        f"worker-{i + 1}.log")
        return self.procs[1:]

    def status(self):
        try:
            out = subprocess.run([os.path.join(self.args.bin, "shoalctl"), "status",
                                  f"--coordinator={self.addr}", "--json", "--rpc_timeout=5s"],
                                 capture_output=True, text=True, timeout=15)
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0:
            return None
        try:
            return json.loads(out.stdout)
        except json.JSONDecodeError:
            return None

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def consensus_of(st):
    """The latest consensus evaluation of a gossip run (None before one)."""
    if int(st.get("consensus_models", 0)) > 0:
        return float(st.get("consensus_test_accuracy", 0))
    return None


def accuracy_of(st):
    """The run's latest test accuracy: the newest evaluated round (sync), or
    the mean of the workers' latest evaluations (gossip, no rounds)."""
    for r in reversed(st.get("recent_rounds", [])):
        if r.get("evaluated"):
            return float(r.get("test_accuracy", 0)), int(r.get("round", 0))
    accs = [float(w.get("test_accuracy", 0)) for w in st.get("workers", [])
            if w.get("state") not in ("left", "lost", "finished", "evicted") and float(w.get("test_accuracy", 0)) > 0]
    return (sum(accs) / len(accs) if accs else 0.0), 0


def finished_accuracy(st):
    """Gossip with --gossip_steps: every worker evaluates after its last step
    and leaves; the mean of those final evaluations (left workers included)."""
    accs = [float(w.get("test_accuracy", 0)) for w in st.get("workers", [])
            if float(w.get("test_accuracy", 0)) > 0]
    return sum(accs) / len(accs) if accs else 0.0


def duty_fraction(slow_fraction, workers, cores):
    """The duty cycle that leaves one worker at slow_fraction of its peers'
    speed when `workers` single-threaded workers share `cores` cores: the
    fixed point of f = s * min(1, cores / (workers - 1 + f))."""
    f = slow_fraction
    for _ in range(100):
        f = slow_fraction * min(1.0, cores / (workers - 1 + f))
    return f


def worker_id_of(log_path):
    """The id a worker joined as, from its log ("joined run ... as wN")."""
    try:
        for line in open(log_path):
            i = line.find(" joined run ")
            if i >= 0:
                rest = line[i:].split(" as ", 1)
                if len(rest) == 2:
                    return rest[1].split()[0]
    except OSError:
        pass
    return None


def measured_slowdown(status, slow_id):
    """The throttled worker's median training time over its peers' median
    (sync arms; None when not measured)."""
    times = {w.get("id"): float(w.get("train_seconds_median", 0)) for w in status.get("workers", [])}
    slow = times.pop(slow_id, 0) if slow_id else 0
    peers = sorted(t for t in times.values() if t > 0)
    if slow <= 0 or not peers:
        return None
    return slow / peers[len(peers) // 2]


def median_round_seconds(status):
    """Median wall time of the completed rounds in the status (round start to
    the last hash report), or None. The throttled arms count from their
    first round, which is throttled too."""
    secs = sorted(float(r.get("seconds", 0)) for r in status.get("recent_rounds", [])
                  if float(r.get("seconds", 0)) > 0)
    return secs[len(secs) // 2] if secs else None


def run_arm(args, name, flags, throttle, stop_when, workers_may_exit=False):
    """Starts a cluster, throttles worker 4 when asked, polls the status until
    stop_when(status, elapsed) says so or the cap passes. Returns a dict.
    workers_may_exit: the run ends by itself (workers leave when done), so a
    worker process that exited is not a failure; the coordinator is."""
    c = Cluster(args, name, flags)
    duty = None
    result = {"name": name, "available": True, "capped": False}
    try:
        ok, why = c.start_coordinator()
        if not ok:
            result["available"] = False
            result["why"] = why.strip().splitlines()[-1] if why.strip() else "did not start"
            return result
        workers = c.start_workers()
        t0 = None
        start = time.time()
        last = None
        while True:
            now = time.time()
            st = c.status()
            if st is not None:
                last = st
                if t0 is None and (st.get("phase") in ("TRAINING", "SHARING") or
                                   int(st.get("last_completed_round", 0)) > 0):
                    t0 = now  # every worker joined: training has started
                    if throttle:
                        # Throttled from here on, not while it joins: a worker
                        # that takes longer than the coordinator's session grace
                        # between Join and opening its session is dropped.
                        duty = DutyCycle(workers[-1].pid, args.duty)
                if t0 is not None:
                    done = stop_when(st, now - t0)
                    if done:
                        result["seconds"] = now - t0
                        result.update(done)  # a stop that timed its own crossing wins
                        break
            if now - start > args.cap_seconds:
                result["capped"] = True
                result["seconds"] = now - (t0 or start)
                break
            watched = c.procs[:1] if workers_may_exit else c.procs
            if any(p.poll() is not None for p in watched):
                result["available"] = False
                result["why"] = "a process exited early (logs in %s)" % c.dir
                break
            time.sleep(args.poll)
        if last is not None:
            acc, rnd = accuracy_of(last)
            result.setdefault("accuracy", acc)
            result["rounds"] = int(last.get("last_completed_round", 0))
            slow = [w for w in last.get("workers", [])]
            result["late"] = sum(int(w.get("rounds_late", 0)) for w in slow)
            result["folded"] = sum(int(w.get("folded_updates", 0)) for w in slow)
            result["round_median"] = median_round_seconds(last)
            json.dump(last, open(os.path.join(c.dir, "status.json"), "w"), indent=1)
        if duty is not None:
            result["duty_periods"] = duty.periods
            if last is not None:
                slow_id = worker_id_of(os.path.join(c.dir, f"worker-{args.workers}.log"))
                result["slowdown"] = measured_slowdown(last, slow_id)
    finally:
        if duty is not None:
            duty.stop()
        c.stop()
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--local_steps", type=int, default=100)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--slow_fraction", type=float, default=0.25)
    ap.add_argument("--cap_seconds", type=float, default=600)
    ap.add_argument("--equal_rounds", type=int, default=10)
    ap.add_argument("--deadline_factor", type=float, default=1.5)
    ap.add_argument("--poll", type=float, default=0.5)
    # The gossip arms' own settings (bench/history/straggler.md): at the
    # coordinator's defaults (every 10 steps, lr 0.05) gossip ends 2.7 points
    # below sync at equal samples; pulling a peer every 2 steps at half the
    # learning rate closes the gap.
    ap.add_argument("--gossip_every", type=int, default=2)
    ap.add_argument("--gossip_learning_rate", type=float, default=0.025)
    ap.add_argument("--arms", default="today,fold,gossip,equal-sync,equal-gossip",
                    help="which arms to run (levers: e.g. --arms=equal-gossip)")
    ap.add_argument("--gossip_flags", default="",
                    help="extra coordinator flags of the gossip arms, space-separated")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of each straggler arm (interleaved); the median time counts")
    ap.add_argument("--cores", type=int, default=os.cpu_count(),
                    help="cores the workers share (for the duty cycle)")
    args = ap.parse_args()
    args.duty = duty_fraction(args.slow_fraction, args.workers, args.cores)
    wanted = set(args.arms.split(","))
    # Evaluate as often as the sync arms do (every --local_steps steps):
    # --eval_every counts publications, one every --gossip_every steps.
    args.gossip_eval_every = max(1, args.local_steps // args.gossip_every)
    gossip_extra = [f"--gossip_every={args.gossip_every}",
                    f"--learning_rate={args.gossip_learning_rate}"] + args.gossip_flags.split()

    def reach(st, elapsed):
        acc, rnd = accuracy_of(st)
        if acc >= args.target:
            return {"accuracy": acc, "round": rnd}
        return None

    def reach_gossip():
        """Gossip: done when the consensus model reached the target (its
        time counts) and the mean of the workers' own evaluations did too
        (printed)."""
        seen = {}

        def stop(st, elapsed):
            consensus = consensus_of(st)
            if "seconds" not in seen and consensus is not None and consensus >= args.target:
                seen.update(seconds=elapsed, accuracy=consensus)
            mean, _ = accuracy_of(st)
            if "mean_seconds" not in seen and mean >= args.target:
                seen.update(mean_seconds=elapsed, mean_accuracy=mean)
            if "seconds" in seen and "mean_seconds" in seen:
                return dict(seen)
            return None
        return stop

    arms = [
        ("today", ["--adaptive_deadline=false", "--fold_late_work=false"]),
        ("fold", ["--adaptive_deadline=true", "--fold_late_work=true",
                  "--adaptive_deadline_rounds=2", f"--deadline_factor={args.deadline_factor}",
                  "--deadline_floor=500ms"]),
        # Evaluation runs inside a gossip worker's training loop, every
        # --local_steps steps as in the sync arms.
        ("gossip", ["--mode=gossip", f"--eval_every={args.gossip_eval_every}",
                    f"--consensus_eval_every={args.gossip_eval_every}"] + gossip_extra),
    ]
    arms = [a for a in arms if a[0] in wanted]
    results = {}
    print(f"straggler: {args.workers} workers, mlp, Fashion-MNIST, {args.local_steps} local steps "
          f"x batch {args.batch_size}, worker {args.workers} throttled to {args.slow_fraction:g} "
          f"of its peers' speed (SIGSTOP/SIGCONT, runs {args.duty:.3f} of every 200 ms on "
          f"{args.cores} cores), target test accuracy {args.target}, "
          f"cap {args.cap_seconds:.0f} s per arm")
    print(f"{'arm':<8} {'time_to_target':>15} {'accuracy':>9} {'rounds':>7} {'late':>5} "
          f"{'folded':>7}  note")
    runs = {name: [] for name, _ in arms}
    for rep in range(args.repeats):
        for name, flags in arms:
            if runs[name] and not runs[name][-1]["available"]:
                continue
            label = name if args.repeats == 1 else f"{name}#{rep + 1}"
            log(f"straggler: arm {label} ...")
            stop = reach_gossip() if name == "gossip" else reach
            r = run_arm(args, label, flags, True, stop)
            runs[name].append(r)
            if not r["available"]:
                print(f"{label:<8} {'-':>15} {'-':>9} {'-':>7} {'-':>5} {'-':>7}  "
                      f"{name}: not available ({r.get('why', '')})")
                continue
            note = (f"CAPPED at {args.cap_seconds:.0f} s without reaching {args.target}"
                    if r["capped"] else f"reached {args.target}")
            if r.get("slowdown"):
                note += f"; throttled worker trained {r['slowdown']:.1f} x slower than its peers"
            if r.get("round_median"):
                note += f"; median round {r['round_median']:.2f}s"
            if "mean_seconds" in r:
                note += (f" (consensus model); the mean of the workers' own models reached it "
                         f"at {r['mean_seconds']:.1f}s")
            print(f"{label:<8} {r['seconds']:>14.1f}s {r.get('accuracy', 0):>9.4f} "
                  f"{r.get('rounds', 0):>7} {r.get('late', 0):>5} {r.get('folded', 0):>7}  {note}",
                  flush=True)
    for name, rs in runs.items():
        ok = [r for r in rs if r["available"]]
        if not ok:
            results[name] = rs[-1] if rs else {"available": False}
            continue
        ok.sort(key=lambda r: r["seconds"])
        results[name] = ok[len(ok) // 2]  # the median run
    if args.repeats > 1:
        print("median of %d runs: %s" % (args.repeats, "  ".join(
            f"{n}={results[n]['seconds']:.1f}s" for n in runs if results[n].get("available"))))

    # No straggler: accuracy after the same number of samples.
    samples = args.equal_rounds * args.workers * args.local_steps * args.batch_size

    def after_rounds(st, elapsed):
        if int(st.get("last_completed_round", 0)) >= args.equal_rounds:
            acc, _ = accuracy_of(st)
            return {"accuracy": acc}
        return None

    def after_samples(st, elapsed):
        # Each gossip worker trains exactly equal_rounds x local_steps steps
        # (--gossip_steps), evaluates and leaves: the run is FINISHED when the
        # last one left. Samples = the steps the workers report x batch.
        if st.get("phase") == "FINISHED":
            steps = sum(int(w.get("gossip_steps", 0)) for w in st.get("workers", []))
            return {"accuracy": finished_accuracy(st), "samples": steps * args.batch_size}
        return None

    sync_eq = {"available": False, "accuracy": 0}
    if "equal-sync" in wanted:
        log("straggler: equal samples, sync ...")
        sync_eq = run_arm(args, "equal-sync", ["--adaptive_deadline=false",
                                                f"--rounds={args.equal_rounds}"], False, after_rounds)
    gossip_eq = {"available": False, "why": "gossip arm not available"}
    if "equal-gossip" in wanted and results.get("gossip", {"available": True})["available"]:
        log("straggler: equal samples, gossip ...")
        gossip_eq = run_arm(args, "equal-gossip",
                            ["--mode=gossip", f"--eval_every={args.gossip_eval_every}",
                             f"--gossip_steps={args.equal_rounds * args.local_steps}"] + gossip_extra,
                            False, after_samples, workers_may_exit=True)
    if sync_eq.get("round_median"):
        print(f"no straggler (equal-sync): median round {sync_eq['round_median']:.2f}s")
    line = f"equal samples ({samples} = {args.equal_rounds} rounds x {args.workers} workers), no straggler: "
    line += f"sync accuracy={sync_eq.get('accuracy', 0):.4f}"
    if sync_eq.get("capped"):
        line += " (CAPPED)"
    if gossip_eq.get("available"):
        line += (f" gossip accuracy={gossip_eq.get('accuracy', 0):.4f}"
                 f" ({gossip_eq.get('samples', 0)} samples)")
        if gossip_eq.get("capped"):
            line += " (CAPPED)"
        gap = (sync_eq.get("accuracy", 0) - gossip_eq.get("accuracy", 0)) * 100
        line += f" gap={gap:.2f} points"
    else:
        line += " gossip: not available"
    print(line)

    def t(name):
        r = results.get(name)
        return r["seconds"] if r is not None and r["available"] else None

    today, fold, gossip = t("today"), t("fold"), t("gossip")
    fold_ratio = f"{fold / today:.2f}" if today and fold is not None else "n/a"
    gossip_ratio = f"{gossip / today:.2f}" if today and gossip is not None else "n/a"

    def fmt(name, v):
        if v is None:
            return f"{name}=n/a"
        return f"{name}={v:.1f}s" + ("(capped)" if results[name]["capped"] else "")


    # What a throttled worker costs the others per round (the figure the
    # straggler e2e test once asserted on): the fold arm's median round over
    # the median round of the same cluster with no straggler.
    fold_round = results.get("fold", {}).get("round_median") if fold is not None else None
    round_ratio = (f"{fold_round / sync_eq['round_median']:.2f}"
                   if fold_round and sync_eq.get("round_median") else "n/a")

    if gossip is None:
        print("gossip: not available")
    print(f"straggler: {fmt('today', today)} {fmt('fold', fold)} {fmt('gossip', gossip)} "
          f"fold_ratio={fold_ratio} round_ratio={round_ratio} ratio={gossip_ratio}")


if __name__ == "__main__":
    main()
