#!/usr/bin/python3
"""make soak: every feature at once, under a seeded fault schedule (issue 30).

One run for --minutes with everything on:
  - mutual TLS on every channel (scripts/make-certs.sh: a CA and one
    certificate for every address) and a run token; the store has an admin
    token and checks upload grants (--upload_key_file);
  - two coordinator replicas on a 3-member etcd cluster (--etcd);
  - two sites of workers in network namespaces joined by one shaped link
    (tests/support/two_sites.sh --nat), zones site-a / site-b with
    --hierarchy=on and --relay=on, and a worker behind NAT (site A's router
    namespace masquerades; nobody can connect to it);
  - --codec=int8 --outer_optimizer=nesterov;
  - audits by replay (--audit_rate, 0.1 by default; which turns the sample
    ledger on): a failed audit is an ERROR nothing explains, so an honest
    soak must never have one;
  - checkpoints to a shoal-checkpoint store every --checkpoint_every rounds.

Faults, drawn from --seed (one at a time, a quiet gap between them):
  kill_worker / stop_worker      kill -9 (restarted later as a new process:
                                 a late joiner) or SIGSTOP..SIGCONT of a worker
  kill_leader / stop_leader      the leading coordinator replica (a killed
                                 replica restarts on its address)
  kill_supernode / stop_supernode  a zone's elected supernode
  kill_store / stop_store        the checkpoint store (restarted on its data)
  kill_etcd / stop_etcd          one etcd member (restarted on its data)
  blackhole                      iptables DROP of a worker's peer port inside
                                 its namespace, removed after a while
  add_worker / leave             a new worker joins / an added one leaves
                                 (SIGTERM: a graceful leave)
  link_rate                      tc tbf rate of the inter-site link changed
                                 for a while, then restored

Checked continuously (a poll of `shoalctl status --json` every --poll
seconds, in the coordinators' namespace, over TLS with the token):
  hash agreement   every worker that reports the last completed round holds
                   the agreed hash; a round number never changes its hash;
                   no worker is evicted for a hash that differs
  rounds lost      the leader's last completed round never goes back
  stalls           time between two round completions, against a bound:
                   --stall_base, plus the time faults were in effect during
                   the stall, plus the largest allowance (ALLOWANCE below,
                   docs/SOAK.md) of the faults that overlap it
  checkpoints      the latest checkpoint (when it changed, at most every
                   --checkpoint_check seconds, and at the end): its manifest's
                   model hash is the round's agreed hash, and the
                   `shoalctl checkpoints export` file's model bytes hash to it
  growth           RSS, open fds and threads of every process from /proc
                   every --sample seconds; per process instance, the median
                   of its last samples against its first samples after
                   --warmup (RSS: --rss_growth %; fds and threads: at most
                   --fd_growth and --thread_growth more). Reported beside
                   it: etcd's and the store's RSS split into anonymous
                   memory and mapped files, and each etcd member's Go
                   runtime figures from its /metrics (etcd_go.csv)
  errors           every ERROR line of every log (Shoal's, gRPC's, etcd's) is
                   explained by a fault when it falls in a fault's window
                   (from its start to --explain seconds after its end) or
                   within the stop of every process at the end; otherwise it
                   fails the run
  shutdown         at the end every process gets SIGTERM (SIGCONT first) and
                   must exit within --shutdown_grace seconds
  re-joins         no worker re-joins more than --rejoins_per_minute times in
                   any minute (a worker caught in a re-join loop trains
                   nothing while rounds go on without it)

Ends with one line
  soak: minutes=.. rounds=.. faults=kill:..,stop:..,... longest_stall=..s
        hash_mismatches=0 rounds_lost=0 rss_growth_max=..% checkpoints_verified=..
        etcd_heap_held_growth_max=..% result=PASS|FAIL
and a report directory (--out): summary.txt, summary.json, faults.csv,
rounds.csv, samples.csv, etcd_go.csv, errors.txt, soak.png (rounds, stalls, memory over
time), the logs of every process. Every process is stopped by PID, every
namespace (and with it every iptables rule and qdisc) removed, at the end,
on failure and on SIGINT/SIGTERM.
"""
import argparse
import base64
import csv
import hashlib
import io
import json
import os
import pickle
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TWO_SITES = os.path.join(ROOT, "tests", "support", "two_sites.sh")
PYTHON_WORKER = os.path.join(ROOT, "tests", "soak", "python_worker.py")
# Where the Python workers run (--python_workers): one per site, so each
# zone has one; a worker restarted in its namespace is a Python worker again.
PYTHON_NS = ("a3", "b3")
MAKE_CERTS = os.path.join(ROOT, "scripts", "make-certs.sh")
ETCD = "/usr/bin/etcd"

COORD_IP = "10.78.0.1"
COORD_PORTS = (50051, 50052)
STORE_PORT = 50060
ETCD_PORTS = ((2379, 2380), (2479, 2480), (2579, 2580))
# What an etcd member's /metrics says of its Go runtime, sampled with RSS:
# live heap (in use), heap the collector holds for reuse (idle less released
# to the kernel), the next collection's target, goroutines.
GO_FIGURES = ("go_goroutines", "go_memstats_heap_inuse_bytes", "go_memstats_heap_idle_bytes",
              "go_memstats_heap_released_bytes", "go_memstats_next_gc_bytes")


def go_heap_held_mb(go):
    """The heap a Go runtime holds from the kernel, in MiB: in use plus idle,
    less what it has released (HeapSys - HeapReleased). RSS counts only the
    pages of it that have been touched: a restarted etcd member holds heap it
    has not touched yet (large allocations still zero), and its RSS climbs
    toward this figure as they are reused, while this figure stays flat."""
    return (go["go_memstats_heap_inuse_bytes"] + go["go_memstats_heap_idle_bytes"] -
            go["go_memstats_heap_released_bytes"]) / 2**20


# WorkerStatus.state of a worker no longer in the run (common/worker_state.h).
DEPARTED = ("left", "lost", "finished", "evicted")
PEER_PORT = 7000  # + the instance's generation in its namespace
SITE_IP = {"a": "10.78.0.1%d", "b": "10.78.0.2%d"}
NAT_NS, NAT_IP = "n1", "192.168.78.2"
LINK_RATE = "20mbit"

# Seconds a fault of each kind may add to a stall on top of the time it is
# in effect (docs/SOAK.md explains each): what the protocol needs to notice
# it and recover, with the flags this harness gives the coordinator
# (--round_timeout=60s, --connection_timeout=10s, --max_connection_retry=3,
# --heartbeat_lease=10s, --lease_ttl=3s).
ALLOWANCE = {
    "kill_worker": 60,      # session breaks at once; a re-plan, maybe a barrier retry
    "stop_worker": 90,      # its round waits for its deadline (round_timeout) or lease
    "kill_leader": 90,      # lease_ttl, the standby's campaign, re-joins, the round reopened
    "stop_leader": 90,
    "kill_supernode": 100,  # members' relayed sessions move; heartbeat lease + round_timeout
    "stop_supernode": 100,
    "kill_store": 30,       # rounds do not wait for checkpoints
    "stop_store": 30,
    "kill_etcd": 30,        # two of three members keep quorum; an etcd election
    "stop_etcd": 30,
    "blackhole": 100,       # probes time out: connection_timeout x retries, round_timeout
    "add_worker": 60,       # admission and catch-up
    "leave": 30,
    "nat_toggle": 60,       # a leave, or a join and catch-up
    "link_rate": 30,
}
KIND_GROUP = {k: k.split("_")[0] for k in ALLOWANCE}
KIND_GROUP.update({"blackhole": "blackhole", "add_worker": "add", "leave": "leave",
                   "link_rate": "rate", "nat_toggle": "nat"})
WEIGHTS = {
    "kill_worker": 3, "stop_worker": 3, "kill_leader": 2, "stop_leader": 1,
    "kill_supernode": 2, "stop_supernode": 1, "kill_store": 1, "stop_store": 1,
    "kill_etcd": 1, "stop_etcd": 1, "blackhole": 2, "add_worker": 2, "leave": 1,
    "link_rate": 2, "nat_toggle": 2,
}


def log(msg):
    print(time.strftime("%H:%M:%S ") + msg, file=sys.stderr, flush=True)


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted(f"signal {signum}")


def sh(argv, timeout=60, check=True):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return r


