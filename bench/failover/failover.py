#!/usr/bin/python3
"""Coordinator failover on etcd (issue 13): `bash bench/run.sh failover`.

Starts a one-member etcd (Debian's etcd-server) on 127.0.0.1, two coordinator
replicas (--etcd) and 3 workers with ~1 s rounds, then kills the leader with
SIGKILL at random moments (--kills times; the killed replica is started again
as a standby). For each kill: the time from the kill to the next completed
round (seen through shoalctl status on both replicas), and the rounds lost
(a completed round the new leader did not resume after). Then the per-round
time of the same run with --etcd and with --state_dir (no kills).

Two clocks for each failover: the poll (the kill to the first `shoalctl status`
showing the round, so it includes the poll's own latency: a shoalctl process
per poll, slow on a loaded machine) and the log (the kill to the new leader's
"round N complete" line, same machine clock, millisecond stamps). Also, per
kill, whether every worker reported the interrupted round's ready from the
work it trained before the kill ("round not trained again" in its log).

Prints a table and ends with one line
  failover: median=..s max=..s median_log=..s max_log=..s ttl=..s rounds_lost=..
  not_retrained=K/N round_etcd=..s round_state_dir=..s overhead=..
  ratio_poll=<median failover (poll) / lease TTL> ratio=<median failover (log) / lease TTL>
(ratio: the issue's "time from the kill to the next completed round", which
the new leader's log stamps; the poll adds the status client's own latency).
Every process is started and stopped by PID. Nothing asserts on time.
"""
import argparse
import datetime
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Procs:
    def __init__(self, out):
        self.out = out
        self.procs = []

    def start(self, argv, name):
        log = open(os.path.join(self.out, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        p.log_path = log.name
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_listen(path, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        with open(path, "rb") as f:
            m = re.search(rb"listening on ([0-9.]+:[0-9]+)", f.read())
        if m:
            return m.group(1).decode()
        time.sleep(0.1)
    raise RuntimeError("no listen address in " + path)


def status(bin_dir, addresses):
    """The leader's status (or a standby's view), or None."""
    try:
        r = subprocess.run([os.path.join(bin_dir, "shoalctl"), "status", "--json",
                            "--coordinator=" + ",".join(addresses), "--rpc_timeout=1s"],
                           capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout)
    except ValueError:
        return None


def log_epoch(stamp, ref):
    """Seconds since the epoch of a log stamp HH:MM:SS.mmm (local time of
    the machine, as common/logging.cc writes it) on the day of `ref`."""
    h, m, s = stamp.split(":")
    day = datetime.datetime.fromtimestamp(ref)
    t = day.replace(hour=int(h), minute=int(m), second=0, microsecond=0).timestamp() + float(s)
    if t < ref - 43200:  # past midnight
        t += 86400
    return t


def completed_at(path, rnd, ref):
    """When the coordinator logging to `path` completed round `rnd`."""
    with open(path, "rb") as f:
        m = re.search(rb"^I([0-9:.]+) .*round %d complete:" % rnd, f.read(), re.M)
    return log_epoch(m.group(1).decode(), ref) if m else None


def not_retrained(out, rnd):
    """How many workers report round `rnd`'s ready from work carried across
    the failover (the line worker.cc logs)."""
    n = 0
    needle = b"round %d: ready report accepted for the work trained before" % rnd
    for i in range(3):
        with open(os.path.join(out, "failover-worker-%d.log" % i), "rb") as f:
            n += needle in f.read()
    return n


def last_round(st):
    return int(st.get("last_completed_round", 0)) if st else -1


def start_etcd(procs, out):
    cport, pport = free_port(), free_port()
    peer = "http://127.0.0.1:%d" % pport
    client = "http://127.0.0.1:%d" % cport
    procs.start(["/usr/bin/etcd", "--name=m0", "--data-dir=" + os.path.join(out, "etcd"),
                 "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
                 "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
                 "--initial-cluster=m0=" + peer, "--log-level=warn"], "etcd")
    endpoint = "127.0.0.1:%d" % cport
    end = time.time() + 30
    while time.time() < end:
        r = subprocess.run(["etcdctl", "--endpoints=" + endpoint, "--dial-timeout=1s",
                            "put", "/bench/probe", "ok"], capture_output=True,
                           env=dict(os.environ, ETCDCTL_API="3"))
        if r.returncode == 0:
            return endpoint
        time.sleep(0.2)
    raise RuntimeError("etcd did not start")


def coordinator_argv(args, listen, extra):
    return [os.path.join(args.bin, "shoal-coordinator"), "--listen=" + listen,
            "--run_id=bench-failover", "--min_participants=3",
            "--local_steps=%d" % args.local_steps, "--eval_every=100000",
            "--heartbeat_lease=5s"] + extra


def start_workers(procs, args, addresses, tag):
    data = "/usr/share/datasets/fashion-mnist"
    for i in range(3):
        procs.start([os.path.join(args.bin, "shoal-worker"),
                     "--coordinator=" + ",".join(addresses), "--listen=127.0.0.1:0",
                     "--data_dir=" + data, "--eval_limit=500", "--name=bench-%d" % i],
                    "%s-worker-%d" % (tag, i))


def wait_round(args, addresses, at_least, timeout):
    end = time.time() + timeout
    while time.time() < end:
        st = status(args.bin, addresses)
        if last_round(st) >= at_least:
            return st
        time.sleep(0.05)
    return None


def round_times(st):
    return [float(r["seconds"]) for r in st.get("recent_rounds", [])]


def measure_rounds(args, out, mode, rounds):
    """Median round seconds of a run without kills (--etcd or --state_dir)."""
    procs = Procs(out)
    try:
        if mode == "etcd":
            endpoint = start_etcd(procs, os.path.join(out, "etcd-" + mode))
            extra = ["--etcd=" + endpoint, "--etcd_prefix=/bench/overhead/",
                     "--lease_ttl=%ds" % args.ttl]
        else:
            extra = ["--state_dir=" + os.path.join(out, "state")]
        c = procs.start(coordinator_argv(args, "127.0.0.1:0", extra), mode + "-coordinator")
        addr = wait_listen(c.log_path)
        start_workers(procs, args, [addr], mode)
        st = wait_round(args, [addr], rounds + 2, 600)
        if st is None:
            raise RuntimeError(mode + ": the run did not reach round %d" % (rounds + 2))
        times = round_times(st)[2:]  # the first rounds include start-up
        return statistics.median(times), len(times)
    finally:
        procs.stop_all()


def overhead_pairs(args, out):
    etcd, state, ratios = [], [], []
    for p in range(args.overhead_pairs):
        pair_out = os.path.join(out, "pair-%d" % p)
        os.makedirs(pair_out, exist_ok=True)
        e, _ = measure_rounds(args, pair_out, "etcd", args.overhead_rounds)
        d, _ = measure_rounds(args, pair_out, "state_dir", args.overhead_rounds)
        etcd.append(e)
        state.append(d)
        ratios.append(e / d)
        print("pair %d: round etcd %.3f s, state_dir %.3f s, ratio %.3f" % (p + 1, e, d, e / d),
              file=sys.stderr)
    print("%-40s %s" % ("pairs (--etcd run, then --state_dir run)", len(ratios)))
    print("%-40s %s" % ("round time --etcd (median per run)", " ".join("%.3f" % x for x in etcd)))
    print("%-40s %s" % ("round time --state_dir (median per run)",
                        " ".join("%.3f" % x for x in state)))
    print("%-40s %s" % ("ratio per pair", " ".join("%.3f" % x for x in ratios)))
    print("failover-overhead: pairs=%d round_etcd=%.3fs round_state_dir=%.3fs ratio=%.3f" %
          (len(ratios), statistics.median(etcd), statistics.median(state),
           statistics.median(ratios)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--ttl", type=int, default=2)
    ap.add_argument("--local_steps", type=int, default=60)
    ap.add_argument("--overhead_rounds", type=int, default=15)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", default=None)
    ap.add_argument("--overhead_pairs", type=int, default=0,
                    help="only the round-time comparison: this many alternating runs of "
                         "--etcd then --state_dir (a loaded machine drifts between two "
                         "sequential runs; the ratio is the median of the pairs' ratios)")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="shoal-failover-")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(args.seed)
    if args.overhead_pairs > 0:
        overhead_pairs(args, out)
        return

    procs = Procs(out)
    failovers, lost, resumed_log, by_log, carried = [], 0, [], [], []
    try:
        endpoint = start_etcd(procs, out)
        ports = [free_port(), free_port()]
        listens = ["127.0.0.1:%d" % p for p in ports]
        extra = ["--etcd=" + endpoint, "--etcd_prefix=/bench/failover/",
                 "--lease_ttl=%ds" % args.ttl]
        reps = [procs.start(coordinator_argv(args, listens[i], extra), "replica-%d-0" % i)
                for i in range(2)]
        for r in reps:
            wait_listen(r.log_path)
        start_workers(procs, args, listens, "failover")
        if wait_round(args, listens, 3, 300) is None:
            raise RuntimeError("the run did not start (logs in %s)" % out)
        for k in range(args.kills):
            time.sleep(rng.uniform(0.0, 1.5))  # a random moment of the round
            # The leader (a loaded machine may make a status call fail now
            # and then: ask again for up to two minutes).
            st, end = None, time.time() + 120
            while time.time() < end:
                st = status(args.bin, listens)
                if st and st.get("replica_role") == "leader" and st.get("leader") in listens:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("no leader among the replicas: %r" % st)
            leader = st["leader"]
            i = listens.index(leader)
            before = last_round(st)
            reps[i].send_signal(signal.SIGKILL)
            killed = time.time()
            reps[i].wait()
            # The next completed round after the kill.
            nxt = wait_round(args, listens, before + 1, 120)
            if nxt is None:
                raise RuntimeError("no round completed within 120 s of kill %d" % k)
            failovers.append(time.time() - killed)
            # The new leader's resume point: rounds lost = completed rounds it
            # did not resume after.
            other = reps[1 - i]
            done = completed_at(other.log_path, before + 1, killed)
            if done is not None:
                by_log.append(done - killed)
            carried.append(not_retrained(out, before + 1))
            with open(other.log_path, "rb") as f:
                found = re.findall(rb"leader: resuming run \S+ after round ([0-9]+)", f.read())
            if found:
                resumed = int(found[-1])
                resumed_log.append((before, resumed))
                lost += max(0, before - resumed)
            # The killed replica comes back as a standby.
            reps[i] = procs.start(coordinator_argv(args, listens[i], extra),
                                  "replica-%d-%d" % (i, k + 1))
            wait_listen(reps[i].log_path)
            print("kill %2d: leader %s after round %d -> next round in %.2f s (poll), %s (log); "
                  "%d/3 workers reported it without retraining" %
                  (k + 1, leader, before, failovers[-1],
                   "%.2f s" % by_log[-1] if done is not None else "-", carried[-1]),
                  file=sys.stderr)
    finally:
        procs.stop_all()

    round_etcd, n_etcd = measure_rounds(args, out, "etcd", args.overhead_rounds)
    round_dir, n_dir = measure_rounds(args, out, "state_dir", args.overhead_rounds)
    med, worst = statistics.median(failovers), max(failovers)
    med_log = statistics.median(by_log) if by_log else float("nan")
    worst_log = max(by_log) if by_log else float("nan")
    all_carried = sum(1 for c in carried if c == 3)
    print("%-40s %s" % ("kills (3 workers, 2 replicas, 1 etcd)", len(failovers)))
    print("%-40s %d s" % ("lease TTL", args.ttl))
    print("%-40s %.2f s / %.2f s" % ("kill -> next completed round median/max", med, worst))
    print("%-40s %.2f" % ("median failover / lease TTL", med / args.ttl))
    print("%-40s %.2f s / %.2f s (%d kills)" % ("kill -> round complete (log) median/max",
                                                med_log, worst_log, len(by_log)))
    print("%-40s %.2f" % ("median failover (log) / lease TTL", med_log / args.ttl))
    print("%-40s %d of %d" % ("kills whose round no worker retrained", all_carried,
                              len(carried)))
    print("%-40s %d" % ("rounds lost (all kills)", lost))
    print("%-40s %.3f s (%d rounds)" % ("round time --etcd (median)", round_etcd, n_etcd))
    print("%-40s %.3f s (%d rounds)" % ("round time --state_dir (median)", round_dir, n_dir))
    print("%-40s %.3f" % ("round time etcd / state_dir", round_etcd / round_dir))
    print("failover: median=%.2fs max=%.2fs median_log=%.2fs max_log=%.2fs ttl=%ds "
          "rounds_lost=%d not_retrained=%d/%d round_etcd=%.3fs round_state_dir=%.3fs "
          "overhead=%.3f ratio_poll=%.2f ratio=%.2f" %
          (med, worst, med_log, worst_log, args.ttl, lost, all_carried, len(carried),
           round_etcd, round_dir, round_etcd / round_dir, med / args.ttl, med_log / args.ttl))


if __name__ == "__main__":
    main()
