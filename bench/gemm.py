"""GEMM and convolution benchmarks.

* ``library_choice``: the candidate libraries' sgemm (called through ctypes
  in this process: OpenBLAS from scipy-openblas32, and oneDNN when
  ``TORCH_TPU_BENCH_ONEDNN=/path/libdnnl.so`` is given) against
  ``torch.matmul`` on the CPU, square sizes and small-transformer shapes,
  with the machine's measured f32 FMA peak (runtime/bench/fma_peak.c).
* ``gemm``: tpu fp32 GEMM vs CPU ``torch.matmul`` and as % of FMA peak;
  bf16 GEMM vs CPU.
* ``conv``: conv2d forward on ResNet-18 shapes vs CPU.
* ``bf16``: bf16 matmul (the TPU's native matrix dtype) vs CPU ``torch.matmul``
  at squares 256-4096 and LLM shapes, and as % of the host's bf16 matrix-unit
  peak (AMX-BF16 tiles or AVX512-BF16, runtime/bench/fma_peak.c) sampled
  alongside.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import statistics
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import torch_tpu  # noqa: F401
from bench.common import ROOT, interleaved, markdown_table

SQUARES = [256, 512, 1024, 2048, 4096]
# LLM projections (M = tokens, K, N = hidden / intermediate): a 2048-token
# batch through a 2048-wide model with a 5632-wide MLP, and a 4096-wide one.
LLM = [(2048, 2048, 2048), (2048, 5632, 2048), (2048, 2048, 5632), (4096, 4096, 4096), (4096, 11008, 4096)]
# small transformer: 4096 tokens, d_model 256, d_ff 1024 (M, N, K)
TRANSFORMER = [(4096, 1024, 256), (4096, 256, 1024), (4096, 768, 256), (4096, 256, 256)]


def _reps(flops: float) -> int:
    """Products per sample: ~8 GFLOP (~50 ms at this machine's speed). After
    CPU torch.matmul its OpenMP threads keep spinning for milliseconds on the
    same cores; samples are long, and `interleaved` idles 30 ms before each
    one, so that tail does not land in the next config's sample (with 10 ms
    samples and no gap, 256^3 read 36-40 % of peak vs 66 %)."""
    return max(1, min(400, int(8e9 / flops)))


_PEAK: dict[int, float] = {}
_FMA_ITERS = 25_000_000 // 2  # ~25-30 ms a sample on this machine's cores


@functools.cache
def _fma_lib() -> ctypes.CDLL:
    path = ROOT / "build" / "runtime" / "libtpurt_fma_peak.so"
    # always asked of the build (incremental): a library left from older sources would lack symbols
    subprocess.check_call(["cmake", "--build", str(ROOT / "build" / "runtime"), "--target", "tpurt_fma_peak"],
                          stdout=subprocess.DEVNULL)
    lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    lib.tpurt_bench_fma_gflops.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.tpurt_bench_fma_gflops.restype = ctypes.c_double
    lib.tpurt_bench_fma_flops.argtypes = [ctypes.c_int64]
    lib.tpurt_bench_fma_flops.restype = ctypes.c_double
    lib.tpurt_bench_fma_isa.restype = ctypes.c_char_p
    return lib


def fma_isa() -> str:
    """The vector extension the FMA loop runs on ("AVX-512" or "AVX2")."""
    return _fma_lib().tpurt_bench_fma_isa().decode()


def fma_peak(threads: int) -> float:
    """GFLOP/s of a register-resident FMA loop (AVX-512 where the CPU has
    it, else AVX2) on `threads` threads
    (runtime/bench/fma_peak.c): the best of nine samples, kept for the
    process (a sample that shared its cores with anything reads low, and
    every section of one bench run must divide by the same peak)."""
    if threads not in _PEAK:
        lib = _fma_lib()
        _PEAK[threads] = max(lib.tpurt_bench_fma_gflops(threads, _FMA_ITERS) for _ in range(9))
    return _PEAK[threads]


def bf16_sampler(threads: int, flops: float) -> tuple[Callable[[], None], float, str]:
    """As fma_sampler, for the bf16 matrix-unit peak loop (AMX tiles or
    AVX512-BF16 dot products: the unit the host's bf16 products can use)."""
    lib = _fma_lib()
    lib.tpurt_bench_bf16_gflops.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.tpurt_bench_bf16_gflops.restype = ctypes.c_double
    lib.tpurt_bench_bf16_flops.argtypes = [ctypes.c_int64]
    lib.tpurt_bench_bf16_flops.restype = ctypes.c_double
    lib.tpurt_bench_bf16_isa.restype = ctypes.c_char_p
    per = lib.tpurt_bench_bf16_flops(1)
    if per == 0:
        return (lambda: None), 0.0, "none"
    iters = max(10_000, int(flops / (threads * per)))
    return ((lambda: lib.tpurt_bench_bf16_gflops(threads, iters)), threads * lib.tpurt_bench_bf16_flops(iters),
            lib.tpurt_bench_bf16_isa().decode())


def fma_sampler(threads: int, flops: float) -> tuple[Callable[[], None], float]:
    """A config for `interleaved` that runs the FMA loop for about `flops`
    (one call a sample), and the flops it performs: sampled between the GEMM
    samples, it gives the peak the cores deliver at that moment (this shared
    host's clock moves by 10-15 % with its neighbours' load; the best-of-nine
    peak is its best clock)."""
    lib = _fma_lib()
    iters = max(100_000, int(flops / (threads * lib.tpurt_bench_fma_flops(1))))
    return (lambda: lib.tpurt_bench_fma_gflops(threads, iters)), threads * lib.tpurt_bench_fma_flops(iters)


class _Lib:
    def __init__(self, name: str, path: str, kind: str, threads: int):
        self.name = name
        self.lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        self.kind = kind
        if kind == "openblas":
            self.fn = self.lib.scipy_cblas_sgemm
            self.fn.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                     ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
            self.lib.scipy_openblas_set_num_threads(threads)
        else:
            self.fn = self.lib.dnnl_sgemm
            self.fn.argtypes = [ctypes.c_char, ctypes.c_char] + [ctypes.c_int64] * 3 + [
                ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
                ctypes.c_void_p, ctypes.c_int64]

    def sgemm(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        m, k = a.shape
        n = b.shape[1]
        if self.kind == "openblas":
            self.fn(101, 111, 111, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0, c.ctypes.data, n)
        else:
            self.fn(b"N", b"N", m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0, c.ctypes.data, n)


def library_choice(repeats: int) -> tuple[dict, str]:
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    import scipy_openblas32

    libs = [_Lib("OpenBLAS", str(Path(scipy_openblas32.get_lib_dir()) / "libscipy_openblas.so"), "openblas",
                 threads)]
    dnnl = os.environ.get("TORCH_TPU_BENCH_ONEDNN")
    if dnnl:
        libs.append(_Lib("oneDNN", dnnl, "onednn", threads))
    peak = fma_peak(threads)
    rows, res = [], []
    for m, n, k in [(s, s, s) for s in SQUARES] + TRANSFORMER:
        a = np.random.rand(m, k).astype(np.float32)
        b = np.random.rand(k, n).astype(np.float32)
        c = np.empty((m, n), np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        flops = 2.0 * m * n * k
        configs = {"torch": lambda: torch.matmul(ta, tb)}
        for lib in libs:
            configs[lib.name] = (lambda lib=lib: lib.sgemm(a, b, c))
        t = interleaved(configs, repeats=repeats, inner=_reps(flops), prime=True)
        gf = {k_: flops / v / 1e9 for k_, v in t.items()}
        res.append({"shape": [m, n, k], "gflops": gf})
        rows.append([f"{m}×{k} @ {k}×{n}", f"{gf['torch']:.1f}"] +
                    [f"{gf[lib.name]:.1f} ({gf[lib.name] / gf['torch']:.2f}×, {100 * gf[lib.name] / peak:.0f}%)"
                     for lib in libs])
    table = markdown_table(["shape (M×K @ K×N)", "torch CPU GFLOP/s"] +
                           [f"{lib.name} GFLOP/s (vs torch, % peak)" for lib in libs], rows)
    return {"peak_gflops": peak, "threads": threads, "rows": res}, (
        f"Measured f32 FMA peak ({threads} threads, {fma_isa()} FMA loop): **{peak:.1f} GFLOP/s**.\n\n" + table)


def gemm(repeats: int, sizes: list[int]) -> tuple[dict, str]:
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    peak = fma_peak(threads)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    rows, res = [], []
    try:
        for dtype in (torch.float32, torch.bfloat16):
            for m, n, k in [(s, s, s) for s in sizes] + TRANSFORMER:
                if dtype == torch.bfloat16 and m * n * k > 2048**3:
                    continue
                a = torch.randn(m, k).to(dtype)
                b = torch.randn(k, n).to(dtype)
                da, db = a.to("tpu"), b.to("tpu")
                flops = 2.0 * m * n * k

                inner, raw = _reps(flops), {}
                fma, fma_flops = fma_sampler(threads, inner * flops / 2)
                t = interleaved({"cpu": lambda: torch.matmul(a, b), "tpu": lambda: torch.matmul(da, db),
                                 "peak": fma}, repeats=repeats, inner={"cpu": inner, "tpu": inner, "peak": 1},
                                finish={"tpu": torch.tpu.synchronize}, gap_s=0.03, raw=raw, prime=True)
                gf = {k_: flops / v / 1e9 for k_, v in t.items() if k_ != "peak"}
                gf["peak"] = fma_flops / t["peak"] / 1e9
                # tpu / peak of the same repeat (adjacent samples), median over repeats
                gf["tpu_of_peak"] = statistics.median(
                    (flops / tt) / (fma_flops / tp) for tt, tp in zip(raw["tpu"], raw["peak"]))
                res.append({"dtype": str(dtype), "shape": [m, n, k], "gflops": gf})
                rows.append([str(dtype).replace("torch.", ""), f"{m}×{k} @ {k}×{n}", f"{gf['cpu']:.1f}",
                             f"{gf['tpu']:.1f}", f"{gf['tpu'] / gf['cpu']:.2f}×", f"{100 * gf['tpu'] / peak:.0f}%",
                             f"{gf['peak']:.1f}", f"{100 * gf['tpu_of_peak']:.0f}%"])
    finally:
        torch.set_float32_matmul_precision(old)
    table = markdown_table(["dtype", "shape", "CPU torch.matmul GFLOP/s", "tpu GFLOP/s", "tpu / CPU",
                            "tpu % of best peak", "FMA peak alongside GFLOP/s", "tpu % of peak alongside"], rows)
    return {"peak_gflops": peak, "rows": res}, (
        f"GEMM library: {torch_tpu._C._gemm_library()}; measured f32 FMA peak {peak:.1f} GFLOP/s "
        f"({threads} threads, best of nine samples). Goals: fp32 ≥ 0.9× CPU, ≥ 75 % of peak. tpu: back-to-back "
        f"products and one synchronize per sample (throughput; the per-op round trip is the device bench's latency "
        f"figure). The FMA loop is also sampled between each shape's samples (\"alongside\"): this shared host's "
        f"clock follows its neighbours' load, so the peak of the moment is the fair denominator (median over repeats of tpu / the FMA sample next to it); both are shown.\n\n"
        + table)


# ResNet-18 convolutions (batch N): (C_in, H, C_out, kernel, stride, padding)
RESNET18 = [(3, 224, 64, 7, 2, 3), (64, 56, 64, 3, 1, 1), (64, 56, 128, 3, 2, 1), (64, 56, 128, 1, 2, 0),
            (128, 28, 128, 3, 1, 1), (128, 28, 256, 3, 2, 1), (256, 14, 256, 3, 1, 1), (256, 14, 512, 3, 2, 1),
            (512, 7, 512, 3, 1, 1)]


def conv(repeats: int, batch: int) -> tuple[dict, str]:
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    rows, res = [], []
    try:
        for ci, h, co, k, s, p in RESNET18:
            x = torch.randn(batch, ci, h, h)
            w = torch.randn(co, ci, k, k)
            dx, dw = x.to("tpu"), w.to("tpu")
            ho = (h + 2 * p - k) // s + 1
            flops = 2.0 * batch * co * ho * ho * ci * k * k

            t = interleaved({"cpu": lambda: torch.nn.functional.conv2d(x, w, stride=s, padding=p),
                             "tpu": lambda: torch.nn.functional.conv2d(dx, dw, stride=s, padding=p)},
                            repeats=repeats, inner=_reps(flops), finish={"tpu": torch.tpu.synchronize},
                            gap_s=0.03, prime=True)
            gf = {k_: flops / v / 1e9 for k_, v in t.items()}
            res.append({"shape": [batch, ci, h, co, k, s, p], "gflops": gf})
            rows.append([f"{ci}→{co}, {h}×{h}, k{k} s{s} p{p}", f"{t['cpu'] * 1e3:.2f}", f"{t['tpu'] * 1e3:.2f}",
                         f"{gf['tpu']:.1f}", f"{t['cpu'] / t['tpu']:.2f}×"])
    finally:
        torch.set_float32_matmul_precision(old)
    table = markdown_table(["conv (batch %d)" % batch, "CPU ms", "tpu ms", "tpu GFLOP/s", "tpu speed vs CPU"], rows)
    return {"rows": res}, ("conv2d forward, fp32, ResNet-18 shapes (goal ≥ 0.8× CPU; tpu: back-to-back "
                           "convolutions, one synchronize per sample):\n\n" + table)


def bf16(repeats: int, sizes: list[int]) -> tuple[dict, str]:
    """bf16 @ bf16 -> bf16 on tpu vs CPU torch.matmul (oneDNN), side by side,
    and the tpu rate over the bf16 peak loop sampled next to it."""
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    rows, res = [], []
    for m, n, k in [(s_, s_, s_) for s_ in sizes] + [x for x in LLM if x[0] not in sizes or x[1] != x[0]]:
        a = torch.randn(m, k).bfloat16()
        b = torch.randn(k, n).bfloat16()
        da, db = a.to("tpu"), b.to("tpu")
        flops = 2.0 * m * n * k
        inner, raw = max(1, min(400, int(3e10 / flops))), {}
        peak, peak_flops, unit = bf16_sampler(threads, inner * flops / 4)
        t = interleaved({"cpu": lambda: torch.matmul(a, b), "tpu": lambda: torch.matmul(da, db), "peak": peak},
                        repeats=repeats, inner={"cpu": inner, "tpu": inner, "peak": 1},
                        finish={"tpu": torch.tpu.synchronize}, gap_s=0.03, raw=raw, prime=True)
        gf = {k_: flops / v / 1e9 for k_, v in t.items() if k_ != "peak"}
        gf["peak"] = peak_flops / t["peak"] / 1e9 if peak_flops else 0.0
        gf["tpu_of_peak"] = statistics.median(
            (flops / tt) / (peak_flops / tp) for tt, tp in zip(raw["tpu"], raw["peak"])) if peak_flops else 0.0
        gf["ratio"] = statistics.median(c / tt for c, tt in zip(raw["cpu"], raw["tpu"]))
        res.append({"shape": [m, n, k], "gflops": gf})
        rows.append([f"{m}×{k} @ {k}×{n}", f"{gf['cpu']:.0f}", f"{gf['tpu']:.0f}", f"{gf['ratio']:.2f}×",
                     f"{gf['peak']:.0f}", f"{100 * gf['tpu_of_peak']:.0f}%"])
    table = markdown_table(["shape", "CPU torch GFLOP/s", "tpu GFLOP/s", "tpu / CPU (paired)",
                            f"{unit} peak alongside GFLOP/s", "tpu % of peak alongside"], rows)
    return {"unit": unit, "threads": threads, "rows": res}, (
        f"bf16 matmul, bf16 result, {threads} threads; tpu on {torch_tpu._C._cpu_info()['bf16_matmul']}. "
        f"Goals: tpu / CPU ≥ 1.0×, ≥ 70 % of the {unit} peak (a register-resident loop of the unit's "
        f"instruction on every thread, sampled between each shape's samples). tpu: back-to-back products, one "
        f"synchronize per sample.\n\n" + table)
