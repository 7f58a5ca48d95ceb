"""DeferAndFuse fusion patterns, each with its fusion off and on (suite ``fusion`` of ``python -m bench``).

Every pattern is a small deferred graph that one of the planner's fusions
targets; it runs with the setting that turns the fusion off and with it on
(the runtime reads these settings when it records or plans, and keeps them
in the plan's key, so each configuration has its own cached plans), side by
side in one process: samples alternate every repeat and the paired ratio
time(off) / time(on) is reported (above 1: the fusion is faster), with the
kernels launched and the bytes that never took memory per run.

  rmsnorm          x * rsqrt(mean(x^2) + eps) * w, forward and backward  TORCH_TPU_DEFER_PROLOGUE
  row sums         (a * b).sum(-1), the backward of a norm's scale       TORCH_TPU_DEFER_PROLOGUE
  logsumexp        (x * s + m).logsumexp(-1), a loss's normalizer         TORCH_TPU_DEFER_PROLOGUE
  norm scale       rsqrt(mean(x^2) + eps): the group after the mean       TORCH_TPU_DEFER_REDUCE_EPILOGUE
  softmax sum      w / exp(x).sum(-1): the group after the sum            TORCH_TPU_DEFER_REDUCE_EPILOGUE
  autocast casts   (x_bf16.float() * w + r).to(bf16), amp's casts         TORCH_TPU_DEFER_COPIES
  linear epilogue  gelu(x @ W^T + b) + r, a product and its epilogue     TORCH_TPU_DEFER_EPILOGUE (off by default)
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch

import torch_tpu
from bench.common import markdown_table, settle

ROWS, COLS = 4096, 512


def _patterns() -> list[tuple[str, str, tuple[str, str], Callable[[], object]]]:
    g = torch.Generator().manual_seed(0)

    def dev(*shape, dtype=torch.float32, grad=False):
        return torch.randn(*shape, generator=g).to("tpu", dtype).requires_grad_(grad)

    x, w = dev(ROWS, COLS, grad=True), dev(COLS, grad=True)
    a, b, w_rows = dev(ROWS, COLS), dev(ROWS, COLS), dev(ROWS)
    xb, r = dev(2048, 1024, dtype=torch.bfloat16), dev(2048, 1024)
    w1 = dev(1024)
    xl, wl, bl, rl = dev(1024, 512), dev(1024, 512), dev(1024), dev(1024, 1024)

    def rmsnorm():
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        x.grad = w.grad = None
        y.backward(a)
        return x.grad, w.grad

    prologue = ("TORCH_TPU_DEFER_PROLOGUE", ("0", "1"))
    return [
        ("rmsnorm fwd+bwd", f"[{ROWS}, {COLS}] f32", *prologue, rmsnorm),
        ("row sums", f"[{ROWS}, {COLS}] f32", *prologue, lambda: (a * b).sum(-1)),
        ("logsumexp", f"[{ROWS}, {COLS}] f32", *prologue, lambda: (a * 0.5 + b).logsumexp(-1)),
        ("norm scale", f"[{ROWS}, {COLS}] f32", "TORCH_TPU_DEFER_REDUCE_EPILOGUE", ("0", "1"),
         lambda: torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)),
        ("softmax sum", f"[{ROWS}, {COLS}] f32", "TORCH_TPU_DEFER_REDUCE_EPILOGUE", ("0", "1"),
         lambda: w_rows / a.exp().sum(-1)),
        ("autocast casts", "[2048, 1024] bf16 / f32", "TORCH_TPU_DEFER_COPIES", ("0", "1"),
         lambda: (xb.float() * w1 + r).to(torch.bfloat16)),
        ("linear epilogue", "[1024, 512] @ [512, 1024]", "TORCH_TPU_DEFER_EPILOGUE", ("0", "1"),
         lambda: torch.nn.functional.gelu(torch.nn.functional.linear(xl, wl, bl)) + rl),
    ]


def _sample(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of `calls` graphs, each cut by a synchronize."""
    settle()
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn()
        torch.tpu.synchronize()
        del out
    return (time.perf_counter() - t0) / calls


def run(repeats: int, calls: int = 10) -> tuple[dict, str]:
    """{pattern: figures}, and the Markdown table."""
    previous_mode = torch_tpu.set_execution_mode("defer")
    res: dict[str, dict] = {}
    rows = []
    try:
        for name, shape, var, values, fn in _patterns():
            old = os.environ.get(var)
            try:
                stats = {}
                for v in values:  # warm-up: plans built and cached, kernel counts taken
                    os.environ[var] = v
                    for _ in range(2):
                        fn()
                        torch.tpu.synchronize()
                    torch.tpu.reset_defer_stats()
                    out = fn()  # alive at the cut, as in the samples
                    torch.tpu.synchronize()
                    stats[v] = torch.tpu.defer_stats()
                    del out
                t: dict[str, list[float]] = {v: [] for v in values}
                for i in range(repeats):
                    for v in (values if i % 2 == 0 else values[::-1]):
                        os.environ[var] = v
                        t[v].append(_sample(fn, calls))
            finally:
                if old is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = old
            off, on = values
            ratios = sorted(p / q for p, q in zip(t[off], t[on]))
            n = len(ratios)
            res[name] = {
                "shape": shape, "setting": var,
                "ms": {v: statistics.median(t[v]) * 1e3 for v in values},
                "ratio": {"q1": ratios[n // 4], "median": statistics.median(ratios), "q3": ratios[(3 * n) // 4]},
                "kernels": {v: stats[v]["kernels_launched"] for v in values},
                "bytes_never_materialized": {v: stats[v]["bytes_never_materialized"] for v in values},
            }
            r = res[name]
            rows.append([name, shape, f"`{var}`", f"{r['ms'][off]:.3f}", f"{r['ms'][on]:.3f}",
                         f"**{r['ratio']['median']:.2f}×** [{r['ratio']['q1']:.2f}, {r['ratio']['q3']:.2f}]",
                         f"{r['kernels'][off]} → {r['kernels'][on]}",
                         f"{r['bytes_never_materialized'][off] / 2**20:.1f} → "
                         f"{r['bytes_never_materialized'][on] / 2**20:.1f}"])
    finally:
        torch_tpu.set_execution_mode(previous_mode)
    table = markdown_table(["pattern", "shape", "setting (off → on)", "ms off", "ms on",
                            "time off / on (median [q1, q3] of pairs)", "kernels", "MiB never in memory"], rows)
    return res, table
