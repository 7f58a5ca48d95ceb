"""Serialization, missing-op errors, CPU fallback, autoload, doctor CLI."""
from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch

import torch_tpu
from conftest import ROOT, run_python


def test_save_load_roundtrip(tmp_path):
    x = torch.randn(4, 5)
    d = {"w": x.to("tpu"), "b": torch.arange(3).to("tpu"), "v": x.to("tpu")[:, 1]}
    path = tmp_path / "ckpt.pt"
    torch.save(d, path)
    loaded = torch.load(path)
    assert loaded["w"].device.type == "tpu"
    assert torch.equal(loaded["w"].cpu(), x) and torch.equal(loaded["v"].cpu(), x[:, 1])
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["b"].device.type == "cpu" and on_cpu["b"].tolist() == [0, 1, 2]
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    moved = torch.load(buf, map_location="tpu")
    assert moved.device.type == "tpu" and torch.equal(moved.cpu(), x)


def test_missing_op_error_text():
    a = torch.ones(3).to("tpu")
    with pytest.raises(NotImplementedError, match=r"operator 'aten::.*' is not implemented for TPU"):
        torch.hash_tensor(a)


def test_cpu_fallback_counts_and_warns_once():
    a = torch.arange(4.0).to("tpu")
    torch.tpu.reset_fallback_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_tpu._internal.execution_mode.cpu_fallback_mode(True):
            r1 = torch.hash_tensor(a + 2)
            r2 = torch.hash_tensor(a + 2, dim=0)
    assert r1.device.type == "tpu"
    assert torch.equal(r2.cpu(), torch.hash_tensor(torch.arange(4.0) + 2, dim=0))
    stats = torch.tpu.fallback_stats()
    # the functional form reaches the backend through its out= overload
    assert stats["aten::hash_tensor.out"] == 2
    msgs = [str(w.message) for w in caught if "aten::hash_tensor.out" in str(w.message)]
    assert len(msgs) == 1 and "CPU" in msgs[0]
    assert torch_tpu._internal.execution_mode.cpu_fallback_mode() is False
    with pytest.raises(NotImplementedError):
        torch.hash_tensor(a)


def test_cpu_fallback_env():
    r = run_python("import torch, torch_tpu\n"
                   "a = torch.ones(2).to('tpu')\n"
                   "print(torch.hash_tensor(a + 1).cpu().tolist(), torch.tpu.fallback_stats())",
                   env={"TORCH_TPU_CPU_FALLBACK": "1"})
    assert r.returncode == 0, r.stderr
    assert "aten::hash_tensor" in r.stdout


def test_autoload_in_subprocess():
    code = "import torch; print(hasattr(torch, 'tpu'), torch.ones(2, device='tpu').device)"
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True tpu:0"
    r = run_python("import torch, sys; print(hasattr(torch, 'tpu'), 'torch_tpu' in sys.modules)",
                   env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False False"


def test_doctor_passes():
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "torch-tpu"), "doctor"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checks passed" in r.stdout and "[FAIL]" not in r.stdout


def test_doctor_fails_clearly_on_bad_setup():
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "torch-tpu"), "doctor"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120, env={**os.environ, "TPU_NUM_DEVICES": "0"})
    assert r.returncode != 0
    assert "TPU_NUM_DEVICES" in r.stdout + r.stderr


def test_demo_runs():
    r = subprocess.run([sys.executable, "examples/demo.py", "--size-mib", "8"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "after empty_cache" in r.stdout


def test_module_to_keeps_shared_parameters_shared():
    """Module.to('tpu') keeps Parameter objects (param.data is replaced), so a
    weight shared by two modules (tied embedding / output head) stays one
    parameter and its gradient sums both uses, as on CPU."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    m = torch.nn.Sequential(emb, head)
    ref = copy.deepcopy(m)
    assert torch._has_compatible_shallow_copy_type(emb.weight, emb.weight.to("tpu"))
    w = emb.weight
    m.to("tpu")
    assert m[0].weight is m[1].weight is w and w.device.type == "tpu"
    assert len(list(m.parameters())) == 1
    x = torch.tensor([[1, 2, 3, 2]])
    m(x.to("tpu")).square().sum().backward()
    ref(x).square().sum().backward()
    torch.testing.assert_close(w.grad.cpu(), ref[0].weight.grad)
    m.to("cpu")
    assert m[0].weight is m[1].weight is w and w.device.type == "cpu" and w.grad.device.type == "cpu"
    # sparse and strided layouts still do not mix
    assert not torch._has_compatible_shallow_copy_type(torch.zeros(2, device="tpu"), torch.zeros(2).to_sparse())
