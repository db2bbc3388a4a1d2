#!/usr/bin/python3
"""bench/run.sh hier: flat against hierarchical averaging over two sites
joined by one slow link (issue 12).

Network: tests/support/two_sites.sh (namespaces PREFIX-*, removed at the
end, on failure and on SIGINT/SIGTERM): site A holds the coordinator and
--per_site workers, site B --per_site workers, one L2 segment whose only
path between the sites is a veth pair shaped with `tc tbf` (--rate each
way). Traffic inside a site never crosses it.

Model: a TorchScript MLP of 4.0 MiB of float32 parameters
(bench/hier/wide_mlp.py), so a round's exchange dominates the link.

Arms (--arms, default flat,hier,int8), each one run of --rounds rounds:
  flat  every worker exchanges with every other (the flat sharded round)
  hier  --hierarchy=on, workers --zone=site-a / site-b: each site averages
        inside, the two supernodes exchange the site averages over the link,
        members read the result from their supernode
  int8  hier with --codec=int8 --outer_optimizer=nesterov: the round's
        change travels int8 at every level (issue 25)
Measured per arm, over the rounds after --warmup (round 1 also fetches the
model file and opens connections):
  exchange_s    per round the slowest worker's `exchange=` (worker logs),
                median over rounds
  link_bytes    bytes over the inter-site link (both directions, the
                counters of its site-A end) from the end of round --warmup
                to the end of the last round, per round; it includes the
                control plane of site B's workers and the TCP/IP, HTTP/2 and
                gRPC framing
Last line: hier: ... bytes_ratio=<hier / flat link bytes> ratio=<hier / flat exchange_s>
int8_bytes_ratio=<int8 / flat link bytes> int8_ratio=<int8 / flat exchange_s>.
Processes are stopped by PID, never by name.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "wan"))
from wan import Interrupted, Procs, log, on_signal  # noqa: E402

TWO_SITES = os.path.join(ROOT, "tests", "support", "two_sites.sh")
COORD_IP = "10.78.0.1"
ROUND = re.compile(r"round (\d+): .* train=([\d.]+)s exchange=([\d.]+)s .* wire_in=(\d+)")


def sites(*argv, check=True):
    r = subprocess.run(["bash", TWO_SITES] + list(argv), capture_output=True, text=True,
                       timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError(f"two_sites.sh {' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout.strip()


def status(args, prefix, coord):
    try:
        r = subprocess.run(["ip", "netns", "exec", f"{prefix}-c",
                            os.path.join(args.bin, "shoalctl"), "status",
                            f"--coordinator={coord}", "--json", "--rpc_timeout=5s"],
                           capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return None


def exchange_times(d, names, after):
    per_round = {}
    for name in names:
        p = os.path.join(d, f"worker-{name}.log")
        if not os.path.exists(p):
            continue
        for line in open(p):
            m = ROUND.search(line)
            if m:
                per_round.setdefault(int(m.group(1)), []).append(float(m.group(3)))
    rounds = sorted(r for r, v in per_round.items() if len(v) == len(names) and r > after)
    return [max(per_round[r]) for r in rounds]


def run_arm(args, name, model, procs):
    prefix = f"shoalhier{os.getpid()}"
    d = os.path.join(args.out, name)
    os.makedirs(d, exist_ok=True)
    sites("up", prefix, f"--per_site={args.per_site}", f"--rate={args.rate}")
    try:
        clog = os.path.join(d, "coordinator.log")
        flags = {"flat": [], "hier": ["--hierarchy=on"],
                 "int8": ["--hierarchy=on", "--codec=int8", "--outer_optimizer=nesterov",
                          "--outer_lr=0.7", "--outer_momentum=0.9"]}[name]
        coord_p = procs.spawn(f"{prefix}-c", [
            os.path.join(args.bin, "shoal-coordinator"), f"--listen={COORD_IP}:0",
            f"--model=torchscript:{model}", f"--min_participants={2 * args.per_site}",
            f"--local_steps={args.local_steps}", "--eval_every=1000",
            f"--rounds={args.rounds}", "--round_timeout=300s", "--seed=1",
            "--adaptive_deadline=false", "--fold_late_work=false"] + flags, clog)
        coord = None
        for _ in range(300):
            if coord_p.poll() is not None:
                break
            m = re.search(r"listening on (%s:\d+)" % re.escape(COORD_IP), open(clog).read())
            if m:
                coord = m.group(1)
                break
            time.sleep(0.1)
        if coord is None:
            return {"available": False, "why": f"coordinator did not start ({clog})"}
        names = []
        for site, base in (("a", 10), ("b", 20)):
            for i in range(1, args.per_site + 1):
                names.append(f"{site}{i}")
                procs.spawn(f"{prefix}-{site}{i}", [
                    os.path.join(args.bin, "shoal-worker"), f"--coordinator={coord}",
                    f"--listen=10.78.0.{base + i}:0", f"--name={site}{i}",
                    f"--zone=site-{site}", f"--data_dir={args.data_dir}", "--eval_limit=1000",
                    "--exchange_timeout=300s"], os.path.join(d, f"worker-{site}{i}.log"))
        res = {"available": True}
        start, marks, last = time.time(), {}, None
        while True:
            st = status(args, prefix, coord)
            if st is not None:
                last = st
                done = int(st.get("last_completed_round", 0))
                if done >= args.warmup and "start" not in marks:
                    marks["start"] = (done, int(sites("bytes", prefix)))
                if done >= args.rounds:
                    marks["end"] = (done, int(sites("bytes", prefix)))
                    break
            if time.time() - start > args.cap_seconds:
                res.update(available=False, why=f"capped at {args.cap_seconds} s (logs in {d})")
                break
            if any(p.poll() is not None for p in procs.procs):
                res.update(available=False, why=f"a process exited early (logs in {d})")
                break
            time.sleep(args.poll)
        if last is not None:
            json.dump(last, open(os.path.join(d, "status.json"), "w"), indent=1)
            res["hashes_agree"] = len({w.get("model_hash") for w in last.get("workers", [])
                                       if int(w.get("model_round", 0)) ==
                                       int(last.get("last_completed_round", 0))}) == 1
        procs.stop()
        if "start" in marks and "end" in marks and marks["end"][0] > marks["start"][0]:
            (r0, b0), (r1, b1) = marks["start"], marks["end"]
            res["link_bytes"] = (b1 - b0) / (r1 - r0)
            res["rounds_counted"] = r1 - r0
        times = exchange_times(d, names, args.warmup)
        if times:
            res["exchange_s"] = statistics.median(times)
            res["exchange_rounds"] = len(times)
        return res
    finally:
        procs.stop()
        sites("down", prefix, check=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--out", default="/tmp")
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--per_site", type=int, default=3)
    ap.add_argument("--rate", default="20mbit")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--local_steps", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=1319)
    ap.add_argument("--arms", default="flat,hier,int8")
    ap.add_argument("--cap_seconds", type=float, default=900)
    ap.add_argument("--poll", type=float, default=0.25)
    ap.add_argument("--skip_code", type=int, default=2)
    args = ap.parse_args()

    if os.geteuid() != 0:
        print("hier: needs root (it creates network namespaces, veth pairs and tc qdiscs)",
              file=sys.stderr)
        return args.skip_code
    if subprocess.run(["bash", TWO_SITES, "check"]).returncode != 0:
        print("hier: cannot create network namespaces here (ip netns add failed)",
              file=sys.stderr)
        return args.skip_code
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    os.makedirs(args.out, exist_ok=True)
    model = os.path.join(args.out, "wide_mlp.pt")
    made = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "wide_mlp.py"), model,
                           f"--hidden={args.hidden}"], capture_output=True, text=True)
    if made.returncode != 0:
        print(f"hier: cannot write the model: {made.stderr.strip()}", file=sys.stderr)
        return 2
    log(made.stdout.strip())
    model_bytes = os.path.getsize(model)
    params = 784 * args.hidden + args.hidden + 10 * args.hidden + 10
    procs = Procs()
    results = {}
    try:
        for arm in args.arms.split(","):
            log(f"hier: arm {arm}")
            results[arm] = run_arm(args, arm, model, procs)
            log(f"hier: {arm}: {results[arm]}")
    except Interrupted as e:
        log(f"hier: interrupted ({e})")
        return 1
    finally:
        procs.stop()

    mib = params * 4 / 2**20
    print(f"{2 * args.per_site} workers ({args.per_site} + {args.per_site}), link {args.rate} "
          f"each way, model {params} float32 = {mib:.2f} MiB (file {model_bytes} bytes), "
          f"{args.local_steps} local steps, rounds {args.warmup + 1}..{args.rounds} counted")
    print(f"{'arm':6} {'exchange_s':>10} {'link MiB/round':>15} {'models/round':>13} "
          f"{'hashes':>7}")
    for arm, r in results.items():
        if not r.get("available"):
            print(f"{arm:6} unavailable: {r.get('why')}")
            continue
        lb = r.get("link_bytes")
        print(f"{arm:6} {r.get('exchange_s', float('nan')):10.3f} "
              f"{(lb or float('nan')) / 2**20:15.2f} {(lb or float('nan')) / (params * 4):13.2f} "
              f"{'agree' if r.get('hashes_agree') else 'DIFFER':>7}")
    f, h, q = results.get("flat", {}), results.get("hier", {}), results.get("int8", {})
    line = "hier:"
    for arm, r in (("flat", f), ("hier", h), ("int8", q)):
        if r.get("exchange_s") is not None:
            line += f" {arm}_exchange_s={r['exchange_s']:.3f}"
        if r.get("link_bytes") is not None:
            line += f" {arm}_link_models={r['link_bytes'] / (params * 4):.3f}"
    if f.get("link_bytes") and h.get("link_bytes"):
        line += f" bytes_ratio={h['link_bytes'] / f['link_bytes']:.3f}"
    if f.get("exchange_s") and h.get("exchange_s"):
        line += f" ratio={h['exchange_s'] / f['exchange_s']:.3f}"
    if f.get("link_bytes") and q.get("link_bytes"):
        line += f" int8_bytes_ratio={q['link_bytes'] / f['link_bytes']:.3f}"
    if f.get("exchange_s") and q.get("exchange_s"):
        line += f" int8_ratio={q['exchange_s'] / f['exchange_s']:.3f}"
    print(line)
    bad = [a for a, r in results.items() if not r.get("available") or not r.get("hashes_agree")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
