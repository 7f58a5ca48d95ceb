"""torch_tpu.version and the packaging metadata agree with what is built."""
from __future__ import annotations

import re
import tomllib

import torch

import torch_tpu
import torch_tpu.version as v
from tests.conftest import ROOT


def test_version_facts_come_from_the_build():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert v.__version__ == torch_tpu.__version__ == meta["project"]["version"]
    assert re.fullmatch(r"tpurt \d+\.\d+\.\d+", v.runtime)
    assert v.api_version == torch_tpu._C._api_version >= 1
    assert v.torch == torch.__version__ and torch.__version__.startswith("2.13.0")
    info = v.info()
    assert info["isa"] in ("scalar", "avx2", "avx512", "amx") and info["host_cpu"]
    assert info["bf16_matmul"] == torch.tpu.get_device_properties(0).bf16_matmul


def test_wheel_metadata_lists_what_the_package_needs():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = meta["project"]["dependencies"]
    assert "torch==2.13.0" in deps and "scipy-openblas32" in deps
    assert "scipy-openblas32" in meta["build-system"]["requires"]
    # every subpackage is found (no hand-kept list that misses a new folder)
    assert meta["tool"]["setuptools"]["packages"]["find"]["include"] == ["torch_tpu*"]
