"""torch_tpu.profiler: where a step's time goes on the ``tpu`` device.

``with torch_tpu.profiler.profile() as prof:`` records, for the code inside:

* host op dispatch spans (every aten op that touches the device, with its
  input shapes, estimated FLOPs and bytes, the op it ran inside and the
  user's source line), from a RecordFunction callback of the glue
  (torch_tpu/csrc/module.cpp), so code compiled with torch.compile is
  compiled and profiled as it runs (a replayed compiled call is one host op,
  ``torch_tpu::compiled_graph``);
* the runtime's trace ring (runtime/src/trace.c): each kernel as a stream
  worker ran it (device time, one track per stream), the host op or the
  recorded ops it contains (a DeferAndFuse kernel is named after its ops and
  the line that recorded them), DeferAndFuse cuts with their reason and user
  line, plan builds and plan-cache hits, kernel compiles and kernel-cache
  hits, host<->device copies and an allocated / reserved memory counter.

``prof.export_chrome_trace(path)`` writes Chrome / Perfetto JSON,
``prof.summary()`` the top kernels (device time, calls, FLOPs, bytes,
achieved GFLOP/s and GB/s, share of the step) and ``prof.roofline()`` the
estimate for a real TPU generation (see :class:`Roofline`).

FLOPs and bytes are estimates from the host ops' shapes: matmul-like ops
use PyTorch's FLOP formulas (torch.utils.flop_counter), pointwise ops count
one FLOP per output element; bytes are the op's tensor inputs and outputs.
A kernel an op launched gets the op's cost (split evenly when an op
launched several); a fused kernel gets the sum of its ops' FLOPs and the
bytes of the tensors entering the group from outside plus its last op's
outputs (values passed between fused ops stay in registers).

torch.profiler and the PrivateUse1 activity: ``ProfilerActivity.PrivateUse1``
is served by a Kineto activity profiler registered through PyTorch's
PrivateUse1 profiler registry (torch_tpu/csrc/kineto_profiler.cpp), which
reads the same trace ring; while a ``profile`` of this module is active the
ring is its own and that activity records nothing. ``profile(torch_profiler=True)``
runs torch.profiler's CPU activity alongside and merges its events into this
module's trace.
"""
from __future__ import annotations

import gc
import gzip
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_tpu import _C

KERNEL, LAUNCH, MEMBER, CUT, PLAN, COMPILE, COPY, MEMORY = range(1, 9)

__all__ = ["profile", "HostOp", "Kernel", "Roofline", "CHIPS", "chip_spec"]


# ----------------------------------------------------------------- chips

@dataclass(frozen=True)
class ChipSpec:
    name: str
    peak_bf16_flops: float  # FLOP/s
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: int


# Public spec sheets (Google Cloud TPU documentation, "TPU v5e", "TPU v6e"
# and "TPU7x (Ironwood)" system architecture pages): per chip peak bf16
# compute, HBM bandwidth and capacity. The runtime holds the same figures
# for TORCH_TPU_EMULATE (runtime/src/device.c); they are repeated here so a
# report can compare generations without switching the emulated one.
CHIPS: dict[str, ChipSpec] = {
    "v5e": ChipSpec("TPU v5e", 197e12, 819e9, 16 << 30),
    "v6e": ChipSpec("TPU v6e (Trillium)", 918e12, 1640e9, 32 << 30),
    "v7x": ChipSpec("TPU7x (Ironwood)", 2307e12, 7.37e12, 192 << 30),
}


def chip_spec(generation: str | None = None) -> ChipSpec:
    """The spec of ``generation`` (default: the emulated chip, TORCH_TPU_EMULATE)."""
    if generation is None:
        props = _C._device_properties(0)
        generation = props["generation"] if isinstance(props, dict) else props.generation
    if generation not in CHIPS:
        raise ValueError(f"unknown TPU generation {generation!r}: expected one of {', '.join(CHIPS)}")
    return CHIPS[generation]


# ------------------------------------------------------------- host ops

