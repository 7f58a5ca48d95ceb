"""Paired in-process A/B of a runtime setting on DeferAndFuse training steps.

``python -m bench.ab_env VAR A B [--workloads mingpt llama resnet] [--repeats 21] [--batch N] [--untimed N]``

Two DeferAndFuse runners of each workload (bench/models.py) train side by
side in one process; before each sample the environment variable VAR is
set to the runner's value (A or B). Settings that the runtime reads when it
plans a graph and keeps in the plan's key (TORCH_TPU_DEFER_EPILOGUE,
TORCH_TPU_DEFER_PROLOGUE, TORCH_TPU_DEFER_REDUCE_EPILOGUE, TORCH_TPU_DEFER_REMAT,
TORCH_TPU_DEFER_PAIRS,
TORCH_TPU_DEFER_CHAINS, TORCH_TPU_DEFER_PERMUTE, TORCH_TPU_DEFER_HOIST_PRODUCTS)
or when it records an op (TORCH_TPU_DEFER_COPIES) then give each runner its
own cached plans. A setting that acts from what the graphs before did
(TORCH_TPU_DEFER_EARLY: a graph is predicted after two graphs ran the same
plan) needs ``--untimed 2``: that many steps run untimed after the variable
is set, before each sample. Samples alternate in order every repeat (bench.common
time_steps: 3 steps and a synchronize); printed: the median step time of
each and the median and quartiles of the paired ratios time(A) / time(B)
(above 1: B is faster). On these shared hosts the paired ratio holds still
where separate runs drift."""
from __future__ import annotations

import argparse
import os
import statistics

import torch

from bench import models
from bench.common import settle, time_steps
from bench.defer import WORKLOADS, Runner


def ab(var: str, values: tuple[str, str], name: str, repeats: int, batch: int | None = None,
       warmup: int = 4, untimed: int = 0) -> dict:
    """{"ms": (median A, median B), "ratio": (q1, median, q3) of A / B}."""
    base, batches, loss_fn = models.make(name, batch)
    runners = [Runner("tpu", "defer", base, batches, loss_fn) for _ in values]
    previous = os.environ.get(var)
    try:
        for v, r in zip(values, runners):
            os.environ[var] = v
            for _ in range(warmup):
                r.step()
            torch.tpu.synchronize()
        t: list[list[float]] = [[], []]
        for i in range(repeats):
            for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                os.environ[var] = values[k]
                for _ in range(untimed):
                    runners[k].step()
                # the untimed steps' tails (a deferred step's loss.item() may return before its
                # backward pass ran) finish outside the sample
                torch.tpu.synchronize()
                settle()
                t[k].append(time_steps(runners[k].step, "tpu"))
    finally:
        if previous is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = previous
    ratios = sorted(a / b for a, b in zip(t[0], t[1]))
    q = len(ratios)
    return {"ms": (statistics.median(t[0]) * 1e3, statistics.median(t[1]) * 1e3),
            "ratio": (ratios[q // 4], statistics.median(ratios), ratios[(3 * q) // 4])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab_env", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("var", help="environment variable, e.g. TORCH_TPU_DEFER_EPILOGUE")
    p.add_argument("a", help="value of the first configuration")
    p.add_argument("b", help="value of the second configuration")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--repeats", type=int, default=21, help="samples per configuration (paired)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the workload's)")
    p.add_argument("--untimed", type=int, default=0,
                   help="steps run untimed after the variable is set, before each sample (default 0)")
    args = p.parse_args(argv)
    for name in args.workloads:
        r = ab(args.var, (args.a, args.b), name, args.repeats, args.batch, untimed=args.untimed)
        (ma, mb), (q1, med, q3) = r["ms"], r["ratio"]
        print(f"{name}: {args.var}={args.a} {ma:.1f} ms, ={args.b} {mb:.1f} ms; paired "
              f"time({args.a}) / time({args.b}) {med:.3f} [{q1:.3f}, {q3:.3f}]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
