#!/usr/bin/python3
"""bench/run.sh wan: training over shaped 20 Mbit/s links (issue 16).

Network (created here, removed at the end, on failure and on SIGINT/SIGTERM):
  namespace PREFIX-sw   a bridge br0 (the "switch")
  namespace PREFIX-c    the coordinator, eth0 = 10.77.0.1/24, link UNSHAPED
  namespace PREFIX-wI   worker I (1..4), eth0 = 10.77.0.(10+I)/24; its veth
                        is shaped with `tc tbf rate 20mbit` at both ends
                        (egress of eth0 = upload, egress of the bridge port
                        = download), so every worker has 20 Mbit/s each way.
The 10.77.0.0/24 addresses exist only inside these namespaces.

Arms, each capped (--cap_seconds), each timed from "every worker joined" to
the first test accuracy >= --target (0.87) on the full Fashion-MNIST test set:
  ddp         PyTorch DDP (gloo), the same MLP/batch/lr, all-reduce every step
              (bench/wan/ddp_mlp.py; its evaluation time is excluded)
  shoal-fp32  Shoal defaults (--codec=fp32 --outer_optimizer=none)
  shoal-int8  Shoal --codec=int8 --outer_optimizer=nesterov
  shoal-fp32-paced  shoal-fp32 with every worker's --uplink_mbps=--pace_mbit
              (its connections paced in the kernel, uplink_pacer.h)
Shoal arms: --local_steps=--shoal_local_steps, --eval_every=1 (every worker
evaluates every round; that time is included); accuracy read from
`shoalctl status --json`, polled inside the coordinator's namespace.
A capped arm counts as its cap and the table says so.

Also one fp32 exchange against the line-rate bound 2(N-1)/N x model bytes /
20 Mbit/s: per round, the slowest worker's `exchange=` from the worker logs;
the median over rounds (round 1 excluded: connections are set up then).
The same bytes over plain TCP sockets (bench/wan/tcp_exchange.py): arm tcp,
and arm tcp-paced with each rank's sockets paced at --pace_mbit.

Big-model arms (issue 27, "make the communication matter"): a 21 MB
TorchScript MLP (bench/hier/wide_mlp.py --hidden=6700: 5,326,510 float32
parameters), --big_workers workers (no more than cores) with one torch
thread each, int8 + Nesterov, the links reshaped to 10 Mbit/s, 2 Mbit/s or
unshaped (the tbf qdiscs replaced or removed), each arm with and without
--overlap=on: big-{plain,overlap}-{unshaped,10,2}. Per arm: time to
--big_target (on the first --big_eval_limit test images), compute
utilization (per worker, the training seconds of rounds 2.. over the wall
time from round 1's end to the last round's, from its log; the mean over
workers), bytes received per round.
Streaming fragments (--fragments=K): big-fragK-RATE and big-overlapfragK-RATE
(with --overlap=on) run --big_local_steps / K steps per round and evaluate
every K rounds, so each fragment is synced after --big_local_steps steps.
Last line: wan: ... ratio=<shoal-int8 time / ddp time> utilization=<the
overlapped int8 arm at 10 Mbit/s> overlap_ratio_2mbit=<overlap / plain time
at 2 Mbit/s> slow_link_ratio=<overlap at 10 Mbit/s / overlap unshaped>
fragments_utilization=<overlap + 4 fragments at 10 Mbit/s>
fragments_ratio_2mbit=<overlap + 4 fragments / plain time at 2 Mbit/s>
fragments_slow_link_ratio=<overlap + 4 fragments at 10 Mbit/s / unshaped>.
Processes are stopped by PID, never by name.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SUBNET = "10.77.0"
COORD_IP = f"{SUBNET}.1"
MLP_PARAMS = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10  # trainer.cc's MlpImpl


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted(f"signal {signum}")


def sh(*argv, check=True, timeout=30):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


class Net:
    """The namespaces, bridge, veths and tbf qdiscs; remove() undoes all."""

    def __init__(self, prefix, workers, rate, burst, latency, sysctls=()):
        self.prefix, self.workers, self.sysctls = prefix, workers, list(sysctls)
        self.rate, self.burst, self.latency = rate, burst, latency
        self.sw, self.c = f"{prefix}-sw", f"{prefix}-c"
        self.w = [f"{prefix}-w{i + 1}" for i in range(workers)]
        self.created = []

    def ip_of(self, i):
        return f"{SUBNET}.{11 + i}"

    def _ns(self, name):
        sh("ip", "netns", "add", name)
        self.created.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        for kv in self.sysctls:  # net.ipv4.* sysctls are per namespace
            sh("ip", "netns", "exec", name, "sysctl", "-q", "-w", kv)

    def _shape(self, ns, dev):
        sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
           "burst", self.burst, "latency", self.latency)

    def _attach(self, ns, port, addr, shaped):
        # The bridge end is created in the switch and its peer moved to `ns`
        # as eth0 (names are per namespace).
        sh("ip", "-n", self.sw, "link", "add", "name", port, "type", "veth", "peer", "name",
           "eth0", "netns", ns)
        sh("ip", "-n", self.sw, "link", "set", port, "master", "br0")
        sh("ip", "-n", self.sw, "link", "set", port, "up")
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        if shaped:
            self._shape(ns, "eth0")      # upload
            self._shape(self.sw, port)   # download

    def create(self):
        for ns in [self.sw, self.c] + self.w:
            self._ns(ns)
        sh("ip", "-n", self.sw, "link", "add", "name", "br0", "type", "bridge")
        sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        self._attach(self.c, "c", COORD_IP, shaped=False)
        for i, ns in enumerate(self.w):
            self._attach(ns, f"w{i + 1}", self.ip_of(i), shaped=True)
        self.check()

    def check(self):
        """Every worker opens a TCP connection to the coordinator's namespace
        (ping is not always installed)."""
        listener = subprocess.Popen(
            ["ip", "netns", "exec", self.c, "/usr/bin/python3", "-c",
             "import socket,sys\n"
             "s=socket.socket(); s.settimeout(20); s.bind((sys.argv[1], 29699)); s.listen(8)\n"
             "for _ in range(int(sys.argv[2])): s.accept()[0].close()\n", COORD_IP,
             str(self.workers)], stderr=subprocess.PIPE, text=True)
        try:
            for ns in self.w:
                sh("ip", "netns", "exec", ns, "/usr/bin/python3", "-c",
                   "import socket,sys,time\n"
                   "for _ in range(100):\n"
                   "  try: socket.create_connection((sys.argv[1], 29699), timeout=5).close(); break\n"
                   "  except ConnectionRefusedError: time.sleep(0.1)\n"
                   "else: sys.exit('refused')\n", COORD_IP)
            if listener.wait(timeout=20) != 0:
                raise RuntimeError(f"reachability listener failed: {listener.stderr.read()}")
        finally:
            if listener.poll() is None:
                listener.kill()
                listener.wait()

    def reshape(self, rate):
        """Every worker's link (both directions) at `rate` ("10mbit"), or
        unshaped when None."""
        for i, ns in enumerate(self.w):
            for where, dev in ((ns, "eth0"), (self.sw, f"w{i + 1}")):
                sh("tc", "-n", where, "qdisc", "del", "dev", dev, "root", check=False)
                if rate is not None:
                    sh("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                       "burst", self.burst, "latency", self.latency)

    def remove(self):
        # Deleting a namespace deletes its veth ends (and their peers) and the
        # qdiscs on them.
        for ns in reversed(self.created):
            sh("ip", "netns", "del", ns, check=False)
        self.created = []

    def qdisc_stats(self):
        out = []
        for i, ns in enumerate(self.w):
            r = sh("tc", "-s", "-n", ns, "qdisc", "show", "dev", "eth0", check=False)
            out.append(f"{ns} eth0: " + " ".join(r.stdout.split()))
        return "\n".join(out)


class Procs:
    """Processes started in namespaces; stop() ends them by PID."""

    def __init__(self):
        self.procs = []

    def spawn(self, ns, argv, logpath, env=None):
        f = open(logpath, "w")
        p = subprocess.Popen(["ip", "netns", "exec", ns] + argv, stdout=f,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        f.close()
        self.procs.append(p)
        return p

    def stop(self):
        # `ip netns exec` execs the command, so the PID is the process itself.
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs = []


def run_ddp(args, net, procs, out):
    d = os.path.join(out, "ddp")
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    master = f"{net.ip_of(0)}:29500"
    ranks = []
    for r in range(args.workers):
        ranks.append(procs.spawn(net.w[r], [
            "/usr/bin/python3", os.path.join(HERE, "ddp_mlp.py"), f"--rank={r}",
            f"--world={args.workers}", f"--master={master}", f"--target={args.target}",
            f"--eval_every={args.ddp_eval_every}", f"--cap_seconds={args.cap_seconds}",
            f"--batch_size={args.batch_size}", f"--lr={args.lr}"],
            os.path.join(d, f"rank-{r}.log"), env=env))
    deadline = time.time() + args.cap_seconds + 180  # + start and evaluations
    while time.time() < deadline and any(p.poll() is None for p in ranks):
        time.sleep(1)
    procs.stop()
    text = open(os.path.join(d, "rank-0.log")).read()
    evals = re.findall(r"eval step=(\d+) train_s=([\d.]+) wall_s=([\d.]+) test_accuracy=([\d.]+)",
                       text)
    if not evals:
        return {"available": False, "why": f"no evaluation (logs in {d})"}
    step, train_s, wall_s, acc = evals[-1]
    reached = float(acc) >= args.target and float(train_s) <= args.cap_seconds
    first = next((e for e in evals if float(e[3]) >= args.target), None)
    res = {"available": True, "capped": not reached, "accuracy": float(acc), "steps": int(step),
           "wall": float(wall_s)}
    if reached and first:
        res["seconds"], res["accuracy"], res["steps"] = float(first[1]), float(first[3]), int(first[0])
    else:
        res["seconds"] = args.cap_seconds
    res["s_per_step"] = float(train_s) / max(1, int(step))
    return res


def run_tcp(args, net, procs, out, name="tcp", pace_mbit=0):
    """bench/wan/tcp_exchange.py: the bytes of one fp32 exchange over plain
    TCP on the same links, --tcp_reps times, the slowest rank per repetition;
    each rank's uplink paced at pace_mbit (0 = unpaced)."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    ips = ",".join(net.ip_of(i) for i in range(args.workers))
    start = time.time() + 5
    ranks = [procs.spawn(net.w[r], [
        "/usr/bin/python3", os.path.join(HERE, "tcp_exchange.py"), f"--rank={r}", f"--ips={ips}",
        f"--bytes={MLP_PARAMS * 4}", f"--reps={args.tcp_reps}", f"--start={start}",
        f"--period={args.tcp_period}", f"--schedule={args.tcp_schedule}",
        f"--pace_mbit={pace_mbit}"],
        os.path.join(d, f"rank-{r}.log"))
        for r in range(args.workers)]
    deadline = start + args.tcp_reps * args.tcp_period + 60
    while time.time() < deadline and any(p.poll() is None for p in ranks):
        time.sleep(0.5)
    procs.stop()
    per_rep = {}
    for r in range(args.workers):
        for m in re.finditer(r"rep (\d+) seconds ([\d.]+)", open(os.path.join(d, f"rank-{r}.log")).read()):
            per_rep.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    reps = [max(v) for k, v in sorted(per_rep.items()) if len(v) == args.workers and k > 0]
    if not reps:
        return {"available": False, "why": f"no complete repetition (logs in {d})"}
    return {"available": True, "exchange_s": statistics.median(reps), "exchange_rounds": len(reps)}


