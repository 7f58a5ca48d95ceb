"""Train a character-level minGPT on the text of Python's own documentation
(pydoc_data.topics, shipped with every Python), then sample from it.

    python examples/mingpt/train.py                       # tpu, strict eager
    python examples/mingpt/train.py --mode defer          # DeferAndFuse
    python examples/mingpt/train.py --compare             # strict, then defer: throughput of both
    python examples/mingpt/train.py --device cpu --steps 50 --save ckpt.pt
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from examples.mingpt.model import MinGPT  # noqa: E402


def load_text() -> str:
    from pydoc_data import topics

    return "".join(topics.topics[k] for k in sorted(topics.topics))


class Data:
    def __init__(self, text: str, block: int) -> None:
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        n = int(0.9 * len(ids))
        self.train, self.val, self.block = ids[:n], ids[n:], block

    def batch(self, split: str, size: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        src = self.train if split == "train" else self.val
        ix = torch.randint(len(src) - self.block - 1, (size,), generator=g)
        x = torch.stack([src[i:i + self.block] for i in ix])
        y = torch.stack([src[i + 1:i + 1 + self.block] for i in ix])
        return x, y

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="tpu", choices=["tpu", "cpu"])
    p.add_argument("--mode", default="strict", choices=["strict", "defer", "compiled"],
                   help="tpu execution mode (compiled: torch.compile(backend='tpu'), not available yet)")
    p.add_argument("--compare", action="store_true", help="train in strict, then in defer mode; report both")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block", type=int, default=64, help="context length (characters)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="bfloat16: autocast of the forward pass")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-chars", type=int, default=300, help="characters to sample after training")
    p.add_argument("--save", help="checkpoint path to write after training")
    p.add_argument("--load", help="checkpoint path to start from")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def train(args: argparse.Namespace, data: Data, mode: str) -> dict:
    import torch_tpu  # noqa: F401  (registers the device)

    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = MinGPT(vocab=len(data.chars), d=args.width, layers=args.layers, heads=args.heads, block=args.block,
                   dropout=args.dropout)
    if args.load:
        model.load_state_dict(torch.load(args.load, map_location="cpu")["model"])
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(args.seed)
    ctx = torch_tpu.execution_mode(mode) if dev.type == "tpu" else contextlib.nullcontext()
    amp = (torch.autocast(dev.type, dtype=torch.bfloat16) if args.dtype == "bfloat16"
           else contextlib.nullcontext())
    if dev.type == "tpu":
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        torch.tpu.reset_defer_stats()
    losses = []
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, desc=f"minGPT {args.device}/{mode}", unit="step", dynamic_ncols=True)
    t0 = time.perf_counter()
    warm = None
    with ctx:
        model.train()
        for step in range(args.steps):
            x, y = data.batch("train", args.batch_size, g)
            x, y = x.to(dev), y.to(dev)
            with amp:
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if step == 1:
                warm = time.perf_counter()
            if bar:
                el = time.perf_counter() - t0
                bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{(step + 1) * args.batch_size * args.block / el:,.0f}")
                bar.update()
        t1 = time.perf_counter()
        if bar:
            bar.close()
        model.eval()
        with torch.no_grad():
            xv, yv = data.batch("val", args.batch_size, g)
            val = F.cross_entropy(model(xv.to(dev)).reshape(-1, len(data.chars)), yv.to(dev).reshape(-1)).item()
        prompt = torch.tensor([[data.stoi[c] for c in "The "]], device=dev)
        out = model.generate(prompt, args.sample_chars, generator=torch.Generator(dev).manual_seed(args.seed))
        sample = data.decode(out[0].tolist())
    steady = max(1, args.steps - 2)
    tok_s = steady * args.batch_size * args.block / (t1 - (warm or t0))
    res = {"mode": mode, "loss_first": losses[0], "loss_last": sum(losses[-10:]) / len(losses[-10:]), "val": val,
           "tokens_per_s": tok_s, "sample": sample}
    if dev.type == "tpu":
        st = torch.tpu.defer_stats()
        res.update(peak_mib=torch.tpu.max_memory_allocated() / 2**20, graphs=st["graphs_built"],
                   cache_hits=st["cache_hits"])
    if args.save:
        torch.save({"model": {k: v.cpu() for k, v in model.state_dict().items()}, "chars": data.chars}, args.save)
    return res


def summary(args: argparse.Namespace, r: dict) -> str:
    s = (f"minGPT {args.device}/{r['mode']}: loss {r['loss_first']:.3f} -> {r['loss_last']:.3f} "
         f"(val {r['val']:.3f}), {r['tokens_per_s']:,.0f} tokens/s")
    if "peak_mib" in r:
        s += f", peak device memory {r['peak_mib']:.1f} MiB, graphs built {r['graphs']}, cache hits {r['cache_hits']}"
    return s


def main(argv=None) -> int:
    args = parse(argv)
    return run(args)[0]


def run(args: argparse.Namespace) -> tuple[int, list[dict]]:
    if args.mode == "compiled":
        print("--mode compiled: torch.compile(backend='tpu') is not available yet; use strict or defer.",
              file=sys.stderr)
        return 2, []
    if args.device == "cpu" and (args.mode != "strict" or args.compare):
        print("--mode/--compare apply to the tpu device only", file=sys.stderr)
        return 2, []
    data = Data(load_text(), args.block)
    modes = ["strict", "defer"] if args.compare else [args.mode]
    results = [train(args, data, m) for m in modes]
    for r in results:
        print(f"\n--- sample ({r['mode']}) ---\n{r['sample']}\n")
    for r in results:
        print(summary(args, r))
    if args.compare:
        print(f"defer / strict throughput: {results[1]['tokens_per_s'] / results[0]['tokens_per_s']:.2f}x")
    return 0, results


if __name__ == "__main__":
    sys.exit(main())
