"""FFT benchmark: tpu vs CPU torch.fft on one long transform (2^20) and a
batch (1024 lines of 1024 / a 1024×1024 2-d transform), float32."""
from __future__ import annotations

import os

import torch

import torch_tpu  # noqa: F401
from bench.common import interleaved, markdown_table

CASES = [
    ("rfft", (1 << 20,), lambda x: torch.fft.rfft(x), False),
    ("fft", (1 << 20,), lambda x: torch.fft.fft(x), True),
    ("rfft (batch 1024 × 1024)", (1024, 1024), lambda x: torch.fft.rfft(x), False),
    ("fft (batch 1024 × 1024)", (1024, 1024), lambda x: torch.fft.fft(x), True),
    ("rfft2 1024 × 1024", (1024, 1024), lambda x: torch.fft.rfft2(x), False),
    ("fft2 1024 × 1024", (1024, 1024), lambda x: torch.fft.fft2(x), True),
]


def fft(repeats: int) -> tuple[dict, str]:
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    rows, res = [], []
    for name, shape, fn, cplx in CASES:
        x = torch.randn(shape, dtype=torch.complex64 if cplx else torch.float32)
        dx = x.to("tpu")

        def dev(dx=dx, fn=fn):
            fn(dx)
            torch.tpu.synchronize()

        t = interleaved({"cpu": lambda x=x, fn=fn: fn(x), "tpu": dev}, repeats=repeats)
        res.append({"case": name, "shape": list(shape), "seconds": t})
        rows.append([name, f"{t['cpu'] * 1e3:.2f}", f"{t['tpu'] * 1e3:.2f}", f"{t['cpu'] / t['tpu']:.2f}×"])
    table = markdown_table(["transform (float32)", "CPU torch.fft ms", "tpu ms", "tpu speed / CPU"], rows)
    return {"rows": res}, table
