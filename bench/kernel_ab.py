"""Where a DeferAndFuse step's device time goes against strict eager's, kernel
family by kernel family, paired in one process.

``python -m bench.kernel_ab [--workloads mingpt llama resnet] [--repeats 9] [--steps 3]``

A strict and a DeferAndFuse runner of each workload (bench/models.py) train
side by side; samples alternate between them every repeat, each sample is
``--steps`` steps under ``torch_tpu.profiler.profile`` (kernels as the stream
workers ran them, with their device durations). Every kernel is put in a
family by its name — the products (gemm), attention, convolution, norms,
softmax, dropout, GELU / SiLU, copies, the optimizer, recomputations (units
DeferAndFuse inserts to recompute a value instead of keeping it), other
fused groups, the rest — and per family the median device time a step of
each mode is printed with the median and quartiles of the paired ratios
defer / strict. On a shared host whose speed drifts, the paired ratio of
one family holds still where separate runs (TORCH_TPU_KERNEL_TIMES) do not,
so this names the kernels that make a deferred step slower or faster than
a strict one. The profiler's host recorder slows the host side of both
modes alike; step times are not reported (bench.defer measures them).
"""
from __future__ import annotations

import argparse
import re
import statistics

import torch

import torch_tpu
from bench import models
from bench.defer import WORKLOADS, Runner
from torch_tpu import profiler

# first match wins: (family, pattern over the kernel's base name)
FAMILIES = (
    ("recompute", r"^recompute\("),
    ("gemm", r"^(gemm|bgemm)"),
    ("attention", r"scaled_dot_product|attention"),
    ("convolution", r"^conv"),
    ("norm", r"(layer_norm|rms_norm|batch_norm|group_norm)"),
    ("softmax", r"softmax"),
    ("dropout", r"dropout"),
    ("activation", r"(gelu|silu|relu|threshold|sigmoid|tanh)"),
    ("copy", r"^(copy|fused\(copy)"),
    ("optimizer", r"foreach"),
    ("other fused", r"^fused\("),
)
_FAM = [(n, re.compile(p)) for n, p in FAMILIES]


def family(name: str) -> str:
    """The family of a kernel's base name (the name without its recording site)."""
    for n, p in _FAM:
        if p.search(name):
            return n
    return "other"


def sample(r: Runner, steps: int) -> dict[str, float]:
    """Device ns a step per family (and "all") over `steps` steps of r."""
    torch.tpu.synchronize()
    with profiler.profile(with_stack=False, record_shapes=False) as prof:
        for _ in range(steps):
            r.step()
        torch.tpu.synchronize()
    out: dict[str, float] = {"all": 0.0}
    for k in prof.kernels:
        f = family(k.base_name)
        out[f] = out.get(f, 0.0) + k.dur / steps
        out["all"] += k.dur / steps
    return out


def compare(name: str, repeats: int, steps: int, warmup: int = 4) -> dict[str, dict[str, float]]:
    """{family: {"strict_ms", "defer_ms", "ratio", "q1", "q3"}} of one workload."""
    base, batches, loss_fn = models.make(name)
    runners = {m: Runner("tpu", m, base, batches, loss_fn) for m in ("strict", "defer")}
    for r in runners.values():
        for _ in range(warmup):
            r.step()
    got: dict[str, list[dict[str, float]]] = {m: [] for m in runners}
    for i in range(repeats):
        order = ("strict", "defer") if i % 2 == 0 else ("defer", "strict")
        for m in order:
            got[m].append(sample(runners[m], steps))
    fams = sorted({f for m in got for s in got[m] for f in s},
                  key=lambda f: -statistics.median(s.get(f, 0.0) for s in got["strict"] + got["defer"]))
    res: dict[str, dict[str, float]] = {}
    for f in fams:
        s = [x.get(f, 0.0) for x in got["strict"]]
        d = [x.get(f, 0.0) for x in got["defer"]]
        ratios = sorted(b / a for a, b in zip(s, d) if a > 0)
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [float("nan")] * 3
        res[f] = {"strict_ms": statistics.median(s) / 1e6, "defer_ms": statistics.median(d) / 1e6,
                  "ratio": statistics.median(ratios) if ratios else float("nan"), "q1": q[0], "q3": q[2]}
    return res


def table(name: str, res: dict[str, dict[str, float]]) -> str:
    lines = [f"{name}: device ms a step by kernel family (medians; paired defer / strict with quartiles)",
             f"  {'family':<13} {'strict':>8} {'defer':>8}  defer / strict"]
    for f, v in res.items():
        ratio = f"{v['ratio']:.2f} [{v['q1']:.2f}, {v['q3']:.2f}]" if v["strict_ms"] > 0 else "(defer only)"
        lines.append(f"  {f:<13} {v['strict_ms']:8.2f} {v['defer_ms']:8.2f}  {ratio}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=3, help="steps a sample")
    a = ap.parse_args()
    torch_tpu.set_execution_mode("strict")
    for w in a.workloads:
        print(table(w, compare(w, a.repeats, a.steps)), flush=True)


if __name__ == "__main__":
    main()
