#!/usr/bin/python3
"""A small CNN with BatchNorm for Shoal's --model=torchscript:PATH.

  /usr/bin/python3 examples/torchscript/small_cnn.py write small_cnn.pt
      writes the scripted model (torch.jit.script(SmallCnn()).save(...)).
  /usr/bin/python3 examples/torchscript/small_cnn.py check EXPORT.pt [--images N]
      loads a `shoalctl checkpoints export` file into SmallCnn with
      load_state_dict (strict: same names, no renaming) and prints the
      accuracy on the first N Fashion-MNIST test images.

Shoal feeds the model float32 batches [N, 1, 28, 28]: pixels / 255,
normalised with Fashion-MNIST's mean 0.2860 and standard deviation 0.3530
(`normalize` below does the same), and trains it on cross-entropy over the
logits it returns ([N, 10]). Needs Debian's python3-torch only.
"""
import argparse
import gzip
import struct
import sys

import torch
from torch import nn

MEAN, STD = 0.2860, 0.3530
DATA_DIR = "/usr/share/datasets/fashion-mnist"


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def read_idx(path: str) -> torch.Tensor:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def normalize(images: torch.Tensor) -> torch.Tensor:
    return ((images.float() / 255.0 - MEAN) / STD).unsqueeze(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the scripted model")
    w.add_argument("out")
    w.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check", help="load an export and evaluate it")
    c.add_argument("export")
    c.add_argument("--images", type=int, default=100)
    c.add_argument("--data_dir", default=DATA_DIR)
    c.add_argument("--predictions", default="",
                   help="a worker's --predictions_out file: every prediction must agree")
    args = parser.parse_args()
    if args.cmd == "write":
        torch.manual_seed(args.seed)
        torch.jit.script(SmallCnn()).save(args.out)
        print(f"wrote {args.out}")
        return 0
    state = torch.load(args.export)
    model = SmallCnn()
    model.load_state_dict(state)  # strict: every name must match
    model.eval()
    images = read_idx(f"{args.data_dir}/t10k-images-idx3-ubyte.gz")[: args.images]
    labels = read_idx(f"{args.data_dir}/t10k-labels-idx1-ubyte.gz")[: args.images].long()
    with torch.no_grad():
        predicted = model(normalize(images)).argmax(1)
    correct = int((predicted == labels).sum())
    print(f"loaded {len(state)} tensors with load_state_dict; "
          f"correct={correct} images={len(labels)} accuracy={correct / len(labels):.4f}")
    if args.predictions:
        worker = {}
        with open(args.predictions) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                index, label, pred = (int(v) for v in line.split())
                worker[index] = (label, pred)
        checked = [i for i in sorted(worker) if i < len(labels)]
        differ = [i for i in checked if worker[i][1] != int(predicted[i])]
        wrong_labels = [i for i in checked if worker[i][0] != int(labels[i])]
        print(f"predictions: {len(checked) - len(differ)} of {len(checked)} agree with the worker"
              + (f"; differ at {differ[:10]}" if differ else ""))
        if not checked or differ or wrong_labels:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