class Proc:
    """One process instance in a namespace. `ip netns exec` execs the
    command, so the PID is the process itself; signals go to that PID."""

    def __init__(self, role, name, ns, argv, logpath):
        self.role, self.name, self.ns, self.argv, self.logpath = role, name, ns, argv, logpath
        f = open(logpath, "a")
        self.popen = subprocess.Popen(["ip", "netns", "exec", ns] + argv, stdout=f,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        f.close()
        self.pid = self.popen.pid
        self.started = time.time()
        self.stopped = False  # SIGSTOPped by a fault
        self.ended = None
        self.exit_code = None
        self.end_reason = ""

    def alive(self):
        if self.popen.poll() is None:
            return True
        if self.ended is None:
            self.ended = time.time()
            self.exit_code = self.popen.returncode
        return False

    def signal(self, sig):
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def log_text(self):
        try:
            with open(self.logpath, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.prefix = f"shoalsoak{os.getpid() % 100000}"
        self.out = args.out
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="shoal-soak-")
        self.procs = []          # every instance ever started
        self.gen = {}            # namespace -> instances started in it
        self.net_up = False
        self.blackholes = []     # (ns, port) rules in place
        self.rate = LINK_RATE
        # Checks and records.
        self.faults = []         # dicts: kind, target, start, end, detail
        self.active = None       # the fault in effect, if any
        self.round_hash = {}     # round -> agreed hash
        self.round_seen_at = {}  # round -> time first seen completed
        self.max_round = 0
        self.last_progress = None  # time of the last round completion
        self.stalls = []         # (start, end, bound, faults)
        self.hash_mismatches = []
        self.rounds_lost = 0
        self.lost_events = []
        self.evicted_seen = set()
        self.samples = []        # (t, instance name, role, rss_kb, fds, threads)
        self.go_samples = []     # (t, etcd instance name, {Go runtime figure: value})
        self.rss_parts = []      # (t, instance name, RssAnon kB, RssFile kB)
        self.status_log = []     # (t, last_completed_round, members, leader)
        self.checkpoints_verified = 0
        self.checkpoint_failures = []
        self.last_checkpoint_checked = ("", 0.0)
        self.failures = []
        self.shutdown = []       # (name, seconds or None, exit code)
        self.last_status = None
        self.start = None
        self.t_end_faults = None
        self.etcd_text = ""      # record sizes and raft index at the end

    # ---- setup -------------------------------------------------------
    def secrets_and_certs(self):
        d = os.path.join(self.work, "pki")
        names = ["127.0.0.1", COORD_IP, "10.78.0.50", NAT_IP]
        names += [SITE_IP[s] % i for s in "ab" for i in range(1, 5)]
        sh(["bash", MAKE_CERTS, d] + names)
        self.tls = [f"--tls_cert={d}/shoal.pem", f"--tls_key={d}/shoal.key",
                    f"--tls_ca={d}/ca.pem"]
        for name in ("run", "admin", "upload"):
            p = os.path.join(self.work, f"{name}.token")
            with open(p, "w") as f:
                f.write(secrets.token_hex(24) + "\n")
            os.chmod(p, 0o600)
        self.token = f"--token_file={self.work}/run.token"

    def spawn(self, role, ns_short, argv, name=None):
        ns = f"{self.prefix}-{ns_short}"
        n = self.gen.get(ns_short, 0) + 1
        self.gen[ns_short] = n
        name = name or f"{ns_short}.{n}"
        # Every instance its own name: a restarted replica is c0+1, c0+2, ...
        used = sum(1 for q in self.procs if q.name == name or q.name.startswith(name + "+"))
        if used:
            name = f"{name}+{used}"
        p = Proc(role, name, ns, argv, os.path.join(self.logs, f"{role}-{name}.log"))
        self.procs.append(p)
        return p

    def etcd_endpoints(self):
        return ",".join(f"127.0.0.1:{c}" for c, _ in ETCD_PORTS)

    def start_etcd(self, i):
        cluster = ",".join(f"e{k}=http://127.0.0.1:{p}" for k, (_, p) in enumerate(ETCD_PORTS))
        c, p = ETCD_PORTS[i]
        data = os.path.join(self.work, f"etcd-{i}")
        return self.spawn("etcd", "c", [
            # Go's collector keeps the member's heap under this (etcd 3.4 on
            # Go 1.19): its memory has a configured bound, checked below.
            "env", f"GOMEMLIMIT={self.args.etcd_memlimit_mb}MiB",
            ETCD, f"--name=e{i}", f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{c}",
            f"--advertise-client-urls=http://127.0.0.1:{c}",
            f"--listen-peer-urls=http://127.0.0.1:{p}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
            f"--initial-cluster={cluster}", "--initial-cluster-state=new",
            "--initial-cluster-token=shoal-soak", "--heartbeat-interval=200",
            "--election-timeout=2000", "--log-level=warn",
            # As deploy/ runs it: the record is rewritten every round, and
            # without compaction etcd keeps every revision.
            "--auto-compaction-mode=revision", "--auto-compaction-retention=1000",
            # etcd's in-memory raft log is about snapshot-count + 5000
            # entries (one a round): the default 100000 grows for days.
            "--snapshot-count=1000"], name=f"e{i}")

    def etcd_healthy(self):
        r = subprocess.run(["ip", "netns", "exec", f"{self.prefix}-c", "env", "ETCDCTL_API=3",
                            "etcdctl", "--dial-timeout=2s", "--command-timeout=3s",
                            f"--endpoints={self.etcd_endpoints()}", "put", "/soak/probe", "ok"],
                           capture_output=True, text=True, timeout=20)
        return r.returncode == 0

    def etcdctl(self, argv):
        return subprocess.run(["ip", "netns", "exec", f"{self.prefix}-c", "env", "ETCDCTL_API=3",
                               "etcdctl", "--dial-timeout=2s", "--command-timeout=5s",
                               f"--endpoints={self.etcd_endpoints()}"] + argv,
                              capture_output=True, timeout=30)

    def fill_etcd_window(self):
        """etcd 3.4 keeps its last snapshot-count + 5,000 raft entries in
        memory: a bounded window, but at one record write a round it takes
        this run about an hour to fill, so its fill would read as growth
        after the warm-up. Before anything else starts, write --etcd_window
        entries of about the run's average one (256 bytes) to a scratch
        key and delete it: the window is full from the start, and what grows
        after the warm-up is growth. (A member restarted by a fault comes back
        with only the entries since its last snapshot and refills from the
        run; it is not filled again, see end_fault.) 0 skips it."""
        n = self.args.etcd_window
        if n <= 0:
            return None
        script = (
            "import base64, json, os, sys, time, urllib.request\n"
            "url = sys.argv[1]; n = int(sys.argv[2])\n"
            "key = base64.b64encode(b'/soak/window').decode()\n"
            "def call(path, body):\n"
            "    for attempt in range(20):\n"
            "        try:\n"
            "            urllib.request.urlopen(urllib.request.Request(url + path, data=body),\n"
            "                                   timeout=10).read()\n"
            "            return\n"
            "        except OSError:\n"
            "            time.sleep(0.5)\n"
            "    sys.exit('etcd did not take the scratch write: ' + url)\n"
            "for i in range(n):\n"
            "    v = base64.b64encode(os.urandom(256)).decode()\n"
            "    call('/v3/kv/put', json.dumps({'key': key, 'value': v}).encode())\n"
            "call('/v3/kv/deleterange', json.dumps({'key': key}).encode())\n")
        argv = ["ip", "netns", "exec", f"{self.prefix}-c", "/usr/bin/python3", "-c", script,
                f"http://127.0.0.1:{ETCD_PORTS[0][0]}", str(n)]
        t0 = time.time()
        subprocess.run(argv, check=True, timeout=600)
        log(f"soak: etcd's raft log window filled ({n} entries of 256 bytes, "
            f"{time.time() - t0:.0f}s)")
        return None

    def etcd_figures(self):
        """What the run writes to etcd every round, and how far its raft log
        went (the report's etcd line): the record's two keys, in bytes."""
        try:
            sizes = []
            for key in ("/shoal/soak/record", "/shoal/soak/record-rare"):
                r = self.etcdctl(["get", "--print-value-only", key])
                sizes.append(f"{key.rsplit('/', 1)[1]} {max(len(r.stdout) - 1, 0)} B"
                             if r.returncode == 0 else f"{key}: {r.stderr.decode()[:80]}")
            r = self.etcdctl(["endpoint", "status", "-w", "json"])
            members = json.loads(r.stdout or b"[]") if r.returncode == 0 else []
            raft = ", ".join(f"{m['Endpoint'].split(':')[-1]}: raft index "
                             f"{m['Status'].get('raftIndex', m['Status'].get('raft_index', '?'))}, db "
                             f"{m['Status'].get('dbSize', 0) / 1e6:.1f} MB" for m in members)
            return "etcd: " + ", ".join(sizes) + (f"; {raft}" if raft else "")
        except (subprocess.SubprocessError, ValueError, KeyError) as e:
            return f"etcd: figures not read ({e})"

    def coordinator_flags(self):
        a = self.args
        return [f"--etcd={self.etcd_endpoints()}", "--etcd_prefix=/shoal/soak/",
                "--lease_ttl=3s", "--run_id=soak", f"--seed={a.seed}",
                f"--min_participants={a.min_participants}", f"--local_steps={a.local_steps}",
                "--eval_every=10", "--round_timeout=60s", "--connection_timeout=10s",
                "--max_connection_retry=3", "--heartbeat_lease=10s",
                "--codec=int8", "--outer_optimizer=nesterov", "--hierarchy=on", "--relay=on",
                f"--checkpoint_store={COORD_IP}:{STORE_PORT}",
                f"--checkpoint_every={a.checkpoint_every}",
                f"--audit_rate={a.audit_rate}",
                f"--upload_key_file={self.work}/upload.token", self.token] + self.tls

    def start_coordinator(self, i):
        addr = f"{COORD_IP}:{COORD_PORTS[i]}"
        return self.spawn("coordinator", "c", [
            os.path.join(self.args.bin, "shoal-coordinator"), f"--listen={addr}",
            f"--advertise={addr}"] + self.coordinator_flags(), name=f"c{i}")

    def start_store(self):
        return self.spawn("store", "c", [
            os.path.join(self.args.bin, "shoal-checkpoint"), f"--listen={COORD_IP}:{STORE_PORT}",
            f"--data_dir={self.work}/store", self.token, f"--retain={self.args.retain}",
            f"--admin_token_file={self.work}/admin.token",
            f"--upload_key_file={self.work}/upload.token"] + self.tls, name="store")

    def coordinators(self):
        return ",".join(f"{COORD_IP}:{p}" for p in COORD_PORTS)

    def start_worker(self, ns_short):
        n = self.gen.get(ns_short, 0) + 1
        port = PEER_PORT + n
        if ns_short == NAT_NS:
            ip, zone = NAT_IP, "site-a"
        else:
            ip, zone = SITE_IP[ns_short[0]] % int(ns_short[1:]), f"site-{ns_short[0]}"
        flags = [f"--coordinator={self.coordinators()}", f"--listen={ip}:{port}",
                 f"--zone={zone}", f"--data_dir={self.args.data_dir}", "--eval_limit=500",
                 f"--name={ns_short}.{n}", self.token] + self.tls
        if ns_short in PYTHON_NS[:self.args.python_workers]:
            # Debian's interpreter (python3-torch) and the build's module.
            return self.spawn("worker", ns_short, [
                "env", f"PYTHONPATH={self.args.pythonpath}", "PYTHONUNBUFFERED=1",
                "/usr/bin/python3", PYTHON_WORKER] + flags)
        return self.spawn("worker", ns_short,
                          [os.path.join(self.args.bin, "shoal-worker")] + flags)

    def is_python(self, p):
        return p.role == "worker" and PYTHON_WORKER in p.argv

    def wait_listening(self, p, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if "listening on" in p.log_text():
                return
            if not p.alive():
                raise RuntimeError(f"{what} exited at start: {p.logpath}")
            time.sleep(0.2)
        raise RuntimeError(f"{what} not listening after {timeout}s: {p.logpath}")

    def setup(self):
        self.secrets_and_certs()
        sh(["bash", TWO_SITES, "up", self.prefix, "--per_site=4", f"--rate={LINK_RATE}", "--nat"])
        self.net_up = True
        self.etcd = [self.start_etcd(i) for i in range(3)]
        deadline = time.time() + 120
        while not self.etcd_healthy():
            if time.time() > deadline:
                raise RuntimeError("etcd cluster not healthy after 120 s (logs in %s)" % self.logs)
            time.sleep(1)
        self.fill_etcd_window()
        self.store = self.start_store()
        self.wait_listening(self.store, "store")
        self.coord = [self.start_coordinator(i) for i in range(2)]
        for i, c in enumerate(self.coord):
            self.wait_listening(c, f"coordinator {i}")
        for ns in ("a1", "a2", "a3", "b1", "b2", "b3", NAT_NS):
            self.start_worker(ns)

    # ---- observation --------------------------------------------------
    def shoalctl(self, argv, timeout=30):
        return subprocess.run(["ip", "netns", "exec", f"{self.prefix}-c",
                               os.path.join(self.args.bin, "shoalctl")] + argv + self.tls +
                              [self.token], capture_output=True, text=True, timeout=timeout)

    def status(self):
        try:
            r = self.shoalctl(["status", "--json", "--rpc_timeout=5s",
                               f"--coordinator={self.coordinators()}"], timeout=40)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError:
            return None

    def live_workers(self):
        return [p for p in self.procs if p.role == "worker" and p.alive() and not p.end_reason]

    def worker_by_address(self, address):
        for p in self.procs:
            if p.role == "worker" and any(a == f"--listen={address}" for a in p.argv):
                return p
        return None

    def observe(self, st, now):
        if st.get("replica_role", "leader") not in ("leader", ""):
            return  # a standby's view (no leader answered): no round decisions in it
        done = int(st.get("last_completed_round", 0))
        self.status_log.append((now, done, int(st.get("members", 0)), st.get("leader", "")))
        self.last_status = st
        agreed = st.get("model_hash", "")
        # Every worker that reports the last completed round holds its hash.
        for w in st.get("workers", []):
            if w.get("state") in DEPARTED:
                reason = w.get("reason", "")
                key = (w.get("id"), reason)
                if key not in self.evicted_seen:
                    self.evicted_seen.add(key)
                    if "hash" in reason.lower():
                        self.hash_mismatches.append((now, w.get("id"), reason))
                continue
            if done and int(w.get("model_round", 0)) == done and w.get("model_hash") != agreed:
                self.hash_mismatches.append(
                    (now, w.get("id"), f"round {done}: {w.get('model_hash')} != {agreed}"))
        # A round keeps its hash forever.
        for r in st.get("recent_rounds", []):
            rnd, h = int(r.get("round", 0)), r.get("model_hash", "")
            if not rnd or not h:
                continue
            if rnd in self.round_hash and self.round_hash[rnd] != h:
                self.hash_mismatches.append(
                    (now, "-", f"round {rnd} changed its hash {self.round_hash[rnd]} -> {h}"))
                self.round_hash[rnd] = h
            self.round_hash.setdefault(rnd, h)
            self.round_seen_at.setdefault(rnd, now)
        # Rounds never go back; a completion ends a stall.
        if done < self.max_round:
            if not self.lost_events or self.lost_events[-1][1] != done:
                self.rounds_lost += self.max_round - done
                self.lost_events.append((now, done, self.max_round))
                log(f"soak: ROUNDS LOST: last completed round went back {self.max_round} -> {done}")
        elif done > self.max_round:
            if self.last_progress is not None and self.max_round > 0:
                self.close_stall(self.last_progress, now)
            self.max_round = done
            self.last_progress = now

    def faults_between(self, a, b):
        """Faults whose effect (from their start to their end plus their
        kind's allowance) overlaps [a, b]."""
        out = []
        for f in self.faults:
            end = f["end"] if f["end"] is not None else b
            if f["start"] <= b and end + ALLOWANCE[f["kind"]] >= a:
                out.append(f)
        return out

    def stall_bound(self, a, b):
        """--stall_base, plus the time faults were in effect during the stall,
        plus the largest allowance of the faults that overlap it (faults come
        one at a time: their recoveries do not add up)."""
        bound = self.args.stall_base
        allowance = 0
        for f in self.faults_between(a, b):
            end = f["end"] if f["end"] is not None else b
            bound += max(0.0, min(end, b) - max(f["start"], a))
            allowance = max(allowance, ALLOWANCE[f["kind"]])
        return bound + allowance

    def close_stall(self, a, b):
        fs = self.faults_between(a, b)
        self.stalls.append((a, b, self.stall_bound(a, b), [f["id"] for f in fs]))

    def sample(self, now):
        for p in self.procs:
            if not p.alive():
                continue
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    text = f.read()
                rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1))
                anon = int(re.search(r"RssAnon:\s+(\d+)", text).group(1))
                file_ = int(re.search(r"RssFile:\s+(\d+)", text).group(1))
                threads = int(re.search(r"Threads:\s+(\d+)", text).group(1))
                fds = len(os.listdir(f"/proc/{p.pid}/fd"))
            except (OSError, AttributeError):
                continue
            self.samples.append((now, p.name, p.role, rss, fds, threads))
            # Anonymous memory (heaps, stacks) apart from mapped files (the
            # binary, and etcd's database, which bbolt maps in).
            self.rss_parts.append((now, p.name, anon, file_))
            if p.role == "etcd" and not p.stopped:
                go = self.etcd_go(p)
                if go is not None:
                    self.go_samples.append((now, p.name, go))

    def etcd_go(self, p):
        """An etcd member's Go runtime figures from its /metrics (GO_FIGURES),
        or None when it does not answer: what of its RSS is live heap, what
        the collector keeps for reuse, and its goroutines (one or more per
        open stream: a leak of streams shows there first)."""
        m = re.search(r"--listen-client-urls=http://127\.0\.0\.1:(\d+)", " ".join(p.argv))
        if m is None:
            return None
        try:
            r = subprocess.run(["ip", "netns", "exec", p.ns, "curl", "-s", "-m", "3",
                                f"http://127.0.0.1:{m.group(1)}/metrics"],
                               capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return None
        out = {}
        for name in GO_FIGURES:
            v = re.search(rf"^{name} (\S+)$", r.stdout, re.M)
            if v is None:
                return None
            out[name] = float(v.group(1))
        return out

    # ---- checkpoints --------------------------------------------------
    def verify_checkpoint(self, st, now, final=False):
        cid = st.get("checkpoint_id", "")
        if not cid:
            return
        last_id, last_t = self.last_checkpoint_checked
        if not final and (cid == last_id or now - last_t < self.args.checkpoint_check):
            return
        self.last_checkpoint_checked = (cid, now)
        rnd = int(st.get("checkpoint_round", 0))
        expect = self.round_hash.get(rnd)
        store = f"--store={COORD_IP}:{STORE_PORT}"
        try:
            show = self.shoalctl(["checkpoints", "show", "--json", f"--id={cid}", store])
        except subprocess.TimeoutExpired:
            show = None
        if show is None or show.returncode != 0:
            # The store may be down by a fault; the next check tries again.
            if self.active is None or "store" not in self.active["kind"]:
                self.checkpoint_failures.append((now, cid, "show failed: " + (
                    show.stderr.strip()[-300:] if show else "timeout")))
            self.last_checkpoint_checked = ("", now)
            return
        manifest = json.loads(show.stdout)
        recorded = manifest.get("model_sha256", "")
        path = os.path.join(self.work, "export.pt")
        try:
            exp = self.shoalctl(["checkpoints", "export", f"--id={cid}", f"--out={path}", store],
                                timeout=120)
        except subprocess.TimeoutExpired:
            exp = None
        if exp is None or exp.returncode != 0:
            if self.active is None or "store" not in self.active["kind"]:
                self.checkpoint_failures.append((now, cid, "export failed: " + (
                    exp.stderr.strip()[-300:] if exp else "timeout")))
            self.last_checkpoint_checked = ("", now)
            return
        try:
            exported = export_model_sha256(path)
        except Exception as e:  # a malformed export is a finding, not a crash
            self.checkpoint_failures.append((now, cid, f"export unreadable: {e}"))
            return
        finally:
            if os.path.exists(path):
                os.remove(path)
        problems = []
        if exported != recorded:
            problems.append(f"export hashes to {exported}, manifest says {recorded}")
        if expect is not None and recorded != expect:
            problems.append(f"manifest hash {recorded} != round {rnd}'s agreed {expect}")
        if problems:
            self.checkpoint_failures.append((now, cid, "; ".join(problems)))
            log(f"soak: CHECKPOINT {cid}: {'; '.join(problems)}")
        else:
            self.checkpoints_verified += 1
            log(f"soak: checkpoint {cid} (round {rnd}) verified: export hashes to "
                f"{recorded[:12]}..{'' if expect else ' (round older than the status shows)'}")

    # ---- faults -------------------------------------------------------
    def pick_fault(self):
        kinds = [k for k in WEIGHTS if not self.args.kinds or k in self.args.kinds.split(",")]
        live = self.live_workers()
        st = self.last_status or {}
        possible = []
        for k in kinds:
            if k in ("kill_worker", "stop_worker", "blackhole") and len(live) <= self.args.min_participants:
                continue
            if k == "add_worker" and len(live) >= self.args.max_workers:
                continue
            if k == "leave" and not [p for p in live if self.is_added(p)]:
                continue
            if k == "nat_toggle" and len(live) <= self.args.min_participants:
                continue
            if k in ("kill_supernode", "stop_supernode") and not self.supernodes(st):
                continue
            if k in ("kill_leader", "stop_leader") and self.leader_proc(st) is None:
                continue
            possible.append(k)
        if not possible:
            return None
        weights = [WEIGHTS[k] for k in possible]
        return self.rng.choices(possible, weights)[0]

    def is_added(self, p):
        return p.role == "worker" and (p.ns.endswith("-a4") or p.ns.endswith("-b4") or
                                       not p.name.endswith(".1"))

    def supernodes(self, st):
        out = []
        for z in st.get("zones", []):
            sid = z.get("supernode")
            if not sid:
                continue
            for w in st.get("workers", []):
                if w.get("id") == sid and w.get("state") not in DEPARTED:
                    p = self.worker_by_address(w.get("address", ""))
                    if p is not None and p.alive() and not p.stopped:
                        out.append((z.get("path", ""), sid, p))
        return out

    def leader_proc(self, st):
        leader = st.get("leader", "")
        for i, port in enumerate(COORD_PORTS):
            if leader == f"{COORD_IP}:{port}" and self.coord[i].alive():
                return self.coord[i]
        return None

    def begin_fault(self, now):
        kind = self.pick_fault()
        if kind is None:  # --kinds leaves nothing possible now
            return
        r = self.rng
        f = {"id": len(self.faults) + 1, "kind": kind, "start": now, "end": None, "target": "",
             "detail": "", "undo_at": None, "undo": None, "proc": None}
        st = self.last_status or {}
        hold = r.uniform(*self.args.hold)
        if kind in ("kill_worker", "stop_worker", "blackhole"):
            # Nobody connects to the worker behind NAT: no port to blackhole.
            targets = [q for q in self.live_workers()
                       if kind != "blackhole" or not q.ns.endswith("-" + NAT_NS)]
            # --python_weight: how much likelier a Python worker is the target.
            p = r.choices(targets, [self.args.python_weight if self.is_python(q) else 1
                                    for q in targets])[0]
            f["target"] = p.name
            f["proc"] = p
            if kind == "kill_worker":
                p.signal(signal.SIGKILL)
                p.end_reason = "killed by the soak"
                ns = p.ns[len(self.prefix) + 1:]
                f["undo"] = ("restart_worker", ns)
                f["undo_at"] = now + r.uniform(5, 20)
            elif kind == "stop_worker":
                self.stop(p, f, now + hold)
            else:
                port = int(re.search(r"--listen=[\d.]+:(\d+)", " ".join(p.argv)).group(1))
                sh(["ip", "netns", "exec", p.ns, "iptables", "-A", "INPUT", "-p", "tcp",
                    "--dport", str(port), "-j", "DROP"])
                self.blackholes.append((p.ns, port))
                f["detail"] = f"port {port} dropped"
                f["undo"] = ("unblackhole", (p.ns, port))
                f["undo_at"] = now + hold
        elif kind in ("kill_leader", "stop_leader"):
            p = self.leader_proc(st)
            f["target"] = p.name
            f["proc"] = p
            if kind == "kill_leader":
                p.signal(signal.SIGKILL)
                p.end_reason = "killed by the soak"
                f["undo"] = ("restart_coordinator", self.coord.index(p))
                f["undo_at"] = now + r.uniform(5, 15)
            else:
                self.stop(p, f, now + min(hold, 20))
        elif kind in ("kill_supernode", "stop_supernode"):
            zone, sid, p = r.choice(self.supernodes(st))
            f["target"] = f"{p.name} ({sid}, {zone})"
            f["proc"] = p
            if kind == "kill_supernode":
                p.signal(signal.SIGKILL)
                p.end_reason = "killed by the soak"
                f["undo"] = ("restart_worker", p.ns[len(self.prefix) + 1:])
                f["undo_at"] = now + r.uniform(5, 20)
            else:
                self.stop(p, f, now + hold)
        elif kind in ("kill_store", "stop_store"):
            p = self.store
            f["target"] = p.name
            if kind == "kill_store":
                p.signal(signal.SIGKILL)
                p.end_reason = "killed by the soak"
                f["undo"] = ("restart_store", None)
                f["undo_at"] = now + r.uniform(5, 20)
            else:
                self.stop(p, f, now + hold)
        elif kind in ("kill_etcd", "stop_etcd"):
            i = r.randrange(3)
            p = self.etcd[i]
            f["target"] = p.name
            if kind == "kill_etcd":
                p.signal(signal.SIGKILL)
                p.end_reason = "killed by the soak"
                f["undo"] = ("restart_etcd", i)
                f["undo_at"] = now + r.uniform(5, 20)
            else:
                self.stop(p, f, now + hold)
        elif kind == "add_worker":
            ns = r.choice(["a4", "b4", "a1", "b1", "a2", "b2"])
            p = self.start_worker(ns)
            f["target"] = p.name
            f["undo_at"] = now  # nothing to undo: it stays
        elif kind == "leave":
            p = r.choice([q for q in self.live_workers() if self.is_added(q)])
            f["target"] = p.name
            p.signal(signal.SIGTERM)
            p.end_reason = "left (SIGTERM by the soak)"
            f["undo_at"] = now
        elif kind == "nat_toggle":
            # A round with a participant behind NAT is flat (docs/SUPERNODES.md,
            # "Limits"): the worker behind NAT comes and goes, so that about
            # half the rounds are hierarchical.
            nat = [q for q in self.live_workers() if q.ns.endswith("-" + NAT_NS)]
            if nat:
                p = nat[0]
                p.signal(signal.SIGTERM)
                p.end_reason = "left (SIGTERM by the soak)"
                f["detail"] = "left"
            else:
                p = self.start_worker(NAT_NS)
                f["detail"] = "joined"
            f["target"] = p.name
            f["undo_at"] = now
        elif kind == "link_rate":
            rate = r.choice(["2mbit", "5mbit", "10mbit", "50mbit", "100mbit"])
            self.set_rate(rate)
            f["target"] = "inter-site link"
            f["detail"] = f"{LINK_RATE} -> {rate}"
            f["undo"] = ("rate", LINK_RATE)
            f["undo_at"] = now + max(hold, 30)
        self.faults.append(f)
        self.active = f
        log(f"soak: fault {f['id']} {kind} {f['target']} {f['detail']}".rstrip())

    def exited(self, p, now):
        """A process exited by itself. Expected after a fault aimed at it (a
        worker stopped or cut off past its lease is evicted and leaves);
        otherwise a finding. A worker is replaced either way, so the run
        keeps its size."""
        cause = None
        for f in self.faults:
            end = f["end"] if f["end"] is not None else now
            if f.get("proc") is p and now <= end + ALLOWANCE[f["kind"]]:
                cause = f
        tail = " | ".join(p.log_text().strip().splitlines()[-2:])[-300:]
        if cause is not None:
            p.end_reason = f"exited (code {p.exit_code}) after fault {cause['id']} {cause['kind']}"
            log(f"soak: {p.role} {p.name} {p.end_reason}: {tail}")
        else:
            p.end_reason = f"exited by itself with code {p.exit_code}"
            self.failures.append(f"{p.role} {p.name} exited by itself (code {p.exit_code}): "
                                 f"{tail} ({p.logpath})")
            log(f"soak: {p.role} {p.name} EXITED with code {p.exit_code}: {tail}")
        if p.role == "worker":
            q = self.start_worker(p.ns[len(self.prefix) + 1:])
            log(f"soak: {q.name} replaces {p.name}")

    def stop(self, p, f, until):
        p.signal(signal.SIGSTOP)
        p.stopped = True
        f["undo"] = ("cont", p)
        f["undo_at"] = until
        f["detail"] = "SIGSTOP"

    def set_rate(self, rate):
        for s in ("A", "B"):
            sh(["tc", "-n", f"{self.prefix}-{s}", "qdisc", "change", "dev", "wan", "root", "tbf",
                "rate", rate, "burst", "32kb", "latency", "200ms"])
        self.rate = rate

    def end_fault(self, f, now):
        undo = f.get("undo")
        if undo is not None:
            what, arg = undo
            if what == "cont":
                arg.signal(signal.SIGCONT)
                arg.stopped = False
            elif what == "restart_worker":
                p = self.start_worker(arg)
                f["detail"] = f"restarted as {p.name}"
            elif what == "restart_coordinator":
                self.coord[arg] = self.start_coordinator(arg)
                f["detail"] = f"restarted as {self.coord[arg].name}"
            elif what == "restart_store":
                self.store = self.start_store()
            elif what == "restart_etcd":
                # Not filled again: a fill's burst raised the live members' RSS
                # (+12-17 % in a 4-minute soak with two refills), more than
                # the restarted member's window costs.
                self.etcd[arg] = self.start_etcd(arg)
            elif what == "unblackhole":
                ns, port = arg
                sh(["ip", "netns", "exec", ns, "iptables", "-D", "INPUT", "-p", "tcp", "--dport",
                    str(port), "-j", "DROP"], check=False)
                self.blackholes.remove(arg)
            elif what == "rate":
                self.set_rate(arg)
        f["end"] = now
        self.active = None
        log(f"soak: fault {f['id']} {f['kind']} over after {now - f['start']:.0f}s "
            f"{f['detail']}".rstrip())

    # ---- main loop ----------------------------------------------------
    def run(self):
        a = self.args
        self.setup()
        log(f"soak: cluster up (namespaces {self.prefix}-*, logs in {self.logs}); waiting for "
            "round 1")
        deadline = time.time() + 600
        while self.max_round < 1:
            st = self.status()
            if st is not None:
                self.observe(st, time.time())
            if time.time() > deadline:
                raise RuntimeError("no round completed in 10 minutes")
            time.sleep(a.poll)
        self.start = time.time()
        end = self.start + a.minutes * 60
        log(f"soak: round {self.max_round} done; {a.minutes} minutes of faults from seed {a.seed}")
        next_fault = self.start + a.quiet_start
        next_sample = 0
        while True:
            now = time.time()
            if now >= end:
                break
            st = self.status()
            if st is not None:
                self.observe(st, now)
                self.verify_checkpoint(st, now)
            if now >= next_sample:
                self.sample(now)
                next_sample = now + a.sample
            f = self.active
            if f is not None and f["undo_at"] is not None and now >= f["undo_at"]:
                self.end_fault(f, now)
                next_fault = now + self.rng.uniform(*a.gap)
            elif f is None and now >= next_fault and now < end - a.gap[0]:
                self.begin_fault(now)
            for p in list(self.procs):
                if not p.end_reason and not p.alive():
                    self.exited(p, now)
            time.sleep(a.poll)
        if self.active is not None:
            self.end_fault(self.active, time.time())
        # Let the run show it recovered from the last fault, then the final
        # checks.
        settle = time.time() + a.settle
        last_end = self.faults[-1]["end"] if self.faults else 0
        while time.time() < settle:
            st = self.status()
            if st is not None:
                self.observe(st, time.time())
                if self.last_progress is not None and self.last_progress > last_end:
                    break
            time.sleep(a.poll)
        st = self.status()
        if st is not None:
            self.observe(st, time.time())
            self.sample(time.time())
            self.verify_checkpoint(st, time.time(), final=True)
        self.t_end_faults = time.time()
        self.etcd_text = self.etcd_figures()
        if self.last_progress is not None:
            self.close_stall(self.last_progress, self.t_end_faults)

    # ---- teardown -----------------------------------------------------
    def stop_all(self):
        t0 = time.time()
        order = {"worker": 0, "coordinator": 1, "store": 2, "etcd": 3}
        live = [p for p in self.procs if p.alive()]
        for p in live:
            if p.stopped:
                p.signal(signal.SIGCONT)
                p.stopped = False
        for group in sorted(set(order.values())):
            batch = [p for p in live if order.get(p.role, 9) == group]
            t = time.time()
            for p in batch:
                p.signal(signal.SIGTERM)
            for p in batch:
                left = self.args.shutdown_grace - (time.time() - t)
                try:
                    p.popen.wait(timeout=max(0.1, left))
                    self.shutdown.append((p.name, time.time() - t, p.popen.returncode))
                except subprocess.TimeoutExpired:
                    self.shutdown.append((p.name, None, None))
                    os.kill(p.pid, signal.SIGKILL)
                    p.popen.wait()
                p.end_reason = p.end_reason or "stopped at the end"
        self.stop_ended = time.time()
        self.stop_started = t0

    def cleanup(self):
        # Anything still running (an exception before stop_all): by PID.
        for p in self.procs:
            if p.popen.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
        for ns, port in list(self.blackholes):
            subprocess.run(["ip", "netns", "exec", ns, "iptables", "-D", "INPUT", "-p", "tcp",
                            "--dport", str(port), "-j", "DROP"], capture_output=True)
        self.blackholes = []
        if self.net_up:
            # Deleting the namespaces removes their veths, qdiscs and iptables rules.
            subprocess.run(["bash", TWO_SITES, "down", self.prefix], capture_output=True,
                           timeout=120)
            self.net_up = False
        shutil.rmtree(self.work, ignore_errors=True)


# ---- the export's model bytes, without importing torch ------------------

class _Storage:
    def __init__(self, key, dtype):
        self.key, self.dtype = key, dtype


class _Tensor:
    def __init__(self, storage, offset, size):
        self.storage, self.offset, self.size = storage, offset, size


def _rebuild_tensor(storage, offset, size, stride, *rest):
    return _Tensor(storage, offset, size)


class _ExportUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "torch._utils" and name.startswith("_rebuild_tensor"):
            return _rebuild_tensor
        if module == "collections" and name == "OrderedDict":
            import collections
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return name
        if module == "torch.jit._pickle" and name == "restore_type_tag":
            # LibTorch's pickler tags a typed dict: (dict, "Dict[str, Tensor]").
            return lambda obj, type_str: obj
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in the export")

    def persistent_load(self, pid):
        # ('storage', storage_type, key, location, numel[, view_metadata])
        return _Storage(pid[2], pid[1])


def export_model_sha256(path):
    """SHA-256 over the raw bytes of the exported tensors, in the file's
    order: what the run hashes as its model (the flat float32 vector). Reads
    `shoalctl checkpoints export`'s file (LibTorch's pickle_save: torch's
    legacy format, a sequence of pickles then each storage's bytes; the zip
    format too) without importing Torch."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            root = pkl[: -len("data.pkl")]
            state = _ExportUnpickler(io.BytesIO(z.read(pkl))).load()
            storages = {t.storage.key: z.read(f"{root}data/{t.storage.key}")
                        for t in state.values() if isinstance(t, _Tensor)}
    else:
        with open(path, "rb") as f:
            for _ in range(3):  # magic number, protocol version, sys info
                pickle.Unpickler(f).load()
            state = _ExportUnpickler(f).load()
            keys = pickle.Unpickler(f).load()
            storages = {}
            for key in keys:
                numel = int.from_bytes(f.read(8), "little")
                storages[key] = f.read(numel * 4)  # float32 storages only
    h = hashlib.sha256()
    for name, t in state.items():
        if not isinstance(t, _Tensor):
            continue
        count = 1
        for d in t.size:
            count *= d
        h.update(storages[t.storage.key][t.offset * 4:(t.offset + count) * 4])
    return h.hexdigest()


# ---- analysis and report ---------------------------------------------------

LINE_TIME = [
    # Shoal: E12:34:56.789 [tag] file:line] message
    (re.compile(r"^E(\d\d):(\d\d):(\d\d)\.(\d+) "), "hms"),
    # gRPC / glog: E0612 12:34:56.789012 pid file:line] message
    (re.compile(r"^E\d{4} (\d\d):(\d\d):(\d\d)\.(\d+) "), "hms"),
]
ETCD_ERROR = re.compile(r'"level":"(error|fatal|panic)".*?"ts":"([^"]+)"')


def etcd_time(ts, default):
    """etcd's "ts" (2025-06-12T15:01:02.123Z or ...+02:00) as epoch seconds."""
    m = re.match(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.\d+)?(Z|[+-]\d\d:?\d\d)?", ts)
    if not m:
        return default
    import calendar
    t = calendar.timegm(tuple(int(m.group(i)) for i in range(1, 7)) + (0, 0, 0))
    z = m.group(7)
    if z and z != "Z":
        sign = 1 if z[0] == "+" else -1
        digits = z[1:].replace(":", "")
        t -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    elif not z:
        t = time.mktime(tuple(int(m.group(i)) for i in range(1, 7)) + (0, 0, -1))
    return t


def error_lines(p, day_start):
    """(time, line) of every ERROR line in a process's log."""
    out = []
    for line in p.log_text().splitlines():
        t = None
        for rx, _ in LINE_TIME:
            m = rx.match(line)
            if m:
                h, mi, s = int(m.group(1)), int(m.group(2)), int(m.group(3))
                t = day_start + h * 3600 + mi * 60 + s
                # A line after midnight of the start day.
                if t < p.started - 3600:
                    t += 86400
                break
        if t is None and p.role == "etcd":
            m = ETCD_ERROR.search(line)
            if m:
                t = etcd_time(m.group(2), p.started)
        if t is not None:
            out.append((t, line))
    return out


def analyze(soak):
    a = soak.args
    res = {}
    now = time.time()
    lt = time.localtime(soak.procs[0].started)
    day_start = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))
    # Errors.
    unexplained, explained = [], 0
    for p in soak.procs:
        for t, line in error_lines(p, day_start):
            why = None
            for f in soak.faults:
                end = f["end"] if f["end"] is not None else now
                if f["start"] - 5 <= t <= end + a.explain:
                    why = f"fault {f['id']} {f['kind']}"
                    break
            if why is None and getattr(soak, "stop_started", None) and t >= soak.stop_started - 2:
                why = "the stop at the end"
            if why is None and p.ended is not None and p.end_reason.startswith("killed") and t >= p.ended - 5:
                why = "its own kill"
            if why is None:
                unexplained.append((t, p.name, line))
            else:
                explained += 1
    # How many plans were hierarchical (none while the worker behind NAT
    # takes part) and how many relayed routes changed.
    plans = hier = 0
    for p in soak.procs:
        if p.role != "coordinator":
            continue
        for line in p.log_text().splitlines():
            if " plan attempt " in line:
                plans += 1
                hier += "hierarchical" in line
    res["plans"], res["plans_hierarchical"] = plans, hier
    res["errors_explained"] = explained
    res["errors_unexplained"] = unexplained
    # Growth per process instance, after the warm-up.
    by = {}
    for t, name, role, rss, fds, thr in soak.samples:
        by.setdefault(name, []).append((t, rss, fds, thr))
    growth = {}
    for name, rows in by.items():
        p = next(q for q in soak.procs if q.name == name)
        after = [r for r in rows if r[0] >= p.started + a.warmup]
        if len(after) < 6:
            continue
        base = after[:3]
        last = after[-3:]
        def med(rows, i):
            return statistics.median(r[i] for r in rows)
        rss0, rss1 = med(base, 1), med(last, 1)
        growth[name] = {
            "role": p.role, "samples": len(after),
            "rss_kb": [rss0, rss1], "rss_pct": 100.0 * (rss1 - rss0) / max(rss0, 1),
            "fds": [med(base, 2), med(last, 2)], "threads": [med(base, 3), med(last, 3)],
            "minutes": (after[-1][0] - after[0][0]) / 60,
        }
    parts_by = {}
    for t, name, anon, file_ in soak.rss_parts:
        parts_by.setdefault(name, []).append((t, anon, file_))
    for name, g in growth.items():
        p = next(q for q in soak.procs if q.name == name)
        after = [r for r in parts_by.get(name, []) if r[0] >= p.started + a.warmup]
        if len(after) >= 6:
            g["anon_kb"] = [statistics.median(r[1] for r in after[:3]),
                            statistics.median(r[1] for r in after[-3:])]
            g["file_kb"] = [statistics.median(r[2] for r in after[:3]),
                            statistics.median(r[2] for r in after[-3:])]
    # etcd: the same window's Go runtime figures, to tell live heap from
    # heap the collector keeps.
    go_by = {}
    for t, name, go in soak.go_samples:
        go_by.setdefault(name, []).append((t, go))
    for name, g in growth.items():
        if g["role"] != "etcd":
            continue
        p = next(q for q in soak.procs if q.name == name)
        after = [go for t, go in go_by.get(name, []) if t >= p.started + a.warmup]
        if len(after) < 6:
            continue
        def med_go(rows, key):
            return statistics.median(key(r) for r in rows)
        figures = {
            "heap_held_mb": go_heap_held_mb,
            "heap_inuse_mb": lambda r: r["go_memstats_heap_inuse_bytes"] / 2**20,
            "heap_kept_mb": lambda r: (r["go_memstats_heap_idle_bytes"] -
                                       r["go_memstats_heap_released_bytes"]) / 2**20,
            "next_gc_mb": lambda r: r["go_memstats_next_gc_bytes"] / 2**20,
            "goroutines": lambda r: r["go_goroutines"],
        }
        g["go"] = {k: [med_go(after[:3], f), med_go(after[-3:], f)] for k, f in figures.items()}
        g["go"]["heap_inuse_max_mb"] = max(figures["heap_inuse_mb"](r) for r in after)
        held = g["go"]["heap_held_mb"]
        g["go"]["heap_held_pct"] = 100.0 * (held[1] - held[0]) / max(held[0], 1e-9)
    res["growth"] = growth
    # Re-joins per worker process: the most in any 60 s.
    stamp = re.compile(r"^[IWE](\d\d):(\d\d):(\d\d)\.\d+ .*\] re-joined run ")
    rejoins = {}
    for p in soak.procs:
        if p.role != "worker":
            continue
        times = []
        for line in p.log_text().splitlines():
            m = stamp.match(line)
            if m:
                times.append(int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)))
        most, lo = 0, 0
        for hi in range(len(times)):
            while times[hi] - times[lo] >= 60 or times[hi] < times[lo]:
                lo += 1
            most = max(most, hi - lo + 1)
        rejoins[p.name] = (len(times), most)
    res["rejoins"] = rejoins
    return res


