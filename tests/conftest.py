"""Shared fixtures: every test starts with CPU fallback off and the device
synchronized and free of pending errors.

The kernel behaviour tests (tests/test_ops_*.py, tests/test_optim.py) run
twice, in the strict and in the DeferAndFuse execution mode ([strict] /
[defer] in the test ids), and must give the same results in both."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_tpu  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_device_state():
    torch_tpu._C._set_cpu_fallback(False)
    torch_tpu._C._reset_fallback_counts()
    yield
    torch_tpu._C._set_cpu_fallback(False)
    for i in range(torch.tpu.device_count()):
        torch.tpu.synchronize(i)


_BOTH_MODES = re.compile(r"^test_(ops_\w+|optim)$")


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if _BOTH_MODES.match(module) and "_exec_mode" in metafunc.fixturenames:
        metafunc.parametrize("_exec_mode", ["strict", "defer"], indirect=True)


@pytest.fixture(autouse=True)
def _exec_mode(request):
    """Runs the test in request.param's execution mode (modules selected by
    pytest_generate_tests); other tests run in the process's mode."""
    mode = getattr(request, "param", None)
    if mode is None:
        yield None
        return
    previous = torch_tpu.set_execution_mode(mode)
    try:
        yield mode
    finally:
        torch_tpu.set_execution_mode(previous)


def rnd(shape, dtype=torch.float32, seed=0, int_range=50):
    """Host tensor from a fixed seed: normal floats, random bools, integers
    in [-int_range, int_range)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-int_range, int_range, shape, generator=g).to(dtype)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter of this venv (for env-dependent setup),
    with faulthandler on: a crash leaves every thread's Python stack in stderr."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(params=["strict", "defer"])
def both_modes(request):
    """Runs the test once in the strict and once in the DeferAndFuse mode
    (for suites outside the ops modules, e.g. tests/hf, tests/clients)."""
    previous = torch_tpu.set_execution_mode(request.param)
    yield request.param
    torch_tpu.set_execution_mode(previous)


@pytest.fixture
def one_cpu_thread():
    """The CPU reference on one thread: OpenMP threads that spin on this
    shared 2-core machine make a tiny CPU run take tens of seconds."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
