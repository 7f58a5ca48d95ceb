"""Train a small UNet as a DDPM noise predictor on scikit-learn's handwritten
digits (load_digits: 1797 8x8 images, upsampled bilinearly to 16x16 or 32x32
and scaled to [-1, 1]), then sample images with the reverse process on the
device and write them as a PNG grid.

Training: a timestep t ~ U{0..T-1} and noise eps ~ N(0, I) per image, both
drawn on the host from a seeded torch.Generator and moved to the device (so
tpu and cpu see the same numbers); loss = MSE(eps_theta(x_t, t), eps).
Sampling: --sample-steps evenly spaced timesteps of the T with the DDIM
update; --eta 1 (default) is the ancestral DDPM sampler respaced to those
steps, --eta 0 deterministic DDIM. Its noise comes from a device generator
(torch.Generator(device)). Reported: final training loss, held-out noise MSE
(fixed host noise on the 10 % validation split) and the sampling time.

    python examples/unet/train.py                          # tpu, strict eager
    python examples/unet/train.py --mode defer             # DeferAndFuse
    python examples/unet/train.py --compare                # strict, then defer: throughput of both
    python examples/unet/train.py --device cpu --steps 50 --save unet.pt
    python examples/unet/train.py --load unet.pt --steps 100 --sample-count 64 --samples-png digits.png
    python examples/unet/train.py --size 32 --down avgpool --up convT --schedule linear --timesteps 1000
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
from examples.unet.model import Diffusion, UNet  # noqa: E402

PAD, SCALE = 2, 2  # PNG grid: pixels between/around tiles, magnification of each tile


def parse(argv=None) -> argparse.Namespace:
    p = common.parser(__doc__, steps=300, batch_size=32, lr=2e-3)
    p.add_argument("--size", type=int, default=16, choices=[16, 32], help="image side after upsampling the 8x8 digits")
    p.add_argument("--base", type=int, default=32, help="channels of the first UNet level (default 32)")
    p.add_argument("--mults", default="1,2,2", help="channel multipliers per level (default 1,2,2)")
    p.add_argument("--no-attention", action="store_true", help="no self-attention block at the lowest resolution")
    p.add_argument("--down", default="conv", choices=["conv", "avgpool"], help="stride-2 conv or 2x2 avg pooling")
    p.add_argument("--up", default="nearest", choices=["nearest", "convT"],
                   help="nearest upsample + conv, or ConvTranspose2d")
    p.add_argument("--schedule", default="cosine", choices=["cosine", "linear"], help="beta schedule")
    p.add_argument("--timesteps", type=int, default=500, help="diffusion steps T (default 500)")
    p.add_argument("--sample-count", type=int, default=16, help="images to sample after training (0: none)")
    p.add_argument("--sample-steps", type=int, default=50, help="reverse steps (evenly spaced out of T; default 50)")
    p.add_argument("--eta", type=float, default=1.0, help="DDIM eta: 1 = respaced ancestral DDPM, 0 = DDIM")
    p.add_argument("--samples-png", default="unet_samples.png", help="PNG grid of the samples (default %(default)s; with --compare one file per"
                        " mode: unet_samples.strict.png, unet_samples.defer.png; '' for none)")
    return p.parse_args(argv)


def digits(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) images [N, 1, size, size] in [-1, 1]; a fixed 90/10 split."""
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 16.0  # [1797, 1, 8, 8] in [0, 1]
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1) * 2 - 1
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1234))
    n = int(0.9 * len(x))
    return x[perm[:n]].contiguous(), x[perm[n:]].contiguous()


