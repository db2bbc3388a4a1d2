#!/usr/bin/env python3
"""etcd's memory under faults, per Go collector setting (issue 30): does a
setting stop a member's RSS from climbing after its first 10 minutes?

Three-member clusters side by side on 127.0.0.1, one per --variants entry
(its environment: GOGC, GOMEMLIMIT), configured as the soak runs them, each
serving two shoal-coordinator replicas (a leader and a standby, no workers)
and the same puts (a 136-byte record every 1.9 s, a 933-byte one every 30th:
the soak's round rate). Every --fault_every seconds every cluster gets the
same fault, in turn: SIGSTOP of member k for 10 s; kill -9 of member k and a
restart on its data 15 s later; kill -9 of a coordinator and a new one.
Every 30 s, per member: RSS split into anonymous and mapped files (/proc),
and from its /metrics the heap its Go runtime holds (in use + idle -
released), the collector's next target and allocation.

   etcd_gc.py --bin=build/bin [--minutes=42] [--variants=a:GOMEMLIMIT=48MiB,...] [--out=DIR]

Per member instance that lived 10 minutes and six samples more: RSS,
anonymous memory and held heap from its 10-minute mark (medians of the
first three samples) to its end (the last three), as the soak judges them.
Last line, per variant: `etcd_gc: NAME rss_growth_max=..% held_growth_max=..%
held_end_mb=..-.. next_gc_mb=..-..`. rows.json in --out has every sample.
Processes are stopped by PID (SIGCONT first), also on failure or SIGTERM.
"""
import argparse, json, os, re, signal, shutil, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import etcd_bench as eb  # noqa: E402  (free_port, put, PROCS, stop_all)

FIGURES = ("go_memstats_heap_inuse_bytes", "go_memstats_heap_idle_bytes",
           "go_memstats_heap_released_bytes", "go_memstats_next_gc_bytes",
           "go_memstats_alloc_bytes_total")


def parse_variants(text):
    out = {}
    for part in text.split(","):
        name, _, env = part.partition(":")
        out[name] = dict(kv.split("=", 1) for kv in env.split("+") if kv)
    return out


class Cluster:
    def __init__(self, name, env, work, bin_dir):
        self.name, self.env, self.work, self.bin = name, env, work, bin_dir
        self.ports = [(eb.free_port(), eb.free_port()) for _ in range(3)]
        self.members = [self.spawn(k) for k in range(3)]
        self.born = [time.time()] * 3
        self.gen = [0] * 3
        self.coords = []

    def spawn(self, k):
        cluster = ",".join(f"{self.name}{j}=http://127.0.0.1:{p}" for j, (_, p) in enumerate(self.ports))
        c, p = self.ports[k]
        d = os.path.join(self.work, f"{self.name}{k}")
        proc = subprocess.Popen(
            ["etcd", f"--name={self.name}{k}", f"--data-dir={d}",
             f"--listen-client-urls=http://127.0.0.1:{c}", f"--advertise-client-urls=http://127.0.0.1:{c}",
             f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
             f"--initial-cluster={cluster}", "--initial-cluster-state=new",
             f"--initial-cluster-token={self.name}", "--heartbeat-interval=200",
             "--election-timeout=2000", "--log-level=warn",
             # As the soak and deploy/ run it.
             "--auto-compaction-mode=revision", "--auto-compaction-retention=1000", "--snapshot-count=1000"],
            env={**os.environ, **self.env}, stdout=subprocess.DEVNULL, stderr=open(d + ".log", "a"))
        eb.PROCS.append(proc)
        return proc

    def spawn_coordinator(self, k):
        eps = ",".join(f"127.0.0.1:{c}" for c, _ in self.ports)
        port = eb.free_port()
        proc = subprocess.Popen(
            [os.path.join(self.bin, "shoal-coordinator"), f"--listen=127.0.0.1:{port}",
             f"--advertise=127.0.0.1:{port}", f"--etcd={eps}", "--etcd_prefix=/shoal/bench/",
             "--lease_ttl=3s", "--run_id=bench"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.work, f"coordinator-{self.name}{k}.log"), "a"))
        eb.PROCS.append(proc)
        return proc

    def put(self, size):
        for c, _ in self.ports:  # the first member that answers
            try:
                eb.put(c, "/shoal/bench/P record-test", size)
                return
            except OSError:
                continue

    def sample(self, now):
        rows = []
        for k, proc in enumerate(self.members):
            if proc.poll() is not None:
                continue
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    text = f.read()
                anon = int(re.search(r"RssAnon:\s+(\d+)", text).group(1))
                file_ = int(re.search(r"RssFile:\s+(\d+)", text).group(1))
                metrics = eb.urllib.request.urlopen(
                    f"http://127.0.0.1:{self.ports[k][0]}/metrics", timeout=3).read().decode()
                go = {m: float(re.search(rf"^{m} (\S+)$", metrics, re.M).group(1)) for m in FIGURES}
            except (OSError, AttributeError):
                continue  # stopped, or between a kill and its restart
            rows.append({"t": now, "member": f"{self.name}{k}+{self.gen[k]}",
                         "life": time.time() - self.born[k], "anon_kb": anon, "file_kb": file_, **go})
        return rows


