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


def test_build_flags_are_the_ones_the_runtime_was_compiled_with():
    b = v.build
    assert b["build_type"] == "Release" and b["torch"] == torch.__version__
    # flags runtime/CMakeLists.txt sets for every source, as the compiler ran them
    for flag in ("-O3", "-ffp-contract=off", "-fno-math-errno", "-std=c11"):
        assert flag in b["c_flags"].split(), b["c_flags"]
    assert ("-march=native" in b["c_flags"].split()) == b["native"]
    assert b["c_compiler"] and "-O2" in b["cxx_flags"].split()
    info = v.info()
    assert (info["build_type"], info["build_native"], info["build_flags"]) == (b["build_type"], b["native"],
                                                                              b["c_flags"])


def test_wheel_metadata_lists_what_the_package_needs():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = meta["project"]["dependencies"]
    assert "torch==2.13.0" in deps and "scipy-openblas32" in deps
    assert "scipy-openblas32" in meta["build-system"]["requires"]
    # every subpackage is found (no hand-kept list that misses a new folder)
    assert meta["tool"]["setuptools"]["packages"]["find"]["include"] == ["torch_tpu*"]
