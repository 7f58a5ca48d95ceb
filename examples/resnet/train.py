"""Train a ResNet-18-style network on scikit-learn's digits (1797 8x8
grayscale images of the digits 0-9, shipped with scikit-learn): the images
are upsampled on the host (bilinear) to --image-size and normalized; 20 % of
each class is held out (fixed split). SGD with Nesterov momentum and a cosine
learning-rate decay; then the held-out set runs in inference mode
(model.eval() + torch.inference_mode()): accuracy and images/s.

    python examples/resnet/train.py                        # tpu, strict eager
    python examples/resnet/train.py --mode defer           # DeferAndFuse
    python examples/resnet/train.py --compare              # strict, then defer: throughput of both
    python examples/resnet/train.py --device cpu --epochs 1 --save resnet.pt
    python examples/resnet/train.py --load resnet.pt --steps 20
    python examples/resnet/train.py --image-size 32 --width 32 --epochs 5
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from examples import common  # noqa: E402
from examples.resnet.model import Digits, ResNet18  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = common.parser(__doc__, steps=90, batch_size=32, lr=0.05)
    p.add_argument("--epochs", type=float, help="train this many epochs (overrides --steps; the default 90 steps"
                                                   " of 32 images are about 2 epochs)")
    p.add_argument("--width", type=int, default=16, help="channels of the first stage (doubled per stage; default 16)")
    p.add_argument("--image-size", type=int, default=16, help="side the 8x8 digits are upsampled to (default 16)")
    p.add_argument("--eval-batch-size", type=int, default=128, help="batch of the inference pass (default 128)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    return p.parse_args(argv)


def evaluate(model: torch.nn.Module, data: Digits, run: common.Run) -> tuple[torch.Tensor, float]:
    """Predicted classes of the held-out set (on the host) and the wall time
    of the pass, device work included."""
    dev, bs = run.device, run.args.eval_batch_size
    model.eval()
    preds = []
    t0 = time.perf_counter()
    with torch.inference_mode(), run.autocast():
        for i in range(0, len(data.y_test), bs):
            logits = model(data.x_test[i:i + bs].to(dev))
            preds.append(logits.argmax(1).cpu())
    return torch.cat(preds), time.perf_counter() - t0


def train(args: argparse.Namespace, data: Digits, mode: str) -> dict:
    with common.Run(args, mode, "ResNet") as run:
        dev = run.device
        model = ResNet18(classes=data.classes, width=args.width, in_ch=1).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=args.momentum > 0,
                              weight_decay=args.weight_decay)
        if args.load:
            common.load_checkpoint(args.load, model, opt)
        batches = data.batches(args.batch_size, torch.Generator().manual_seed(args.seed))

        fwd = run.compile(model)
        def step(i: int) -> torch.Tensor:
            for group in opt.param_groups:  # cosine decay to 0 over the run
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * i / args.steps))
            x, y = next(batches)
            x, y = x.to(dev), y.to(dev)
            return run.update(opt, lambda: fwd(x), lambda logits: F.cross_entropy(logits, y))

        model.train()
        run.train(step, units_per_step=args.batch_size, unit="images")
        evaluate(model, data, run)  # warm-up: allocation, plan building for the eval shapes
        preds, secs = evaluate(model, data, run)
        run.result.update(accuracy=(preds == data.y_test).float().mean().item(), predictions=preds,
                          infer_throughput=len(preds) / secs)
        if args.save:
            common.save_checkpoint(args.save, model, opt, width=args.width, image_size=args.image_size)
    return run.result


def main(argv=None) -> int:
    return run(parse(argv))[0]


def run(args: argparse.Namespace) -> tuple[int, list[dict]]:
    if (rc := common.check(args)) is not None:
        return rc, []
    data = Digits(args.image_size)
    if args.epochs is not None:
        args.steps = max(1, round(args.epochs * (len(data.y_train) // args.batch_size)))
    results = [train(args, data, m) for m in common.modes(args)]
    common.report(results, lambda r: f"held-out accuracy {r['accuracy']:.1%} ({len(data.y_test)} images),"
                                     f" inference {r['infer_throughput']:,.0f} images/s")
    return 0, results


if __name__ == "__main__":
    sys.exit(main())
