"""The benchmark matrix: the example workloads (minGPT, Llama, ResNet, DLRM,
UNet; Qwen behind --qwen) x {cpu eager, cpu torch.compile (Inductor), tpu
strict, tpu defer}.

Every workload comes from ``examples/<name>/model.py::bench_workload(batch,
preset)`` -> (model on CPU, 4 host batches [(inputs, target)], loss_fn). A
workload whose module or function is not there is reported as MISSING (printed
and in the JSON), never dropped; a configuration that fails (Inductor without a
compiler, an op the backend lacks, ...) shows its error in the table cell.

Training step = zero_grad, forward, loss, backward, AdamW step, loss.item().
Inference step (Llama, ResNet) = eval-mode forward under inference_mode, then
a device sync. Configurations alternate inside every repeat (as in
bench/defer.py); a sample is bench.common.STEPS_PER_SAMPLE consecutive
steps and a device sync (time_steps), and the median step time is reported.

Peak memory, the same definition on both devices: the configuration's own
resident tensors (parameters, buffers, gradients, optimizer state, its copy of
the 4 batches: summed over unique storages) plus the largest growth of
allocated bytes above the level at the start of a measured step. tpu: growth
from torch.tpu.memory_allocated / max_memory_allocated. cpu: growth of the
CPU allocator's "Total Allocated" in torch.profiler memory events
(profile_memory=True) over one step, measured after one profiled step so that
every block freed in the window is known to the profiler. Host memory outside
torch's CPU allocator (Python objects, Inductor's compiled code) is not counted.

Compile cost: the time of the first step (Inductor: tracing + compilation,
with the FX-graph cache hit/miss counts, since Inductor caches on disk; tpu
defer: recording + fusion + building), and for tpu defer the graphs built and
cache hits of torch.tpu.defer_stats() over the warm-up and timed steps.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import torch

import torch_tpu
from bench import common

WORKLOADS = ("mingpt", "llama", "resnet", "dlrm", "unet")
OPTIONAL = ("qwen",)
INFERENCE = ("llama", "resnet")
CONFIGS = ("cpu eager", "cpu inductor", "tpu strict", "tpu defer", "tpu compiled", "cpu eager bf16", "tpu strict bf16")
# "tpu compiled": torch.compile(model, backend="tpu"); the optimizer step eager (strict)
# "... bf16": the same step under torch.autocast(device, torch.bfloat16) (weights
# f32, products and activations bf16), compared with CPU eager under autocast.
TOKEN_MODELS = ("mingpt", "llama", "qwen")


class Missing(Exception):
    """The workload's example module or its bench_workload is not there."""


def load(name: str, preset: str, batch: int | None = None):
    """bench_workload of examples/<name>/model.py; raises Missing if absent."""
    modname = f"examples.{name}.model"
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name in (modname, f"examples.{name}"):
            raise Missing(f"examples/{name}/model.py not found") from None
        raise
    fn = getattr(mod, "bench_workload", None)
    if fn is None:
        raise Missing(f"examples/{name}/model.py has no bench_workload")
    return fn(batch=batch, preset=preset)


def _to(obj, device: str):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _short(e: BaseException, n: int = 160) -> str:
    msg = f"{type(e).__name__}: {e}".strip().splitlines()
    text = msg[0] if msg else type(e).__name__
    return text[:n] + ("…" if len(text) > n else "")


