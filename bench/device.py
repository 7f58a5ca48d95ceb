"""Device foundation benchmarks: host<->device copy bandwidth against a host
memcpy of the same size, and the round trip of the smallest device op."""
from __future__ import annotations

import ctypes

import torch

import torch_tpu  # noqa: F401
from bench.common import interleaved, markdown_table

MiB = 2**20


def copy_bandwidth(sizes_mib: list[int], repeats: int) -> tuple[list[dict], str]:
    rows, results = [], []
    for mib in sizes_mib:
        n = mib * MiB
        a = torch.ones(n, dtype=torch.uint8)
        b = torch.empty(n, dtype=torch.uint8)
        pinned = torch.ones(n, dtype=torch.uint8).pin_memory()
        pinned_out = torch.empty(n, dtype=torch.uint8).pin_memory()
        dev = torch.empty(n, dtype=torch.uint8, device="tpu")
        dev2 = torch.empty(n, dtype=torch.uint8, device="tpu")
        pa, pb = a.data_ptr(), b.data_ptr()
        inner = max(1, 64 // mib)
        t = interleaved({
            "memcpy": lambda: ctypes.memmove(pb, pa, n),
            "h2d": lambda: dev.copy_(a),
            "h2d_pinned": lambda: dev.copy_(pinned),
            "d2h": lambda: b.copy_(dev),
            "d2h_pinned": lambda: pinned_out.copy_(dev),
            "d2d": lambda: (dev2.copy_(dev), torch.tpu.synchronize()),
        }, repeats=repeats, inner=inner, gap_s=0)  # no CPU torch parallel region to settle after
        gbs = {k: n / v / 1e9 for k, v in t.items()}
        results.append({"size_mib": mib, "seconds": t, "GBps": gbs})
        rows.append([f"{mib} MiB", f"{gbs['memcpy']:.1f}",
                     *(f"{gbs[k]:.1f} ({gbs[k] / gbs['memcpy']:.2f}×)"
                       for k in ("h2d", "h2d_pinned", "d2h", "d2h_pinned", "d2d"))])
    table = markdown_table(["size", "memcpy GB/s", "H2D", "H2D pinned", "D2H", "D2H pinned", "D2D"], rows)
    return results, table


def op_roundtrip(repeats: int) -> tuple[dict, str]:
    cpu = torch.zeros(1)
    tpu = torch.zeros(1, device="tpu")
    host = torch.zeros(1)

    def tpu_sync() -> None:
        tpu.fill_(1.0)
        torch.tpu.synchronize()

    def tpu_burst() -> None:
        for _ in range(1000):
            tpu.fill_(1.0)
        torch.tpu.synchronize()

    def cpu_burst() -> None:
        for _ in range(1000):
            cpu.fill_(1.0)

    a_cpu, b_cpu = torch.ones(1), torch.ones(1)
    a_tpu, b_tpu = a_cpu.to("tpu"), b_cpu.to("tpu")

    def cpu_adds() -> None:
        for _ in range(1000):
            torch.add(a_cpu, b_cpu)

    def tpu_adds() -> None:
        for _ in range(1000):
            torch.add(a_tpu, b_tpu)
        torch.tpu.synchronize()

    t = interleaved({
        "cpu_fill": lambda: cpu.fill_(1.0),
        "tpu_fill_sync": tpu_sync,
        "tpu_item": lambda: tpu.item(),
        "tpu_d2h_1elem": lambda: host.copy_(tpu),
    }, repeats=repeats, inner=200, gap_s=0)
    # one-element CPU ops run no parallel region, so nothing spins to settle after; a pause would park
    # the runtime's workers and make every sample start by waking them (SETTLE_S in bench/common.py)
    burst = interleaved({"cpu_1000_fills": cpu_burst, "tpu_1000_fills_1_sync": tpu_burst,
                         "cpu_1000_adds": cpu_adds, "tpu_1000_adds_1_sync": tpu_adds}, repeats=repeats, gap_s=0)
    t.update({k: v / 1000 for k, v in burst.items()})
    us = {k: v * 1e6 for k, v in t.items()}
    rows = [
        ["CPU `fill_` of 1 element (no device)", f"{us['cpu_fill']:.2f}", "1.00×"],
        ["tpu `fill_` + `synchronize()` (full round trip)", f"{us['tpu_fill_sync']:.2f}",
         f"{us['tpu_fill_sync'] / us['cpu_fill']:.2f}×"],
        ["tpu `.item()` (device→host of 1 element)", f"{us['tpu_item']:.2f}", f"{us['tpu_item'] / us['cpu_fill']:.2f}×"],
        ["tpu 1-element D2H `copy_`", f"{us['tpu_d2h_1elem']:.2f}", f"{us['tpu_d2h_1elem'] / us['cpu_fill']:.2f}×"],
        ["CPU `fill_`, per op in a burst of 1000", f"{us['cpu_1000_fills']:.2f}", "—"],
        ["tpu `fill_`, per op in a burst of 1000 + 1 sync", f"{us['tpu_1000_fills_1_sync']:.2f}",
         f"{us['tpu_1000_fills_1_sync'] / us['cpu_1000_fills']:.2f}× CPU burst"],
        ["CPU `torch.add` of two 1-element tensors, per op in a burst of 1000", f"{us['cpu_1000_adds']:.2f}", "—"],
        ["tpu `torch.add` of two 1-element tensors, per op, 1000 + 1 sync (goal ≤ 2× CPU)",
         f"{us['tpu_1000_adds_1_sync']:.2f}", f"{us['tpu_1000_adds_1_sync'] / us['cpu_1000_adds']:.2f}× CPU adds"],
    ]
    return {"microseconds": us}, markdown_table(["operation", "µs (median)", "vs CPU fill_"], rows)
