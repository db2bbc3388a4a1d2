"""A small character-level transformer language model trained in a Shoal run.

The text is the `fortunes` package's (/usr/share/games/fortunes): every
worker reads it, keeps 5 % for validation, and trains on its own shard of the
rest. Three workers (docs/PYTHON.md):

    build/bin/shoal-coordinator --listen=127.0.0.1:50051 --model=module \\
        --min_participants=3 --rounds=40 --local_steps=25 &
    for n in a b c; do
      PYTHONPATH=build/python /usr/bin/python3 examples/python/char_lm.py --name=$n &
    done

Prints the validation loss and perplexity each round, and a sample of
generated text at the end. `--alone --steps=N` trains the same model in one
process without Shoal (the baseline of `bash bench/run.sh python`).
"""
import argparse
import glob
import logging
import math
import os

import torch
import torch.nn.functional as F

import shoal

CONTEXT = 64


def corpus(root="/usr/share/games/fortunes"):
    paths = sorted(p for p in glob.glob(os.path.join(root, "*"))
                   if os.path.isfile(p) and not p.endswith((".dat", ".u8")))
    text = "".join(open(p, encoding="latin-1").read() for p in paths)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    split = int(len(data) * 0.95)
    return chars, data[:split], data[split:]


class CharLM(torch.nn.Module):
    def __init__(self, vocab, dim=64, heads=4, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.position = torch.nn.Parameter(torch.zeros(CONTEXT, dim))
        layer = torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.triu(torch.full((CONTEXT, CONTEXT), float("-inf")), 1),
                             persistent=False)

    def forward(self, x):
        t = x.size(1)
        h = self.embed(x) + self.position[:t]
        return self.head(self.norm(self.blocks(h, mask=self.mask[:t, :t])))


def batches(data, batch, generator):
    while True:
        starts = torch.randint(0, len(data) - CONTEXT - 1, (batch,), generator=generator)
        x = torch.stack([data[s:s + CONTEXT] for s in starts])
        y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts])
        yield x, y


def validation_loss(model, data, n=32):
    g = torch.Generator().manual_seed(1)
    x, y = next(batches(data, n, g))
    with torch.no_grad():
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()


def sample(model, chars, prompt="The ", length=200):
    idx = torch.tensor([[chars.index(c) for c in prompt if c in chars]])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(length):
            logits = model(idx[:, -CONTEXT:])[0, -1]
            nxt = torch.multinomial(F.softmax(logits / 0.8, -1), 1, generator=g)
            idx = torch.cat([idx, nxt.view(1, 1)], 1)
    return "".join(chars[i] for i in idx[0])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", default="127.0.0.1:50051")
    p.add_argument("--name", default="")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--alone", action="store_true", help="train in this process, no Shoal")
    p.add_argument("--steps", type=int, default=1000, help="--alone: steps to train")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    chars, train, valid = corpus()
    model = CharLM(len(chars))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def train_step(x, y, opt=opt):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step(loss=loss) if isinstance(opt, shoal.Optimizer) else opt.step()
        return loss

    if args.alone:
        data = batches(train, args.batch, torch.Generator().manual_seed(7))
        for step in range(1, args.steps + 1):
            train_step(*next(data))
            if step % 100 == 0 or step == args.steps:
                v = validation_loss(model, valid)
                print(f"step {step} validation loss {v:.4f} perplexity {math.exp(v):.2f}",
                      flush=True)
    else:
        with shoal.Worker(model, args.coordinator, name=args.name) as w:
            shard = train[len(train) * (w.rank % w.shards) // w.shards:
                          len(train) * (w.rank % w.shards + 1) // w.shards]
            data = batches(shard, args.batch, torch.Generator().manual_seed(7 + w.rank))
            shoal_opt = shoal.Optimizer(opt, w)  # each optimizer step is a Shoal step
            while w.running:
                train_step(*next(data), opt=shoal_opt)
                if w.new_round:
                    v = validation_loss(model, valid)
                    w.report(0.0, v)
                    r, h = w.agreed()  # the averaged model this worker holds
                    print(f"round {r} validation loss {v:.4f} "
                          f"perplexity {math.exp(v):.2f} hash {h}", flush=True)
    v = validation_loss(model, valid)
    print(f"final validation loss {v:.4f} perplexity {math.exp(v):.2f}", flush=True)
    print("sample: " + sample(model, chars).replace("\n", "\n  "), flush=True)


if __name__ == "__main__":
    main()