def shoal_status(args, net, coord=None):
    """`shoalctl status --json` from the coordinator's namespace (coord, else
    args._coord); None when it does not answer."""
    try:
        r = subprocess.run(["ip", "netns", "exec", net.c, os.path.join(args.bin, "shoalctl"),
                            "status", f"--coordinator={coord or args._coord}", "--json",
                            "--rpc_timeout=5s"],
                           capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return None


def accuracy_of(st):
    for r in reversed(st.get("recent_rounds", [])):
        if r.get("evaluated"):
            return float(r.get("test_accuracy", 0)), int(r.get("round", 0))
    return 0.0, 0


def run_shoal(args, net, procs, out, name, flags, workers=None, local_steps=None, target=None,
              cap=None, worker_flags=(), poll=None):
    workers = workers or args.workers
    poll = poll or args.poll
    local_steps = local_steps or args.shoal_local_steps
    target = target or args.target
    cap = cap or args.cap_seconds
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    clog = os.path.join(d, "coordinator.log")
    coord = procs.spawn(net.c, [
        os.path.join(args.bin, "shoal-coordinator"), f"--listen={COORD_IP}:0",
        f"--min_participants={workers}", f"--local_steps={local_steps}",
        f"--batch_size={args.batch_size}", f"--learning_rate={args.lr}", "--eval_every=1",
        "--round_timeout=300s", "--seed=1"] + args.shoal_flags.split() + flags, clog)
    args._coord = None
    for _ in range(300):
        if coord.poll() is not None:
            break
        m = re.search(r"listening on (%s:\d+)" % re.escape(COORD_IP), open(clog).read())
        if m:
            args._coord = m.group(1)
            break
        time.sleep(0.1)
    if args._coord is None:
        procs.stop()
        return {"available": False, "why": f"coordinator did not start ({clog})"}
    for i in range(workers):
        procs.spawn(net.w[i], [
            os.path.join(args.bin, "shoal-worker"), f"--coordinator={args._coord}",
            f"--listen={net.ip_of(i)}:0", f"--name=w{i + 1}",
            "--exchange_timeout=300s"] + list(worker_flags),
            os.path.join(d, f"worker-{i + 1}.log"))
    res = {"available": True, "capped": False}
    t0, start, last = None, time.time(), None
    while True:
        now = time.time()
        st = shoal_status(args, net)
        if st is not None:
            last = st
            if t0 is None and (st.get("phase") in ("TRAINING", "SHARING") or
                               int(st.get("last_completed_round", 0)) > 0):
                t0 = now  # every worker joined
            acc, rnd = accuracy_of(st)
            if t0 is not None and acc >= target:
                res.update(seconds=now - t0, accuracy=acc, round=rnd)
                break
        if t0 is not None and now - t0 > cap or now - start > cap + 300:
            res.update(capped=True, seconds=cap)
            break
        if any(p.poll() is not None for p in procs.procs):
            res.update(available=False, why=f"a process exited early (logs in {d})")
            break
        # shoalctl loads Torch at start: each poll costs the workers' cores
        # about a third of a second of CPU, so the big arms poll less often.
        time.sleep(poll)
    if last is not None:
        json.dump(last, open(os.path.join(d, "status.json"), "w"), indent=1)
        res.setdefault("accuracy", accuracy_of(last)[0])
        res["rounds"] = int(last.get("last_completed_round", 0))
    procs.stop()
    res.update(exchange_stats(d, workers))
    return res


BIG_RATES = {"unshaped": None, "10": "10mbit", "2": "2mbit"}


BIG_KIND = re.compile(r"^(plain|overlap)?(?:frag(\d+))?$")


def run_big(args, net, procs, out, name):
    """big-{plain,overlap,fragK,overlapfragK}-{unshaped,10,2}: the 21 MB
    model (see the module docstring). With K fragments a round runs
    --big_local_steps / K local steps and evaluates every K rounds, so each
    fragment is synced after as many steps, and evaluated as often per step,
    as the whole model in the arms without fragments."""
    _, kind, rate = name.split("-")
    m = BIG_KIND.match(kind)
    if not m or kind == "":
        raise ValueError(f"unknown big-model arm {name}")
    net.reshape(BIG_RATES[rate])
    flags = args.big_flags.split() + (["--overlap=on"] if m.group(1) == "overlap" else [])
    fragments = int(m.group(2) or 1)
    local_steps = args.big_local_steps
    if fragments > 1:
        local_steps = max(1, args.big_local_steps // fragments)
        flags += [f"--fragments={fragments}",
                  f"--eval_every={args.big_fragment_eval_every or fragments}"]
    flags.append(f"--model=torchscript:{args._big_model}")
    res = run_shoal(args, net, procs, out, name, flags, workers=args.big_workers,
                    local_steps=local_steps, target=args.big_target,
                    cap=args.big_cap_seconds, poll=args.big_poll,
                    worker_flags=["--torch_threads=1", f"--eval_limit={args.big_eval_limit}"])
    res["fragments"] = fragments
    return res


ROUND = re.compile(r"round (\d+): .* train=([\d.]+)s exchange=([\d.]+)s .* wire_in=(\d+)")
STAMP = re.compile(r"^[IWE](\d\d):(\d\d):(\d\d\.\d+) ")


def exchange_stats(d, workers):
    per_round = {}
    utilizations = []
    for i in range(workers):
        p = os.path.join(d, f"worker-{i + 1}.log")
        if not os.path.exists(p):
            continue
        done = {}  # round -> (seconds of the day its line was logged, train seconds)
        for line in open(p):
            m = ROUND.search(line)
            if m:
                per_round.setdefault(int(m.group(1)), []).append(
                    (float(m.group(2)), float(m.group(3)), int(m.group(4))))
                t = STAMP.match(line)
                if t:
                    done[int(m.group(1))] = (int(t.group(1)) * 3600 + int(t.group(2)) * 60 +
                                             float(t.group(3)), float(m.group(2)))
        # Compute utilization: training seconds of rounds 2.. over the wall
        # time from round 1's end to the last round's (round 1 trains before
        # anything can overlap it).
        rs = sorted(done)
        if len(rs) >= 2 and rs[0] == 1:
            wall = (done[rs[-1]][0] - done[1][0]) % 86400
            if wall > 0:
                utilizations.append(sum(done[r][1] for r in rs[1:]) / wall)
    rounds = sorted(r for r, v in per_round.items() if len(v) == workers and r > 1)
    if not rounds:
        return {}
    util = {"utilization": statistics.mean(utilizations)} if utilizations else {}
    return {**util,
        "exchange_s": statistics.median(max(x[1] for x in per_round[r]) for r in rounds),
        "train_s": statistics.median(max(x[0] for x in per_round[r]) for r in rounds),
        "wire_in": statistics.median(statistics.mean(x[2] for x in per_round[r]) for r in rounds),
        "exchange_rounds": len(rounds),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--out", default="/tmp")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--target", type=float, default=0.87)
    ap.add_argument("--cap_seconds", type=float, default=600)
    ap.add_argument("--rate_mbit", type=float, default=20)
    ap.add_argument("--burst", default="32kb")
    ap.add_argument("--latency", default="100ms", help="tbf queue bound (not a delay)")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--shoal_local_steps", type=int, default=250)
    ap.add_argument("--ddp_eval_every", type=int, default=20)
    ap.add_argument("--arms", default="shoal-int8,shoal-fp32,shoal-fp32-paced,ddp,tcp,tcp-paced,"
                    "big-overlap-unshaped,"
                    "big-plain-10,big-overlap-10,big-plain-2,big-overlap-2,"
                    "big-overlapfrag4-unshaped,big-overlapfrag4-10,big-overlapfrag4-2,"
                    "big-frag4-2")
    ap.add_argument("--sysctl", action="append", default=[],
                    help="KEY=VALUE set in every namespace (e.g. "
                         "net.ipv4.tcp_slow_start_after_idle=0); repeatable")
    ap.add_argument("--check_net", action="store_true",
                    help="only create the network, check it and remove it")
    ap.add_argument("--skip_code", type=int, default=2,
                    help="exit code when not root or without ip/tc (77: a skipped ctest)")
    ap.add_argument("--tcp_reps", type=int, default=9)
    ap.add_argument("--tcp_schedule", choices=("all", "ring"), default="all",
                    help="tcp_exchange.py's transfer order (ring: one flow per link each way)")
    ap.add_argument("--pace_mbit", type=float, default=0,
                    help="the uplink rate of the paced arms (tcp-paced, shoal-fp32-paced); "
                         "0 = --rate_mbit, the link's")
    ap.add_argument("--tcp_period", type=float, default=3.0,
                    help="idle between TCP repetitions, about a Shoal round's training")
    ap.add_argument("--int8_flags",
                    default="--codec=int8 --outer_optimizer=nesterov --outer_lr=1.0")
    ap.add_argument("--poll", type=float, default=0.5)
    ap.add_argument("--big_workers", type=int, default=min(2, os.cpu_count() or 1),
                    help="workers of the big-model arms (no more than cores)")
    ap.add_argument("--big_hidden", type=int, default=6700,
                    help="hidden units of the big MLP (6700: 21.3 MB of float32)")
    ap.add_argument("--big_local_steps", type=int, default=300)
    ap.add_argument("--big_target", type=float, default=0.86)
    ap.add_argument("--big_cap_seconds", type=float, default=900)
    ap.add_argument("--big_poll", type=float, default=3.0)
    ap.add_argument("--big_eval_limit", type=int, default=2000,
                    help="test images each worker evaluates the big model on every round "
                         "(all 10000 take seconds of the one core a worker has)")
    ap.add_argument("--big_fragment_eval_every", type=int, default=0,
                    help="evaluate the fragment arms every N rounds (0: every K, as often per "
                         "step as the other arms; 1: every round, a finer time to target at K "
                         "times the evaluation cost)")
    ap.add_argument("--big_flags",
                    default="--codec=int8 --outer_optimizer=nesterov --outer_lr=1.0")
    # Every worker in every round, like DDP: on a loaded machine the adaptive
    # deadline drops whichever worker the scheduler slowed, and the run then
    # measures the CPU contention instead of the links.
    ap.add_argument("--shoal_flags", default="--adaptive_deadline=false --fold_late_work=false")
    args = ap.parse_args()
    if args.pace_mbit <= 0:
        args.pace_mbit = args.rate_mbit

    if os.geteuid() != 0:
        print("wan: needs root (it creates network namespaces, veth pairs and tc qdiscs)",
              file=sys.stderr)
        return args.skip_code
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            print(f"wan: '{tool}' not found (Debian package iproute2)", file=sys.stderr)
            return args.skip_code
    for b in ("shoal-coordinator", "shoal-worker", "shoalctl"):
        if not args.check_net and not os.access(os.path.join(args.bin, b), os.X_OK):
            print(f"wan: no {os.path.join(args.bin, b)}; build it first", file=sys.stderr)
            return 2

    os.makedirs(args.out, exist_ok=True)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    net = Net(f"shoalwan{os.getpid()}", args.workers, f"{args.rate_mbit:g}mbit", args.burst,
              args.latency, args.sysctl)
    procs = Procs()
    results = {}
    arms = {
        "ddp": None,
        "shoal-fp32": [],
        "shoal-int8": args.int8_flags.split(),
    }
    if args.check_net:
        # Smoke check of the setup and teardown alone: build, ping, remove,
        # and verify that no namespace of ours is left.
        try:
            net.create()
            print(f"wan: network up: {net.sw}, {net.c}, {', '.join(net.w)}; "
                  f"every worker reached {COORD_IP}")
        finally:
            net.remove()
        left = [x for x in sh("ip", "netns", "list").stdout.split() if x.startswith(net.prefix)]
        if left:
            print(f"wan: namespaces left behind: {left}", file=sys.stderr)
            return 1
        print("wan: network removed")
        return 0
    try:
        net.create()
        log(f"wan: namespaces {net.sw}, {net.c}, {', '.join(net.w)} up")
        for name in args.arms.split(","):
            log(f"wan: arm {name} ...")
            t = time.time()
            if name == "ddp":
                results[name] = run_ddp(args, net, procs, args.out)
            elif name == "tcp":
                results[name] = run_tcp(args, net, procs, args.out)
            elif name == "tcp-paced":
                results[name] = run_tcp(args, net, procs, args.out, name, args.pace_mbit)
            elif name == "shoal-fp32-paced":
                results[name] = run_shoal(args, net, procs, args.out, name, [],
                                          worker_flags=[f"--uplink_mbps={args.pace_mbit:g}"])
            elif name.startswith("big-"):
                if not hasattr(args, "_big_model"):
                    args._big_model = os.path.join(args.out, "big_mlp.pt")
                    sh("/usr/bin/python3", os.path.join(HERE, "..", "hier", "wide_mlp.py"),
                       args._big_model, f"--hidden={args.big_hidden}",
                       timeout=300)  # loads Torch: slow on a busy machine
                results[name] = run_big(args, net, procs, args.out, name)
            else:
                results[name] = run_shoal(args, net, procs, args.out, name, arms[name])
            log(f"wan: arm {name}: {results[name]} ({time.time() - t:.0f} s)")
        log(net.qdisc_stats())
    except Interrupted as e:
        log(f"wan: interrupted ({e}); cleaning up")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        procs.stop()
        net.remove()

    model_bytes = MLP_PARAMS * 4
    n = args.workers
    bound_s = 2 * (n - 1) / n * model_bytes * 8 / (args.rate_mbit * 1e6)
    print(f"wan: {n} workers, each in its own network namespace behind a veth shaped with tc tbf "
          f"{args.rate_mbit:g} Mbit/s each way (burst {args.burst}, queue bound {args.latency}); "
          f"coordinator unshaped on the same bridge; mlp ({MLP_PARAMS} params, {model_bytes} B "
          f"fp32), batch {args.batch_size}, lr {args.lr}; target test accuracy {args.target} "
          f"(10000 test images); sysctls {args.sysctl or 'kernel defaults'}; cap {args.cap_seconds:.0f} s per arm; Shoal local_steps="
          f"{args.shoal_local_steps} {args.shoal_flags}, int8 arm {args.int8_flags}, eval every round (included); DDP eval every "
          f"{args.ddp_eval_every} steps on rank 0 (excluded); {os.cpu_count()} cores")
    print(f"{'arm':<21} {'time_to_target':>15} {'accuracy':>9} {'rounds/steps':>13} "
          f"{'exchange_s':>11} {'train_s':>8} {'wire_in_B':>10} {'utilization':>12}  note")
    for name in args.arms.split(","):
        r = results[name]
        if name in ("tcp", "tcp-paced"):
            continue
        if not r.get("available"):
            print(f"{name:<21} {'-':>15}  not available: {r.get('why', '')}")
            continue
        big = name.startswith("big-")
        target = args.big_target if big else args.target
        cap = args.big_cap_seconds if big else args.cap_seconds
        note = (f"CAPPED: {target} not reached in {cap:.0f} s (counts as the cap)"
                if r["capped"] else f"reached {target}")
        if name == "ddp":
            note += f"; {r['s_per_step']:.3f} s/step"
        cnt = r.get("steps", r.get("rounds", 0))
        ex = f"{r['exchange_s']:.3f}" if "exchange_s" in r else "-"
        tr = f"{r['train_s']:.2f}" if "train_s" in r else "-"
        wi = f"{r['wire_in']:.0f}" if "wire_in" in r else "-"
        ut = f"{r['utilization']:.3f}" if "utilization" in r else "-"
        print(f"{name:<21} {r['seconds']:>14.1f}s {r.get('accuracy', 0):>9.4f} {cnt:>13} "
              f"{ex:>11} {tr:>8} {wi:>10} {ut:>12}  {note}")
    if any(n.startswith("big-") for n in args.arms.split(",")):
        print(f"big-model arms: {args.big_workers} workers (one torch thread each, "
              f"{os.cpu_count()} cores), TorchScript MLP 784-{args.big_hidden}-10 "
              f"({784 * args.big_hidden + args.big_hidden + args.big_hidden * 10 + 10} params, "
              f"accuracy on the first {args.big_eval_limit} test images, "
              f"{(784 * args.big_hidden + args.big_hidden + args.big_hidden * 10 + 10) * 4 / 1e6:.1f} MB "
              f"fp32), local_steps={args.big_local_steps}, {args.big_flags}, target "
              f"{args.big_target}; utilization = training seconds of rounds 2.. / wall seconds "
              f"from round 1's end to the last (per worker, from its log; the mean)")

    def t(name):
        r = results.get(name)
        return r["seconds"] if r and r.get("available") else None

    def fmt(name):
        v = t(name)
        if v is None:
            return f"{name}=n/a"
        return f"{name}={v:.1f}s" + ("(capped)" if results[name]["capped"] else "")

    over_bound = {}
    for arm, tcp_arm, how in (("shoal-fp32", "tcp", ""),
                              ("shoal-fp32-paced", "tcp-paced",
                               f" paced at {args.pace_mbit:g} Mbit/s per uplink")):
        fp32 = results.get(arm, {})
        if "exchange_s" in fp32:
            over_bound[arm] = f"{fp32['exchange_s'] / bound_s:.3f}"
            print(f"one fp32 exchange{how}: {fp32['exchange_s']:.3f} s (median over "
                  f"{fp32['exchange_rounds']} rounds of the slowest worker), line-rate bound "
                  f"2(N-1)/N x {model_bytes} B / {args.rate_mbit:g} Mbit/s = {bound_s:.3f} s; "
                  f"received per worker {fp32['wire_in']:.0f} B (bound's bytes "
                  f"{2 * (n - 1) / n * model_bytes:.0f} B); exchange/bound={over_bound[arm]}")
        tcp = results.get(tcp_arm, {})
        if tcp.get("available"):
            over_bound[tcp_arm] = f"{tcp['exchange_s'] / bound_s:.3f}"
            print(f"the same bytes over plain TCP sockets{how} on the same links "
                  f"(bench/wan/tcp_exchange.py, median of {tcp['exchange_rounds']}, "
                  f"{args.tcp_period:g} s idle between): {tcp['exchange_s']:.3f} s, "
                  f"tcp/bound={over_bound[tcp_arm]}"
                  + (f", shoal/tcp={fp32['exchange_s'] / tcp['exchange_s']:.3f}"
                     if "exchange_s" in fp32 else ""))
        elif tcp_arm in results:
            print(f"{tcp_arm} reference: not available: {tcp.get('why', '')}")
    ex_ratio = over_bound.get("shoal-fp32", "n/a")
    ddp, int8 = t("ddp"), t("shoal-int8")
    ratio = f"{int8 / ddp:.3f}" if ddp and int8 is not None else "n/a"
    fp32_ratio = f"{t('shoal-fp32') / ddp:.3f}" if ddp and t("shoal-fp32") is not None else "n/a"
    def big_ratio(a, b):
        va, vb = t(a), t(b)
        return f"{va / vb:.3f}" if va is not None and vb else "n/a"

    def util(name):
        r = results.get(name, {})
        return f"{r['utilization']:.3f}" if "utilization" in r else "n/a"

    print(f"wan: {fmt('ddp')} {fmt('shoal-fp32')} {fmt('shoal-int8')} fp32_ratio={fp32_ratio} "
          f"exchange_over_bound={ex_ratio} "
          f"paced_exchange_over_bound={over_bound.get('shoal-fp32-paced', 'n/a')} "
          f"tcp_over_bound={over_bound.get('tcp', 'n/a')} "
          f"paced_tcp_over_bound={over_bound.get('tcp-paced', 'n/a')} ratio={ratio} utilization={util('big-overlap-10')} "
          f"overlap_ratio_2mbit={big_ratio('big-overlap-2', 'big-plain-2')} "
          f"slow_link_ratio={big_ratio('big-overlap-10', 'big-overlap-unshaped')} "
          f"fragments_utilization={util('big-overlapfrag4-10')} "
          f"fragments_ratio_2mbit={big_ratio('big-overlapfrag4-2', 'big-plain-2')} "
          f"fragments_slow_link_ratio="
          f"{big_ratio('big-overlapfrag4-10', 'big-overlapfrag4-unshaped')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
