"""Leaks and soak: training steps of the Llama example with device memory and
host RSS flat after warm-up, in strict and DeferAndFuse modes.

CI runs a bounded number of steps; ``make soak`` (``python -m tests.test_soak
--steps 1000``) the long run, printing the figures RELIABILITY.md quotes:
device bytes allocated / reserved at the end of each step (must not change
after warm-up) and the least-squares slope of host RSS per step.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Any

import pytest
import torch

import torch_tpu

WARMUP = 15
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _slope(ys: list[int]) -> float:
    n = len(ys)
    mx = (n - 1) / 2
    my = sum(ys) / n
    num = sum((i - mx) * (y - my) for i, y in enumerate(ys))
    den = sum((i - mx) ** 2 for i in range(n)) or 1
    return num / den


def soak(mode: str, steps: int, warmup: int = WARMUP) -> dict[str, Any]:
    """Trains a small Llama for warmup + steps steps; returns the per-step
    figures after warm-up."""
    from examples import common
    from examples.llama.model import Llama, default_hidden

    text = common.pydoc_text()[:200_000]
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text[:20_000]], dtype=torch.int64)
    torch.manual_seed(0)
    with torch_tpu.execution_mode(mode):
        model = Llama(vocab=len(vocab), d=64, layers=2, heads=4, kv_heads=2, hidden=default_hidden(64),
                      block=32).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        g = torch.Generator().manual_seed(1)
        alloc, reserved, rss, losses = [], [], [], []
        for i in range(warmup + steps):
            ix = torch.randint(0, data.numel() - 33, (8,), generator=g)
            x = torch.stack([data[j:j + 32] for j in ix]).to("tpu")
            y = torch.stack([data[j + 1:j + 33] for j in ix]).to("tpu")
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            del x, y, logits, loss
            if i >= warmup:
                gc.collect()
                torch.tpu.synchronize()
                alloc.append(torch.tpu.memory_allocated())
                reserved.append(torch.tpu.memory_reserved())
                rss.append(_rss())
    return {"mode": mode, "steps": steps, "alloc": alloc, "reserved": reserved, "rss": rss,
            "rss_slope_bytes_per_step": _slope(rss), "loss_first": losses[0], "loss_last": losses[-1]}


def _check(r: dict[str, Any], rss_budget: float) -> None:
    assert r["loss_last"] < r["loss_first"], "the model does not train"
    assert len(set(r["alloc"])) == 1, f"device memory allocated changes after warm-up: {sorted(set(r['alloc']))}"
    assert len(set(r["reserved"])) == 1, f"device memory reserved grows after warm-up: {sorted(set(r['reserved']))}"
    growth = r["rss_slope_bytes_per_step"] * r["steps"]
    assert growth < rss_budget, (f"host RSS grows {r['rss_slope_bytes_per_step']:.0f} B/step "
                                 f"({growth / 2**20:.1f} MiB over {r['steps']} steps)")


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_soak_memory_flat(mode):
    r = soak(mode, steps=40)
    _check(r, rss_budget=4 * 2**20)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="soak: Llama training steps, device memory and host RSS after warm-up")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--modes", default="strict,defer")
    a = ap.parse_args(argv)
    rc = 0
    for mode in a.modes.split(","):
        r = soak(mode, a.steps)
        print(f"{mode}: {a.steps} steps after {WARMUP} warm-up: device allocated {min(r['alloc'])}..{max(r['alloc'])} B, "
              f"reserved {min(r['reserved'])}..{max(r['reserved'])} B, host RSS {r['rss'][0] / 2**20:.1f} -> "
              f"{r['rss'][-1] / 2**20:.1f} MiB, slope {r['rss_slope_bytes_per_step']:.1f} B/step, "
              f"loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}", flush=True)
        try:
            _check(r, rss_budget=16 * 2**20)
        except AssertionError as exc:
            print(f"{mode}: FAIL: {exc}")
            rc = 1
    return rc


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
