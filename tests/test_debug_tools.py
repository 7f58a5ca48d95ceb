"""torch_tpu.debug (check_nan, compare), TORCH_TPU_CHECK_NAN, debug eager's
error messages and `torch-tpu check` on planted problems."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu
from torch_tpu import debug


def test_check_nan_strict_names_first_op():
    x = torch.tensor([1.0, -1.0, 4.0], device="tpu")
    with pytest.raises(FloatingPointError, match=r"aten::log .*output 0 at .*test_debug_tools.py:\d+") as ei:
        with debug.check_nan():
            y = x * 2
            z = torch.log(y)  # the first NaN
            (z + 1).sum()
    assert "aten::add" not in str(ei.value)


def test_check_nan_defer_names_first_op():
    x = torch.tensor([1.0, -1.0, 4.0], device="tpu")
    with torch_tpu.execution_mode("defer"):
        with pytest.raises(FloatingPointError, match=r"aten::sqrt .*test_debug_tools.py:\d+"):
            with debug.check_nan():
                y = x + 1
                w = (y - 3).sqrt()  # NaN at index 1 (and 0)
                (w * 2).exp()
        torch.tpu.synchronize()


def test_check_nan_quiet_and_inf_option():
    x = torch.tensor([1.0, 0.0], device="tpu")
    with debug.check_nan() as chk:
        (x + 1).relu().sum()
    assert chk.ops_checked >= 3
    with debug.check_nan(inf=False):
        (1 / x)  # +inf, allowed
    with pytest.raises(FloatingPointError, match="aten::(div|reciprocal)"):
        with debug.check_nan():
            (1 / x)


def test_check_nan_environment():
    script = "import torch\nx = torch.tensor([-1.0], device='tpu')\ny = x.sqrt()\nprint('not reached')\n"
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, TORCH_TPU_CHECK_NAN="1"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "not reached" not in r.stdout
    assert "FloatingPointError" in r.stderr and "aten::sqrt" in r.stderr and "<string>:3" in r.stderr


def test_launch_blocking_names_op_and_line():
    script = textwrap.dedent("""
        import torch
        x = torch.zeros(4, device="tpu")
        idx = torch.tensor([7], device="tpu")
        y = x[idx]
        print(y.cpu())
    """)
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, TPU_LAUNCH_BLOCKING="1"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "index" in r.stderr.lower() and "out of" in r.stderr.lower() or "bounds" in r.stderr.lower(), r.stderr
    assert 'line 5' in r.stderr, r.stderr  # raised at the op's own line, not at the later sync


class _Buggy(torch.nn.Module):
    """A layer with a planted device-dependent bug."""

    def forward(self, x):
        y = x * 0.5
        if x.device.type == "tpu":
            y = y + 1e-2
        return torch.tanh(y)


def test_compare_finds_planted_divergence():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(16, 16), _Buggy()), torch.nn.Linear(16, 4))
    rep = debug.compare(model, torch.randn(8, 16))
    assert not rep.ok
    assert rep.first.module == "2.1" and rep.first.kind == "_Buggy"
    assert rep.first.op.startswith("aten::add")
    assert rep.first.max_abs > 1e-3
    assert "2.1" in str(rep)


def test_compare_agrees_on_clean_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    rep = debug.compare(model, torch.randn(8, 16))
    assert rep.ok, str(rep)
    assert len(rep.modules) == 5


def test_cli_check_flags_item_in_loop_and_missing_op(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        m = torch.nn.Linear(8, 1).to("tpu")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x = torch.randn(32, 8, device="tpu")
        for step in range(4):
            loss = m(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(loss.item())
        MISSING
    """).replace("MISSING", "torch._standard_gamma(x.abs())"))
    r = subprocess.run([sys.executable, "-m", "torch_tpu.cli", "check", str(script)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"host sync inside a loop at \S*train.py:11:", r.stdout), r.stdout
    assert "[BLOCKER] operator 'aten::_standard_gamma" in r.stdout, r.stdout
    assert "fits the HBM of v5e" in r.stdout
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\nx = torch.ones(4, device='tpu')\nprint((x * 2).sum().item())\n")
    r = subprocess.run([sys.executable, "-m", "torch_tpu.cli", "check", str(clean)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 blocker(s)" in r.stdout


_LOOP = """
import torch, torch_tpu
torch_tpu.set_execution_mode("defer")
f = torch.compile(lambda a: (a * 2 + 1).relu().sum(), backend="tpu")
for n in (8, 8, 12):
    x = torch.ones(n, device="tpu")
    print(f(x).item())
"""


def _check_loop(tmp_path) -> str:
    script = tmp_path / "loop.py"
    script.write_text(_LOOP)
    r = subprocess.run([sys.executable, "-m", "torch_tpu.cli", "check", str(script)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_cli_check_reports_cut_reasons(tmp_path):
    """`torch-tpu check` on a DeferAndFuse script reading a value each
    iteration: the cuts are counted by reason and the host sync is a warning
    at its line, not a blocker (exit 0)."""
    out = _check_loop(tmp_path)
    cuts = re.search(r"DeferAndFuse cuts: (.*)", out)
    assert cuts and re.search(r"\bitem \d+", cuts.group(1)), out
    assert re.search(r"host sync inside a loop at \S*loop.py:7:", out), out
    assert "0 blocker(s)" in out


def test_cli_check_reports_recompiles(tmp_path):
    """check records host ops with a RecordFunction callback, not a dispatch
    mode, so Dynamo compiles the script's function under it and the shape
    change is a recompile with its reason."""
    out = _check_loop(tmp_path)
    assert re.search(r"\[warn\] +torch.compile recompiled <lambda> \(\S*loop.py:4\) 1 time\(s\): .*size mismatch", out), out


def test_doctor_checks_the_kernel_cache_compiler_and_profiler():
    r = subprocess.run([sys.executable, "-m", "torch_tpu.cli", "doctor"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for check in ("kernel cache", "compiler", "profiler"):
        assert re.search(rf"\[ok\] +{check}: ", r.stdout), r.stdout
