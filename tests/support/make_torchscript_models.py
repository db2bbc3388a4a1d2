#!/usr/bin/python3
"""Writes the TorchScript files of the loader tests into OUT_DIR:
good.pt (examples/torchscript's SmallCnn with BatchNorm), text.pt (not a
TorchScript file), noparams.pt (a module without parameters),
wrongshape.pt (its forward wants 100 features, not an image batch)."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torchscript"))
from small_cnn import SmallCnn  # noqa: E402


class NoParams(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :10]


class WrongShape(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(100, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def main() -> int:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1)
    torch.jit.script(SmallCnn()).save(os.path.join(out, "good.pt"))
    with open(os.path.join(out, "text.pt"), "w") as f:
        f.write("this is a text file, not a model\n")
    torch.jit.script(NoParams()).save(os.path.join(out, "noparams.pt"))
    torch.jit.script(WrongShape()).save(os.path.join(out, "wrongshape.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
