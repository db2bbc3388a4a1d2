#!/usr/bin/env python3
"""etcd under the coordinator replicas (issue 30): what a replica's calls
cost etcd 3.4, and what two replicas do to a 3-member cluster's memory.

1. Per call: one etcd member; for each kind of call a replica makes
   (bench/etcd/etcd_calls.cc), N calls through Shoal's etcd client, and the
   member's go_memstats_alloc_bytes_total before and after (less the cost of
   a /metrics scrape and of the tool's own connection, measured alike).
2. Replicas: two 3-member clusters side by side for --minutes, both getting
   a 136-byte put every 1.9 s (the soak's round rate) and a 933-byte one
   every 30th; one also serves two shoal-coordinator replicas (no workers:
   a leader and a standby). Per member: RSS after --warmup and at the end,
   allocation per minute, raft proposals per minute; calls per second by
   method (grpc_server_handled_total) against the baseline cluster.

   etcd_bench.py --bin=build/bin [--minutes=20] [--warmup=600] [--n=1000] [--out=DIR]

Last line: `etcd: alloc_per_call_kb=.. replica_calls_per_s=.. proposals_per_min=..
baseline_proposals_per_min=.. rss_growth_max=..% ratio=..` where ratio is the
replica cluster's mean member RSS over the baseline's at the end.
Processes are stopped by PID, also on failure or SIGTERM.
"""
import argparse, base64, json, os, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, time
import urllib.request

PROCS = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_all():
    for p in PROCS:
        if p.poll() is None:
            p.terminate()
    for p in PROCS:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def start_cluster(name, work, size=3):
    ports = [(free_port(), free_port()) for _ in range(size)]
    cluster = ",".join(f"{name}{k}=http://127.0.0.1:{p}" for k, (_, p) in enumerate(ports))
    members = []
    for k, (c, p) in enumerate(ports):
        d = os.path.join(work, f"{name}{k}")
        proc = subprocess.Popen(
            ["etcd", f"--name={name}{k}", f"--data-dir={d}",
             f"--listen-client-urls=http://127.0.0.1:{c}", f"--advertise-client-urls=http://127.0.0.1:{c}",
             f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
             f"--initial-cluster={cluster}", "--initial-cluster-state=new", f"--initial-cluster-token={name}",
             "--heartbeat-interval=200", "--election-timeout=2000", "--log-level=warn",
             # As the soak and deploy/ run it.
             "--auto-compaction-mode=revision", "--auto-compaction-retention=1000", "--snapshot-count=1000"],
            stdout=subprocess.DEVNULL, stderr=open(d + ".log", "w"))
        PROCS.append(proc)
        members.append({"name": f"{name}{k}", "proc": proc, "port": c})
    deadline = time.time() + 60
    for m in members:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{m['port']}/health", timeout=2).read()
                break
            except Exception:
                if time.time() > deadline:
                    raise RuntimeError(f"etcd {m['name']} not healthy after 60 s")
                time.sleep(0.2)
    return members


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {"calls": {}}
    for name in ("go_memstats_alloc_bytes_total", "etcd_server_proposals_committed_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    for m in re.finditer(r'^grpc_server_handled_total\{[^}]*grpc_method="(\w+)"[^}]*\} (\S+)$', text, re.M):
        out["calls"][m.group(1)] = out["calls"].get(m.group(1), 0) + float(m.group(2))
    return out


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def put(port, key, size):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "value": base64.b64encode(os.urandom(size)).decode()}).encode()
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v3/kv/put", data=body),
                           timeout=5).read()


def per_call(args, work):
    (m,) = start_cluster("p", work, size=1)
    tool = os.path.join(args.bin, "shoal-bench-etcd-calls")
    ep = f"127.0.0.1:{m['port']}"

    def alloc():
        return metrics(m["port"])["go_memstats_alloc_bytes_total"]

    def run(kind, n):
        subprocess.run([tool, f"--endpoint={ep}", f"--kind={kind}", f"--n={n}"], check=True,
                       capture_output=True, text=True, timeout=600)

    a0 = alloc(); a1 = alloc()
    scrape = a1 - a0
    rows = []
    for kind in ("get", "get_local", "keepalive", "campaign", "put", "watch"):
        run(kind, 50)
        a0 = alloc(); run(kind, 0); a1 = alloc()
        setup = a1 - a0 - scrape
        a0 = alloc(); t0 = time.time(); run(kind, args.n); secs = time.time() - t0; a1 = alloc()
        kb = (a1 - a0 - scrape - setup) / args.n / 1024
        rows.append((kind, kb, secs / args.n * 1000))
    print(f"per call, one member, {args.n} calls each (allocation by etcd, less the tool's connection):")
    print(f"  {'kind':<10} {'KB/call':>8} {'ms/call':>8}")
    for kind, kb, ms in rows:
        print(f"  {kind:<10} {kb:8.1f} {ms:8.2f}")
    return rows


