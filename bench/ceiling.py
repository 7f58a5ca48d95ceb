"""How far fusion can take DeferAndFuse on the bench's training steps.

``python -m bench.ceiling [--workloads mingpt llama resnet] [--steps 20] [--repeats 3] [--record]``

Strict eager and DeferAndFuse run the same product, convolution and
attention kernels: fusion removes elementwise passes, reductions' inputs,
copies and host work around them, never those. For each workload child
processes train `--steps` steps (after 4 warm-up steps) in each mode with
TORCH_TPU_KERNEL_TIMES=1, and from the device's own per-kernel wall times
this prints the step time, the kernel time per step, the time in the
products / convolutions / attention per step, and the ceiling: strict's
step time over that time — the defer / strict speed-up a DeferAndFuse that
removed every other kernel and all host time would reach.

Each figure is the median over `--repeats` children per mode, the modes'
children alternating (strict, defer, defer, strict, ...): the shared hosts
have phases of seconds in which a core runs at about half speed, and one
child per mode put a whole mode in such a phase (strict 40 or 50 ms a
minGPT step in consecutive fresh processes on the same host). The spread
column gives each mode's lowest and highest step time.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import markdown_table, record

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("mingpt", "llama", "resnet")
WARMUP = 4
# kernels that run in every mode: products, convolutions (forward and both
# gradients) and fused attention (forward and backward)
FIXED = re.compile(r"^(gemm|bgemm|conv|aten::_scaled_dot_product)")
_ROW = re.compile(r"^\s+([0-9.]+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)%\s+(.+?)\s*$", re.M)

_CHILD = """
import sys, time, torch, torch_tpu
from bench import models
from bench.defer import Runner
name, mode, steps, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
base, batches, loss_fn = models.make(name)
r = Runner("tpu", mode, base, batches, loss_fn)
for _ in range(warmup):
    r.step()
torch.tpu.synchronize()
t = time.perf_counter()
for _ in range(steps):
    r.step()
torch.tpu.synchronize()
print("STEP_MS", (time.perf_counter() - t) / steps * 1e3)
"""


def measure(name: str, mode: str, steps: int) -> dict:
    """Step ms and kernel ms per step (all, fixed) of one child run."""
    env = dict(os.environ, TORCH_TPU_KERNEL_TIMES="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", _CHILD, name, mode, str(steps), str(WARMUP)], env=env,
                       capture_output=True, text=True, cwd=ROOT, check=False)
    m = re.search(r"STEP_MS ([0-9.]+)", p.stdout)
    if p.returncode or not m:
        raise RuntimeError(f"{name} {mode}: the child failed:\n{p.stderr[-2000:]}")
    rows = [(float(ms), name_.strip()) for ms, _calls, _us, _share, name_ in _ROW.findall(p.stderr)]
    n = steps + WARMUP  # the table covers the warm-up steps too
    return {"step_ms": float(m.group(1)),
            "kernel_ms": sum(ms for ms, _ in rows) / n,
            "fixed_ms": sum(ms for ms, k in rows if FIXED.match(k)) / n}


def _median(runs: list[dict]) -> dict:
    """Each figure's median over a mode's children, and the step times' range."""
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["step_ms_range"] = (min(r["step_ms"] for r in runs), max(r["step_ms"] for r in runs))
    return out


def run(workloads: tuple[str, ...], steps: int, repeats: int = 3) -> tuple[dict, str]:
    res, rows = {}, []
    for name in workloads:
        runs: dict[str, list[dict]] = {"strict": [], "defer": []}
        for i in range(repeats):
            for mode in (("strict", "defer") if i % 2 == 0 else ("defer", "strict")):
                runs[mode].append(measure(name, mode, steps))
        r = {mode: _median(v) for mode, v in runs.items()}
        s, d = r["strict"], r["defer"]
        r["ceiling"] = s["step_ms"] / s["fixed_ms"]
        r["defer_speedup"] = s["step_ms"] / d["step_ms"]
        res[name] = r
        spread = " / ".join(f"{m['step_ms_range'][0]:.1f}–{m['step_ms_range'][1]:.1f}" for m in (s, d))
        rows.append([name, f"{s['step_ms']:.1f}", f"{d['step_ms']:.1f}", spread,
                     f"{s['kernel_ms']:.1f} / {d['kernel_ms']:.1f}",
                     f"{s['fixed_ms']:.1f} / {d['fixed_ms']:.1f}", f"{s['fixed_ms'] / s['kernel_ms']:.0%}",
                     f"{r['defer_speedup']:.2f}×", f"**{r['ceiling']:.2f}×**"])
    table = markdown_table(["train step", "strict ms", "defer ms", "step ms range strict / defer",
                            "kernels ms/step strict / defer",
                            "GEMM+conv+attention ms/step strict / defer", "their share (strict)",
                            "defer speed / strict", "ceiling: strict ms / GEMM+conv+attention ms"], rows)
    return res, table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--steps", type=int, default=20, help="timed steps per child (after 4 warm-up steps)")
    p.add_argument("--repeats", type=int, default=3,
                   help="children per mode, alternating modes; figures are their medians (default 3)")
    p.add_argument("--record", action="store_true", help="append the table to BENCHMARKS.md")
    args = p.parse_args(argv)
    _, table = run(tuple(args.workloads), args.steps, args.repeats)
    print(table)
    if args.record:
        command = "python -m bench.ceiling " + " ".join(sys.argv[1:] if argv is None else argv)
        record("DeferAndFuse ceiling: the kernels fusion cannot remove", command.strip(),
               f"Per training step (medians of {args.repeats} child processes per mode, alternating; device wall "
               "time per kernel from `TORCH_TPU_KERNEL_TIMES`; a step's kernels run one after another on the "
               "device):\n\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
