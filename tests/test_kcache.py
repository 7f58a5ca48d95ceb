"""torch.tpu._get_cache_stats() / _clear_cache(): the persistent kernel
cache's statistics under TorchTPU's names. Entries are stored and read
through the runtime's internal entry points (exported for tests), as the
code generator does, in a temporary cache directory."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest
import torch

import torch_tpu

LIB = "libtpurt.so"  # by soname: the copy (x86-64 level variant) torch_tpu mapped


class KKey(ctypes.Structure):
    _fields_ = [(n, ctypes.c_char_p) for n in ("source", "compiler", "compiler_version", "flags", "isa")]


class KSo(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char * 32), ("fd", ctypes.c_int), ("size", ctypes.c_size_t),
                ("compile_seconds", ctypes.c_double), ("key_hash", ctypes.c_char * 65)]


@pytest.fixture
def rt(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_TPU_CACHE_READONLY", raising=False)
    monkeypatch.delenv("TORCH_TPU_CACHE_MAX_BYTES", raising=False)
    lib = ctypes.CDLL(LIB)
    lib.tpurt__kcache_store.argtypes = [ctypes.POINTER(KKey), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_double]
    lib.tpurt__kcache_lookup.argtypes = [ctypes.POINTER(KKey), ctypes.POINTER(KSo)]
    lib.tpurt__kcache_so_close.argtypes = [ctypes.POINTER(KSo)]
    torch.tpu._clear_cache()
    yield lib
    torch.tpu._clear_cache()


def key(source: str) -> KKey:
    return KKey(source.encode(), b"/usr/bin/cc", b"cc 12", b"-O2 -shared -fPIC", b"x86-64")


def lookup(lib, k: KKey) -> tuple[int, bytes]:
    so = KSo()
    r = lib.tpurt__kcache_lookup(ctypes.byref(k), ctypes.byref(so))
    data = b""
    if r == 1:
        data = os.pread(so.fd, so.size, 0)
        lib.tpurt__kcache_so_close(ctypes.byref(so))
    return r, data


def test_stats_names_and_types(rt):
    s = torch.tpu._get_cache_stats()
    for name in ("num_cache_reqs", "num_cache_hits", "num_cache_misses", "num_cache_refused", "num_cache_corrupt",
                 "num_cache_stores", "num_cache_stores_skipped", "num_cache_store_failures",
                 "num_cache_evictions", "max_bytes"):
        assert isinstance(s[name], int), name
    assert s["num_cache_reqs"] == s["num_cache_hits"] == 0
    assert s["max_bytes"] == 1 << 30
    assert s["readonly"] is False
    assert s["per_entry_stats"] == {}


def test_entries_and_clear(rt, tmp_path):
    a, b = key("kernel a"), key("kernel b")
    blob = bytes(range(256)) * 8
    assert lookup(rt, a) == (0, b"")
    assert rt.tpurt__kcache_store(ctypes.byref(a), blob, len(blob), 0.75) == 0
    assert rt.tpurt__kcache_store(ctypes.byref(b), blob[:100], 100, 2.0) == 0
    assert lookup(rt, a) == (1, blob)
    assert lookup(rt, a) == (1, blob)
    s = torch.tpu._get_cache_stats()
    assert (s["num_cache_reqs"], s["num_cache_hits"], s["num_cache_misses"], s["num_cache_stores"]) == (3, 2, 1, 2)
    per = s["per_entry_stats"]
    assert len(per) == 2
    for entry_id, e in per.items():
        assert isinstance(entry_id, str) and len(entry_id) == 64
        assert set(e) == {"read_count", "compile_duration", "last_read"}
        assert isinstance(e["read_count"], int) and isinstance(e["compile_duration"], float)
        assert (tmp_path / "cache" / f"{entry_id}.tkc").is_file()
    by_reads = sorted(per.values(), key=lambda e: e["read_count"])
    assert by_reads[0]["read_count"] == 0 and by_reads[0]["last_read"] is None
    assert by_reads[0]["compile_duration"] == pytest.approx(2.0)
    assert by_reads[1]["read_count"] == 2 and isinstance(by_reads[1]["last_read"], float)
    assert by_reads[1]["compile_duration"] == pytest.approx(0.75)
    assert torch.tpu._cache_dir() == str(tmp_path / "cache")

    torch.tpu._clear_cache()
    s = torch.tpu._get_cache_stats()
    assert s["num_cache_reqs"] == s["num_cache_hits"] == s["num_cache_stores"] == 0
    assert s["per_entry_stats"] == {}
    assert not list((tmp_path / "cache").glob("*.tkc"))
    assert lookup(rt, a) == (0, b"")


def test_readonly_clear_keeps_entries(rt, tmp_path, monkeypatch):
    a = key("kernel ro")
    assert rt.tpurt__kcache_store(ctypes.byref(a), b"\x7fELF....", 8, 0.1) == 0
    monkeypatch.setenv("TORCH_TPU_CACHE_READONLY", "1")
    assert torch.tpu._get_cache_stats()["readonly"] is True
    assert lookup(rt, a) == (1, b"\x7fELF....")
    torch.tpu._clear_cache()
    assert torch.tpu._get_cache_stats()["num_cache_hits"] == 0
    assert len(list((tmp_path / "cache").glob("*.tkc"))) == 1


def test_refused_directory(rt, tmp_path, monkeypatch):
    bad = tmp_path / "shared"
    bad.mkdir()
    bad.chmod(0o777)
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(bad))
    assert lookup(rt, key("kernel x"))[0] == -1
    assert torch.tpu._get_cache_stats()["num_cache_refused"] == 1
    with pytest.raises(RuntimeError, match="writable by others"):
        torch.tpu._cache_dir()