def replicas(args, work):
    rep = start_cluster("r", work)
    base = start_cluster("b", work)
    eps = ",".join(f"127.0.0.1:{m['port']}" for m in rep)
    for k in range(2):
        port = free_port()
        PROCS.append(subprocess.Popen(
            [os.path.join(args.bin, "shoal-coordinator"), f"--listen=127.0.0.1:{port}",
             f"--advertise=127.0.0.1:{port}", f"--etcd={eps}", "--etcd_prefix=/shoal/bench/",
             "--lease_ttl=3s", "--run_id=bench"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, f"coordinator-{k}.log"), "w")))
    samples = {m["name"]: [] for m in rep + base}
    first = {}
    t0 = time.time(); i = 0; next_sample = 0.0
    while time.time() - t0 < args.minutes * 60:
        for cl in (rep, base):
            put(cl[0]["port"], "/shoal/bench/P record-test", 136)
            if i % 30 == 0:
                put(cl[0]["port"], "/shoal/bench/P rare-test", 933)
        i += 1
        now = time.time() - t0
        if now >= next_sample:
            for m in rep + base:
                mt = metrics(m["port"])
                samples[m["name"]].append((now, rss_kb(m["proc"].pid), mt))
                if now >= args.warmup and m["name"] not in first:
                    first[m["name"]] = len(samples[m["name"]]) - 1
            next_sample = now + 30
        time.sleep(1.9)
    print(f"\nreplicas: two 3-member clusters, {args.minutes:.0f} min, the same puts; 'r' also serves "
          "two coordinator replicas (a leader and a standby). RSS after the "
          f"{args.warmup:.0f} s warm-up (median of 3 samples) and at the end:")
    print(f"  {'member':<7} {'RSS MiB':>15} {'growth':>7} {'alloc MB/min':>13} {'proposals/min':>14}")
    growth = []
    end_rss = {"r": [], "b": []}
    for m in rep + base:
        s = samples[m["name"]]
        f = first.get(m["name"], 0)
        r0 = statistics.median(x[1] for x in s[f:f + 3]) / 1024
        r1 = statistics.median(x[1] for x in s[-3:]) / 1024
        mins = (s[-1][0] - s[0][0]) / 60
        alloc = (s[-1][2]["go_memstats_alloc_bytes_total"] - s[0][2]["go_memstats_alloc_bytes_total"]) / 1e6 / mins
        props = (s[-1][2]["etcd_server_proposals_committed_total"] -
                 s[0][2]["etcd_server_proposals_committed_total"]) / mins
        g = 100 * (r1 - r0) / r0
        growth.append(g)
        end_rss[m["name"][0]].append(r1)
        print(f"  {m['name']:<7} {r0:6.1f} -> {r1:6.1f} {g:+6.1f}% {alloc:13.1f} {props:14.1f}")

    def calls(cl):
        out = {}
        for m in cl:
            s = samples[m["name"]]
            secs = s[-1][0] - s[0][0]
            for k, v in s[-1][2]["calls"].items():
                out[k] = out.get(k, 0) + (v - s[0][2]["calls"].get(k, 0)) / secs
        return out

    rc, bc = calls(rep), calls(base)
    print("  calls per second, all members (replica cluster / baseline):")
    for k in sorted(set(rc) | set(bc)):
        if rc.get(k, 0) + bc.get(k, 0) > 0.01:
            print(f"    {k:<16} {rc.get(k, 0):6.2f} / {bc.get(k, 0):6.2f}")
    props = lambda cl: statistics.mean(
        (samples[m["name"]][-1][2]["etcd_server_proposals_committed_total"] -
         samples[m["name"]][0][2]["etcd_server_proposals_committed_total"]) /
        ((samples[m["name"]][-1][0] - samples[m["name"]][0][0]) / 60) for m in cl)
    return {"replica_calls_per_s": sum(rc.values()) - sum(bc.values()), "proposals": props(rep),
            "baseline_proposals": props(base), "growth": max(growth),
            "ratio": statistics.mean(end_rss["r"]) / statistics.mean(end_rss["b"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=600)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if shutil.which("etcd") is None:
        sys.exit("etcd_bench: etcd is not installed (etcd-server)")
    args.warmup = min(args.warmup, args.minutes * 60 / 2)
    work = tempfile.mkdtemp(prefix="shoal-bench-etcd-", dir=args.out or None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rows = per_call(args, work)
        stop_all(); PROCS.clear()
        r = replicas(args, work)
    finally:
        stop_all()
    print(f"etcd: alloc_per_call_kb={statistics.mean(kb for _, kb, _ in rows):.1f} "
          f"replica_calls_per_s={r['replica_calls_per_s']:.2f} proposals_per_min={r['proposals']:.1f} "
          f"baseline_proposals_per_min={r['baseline_proposals']:.1f} rss_growth_max={r['growth']:.1f}% "
          f"ratio={r['ratio']:.3f}")


if __name__ == "__main__":
    main()
