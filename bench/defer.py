"""DeferAndFuse vs Strict Eager vs PyTorch CPU eager on training steps of
the small workloads of bench/models.py (minGPT, Llama-style decoder,
ResNet-18-style CNN). One training step = zero_grad, forward, loss,
backward, AdamW step, loss.item() (the usual logging sync, which is also
the cut that ends the deferred graph); DeferAndFuse runs by default and
with pipelined segments (TORCH_TPU_DEFER_SEGMENT_OPS). Configurations alternate inside
every repeat; a sample is STEPS_PER_SAMPLE consecutive steps and a device
synchronize (bench.common.time_steps: a deferred step's loss.item() returns
once the loss is computed, and the rest of the step runs while the host
records the next); the median step time is reported, with peak device memory
per mode (each mode's training loop alone on the device: params, grads,
optimizer state, batches and the step's own memory) and the host time
spent issuing one step (before its sync)."""
from __future__ import annotations

import contextlib
import copy
import gc
import os
import statistics
import time

import torch

import torch_tpu
from bench import models
from bench.common import STEPS_PER_SAMPLE, interleaved, markdown_table, settle, time_steps

WORKLOADS = ("mingpt", "llama", "resnet")
SEGMENT_OPS = 64  # the pipelined configuration (TORCH_TPU_DEFER_SEGMENT_OPS) measured beside the default


class Runner:
    def __init__(self, device: str, mode: str | None, base: torch.nn.Module, batches, loss_fn,
                 segment_ops: int = 0) -> None:
        self.device, self.mode, self.segment_ops = device, mode, segment_ops
        self.model = copy.deepcopy(base).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = [(x.to(device), y.to(device)) for x, y in batches]
        self.loss_fn = loss_fn
        self.i = 0
        self.issue: list[float] = []

    def step(self) -> float:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        ctx = torch_tpu.execution_mode(self.mode) if self.mode else contextlib.nullcontext()
        with ctx, _segments(self.segment_ops if self.device == "tpu" else None):
            t0 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.opt.step()
            self.issue.append(time.perf_counter() - t0)
            return loss.item()


@contextlib.contextmanager
def _segments(n: int | None):
    """Pipelined segments of n ops for the duration (0: off, whatever
    TORCH_TPU_DEFER_SEGMENT_OPS says; None: leave the setting alone), then
    the previous setting again."""
    if n is None:
        yield
        return
    previous = torch_tpu._C._get_defer_segment_ops()
    torch_tpu._C._set_defer_segment_ops(n)
    try:
        yield
    finally:
        torch_tpu._C._set_defer_segment_ops(previous)


def _peak(mode: str, base: torch.nn.Module, batches, loss_fn, warmup: int = 2, steps: int = 3,
          segment_ops: int = 0) -> int:
    """Peak device bytes of one training loop of `mode` alone on the device
    (a fresh runner after the timed ones are gone: a second model and its
    optimizer state resident next to it would dilute the ratio)."""
    torch.tpu.synchronize()
    other = torch.tpu.memory_allocated()
    r = Runner("tpu", mode, base, batches, loss_fn, segment_ops)
    for _ in range(warmup):
        r.step()
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    for _ in range(steps):
        r.step()
    torch.tpu.synchronize()
    peak = torch.tpu.max_memory_allocated() - other
    del r
    gc.collect()
    return peak


