#!/usr/bin/python3
"""bench/run.sh python: the Python module against the C++ worker, and a
three-worker char LM against one process (docs/PYTHON.md).

Arms, each a real coordinator and workers on 127.0.0.1:
  cpp     two shoal-worker processes, the built-in MLP (--model=mlp)
          (cpp and python alternate --reps times; the figures are medians)
  python  two Python workers (examples/python/fashion_mnist.py), the same
          MLP, batch (64), local steps and rounds, one Torch thread each
  lm3     three Python workers of examples/python/char_lm.py, --lm_rounds x
          --lm_steps steps each, coordinator flags --lm_flags (default DiLoCo's
          Nesterov outer step)
  lm1     char_lm.py --alone: one process, 3 x rounds x local_steps steps
          (the same number of samples)
Figures:
  round_s   median over rounds after the first of the coordinator's round
            seconds (RoundSummary.seconds: start to agreed hash)
  lm loss   final validation loss
Last line: python: ... ratio=<python / cpp round_s> lm_loss_ratio=<lm3 / lm1>
Processes are stopped by PID.
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


class Procs:
    def __init__(self, out):
        self.out = out
        self.procs = []

    def start(self, argv, name, env=None):
        log = open(os.path.join(self.out, name + ".log"), "wb")
        p = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env)
        p.log_path = log.name
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=30)
        self.procs = []


def read(p):
    return open(p.log_path, errors="replace").read()


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
            raise RuntimeError(f"{p.args[0]} exited before /{pattern}/:\n{read(p)[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for /{pattern}/ in {p.log_path}")


def coordinator(procs, bin_dir, name, *flags):
    c = procs.start([f"{bin_dir}/shoal-coordinator", "--listen=127.0.0.1:0", *flags], name)
    return c, wait_for(c, r"listening on ([0-9.]+:[0-9]+)", 60).group(1)


def status(bin_dir, address):
    out = subprocess.run([f"{bin_dir}/shoalctl", "status", f"--coordinator={address}", "--json"],
                         capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)


def wait_finished(bin_dir, address, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = status(bin_dir, address)
        if s.get("phase") == "FINISHED":
            return s
        time.sleep(0.5)
    raise RuntimeError("the run did not finish")


def round_seconds(s):
    rounds = sorted(s["recent_rounds"], key=lambda r: int(r["round"]))[1:]
    return statistics.median(float(r["seconds"]) for r in rounds)


def mlp_arm(procs, args, arm):
    flags = [f"--model={'mlp' if arm == 'cpp' else 'module'}", "--min_participants=2",
             f"--rounds={args.rounds}", f"--local_steps={args.local_steps}",
             f"--eval_every={args.rounds + 1}", "--batch_size=64"]
    c, address = coordinator(procs, args.bin, f"{arm}-coordinator", *flags)
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    for i in range(2):
        if arm == "cpp":
            procs.start([f"{args.bin}/shoal-worker", f"--coordinator={address}",
                         "--listen=127.0.0.1:0", "--torch_threads=1",
                         f"--name={arm}{i}"], f"{arm}{i}")
        else:
            procs.start([PY, os.path.join(ROOT, "examples/python/fashion_mnist.py"),
                         f"--coordinator={address}", f"--name={arm}{i}"], f"{arm}{i}", env)
    s = wait_finished(args.bin, address, 1200)
    procs.stop_all()
    return round_seconds(s)


def lm_arm(procs, args, arm):
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    script = os.path.join(ROOT, "examples/python/char_lm.py")
    if arm == "lm1":
        p = procs.start([PY, script, "--alone", f"--steps={3 * args.lm_rounds * args.lm_steps}"],
                        arm, env)
        loss = float(wait_for(p, r"final validation loss ([0-9.]+)", 3600).group(1))
        procs.stop_all()
        return loss
    c, address = coordinator(procs, args.bin, "lm-coordinator", "--model=module",
                             "--min_participants=3", f"--rounds={args.lm_rounds}",
                             f"--local_steps={args.lm_steps}", *args.lm_flags.split())
    workers = [procs.start([PY, script, f"--coordinator={address}", f"--name=lm{i}",
                            *([f"--lr={args.lm_lr}"] if args.lm_lr else [])], f"lm{i}", env)
               for i in range(3)]
    losses = [float(wait_for(w, r"final validation loss ([0-9.]+)", 3600).group(1))
              for w in workers]
    procs.stop_all()
    return statistics.mean(losses)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--pythonpath", default="build/python")
    ap.add_argument("--out", default="/tmp")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--local_steps", type=int, default=100)
    ap.add_argument("--lm_rounds", type=int, default=120)
    ap.add_argument("--lm_steps", type=int, default=25)
    ap.add_argument("--arms", default="cpp,python,lm3,lm1")
    ap.add_argument("--reps", type=int, default=3,
                    help="the cpp and python arms alternate this many times (medians)")
    ap.add_argument("--lm_flags", default="--outer_optimizer=nesterov",
                    help="coordinator flags of the lm3 run")
    ap.add_argument("--lm_lr", type=float, default=0,
                    help="the lm3 workers' learning rate (0: the example's, as lm1's)")
    args = ap.parse_args()
    procs = Procs(args.out)

    def stop(signum, frame):
        procs.stop_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    figures = {}
    try:
        arms = args.arms.split(",")
        mlp = [a for a in arms if a in ("cpp", "python")]
        order = [a for _ in range(args.reps) for a in mlp] + [a for a in arms if a not in mlp]
        runs = {}
        for arm in order:
            t0 = time.monotonic()
            value = mlp_arm(procs, args, arm) if arm in mlp else lm_arm(procs, args, arm)
            runs.setdefault(arm, []).append(value)
            unit = "round_s" if arm in mlp else "final_loss"
            print(f"{arm:8s} {unit}={value:.4f}  ({time.monotonic() - t0:.0f} s, load "
                  f"{open('/proc/loadavg').read().split()[0]})", flush=True)
        figures = {arm: statistics.median(v) for arm, v in runs.items()}
        if mlp:
            ratios = [p / c for c, p in zip(runs.get("cpp", []), runs.get("python", []))]
            if ratios:
                print(f"python / cpp round_s per repetition: "
                      f"{', '.join(f'{r:.3f}' for r in ratios)}", flush=True)
    finally:
        procs.stop_all()
    line = "python:"
    if "cpp" in figures and "python" in figures:
        line += (f" cpp_round_s={figures['cpp']:.4f} python_round_s={figures['python']:.4f}"
                 f" ratio={figures['python'] / figures['cpp']:.3f}")
    if "lm3" in figures and "lm1" in figures:
        line += (f" lm3_loss={figures['lm3']:.4f} lm1_loss={figures['lm1']:.4f}"
                 f" lm_loss_ratio={figures['lm3'] / figures['lm1']:.3f}")
    print(line, flush=True)


if __name__ == "__main__":
    main()
