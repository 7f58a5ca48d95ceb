"""Train a character-level minGPT on the text of Python's own documentation
(pydoc_data.topics, shipped with every Python), then sample from it.

    python examples/mingpt/train.py                       # tpu, strict eager
    python examples/mingpt/train.py --mode defer          # DeferAndFuse
    python examples/mingpt/train.py --compare             # strict, then defer: throughput of both
    python examples/mingpt/train.py --device cpu --steps 50 --save ckpt.pt
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from examples import common  # noqa: E402
from examples.mingpt.model import MinGPT  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = common.parser(__doc__, steps=200, batch_size=32, lr=3e-3)
    p.add_argument("--block", type=int, default=64, help="context length (characters)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--sample-chars", type=int, default=300, help="characters to sample after training")
    return p.parse_args(argv)


def train(args: argparse.Namespace, data: common.CharData, mode: str) -> dict:
    with common.Run(args, mode, "minGPT") as run:
        dev = run.device
        model = MinGPT(vocab=data.vocab, d=args.width, layers=args.layers, heads=args.heads, block=args.block,
                       dropout=args.dropout).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        if args.load:
            common.load_checkpoint(args.load, model, opt)
        g = torch.Generator().manual_seed(args.seed)

        fwd = run.compile(model)
        def step(i: int) -> torch.Tensor:
            x, y = data.batch("train", args.batch_size, g)
            x, y = x.to(dev), y.to(dev)
            return run.update(opt, lambda: fwd(x),
                              lambda out: common.lm_loss(out, y))

        model.train()
        run.train(step, units_per_step=args.batch_size * args.block, unit="tokens")
        model.eval()
        with torch.no_grad():
            xv, yv = data.batch("val", args.batch_size, g)
            val = common.lm_loss(model(xv.to(dev)), yv.to(dev)).item()
        prompt = torch.tensor([data.encode("The ")], device=dev)
        out = model.generate(prompt, args.sample_chars, generator=torch.Generator(dev).manual_seed(args.seed))
        run.result.update(val=val, sample=data.decode(out[0].tolist()))
        if args.save:
            common.save_checkpoint(args.save, model, opt, chars=data.chars)
    return run.result


def main(argv=None) -> int:
    return run(parse(argv))[0]


def run(args: argparse.Namespace) -> tuple[int, list[dict]]:
    if (rc := common.check(args)) is not None:
        return rc, []
    data = common.CharData(common.pydoc_text(), args.block)
    results = [train(args, data, m) for m in common.modes(args)]
    for r in results:
        print(f"\n--- sample ({r['mode']}) ---\n{r['sample']}\n")
    common.report(results, lambda r: f"val loss {r['val']:.3f}")
    return 0, results


if __name__ == "__main__":
    sys.exit(main())
