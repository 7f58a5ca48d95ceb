"""Smoke test of an installed torch_tpu wheel (run by `make test-wheel` in a
fresh virtual environment, outside the source tree): autoload through
`import torch`, the device, kernels, DeferAndFuse, torch.compile, the CLI and
the version info (build flags included)."""
import os
import subprocess
import sys

import torch  # the torch.backends entry point loads torch_tpu

assert hasattr(torch, "tpu"), "torch_tpu was not autoloaded by import torch"
import torch_tpu  # noqa: E402
import torch_tpu.version as v  # noqa: E402

here = os.path.dirname(os.path.abspath(torch_tpu.__file__))
assert "site-packages" in here, f"torch_tpu imported from {here}, not from the installed wheel"
x = torch.arange(12, dtype=torch.float32, device="tpu").reshape(3, 4)
assert torch.equal((x @ x.t()).cpu(), torch.arange(12.).reshape(3, 4) @ torch.arange(12.).reshape(3, 4).t())
with torch_tpu.execution_mode("defer"):
    y = ((x * 2 + 1).relu() - 3).sum()
    assert y.item() == float(((torch.arange(12.) * 2 + 1).relu() - 3).sum())
    assert torch.tpu.defer_stats()["ops_recorded"] >= 4
f = torch.compile(lambda t: t.sin() * 2, backend="tpu")
assert torch.allclose(f(x).cpu(), torch.arange(12.).reshape(3, 4).sin() * 2)
info = v.info()
assert info["torch_tpu"] == torch_tpu.__version__ and info["api_version"] >= 1 and info["isa"]
# how the wheel was built, recorded by setup.py at build time
assert info["build_type"] == "Release" and "-ffp-contract=off" in info["build_flags"].split(), info
assert ("-march=native" in info["build_flags"].split()) == info["build_native"], info
assert v.build["torch"] == torch.__version__, (v.build, torch.__version__)
# one wheel for any x86-64: the level variants are in it, and each one the host
# runs loads (its rpath finds OpenBLAS in site-packages) and computes
assert info["build_native"] or info["build_variants"] == ["x86-64", "x86-64-v3", "x86-64-v4"], info
for rel in ["lib/libtpurt.so"] + [f"lib/glibc-hwcaps/{lv}/libtpurt.so" for lv in info["build_variants"][1:]]:
    assert os.path.isfile(os.path.join(here, rel)), rel
order = ["scalar", "avx2", "avx512", "amx"]
for level in order[: order.index(info["host_isa"]) + 1]:
    code = ("import torch, torch_tpu; from torch_tpu import _C; x = torch.ones(64, 64, device='tpu'); "
            "assert (x @ x).cpu().eq(64).all(); print(_C._cpu_info()['build'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                       env={**os.environ, "TORCH_TPU_ISA": level})
    want = {"scalar": "x86-64", "avx2": "x86-64-v3"}.get(level, "x86-64-v4")
    assert r.returncode == 0 and (info["build_native"] or r.stdout.split()[-1] == want), (level, r.stdout, r.stderr)
r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "torch-tpu"), "doctor"], capture_output=True,
                   text=True)
assert r.returncode == 0 and "host:" in r.stdout, r.stdout + r.stderr
print("wheel smoke test passed:", info)
