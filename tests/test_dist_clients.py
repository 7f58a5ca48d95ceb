"""Distributed clients on tpu with tpu_dist: TorchTitan's Llama 3 debug model
(FSDP, 2 processes under torchrun) and Ray Train's TorchTrainer (2 workers, DDP)
through their example scripts in examples/distributed/.

They need the packages of requirements-full*.txt (`make venv-full`, which
`make test-full` runs first) and are skipped without them. TorchTitan's run
takes ~20 s; Ray's ~45 s (a local Ray cluster starts), so it runs under
TORCH_TPU_TEST_FULL=1 (make test-full) only."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FULL = os.environ.get("TORCH_TPU_TEST_FULL") == "1"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _run(args: list[str], timeout: float) -> str:
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    out = ANSI.sub("", r.stdout + r.stderr)
    assert r.returncode == 0, out[-6000:]
    return out


def _assert_trains(losses: list[float], steps: int) -> None:
    assert len(losses) == steps, losses
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0], losses
    half = steps // 2
    assert sum(losses[half:]) / (steps - half) < sum(losses[:half]) / half, losses


@pytest.mark.skipif(not _installed("torchtitan"),
                    reason="torchtitan not installed: `make venv-full` (requirements-full*.txt)")
def test_torchtitan_llama3_debugmodel_fsdp_on_tpu(tmp_path):
    steps = 5
    out = _run(["examples/distributed/torchtitan_llama3.py", "--steps", str(steps),
                "--assets", str(tmp_path / "assets")], timeout=900)
    # TorchTitan chose the device and the backend by itself
    assert "TPU_DIST rank=0 device=tpu:0 backend=tpu_dist world=2" in out, out[-4000:]
    assert "TPU capacity: TPU" in out and "Applied FSDP to the model" in out, out[-4000:]
    assert "dp_shard=2" in out, out[-4000:]
    losses = [float(x) for x in re.findall(r"step:\s*\d+\s+loss:\s*(\S+)", out)]
    _assert_trains(losses, steps)
    assert "Training completed" in out


@pytest.mark.skipif(not _installed("ray.train"),
                    reason="ray[train] not installed: `make venv-full` (requirements-full*.txt)")
@pytest.mark.skipif(not FULL, reason="~45 s (a local Ray cluster): TORCH_TPU_TEST_FULL=1 (make test-full)")
def test_ray_train_torchtrainer_tpu_dist(tmp_path):
    steps, result = 6, tmp_path / "losses.json"
    out = _run(["examples/distributed/ray_train_llama.py", "--workers", "2", "--steps", str(steps),
                "--out", str(result)], timeout=900)
    rec = json.loads(result.read_text())
    assert rec["world"] == 2 and rec["backend"] == "tpu_dist" and rec["device"].startswith("tpu"), rec
    for rank in (0, 1):
        assert re.search(rf"worker {rank}/2: model on tpu:\d, process group backend tpu_dist", out), out[-4000:]
    _assert_trains(rec["losses"], steps)
