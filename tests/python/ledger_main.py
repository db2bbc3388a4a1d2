"""A Python worker that trains the samples Shoal hands it (w.batches() or a
DataLoader over w.sampler()), for test_python_ledger.py: the demo's MLP on
the first --train_samples images of Fashion-MNIST.

Prints, flushed: "joined as W", "training round R" at a round's first
batch, "round R hash H" after each round's step, "done after N rounds: hash
H" and the run's ledger line from the status at the end. With --record, it
appends "R i i i ..." (the round and the dataset indices of a batch) to that
file before each step, so the test can compare what the loop trained with
the ledger's record."""
import argparse
import logging
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import shoal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
from fashion_mnist import MLP, load  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--coordinator", required=True)
p.add_argument("--name", default="")
p.add_argument("--train_samples", type=int, default=60000)
p.add_argument("--api", choices=["batches", "sampler"], default="batches")
p.add_argument("--record", default="")
# Once this worker trained this many rounds, each step sleeps ("slow from
# round R"): the test kills it while it trains a round whose ledger line it
# cannot have written yet.
p.add_argument("--slow_after", type=int, default=0)
p.add_argument("--step_sleep", type=float, default=0.3)
# Joins once this file exists (a late joiner that has loaded its data).
p.add_argument("--join_after", default="")
args = p.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
torch.set_num_threads(1)

x, y = load("train")
x, y = x[:args.train_samples].contiguous(), y[:args.train_samples].contiguous()
index = torch.arange(len(x))  # what each batch trained, for --record
record = open(args.record, "a") if args.record else None

while args.join_after and not Path(args.join_after).exists():
    time.sleep(0.05)
model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
with shoal.Worker(model, args.coordinator, name=args.name, train_samples=len(x)) as w:
    print(f"joined as {w.worker_id}: ledger {w.ledger} batch_size {w.batch_size} "
          f"rank {w.rank} shards {w.shards}", flush=True)
    started = 0
    slow = False

    def train(xb, yb, ib):
        global started, slow
        if w.round != started:
            started = w.round
            print(f"training round {w.round}", flush=True)
            if args.slow_after and w.rounds >= args.slow_after and not slow:
                slow = True
                print(f"slow from round {w.round}", flush=True)
        if slow:
            time.sleep(args.step_sleep)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if record:
            record.write(f"{w.round} {' '.join(map(str, ib.tolist()))}\n")
            record.flush()
        going = w.step(loss)
        if w.new_round:
            r, digest = w.agreed()
            print(f"round {r} hash {digest}", flush=True)
        return going

    if args.api == "batches":
        for xb, yb, ib in w.batches((x, y, index)):
            train(xb, yb, ib)
    else:
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y, index),
                                             sampler=w.sampler(), batch_size=w.batch_size)
        while w.running:
            for xb, yb, ib in loader:
                if not train(xb, yb, ib):
                    break
    st = w.status()
    if st.ledger is not None:
        lg = st.ledger
        print(f"status ledger: epochs_done {lg.epochs_done} trained {lg.samples_trained} "
              f"lost {lg.samples_lost} redone {lg.samples_redone} of {lg.dataset_samples}",
              flush=True)
    print(f"done after {w.rounds} rounds: hash {w.model_hash()}", flush=True)
