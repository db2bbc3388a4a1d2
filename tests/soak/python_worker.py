#!/usr/bin/python3
"""A Python worker of the soak (tests/soak/soak.py --python_workers): the
examples' MLP, which has the built-in MLP's layout, trained by a Python
loop on Fashion-MNIST beside the soak's shoal-workers, through every fault
they see: TLS, the run token, a zone, the coordinator replicas, the
sample ledger and audits (it hands Shoal its step, so the other Python
worker replays its rounds and it replays theirs: docs/PYTHON.md
"Audits").

Its log lines look like Shoal's ("I12:34:56.789 [python] ..."), so the
soak's ERROR check reads them as it reads the others'. Prints "round R
hash H" after each round's average and "done after N rounds" at the end.
SIGTERM (the soak's stop) leaves the run cleanly."""
import argparse
import logging
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import shoal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
from fashion_mnist import MLP, load  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--coordinator", required=True)
p.add_argument("--listen", required=True)
p.add_argument("--zone", default="")
p.add_argument("--name", default="")
p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
p.add_argument("--token_file", default="")
p.add_argument("--tls_cert", default="")
p.add_argument("--tls_key", default="")
p.add_argument("--tls_ca", default="")
p.add_argument("--eval_limit", type=int, default=500)
args = p.parse_args()
logging.basicConfig(level=logging.INFO, datefmt="%H:%M:%S",
                    format="%(levelname).1s%(asctime)s.%(msecs)03d [python] %(message)s")
torch.set_num_threads(1)

x, y = load("train", args.data_dir)
test_x, test_y = load("t10k", args.data_dir)
test_x, test_y = test_x[:args.eval_limit], test_y[:args.eval_limit]
model = MLP()


def train_step(module, batch, opt):
    xb, yb = batch
    loss = F.cross_entropy(module(xb), yb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def make_optimizer(params):
    # The run's default local optimizer: SGD, --learning_rate 0.05, --momentum 0.9.
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def on_round(w):
    r, digest = w.agreed()
    print(f"round {r} hash {digest}", flush=True)
    with torch.no_grad():
        model.eval()
        logits = model(test_x)
        w.report(float((logits.argmax(1) == test_y).float().mean()),
                 float(F.cross_entropy(logits, test_y)))
        model.train()


with shoal.Worker(model, args.coordinator, name=args.name, listen=args.listen, zone=args.zone,
                  token_file=args.token_file, tls_cert=args.tls_cert, tls_key=args.tls_key,
                  tls_ca=args.tls_ca, train_samples=len(x), step=train_step,
                  optimizer=make_optimizer) as w:
    print(f"joined as {w.worker_id}: audited {w.audited} ledger {w.ledger}", flush=True)
    rounds = w.run((x, y), on_round=on_round)
    print(f"done after {rounds} rounds", flush=True)
    err = w.result()
    if err is not None:
        logging.warning("the run ended for this worker: %s", err)
