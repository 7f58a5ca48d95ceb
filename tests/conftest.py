"""Shared fixtures: every test starts with CPU fallback off and the device
synchronized and free of pending errors."""
from __future__ import annotations

import os
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


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter of this venv (for env-dependent setup)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=ROOT)
