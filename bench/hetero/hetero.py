#!/usr/bin/python3
"""bench/run.sh hetero: one slow uplink among fast ones (issue 49).

Network: bench/wan/wan.py's (a bridge namespace, the coordinator unshaped,
each worker in its own namespace behind a veth), reshaped per worker with tc
tbf at both ends of its veth: worker 1 at --slow_mbit (10), the others at
--fast_mbit (100) each way.

Model: a TorchScript MLP of --hidden units (bench/hier/wide_mlp.py; 6700:
5,326,510 float32 parameters, 21.3 MB), fp32, --local_steps steps a round
with one torch thread per worker, evaluation only at the end.

Arms, each --rounds rounds with the same flags but:
  equal      --slice_sizing=equal (every owner 1/N of the model)
  bandwidth  --slice_sizing=bandwidth (owners' slices in proportion to their
             measured rate; round 1 is even, nothing is measured yet)
Per round the exchange time is the slowest worker's `exchange=` (its round
line); an arm's figure is the median over its last --measured rounds (the
bandwidth arm's slices have settled by then; round 1 is never counted).

The bandwidth-weighted bound: with slices S_k, member k moves
T + (N-2) S_k bytes each way (its contribution's other slices out, its
slice's contributions in, its average out N-1 times, the others' averages
in), so the exchange takes at least max_k (T + (N-2) S_k) / B_k; the bound
is the least of that over all slices summing to T (bisection; with one slow
member it is about T / B_slow: it owns nothing and still sends its whole
contribution). T from the coordinator's plan line, B from the tbf rates.

Plain TCP: after the arms, tcp_probe.py moves the slow member's bytes of a
bandwidth round (T + (N-2) S_slow) out and in at once, over the same links,
with the kernel's TCP alone: tcp_s=. The bound assumes a link carries its
rate both ways at once; TCP through a tbf queue of --latency does not (the
ACKs of one direction wait behind the other's data), so tcp_ratio=W/tcp_s
says how far Shoal is from what the link gives TCP.

Last line: hetero: ... equal_s=E bandwidth_s=W bound_s=B tcp_s= tcp_ratio=
bound_ratio=W/B slow_share=<the slow member's slice share at the end>
ratio=W/E. Goals (issue 49): ratio <= 0.5, bound_ratio <= 1.2.
Needs root, ip and tc (exit --skip_code without them). Processes are
stopped by PID, never by name.
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
sys.path.insert(0, os.path.join(HERE, "..", "wan"))
import wan  # noqa: E402  (its Net, Procs and helpers)

ROUND = re.compile(r"round (\d+): .* train=([\d.]+)s exchange=([\d.]+)s .* hash=([0-9a-f]+)")
TCP_PORT = 9188  # tcp_probe.py's, inside the bench's namespaces
PLAN = re.compile(r"round \d+ plan attempt \d+: \d+ participants, (\d+) elements")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def shape(net, rates):
    """Worker i's link at rates[i] ("10mbit") each way; None: unshaped."""
    for i, ns in enumerate(net.w):
        for where, dev in ((ns, "eth0"), (net.sw, f"w{i + 1}")):
            wan.sh("tc", "-n", where, "qdisc", "del", "dev", dev, "root", check=False)
            if rates[i] is not None:
                wan.sh("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                       rates[i], "burst", net.burst, "latency", net.latency)


def status(args, net, coord):
    return wan.shoal_status(args, net, coord)


def run_arm(args, net, procs, name, sizing):
    d = os.path.join(args.out, name)
    os.makedirs(d, exist_ok=True)
    clog = os.path.join(d, "coordinator.log")
    coord_proc = procs.spawn(net.c, [
        os.path.join(args.bin, "shoal-coordinator"), f"--listen={wan.COORD_IP}:0",
        f"--min_participants={args.workers}", f"--local_steps={args.local_steps}",
        f"--rounds={args.rounds}", f"--eval_every={args.rounds}", "--round_timeout=900s",
        "--seed=1", "--adaptive_deadline=false", "--fold_late_work=false",
        f"--model=torchscript:{args._model}", f"--slice_sizing={sizing}"], clog)
    coord = None
    for _ in range(600):
        if coord_proc.poll() is not None:
            break
        m = re.search(r"listening on (%s:\d+)" % re.escape(wan.COORD_IP), open(clog).read())
        if m:
            coord = m.group(1)
            break
        time.sleep(0.1)
    if coord is None:
        procs.stop()
        return {"available": False, "why": f"coordinator did not start ({clog})"}
    for i in range(args.workers):
        procs.spawn(net.w[i], [
            os.path.join(args.bin, "shoal-worker"), f"--coordinator={coord}",
            f"--listen={net.ip_of(i)}:0", f"--name=w{i + 1}", "--exchange_timeout=600s",
            "--torch_threads=1", "--eval_limit=500"], os.path.join(d, f"worker-{i + 1}.log"))
    start, last, res = time.time(), None, {"available": True}
    while True:
        st = status(args, net, coord)
        if st is not None:
            last = st
            if st.get("phase") == "FINISHED":
                break
        if time.time() - start > args.cap_seconds:
            res["capped"] = True
            break
        if any(p.poll() is not None for p in procs.procs[1:]) and (
                last is None or last.get("phase") != "FINISHED"):
            time.sleep(2)
            st = status(args, net, coord)
            if st is None or st.get("phase") != "FINISHED":
                res.update(available=False, why=f"a process exited early (logs in {d})")
                break
        time.sleep(args.poll)
    if last is not None:
        json.dump(last, open(os.path.join(d, "status.json"), "w"), indent=1)
        by_name = {w.get("name", ""): w for w in last.get("workers", [])}
        slow = by_name.get("w1", {})
        res["slow_share"] = float(slow.get("slice_share", 0))
        res["slow_rate"] = float(slow.get("exchange_rate_bytes_per_second", 0))
        res["fast_rate"] = statistics.median(
            float(by_name.get(f"w{i + 1}", {}).get("exchange_rate_bytes_per_second", 0))
            for i in range(1, args.workers))
    procs.stop()
    # Per round: the slowest worker's exchange, and whether the hashes agree.
    per_round = {}
    for i in range(args.workers):
        p = os.path.join(d, f"worker-{i + 1}.log")
        if not os.path.exists(p):
            continue
        for line in open(p):
            m = ROUND.search(line)
            if m:
                per_round.setdefault(int(m.group(1)), []).append((float(m.group(3)), m.group(4)))
    rounds = sorted(r for r, v in per_round.items() if len(v) == args.workers and r > 1)
    res["hashes_agree"] = all(len({h for _, h in per_round[r]}) == 1 for r in per_round)
    res["per_round"] = {r: round(max(x[0] for x in per_round[r]), 3) for r in sorted(per_round)}
    measured = rounds[-args.measured:]
    if measured:
        res["exchange_s"] = statistics.median(max(x[0] for x in per_round[r]) for r in measured)
        res["rounds"] = measured
    m = PLAN.search(open(clog).read())
    if m:
        res["elements"] = int(m.group(1))
    return res


def tcp_seconds(args, net, procs, elements, share):
    """Plain TCP (tcp_probe.py) moving the slow member's bytes of a round with
    `share` each way at once: T - S to the other owners and S to each of them
    out, as much in; the time the link allows without Shoal. None if it fails."""
    probe = os.path.join(HERE, "tcp_probe.py")
    for i in range(1, args.workers):
        procs.spawn(net.w[i], ["/usr/bin/python3", probe, "serve", str(TCP_PORT)],
                    os.path.join(args.out, f"tcp_probe_w{i + 1}.log"))
    total = 4 * elements
    own = int(total * share)
    each = (total - own) // (args.workers - 1) + own
    ips = ",".join(net.ip_of(i) for i in range(1, args.workers))
    for _ in range(50):  # the servers listening
        r = subprocess.run(["ip", "netns", "exec", net.w[0], "/usr/bin/python3", probe, "send",
                            ips, str(TCP_PORT), "1", "0"], capture_output=True, text=True,
                           timeout=60)
        if r.returncode == 0:
            break
        time.sleep(0.2)
    r = subprocess.run(["ip", "netns", "exec", net.w[0], "/usr/bin/python3", probe, "send", ips,
                        str(TCP_PORT), str(each), str(each)], capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        log(f"hetero: tcp probe failed: {r.stderr.strip()}")
        return None
    return float(r.stdout.strip())


def bound_seconds(total_bytes, rates_bps):
    """min over slices S (sum T) of max_k (T + (N-2) S_k) / B_k."""
    n = len(rates_bps)
    if n <= 2:
        return total_bytes / min(rates_bps)

    def owned(t):  # the most each member can own and finish within t
        return sum(max(0.0, (t * b - total_bytes) / (n - 2)) for b in rates_bps)

    # Every member moves at least T (its contribution out, the averages
    # in), whatever it owns: no bound is below T / B_min.
    lo, hi = total_bytes / min(rates_bps), 2 * total_bytes / min(rates_bps)
    if owned(lo) >= total_bytes:
        return lo
    for _ in range(200):
        mid = (lo + hi) / 2
        if owned(mid) >= total_bytes:
            hi = mid
        else:
            lo = mid
    return hi


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--out", default="/tmp")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--slow_mbit", type=float, default=10)
    ap.add_argument("--fast_mbit", type=float, default=100)
    ap.add_argument("--hidden", type=int, default=6700, help="6700: 21.3 MB of float32")
    ap.add_argument("--local_steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--measured", type=int, default=3, help="last rounds an arm's figure is of")
    ap.add_argument("--cap_seconds", type=float, default=1500)
    ap.add_argument("--poll", type=float, default=3.0)
    ap.add_argument("--burst", default="32kb")
    ap.add_argument("--latency", default="100ms")
    ap.add_argument("--arms", default="equal,bandwidth")
    ap.add_argument("--skip_code", type=int, default=2,
                    help="exit code when not root or without ip/tc (77: a skipped ctest)")
    ap.add_argument("--expect_shrink", action="store_true",
                    help="the e2e check (tests/e2e/tests.cmake): exit 1 unless the hashes "
                         "agree and the slow member's final slice share in the bandwidth arm "
                         "is below half of 1/N")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("hetero: needs root (network namespaces, veth pairs, tc qdiscs)", file=sys.stderr)
        return args.skip_code
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            print(f"hetero: '{tool}' not found (Debian package iproute2)", file=sys.stderr)
            return args.skip_code
    for b in ("shoal-coordinator", "shoal-worker", "shoalctl"):
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            print(f"hetero: no {os.path.join(args.bin, b)}; build it first", file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, wan.on_signal)
    args._model = os.path.join(args.out, "hetero_mlp.pt")
    wan.sh("/usr/bin/python3", os.path.join(HERE, "..", "hier", "wide_mlp.py"), args._model,
           f"--hidden={args.hidden}", timeout=300)
    # Created at the slow rate everywhere; shape() sets each link's own.
    net = wan.Net(f"shoalhet{os.getpid() % 100000}", args.workers, f"{args.slow_mbit:g}mbit",
                  args.burst, args.latency)
    procs = wan.Procs()
    results = {}
    tcp = None
    try:
        net.create()
        fast = f"{args.fast_mbit:g}mbit" if args.fast_mbit > 0 else None
        shape(net, [f"{args.slow_mbit:g}mbit"] + [fast] * (args.workers - 1))
        for name in args.arms.split(","):
            t = time.time()
            results[name] = run_arm(args, net, procs, name, name)
            log(f"hetero: arm {name}: {results[name]} ({time.time() - t:.0f} s)")
        bw = results.get("bandwidth", {})
        if bw.get("elements") and args.fast_mbit > 0 and not args.expect_shrink:
            tcp = tcp_seconds(args, net, procs, bw["elements"], bw.get("slow_share", 0))
        log(net.qdisc_stats())
    except wan.Interrupted as e:
        log(f"hetero: interrupted ({e}); cleaning up")
        return 130
    finally:
        procs.stop()
        net.remove()
    eq, bw = results.get("equal", {}), results.get("bandwidth", {})
    elements = bw.get("elements") or eq.get("elements") or 0
    total = 4 * elements
    rates = [args.slow_mbit * 1e6 / 8] + [args.fast_mbit * 1e6 / 8] * (args.workers - 1)
    bound = bound_seconds(total, rates) if total and args.fast_mbit > 0 else 0
    print(f"hetero: {args.workers} workers, w1 at {args.slow_mbit:g} Mbit/s, the others at "
          f"{args.fast_mbit:g} Mbit/s each way (tc tbf, network namespaces); a {total / 1e6:.1f} MB "
          f"fp32 model, {args.local_steps} local steps, {args.rounds} rounds per arm; exchange = "
          f"the slowest worker's, median of the last {args.measured} rounds")
    print(f"{'arm':<10} {'exchange_s':>10} {'slow_share':>10} {'hashes':>7}  per round")
    for name, r in results.items():
        print(f"{name:<10} {r.get('exchange_s', float('nan')):>10.2f} "
              f"{r.get('slow_share', 0):>10.4f} {str(r.get('hashes_agree')):>7}  "
              f"{r.get('per_round')}")
    print(f"bound (bandwidth-weighted, min over slices of max_k (T + (N-2) S_k) / B_k): "
          f"{bound:.2f} s; cores {os.cpu_count()}, load {os.getloadavg()}")
    e, w = eq.get("exchange_s"), bw.get("exchange_s")
    ratio = f"{w / e:.3f}" if e and w else "n/a"
    bound_ratio = f"{w / bound:.3f}" if w and bound else "n/a"
    tcp_ratio = f"{w / tcp:.3f}" if w and tcp else "n/a"
    print(f"plain TCP moving the slow member's bytes of a bandwidth round both ways at once "
          f"(tcp_probe.py, same links): {tcp if tcp is None else round(tcp, 2)} s")
    agree = all(r.get("hashes_agree") for r in results.values())
    print(f"hetero: workers={args.workers} slow_mbit={args.slow_mbit:g} "
          f"fast_mbit={args.fast_mbit:g} model_mb={total / 1e6:.1f} "
          f"equal_s={e if e is None else round(e, 2)} bandwidth_s={w if w is None else round(w, 2)} "
          f"bound_s={bound:.2f} slow_share={bw.get('slow_share', 0):.4f} "
          f"tcp_s={tcp if tcp is None else round(tcp, 2)} tcp_ratio={tcp_ratio} "
          f"hashes_agree={str(agree).lower()} bound_ratio={bound_ratio} ratio={ratio}")
    if args.expect_shrink:
        share = bw.get("slow_share", 1)
        if not agree or not bw.get("available") or share >= 0.5 / args.workers:
            print(f"hetero: FAILED: hashes agree {agree}, the slow member's slice share {share} "
                  f"(want < {0.5 / args.workers:.4f}); logs in {args.out}", file=sys.stderr)
            return 1
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
