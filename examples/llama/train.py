"""Train a character-level Llama-style decoder (RMSNorm, RoPE, grouped-query
attention, SwiGLU; untied output head) on the text of Python's own
documentation (pydoc_data.topics), then generate text with its KV cache,
printed as it comes: one prefill pass over the prompt, then one token per
step feeding only the new token (static cache of `block` positions written in
place with index_copy_).

    python examples/llama/train.py                        # tpu, strict eager
    python examples/llama/train.py --mode defer           # DeferAndFuse
    python examples/llama/train.py --compare              # strict, then defer: throughput of both
    python examples/llama/train.py --device cpu --steps 50 --save ckpt.pt
    python examples/llama/train.py --load ckpt.pt --steps 0 --sample-chars 500   # only generate
    python examples/llama/train.py --layers 6 --width 256 --heads 8 --kv-heads 2 --block 128
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from examples import common  # noqa: E402
from examples.llama.model import Llama, default_hidden  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = common.parser(__doc__, steps=200, batch_size=32, lr=3e-3)
    p.add_argument("--block", type=int, default=64, help="context length (characters; also the KV cache length)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (grouped-query attention; divides --heads)")
    p.add_argument("--hidden", type=int, default=None,
                   help="SwiGLU hidden size (default 8/3 of --width rounded up to a multiple of 32)")
    p.add_argument("--tie", action="store_true", help="tie the output head to the token embedding")
    p.add_argument("--sample-chars", type=int, default=300, help="characters to generate after training")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--prompt", default="The ")
    args = p.parse_args(argv)
    args.hidden = args.hidden or default_hidden(args.width)
    return args


def train(args: argparse.Namespace, data: common.CharData, mode: str) -> dict:
    with common.Run(args, mode, "Llama") as run:
        dev = run.device
        model = Llama(vocab=data.vocab, d=args.width, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                      hidden=args.hidden, block=args.block, tie=args.tie).to(dev)
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
        with torch.no_grad(), run.autocast():
            xv, yv = data.batch("val", args.batch_size, torch.Generator().manual_seed(1234))
            val = common.lm_loss(model(xv.to(dev)).float(), yv.to(dev)).item()
        prompt = torch.tensor([data.encode(args.prompt)], device=dev)
        print(f"\n--- generated with the KV cache ({args.device}/{mode}) ---\n{args.prompt}", end="", flush=True)
        t0 = time.perf_counter()
        out = model.generate(prompt, args.sample_chars, temperature=args.temperature, top_k=args.top_k,
                             generator=torch.Generator(dev).manual_seed(args.seed),
                             on_token=lambda t: print(data.decode(t.tolist()), end="", flush=True))
        text = data.decode(out[0].tolist())
        print("\n")
        gen_rate = args.sample_chars / max(time.perf_counter() - t0, 1e-9)
        run.result.update(val=val, bpc=val / math.log(2), sample=text, gen_tokens_per_s=gen_rate,
                          params=sum(p.numel() for p in model.parameters()))
        if args.save:
            common.save_checkpoint(args.save, model, opt, chars=data.chars)
    return run.result


def main(argv=None) -> int:
    return run(parse(argv))[0]


def run(args: argparse.Namespace) -> tuple[int, list[dict]]:
    if (rc := common.check(args)) is not None:
        return rc, []
    if args.width % args.heads or args.heads % args.kv_heads:
        print("--width must be a multiple of --heads, and --heads a multiple of --kv-heads", file=sys.stderr)
        return 2, []
    data = common.CharData(common.pydoc_text(), args.block)
    results = [train(args, data, m) for m in common.modes(args)]
    common.report(results, lambda r: f"{r['params'] / 1e6:.2f}M params, val loss {r['val']:.3f} "
                                     f"({r['bpc']:.2f} bits/char), generation {r['gen_tokens_per_s']:,.0f} tokens/s")
    return 0, results


if __name__ == "__main__":
    sys.exit(main())
