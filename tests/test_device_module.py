"""torch.tpu device module, torch.accelerator integration, generated methods."""
from __future__ import annotations

import pytest
import torch

from conftest import run_python


def test_device_basics():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.init()
    assert torch.tpu.is_initialized()
    torch.tpu.synchronize()
    torch.tpu.synchronize("tpu:0")


def test_accelerator_api():
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == "tpu"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.synchronize()
    x = torch.empty(1000, device="tpu")
    assert torch.accelerator.memory_allocated() >= 4000
    del x


def test_device_properties_default_generation():
    p = torch.tpu.get_device_properties(0)
    assert p.name == "TPU v6e (emulated)" == torch.tpu.get_device_name()
    assert p.generation == "v6e"
    assert p.hbm_bytes == 32 * 2**30
    assert 0 < p.total_memory <= p.hbm_bytes
    assert p.peak_bf16_flops == pytest.approx(918e12)
    assert p.host_threads >= 1


@pytest.mark.parametrize("gen,hbm,cores", [("v5e", 16, 1), ("v6e", 32, 1), ("v7x", 192, 2)])
def test_generation_from_env(gen, hbm, cores):
    r = run_python(
        "import torch, torch_tpu; p = torch.tpu.get_device_properties(0); "
        "print(p.generation, p.hbm_bytes // 2**30, p.tensor_cores, p.total_memory <= p.hbm_bytes)",
        env={"TORCH_TPU_EMULATE": gen},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [gen, str(hbm), str(cores), "True"]


def test_bad_generation_raises():
    r = run_python("import torch, torch_tpu; torch.empty(1, device='tpu')", env={"TORCH_TPU_EMULATE": "v99"})
    assert r.returncode != 0
    assert "TORCH_TPU_EMULATE" in r.stderr


def test_hbm_limit_env():
    r = run_python("import torch, torch_tpu; print(torch.tpu.get_device_properties(0).total_memory)",
                   env={"TORCH_TPU_HBM_LIMIT": "64M"})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == 64 * 2**20


def test_generated_methods():
    x = torch.ones(3).tpu()
    assert x.is_tpu and x.device == torch.device("tpu", 0)
    assert not torch.ones(1).is_tpu
    m = torch.nn.Linear(2, 2).tpu()
    assert all(p.device.type == "tpu" for p in m.parameters())
    s = torch.UntypedStorage(16).tpu()
    assert s.is_tpu and s.device.type == "tpu"
    assert torch.ones(2).untyped_storage().tpu().device.type == "tpu"


def test_multi_chip_set_device_really_switches():
    code = r"""
import torch, torch_tpu
assert torch.tpu.device_count() == 3
torch.tpu.set_device(2)
assert torch.tpu.current_device() == 2
x = torch.empty(4, device="tpu")
assert x.device == torch.device("tpu", 2), x.device
assert torch.tpu.memory_allocated(2) > 0 and torch.tpu.memory_allocated(0) == 0
with torch.tpu.device(1):
    assert torch.tpu.current_device() == 1
    y = torch.empty(4, device="tpu")
    assert y.device.index == 1
assert torch.tpu.current_device() == 2
torch.accelerator.set_device_index(0)
assert torch.tpu.current_device() == 0
# copies between chips
a = torch.arange(10.0).to("tpu:1")
b = a.to("tpu:2")
c = a[::2].to("tpu:0", torch.float64)
assert b.device.index == 2 and torch.equal(b.cpu(), torch.arange(10.0))
assert torch.equal(c.cpu(), torch.arange(0.0, 10.0, 2, dtype=torch.float64))
print("ok")
"""
    r = run_python(code, env={"TPU_NUM_DEVICES": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_invalid_device_index_errors_and_device_stays_usable():
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.empty(2, device="tpu:5")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.tpu.set_device(5)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.ones(2).to("tpu:3")
    with pytest.raises(RuntimeError):
        torch.tpu.set_device(-2)
    # -1 means "the current device", as in torch.cuda.set_device.
    torch.tpu.set_device(-1)
    assert torch.tpu.current_device() == 0
    assert torch.ones(2).to("tpu").cpu().tolist() == [1.0, 1.0]


def test_mixed_chips_in_one_op_raise():
    code = r"""
import torch, torch_tpu
torch_tpu.cpu_fallback_mode(True)
a = torch.ones(3, device="tpu:0"); b = torch.ones(3, device="tpu:1")
try:
    torch.add(a, b)
except RuntimeError as e:
    assert "Expected all tensors to be on the same device" in str(e), e
    print("raised")
print(torch.add(a, a).cpu().tolist())
"""
    r = run_python(code, env={"TPU_NUM_DEVICES": "2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["raised", "[2.0, 2.0, 2.0]"]


def test_rng_state_roundtrip_and_seeding():
    torch.tpu.manual_seed(1234)
    g = torch.tpu.default_generators[0]
    assert g.device == torch.device("tpu", 0)
    assert g.initial_seed() == 1234 == torch.tpu.initial_seed()
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 16
    g.set_offset(40)
    assert g.get_offset() == 40
    torch.tpu.set_rng_state(state)
    assert g.get_offset() == 0 and g.initial_seed() == 1234
    torch.manual_seed(99)  # torch.manual_seed seeds every backend's generators
    assert torch.tpu.initial_seed() == 99
    torch.tpu.manual_seed_all(7)
    assert [t.initial_seed() for t in torch.tpu.default_generators] == [7]
    gen = torch.Generator(device="tpu")
    gen.manual_seed(5)
    assert gen.initial_seed() == 5 and gen.device.type == "tpu"
    with pytest.raises(RuntimeError):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))
    assert len(torch.tpu.get_rng_state_all()) == 1


def test_amp_dtypes():
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()


def test_forked_child_refuses_device_clearly():
    code = r"""
import os, torch, torch_tpu
torch.ones(1).to("tpu")
pid = os.fork()
if pid == 0:
    try:
        assert torch.tpu._is_in_bad_fork()
        torch.ones(1).to("tpu")
        os._exit(3)
    except Exception as e:
        os._exit(0 if "forked" in str(e) else 4)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), torch.tpu._is_in_bad_fork())
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "False"]
