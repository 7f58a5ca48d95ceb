"""Caching allocator statistics, empty_cache, out-of-memory behaviour."""
from __future__ import annotations

import gc

import pytest
import torch

from conftest import run_python

MiB = 2**20


def test_stats_track_allocations():
    torch.tpu.synchronize()
    gc.collect()
    torch.tpu.empty_cache()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="tpu")
    assert torch.tpu.memory_allocated() == base + 3 * MiB
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    y = torch.empty(5 * MiB, dtype=torch.uint8, device="tpu")
    peak = torch.tpu.max_memory_allocated()
    assert peak == base + 8 * MiB
    del x, y
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() == peak
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base
    stats = torch.tpu.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "allocation.all.current",
                "segment.large_pool.current", "num_ooms", "num_alloc_retries", "requested_bytes.all.current"):
        assert key in stats, key
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()


def test_cache_reuse_and_empty_cache():
    torch.tpu.empty_cache()
    r0 = torch.tpu.memory_reserved()
    x = torch.empty(16 * MiB, dtype=torch.uint8, device="tpu")
    ptr = x.data_ptr()
    del x
    assert torch.tpu.memory_reserved() >= r0 + 16 * MiB  # cached, not returned
    y = torch.empty(16 * MiB, dtype=torch.uint8, device="tpu")
    assert y.data_ptr() == ptr  # served from the cache
    del y
    torch.tpu.empty_cache()
    assert torch.tpu.memory_reserved() == r0
    free, total = torch.tpu.mem_get_info()
    assert total == torch.tpu.get_device_properties().total_memory
    assert free == total - torch.tpu.memory_reserved()


def test_oom_then_continued_use():
    total = torch.tpu.get_device_properties().total_memory
    ooms = torch.tpu.memory_stats()["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError, match=r"TPU out of memory\. Tried to allocate"):
        torch.empty(total + MiB, dtype=torch.uint8, device="tpu")
    assert torch.tpu.memory_stats()["num_ooms"] == ooms + 1
    x = torch.ones(1000).to("tpu")
    assert x.cpu().sum().item() == 1000


def test_oom_under_a_small_limit_frees_cache_and_recovers():
    code = r"""
import torch, torch_tpu
MiB = 2**20
assert torch.tpu.get_device_properties().total_memory == 64 * MiB
a = torch.empty(40 * MiB, dtype=torch.uint8, device="tpu")
try:
    b = torch.empty(40 * MiB, dtype=torch.uint8, device="tpu")
except torch.OutOfMemoryError as e:
    msg = str(e)
    assert "TPU 0 has a total capacity of 64.00 MiB" in msg, msg
    assert "40.00 MiB" in msg, msg
    print("oom")
del a
# the freed 40 MiB is cached; a differently sized request must still fit
c = torch.empty(50 * MiB, dtype=torch.uint8, device="tpu")
c.fill_(1)
print(int(c[-1].item()), torch.tpu.memory_stats()["num_alloc_retries"] >= 1)
"""
    r = run_python(code, env={"TORCH_TPU_HBM_LIMIT": str(64 * 2**20)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["oom", "1", "True"]


def test_host_pinned_stats():
    before = torch.tpu.host_memory_stats()["allocation"]["current"]
    p = torch.empty(1000).pin_memory()
    assert p.is_pinned()
    assert torch.tpu.host_memory_stats()["allocation"]["current"] == before + 1
    del p
