"""The demo's MLP on Fashion-MNIST, trained in a Shoal run from Python.

Start a coordinator, then this script once per worker (docs/PYTHON.md):

    build/bin/shoal-coordinator --listen=127.0.0.1:50051 --model=module \\
        --min_participants=3 --rounds=30 --local_steps=100 &
    for n in a b c; do
      PYTHONPATH=build/python /usr/bin/python3 examples/python/fashion_mnist.py --name=$n &
    done

The model's tensors are named like the C++ worker's built-in MLP (fc1, fc2,
fc3), so this script also joins a --model=mlp run beside C++ workers.
In a run with the sample ledger (--sample_ledger --epochs=E) it trains the
samples the coordinator names for each round (w.batches()); otherwise its
shard of the training set.
`--dtype=bfloat16` (or float16) trains the module in that dtype, with
float32 master values in Shoal's buffer: it joins the same runs.
Prints one line a round: the averaged model's round and hash, the module's
test accuracy and mean loss.
"""
import argparse
import gzip
import logging

import numpy as np
import torch
import torch.nn.functional as F

import shoal


class MLP(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256, dtype=dtype)
        self.fc2 = torch.nn.Linear(256, 128, dtype=dtype)
        self.fc3 = torch.nn.Linear(128, 10, dtype=dtype)

    def forward(self, x):
        x = x.view(-1, 784).to(self.fc1.weight.dtype)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))).float()


def load(kind, root="/usr/share/datasets/fashion-mnist"):
    with gzip.open(f"{root}/{kind}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{root}/{kind}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return (torch.tensor(x, dtype=torch.float32) / 255 - 0.2860) / 0.3530, torch.tensor(y).long()


def shard_batches(w, x, y, size):
    """Batches of this worker's shard, epoch after epoch, until the run is over."""
    x = x[w.rank % w.shards::w.shards].contiguous()
    y = y[w.rank % w.shards::w.shards].contiguous()
    while w.running:
        for batch in torch.randperm(len(x)).split(size):
            yield x.index_select(0, batch), y.index_select(0, batch)


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", default="127.0.0.1:50051")
    p.add_argument("--name", default="")
    p.add_argument("--token_file", default="")
    p.add_argument("--uplink_mbps", type=float, default=0,
                   help="this machine's uplink, to pace the exchange at (0 = unpaced)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the module's dtype (Shoal keeps float32 master values)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)  # as shoal-worker's --torch_threads: several workers share a machine
    train_x, train_y = load("train")
    test_x, test_y = load("t10k")

    model = MLP(getattr(torch, args.dtype))
    with shoal.Worker(model, args.coordinator, name=args.name, token_file=args.token_file,
                      uplink_mbps=args.uplink_mbps, train_samples=len(train_x)) as w:
        print(f"joined as {w.worker_id}: accuracy {accuracy(model, test_x, test_y):.4f} "
              f"hash {w.model_hash()}", flush=True)
        if w.ledger:  # the samples the coordinator names, a batch of the run's --batch_size a step
            batches = w.batches((train_x, train_y))
        else:  # this worker's shard
            batches = shard_batches(w, train_x, train_y, args.batch)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, foreach=True)
        every = max(1, int(w.config["training"].get("eval_every", 1)))  # the run's --eval_every
        for xb, yb in batches:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if not w.step(loss):
                break
            if not w.new_round:
                continue
            # Steps (gossip), or the averaged model this worker holds.
            done, digest = (w.rounds, w.model_hash()) if w.gossip else w.agreed()
            if done % every == 0:
                acc = accuracy(model, test_x, test_y)  # the module (the local model, overlapped)
                w.report(acc)
                print(f"{'step' if w.gossip else 'round'} {done} accuracy {acc:.4f} loss {loss.item():.4f} "
                      f"hash {digest}", flush=True)
        st = w.status()  # the coordinator's view, as Python objects
        print(f"status: phase {st.phase} round {st.last_completed_round} members {st.members} "
              f"states {sorted(m.state for m in st.workers)}", flush=True)
        print(f"done after {w.rounds} {'steps' if w.gossip else 'rounds'}: accuracy {accuracy(model, test_x, test_y):.4f} "
              f"hash {w.model_hash()}", flush=True)


if __name__ == "__main__":
    main()
