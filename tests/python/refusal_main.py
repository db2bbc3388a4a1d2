"""Joins a run with a module and reports how the join went, for
test_refusals.py: 'joined' or 'error CODE: message' (exit 3)."""
import argparse
import sys

import torch

import shoal

p = argparse.ArgumentParser()
p.add_argument("--coordinator", required=True)
p.add_argument("--name", default="")
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--token_file", default="")
p.add_argument("--uplink_mbps", type=float, default=0)
args = p.parse_args()


class MLP(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, hidden)
        self.fc2 = torch.nn.Linear(hidden, 128)
        self.fc3 = torch.nn.Linear(128, 10)


try:
    with shoal.Worker(MLP(args.hidden), args.coordinator, name=args.name,
                      token_file=args.token_file, uplink_mbps=args.uplink_mbps,
                      connect_timeout=20) as w:
        print(f"joined as {w.worker_id}", flush=True)
except shoal.Error as e:
    print(f"error {e.code}: {e.message}", flush=True)
    sys.exit(3)
