#!/usr/bin/python3
"""bench/run.sh scale (issue 47): what Shoal costs as the model grows.

For each model size (a wide MLP on Fashion-MNIST, bench/scale/scale_worker.py:
1 M, 10 M, 100 M parameters and the largest size asked for, >= 500 M), one
run of each arm on this machine, all on 127.0.0.1, every process stopped by
PID:
  alone    the same loop without Shoal, one process: its peak RSS
  plain    a coordinator and 3 Python workers (--model=module), --rounds x
           --local_steps: each worker's peak RSS, the loop's utilization
           (seconds in its own steps / wall seconds, from the end of round
           1), the round time (the coordinator's, median of rounds 2..) and
           the exchange (slowest worker per round, from the workers' round
           lines) against its bound: the bytes a worker receives,
           2 (N - 1) / N x the model, at the loopback stream rate measured
           in the same run (shoal-bench-stream's plain TCP arm)
  overlap  the same with --overlap=on: the utilization the loop keeps when
           the round's averaging runs while it trains

With --big the largest size (--big_size, default the last of --sizes; run.sh
gives 500m, which then has only its loop-alone arm besides) runs the issue's
half-billion check: two
workers start, a checkpoint store keeps every other round, a third worker
joins late and pulls the model from the two, the run ends with every hash
equal, and `shoalctl checkpoints export` writes the last checkpoint, which
loads into the Python class (load_state_dict, strict).

Figures: extra_memory = (peak RSS with Shoal - alone) / model bytes, per size
(goal at 100 M: <= 1.25); utilization with and without overlap; round time;
exchange_vs_bound. A plot of model size against memory and round time
(matplotlib, scripts/install-deps.sh --bench). Last line:
  scale: ... extra_memory=X utilization=Y exchange_vs_bound=Z
with X and Z at 100 M and Y the overlapped loop's at 100 M.
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
PY = "/usr/bin/python3"
WORKER = os.path.join(HERE, "scale_worker.py")

# name: (width, depth) of scale_worker.py's MLP.
SIZES = {"1m": (512, 5), "10m": (1536, 6), "100m": (4096, 8), "500m": (8000, 10)}


def parameters(width, depth):
    dims = [784] + [width] * (depth - 1) + [10]
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


class Procs:
    """Processes of one arm; stop_all() ends them by PID, always."""

    def __init__(self, out):
        self.out = out
        self.procs = []

    def start(self, argv, name, env=None):
        log = open(os.path.join(self.out, name + ".log"), "wb")
        p = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env)
        p.log_path = log.name
        p.name = name
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=30)
        self.procs = []


def read(p):
    with open(p.log_path, errors="replace") as f:
        return f.read()


def wait_for(p, pattern, timeout):
    deadline = time.monotonic() + timeout
    rx = re.compile(pattern, re.M)
    while time.monotonic() < deadline:
        m = rx.search(read(p))
        if m:
            return m
        if p.poll() is not None:
            m = rx.search(read(p))
            if m:
                return m
            raise RuntimeError(f"{p.name} exited before /{pattern}/:\n{read(p)[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for /{pattern}/ in {p.log_path}")


def wait_exit(procs, timeout):
    deadline = time.monotonic() + timeout
    for p in procs:
        left = max(1.0, deadline - time.monotonic())
        p.wait(timeout=left)


def shoalctl(bin_dir, *args, timeout=60):
    return subprocess.run([f"{bin_dir}/shoalctl", *args], capture_output=True, text=True,
                          timeout=timeout)


def status(bin_dir, address):
    out = shoalctl(bin_dir, "status", f"--coordinator={address}", "--json")
    return json.loads(out.stdout)


def scale_line(p):
    m = re.search(r"^SCALE (\{.*\})$", read(p), re.M)
    if not m:
        raise RuntimeError(f"{p.name} printed no SCALE line:\n{read(p)[-3000:]}")
    return json.loads(m.group(1))


def loopback_rate(bin_dir, out):
    """Bytes per second of one plain TCP stream on loopback (shoal-bench-stream)."""
    r = subprocess.run([f"{bin_dir}/shoal-bench-stream", "--mib=256", "--reps=3",
                        "--variants=tcp", f"--log={out}/stream.log"],
                       capture_output=True, text=True, timeout=600)
    m = re.search(r"tcp_MBps=([0-9.]+)", r.stdout)
    if not m:
        raise RuntimeError(f"shoal-bench-stream printed no rate:\n{r.stdout}\n{r.stderr}")
    return float(m.group(1)) * 1e6


def alone_arm(args, width, depth, out):
    procs = Procs(out)
    try:
        p = procs.start([PY, WORKER, "--alone", f"--width={width}", f"--depth={depth}",
                         f"--steps={args.rounds * args.local_steps}",
                         f"--first_steps={args.local_steps}"], "alone")
        p.wait(timeout=args.arm_timeout)
        return scale_line(p)
    finally:
        procs.stop_all()


def exchange_seconds(logs):
    """Per round, the slowest worker's exchange seconds (round lines)."""
    per_round = {}
    for text in logs:
        for m in re.finditer(r"round (\d+): .*? exchange=([0-9.]+)s", text):
            r, s = int(m.group(1)), float(m.group(2))
            per_round[r] = max(per_round.get(r, 0.0), s)
    return [per_round[r] for r in sorted(per_round) if r > 1]