def grid(imgs: torch.Tensor) -> torch.Tensor:
    """uint8 [H, W] grid of [N, 1, h, w] images in [-1, 1]: ceil(sqrt(N))
    columns, each tile magnified SCALE times, PAD black pixels around tiles."""
    n, _, h, w = imgs.shape
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    h, w = h * SCALE, w * SCALE
    px = ((imgs.detach().float().cpu()[:, 0] + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    px = px.repeat_interleave(SCALE, dim=1).repeat_interleave(SCALE, dim=2)
    out = torch.zeros(rows * h + (rows + 1) * PAD, cols * w + (cols + 1) * PAD, dtype=torch.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        y, x = PAD + r * (h + PAD), PAD + c * (w + PAD)
        out[y:y + h, x:x + w] = px[i]
    return out


def build(args: argparse.Namespace) -> UNet:
    mults = tuple(int(m) for m in args.mults.split(","))
    return UNet(channels=1, base=args.base, mults=mults, attention=not args.no_attention, down=args.down, up=args.up)


def train(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor], mode: str) -> dict:
    xtrain, xval = data
    with common.Run(args, mode, "UNet-DDPM") as run:
        dev = run.device
        model = build(args).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        if args.load:
            common.load_checkpoint(args.load, model, opt)
        diff = Diffusion(args.schedule, args.timesteps, dev)
        g = torch.Generator().manual_seed(args.seed)
        fwd = run.compile(model)

        def step(i: int) -> torch.Tensor:
            b = args.batch_size
            idx = torch.randint(len(xtrain), (b,), generator=g)
            t = torch.randint(diff.T, (b,), generator=g)
            noise = torch.randn((b, 1, args.size, args.size), generator=g)
            loss = diff.loss(fwd, xtrain[idx].to(dev), t.to(dev), noise.to(dev), run.autocast())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        model.train()
        run.train(step, units_per_step=args.batch_size, unit="images")
        model.eval()
        gv = torch.Generator().manual_seed(10_000 + args.seed)  # the same held-out noise for every run
        with torch.no_grad():
            tv = torch.randint(diff.T, (len(xval),), generator=gv)
            nv = torch.randn(xval.shape, generator=gv)
            val = diff.loss(model, xval.to(dev), tv.to(dev), nv.to(dev), run.autocast()).item()
        run.result.update(val=val)
        if args.sample_count > 0:
            gen = torch.Generator(dev).manual_seed(args.seed)
            t0 = time.perf_counter()
            imgs = diff.sample(model, (args.sample_count, 1, args.size, args.size), args.sample_steps, gen, dev,
                               eta=args.eta, autocast=run.autocast())
            imgs = imgs.cpu()
            run.result.update(sample_s=time.perf_counter() - t0, samples=imgs)
            if args.samples_png:
                common.write_png(args.samples_png, grid(imgs))
                run.result.update(png=args.samples_png)
        if args.save:
            common.save_checkpoint(args.save, model, opt, args={k: v for k, v in vars(args).items()
                                                               if k in ("size", "base", "mults", "no_attention",
                                                                        "down", "up", "schedule", "timesteps")})
    return run.result


def main(argv=None) -> int:
    return run(parse(argv))[0]


def run(args: argparse.Namespace) -> tuple[int, list[dict]]:
    if (rc := common.check(args)) is not None:
        return rc, []
    if args.sample_steps < 1:
        print("--sample-steps must be >= 1", file=sys.stderr)
        return 2, []
    data = digits(args.size)
    results = []
    for m in common.modes(args):
        if args.compare and args.samples_png:  # one PNG per mode: name.strict.png, name.defer.png
            root, ext = os.path.splitext(args.samples_png)
            sub = argparse.Namespace(**{**vars(args), "samples_png": f"{root}.{m}{ext or '.png'}"})
        else:
            sub = args
        results.append(train(sub, data, m))
    def extra(r: dict) -> str:
        s = f"held-out noise MSE {r['val']:.4f}"
        if "sample_s" in r:
            s += (f", sampled {args.sample_count} images x {min(args.sample_steps, args.timesteps)} steps in"
                  f" {r['sample_s']:.2f} s")
            if "png" in r:
                s += f" -> {r['png']}"
        return s

    common.report(results, extra)
    return 0, results


if __name__ == "__main__":
    sys.exit(main())