def plot(soak, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (scripts/install-deps.sh --soak): no plot"
    t0 = soak.start or (soak.status_log[0][0] if soak.status_log else time.time())
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    ax = axes[0]
    if soak.status_log:
        ax.plot([(t - t0) / 60 for t, *_ in soak.status_log], [r for _, r, *_ in soak.status_log],
                lw=1, color="tab:blue")
    ax.set_ylabel("last completed round")
    colors = {"kill": "tab:red", "stop": "tab:orange", "blackhole": "tab:purple",
              "add": "tab:green", "leave": "tab:olive", "rate": "tab:cyan", "nat": "tab:brown"}
    for f in soak.faults:
        end = f["end"] or f["start"]
        for a in axes:
            a.axvspan((f["start"] - t0) / 60, (max(end, f["start"] + 1) - t0) / 60, alpha=0.15,
                      color=colors.get(KIND_GROUP[f["kind"]], "grey"), lw=0)
    ax.set_title("rounds; shaded: faults (red kill, orange stop, purple blackhole, green add, "
                 "olive leave, cyan link rate, brown NAT worker leaves/joins)", fontsize=9)
    ax = axes[1]
    if soak.stalls:
        ax.bar([(b - t0) / 60 for a, b, *_ in soak.stalls], [b - a for a, b, *_ in soak.stalls],
               width=0.05, color="tab:blue", label="stall (s)")
        ax.plot([(b - t0) / 60 for a, b, *_ in soak.stalls], [bd for *_, bd, _ in soak.stalls],
                ".", color="tab:red", ms=3, label="its bound (s)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_ylabel("seconds between rounds")
    ax = axes[2]
    by = {}
    for t, name, role, rss, fds, thr in soak.samples:
        by.setdefault((role, name), []).append(((t - t0) / 60, rss / 1024))
    for (role, name), pts in sorted(by.items()):
        ax.plot([x for x, _ in pts], [y for _, y in pts], lw=0.8,
                label=name if role != "worker" else None)
    ax.set_ylabel("RSS (MiB) per process")
    ax.set_xlabel("minutes since the first round")
    if any(role != "worker" for role, _ in by):
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return None


def replot(out):
    """Draws out/soak.png from a finished soak's rounds, stalls, faults and samples CSVs.

    The round line is each round's first sighting (rounds.csv) rather than every status
    read, which is what the run's own plot draws; the rest is the same data."""
    base = 1e9  # the CSVs' times are seconds since the first round; plot() wants a start

    def rows(name):
        with open(os.path.join(out, name), newline="") as f:
            return list(csv.DictReader(f))

    view = types.SimpleNamespace(start=base, status_log=[], stalls=[], faults=[], samples=[])
    try:
        for r in rows("rounds.csv"):
            view.status_log.append((base + float(r["first_seen_s"]), int(r["round"])))
        for r in rows("stalls.csv"):
            a = base + float(r["start_s"])
            view.stalls.append((a, a + float(r["seconds"]), float(r["bound_s"]), r["faults"]))
        for r in rows("faults.csv"):
            a = base + float(r["start_s"])
            view.faults.append({"kind": r["kind"], "start": a, "end": a + float(r["seconds"] or 0)})
        for r in rows("samples.csv"):
            view.samples.append((base + float(r["t_s"]), r["process"], r["role"],
                                 float(r["rss_kb"]), int(r["fds"]), int(r["threads"])))
    except (OSError, KeyError, ValueError) as e:
        print(f"soak: cannot read the report in {out}: {e}", file=sys.stderr)
        return 2
    path = os.path.join(out, "soak.png")
    problem = plot(view, path)
    if problem:
        print(f"soak: {problem}", file=sys.stderr)
        return 2
    print(f"soak: wrote {path}")
    return 0


def etcd_memory(out, warmup=600.0):
    """Prints, from a finished soak's samples.csv and etcd_go.csv, each etcd
    member's growth after its warm-up: RSS, anonymous memory and the heap its
    Go runtime holds (go_heap_held_mb), medians of the first and last three
    samples as the run judges them; a member's start is its first sample.
    Returns {member: (rss %, held %)}, or None when the report cannot be read."""
    def rows(name):
        with open(os.path.join(out, name), newline="") as f:
            return list(csv.DictReader(f))

    try:
        mem, held = {}, {}
        for r in rows("samples.csv"):
            if r["role"] == "etcd":
                mem.setdefault(r["process"], []).append(
                    (float(r["t_s"]), int(r["rss_kb"]) / 1024, int(r["rss_anon_kb"]) / 1024))
        for r in rows("etcd_go.csv"):
            held.setdefault(r["process"], []).append(
                (float(r["t_s"]), go_heap_held_mb({k: float(v) for k, v in r.items()
                                                   if k != "process"})))
    except (OSError, KeyError, ValueError) as e:
        print(f"soak: cannot read the report in {out}: {e}", file=sys.stderr)
        return None
    result = {}
    print(f"etcd members after a {warmup:.0f}s warm-up (medians of the first and last 3 samples):")
    print(f"  {'member':<8} {'RSS MiB':>16} {'':>7}  {'anonymous MiB':>14}  {'Go heap held MiB':>17}")
    for name, v in sorted(mem.items()):
        after = [x for x in v if x[0] >= v[0][0] + warmup]
        h = [x for x in held.get(name, []) if x[0] >= v[0][0] + warmup]
        if len(after) < 6 or len(h) < 6:
            continue
        def med(xs, i):
            return statistics.median(x[i] for x in xs)
        r0, r1 = med(after[:3], 1), med(after[-3:], 1)
        h0, h1 = med(h[:3], 1), med(h[-3:], 1)
        result[name] = (100 * (r1 - r0) / r0, 100 * (h1 - h0) / h0)
        print(f"  {name:<8} {r0:7.1f} -> {r1:5.1f} {result[name][0]:+6.1f}%  "
              f"{med(after[:3], 2):5.1f} -> {med(after[-3:], 2):5.1f}  "
              f"{h0:6.1f} -> {h1:5.1f} {result[name][1]:+6.1f}%")
    return result


def report(soak, res):
    a = soak.args
    out = soak.out
    failures = list(soak.failures)
    rounds = soak.max_round
    minutes = ((soak.t_end_faults or time.time()) - soak.start) / 60 if soak.start else 0.0
    counts = {}
    for f in soak.faults:
        g = KIND_GROUP[f["kind"]]
        counts[g] = counts.get(g, 0) + 1
    fault_text = ",".join(f"{k}:{counts.get(k, 0)}" for k in
                          ("kill", "stop", "blackhole", "add", "leave", "rate", "nat"))
    longest = max((b - a_ for a_, b, *_ in soak.stalls), default=0.0)
    over = [(a_, b, bd, fs) for a_, b, bd, fs in soak.stalls if b - a_ > bd]
    for a_, b, bd, fs in over:
        failures.append(f"stall of {b - a_:.0f}s > bound {bd:.0f}s at +{(a_ - soak.start) / 60:.1f} "
                        f"min (faults {fs or 'none'})")
    if soak.hash_mismatches:
        failures.append(f"{len(soak.hash_mismatches)} hash mismatch(es): {soak.hash_mismatches[:3]}")
    if soak.rounds_lost:
        failures.append(f"{soak.rounds_lost} round(s) lost: {soak.lost_events[:3]}")
    for t, cid, why in soak.checkpoint_failures:
        failures.append(f"checkpoint {cid}: {why}")
    if soak.checkpoints_verified == 0:
        failures.append("no checkpoint verified")
    growth = res["growth"]
    rss_max, rss_who = 0.0, "-"
    for name, g in growth.items():
        if g["rss_pct"] > rss_max:
            rss_max, rss_who = g["rss_pct"], name
        if g["rss_pct"] > a.rss_growth and (g["rss_kb"][1] - g["rss_kb"][0]) / 1024 > a.rss_floor_mb:
            failures.append(f"{name}: RSS grew {g['rss_pct']:.1f}% ({g['rss_kb'][0]:.0f} -> "
                            f"{g['rss_kb'][1]:.0f} kB over {g['minutes']:.1f} min after the warm-up)")
        if g["fds"][1] - g["fds"][0] > a.fd_growth:
            failures.append(f"{name}: open fds {g['fds'][0]:.0f} -> {g['fds'][1]:.0f}")
        if g["threads"][1] - g["threads"][0] > a.thread_growth:
            failures.append(f"{name}: threads {g['threads'][0]:.0f} -> {g['threads'][1]:.0f}")
        # etcd's bound: its anonymous memory (Go's heap, stacks, runtime)
        # under GOMEMLIMIT (with 10 % for what the runtime does not count),
        # and its goroutines flat (a leaked stream shows there first).
        if g["role"] == "etcd" and "anon_kb" in g:
            bound_kb = 1.1 * a.etcd_memlimit_mb * 1024
            if g["anon_kb"][1] > bound_kb:
                failures.append(f"{name}: anonymous memory {g['anon_kb'][1] / 1024:.1f} MiB over "
                                f"its bound {bound_kb / 1024:.1f} MiB (GOMEMLIMIT + 10 %)")
        if g["role"] == "etcd" and "go" in g:
            gr = g["go"]["goroutines"]
            if gr[1] - gr[0] > a.goroutine_growth:
                failures.append(f"{name}: goroutines {gr[0]:.0f} -> {gr[1]:.0f}")
    for name, secs, code in soak.shutdown:
        if secs is None:
            failures.append(f"{name} did not exit within {a.shutdown_grace}s of SIGTERM (killed)")
    for name, (total, most) in sorted(res["rejoins"].items()):
        if most > a.rejoins_per_minute:
            failures.append(f"{name}: {most} re-joins in one minute ({total} in all): a re-join loop")
    if res["errors_unexplained"]:
        failures.append(f"{len(res['errors_unexplained'])} ERROR line(s) no fault explains "
                        f"(errors.txt)")
    if rounds < 2:
        failures.append("fewer than 2 rounds completed")
    # The Python workers: the rounds they trained, each on the run's hash.
    python_rounds = 0
    for p in soak.procs:
        if not soak.is_python(p):
            continue
        for m in re.finditer(r"^round (\d+) hash ([0-9a-f]{64})$", p.log_text(), re.M):
            python_rounds += 1
            rnd, h = int(m.group(1)), m.group(2)
            if rnd in soak.round_hash and not soak.round_hash[rnd].startswith(h[:12]) and \
                    not h.startswith(soak.round_hash[rnd][:12]):
                soak.hash_mismatches.append((p.name, f"round {rnd}: {h} != "
                                                     f"{soak.round_hash[rnd]}"))
    if a.python_workers and python_rounds == 0:
        failures.append(f"the {a.python_workers} Python workers completed no round")
    if soak.hash_mismatches and not any("hash mismatch" in f for f in failures):
        failures.append(f"{len(soak.hash_mismatches)} hash mismatch(es): {soak.hash_mismatches[:3]}")
    result = "PASS" if not failures else "FAIL"
    line = (f"soak: minutes={minutes:.1f} rounds={rounds} faults={fault_text} "
            f"longest_stall={longest:.0f}s hash_mismatches={len(soak.hash_mismatches)} "
            f"rounds_lost={soak.rounds_lost} rss_growth_max={rss_max:.1f}% "
            f"checkpoints_verified={soak.checkpoints_verified} python_rounds={python_rounds} "
            f"result={result}")
    # etcd's members apart: the heap their Go runtime holds, the figure that
    # grows when a Go process does (its RSS also grows as the kernel pages in
    # heap the runtime already held, untouched, at the end of the warm-up).
    held_max, held_who = 0.0, "-"
    for name, g in growth.items():
        if "go" in g and g["go"]["heap_held_pct"] > held_max:
            held_max, held_who = g["go"]["heap_held_pct"], name
    if held_who != "-":
        line = line.replace(" result=", f" etcd_heap_held_growth_max={held_max:.1f}% result=")
    # Files.
    with open(os.path.join(out, "faults.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "kind", "target", "start_s", "seconds", "detail"])
        for x in soak.faults:
            w.writerow([x["id"], x["kind"], x["target"], f"{x['start'] - soak.start:.1f}",
                        f"{(x['end'] or x['start']) - x['start']:.1f}", x["detail"]])
    with open(os.path.join(out, "rounds.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "first_seen_s", "model_hash"])
        for r in sorted(soak.round_hash):
            w.writerow([r, f"{soak.round_seen_at[r] - (soak.start or 0):.1f}", soak.round_hash[r]])
    with open(os.path.join(out, "stalls.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_s", "seconds", "bound_s", "faults"])
        for a_, b, bd, fs in soak.stalls:
            w.writerow([f"{a_ - soak.start:.1f}", f"{b - a_:.1f}", f"{bd:.0f}",
                        " ".join(map(str, fs))])
    with open(os.path.join(out, "samples.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "process", "role", "rss_kb", "fds", "threads", "rss_anon_kb",
                    "rss_file_kb"])
        # rss_parts is appended with samples, one for one.
        for (t, name, role, rss, fds, thr), (_, _, anon, file_) in zip(soak.samples,
                                                                        soak.rss_parts):
            w.writerow([f"{t - (soak.start or t):.1f}", name, role, rss, fds, thr, anon, file_])
    with open(os.path.join(out, "etcd_go.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "process"] + list(GO_FIGURES))
        for t, name, go in soak.go_samples:
            w.writerow([f"{t - (soak.start or t):.1f}", name] + [f"{go[k]:.0f}" for k in GO_FIGURES])
    with open(os.path.join(out, "errors.txt"), "w") as f:
        f.write(f"# {res['errors_explained']} ERROR lines explained by a fault or the final stop; "
                f"{len(res['errors_unexplained'])} not:\n")
        for t, name, text in res["errors_unexplained"]:
            f.write(f"+{(t - (soak.start or t)) / 60:.1f}min {name}: {text}\n")
    note = plot(soak, os.path.join(out, "soak.png"))
    lines = [line, "", f"seed={a.seed} minutes={a.minutes} bin={a.bin}",
             f"workers started={sum(1 for p in soak.procs if p.role == 'worker')} "
             f"coordinator starts={sum(1 for p in soak.procs if p.role == 'coordinator')} "
             f"etcd starts={sum(1 for p in soak.procs if p.role == 'etcd')} "
             f"store starts={sum(1 for p in soak.procs if p.role == 'store')}",
             "faults by kind: " + ", ".join(
                 f"{k}={sum(1 for f in soak.faults if f['kind'] == k)}" for k in WEIGHTS),
             f"longest stall {longest:.0f}s; stalls over their bound: {len(over)}",
             f"rss growth max {rss_max:.1f}% ({rss_who}); per process after the {a.warmup:.0f}s "
             "warm-up:"]
    for name, g in sorted(growth.items()):
        lines.append(f"  {name:<10} {g['role']:<11} rss {g['rss_kb'][0] / 1024:7.1f} -> "
                     f"{g['rss_kb'][1] / 1024:7.1f} MiB ({g['rss_pct']:+.1f}%)  fds "
                     f"{g['fds'][0]:.0f} -> {g['fds'][1]:.0f}  threads {g['threads'][0]:.0f} -> "
                     f"{g['threads'][1]:.0f}  over {g['minutes']:.1f} min")
        if "anon_kb" in g and g["role"] in ("etcd", "store"):
            lines.append(f"  {'':<10} {'':<11} of it anonymous {g['anon_kb'][0] / 1024:.1f} -> "
                         f"{g['anon_kb'][1] / 1024:.1f} MiB, mapped files "
                         f"{g['file_kb'][0] / 1024:.1f} -> {g['file_kb'][1] / 1024:.1f} MiB")
        if "go" in g:
            go = g["go"]
            lines.append(f"  {'':<10} {'':<11} Go: heap held {go['heap_held_mb'][0]:.1f} -> "
                         f"{go['heap_held_mb'][1]:.1f} MiB ({go['heap_held_pct']:+.1f}%)")
            lines.append(f"  {'':<10} {'':<11} Go: heap in use {go['heap_inuse_mb'][0]:.1f} -> "
                         f"{go['heap_inuse_mb'][1]:.1f} MiB (max {go['heap_inuse_max_mb']:.1f}), "
                         f"kept for reuse {go['heap_kept_mb'][0]:.1f} -> {go['heap_kept_mb'][1]:.1f} "
                         f"MiB, next GC {go['next_gc_mb'][0]:.1f} -> {go['next_gc_mb'][1]:.1f} MiB, "
                         f"goroutines {go['goroutines'][0]:.0f} -> {go['goroutines'][1]:.0f}")
    lines.append("shutdown (SIGTERM -> exit): " + ", ".join(
        f"{n}={'%.1fs' % s if s is not None else 'HUNG'}" for n, s, _ in soak.shutdown))
    lines.append(f"round plans: {res.get('plans', 0)}, hierarchical {res.get('plans_hierarchical', 0)} "
                 "(a round with the worker behind NAT is flat)")
    busiest = max(res["rejoins"].items(), key=lambda kv: kv[1][1], default=("-", (0, 0)))
    lines.append(f"re-joins: {sum(t for t, _ in res['rejoins'].values())} in all; most in one "
                 f"minute {busiest[1][1]} ({busiest[0]})")
    if soak.etcd_text:
        lines.append(soak.etcd_text)
    lines.append(f"ERROR lines: {res['errors_explained']} explained, "
                 f"{len(res['errors_unexplained'])} not (errors.txt)")
    if note:
        lines.append(note)
    if failures:
        lines.append("failures:")
        lines += [f"  - {x}" for x in failures]
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"line": line, "result": result, "failures": failures, "rounds": rounds,
                   "faults": soak.faults and [{k: v for k, v in x.items() if k not in ("undo", "proc")}
                                              for x in soak.faults],
                   "longest_stall": longest, "hash_mismatches": soak.hash_mismatches,
                   "rounds_lost": soak.rounds_lost, "growth": growth,
                   "checkpoints_verified": soak.checkpoints_verified,
                   "shutdown": soak.shutdown}, f, indent=1, default=str)
    print("\n".join(lines[1:]), file=sys.stderr)
    print(line, flush=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="", help="the directory of Shoal's binaries (build/bin)")
    ap.add_argument("--replot", default="", metavar="REPORT_DIR",
                    help="only draw REPORT_DIR/soak.png again from a finished soak's CSV files "
                         "(e.g. when matplotlib was missing during the run), and exit")
    ap.add_argument("--etcd_memory", default="", metavar="REPORT_DIR",
                    help="only print each etcd member's growth after the warm-up (--warmup, "
                         "default 600 s) from a finished soak's CSV files: RSS, anonymous memory "
                         "and the heap its Go runtime holds, and exit")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--min_participants", type=int, default=3)
    ap.add_argument("--max_workers", type=int, default=9)
    ap.add_argument("--local_steps", type=int, default=20)
    ap.add_argument("--checkpoint_every", type=int, default=5)
    ap.add_argument("--audit_rate", type=float, default=0.1,
                    help="audits by replay (0 = off); honest workers never fail one")
    ap.add_argument("--retain", type=int, default=20,
                    help="the store keeps this many checkpoints (rounds take seconds: without a "
                         "limit hours of checkpoints fill the disk)")
    ap.add_argument("--poll", type=float, default=2, help="seconds between status reads")
    ap.add_argument("--sample", type=float, default=15, help="seconds between /proc samples")
    ap.add_argument("--kinds", default="",
                    help="draw faults only of these kinds (comma-separated, e.g. kill_etcd); "
                         "default: every kind")
    ap.add_argument("--etcd_memlimit_mb", type=int, default=48,
                    help="GOMEMLIMIT of every etcd member: the Go runtime's soft limit on its "
                         "memory; an etcd member must stay under it plus its mapped files")
    ap.add_argument("--goroutine_growth", type=float, default=64,
                    help="etcd: goroutines may grow at most this many after the warm-up")
    ap.add_argument("--etcd_window", type=int, default=6500,
                    help="scratch entries written to etcd before the run, filling its in-memory "
                         "raft log window (snapshot-count 1000 + 5000) so that the window's fill "
                         "is not read as growth; 0 = none")
    ap.add_argument("--warmup", type=float, default=-1,
                    help="seconds after a process starts before its growth counts (default: "
                         "10 minutes, or a quarter of a shorter soak, at least 1 minute)")
    ap.add_argument("--quiet_start", type=float, default=30,
                    help="seconds after the first round before the first fault")
    ap.add_argument("--gap", type=float, nargs=2, default=(15, 45),
                    help="quiet seconds between two faults (uniform)")
    ap.add_argument("--hold", type=float, nargs=2, default=(5, 30),
                    help="seconds a stop, blackhole or rate change lasts (uniform)")
    ap.add_argument("--stall_base", type=float, default=120,
                    help="longest gap between rounds with no fault (2 x --round_timeout)")
    ap.add_argument("--explain", type=float, default=120,
                    help="an ERROR line up to this long after a fault ended is explained by it")
    ap.add_argument("--checkpoint_check", type=float, default=60)
    ap.add_argument("--settle", type=float, default=180,
                    help="at most this long after the last fault for a round to complete")
    ap.add_argument("--rss_growth", type=float, default=10)
    ap.add_argument("--rss_floor_mb", type=float, default=16,
                    help="RSS growth below this many MiB never fails (small processes: etcd's "
                         "mmapped database, the store's buffers)")
    ap.add_argument("--fd_growth", type=float, default=64)
    ap.add_argument("--thread_growth", type=float, default=32)
    ap.add_argument("--rejoins_per_minute", type=int, default=20,
                    help="most re-joins of one worker in any minute (a loop fails the run)")
    ap.add_argument("--shutdown_grace", type=float, default=30)
    ap.add_argument("--python_workers", type=int, default=2, choices=range(len(PYTHON_NS) + 1),
                    help="Python workers among the first workers (tests/soak/python_worker.py, "
                         "in namespaces " + " and ".join(PYTHON_NS) + ")")
    ap.add_argument("--python_weight", type=float, default=1,
                    help="a kill, stop or blackhole of a worker picks a Python worker this many "
                         "times as often as a shoal-worker (1: any worker alike)")
    ap.add_argument("--pythonpath", default="",
                    help="where `import shoal` is found (default: the python directory beside "
                         "--bin, build/python)")
    args = ap.parse_args()
    if args.replot:
        return replot(args.replot)
    if args.etcd_memory:
        return 0 if etcd_memory(args.etcd_memory, args.warmup if args.warmup >= 0 else 600.0) else 2
    if not args.bin:
        ap.error("--bin is required (the directory of shoal-coordinator, shoal-worker, ...)")
    if args.warmup < 0:
        args.warmup = max(60.0, min(600.0, args.minutes * 60 / 4))
    if not args.out:
        args.out = tempfile.mkdtemp(prefix="shoal-soak-report-")
    os.makedirs(args.out, exist_ok=True)
    if os.geteuid() != 0:
        print("soak: needs root (network namespaces, tc, iptables)", file=sys.stderr)
        return 2
    for tool in ("ip", "tc", "iptables", "etcdctl", "curl"):
        if shutil.which(tool) is None:
            print(f"soak: {tool} not found (scripts/install-deps.sh)", file=sys.stderr)
            return 2
    # The soak runs copies of the binaries: a rebuild of --bin during an
    # hours-long soak (ninja replacing them) must not change what restarted
    # processes run, nor make an exec fail while the linker writes the file.
    snapshot = os.path.join(args.out, "bin")
    os.makedirs(snapshot, exist_ok=True)
    for name in ("shoal-coordinator", "shoal-worker", "shoal-checkpoint", "shoalctl"):
        src = os.path.join(args.bin, name)
        if not os.access(src, os.X_OK):
            print(f"soak: {src} missing (make build)", file=sys.stderr)
            return 2
        shutil.copy2(src, os.path.join(snapshot, name))
    if args.python_workers:
        # The module too: the Python workers restarted late import this copy.
        src = args.pythonpath or os.path.join(os.path.dirname(os.path.abspath(args.bin)), "python")
        if not os.path.isdir(os.path.join(src, "shoal")):
            print(f"soak: {src}/shoal missing (make build), or --python_workers=0",
                  file=sys.stderr)
            return 2
        args.pythonpath = os.path.join(args.out, "python")
        shutil.rmtree(args.pythonpath, ignore_errors=True)
        shutil.copytree(os.path.join(src, "shoal"), os.path.join(args.pythonpath, "shoal"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    args.bin = snapshot
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    soak = Soak(args)
    log(f"soak: report in {args.out}")
    code = 1
    try:
        try:
            soak.run()
        except Interrupted as e:
            soak.failures.append(f"interrupted ({e})")
            log(f"soak: interrupted ({e}); stopping everything")
        except Exception as e:  # the report still gets written
            soak.failures.append(f"harness error: {e!r}")
            log(f"soak: harness error: {e!r}")
            import traceback
            traceback.print_exc()
        # SIGINT during the stop must not leave processes behind: ignore it
        # until cleanup is done.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        soak.stop_all()
        if soak.t_end_faults is None:
            soak.t_end_faults = time.time()
        res = analyze(soak) if soak.procs else {"growth": {}, "errors_explained": 0,
                                                "errors_unexplained": []}
        code = 0 if report(soak, res) == "PASS" else 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        soak.cleanup()
    return code


if __name__ == "__main__":
    sys.exit(main())
