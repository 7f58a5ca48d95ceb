"""Fused scaled_dot_product_attention benchmark: tpu (fused overrideable
backend) vs CPU ``F.scaled_dot_product_attention`` on the same shapes,
forward and forward+backward, float32."""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from bench.common import interleaved, markdown_table

# (B, H, L = S, D, causal)
SHAPES = [(8, 8, 256, 64, False), (4, 16, 1024, 64, True), (1, 32, 2048, 128, True)]


def _flops(B, H, L, D, causal, bwd):
    f = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)  # QK^T and PV
    return f * (3.5 if bwd else 1.0)  # backward: 5 products of the same size (recompute included)


def attention(repeats: int) -> tuple[dict, str]:
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    rows, res = [], []
    for B, H, L, D, causal in SHAPES:
        qkv = [torch.randn(B, H, L, D) for _ in range(3)]
        g = torch.randn(B, H, L, D)
        dqkv = [t.to("tpu") for t in qkv]
        dg = g.to("tpu")
        for bwd in (False, True):
            def run(ins, grad, dev):
                ins = [t.detach().requires_grad_(bwd) for t in ins]
                out = F.scaled_dot_product_attention(*ins, is_causal=causal)
                if bwd:
                    torch.autograd.grad(out, ins, grad)
                if dev:
                    torch.tpu.synchronize()

            t = interleaved({"cpu": lambda: run(qkv, g, False), "tpu": lambda: run(dqkv, dg, True)},
                            repeats=repeats, warmup=1)
            fl = _flops(B, H, L, D, causal, bwd)
            name = f"({B}, {H}, {L}, {D}){' causal' if causal else ''}"
            res.append({"shape": [B, H, L, D], "causal": causal, "bwd": bwd, "seconds": t})
            rows.append([name, "fwd+bwd" if bwd else "fwd", f"{t['cpu'] * 1e3:.1f}", f"{t['tpu'] * 1e3:.1f}",
                         f"{t['cpu'] / t['tpu']:.2f}×", f"{fl / t['tpu'] / 1e9:.1f}"])
    table = markdown_table(["shape (B, H, L=S, D)", "pass", "CPU ms", "tpu ms", "tpu speed-up vs CPU",
                            "tpu GFLOP/s"], rows)
    return {"rows": res}, "Fused scaled_dot_product_attention (float32) vs CPU SDPA:\n\n" + table
