"""Streams and events: asynchronous execution, ordering, waits, timing,
errors raised at the next synchronization point."""
from __future__ import annotations

import time

import pytest
import torch

import torch_tpu
from tests.conftest import run_python

BIG = 1 << 26  # 64M float32 = 256 MiB: long enough to observe asynchrony


def test_stream_objects():
    s = torch.tpu.Stream()
    assert s.device.type == "tpu" and s.stream_id != 0
    d = torch.tpu.default_stream()
    assert d.stream_id == 0 and d.device == torch.device("tpu", 0)
    assert torch.tpu.current_stream() == d
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s
        assert torch.accelerator.current_stream() == s
    assert torch.tpu.current_stream() == d
    assert s.query()
    s.synchronize()


def test_launch_returns_before_completion():
    src = torch.ones(BIG).pin_memory()
    dst = torch.empty(BIG, device="tpu")
    s = torch.tpu.current_stream()
    dst.copy_(src, non_blocking=True)
    assert not s.query(), "a 256 MiB non-blocking copy finished before the call returned"
    s.synchronize()
    assert s.query()
    assert dst[-1].item() == 1.0


def test_event_wait_orders_streams():
    src = torch.full((BIG,), 3.0).pin_memory()
    a = torch.zeros(BIG, device="tpu")
    b = torch.zeros(BIG, device="tpu")
    torch.tpu.synchronize()  # the zero fills ran on the default stream
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    e = torch.tpu.Event()
    with torch.tpu.stream(s1):
        a.copy_(src, non_blocking=True)
        e.record()
    s2.wait_event(e)
    with torch.tpu.stream(s2):
        b.copy_(a)  # device-to-device, must see the finished host copy
    s2.synchronize()
    assert b[0].item() == 3.0 and b[-1].item() == 3.0
    assert e.query()


def test_wait_stream_and_event_sync():
    src = torch.full((BIG,), 2.0).pin_memory()
    a = torch.zeros(BIG, device="tpu")
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream()
    s1.wait_stream(torch.tpu.default_stream())  # after the zero fill
    with torch.tpu.stream(s1):
        a.copy_(src, non_blocking=True)
    s2.wait_stream(s1)
    ev = s2.record_event()
    ev.synchronize()
    assert ev.query() and s1.query()
    assert a[-1].item() == 2.0


def test_elapsed_time():
    start = torch.tpu.Event(enable_timing=True)
    end = torch.tpu.Event(enable_timing=True)
    src = torch.ones(BIG).pin_memory()
    dst = torch.empty(BIG, device="tpu")
    t0 = time.perf_counter()
    start.record()
    dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3
    ms = start.elapsed_time(end)
    assert 0.0 < ms <= wall_ms + 1.0
    untimed = torch.tpu.Event()
    untimed.record()
    untimed.synchronize()
    with pytest.raises(ValueError, match="enable_timing"):
        start.elapsed_time(untimed)


def test_async_error_raised_at_sync_with_op_name_then_usable():
    torch_tpu._C._debug_launch_error("bad index 12 for dimension of size 3")
    with pytest.raises(RuntimeError, match="debug_error.*bad index 12"):
        torch.tpu.synchronize()
    torch.tpu.synchronize()  # reported once, then cleared
    assert torch.ones(3).to("tpu").cpu().tolist() == [1.0, 1.0, 1.0]


def test_async_error_raised_by_item_and_stream_sync():
    torch_tpu._C._debug_launch_error("first failure")
    with pytest.raises(RuntimeError, match="first failure"):
        torch.ones(1).to("tpu").item()
    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        torch_tpu._C._debug_launch_error("on a side stream")
    with pytest.raises(RuntimeError, match="on a side stream"):
        s.synchronize()
    s.synchronize()


def test_launch_blocking_reports_error_at_the_call():
    torch_tpu._C._set_launch_blocking(True)
    try:
        with pytest.raises(RuntimeError, match="right here"):
            torch_tpu._C._debug_launch_error("right here")
    finally:
        torch_tpu._C._set_launch_blocking(False)
    torch.tpu.synchronize()


def _kernel_times(mode: str, setting: str) -> dict[str, tuple[int, float]]:
    code = f"""
import torch, torch_tpu
with torch_tpu.execution_mode({mode!r}):
    a = torch.randn(64, 64, device="tpu")
    for _ in range(7):
        b = (a @ a).relu() + 1  # recorded on one line
        b.sum().item()
torch.tpu.synchronize()
"""
    out = run_python(code, {"TORCH_TPU_KERNEL_TIMES": setting})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stderr.splitlines()
    head = [i for i, ln in enumerate(lines) if ln.startswith("torch_tpu kernel times")]
    assert len(head) == 1, out.stderr[-3000:]
    rows = {}
    for ln in lines[head[0] + 2:]:
        total_ms, calls, _per, _share, name = ln.split(None, 4)
        rows[name] = (int(calls), float(total_ms))
    return rows


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_kernel_times_count_every_command_by_name(mode):
    # TORCH_TPU_KERNEL_TIMES=1: at exit, stderr lists the device's commands
    # by name with their calls and wall time; a deferred unit's recording
    # site is dropped from its name (one row per op or fused group) unless
    # the setting is "sites"
    rows = _kernel_times(mode, "1")
    assert rows["gemm"][0] == 7 and rows["gemm"][1] > 0, rows
    assert not any("recorded at" in n for n in rows), rows
    if mode == "strict":
        assert rows["relu"][0] == 7 and rows["add"][0] == 7, rows
    else:  # relu and + 1 are one kernel
        assert sum(c for n, (c, _) in rows.items() if n.startswith("fused(") and "relu" in n) == 7, rows
    sites = _kernel_times(mode, "sites")
    if mode == "defer":
        assert any("recorded at" in n and "test_streams" not in n and "<string>:6" in n for n in sites), sites
    assert sum(c for _, (c, _) in sites.items()) == sum(c for _, (c, _) in rows.items()), (sites, rows)


def test_kernel_times_are_off_by_default():
    out = run_python("import torch, torch_tpu\n(torch.ones(3, device='tpu') + 1).cpu()\n",
                     {"TORCH_TPU_KERNEL_TIMES": "0"})
    assert out.returncode == 0 and "kernel times" not in out.stderr, out.stderr[-2000:]
