"""Bad input: the tpu device raises the exception class PyTorch's CPU backend
raises, with a message as clear, and keeps working afterwards.

Every case of the table runs in the strict (asynchronous: an error inside a
kernel is raised at the next synchronization), debug (synchronous: raised by
the op itself) and DeferAndFuse (raised when the recorded graph runs) modes.
The expected class is taken from running the same code on the CPU (the
table's class is what that gives, written down for RELIABILITY.md); after the
error, an op on the device must give the right value and a synchronization
must raise nothing. Cases the CPU cannot show (a second device, a missing
chip, device memory, a TPU operator that does not exist) state the class a
PyTorch device backend raises (CUDA's).
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from tests.conftest import run_python


def _t(dev, *shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g).to(dtype).to(dev)


def _i(dev, values):
    return torch.tensor(values, dtype=torch.int64, device=dev)


# name: (fn(device), expected class, regex the tpu message must match)
CASES = {
    # shapes
    "add broadcast mismatch": (lambda d: _t(d, 3) + _t(d, 4), RuntimeError, r"size of tensor a \(3\).*tensor b \(4\)"),
    "mm inner mismatch": (lambda d: _t(d, 2, 3) @ _t(d, 4, 5), RuntimeError, r"cannot be multiplied|shapes"),
    "bmm batch mismatch": (lambda d: torch.bmm(_t(d, 2, 3, 4), _t(d, 3, 4, 5)), RuntimeError, r"batch|size"),
    "view incompatible": (lambda d: _t(d, 4, 6).t().view(24), RuntimeError, r"view size is not compatible"),
    "cat shape mismatch": (lambda d: torch.cat([_t(d, 2, 3), _t(d, 2, 4)]), RuntimeError, r"Sizes of tensors must match"),
    "in-place broadcast grows self": (lambda d: _t(d, 3).add_(_t(d, 2, 3)), RuntimeError, r"doesn't match the broadcast shape"),
    "copy_ source of more dims": (lambda d: _t(d, 1, 2).copy_(_t(d, 1, 1, 2)), RuntimeError,
                                  r"output with shape \[1, 2\] doesn't match the broadcast shape \[1, 1, 2\]"),
    "copy_ into empty, source of more dims": (lambda d: _t(d, 1, 0).copy_(_t(d, 1, 1, 0)), RuntimeError,
                                              r"output with shape \[1, 0\] doesn't match the broadcast shape"),
    # dtypes
    "mm dtype mismatch": (lambda d: _t(d, 2, 2) @ _t(d, 2, 2, dtype=torch.float64), RuntimeError, r"dtype|same"),
    "in-place int result float": (lambda d: _i(d, [1, 2]).add_(_t(d, 2)), RuntimeError, r"can't be cast"),
    "gather float index": (lambda d: torch.gather(_t(d, 3, 4), 0, _t(d, 1, 1)), RuntimeError, r"int64"),
    "float tensor as index": (lambda d: _t(d, 4)[_t(d, 2)], IndexError, r"long, int, byte or bool"),
    "NaN index (float)": (lambda d: _t(d, 4)[torch.tensor([float("nan")], device=d)], IndexError, r"long, int, byte or bool"),
    "NaN cast to index": (lambda d: _t(d, 4).index_select(0, torch.tensor([float("nan")], device=d).long()),
                          IndexError, r"out of (range|bounds)"),
    "neg of bool": (lambda d: -torch.ones(2, dtype=torch.bool, device=d), RuntimeError, r"bool tensor is not supported"),
    "abs of bool": (lambda d: torch.ones(2, dtype=torch.bool, device=d).abs(), NotImplementedError, r"Bool"),
    # indices out of range
    "index_select": (lambda d: _t(d, 3, 4).index_select(0, _i(d, [0, 3])), IndexError, r"out of (range|bounds)"),
    "index_select negative": (lambda d: _t(d, 3, 4).index_select(0, _i(d, [-1])), IndexError, r"out of (range|bounds)"),
    "gather": (lambda d: torch.gather(_t(d, 3, 4), 1, _i(d, [[0, 4]])), RuntimeError, r"index 4 is out of bounds"),
    "scatter": (lambda d: _t(d, 3).scatter(0, _i(d, [5]), _t(d, 1)), RuntimeError, r"index 5 is out of bounds"),
    "scatter_add": (lambda d: _t(d, 3).scatter_add(0, _i(d, [-4]), _t(d, 1)), RuntimeError, r"out of bounds"),
    "scatter_reduce": (lambda d: _t(d, 3).scatter_reduce(0, _i(d, [3]), _t(d, 1), "amax"), RuntimeError, r"out of bounds"),
    "index_add": (lambda d: _t(d, 3, 2).index_add(0, _i(d, [3]), _t(d, 1, 2)), RuntimeError, r"out of bounds"),
    "embedding": (lambda d: F.embedding(_i(d, [1, 10]), _t(d, 5, 2)), IndexError, r"out of (range|bounds)"),
    "advanced get": (lambda d: _t(d, 3, 2)[_i(d, [0, 3])], IndexError, r"index 3 is out of bounds"),
    "advanced get negative": (lambda d: _t(d, 3, 2)[:, _i(d, [-3])], IndexError, r"index -3 is out of bounds"),
    "advanced put": (lambda d: _t(d, 3).index_put_((_i(d, [7]),), _t(d, 1)), IndexError, r"out of bounds"),
    "take": (lambda d: _t(d, 2, 2).take(_i(d, [4])), IndexError, r"out of (range|bounds)"),
    "nll_loss target": (lambda d: F.nll_loss(_t(d, 2, 3), _i(d, [0, 3])), IndexError, r"Target 3 is out of bounds"),
    "select out of range": (lambda d: _t(d, 3).select(0, 3), IndexError, r"out of range"),
    "dim out of range": (lambda d: _t(d, 3).sum(2), IndexError, r"Dimension out of range"),
    "index_select empty self": (lambda d: _t(d, 0).index_select(0, _i(d, [0])), IndexError, r"out of (range|bounds)"),
    "index_select empty dim": (lambda d: _t(d, 0, 3).index_select(0, _i(d, [0])), RuntimeError,
                               r"indexing axis dim should be positive"),
    # writes into a tensor whose elements share memory (an expanded one)
    "index_add_ into expanded": (lambda d: _t(d, 1, 3).expand(2, 3).index_add_(0, _i(d, [1]), _t(d, 1, 3)),
                                 RuntimeError, r"more than one element of the written-to tensor"),
    "scatter_ into expanded": (lambda d: _t(d, 3, 1).expand(3, 2).scatter_(0, _i(d, [[0, 1]]), _t(d, 1, 2)),
                               RuntimeError, r"more than one element of the written-to tensor"),
    "index_copy_ into expanded": (lambda d: _t(d, 1, 3).expand(2, 3).index_copy_(0, _i(d, [1]), _t(d, 1, 3)),
                                  RuntimeError, r"more than one element of the written-to tensor"),
    # scalars
    "clamp bound overflows uint8": (lambda d: torch.arange(3, dtype=torch.uint8, device=d).clamp(-300, 2),
                                    RuntimeError, r"cannot be converted to type uint8_t without overflow"),
    # sizes
    "negative size empty": (lambda d: torch.empty(-1, device=d), RuntimeError, r"negative dimension"),
    "negative size randn": (lambda d: torch.randn(2, -3, device=d), RuntimeError, r"negative dimension"),
    "negative view size": (lambda d: _t(d, 4).view(-2, 2), RuntimeError, r"invalid shape dimension"),
    "empty reduction": (lambda d: _t(d, 0).amax(), RuntimeError, r"numel\(\) == 0"),
    # autograd
    "backward twice": (lambda d: _backward_twice(d), RuntimeError, r"backward through the graph a second time"),
    "in-place on leaf": (lambda d: _t(d, 3).requires_grad_().add_(1), RuntimeError, r"leaf Variable"),
}


def _backward_twice(d):
    x = _t(d, 3).requires_grad_()
    y = (x.exp() * 2).sum()
    y.backward()
    y.backward()


def _cpu_class(fn):
    try:
        fn("cpu")
    except Exception as exc:
        return type(exc)
    return None


def _check_device_works():
    torch.tpu.synchronize()   # the error was raised once, not again
    y = torch.arange(6.0, device="tpu").reshape(2, 3)
    assert (y * 2).sum().item() == 30.0
    z = _t("tpu", 3, 4).index_select(0, _i("tpu", [2, 0]))
    assert torch.equal(z.cpu(), _t("cpu", 3, 4).index_select(0, _i("cpu", [2, 0])))


@pytest.mark.parametrize("mode", ["strict", "debug", "defer"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case, mode):
    fn, cls, pattern = CASES[case]
    assert _cpu_class(fn) is cls, f"the table's class for {case!r} is not what the CPU raises"
    with torch_tpu.execution_mode(mode):
        with pytest.raises(Exception) as info:
            out = fn("tpu")
            if mode == "debug":   # a synchronous error must come from the op itself
                raise AssertionError(f"{case}: the op returned without an error in debug mode")
            if isinstance(out, torch.Tensor):
                out.cpu()          # defer: the graph runs here; strict: the copy waits for the kernel
            torch.tpu.synchronize()
    assert type(info.value) is cls, f"{case} [{mode}]: {type(info.value).__name__}: {info.value}"
    assert re.search(pattern, str(info.value)), f"{case} [{mode}]: unclear message: {info.value}"
    _check_device_works()


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_async_index_error_raised_at_the_next_sync(mode):
    """In strict mode the bad gather returns at once and its error comes at
    the synchronization, naming the op; the queued work before it is done."""
    with torch_tpu.execution_mode(mode):
        x = _t("tpu", 3, 4)
        good = x * 2
        bad = torch.gather(x, 0, _i("tpu", [[9, 0, 0, 0]]))
        with pytest.raises(RuntimeError, match=r"gather.*index 9 is out of bounds for dimension 0 with size 3"):
            torch.tpu.synchronize()
        del bad
        assert torch.equal(good.cpu(), _t("cpu", 3, 4) * 2)
    _check_device_works()


def test_device_mismatch():
    with pytest.raises(RuntimeError, match=r"same device|Expected all tensors"):
        _t("tpu", 3) + _t("cpu", 3)
    with pytest.raises(RuntimeError, match=r"same device|Expected all tensors"):
        _t("tpu", 3, 3) @ _t("cpu", 3, 3)
    with pytest.raises(RuntimeError, match=r"same device|Expected all tensors"):
        torch.cat([_t("tpu", 2), _t("cpu", 2)])
    with pytest.raises(RuntimeError, match=r"same device|Expected all tensors"):
        _t("tpu", 3).copy_(_t("cpu", 3)).add_(_t("cpu", 3))
    _check_device_works()


def test_device_mismatch_between_chips():
    r = run_python(
        "import torch, torch_tpu\n"
        "a = torch.ones(3, device='tpu:0'); b = torch.ones(3, device='tpu:1')\n"
        "try:\n    a + b\nexcept RuntimeError as e:\n    print('RuntimeError', e)\n"
        "print((a * 2).sum().item(), (b * 3).sum().item())\n",
        env={"TPU_NUM_DEVICES": "2"})
    assert r.returncode == 0, r.stderr
    assert re.search(r"RuntimeError .*(same device|tpu:0.*tpu:1|tpu:1.*tpu:0)", r.stdout), r.stdout
    assert r.stdout.strip().endswith("6.0 9.0")


def test_chip_index_out_of_range():
    n = torch.tpu.device_count()
    with pytest.raises(RuntimeError, match=r"invalid device ordinal"):
        torch.empty(2, device=f"tpu:{n}")
    with pytest.raises(RuntimeError, match=r"invalid device ordinal"):
        torch.tpu.set_device(n + 3)
    with pytest.raises(RuntimeError, match=r"invalid device ordinal"):
        torch.ones(2).to(f"tpu:{n + 1}")
    with pytest.raises(RuntimeError, match=r"invalid device ordinal"):
        torch.tpu.synchronize(n)
    assert torch.tpu.current_device() == 0
    _check_device_works()


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_out_of_memory(mode):
    import gc
    gc.collect()
    torch.tpu.synchronize()
    total = torch.tpu.get_device_properties(0).total_memory
    before = torch.tpu.memory_allocated()
    with torch_tpu.execution_mode(mode):
        with pytest.raises(torch.OutOfMemoryError, match=r"TPU out of memory\. Tried to allocate"):
            x = torch.empty(total // 4 + 1024, dtype=torch.float32, device="tpu")
            (x + 1).cpu()
    assert torch.tpu.memory_allocated() == before
    _check_device_works()


def test_unsupported_operator():
    x = _t("tpu", 3, 3)
    with pytest.raises(NotImplementedError, match=r"operator 'aten::\w+' is not implemented for TPU"):
        x.to_sparse()
    _check_device_works()


def test_use_after_empty_cache():
    """Tensors alive across empty_cache keep their values; freed blocks are
    returned and new allocations work."""
    keep = _t("tpu", 64, 64)
    drop = [torch.ones(1 << 22, device="tpu") for _ in range(4)]   # 16 MiB each: blocks of their own
    reserved = torch.tpu.memory_reserved()
    del drop
    torch.tpu.empty_cache()
    assert torch.tpu.memory_reserved() < reserved
    assert torch.equal(keep.cpu(), _t("cpu", 64, 64))
    view = keep[3:, ::2]
    torch.tpu.empty_cache()
    assert torch.equal((view * 2).cpu(), _t("cpu", 64, 64)[3:, ::2] * 2)
    _check_device_works()