class _OptimizerStep:
    """One AdamW step (foreach, the default) over a copy of `base`'s
    parameters on tpu with fixed gradients, in strict mode or deferred
    (cut right after the step), with or without foreach chains, or compiled
    (``torch.compile(opt.step, backend="tpu")``, called from strict mode)."""

    def __init__(self, base: torch.nn.Module, mode: str, chains: bool = True, compiled: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.params = [p.detach().to("tpu").requires_grad_() for p in base.parameters()]
        for p in self.params:
            p.grad = torch.randn(p.shape, generator=g).to("tpu")
        self.opt = torch.optim.AdamW(self.params, lr=1e-3)
        self.step = torch.compile(self.opt.step, backend="tpu") if compiled else self.opt.step
        self.mode, self.chains = mode, chains

    def __call__(self) -> None:
        saved = os.environ.get("TORCH_TPU_DEFER_CHAINS")
        os.environ["TORCH_TPU_DEFER_CHAINS"] = "1" if self.chains else "0"
        try:
            with torch_tpu.execution_mode(self.mode):
                self.step()
                torch_tpu.flush()
            torch.tpu.synchronize()
        finally:
            if saved is None:
                del os.environ["TORCH_TPU_DEFER_CHAINS"]
            else:
                os.environ["TORCH_TPU_DEFER_CHAINS"] = saved


def optimizer_steps(repeats: int, workloads=WORKLOADS) -> tuple[dict, str]:
    """The AdamW step alone (mul, lerp, mul, addcmul, sqrt, div, add,
    addcdiv over every parameter): strict mode, defer with the launches run
    one by one, defer with them run as one pass (a foreach chain), and the
    step compiled with torch.compile(backend="tpu") (state on the device,
    updates in place, replayed)."""
    results, rows = {}, []
    for name in workloads:
        base, _, _ = models.make(name)
        configs = {"strict": _OptimizerStep(base, "strict"), "defer, one by one": _OptimizerStep(base, "defer", False),
                   "defer, chain": _OptimizerStep(base, "defer"),
                   "compiled": _OptimizerStep(base, "strict", compiled=True)}
        for c in configs.values():  # compiles the compiled step outside the timed samples
            c()
        med = interleaved(configs, repeats, inner=5)
        params = sum(p.numel() for p in base.parameters())
        ntensors = len(list(base.parameters()))
        results[name] = {"params": params, "tensors": ntensors, "step_s": med}
        rows.append([f"{name} ({params / 1e6:.2f}M params, {ntensors} tensors)",
                     *(f"{med[k] * 1e3:.2f}" for k in configs),
                     f"{med['defer, one by one'] / med['defer, chain']:.2f}×", f"{med['strict'] / med['defer, chain']:.2f}×",
                     f"{med['strict'] / med['compiled']:.2f}×"])
        configs.clear()
        gc.collect()
    table = markdown_table(["AdamW step", "strict ms", "defer one by one ms", "defer chain ms", "compiled ms",
                            "chain speed / one by one", "chain speed / strict", "compiled speed / strict"], rows)
    return results, table


_COUNTS = ("ops_recorded", "kernels_launched", "graphs_built", "cache_hits")


def _counts() -> dict[str, int]:
    stats = torch.tpu.defer_stats()
    return {k: stats[k] for k in _COUNTS}


def run(repeats: int, workloads=WORKLOADS, warmup: int = 4) -> tuple[dict, str, str]:
    """The main table (CPU / strict / defer) and the pipelined-segments
    table (defer with SEGMENT_OPS-op segments beside the default). Four
    warm-up steps: the first step (optimizer state created) has another
    length, and segments start after two equal steps, so the segments'
    plans are built in the fourth."""
    results: dict = {}
    rows, seg_rows = [], []
    seg_key = f"tpu defer seg{SEGMENT_OPS}"
    for name in workloads:
        base, batches, loss_fn = models.make(name)
        runners = {
            "cpu eager": Runner("cpu", None, base, batches, loss_fn),
            "tpu strict": Runner("tpu", "strict", base, batches, loss_fn),
            "tpu defer": Runner("tpu", "defer", base, batches, loss_fn),
            seg_key: Runner("tpu", "defer", base, batches, loss_fn, SEGMENT_OPS),
        }
        for r in runners.values():
            for _ in range(warmup):
                r.step()
            r.issue.clear()
        samples: dict[str, list[float]] = {k: [] for k in runners}
        counts = {k: dict.fromkeys(_COUNTS, 0) for k in runners}
        for _ in range(repeats):
            for k, r in runners.items():
                before = _counts()
                settle()
                samples[k].append(time_steps(r.step, r.device))
                for c, v in _counts().items():
                    counts[k][c] += v - before[c]
        steps = repeats * STEPS_PER_SAMPLE
        med = {k: statistics.median(v) for k, v in samples.items()}
        issue = {k: statistics.median(r.issue) for k, r in runners.items()}
        runners.clear()
        gc.collect()
        peak_strict = _peak("strict", base, batches, loss_fn)
        peak_defer = _peak("defer", base, batches, loss_fn)
        peak_seg = _peak("defer", base, batches, loss_fn, segment_ops=SEGMENT_OPS)
        params = sum(p.numel() for p in base.parameters())
        stats = counts["tpu defer"]
        res = {"params": params, "step_s": med, "issue_s": issue, "peak_strict": peak_strict,
               "peak_defer": peak_defer, "peak_defer_segments": peak_seg, "segment_ops": SEGMENT_OPS,
               "defer_counts": counts}
        results[name] = res
        rows.append([
            f"{name} ({params / 1e6:.2f}M params)",
            f"{med['cpu eager'] * 1e3:.1f}", f"{med['tpu strict'] * 1e3:.1f}", f"{med['tpu defer'] * 1e3:.1f}",
            f"{med['tpu strict'] / med['tpu defer']:.2f}×", f"{med['cpu eager'] / med['tpu defer']:.2f}×",
            f"{peak_strict / 2**20:.1f} / {peak_defer / 2**20:.1f} ({peak_defer / max(1, peak_strict):.2f}×)",
            f"{issue['tpu strict'] * 1e3:.1f} / {issue['tpu defer'] * 1e3:.1f}",
            f"{stats['ops_recorded'] // max(1, steps)} → {stats['kernels_launched'] // max(1, steps)}",
            f"{stats['graphs_built']} / {stats['cache_hits']}",
        ])
        seg = counts[seg_key]
        seg_rows.append([
            name, f"{med['tpu strict'] * 1e3:.1f}", f"{med['tpu defer'] * 1e3:.1f}", f"{med[seg_key] * 1e3:.1f}",
            f"{med['tpu defer'] / med[seg_key]:.2f}×", f"{med['tpu strict'] / med[seg_key]:.2f}×",
            f"{med['cpu eager'] / med[seg_key]:.2f}×",
            f"{peak_defer / max(1, peak_strict):.2f}× / {peak_seg / max(1, peak_strict):.2f}×",
            f"{seg['kernels_launched'] // max(1, steps)}", f"{seg['graphs_built']} / {seg['cache_hits']}",
        ])
    table = markdown_table([
        "train step", "CPU eager ms", "tpu strict ms", "tpu defer ms", "defer speed / strict (goal ≥ 1.3×; ResNet ≥ 1.15×)",
        "defer speed / CPU (goal ≥ 1.5×)", "peak MiB strict / defer (goal ≤ 0.7×)",
        "host issue ms strict / defer", "ops → kernels per step (defer)", "graphs built / cache hits",
    ], rows)
    seg_table = markdown_table([
        "train step", "tpu strict ms", "tpu defer ms", f"defer, {SEGMENT_OPS}-op segments ms",
        "segments speed / defer", "segments speed / strict", "segments speed / CPU",
        "peak / strict: defer / segments", "kernels per step (segments)", "graphs built / cache hits (segments)",
    ], seg_rows)
    return results, table, seg_table
