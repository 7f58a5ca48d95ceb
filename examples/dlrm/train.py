"""Train a DLRM click-through-rate model on a SYNTHETIC click log, then report
its validation AUC and log loss.

The data is generated on the host from --data-seed (no download, no real
users): --dense-features Gaussian dense features and --tables sparse
categorical features, each a multi-hot bag of 1 to --max-bag (4) ids with
Zipf-like popularity over the table's rows; the click label is drawn from a
hidden random logistic model of the dense features, per-id effects and
pairwise table interactions, so there is real (noisy) signal to learn. The
last 10 % of the samples are the validation split; the hidden model's own
validation AUC is printed as the ceiling.

Model: bottom MLP on the dense features, one nn.EmbeddingBag(mode="sum") per
table (variable-length bags through offsets), pairwise dot-product interaction,
top MLP, one logit, BCEWithLogits loss; optimizer Adagrad (the usual choice
for recommendation embeddings; dense gradients, sparse=False).

    python examples/dlrm/train.py                         # tpu, strict eager
    python examples/dlrm/train.py --mode defer            # DeferAndFuse
    python examples/dlrm/train.py --compare               # strict, then defer: throughput of both
    python examples/dlrm/train.py --device cpu --steps 100 --save ckpt.pt
    python examples/dlrm/train.py --load ckpt.pt --steps 100 --seed 1     # resume (same data and size flags)
    python examples/dlrm/train.py --tables 4 --rows 5000 --emb-dim 32 --samples 100000
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from examples import common  # noqa: E402
from examples.dlrm.model import DLRM, SyntheticClickLog, auc  # noqa: E402

DEFAULT_ROWS = (400, 800, 1600, 3000, 300, 1200, 600, 2000)


def parse(argv=None) -> argparse.Namespace:
    p = common.parser(__doc__, steps=300, batch_size=256, lr=0.01)
    p.add_argument("--tables", type=int, default=8, help="sparse features (embedding tables), default 8")
    p.add_argument("--rows", default=None,
                   help="ids per table: one number for all tables or a comma list "
                        f"(default {','.join(map(str, DEFAULT_ROWS))}, cycled to --tables)")
    p.add_argument("--emb-dim", type=int, default=16, help="embedding width (= bottom-MLP output), default 16")
    p.add_argument("--dense-features", type=int, default=13, help="default 13")
    p.add_argument("--samples", type=int, default=50_000, help="synthetic samples, 10%% held out (default 50000)")
    p.add_argument("--max-bag", type=int, default=4, help="bags hold 1..max-bag ids (default 4)")
    p.add_argument("--bottom", default="64,32", help="bottom-MLP hidden widths (default 64,32)")
    p.add_argument("--top", default="64,32", help="top-MLP hidden widths (default 64,32)")
    p.add_argument("--data-seed", type=int, default=0,
                   help="seed of the synthetic click log (--seed sets the model's init and the batch order), default 0")
    p.add_argument("--eval-batch", type=int, default=1024, help="validation batch size (default 1024)")
    return p.parse_args(argv)


def table_rows(args: argparse.Namespace) -> list[int]:
    src = [int(r) for r in args.rows.split(",")] if args.rows else list(DEFAULT_ROWS)
    return [src[i % len(src)] for i in range(args.tables)]


def widths(s: str) -> list[int]:
    return [int(w) for w in s.split(",") if w.strip()]


def make_data(args: argparse.Namespace) -> SyntheticClickLog:
    return SyntheticClickLog(samples=args.samples, dense_features=args.dense_features, rows=table_rows(args),
                             max_bag=args.max_bag, seed=args.data_seed)


@torch.no_grad()
def evaluate(model: DLRM, data: SyntheticClickLog, dev: torch.device, size: int, run: common.Run) -> dict:
    """Validation AUC and log loss (host-side, over the whole split)."""
    model.eval()
    idx = data.split("val")
    logits = []
    for s in range(0, len(idx), size):
        (x, i, o), _ = data.batch(idx[s:s + size])
        with run.autocast():
            logits.append(model(x.to(dev), i.to(dev), o.to(dev)).float().cpu())
    model.train()
    z, y = torch.cat(logits), data.clicks[idx]
    return {"auc": auc(z, y), "logloss": float(F.binary_cross_entropy_with_logits(z, y)),
            "pred_ctr": float(torch.sigmoid(z).mean())}


def train(args: argparse.Namespace, data: SyntheticClickLog, mode: str) -> dict:
    with common.Run(args, mode, "DLRM") as run:
        dev = run.device
        model = DLRM(args.dense_features, data.rows, emb_dim=args.emb_dim, bottom=widths(args.bottom),
                     top=widths(args.top)).to(dev)
        opt = torch.optim.Adagrad(model.parameters(), lr=args.lr)
        if args.load:
            common.load_checkpoint(args.load, model, opt)
        g = torch.Generator().manual_seed(args.seed)
        train_idx = data.split("train")
        per_epoch = len(train_idx) // args.batch_size  # full batches only: one shape for every step
        if per_epoch < 1:
            raise SystemExit(f"--batch-size {args.batch_size} exceeds the {len(train_idx)} training samples")
        order: list[torch.Tensor] = []

        fwd = run.compile(model)
        def step(i: int) -> torch.Tensor:
            if i % per_epoch == 0:
                order[:] = [train_idx[torch.randperm(len(train_idx), generator=g)]]
            j = i % per_epoch
            (x, ix, off), y = data.batch(order[0][j * args.batch_size:(j + 1) * args.batch_size])
            x, ix, off, y = x.to(dev), ix.to(dev), off.to(dev), y.to(dev)
            return run.update(opt, lambda: fwd(x, ix, off), lambda logits: F.binary_cross_entropy_with_logits(logits, y))

        model.train()
        run.train(step, units_per_step=args.batch_size, unit="samples")
        run.result.update(evaluate(model, data, dev, args.eval_batch, run))
        if args.save:
            common.save_checkpoint(args.save, model, opt, rows=data.rows, emb_dim=args.emb_dim)
    return run.result


def main(argv=None) -> int:
    return run(parse(argv))[0]


def run(args: argparse.Namespace) -> tuple[int, list[dict]]:
    if (rc := common.check(args)) is not None:
        return rc, []
    data = make_data(args)
    print(f"synthetic click log: {data.n_train} train / {data.n - data.n_train} val samples, "
          f"{len(data.rows)} tables of {','.join(map(str, data.rows))} ids, click rate {data.click_rate('train'):.3f}, "
          f"hidden model's val AUC {data.oracle_auc('val'):.3f}")
    results = [train(args, data, m) for m in common.modes(args)]
    p, q = data.click_rate("train"), data.click_rate("val")
    base = -(q * math.log(p) + (1 - q) * math.log(1 - p))  # val log loss of predicting the train click rate
    common.report(results, lambda r: f"val AUC {r['auc']:.4f}, val log loss {r['logloss']:.4f} "
                                     f"(constant-rate baseline {base:.4f})")
    return 0, results


if __name__ == "__main__":
    sys.exit(main())