def shoal_arm(args, width, depth, out, name, flags, workers=3):
    procs = Procs(out)
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    try:
        c = procs.start([f"{args.bin}/shoal-coordinator", "--listen=127.0.0.1:0", "--model=module",
                         f"--min_participants={workers}", f"--rounds={args.rounds}",
                         f"--local_steps={args.local_steps}", f"--eval_every={args.rounds + 1}",
                         # A round of a big model on a busy 2-core machine is slow; the
                         # benchmark measures it, it does not judge stragglers.
                         "--adaptive_deadline=false", "--round_timeout=30m", *flags],
                        f"{name}-coordinator")
        address = wait_for(c, r"listening on ([0-9.]+:[0-9]+)", 60).group(1)
        ws = [procs.start([PY, WORKER, f"--coordinator={address}", f"--name={name}{i}",
                           f"--width={width}", f"--depth={depth}", f"--seed={i + 1}"],
                          f"{name}{i}", env) for i in range(workers)]
        wait_exit(ws, args.arm_timeout)
        lines = [scale_line(w) for w in ws]
        s = status(args.bin, address)
        rounds = sorted(s.get("recent_rounds", []), key=lambda r: int(r["round"]))[1:]
        round_s = statistics.median(float(r["seconds"]) for r in rounds) if rounds else 0.0
        exch = exchange_seconds(read(w) for w in ws)
        hashes = {ln.get("hash") for ln in lines}
        return {
            "peak_rss": max(ln["peak_rss"] for ln in lines),
            "utilization": statistics.median(ln["compute_s"] / ln["wall_s"] for ln in lines
                                             if ln["wall_s"] > 0),
            "round_s": round_s,
            "exchange_s": statistics.median(exch) if exch else 0.0,
            "hashes_agree": len(hashes) == 1,
            "rounds": min(ln.get("rounds", 0) for ln in lines),
        }
    finally:
        procs.stop_all()


