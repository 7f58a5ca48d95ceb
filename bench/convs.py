"""Every convolution of a workload, bf16 (or float32), tpu vs CPU torch, pass by pass.

``python -m bench convs [--quick|--full] [--workloads resnet unet] [--conv-dtype bfloat16|float32] [--repeats N]``

The shapes come from one forward pass of the example's model (forward hooks
on its Conv2d / ConvTranspose2d layers: input, weight, stride, padding, and
how many layers share them). Each shape's forward pass, input gradient and
weight gradient (``aten.convolution_backward`` with one output asked for)
is timed alone on each device with bf16 operands — what an autocast training
step runs — (``--conv-dtype float32``: float32 ones, what an f32 step runs) as back-to-back calls and one synchronize per sample, the
devices alternating in every repeat; the median is reported. The last line
weighs each shape by its count: the convolutions' share of a step, per pass.
"""
from __future__ import annotations

import collections
import statistics
import time

import torch
import torch.nn.functional as F

from bench import matrix
from bench.common import settle


def shapes(name: str, preset: str) -> list[tuple[tuple, int]]:
    """[((transposed, x shape, w shape, stride, padding), count)], most
    frequent first."""
    model, batches, _ = matrix.load(name, preset)
    seen: collections.Counter = collections.Counter()

    def hook(m, inp, out):
        seen[(isinstance(m, torch.nn.ConvTranspose2d), tuple(inp[0].shape), tuple(m.weight.shape), tuple(m.stride),
              tuple(m.padding))] += 1

    hooks = [m.register_forward_hook(hook) for m in model.modules()
             if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]
    x = batches[0][0]
    with torch.no_grad():
        model(*x) if isinstance(x, (tuple, list)) else model(x)
    for h in hooks:
        h.remove()
    return sorted(seen.items(), key=lambda kv: -kv[1])


def _passes(key: tuple, dev: str, dtype: torch.dtype = torch.bfloat16):
    """The three passes of one shape on dev, as callables."""
    tr, xs, ws, st, pd = key
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*xs, generator=g).to(dtype).to(dev)
    w = torch.randn(*ws, generator=g).to(dtype).to(dev)
    conv = F.conv_transpose2d if tr else F.conv2d
    y = conv(x, w, stride=st, padding=pd)
    gy = torch.randn(y.shape, generator=g).to(dtype).to(dev)
    args = (gy, x, w, None, list(st), list(pd), [1, 1], tr, [0, 0], 1)
    return (lambda: conv(x, w, stride=st, padding=pd),
            lambda: torch.ops.aten.convolution_backward(*args, [True, False, False]),
            lambda: torch.ops.aten.convolution_backward(*args, [False, True, False]))


def _time(fn, dev: str, calls: int) -> float:
    """Microseconds a call over `calls` back-to-back calls (after one untimed)."""
    fn()
    matrix._sync(dev)
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    matrix._sync(dev)
    return (time.perf_counter() - t) / calls * 1e6


def run(preset: str = "quick", workloads=("resnet", "unet"), repeats: int = 5, calls: int = 5,
        dtype: torch.dtype = torch.bfloat16) -> tuple[dict, str]:
    res: dict = {"preset": preset, "dtype": str(dtype).removeprefix("torch."), "workloads": {}}
    parts = []
    for name in workloads:
        rows, tot = [], {"cpu": [0.0, 0.0, 0.0], "tpu": [0.0, 0.0, 0.0]}
        for key, count in shapes(name, preset):
            fns = {d: _passes(key, d, dtype) for d in ("cpu", "tpu")}
            us = {d: [] for d in fns}
            for i in range(3):
                samples = {d: [] for d in fns}
                for r in range(repeats):
                    for d in (("cpu", "tpu") if r % 2 == 0 else ("tpu", "cpu")):
                        settle()
                        samples[d].append(_time(fns[d][i], d, calls))
                for d in fns:
                    us[d].append(statistics.median(samples[d]))
                    tot[d][i] += us[d][i] * count
            tr, xs, ws, st, pd = key
            rows.append({"transposed": tr, "x": list(xs), "w": list(ws), "stride": list(st), "padding": list(pd),
                         "count": count, "cpu_us": us["cpu"], "tpu_us": us["tpu"]})
        res["workloads"][name] = {"shapes": rows, "step_ms": {d: [v / 1e3 for v in t] for d, t in tot.items()}}
        lines = [f"{name} ({preset} preset), {res['dtype']}, µs a call, CPU / tpu (ratio > 1: tpu faster):", "",
                 "| x | w | stride, padding | layers | forward | input gradient | weight gradient |",
                 "|---|---|---|---|---|---|---|"]
        for row in rows:
            cells = [f"{c:.0f} / {t:.0f} ({c / t:.2f}×)" for c, t in zip(row["cpu_us"], row["tpu_us"])]
            kind = "transposed, " if row["transposed"] else ""
            lines.append(f"| {row['x']} | {row['w']} | {kind}{row['stride'][0]}, {row['padding'][0]} | {row['count']} | "
                         + " | ".join(cells) + " |")
        sm = res["workloads"][name]["step_ms"]
        lines.append(f"| **a step** | | | | " + " | ".join(
            f"**{c:.1f} / {t:.1f} ms ({c / t:.2f}×)**" for c, t in zip(sm["cpu"], sm["tpu"])) + " |")
        parts.append("\n".join(lines))
    return res, "\n\n".join(parts)
