#!/usr/bin/python3
"""Writes the model of `bench/run.sh hier`: a TorchScript MLP of about 4 MiB
of float32 parameters (784 -> HIDDEN -> 10; HIDDEN = 1319 gives 1,048,615
parameters, 4.0 MiB), for Shoal's --model=torchscript:PATH.

  /usr/bin/python3 bench/hier/wide_mlp.py OUT.pt [--hidden=1319]
Needs Debian's python3-torch only.
"""
import argparse

import torch
from torch import nn


class WideMlp(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1319)
    args = ap.parse_args()
    torch.manual_seed(1)
    model = WideMlp(args.hidden)
    torch.jit.script(model).save(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: {n} parameters, {n * 4 / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