def held_mb(row):
    return (row["go_memstats_heap_inuse_bytes"] + row["go_memstats_heap_idle_bytes"] -
            row["go_memstats_heap_released_bytes"]) / 2**20


def run(args, work):
    clusters = [Cluster(n, env, work, args.bin) for n, env in parse_variants(args.variants).items()]
    time.sleep(5)
    for cl in clusters:
        cl.coords = [cl.spawn_coordinator(k) for k in range(2)]
    rows, pending = [], []
    t0 = time.time()
    i, next_sample, next_fault, fault = 0, 0.0, args.fault_every, 0
    while time.time() - t0 < args.minutes * 60:
        now = time.time() - t0
        for cl in clusters:
            cl.put(933 if i % 30 == 0 else 136)
        i += 1
        for due, undo in list(pending):
            if now >= due:
                undo()
                pending.remove((due, undo))
        if now >= next_fault:
            kind, k = ("stop", "kill", "coordinator")[fault % 3], (fault // 3) % 3
            for cl in clusters:
                if kind == "stop":
                    proc = cl.members[k]
                    proc.send_signal(signal.SIGSTOP)
                    pending.append((now + 10, lambda proc=proc: proc.send_signal(signal.SIGCONT)))
                elif kind == "kill":
                    cl.members[k].kill()
                    cl.members[k].wait()

                    def back(cl=cl, k=k):
                        cl.members[k] = cl.spawn(k)
                        cl.born[k] = time.time()
                        cl.gen[k] += 1
                    pending.append((now + 15, back))
                else:
                    j = fault % 2
                    cl.coords[j].kill()
                    cl.coords[j].wait()
                    cl.coords[j] = cl.spawn_coordinator(j)
            fault += 1
            next_fault += args.fault_every
        if now >= next_sample:
            for cl in clusters:
                rows += cl.sample(now)
            next_sample = now + 30
        time.sleep(1.9)
    for cl in clusters:
        for proc in cl.members:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
    return rows


def report(rows, warmup):
    by = {}
    for r in rows:
        by.setdefault(r["member"], []).append(r)
    per_variant = {}
    print(f"per member instance, from its {warmup:.0f} s mark to its end (medians of 3 samples):")
    print(f"  {'member':<7} {'RSS MiB':>22}  {'anonymous MiB':>14}  {'Go heap held MiB':>21}  next GC")
    for name, v in sorted(by.items()):
        after = [r for r in v if r["life"] >= warmup]
        if len(after) < 6:
            continue

        def med(xs, f):
            return statistics.median(f(x) for x in xs)
        rss = lambda r: (r["anon_kb"] + r["file_kb"]) / 1024
        anon = lambda r: r["anon_kb"] / 1024
        r0, r1 = med(after[:3], rss), med(after[-3:], rss)
        h0, h1 = med(after[:3], held_mb), med(after[-3:], held_mb)
        gc = med(after, lambda r: r["go_memstats_next_gc_bytes"] / 2**20)
        per_variant.setdefault(name[0], []).append((100 * (r1 - r0) / r0, 100 * (h1 - h0) / h0, h1, gc))
        print(f"  {name:<7} {r0:6.1f} -> {r1:5.1f} {100 * (r1 - r0) / r0:+6.1f}%  "
              f"{med(after[:3], anon):5.1f} -> {med(after[-3:], anon):5.1f}  "
              f"{h0:5.1f} -> {h1:5.1f} {100 * (h1 - h0) / h0:+6.1f}%  {gc:5.1f}")
    for name, v in per_variant.items():
        print(f"etcd_gc: {name} rss_growth_max={max(x[0] for x in v):.1f}% "
              f"held_growth_max={max(x[1] for x in v):.1f}% "
              f"held_end_mb={min(x[2] for x in v):.1f}-{max(x[2] for x in v):.1f} "
              f"next_gc_mb={min(x[3] for x in v):.1f}-{max(x[3] for x in v):.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--minutes", type=float, default=42)
    ap.add_argument("--warmup", type=float, default=600)
    ap.add_argument("--fault_every", type=float, default=120)
    ap.add_argument("--variants", default="a:GOMEMLIMIT=48MiB,h:GOGC=50+GOMEMLIMIT=48MiB,"
                    "k:GOGC=25+GOMEMLIMIT=48MiB",
                    help="NAME:VAR=VALUE+VAR=VALUE,... one cluster each (NAME: one letter)")
    ap.add_argument("--out", default="")
    ap.add_argument("--report", default="", metavar="ROWS_JSON",
                    help="only print the tables from a finished run's rows.json, and exit")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            report(json.load(f), args.warmup)
        return
    if shutil.which("etcd") is None:
        sys.exit("etcd_gc: etcd is not installed (etcd-server)")
    work = tempfile.mkdtemp(prefix="shoal-bench-etcd-gc-", dir=args.out or None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rows = run(args, work)
    finally:
        eb.stop_all()
    with open(os.path.join(work, "rows.json"), "w") as f:
        json.dump(rows, f)
    print(f"samples: {os.path.join(work, 'rows.json')}")
    report(rows, args.warmup)


if __name__ == "__main__":
    main()
