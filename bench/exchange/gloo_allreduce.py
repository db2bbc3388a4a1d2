#!/usr/bin/env python3
"""Baseline of the exchange benchmark: torch.distributed.all_reduce (gloo)
averaging the same tensors across the same number of processes on loopback.

Started by shoal-bench-exchange. Rank 0 is this process; it starts ranks
1..world-1 as children, prints "ready", then for every "go MODE" line on
stdin runs one timed repetition and prints "done SECONDS OK CPU", where SECONDS
is the slowest rank's time, OK is 1 when every rank holds the average and
CPU the CPU-seconds of all ranks (every thread) during the repetition.
MODE: "flat" (one all_reduce over one flat tensor holding every parameter,
like Shoal's flat vector) or "per_tensor" (one all_reduce per tensor).
"""
import argparse
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill(tensors, rank, rep):
    # Same values as the Shoal workers: (i % 1000) * 0.001 + rank + rep % 3.
    offset = 0
    for t in tensors:
        n = t.numel()
        idx = torch.arange(offset, offset + n, dtype=torch.int64)
        t.copy_((idx % 1000).to(torch.float32) * 0.001 + rank + rep % 3)
        offset += n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    children = []
    if args.rank == 0:
        args.port = free_port()
        for r in range(1, args.world):
            children.append(subprocess.Popen(
                [sys.executable, __file__, f"--world={args.world}", f"--sizes={args.sizes}",
                 f"--rank={r}", f"--port={args.port}"], stdin=subprocess.DEVNULL))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)

    flat = torch.empty(sum(sizes), dtype=torch.float32)
    views = list(torch.split(flat, sizes))  # the model's tensors, in one buffer
    separate = [torch.empty(n, dtype=torch.float32) for n in sizes]
    command = torch.zeros(1, dtype=torch.int64)
    rep = 0
    if args.rank == 0:
        print("ready", flush=True)
    while True:
        if args.rank == 0:
            line = sys.stdin.readline().split()
            command[0] = 0 if not line or line[0] == "quit" else (1 if line[1] == "flat" else 2)
        dist.broadcast(command, src=0)
        if command.item() == 0:
            break
        rep += 1
        tensors = views if command.item() == 1 else separate
        fill(tensors, args.rank, rep)
        dist.barrier()
        cpu0 = time.process_time()  # every thread of this process
        start = time.perf_counter()
        if command.item() == 1:
            dist.all_reduce(flat)
            flat.div_(args.world)
        else:
            for t in separate:
                dist.all_reduce(t)
                t.div_(args.world)
        took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        cpu = torch.tensor([time.process_time() - cpu0], dtype=torch.float64)
        # Check the average (not timed), then collect the slowest time.
        want = (sum(range(args.world)) / args.world) + rep % 3
        last = sum(sizes) - 1
        ok = (abs(float(tensors[0][0]) - want) < 1e-3 and
              abs(float(tensors[-1][-1]) - ((last % 1000) * 0.001 + want)) < 1e-3)
        ok_t = torch.tensor([1 if ok else 0], dtype=torch.int64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        dist.all_reduce(ok_t, op=dist.ReduceOp.MIN)
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
        if args.rank == 0:
            print(f"done {took.item():.6f} {ok_t.item()} {cpu.item():.6f}", flush=True)
    dist.destroy_process_group()
    for c in children:
        c.wait()


if __name__ == "__main__":
    main()
