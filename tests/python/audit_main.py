"""A Python worker that hands Shoal its step (shoal.Worker(step=,
optimizer=) and w.run()), for test_python_audit.py: a module with dropout
and BatchNorm (the replay must reproduce the generator's draws and the
running statistics) trained with SGD and momentum on the first
--train_samples images of Fashion-MNIST.

Prints, flushed: "joined as W", "round R hash H" after each round,
"done after N rounds: hash H", and "result CODE: message" when the run
ended for it with an error; "error CODE: message" (exit 3) when the join
is refused. --shuffle_labels trains on permuted labels (a cheater whose
contributions are real trained models); --no_step joins without handing
the step (refused in an audited run); --own_loop calls w.step() from a
loop of its own (refused in an audited run too)."""
import argparse
import logging
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import shoal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
from fashion_mnist import load  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--coordinator", required=True)
p.add_argument("--name", default="")
p.add_argument("--train_samples", type=int, default=12800)
p.add_argument("--shuffle_labels", action="store_true")
p.add_argument("--no_step", action="store_true")
# Hands the step, then trains in a loop of its own with w.step() (refused
# in an audited run: "own loop: error CODE: message").
p.add_argument("--own_loop", action="store_true")
args = p.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

x, y = load("train")
x, y = x[:args.train_samples].contiguous(), y[:args.train_samples].contiguous()
if args.shuffle_labels:
    y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(7))]

model = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.BatchNorm1d(128), torch.nn.ReLU(),
    torch.nn.Dropout(0.2), torch.nn.Linear(128, 10))


def train_step(module, batch, opt):
    xb, yb = batch
    loss = F.cross_entropy(module(xb), yb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def on_round(w):
    r, digest = w.agreed()
    print(f"round {r} hash {digest}", flush=True)


step = {} if args.no_step else dict(step=train_step, optimizer=make_optimizer)
try:
    with shoal.Worker(model, args.coordinator, name=args.name, train_samples=len(x),
                      connect_timeout=20, **step) as w:
        print(f"joined as {w.worker_id}: audited {w.audited} threads {torch.get_num_threads()}",
              flush=True)
        if args.own_loop:
            try:
                w.step(train_step(model, (x[:32], y[:32]), make_optimizer(model.parameters())))
                print("own loop: stepped", flush=True)
            except shoal.Error as e:
                print(f"own loop: error {e.code}: {e.message}", flush=True)
            sys.exit(0)
        rounds = w.run((x, y), on_round=on_round)
        print(f"done after {rounds} rounds: hash {w.model_hash()}", flush=True)
        err = w.result()
        if err is not None:
            print(f"result {err.code}: {err.message}", flush=True)
except shoal.Error as e:
    print(f"error {e.code}: {e.message}", flush=True)
    sys.exit(3)