@dataclass
class HostOp:
    corr: int
    name: str
    ts: int  # ns, runtime clock
    dur: int
    tid: int
    site: str | None
    shapes: list[Any]
    flops: float
    bytes: float
    inputs: tuple[int, ...]  # data_ptr of tensor inputs
    outputs: tuple[int, ...]
    out_bytes: float
    parent: int = 0  # the op it ran inside (0: none), e.g. addmm inside linear


def _overload(name: str, overload: str) -> Any:
    """The OpOverload a recorded op name denotes (None: not an ATen-style op)."""
    ns, _, op = name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None


def _is_tensor(a: Any) -> bool:
    """Whether a recorded argument is a tensor: (sizes, dtype, on the device,
    data address, bytes)."""
    return isinstance(a, tuple) and len(a) == 5 and isinstance(a[1], torch.dtype)


def _rebuild(a: Any) -> Any:
    """A recorded argument as the FLOP formulas read it: tensors as meta
    tensors of the recorded shape and dtype, lists item by item."""
    if _is_tensor(a):
        return torch.empty(a[0], dtype=a[1], device="meta")
    if isinstance(a, list):
        return [_rebuild(x) for x in a]
    return a


def _recorded_tensors(a: Any) -> list[tuple]:
    if _is_tensor(a):
        return [a]
    if isinstance(a, list):
        return [t for x in a for t in _recorded_tensors(x)]
    return []


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_FORMULA, _POINTWISE, _NONE = range(3)


def _flop_kind(func: Any) -> int:
    """How an op's FLOPs are counted: PyTorch's formula (torch.utils.flop_counter)
    for matmul-like ops, one per element for pointwise and reduction ops."""
    if func is None:
        return _NONE
    from torch.utils.flop_counter import flop_registry
    if func._overloadpacket in flop_registry:
        return _FORMULA
    tags = getattr(func, "tags", ())
    if torch.Tag.pointwise in tags or getattr(torch.Tag, "reduction", None) in tags:
        return _POINTWISE
    return _NONE


def _formula_flops(func: Any, inputs: list, outputs: list) -> float | None:
    """The formula's FLOPs on meta tensors of the recorded shapes (None: the
    formula does not take this overload's arguments)."""
    from torch.utils.flop_counter import flop_registry
    args, kwargs = [], {}
    for arg, v in zip(func._schema.arguments, inputs):
        if arg.kwarg_only:
            kwargs[arg.name] = _rebuild(v)
        else:
            args.append(_rebuild(v))
    out = [_rebuild(v) for v in outputs]
    try:
        return float(flop_registry[func._overloadpacket](*args, **kwargs,
                                                         out_val=out[0] if len(out) == 1 else tuple(out)))
    except Exception:
        return None


def _base(name: str) -> str:
    """An op's name without overload and in-place mark: add_.Tensor -> add."""
    return name.split(".", 1)[0].rstrip("_")


def _host_ops(records: list[tuple], record_shapes: bool) -> dict[int, HostOp]:
    """HostOps from the glue's recorded ops (torch_tpu/csrc/module.cpp,
    "host ops"): a formula's FLOPs computed once per distinct op and
    arguments, a pointwise op's from its largest tensor."""
    ops: dict[int, HostOp] = {}
    formula: dict[Any, float | None] = {}
    funcs: dict[tuple[str, str], tuple[Any, int, str]] = {}
    for corr, parent, name, overload, ts, dur, tid, site, ins, outs in records:
        key = (name, overload)
        f = funcs.get(key)
        if f is None:
            func = _overload(name, overload)
            full = f"{name}.{overload}" if overload else name  # as OpOverload.name() spells it
            f = funcs[key] = (func, _flop_kind(func), full.removeprefix("aten::"))
        func, kind, full = f
        tin, tout = _recorded_tensors(ins), _recorded_tensors(outs)
        flops = None
        if kind == _FORMULA:
            sig = (key, repr(ins), repr([t[:2] for t in tout]))
            if sig not in formula:
                formula[sig] = _formula_flops(func, ins, outs)
            flops = formula[sig]
        if flops is None and kind != _NONE:  # pointwise, or a formula that did not apply
            flops = float(max([_numel(t[0]) for t in tout + tin], default=0))
        in_bytes = sum(t[4] for t in tin)
        out_bytes = sum(t[4] for t in tout)
        ops[corr] = HostOp(corr, full, ts, dur, tid, site,
                           [list(t[0]) for t in tin] if record_shapes else [], flops or 0.0,
                           float(in_bytes + out_bytes), tuple(t[3] for t in tin if t[2]),
                           tuple(t[3] for t in tout if t[2]), float(out_bytes), parent)
    return ops


