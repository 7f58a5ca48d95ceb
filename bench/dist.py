"""Distributed benchmarks (``python -m bench dist``).

all_reduce bus bandwidth on 2 processes: tpu_dist on tpu tensors (with and
with the fingerprint check on the host's shared-memory board, with it through
Gloo, and without it: TORCH_TPU_DIST_VERIFY=1 / gloo / 0) vs Gloo on CPU tensors
of the same sizes, all in one "cpu:gloo,tpu:tpu_dist" group, configurations
alternating in every repeat; and DDP training throughput of the Llama example
(examples/distributed/train_llama.py) on 1 and 2 processes under torchrun,
the per-process batch fixed (weak scaling).

Bus bandwidth = bytes * 2 (n - 1) / n / time, n = 2 (NCCL-tests' definition).
"""
from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time

from bench import common

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
CONFIGS = ("gloo cpu", "tpu_dist", "tpu_dist verify=gloo", "tpu_dist verify=0")


def _fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(sizes: list[int], repeats: int) -> None:
    """One rank of the all_reduce benchmark; rank 0 prints the JSON."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    dev = torch.device("tpu", 0)
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")
    os.environ["TORCH_TPU_DIST_VERIFY"] = "gloo"
    through_gloo = dist.new_group(backend="tpu_dist")
    os.environ["TORCH_TPU_DIST_VERIFY"] = "0"
    unverified = dist.new_group(backend="tpu_dist")
    groups = {"gloo cpu": None, "tpu_dist": None, "tpu_dist verify=gloo": through_gloo, "tpu_dist verify=0": unverified}
    default = dist.distributed_c10d._get_default_group()
    paths = {c: (g or default)._get_backend(dev)._verify_path for c, g in groups.items() if c != "gloo cpu"}
    if paths != {"tpu_dist": "board", "tpu_dist verify=gloo": "gloo", "tpu_dist verify=0": "off"}:
        raise RuntimeError(f"unexpected fingerprint checks: {paths}")
    out: dict[str, dict[str, list[float]]] = {c: {} for c in CONFIGS}
    for size in sizes:
        n = size // 4
        bufs = {"gloo cpu": torch.ones(n), "tpu_dist": torch.ones(n, device=dev)}
        bufs["tpu_dist verify=0"] = bufs["tpu_dist verify=gloo"] = bufs["tpu_dist"]
        iters = max(3, min(100, (32 << 20) // size))
        for c in CONFIGS:  # warm up: connections, staging buffers
            dist.all_reduce(bufs[c], group=groups[c])
        for _ in range(repeats):
            for c in CONFIGS:
                t = bufs[c]
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=groups[c])
                if t.device.type == "tpu":
                    torch.tpu.synchronize()
                dt = (time.perf_counter() - t0) / iters
                out[c].setdefault(str(size), []).append(dt)
                t.fill_(1)
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def allreduce(repeats: int, sizes: list[int] | None = None) -> tuple[dict, str]:
    sizes = sizes or SIZES
    port = _port()
    procs = []
    for r in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
               "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "TPU_NUM_DEVICES": "1", "LOCAL_WORLD_SIZE": "2"}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", f"from bench import dist; dist._worker({sizes!r}, {repeats})"],
            cwd=common.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    for p, o in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(f"all_reduce benchmark rank failed:\n{o[-4000:]}")
    raw = json.loads(next(line for line in outs[0].splitlines() if line.startswith("RESULT "))[7:])
    rows, res = [], {}
    for size in sizes:
        med = {c: statistics.median(raw[c][str(size)]) for c in CONFIGS}
        bw = {c: size * 2 * (2 - 1) / 2 / med[c] / 1e9 for c in CONFIGS}
        res[str(size)] = {"seconds": med, "busbw_GBps": bw}
        rows.append([_fmt_size(size), f"{med['gloo cpu'] * 1e6:,.0f}", f"{bw['gloo cpu']:.2f}",
                     f"{bw['tpu_dist']:.2f}", f"{bw['tpu_dist'] / bw['gloo cpu']:.2f}×",
                     f"{bw['tpu_dist verify=gloo'] / bw['gloo cpu']:.2f}×",
                     f"{bw['tpu_dist verify=0'] / bw['gloo cpu']:.2f}×"])
    table = common.markdown_table(
        ["size", "gloo cpu µs", "gloo cpu busbw GB/s", "tpu_dist busbw GB/s", "tpu_dist / gloo",
         "check through Gloo (verify=gloo) / gloo", "no check (verify=0) / gloo"], rows)
    return res, table


def ddp_scaling(steps: int = 12) -> tuple[dict, str]:
    """Llama DDP tokens/s on 1 and 2 processes (same per-process batch)."""
    script = str(common.ROOT / "examples" / "distributed" / "train_llama.py")
    args = ["--parallel", "ddp", "--steps", str(steps), "--batch", "8", "--block", "64", "--layers", "4",
            "--width", "128", "--heads", "4", "--kv-heads", "2"]
    res = {}
    for n in (1, 2):
        env = {k: v for k, v in os.environ.items() if k not in ("TPU_NUM_DEVICES", "LOCAL_WORLD_SIZE")}
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
                            f"--master-port={_port()}", script, *args], capture_output=True, text=True,
                           cwd=common.ROOT, env=env, timeout=1800)
        m = re.search(r"([\d,]+) tokens/s", r.stdout)
        if r.returncode or not m:
            raise RuntimeError(f"DDP run on {n} processes failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        res[n] = float(m.group(1).replace(",", ""))
    table = common.markdown_table(
        ["processes", "tokens/s (all ranks)", "scaling vs 1 process"],
        [[str(n), f"{res[n]:,.0f}", f"{res[n] / res[1]:.2f}×"] for n in (1, 2)])
    return {"tokens_per_s": res, "args": args}, table
