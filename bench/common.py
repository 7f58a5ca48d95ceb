"""Shared helpers of the benchmarks: timing (median of repeats, configs
interleaved), machine description, JSON/Markdown output."""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# Idle time before every timed sample where configs alternate: CPU torch's
# OpenMP workers keep spinning for a few milliseconds after a parallel
# region (measured on the 2-core hosts: <= 10 ms of CPU time), the runtime's
# workers for 50 us; without the pause they take the cores from the next
# config's sample.
SETTLE_S = 0.02


def settle(seconds: float = SETTLE_S) -> None:
    """Lets the previous sample's worker threads park (see SETTLE_S)."""
    time.sleep(seconds)


# Consecutive training steps per timed sample (see time_steps).
STEPS_PER_SAMPLE = 3


def time_steps(step: Callable[[], object], device: str, steps: int = STEPS_PER_SAMPLE) -> float:
    """Seconds per step over `steps` consecutive calls of a training step
    that ends in loss.item(), the last one followed by a device synchronize.
    A deferred step's loss.item() returns as soon as the loss is computed:
    the backward pass and the optimizer go on running on the device while
    the host records the next step, so a single step timed to its item()
    would leave its tail to whatever is timed next, and consecutive steps
    overlap the host's recording with the device's work as a training loop
    does."""
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "tpu":
        torch.tpu.synchronize()
    return (time.perf_counter() - t0) / steps


def core_kind(vendor: str, family: int, model: int) -> str:
    """The microarchitecture of a CPU's family and model numbers where the
    sessions' hosts tell them apart ("AMD EPYC" alone names Zen 3, 4 and 5
    alike, whose vector units differ: Zen 4 runs 512-bit instructions on
    256-bit units), else ''."""
    if vendor == "AuthenticAMD":
        if family == 0x1A:
            return "Zen 5"
        if family == 0x19:
            return "Zen 4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF else "Zen 3"
    if vendor == "GenuineIntel" and family == 6:
        return {0x8F: "Sapphire Rapids", 0xCF: "Emerald Rapids", 0xAD: "Granite Rapids", 0x6A: "Ice Lake",
                0x55: "Skylake / Cascade Lake"}.get(model, "")
    return ""


def machine() -> dict[str, str]:
    cpu = platform.processor()
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                k, v = (t.strip() for t in line.split(":", 1))
                if k in ("model name", "vendor_id", "cpu family", "model") and k not in fields:
                    fields[k] = v
            elif fields:
                break  # the first processor's block is enough
    except OSError:
        pass
    cpu = fields.get("model name", cpu)
    try:
        kind = core_kind(fields.get("vendor_id", ""), int(fields.get("cpu family", "0")), int(fields.get("model", "0")))
    except ValueError:
        kind = ""
    if kind:
        cpu = f"{cpu} ({kind}, family {fields['cpu family']} model {fields['model']})"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
    except OSError:
        commit = "?"
    import torch_tpu
    from torch_tpu import _C

    info = _C._cpu_info()
    return {
        "cpu": cpu,
        "amx": "yes" if info["features"]["amx_usable"] else "no",
        "avx512_bf16": "yes" if info["features"]["avx512_bf16"] else "no",
        "isa": info["isa"],
        "bf16_matmul": info["bf16_matmul"],
        "cores": str(len(os.sched_getaffinity(0))),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_tpu": torch_tpu.__version__,
        "commit": commit,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


def host_line(m: dict[str, str] | None = None) -> str:
    """The host beside every figure: CPU model, cores, AMX and AVX512-BF16, the
    kernel level and the kernel behind bf16 products."""
    m = m or machine()
    return (f"Host: {m['cpu']}, {m['cores']} cores, AMX {m.get('amx', '?')}, AVX512-BF16 {m.get('avx512_bf16', '?')}; "
            f"tpu kernels at level {m.get('isa', '?')}, bf16 matmul on {m.get('bf16_matmul', '?')}; "
            f"torch {m['torch']}, commit {m['commit']}, {m['date']}.")


def interleaved(configs: dict[str, Callable[[], None]], repeats: int, inner: int | dict[str, int] = 1,
                warmup: int = 2, finish: dict[str, Callable[[], None]] | None = None,
                gap_s: float = SETTLE_S, raw: dict[str, list[float]] | None = None,
                prime: bool = False) -> dict[str, float]:
    """Median seconds per call of each config; configs alternate within every
    repeat so that machine noise hits them alike. `inner` calls make a sample
    (a dict gives it per config; absent configs take 1). finish[name], when
    given, runs once after a config's `inner` calls, inside the timing (a
    device synchronize: `inner` launches back to back, then one wait —
    throughput). `gap_s` of idle time before every sample lets the previous
    config's threads park (SETTLE_S by default; CPU torch's OpenMP workers
    spin for milliseconds after each op and would otherwise take cores from
    the next sample). The pause also parks the runtime's workers: a sample
    after it starts by waking them (~0.05-0.1 ms on these hosts), so
    latency measurements that involve no CPU torch parallel region pass
    gap_s=0.
    `raw`, when given, receives every sample (seconds per call, in repeat
    order: pairing the same repeat of two configs cancels slow drift).
    `prime`: one untimed call (and finish) after the pause, before the timed
    ones, for every config alike — for throughput samples of a few
    milliseconds: after an idle pause a 2-core VM's second vCPU can take
    milliseconds to run again, so a 3-product sample of 4096x1024 @
    1024x256 read 175-190 GFLOP/s against 330-370 back to back."""
    finish = finish or {}
    counts = inner if isinstance(inner, dict) else dict.fromkeys(configs, inner)
    for name, fn in configs.items():
        for _ in range(warmup):
            fn()
        if name in finish:
            finish[name]()
    samples: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(repeats):
        for name, fn in configs.items():
            if gap_s:
                settle(gap_s)
            if prime:
                fn()
                if name in finish:
                    finish[name]()
            t0 = time.perf_counter()
            n = counts.get(name, 1)
            for _ in range(n):
                fn()
            if name in finish:
                finish[name]()
            samples[name].append((time.perf_counter() - t0) / n)
    if raw is not None:
        raw.update(samples)
    return {k: statistics.median(v) for k, v in samples.items()}


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def record(title: str, command: str, body: str) -> None:
    """Appends a section to BENCHMARKS.md with the machine and command."""
    m = machine()
    section = (f"\n## {title} — {m['date']}\n\n"
               f"{host_line(m)} Python {m['python']}, torch_tpu {m['torch_tpu']}.  \n"
               f"Command: `{command}`\n\n{body}\n")
    with open(ROOT / "BENCHMARKS.md", "a") as f:
        f.write(section)