# ----------------------------------------------------------- the device

@dataclass
class Kernel:
    name: str  # as the runtime names it ("add+mul (recorded at train.py:12)")
    dev: int
    stream: int
    seq: int
    ts: int  # ns
    dur: int
    status: int
    launch_ts: int | None = None
    launch_tid: int | None = None
    ops: list[int] = field(default_factory=list)  # host op ids it contains
    flops: float = 0.0
    bytes: float = 0.0

    @property
    def base_name(self) -> str:
        return self.name.split(" (recorded at ", 1)[0]

    @property
    def site(self) -> str | None:
        parts = self.name.split(" (recorded at ", 1)
        return parts[1].rstrip(")") if len(parts) == 2 else None


@dataclass
class Roofline:
    """An estimate of the profiled kernels on a real TPU: each kernel takes
    max(FLOPs / peak bf16 FLOP/s, bytes / HBM bandwidth) (the roofline
    model: no launch overhead, no overlap between kernels, perfect use of
    the MXU and of HBM). It is an estimate from spec-sheet figures, not a
    measurement."""

    chip: ChipSpec
    rows: list[dict[str, Any]]  # name, calls, flops, bytes, intensity, est_s, bound
    step_estimate_s: float
    measured_device_s: float

    def table(self, top: int = 15) -> str:
        lines = [f"Roofline ESTIMATE on {self.chip.name} ({self.chip.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16, "
                 f"{self.chip.hbm_bandwidth / 1e9:.0f} GB/s HBM; spec-sheet peaks, no overheads): "
                 f"step ~{self.step_estimate_s * 1e6:.1f} us estimated vs {self.measured_device_s * 1e6:.1f} us "
                 "measured on the emulator",
                 f"{'est us':>10} {'share':>6} {'FLOP/B':>8} {'bound':>7}  kernel"]
        for r in self.rows[:top]:
            share = 100 * r["est_s"] / self.step_estimate_s if self.step_estimate_s else 0.0
            lines.append(f"{r['est_s'] * 1e6:10.3f} {share:5.1f}% {r['intensity']:8.2f} {r['bound']:>7}  {r['name']}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _summarize_roof(chip: ChipSpec, flops: float, nbytes: float) -> tuple[float, str]:
    tc = flops / chip.peak_bf16_flops
    tm = nbytes / chip.hbm_bandwidth
    return max(tc, tm), "compute" if tc >= tm else "memory"


class profile:
    """Context manager: profiles the ``tpu`` work of its block.

    ``torch_profiler=True`` also runs ``torch.profiler`` (CPU activity) and
    merges its events into the exported trace. ``capacity`` bounds the
    runtime's event ring (the oldest events go first; ``dropped`` counts
    them)."""

    def __init__(self, *, with_stack: bool = True, record_shapes: bool = True, torch_profiler: bool = False,
                 capacity: int = 1 << 18) -> None:
        self.with_stack = with_stack
        self.record_shapes = record_shapes
        self.capacity = capacity
        self._torch_prof = None
        self._use_torch = torch_profiler
        self.ops: dict[int, HostOp] = {}
        self.kernels: list[Kernel] = []
        self.cuts: list[dict[str, Any]] = []
        self.plans: list[dict[str, Any]] = []
        self.compiles: list[dict[str, Any]] = []
        self.copies: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.dropped = 0
        self.dropped_ops = 0  # host ops past the cap (4 x capacity)
        self.t0 = self.t1 = 0

    # ------------------------------------------------------------ run
    def __enter__(self) -> "profile":
        if _C._trace_enabled():
            raise RuntimeError("torch_tpu.profiler.profile: another profile is already active")
        torch.tpu.synchronize()
        if self._use_torch:
            self._torch_prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                      record_shapes=self.record_shapes)
            self._torch_prof.__enter__()
        _C._trace_start(self.capacity)
        try:
            _C._hostops_start(self.with_stack, 4 * self.capacity)
        except BaseException:
            _C._trace_stop()
            raise
        self.t0 = _C._trace_now_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            _C._hostops_stop()
            try:
                for i in range(torch.tpu.device_count()):
                    torch.tpu.synchronize(i)  # runs pending deferred graphs, waits for every stream
            finally:
                self.t1 = _C._trace_now_ns()
                _C._trace_stop()
        finally:
            if self._torch_prof is not None:
                self._torch_prof.__exit__(None, None, None)
        gc_was = gc.isenabled()
        gc.disable()  # many small objects, no cycles: collections would cost more than the build
        try:
            records, self.dropped_ops = _C._hostops_read()
            self.ops = _host_ops(records, self.record_shapes)
            events, self.dropped = _C._trace_read()
            self._build(events)
        finally:
            if gc_was:
                gc.enable()

    def _build(self, events: list[tuple]) -> None:
        launches: dict[tuple[int, int, int], tuple[int, int, int, int]] = {}
        members: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        kernels: list[Kernel] = []
        for kind, ts, dur, name, site, dev, stream, seq, corr, a, b, tid in events:
            if kind == KERNEL:
                kernels.append(Kernel(name or "kernel", dev, stream, seq, ts, dur, a))
            elif kind == LAUNCH:
                launches[(dev, stream, seq)] = (ts, tid, corr, b)  # b: its context (the flush's op, else corr)
            elif kind == MEMBER:
                members[(dev, stream, seq)].append(corr)
            elif kind == CUT:
                self.cuts.append({"reason": name, "site": site or None, "ts": ts, "dur": dur, "dev": dev,
                                  "kernels": seq, "cache_hit": bool(corr), "ops": b, "tid": tid})
            elif kind == PLAN:
                self.plans.append({"ts": ts, "dur": dur, "dev": dev, "nodes": a, "kernels": b, "tid": tid})
            elif kind == COMPILE:
                self.compiles.append({"name": name, "ts": ts, "dur": dur, "from_cache": bool(a), "loaded": bool(b),
                                      "tid": tid, "instructions": seq})
            elif kind == COPY:
                self.copies.append({"name": name, "ts": ts, "bytes": a, "direction": ("h2d", "d2h", "d2d")[b],
                                    "dev": dev, "corr": corr, "tid": tid})
            elif kind == MEMORY:
                self.memory.append({"ts": ts, "dev": dev, "allocated": a, "reserved": b})
        # kernels per host op (the even split of an op's cost over its launches)
        for k in kernels:
            key = (k.dev, k.stream, k.seq)
            if key in launches:
                k.launch_ts, k.launch_tid, corr, _ = launches[key]
                k.ops = [self._user_op(c) for c in members.get(key, [])] or ([self._user_op(corr)] if corr else [])
        # an op's cost is split over the kernels one launch context (the op
        # or the flush that launched them) made of it: a compiled call's
        # replays run the kernels of ops recorded once, each replay in full
        share: dict[tuple[int, int], int] = defaultdict(int)
        ctx = {id(k): launches.get((k.dev, k.stream, k.seq), (0, 0, 0, 0))[3] for k in kernels}
        for k in kernels:
            for c in k.ops:
                share[(c, ctx[id(k)])] += 1
        for k in kernels:
            ops = [self.ops[c] for c in k.ops if c in self.ops]
            k.flops = sum(o.flops / share[(o.corr, ctx[id(k)])] for o in ops)
            if len(ops) <= 1:
                k.bytes = sum(o.bytes / share[(o.corr, ctx[id(k)])] for o in ops)
            else:  # fused: tensors entering the group from outside, plus the last op's outputs
                made: set[int] = set()
                ext = 0.0
                for o in ops:
                    for p, nb in zip(o.inputs, self._input_sizes(o)):
                        if p not in made:
                            ext += nb
                            made.add(p)
                    made.update(o.outputs)
                k.bytes = ext + ops[-1].out_bytes
        self.kernels = kernels

    def _user_op(self, corr: int) -> int:
        """The op a kernel is credited to: the innermost op that launched it,
        or the op it implements when that one ran inside an op of the same
        name (tanh.out inside tanh, add.out inside add_): what the user
        called, with the same FLOPs."""
        op = self.ops.get(corr)
        while op is not None and op.parent in self.ops:
            up = self.ops[op.parent]
            if _base(up.name) != _base(op.name):
                break
            op = up
        return op.corr if op is not None else corr

    @staticmethod
    def _input_sizes(o: HostOp) -> list[float]:
        # per-input bytes for fused-group accounting: the op's input bytes split evenly over its tpu inputs
        n = len(o.inputs)
        return [(o.bytes - o.out_bytes) / n] * n if n else []

    # -------------------------------------------------------- results
    @property
    def device_time_s(self) -> float:
        return sum(k.dur for k in self.kernels) / 1e9

    @property
    def wall_time_s(self) -> float:
        return (self.t1 - self.t0) / 1e9

    def key_averages(self, by_site: bool = False) -> list[dict[str, Any]]:
        """One row per kernel name (``by_site``: per name and recording line),
        largest device time first: calls, device_s, flops, bytes, gflops_s,
        gbs, share (of all kernel time)."""
        rows: dict[str, dict[str, Any]] = {}
        total = sum(k.dur for k in self.kernels) or 1
        for k in self.kernels:
            key = k.name if by_site else k.base_name
            r = rows.setdefault(key, {"name": key, "calls": 0, "device_ns": 0, "flops": 0.0, "bytes": 0.0})
            r["calls"] += 1
            r["device_ns"] += k.dur
            r["flops"] += k.flops
            r["bytes"] += k.bytes
        out = sorted(rows.values(), key=lambda r: -r["device_ns"])
        for r in out:
            s = r["device_ns"] / 1e9
            r["device_s"] = s
            r["gflops_s"] = r["flops"] / s / 1e9 if s > 0 else 0.0
            r["gbs"] = r["bytes"] / s / 1e9 if s > 0 else 0.0
            r["share"] = r["device_ns"] / total
        return out

    def summary(self, top: int = 20, by_site: bool = False) -> str:
        rows = self.key_averages(by_site)
        dev = self.device_time_s
        lines = [f"torch_tpu profile: {len(self.kernels)} kernels, {dev * 1e3:.3f} ms device time in "
                 f"{self.wall_time_s * 1e3:.3f} ms wall, {len(self.ops)} host ops, {len(self.cuts)} DeferAndFuse cuts, "
                 f"{len(self.compiles)} kernel compiles / cache loads"
                 + (f", {self.dropped} events dropped (ring full)" if self.dropped else ""),
                 f"{'device ms':>10} {'share':>6} {'calls':>7} {'us/call':>9} {'GFLOP':>9} {'MB':>9} "
                 f"{'GFLOP/s':>9} {'GB/s':>8}  kernel"]
        for r in rows[:top]:
            lines.append(f"{r['device_s'] * 1e3:10.3f} {100 * r['share']:5.1f}% {r['calls']:7d} "
                         f"{r['device_s'] * 1e6 / r['calls']:9.1f} {r['flops'] / 1e9:9.4f} {r['bytes'] / 1e6:9.3f} "
                         f"{r['gflops_s']:9.2f} {r['gbs']:8.2f}  {r['name']}")
        if len(rows) > top:
            rest = rows[top:]
            lines.append(f"{sum(r['device_s'] for r in rest) * 1e3:10.3f} "
                         f"{100 * sum(r['share'] for r in rest):5.1f}% {sum(r['calls'] for r in rest):7d}  "
                         f"({len(rest)} more kernels)")
        if self.cuts:
            reasons: dict[str, int] = defaultdict(int)
            for c in self.cuts:
                reasons[c["reason"]] += 1
            lines.append("DeferAndFuse cuts: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())))
        return "\n".join(lines)

    def roofline(self, generation: str | None = None) -> Roofline:
        """The estimate of these kernels on ``generation`` (v5e, v6e, v7x;
        default the emulated one)."""
        chip = chip_spec(generation)
        rows = []
        for r in self.key_averages():
            est, bound = _summarize_roof(chip, r["flops"], r["bytes"])
            rows.append({"name": r["name"], "calls": r["calls"], "flops": r["flops"], "bytes": r["bytes"],
                         "intensity": r["flops"] / r["bytes"] if r["bytes"] else 0.0, "est_s": est, "bound": bound,
                         "measured_s": r["device_s"]})
        rows.sort(key=lambda r: -r["est_s"])
        return Roofline(chip, rows, sum(r["est_s"] for r in rows), self.device_time_s)

    def save_roofline_png(self, path: str, generations: tuple[str, ...] = ("v5e", "v6e", "v7x"), top: int = 12) -> None:
        """A log-log roofline plot: each generation's roof (min(peak, intensity
        x bandwidth)) and the top kernels at their arithmetic intensity, at the
        performance the roof allows (estimate) and as measured on the
        emulator's host."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.key_averages() if r["flops"] > 0 and r["bytes"] > 0][:top]
        fig, ax = plt.subplots(figsize=(8, 5.5))
        xs = [10 ** (e / 10) for e in range(-20, 51)]
        for g in generations:
            c = CHIPS[g]
            ax.plot(xs, [min(c.peak_bf16_flops, x * c.hbm_bandwidth) / 1e9 for x in xs],
                    label=f"{c.name} roof (spec sheet)")
        chip = chip_spec(None)
        for r in rows:
            ai = r["flops"] / r["bytes"]
            ax.scatter([ai], [min(chip.peak_bf16_flops, ai * chip.hbm_bandwidth) / 1e9], marker="o", color="k")
            ax.scatter([ai], [max(r["gflops_s"], 1e-3)], marker="x", color="tab:red")
            ax.annotate(r["name"][:28], (ai, max(r["gflops_s"], 1e-3)), fontsize=7)
        ax.scatter([], [], marker="o", color="k", label=f"kernels, estimate on {chip.name}")
        ax.scatter([], [], marker="x", color="tab:red", label="kernels, measured on the emulator's host")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("GFLOP/s")
        ax.set_title("Roofline (ESTIMATE from spec-sheet peaks)")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    # ---------------------------------------------------------- trace
    def trace_events(self) -> list[dict[str, Any]]:
        """The Chrome / Perfetto trace events (``traceEvents``)."""
        t0 = self.t0
        us = lambda ns: (ns - t0) / 1e3  # noqa: E731
        pid_host = os.getpid()
        ev: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": pid_host, "args": {"name": "host (torch_tpu)"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid_host, "args": {"sort_index": 0}}]
        dpid = lambda dev: 1_000_000 + max(dev, 0)  # noqa: E731
        devs = sorted({k.dev for k in self.kernels} | {m["dev"] for m in self.memory})
        for d in devs:
            ev.append({"ph": "M", "name": "process_name", "pid": dpid(d), "args": {"name": f"tpu:{d}"}})
            ev.append({"ph": "M", "name": "process_sort_index", "pid": dpid(d), "args": {"sort_index": 1 + d}})
        for dev, stream in sorted({(k.dev, k.stream) for k in self.kernels}):
            ev.append({"ph": "M", "name": "thread_name", "pid": dpid(dev), "tid": stream,
                       "args": {"name": f"stream {stream}" + (" (default)" if stream == 0 else "")}})
        for o in self.ops.values():
            args: dict[str, Any] = {"op id": o.corr, "flops": o.flops, "bytes": o.bytes}
            if o.site:
                args["source"] = o.site
            if o.shapes:
                args["input shapes"] = o.shapes
            ev.append({"ph": "X", "cat": "op", "name": o.name, "pid": pid_host, "tid": o.tid, "ts": us(o.ts),
                       "dur": o.dur / 1e3, "args": args})
        flow = 0
        for k in self.kernels:
            args = {"seq": k.seq, "flops": k.flops, "bytes": k.bytes}
            if k.ops:
                args["ops"] = [self.ops[c].name for c in k.ops if c in self.ops]
                sites = sorted({self.ops[c].site for c in k.ops if c in self.ops and self.ops[c].site})
                if sites:
                    args["source"] = sites if len(sites) > 1 else sites[0]
            if k.status:
                args["status"] = k.status
            ev.append({"ph": "X", "cat": "kernel", "name": k.name, "pid": dpid(k.dev), "tid": k.stream,
                       "ts": us(k.ts), "dur": k.dur / 1e3, "args": args})
            if k.launch_ts is not None:
                flow += 1
                ev.append({"ph": "s", "cat": "launch", "name": "launch", "id": flow, "pid": pid_host,
                           "tid": k.launch_tid, "ts": us(k.launch_ts)})
                ev.append({"ph": "f", "bp": "e", "cat": "launch", "name": "launch", "id": flow, "pid": dpid(k.dev),
                           "tid": k.stream, "ts": us(k.ts)})
        tid_defer, tid_compile, tid_copy = 9_000_001, 9_000_002, 9_000_003
        for tid, name in ((tid_defer, "DeferAndFuse"), (tid_compile, "kernel compiles"), (tid_copy, "copies")):
            ev.append({"ph": "M", "name": "thread_name", "pid": pid_host, "tid": tid, "args": {"name": name}})
        for c in self.cuts:
            ev.append({"ph": "X", "cat": "cut", "name": f"cut: {c['reason']}", "pid": pid_host, "tid": tid_defer,
                       "ts": us(c["ts"]), "dur": c["dur"] / 1e3,
                       "args": {"reason": c["reason"], "source": c["site"], "ops": c["ops"],
                                "kernels": c["kernels"], "plan cache hit": c["cache_hit"]}})
        for p in self.plans:
            ev.append({"ph": "X", "cat": "plan", "name": "plan build", "pid": pid_host, "tid": tid_defer,
                       "ts": us(p["ts"]), "dur": p["dur"] / 1e3, "args": {"nodes": p["nodes"], "kernels": p["kernels"]}})
        for c in self.compiles:
            ev.append({"ph": "X", "cat": "compile", "name": c["name"], "pid": pid_host, "tid": tid_compile,
                       "ts": us(c["ts"]), "dur": c["dur"] / 1e3,
                       "args": {"from kernel cache": c["from_cache"], "loaded": c["loaded"],
                                "instructions": c["instructions"]}})
        for c in self.copies:
            ev.append({"ph": "i", "s": "t", "cat": "copy", "name": f"{c['name']} {c['bytes']} B", "pid": pid_host,
                       "tid": tid_copy, "ts": us(c["ts"]), "args": {"bytes": c["bytes"], "direction": c["direction"]}})
        for m in self.memory:
            ev.append({"ph": "C", "name": "memory", "pid": dpid(m["dev"]), "ts": us(m["ts"]),
                       "args": {"allocated": m["allocated"], "reserved": m["reserved"]}})
        if self._torch_prof is not None:
            ev.extend(self._torch_events())
        return ev

    def _torch_events(self) -> list[dict[str, Any]]:
        """torch.profiler's CPU events, moved onto this trace's clock (both
        start at the profile's start; torch's events keep their own pid)."""
        import tempfile
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            self._torch_prof.export_chrome_trace(f.name)
            data = json.load(open(f.name))
        evs = [e for e in data.get("traceEvents", []) if e.get("ph") in ("X", "i", "M")]
        starts = [e["ts"] for e in evs if e.get("ph") == "X"]
        base = min(starts) if starts else 0.0
        first_op = min((o.ts for o in self.ops.values()), default=self.t0)
        shift = (first_op - self.t0) / 1e3 - base
        pid = 2_000_000  # one process of its own in the merged trace
        out: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": pid,
                                      "args": {"name": "torch.profiler (CPU activity)"}}]
        for e in evs:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                continue
            e = dict(e)
            if "ts" in e:
                e["ts"] = float(e["ts"]) + shift
            e["pid"] = pid
            out.append(e)
        return out

    def export_chrome_trace(self, path: str) -> None:
        """Writes the trace as Chrome / Perfetto JSON (gzip when path ends in .gz)."""
        data = {"traceEvents": self.trace_events(), "displayTimeUnit": "ns",
                "otherData": {"producer": "torch_tpu.profiler", "dropped events": self.dropped,
                              "device": torch.tpu.get_device_name(0)}}
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt") as f:
            json.dump(data, f)
