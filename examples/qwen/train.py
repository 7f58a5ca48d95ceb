"""Train a small Hugging Face transformers Qwen3 (Qwen3ForCausalLM: grouped-query
attention, RMSNorm, rotary positions, SwiGLU) as a character-level language
model on the text of Python's own documentation (pydoc_data.topics), then
generate text from it with model.generate() -- greedy and sampled.

Everything stays offline (HF_HUB_OFFLINE=1, no tokenizer download): the
vocabulary is the text's characters plus <pad>, <bos>, <eos>. The model is
built from a Qwen3Config on the CPU with --seed, written with save_pretrained
to --model-dir, loaded back with from_pretrained and moved to the device, so
every device and mode starts from the same weights. The loss is the model's
own: model(tokens, labels=tokens).loss. The attention implementation is
chosen with --attn (default sdpa, i.e. torch scaled_dot_product_attention;
eager is transformers' explicit matmul/softmax path).

--save DIR / --load DIR are save_pretrained / from_pretrained folders (the
model, plus chars.json with the vocabulary and optimizer.pt with the AdamW
state, so --load continues the training).

    python examples/qwen/train.py                          # tpu, strict mode, sdpa attention
    python examples/qwen/train.py --mode defer             # DeferAndFuse
    python examples/qwen/train.py --compare                # strict, then defer: throughput of both
    python examples/qwen/train.py --attn eager --steps 50
    python examples/qwen/train.py --device cpu --steps 50 --save /tmp/qwen-ck
    python examples/qwen/train.py --load /tmp/qwen-ck --steps 50
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: an accidental download fails loudly

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from examples import common  # noqa: E402
from examples.qwen import model as qwen  # noqa: E402

import transformers  # noqa: E402

transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bars between ours

PROMPT = "The "


def parse(argv=None) -> argparse.Namespace:
    p = common.parser(__doc__, steps=150, batch_size=16, lr=3e-3)
    p.add_argument("--block", type=int, default=64, help="context length in characters (default 64)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size (default 128)")
    p.add_argument("--heads", type=int, default=4, help="query heads (default 4)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads, < --heads: GQA (default 2)")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                   help="transformers attention implementation (default sdpa)")
    p.add_argument("--model-dir", help="folder for the freshly built model's save_pretrained "
                                       "(default: a temporary folder, removed at the end)")
    p.add_argument("--gen-tokens", type=int, default=200, help="characters to generate after training (default 200)")
    return p.parse_args(argv)


def _vocab_file(folder: str) -> str:
    return os.path.join(folder, "chars.json")


def initial_model(args: argparse.Namespace, data: common.CharData, folder: str) -> None:
    """Builds the Qwen3 on the CPU from --seed and writes it (and the
    vocabulary) to folder with save_pretrained."""
    cfg = qwen.config(data.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                      max_positions=max(512, args.block + len(PROMPT) + args.gen_tokens))
    qwen.build(cfg, args.seed, args.attn).save_pretrained(folder)
    with open(_vocab_file(folder), "w") as f:
        json.dump(data.chars, f)


def train(args: argparse.Namespace, data: common.CharData, mode: str, folder: str) -> dict:
    with common.Run(args, mode, f"Qwen3[{args.attn}]") as run:
        dev = run.device
        model = qwen.load(folder, args.attn).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        if args.load and os.path.exists(os.path.join(args.load, "optimizer.pt")):
            opt.load_state_dict(torch.load(os.path.join(args.load, "optimizer.pt"), map_location="cpu"))
        g = torch.Generator().manual_seed(args.seed)

        fwd = run.compile(model)
        def step(i: int) -> torch.Tensor:
            x, _ = data.batch("train", args.batch_size, g)
            x = x.to(dev)
            return run.update(opt, lambda: fwd(input_ids=x, labels=x, use_cache=False).loss, lambda loss: loss)

        model.train()
        run.train(step, units_per_step=args.batch_size * (args.block - 1), unit="tokens")
        model.eval()
        with torch.no_grad():
            xv, _ = data.batch("val", args.batch_size, g)
            xv = xv.to(dev)
            out = model(input_ids=xv, labels=xv, use_cache=False)
            pred = out.logits[:, :-1].argmax(-1)
            acc = (pred == xv[:, 1:]).float().mean().item()
            val = out.loss.item()
            probe = out.logits[:2].float().cpu()
        prompt = torch.tensor([data.encode(PROMPT)], device=dev)
        mask = torch.ones_like(prompt)
        greedy = model.generate(prompt, attention_mask=mask, max_new_tokens=args.gen_tokens, do_sample=False)
        torch.manual_seed(args.seed)
        sampled = model.generate(prompt, attention_mask=mask, max_new_tokens=args.gen_tokens, do_sample=True,
                                 temperature=0.8, top_k=20)
        greedy_ids, sampled_ids = greedy[0].tolist(), sampled[0].tolist()
        run.result.update(val=val, val_acc=acc, probe_ids=xv[:2].cpu(), probe_logits=probe, greedy_ids=greedy_ids,
                          greedy=_decode(data, greedy_ids), sample=_decode(data, sampled_ids))
        if args.save:
            model.save_pretrained(args.save)
            with open(_vocab_file(args.save), "w") as f:
                json.dump(data.chars, f)
            host = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.detach().cpu(), opt.state_dict())
            torch.save(host, os.path.join(args.save, "optimizer.pt"))
    return run.result


def _decode(data: common.CharData, ids: list[int]) -> str:
    """Characters of ids; the special tokens show as <pad>, <bos>, <eos>."""
    return "".join(data.chars[i] if i < data.vocab else qwen.SPECIALS[i - data.vocab] for i in ids)


def main(argv=None) -> int:
    return run(parse(argv))[0]


def run(args: argparse.Namespace) -> tuple[int, list[dict]]:
    if (rc := common.check(args)) is not None:
        return rc, []
    data = common.CharData(common.pydoc_text(), args.block)
    tmp = None
    if args.load:
        with open(_vocab_file(args.load)) as f:
            if json.load(f) != data.chars:
                print(f"--load {args.load}: its vocabulary is not this text's", file=sys.stderr)
                return 2, []
        folder = args.load
    else:
        folder = args.model_dir or (tmp := tempfile.mkdtemp(prefix="qwen3-"))
        initial_model(args, data, folder)
    try:
        results = [train(args, data, m, folder) for m in common.modes(args)]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    for r in results:
        print(f"\n--- greedy ({r['mode']}) ---\n{r['greedy']}\n--- sampled, T=0.8 top-k 20 ({r['mode']}) ---\n"
              f"{r['sample']}\n")
    common.report(results, lambda r: f"val loss {r['val']:.3f}, val next-char accuracy {r['val_acc']:.3f}")
    return 0, results


if __name__ == "__main__":
    sys.exit(main())