def _sync(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


class Runner:
    """One configuration of one workload: its own copy of the model, optimizer
    and batches on its device."""

    def __init__(self, config: str, base: torch.nn.Module, batches, loss_fn, train: bool = True) -> None:
        self.config, self.train = config, train
        self.device = "cpu" if config.startswith("cpu") else "tpu"
        self.bf16 = config.endswith(" bf16")
        self.mode = {"tpu strict": "strict", "tpu defer": "defer", "tpu compiled": "strict"}.get(
            config.removesuffix(" bf16"))
        self.model = copy.deepcopy(base).to(self.device)
        self.model.train(train)
        backend = {"cpu inductor": "inductor", "tpu compiled": "tpu"}.get(config)
        self.fn = torch.compile(self.model, backend=backend) if backend else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3) if train else None
        self.batches = [(_to(x if isinstance(x, (tuple, list)) else (x,), self.device), _to(y, self.device))
                        for x, y in batches]
        self.loss_fn = loss_fn
        self.i = 0

    def ctx(self):
        stack = contextlib.ExitStack()
        if self.mode:
            stack.enter_context(torch_tpu.execution_mode(self.mode))
        if self.bf16:
            stack.enter_context(torch.autocast(self.device, torch.bfloat16))
        return stack

    def step(self) -> float | None:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        with self.ctx():
            if self.train:
                self.opt.zero_grad(set_to_none=True)
                loss = self.loss_fn(self.fn(*x), y)
                loss.backward()
                self.opt.step()
                return loss.item()
            with torch.inference_mode():
                self.fn(*x)
            _sync(self.device)
            return None

    def resident_bytes(self) -> int:
        ts = list(self.model.parameters()) + list(self.model.buffers())
        ts += [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.opt is not None:
            for st in self.opt.state.values():
                ts += list(_tensors(st))
        ts += list(_tensors(self.batches))
        seen: dict[tuple[str, int], int] = {}
        for t in ts:
            if t.device.type != self.device:
                continue  # e.g. AdamW's step counters live on the host
            s = t.untyped_storage()
            seen[(t.device.type, s.data_ptr())] = s.nbytes()
        return sum(seen.values())


def _cpu_growth(r: Runner) -> int:
    """Largest growth of the CPU allocator's Total Allocated within one step,
    above its level at the start of that step (torch.profiler memory events)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        r.step()  # frees blocks from before profiling: unknown sizes, so not measured
        with record_function("bench_matrix_window"):
            r.step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    finally:
        os.unlink(path)
    win = [e for e in events if e.get("name") == "bench_matrix_window" and e.get("ph") == "X"]
    if not win:
        raise RuntimeError("profiler window not found")
    t0, t1 = win[0]["ts"], win[0]["ts"] + win[0]["dur"]
    mem = sorted((e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0),
                 key=lambda e: e["ts"])
    before = [e["args"]["Total Allocated"] for e in mem if e["ts"] < t0]
    inside = [e["args"]["Total Allocated"] for e in mem if t0 <= e["ts"] <= t1]
    start = before[-1] if before else 0
    return max([start] + inside) - start


def peak_bytes(r: Runner, steps: int = 1) -> int:
    """Resident bytes of the runner + the largest growth within a step (see the module doc)."""
    if r.device == "tpu":
        torch.tpu.synchronize()
        base = torch.tpu.memory_allocated()
        resident = r.resident_bytes()
        torch.tpu.reset_peak_memory_stats()
        for _ in range(steps):
            r.step()
        torch.tpu.synchronize()
        return resident + torch.tpu.max_memory_allocated() - base
    resident = r.resident_bytes()
    return resident + _cpu_growth(r)


def _inductor_counters() -> dict[str, int]:
    try:
        from torch._dynamo.utils import counters
        return {k: int(v) for k, v in counters["inductor"].items() if "fxgraph_cache" in k}
    except Exception:  # noqa: BLE001 - only informative
        return {}


def run_task(name: str, base, batches, loss_fn, train: bool, configs, repeats: int, warmup: int = 2,
             log=print) -> dict:
    """Times one (workload, train|infer) over the configurations."""
    kind = "train" if train else "infer"
    x0 = batches[0][0]
    x0 = x0[0] if isinstance(x0, (tuple, list)) else x0
    per_step = x0.numel() if name in TOKEN_MODELS else x0.shape[0]
    units = "tokens/s" if name in TOKEN_MODELS else "samples/s"
    res: dict = {"params": sum(p.numel() for p in base.parameters()), "batch": int(x0.shape[0]),
                 "units": units, "per_step": int(per_step), "configs": {}}
    runners: dict[str, Runner] = {}
    if any(c.startswith("tpu") for c in configs):
        torch.tpu.reset_defer_stats()
    for c in configs:
        cell: dict = {"status": "ok"}
        res["configs"][c] = cell
        try:
            before = _inductor_counters() if c == "cpu inductor" else {}
            r = Runner(c, base, batches, loss_fn, train)
            t0 = time.perf_counter()
            r.step()
            cell["first_step_s"] = time.perf_counter() - t0
            if c == "cpu inductor":
                after = _inductor_counters()
                cell["inductor_cache"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            for _ in range(warmup - 1):
                r.step()
            runners[c] = r
        except Exception as e:  # noqa: BLE001 - reported in the cell
            cell.update(status="error", error=_short(e))
            log(f"  {name} {kind} [{c}]: ERROR {_short(e, 400)}")
            if os.environ.get("BENCH_MATRIX_TRACE"):
                traceback.print_exc()
    samples: dict[str, list[float]] = {c: [] for c in runners}
    for _ in range(repeats):
        for c, r in list(runners.items()):
            try:
                common.settle()
                samples[c].append(common.time_steps(r.step, r.device))
            except Exception as e:  # noqa: BLE001
                res["configs"][c].update(status="error", error=_short(e))
                del runners[c]
                samples.pop(c)
    if "tpu defer" in runners:
        st = torch.tpu.defer_stats()
        res["configs"]["tpu defer"]["defer_stats"] = {k: v for k, v in st.items() if k != "recent_flushes"}
    for c, r in list(runners.items()):
        cell = res["configs"][c]
        cell["step_s"] = statistics.median(samples[c])
        cell["samples_s"] = samples[c]
        cell["throughput"] = per_step / cell["step_s"]
        try:
            cell["peak_bytes"] = peak_bytes(r)
        except Exception as e:  # noqa: BLE001
            cell["peak_bytes"] = None
            cell["peak_error"] = _short(e)
    ok = {c: v for c, v in res["configs"].items() if v["status"] == "ok"}
    for c, v in ok.items():  # bf16 configurations against CPU eager in bf16, and against tpu strict in f32
        ref = "cpu eager bf16" if c.endswith(" bf16") else "cpu eager"
        v["speed_vs_cpu_eager"] = ok[ref]["step_s"] / v["step_s"] if ref in ok else None
        v["speed_vs_tpu_strict"] = ok["tpu strict"]["step_s"] / v["step_s"] if "tpu strict" in ok else None
        if c == "tpu compiled" and "cpu inductor" in ok:
            v["speed_vs_cpu_inductor"] = ok["cpu inductor"]["step_s"] / v["step_s"]
    del runners
    return res


def run(preset: str = "quick", repeats: int = 3, workloads=WORKLOADS, configs=CONFIGS,
        inference=INFERENCE, batch: int | None = None, warmup: int = 2, log=print) -> dict:
    t_start = time.perf_counter()
    out: dict = {"machine": common.machine(), "preset": preset, "repeats": repeats, "warmup": warmup,
                 "configs": list(configs),
                 "workloads": {}, "missing": [], "load_avg": [os.getloadavg()[0]]}
    for name in workloads:
        try:
            base, batches, loss_fn = load(name, preset, batch)
        except Missing as e:
            log(f"!!! MISSING workload {name}: {e}")
            out["workloads"][name] = {"status": "missing", "reason": str(e)}
            out["missing"].append(name)
            continue
        except Exception as e:  # noqa: BLE001
            log(f"!!! workload {name}: bench_workload failed: {_short(e, 400)}")
            out["workloads"][name] = {"status": "error", "reason": _short(e)}
            continue
        w: dict = {"status": "ok"}
        out["workloads"][name] = w
        for train in (True, False):
            if not train and name not in inference:
                continue
            kind = "train" if train else "infer"
            t0 = time.perf_counter()
            w[kind] = run_task(name, base, batches, loss_fn, train, configs, repeats, warmup, log=log)
            cells = w[kind]["configs"]
            log(f"  {name} {kind}: " + ", ".join(
                f"{c} {v['step_s'] * 1e3:.1f} ms" if v["status"] == "ok" else f"{c} ERROR"
                for c, v in cells.items()) + f"  ({time.perf_counter() - t0:.0f} s)")
    out["elapsed_s"] = time.perf_counter() - t_start
    out["load_avg"].append(os.getloadavg()[0])
    return out


def load_text(out: dict) -> str:
    la = out.get("load_avg")
    if not la:
        return "machine load not recorded"
    return (f"1-min load average {la[0]:.1f} at the start and {la[1]:.1f} at the end on "
            f"{out['machine']['cores']} cores (other processes share the machine when above the core count)")


def _ms(v: dict) -> str:
    return f"{v['step_s'] * 1e3:.1f}"


def _ratio(x) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _tp(v: float) -> str:
    return f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.1f}"


def table(out: dict) -> str:
    rows = []
    for name, w in out["workloads"].items():
        if w["status"] != "ok":
            rows.append([f"**{name}**", "–", f"**{w['status'].upper()}**: {w['reason']}"] + ["–"] * 7)
            continue
        for kind in ("train", "infer"):
            if kind not in w:
                continue
            t = w[kind]
            label = f"{name} ({t['params'] / 1e6:.2f}M, batch {t['batch']})"
            for c, v in t["configs"].items():
                if v["status"] != "ok":
                    rows.append([label, kind, c, f"error: {v['error']}"] + ["–"] * 6)
                    continue
                compile_ = "–"
                if c == "cpu inductor":
                    ic = v.get("inductor_cache", {})
                    hit, miss = ic.get("fxgraph_cache_hit", 0), ic.get("fxgraph_cache_miss", 0)
                    compile_ = f"{v['first_step_s']:.1f} s (FX cache {hit} hit / {miss} miss)"
                elif c == "tpu defer":
                    st = v.get("defer_stats", {})
                    compile_ = (f"{v['first_step_s']:.2f} s; graphs {st.get('graphs_built', '?')} / "
                                f"hits {st.get('cache_hits', '?')}")
                elif c == "tpu compiled":
                    vs = v.get("speed_vs_cpu_inductor")
                    compile_ = (f"{v['first_step_s']:.1f} s" +
                                (f"; {vs:.2f}× cpu inductor's step" if vs is not None else ""))
                else:
                    compile_ = f"first step {v['first_step_s']:.2f} s"
                peak = "n/a" if v.get("peak_bytes") is None else f"{v['peak_bytes'] / 2**20:.1f}"
                rows.append([label, kind, c, _ms(v), f"{_tp(v['throughput'])} {t['units']}",
                             _ratio(v["speed_vs_cpu_eager"]), _ratio(v["speed_vs_tpu_strict"]), peak, compile_,
                             f"{len(v['samples_s'])}"])
    return common.markdown_table(["workload", "step", "config", "median ms", "throughput",
                                  "speed vs cpu eager (same dtype)", "speed vs tpu strict (f32)", "peak MiB", "compile / first step", "timed steps"], rows)


def describe(out: dict) -> str:
    missing = out["missing"]
    head = (f"{common.host_line(out['machine'])}\n\nPreset `{out['preset']}`, {out['repeats']} interleaved repeats per configuration (after "
            f"{out['warmup']} warm-up steps), whole run {out['elapsed_s'] / 60:.1f} min, {load_text(out)}. "
            f"Train step: zero_grad, forward, loss, backward, AdamW, loss.item(); infer: eval forward under inference_mode + sync; "
            f"a sample is {common.STEPS_PER_SAMPLE} consecutive steps and a device sync. Peak MiB = own resident tensors "
            "(params, buffers, grads, AdamW state, the 4 batches) + largest growth within a step (tpu: "
            "max_memory_allocated; cpu: CPU-allocator bytes from torch.profiler memory events; host memory "
            "outside torch's allocator is not counted). Inductor's first step includes compilation; its FX-graph "
            "cache is on disk, so a repeated run shows cache hits and a shorter first step.")
    if missing:
        head += f"\n\n**MISSING workloads: {', '.join(missing)}** (no examples/<name>/model.py::bench_workload)."
    return head + "\n\n" + table(out)
