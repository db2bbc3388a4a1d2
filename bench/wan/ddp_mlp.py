#!/usr/bin/python3
"""The DDP arm of `bench/run.sh wan`: PyTorch DistributedDataParallel (gloo)
training the same MLP as Shoal's built-in `mlp` model, one process per
network namespace, an all-reduce of the gradients every step.

Matches services/worker/core/trainer.cc: Linear(784,256)-ReLU-Linear(256,128)-
ReLU-Linear(128,10), pixels (x/255 - 0.2860)/0.3530, SGD lr 0.05 momentum 0.9,
batch 64 per process, rank r trains on every world-th training image from r
(Shoal's disjoint shards), reshuffled every epoch over its shard, one LibTorch
thread. Initial weights: the same seed on every rank (DDP also broadcasts
rank 0's at construction).

Rank 0 evaluates on the whole test set (10000 images) every --eval_every
steps; the clock is paused while it does (evaluation is excluded from the
timed training; the other ranks wait in the next collective). After each
evaluation rank 0 broadcasts whether to stop (target reached or cap passed).
Rank 0 prints one line per evaluation to stdout:
  eval step=S train_s=T wall_s=W test_accuracy=A
and at the end `done reached=0|1 step=S train_s=T test_accuracy=A`.
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, name):
    def pick(base):
        for p in (os.path.join(data_dir, base), os.path.join(data_dir, base + ".gz")):
            if os.path.exists(p):
                return p
        sys.exit(f"ddp_mlp: no {base}[.gz] in {data_dir}")
    images = read_idx(pick(f"{name}-images-idx3-ubyte"))
    labels = read_idx(pick(f"{name}-labels-idx1-ubyte"))
    x = (torch.from_numpy(images.astype(np.float32)).view(-1, 784) / 255.0 - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--master", required=True, help="rank 0's HOST:PORT")
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--target", type=float, default=0.87)
    ap.add_argument("--eval_every", type=int, default=20)
    ap.add_argument("--cap_seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)

    x_train, y_train = load(args.data_dir, "train")
    shard = torch.arange(args.rank, x_train.shape[0], args.world)
    x_train, y_train = x_train[shard], y_train[shard]
    x_test = y_test = None
    if args.rank == 0:
        x_test, y_test = load(args.data_dir, "t10k")

    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world, timeout=__import__("datetime").timedelta(seconds=120))
    torch.manual_seed(args.seed)
    model = nn.parallel.DistributedDataParallel(Mlp())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    gen = torch.Generator().manual_seed(args.seed * 1000003 + args.rank)
    dist.barrier()  # every rank joined: the clock starts

    start = time.monotonic()
    eval_s = 0.0
    step, cursor, order = 0, 0, torch.randperm(x_train.shape[0], generator=gen)
    acc, reached = 0.0, False
    while True:
        if cursor + args.batch_size > order.numel():
            order, cursor = torch.randperm(x_train.shape[0], generator=gen), 0
        idx = order[cursor:cursor + args.batch_size]
        cursor += args.batch_size
        opt.zero_grad()
        F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()  # all-reduce here
        opt.step()
        step += 1
        if step % args.eval_every:
            continue
        stop = torch.zeros(1)
        if args.rank == 0:
            t = time.monotonic()
            with torch.no_grad():
                acc = (model.module(x_test).argmax(1) == y_test).float().mean().item()
            eval_s += time.monotonic() - t
            train_s = time.monotonic() - start - eval_s
            print(f"eval step={step} train_s={train_s:.2f} wall_s={time.monotonic() - start:.2f} "
                  f"test_accuracy={acc:.4f}", flush=True)
            reached = acc >= args.target
            if reached or train_s > args.cap_seconds:
                stop[0] = 1
        dist.broadcast(stop, 0)
        if stop[0] > 0:
            break
    if args.rank == 0:
        print(f"done reached={int(reached)} step={step} "
              f"train_s={time.monotonic() - start - eval_s:.2f} test_accuracy={acc:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
