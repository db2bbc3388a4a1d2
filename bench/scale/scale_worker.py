#!/usr/bin/python3
"""One worker of bench/run.sh scale: a wide MLP on Fashion-MNIST, trained in a
Shoal run from Python (or alone, --alone: the same loop without Shoal).

The model: Linear(784, W), D - 2 layers Linear(W, W), Linear(W, 10), ReLU
between; W and D from --width / --depth. SGD (no momentum, so the optimizer
holds no state: what the loop holds is the parameters, their gradients and
Torch itself). One Torch thread, as several workers share the machine.

Prints one JSON line at the end: parameters, steps, the seconds the loop
spent in its own steps (forward, backward, optimizer: `compute_s`) and the
wall seconds over the same span (`wall_s`, from the end of the first round to
the last step), and this process's peak RSS (VmHWM, bytes).
"""
import argparse
import gzip
import json
import logging
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


class WideMLP(torch.nn.Module):
    def __init__(self, width, depth, dtype=torch.float32):
        super().__init__()
        dims = [784] + [width] * (depth - 1) + [10]
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b, dtype=dtype) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


def load(root="/usr/share/datasets/fashion-mnist", limit=8192):
    with gzip.open(f"{root}/train-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)[:limit]
    with gzip.open(f"{root}/train-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:limit]
    return (torch.tensor(x, dtype=torch.float32) / 255 - 0.2860) / 0.3530, torch.tensor(y).long()


def peak_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", default="")
    p.add_argument("--name", default="")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--alone", action="store_true", help="the same loop without Shoal")
    p.add_argument("--steps", type=int, default=0, help="--alone: steps to train")
    p.add_argument("--first_steps", type=int, default=0,
                   help="--alone: steps not measured (as the Shoal run's first round)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    # Shoal's round lines (exchange=...s) go to the log: scale.py reads them.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    x, y = load()
    model = WideMLP(args.width, args.depth)
    params = sum(t.numel() for t in model.state_dict().values())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    compute = 0.0
    steps = 0
    gen = torch.Generator().manual_seed(args.seed)

    def one_step():
        idx = torch.randint(0, len(x), (args.batch,), generator=gen)
        loss = F.cross_entropy(model(x.index_select(0, idx)), y.index_select(0, idx))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss

    out = {"params": params, "bytes": params * 4}
    if args.alone:
        t_measured = None
        for i in range(args.steps):
            if i == args.first_steps:
                t_measured = time.monotonic()
                compute = 0.0
            t0 = time.monotonic()
            one_step()
            compute += time.monotonic() - t0
        out.update(steps=args.steps, compute_s=compute,
                   wall_s=time.monotonic() - (t_measured or time.monotonic()))
    else:
        import shoal
        with shoal.Worker(model, args.coordinator, name=args.name) as w:
            t_measured = None
            while w.running:
                t0 = time.monotonic()
                loss = one_step()
                t1 = time.monotonic()
                if t_measured is not None:
                    compute += t1 - t0
                steps += 1
                if not w.step(loss):
                    break
                if w.new_round and t_measured is None:
                    t_measured = time.monotonic()  # from the end of the first round
            end = time.monotonic()
            out.update(steps=steps, rounds=w.rounds, compute_s=compute,
                       wall_s=end - (t_measured or end), hash=w.model_hash())
    out["peak_rss"] = peak_rss()
    print("SCALE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