def big_run(args, width, depth, out):
    """Two workers, a late third, a checkpoint store, an export that loads."""
    procs = Procs(out)
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    store_dir = os.path.join(out, "store")
    os.makedirs(store_dir, exist_ok=True)
    try:
        st = procs.start([f"{args.bin}/shoal-checkpoint", "--listen=127.0.0.1:0",
                          f"--data_dir={store_dir}"], "big-store")
        store = wait_for(st, r"listening on ([0-9.]+:[0-9]+)", 60).group(1)
        c = procs.start([f"{args.bin}/shoal-coordinator", "--listen=127.0.0.1:0", "--model=module",
                         "--min_participants=2", f"--rounds={args.big_rounds}",
                         f"--local_steps={args.local_steps}", f"--eval_every={args.big_rounds + 1}",
                         f"--checkpoint_store={store}", "--checkpoint_every=2",
                         # The default heartbeat lease (10 s): the late joiner opens
                         # its session before it pulls the 2 GB model (it was removed
                         # while pulling when it did not: bench/history/scale.md).
                         "--adaptive_deadline=false", "--round_timeout=30m"],
                        "big-coordinator")
        address = wait_for(c, r"listening on ([0-9.]+:[0-9]+)", 60).group(1)
        common = [f"--coordinator={address}", f"--width={width}", f"--depth={depth}"]
        ws = [procs.start([PY, WORKER, *common, f"--name=big{i}", f"--seed={i + 1}"], f"big{i}", env)
              for i in range(2)]
        # The third joins once round 2 is agreed, and pulls the model first.
        deadline = time.monotonic() + args.arm_timeout
        while int(status(args.bin, address).get("last_completed_round", 0)) < 2:
            if time.monotonic() > deadline or any(w.poll() is not None for w in ws):
                raise RuntimeError("the big run did not reach round 2")
            time.sleep(2)
        late = procs.start([PY, WORKER, *common, "--name=late", "--seed=3"], "big-late", env)
        ws.append(late)
        wait_exit(ws, args.arm_timeout)
        lines = [scale_line(w) for w in ws]
        s = status(args.bin, address)
        ckpts = json.loads(shoalctl(args.bin, "checkpoints", "list", f"--store={store}",
                                    "--json").stdout or "[]")
        if isinstance(ckpts, dict):
            ckpts = ckpts.get("checkpoints", [])
        export = os.path.join(out, "big-export.pt")
        newest = ckpts[0]["id"] if ckpts else ""
        ex = shoalctl(args.bin, "checkpoints", "export", newest, f"--store={store}",
                      f"--out={export}", "--rpc_timeout=600s", timeout=1800)
        loaded = subprocess.run(
            [PY, "-c", (
                "import sys, torch; sys.path.insert(0, %r)\n"
                "from scale_worker import WideMLP\n"
                "m = WideMLP(%d, %d); sd = torch.load(%r)\n"
                "sd = sd.get('state_dict', sd) if isinstance(sd, dict) else sd\n"
                "m.load_state_dict(sd, strict=True); print('LOADED', sum(t.numel() for t in m.state_dict().values()))"
            ) % (HERE, width, depth, export)], capture_output=True, text=True, timeout=1800)
        late_text = read(late)
        return {
            "rounds": int(s.get("last_completed_round", 0)),
            "hashes_agree": len({ln.get("hash") for ln in lines}) == 1,
            "late_pulled": bool(re.search(r"caught up|pulled|catch", late_text, re.I)),
            "late_peak_rss": lines[-1]["peak_rss"],
            "peak_rss": max(ln["peak_rss"] for ln in lines),
            "checkpoints": len(ckpts),
            "export_ok": ex.returncode == 0,
            "export_loaded": "LOADED" in loaded.stdout,
            "export_error": (ex.stderr + loaded.stderr)[-2000:],
        }
    finally:
        procs.stop_all()


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no matplotlib (scripts/install-deps.sh --bench)"
    xs = [r["params"] / 1e6 for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot(xs, [r["alone_rss"] / r["bytes"] for r in rows], "o-", label="loop alone")
    ax[0].plot(xs, [r["plain"]["peak_rss"] / r["bytes"] for r in rows], "o-", label="with Shoal")
    if all(r.get("overlap") for r in rows):
        ax[0].plot(xs, [r["overlap"]["peak_rss"] / r["bytes"] for r in rows], "o-",
                   label="with Shoal, --overlap")
    ax[0].set_xscale("log")
    ax[0].set_xlabel("parameters (millions)")
    ax[0].set_ylabel("peak RSS / model bytes")
    ax[0].legend()
    ax[1].plot(xs, [r["plain"]["round_s"] for r in rows], "o-", label="round")
    ax[1].plot(xs, [r["plain"]["exchange_s"] for r in rows], "o-", label="exchange")
    ax[1].plot(xs, [r["bound_s"] for r in rows], "--", label="exchange bound")
    ax[1].set_xscale("log")
    ax[1].set_yscale("log")
    ax[1].set_xlabel("parameters (millions)")
    ax[1].set_ylabel("seconds")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    ap.add_argument("--pythonpath", default=os.path.join(ROOT, "build/python"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="1m,10m,100m,500m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--local_steps", type=int, default=2)
    ap.add_argument("--big", action="store_true", help="the late-join + export run at the largest size")
    ap.add_argument("--big_rounds", type=int, default=6)
    ap.add_argument("--big_size", default="",
                    help="the size of the --big run (default: the last of --sizes); a size not "
                         "in --sizes gets only its loop-alone arm and the big run")
    ap.add_argument("--no_overlap", action="store_true")
    ap.add_argument("--arm_timeout", type=float, default=3600)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rate = loopback_rate(args.bin, args.out)
    print(f"loopback TCP stream: {rate / 1e6:.0f} MB/s", flush=True)
    rows = []
    for name in args.sizes.split(","):
        width, depth = SIZES[name]
        n = parameters(width, depth)
        row = {"size": name, "params": n, "bytes": 4 * n}
        print(f"== {name}: {n / 1e6:.1f} M parameters ({4 * n / 2**20:.0f} MiB)", flush=True)
        row["alone_rss"] = alone_arm(args, width, depth, args.out)["peak_rss"]
        row["plain"] = shoal_arm(args, width, depth, args.out, f"{name}-plain", [])
        if not args.no_overlap:
            row["overlap"] = shoal_arm(args, width, depth, args.out, f"{name}-overlap",
                                       ["--overlap=on"])
        row["bound_s"] = 2 * (3 - 1) / 3 * row["bytes"] / rate
        rows.append(row)
        print(json.dumps(row), flush=True)
    big = None
    if args.big:
        big_size = args.big_size or args.sizes.split(",")[-1]
        width, depth = SIZES[big_size]
        big_params = parameters(width, depth)
        big_alone = next((r["alone_rss"] for r in rows if r["size"] == big_size), None)
        if big_alone is None:
            big_alone = alone_arm(args, width, depth, args.out)["peak_rss"]
        big = big_run(args, width, depth, args.out)
        big.update(size=big_size, params=big_params, alone_rss=big_alone,
                   extra_memory=(big["peak_rss"] - big_alone) / (4 * big_params))
        print("big: " + json.dumps(big), flush=True)
    # The table.
    print(f"\n== scale: 3 Python workers on 127.0.0.1, {args.rounds} rounds x "
          f"{args.local_steps} local steps, loopback {rate / 1e6:.0f} MB/s")
    print(f"{'size':>6} {'params':>8} {'alone':>6} {'shoal':>6} {'extra':>6} {'ovl mem':>7} "
          f"{'util':>5} {'util ovl':>8} {'round s':>8} {'exch s':>7} {'bound s':>7} {'x bound':>7}")
    for r in rows:
        ov = r.get("overlap") or {}
        extra = (r["plain"]["peak_rss"] - r["alone_rss"]) / r["bytes"]
        ov_mem = (ov["peak_rss"] - r["alone_rss"]) / r["bytes"] if ov else float("nan")
        print(f"{r['size']:>6} {r['params'] / 1e6:>7.1f}M {r['alone_rss'] / r['bytes']:>6.2f} "
              f"{r['plain']['peak_rss'] / r['bytes']:>6.2f} {extra:>6.2f} {ov_mem:>7.2f} "
              f"{r['plain']['utilization']:>5.2f} {ov.get('utilization', float('nan')):>8.2f} "
              f"{r['plain']['round_s']:>8.2f} {r['plain']['exchange_s']:>7.2f} "
              f"{r['bound_s']:>7.2f} {r['plain']['exchange_s'] / r['bound_s']:>7.2f}")
    print("(memory columns: peak RSS / model bytes; extra = (Shoal - alone) / model)")
    print("plot:", plot(rows, os.path.join(args.out, "scale.png")))
    at = next((r for r in rows if r["size"] == "100m"), rows[-1])
    extra = (at["plain"]["peak_rss"] - at["alone_rss"]) / at["bytes"]
    util = (at.get("overlap") or at["plain"])["utilization"]
    bound = at["plain"]["exchange_s"] / at["bound_s"]
    tail = ""
    if big is not None:
        print(f"big run ({big['size']}, {big['params'] / 1e6:.1f} M parameters, 2 workers and a "
              f"late joiner): peak RSS / model {big['peak_rss'] / (4 * big['params']):.2f}, "
              f"alone {big['alone_rss'] / (4 * big['params']):.2f}, extra "
              f"{big['extra_memory']:.2f}; rounds {big['rounds']}, checkpoints "
              f"{big['checkpoints']}, late joiner pulled: {big['late_pulled']}")
        tail = (f" big_params={big['params']} big_extra_memory={big['extra_memory']:.2f} "
                f"big_rounds={big['rounds']} "
                f"big_hashes_agree={str(big['hashes_agree']).lower()} "
                f"big_export_loaded={str(big['export_loaded']).lower()}")
    ok = all(r["plain"]["hashes_agree"] for r in rows)
    print(f"scale: size={at['size']} extra_memory={extra:.2f} utilization={util:.2f} "
          f"utilization_plain={at['plain']['utilization']:.2f} exchange_vs_bound={bound:.2f} "
          f"hashes_agree={str(ok).lower()}{tail}")
    return 0 if ok and (big is None or (big["hashes_agree"] and big["export_loaded"])) else 1


if __name__ == "__main__":
    sys.exit(main())
