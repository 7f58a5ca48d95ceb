"""OpInfo conformance harness: its own unit tests and a bounded CI slice.

The CI slice runs ~60 representative OpInfo ops (every family: elementwise,
reductions, matmul/conv, indexing, random, losses, norms, views/copies) in
float32, forward and backward, with the CPU fallback off, in a worker
subprocess. It asserts that no op crashes or hangs and that every op of
``EXPECTED_PASS`` passes. When a kernel lands, add the ops it makes pass to
``EXPECTED_PASS`` (one string per op: the OpInfo key, ``name`` or
``name.variant``, optionally ``:fwd`` / ``:bwd`` to require one direction only).
The whole database runs with ``make test-full`` or ``python -m tests.conformance``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import torch_tpu

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conformance import driver, report  # noqa: E402
from tests.conformance.compare import compare  # noqa: E402
from tests.conformance.runner import (CpuFailure, SampleFailure, classify_exception, run_backward_sample,  # noqa: E402
                                      run_forward_sample, to_device)

# Representative slice of the database, by family.
SLICE = [
    # views, copies, fills (kernels on main)
    "clone", "contiguous", "view", "reshape", "permute", "transpose", "t", "expand", "squeeze", "unsqueeze",
    "narrow", "select", "flatten", "as_strided", "split", "unbind", "diagonal", "movedim", "fill", "zero_",
    "zeros_like", "ones_like", "full_like", "empty_like",
    # elementwise
    "abs", "neg", "exp", "log", "sin", "sqrt", "sigmoid", "tanh", "nn.functional.relu", "nn.functional.gelu",
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "maximum", "where", "clamp", "eq", "lt", "sgn", "erf",
    # reductions / scans / softmax / sort
    "sum", "mean", "amax", "argmax", "prod", "var", "softmax", "log_softmax", "cumsum", "linalg.vector_norm",
    "topk", "cat", "stack",
    # matmul / conv
    "mm", "bmm", "matmul", "addmm", "nn.functional.linear", "nn.functional.conv2d",
    # indexing
    "index_select", "gather", "scatter", "index_add", "masked_fill", "__getitem__", "index_put",
    "nn.functional.embedding",
    # random (shapes and dtypes only)
    "nn.functional.dropout", "bernoulli", "rand_like", "normal", "normal.number_mean", "logit",
    # losses / norms
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.nll_loss",
    "nn.functional.layer_norm",
    # linear algebra, FFT, special functions, pooling/sampling, more indexing
    "linalg.solve", "linalg.inv", "cholesky", "linalg.qr", "fft.fft", "fft.rfft", "fft.irfft", "special.i0e",
    "logaddexp", "nn.functional.embedding_bag", "nn.functional.avg_pool3d", "nn.functional.interpolate.bilinear",
    "nn.functional.unfold", "median", "searchsorted", "index_reduce.mean", "unique",
]

# Ops that must pass in the CI slice (float32). Grows as kernels land.
EXPECTED_PASS: list[str] = [
    # copies, views, fills
    "clone", "contiguous", "view", "reshape", "permute", "transpose", "t", "expand", "squeeze", "unsqueeze",
    "narrow", "select", "flatten", "as_strided", "split", "unbind", "diagonal", "movedim", "fill", "zero_",
    "zeros_like:fwd", "ones_like:fwd", "full_like:fwd", "empty_like:fwd",
    # elementwise
    "abs", "neg", "exp", "log", "sin", "sqrt", "sigmoid", "tanh", "nn.functional.relu", "nn.functional.gelu",
    "add", "sub", "mul", "div.no_rounding_mode", "pow:fwd", "maximum", "where", "clamp", "eq:fwd", "lt:fwd",
    "sgn", "erf",
    # reductions / scans / softmax / sort
    "sum", "mean", "amax", "argmax:fwd", "prod", "var", "softmax", "log_softmax", "cumsum", "linalg.vector_norm",
    "topk", "cat", "stack",
    # matmul / conv
    "mm", "bmm", "matmul", "addmm", "nn.functional.linear", "nn.functional.conv2d",
    # indexing
    "index_select", "gather", "scatter", "index_add", "masked_fill", "__getitem__", "index_put",
    "nn.functional.embedding",
    # random (shapes and dtypes)
    "nn.functional.dropout", "bernoulli", "rand_like:fwd", "normal", "normal.number_mean", "logit",
    # losses / norms
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.nll_loss",
    "nn.functional.layer_norm",
    # linear algebra, FFT, special functions, pooling/sampling, more indexing
    "linalg.solve", "linalg.inv", "cholesky", "linalg.qr", "fft.fft", "fft.rfft", "fft.irfft", "special.i0e",
    "logaddexp", "nn.functional.embedding_bag", "nn.functional.avg_pool3d", "nn.functional.interpolate.bilinear",
    "nn.functional.unfold", "median", "searchsorted:fwd", "index_reduce.mean", "unique:fwd",
]

# Ops compared in the --cpu-fallback dry run of the slice (harness self-check).
# hash_tensor has no TPU kernel (and none is planned soon): with the fallback
# on it must pass through the CPU and be recorded as a fallback operator.
FALLBACK_SLICE = ["clone", "add", "mul", "sum", "softmax", "mm", "index_select", "nn.functional.cross_entropy",
                  "where", "argmax", "nn.functional.dropout", "max.reduction_with_dim", "hash_tensor"]

FULL = bool(__import__("os").environ.get("TORCH_TPU_TEST_FULL"))
CI_TIMEOUT = 60.0
HOOKS_ENV = {"TORCH_TPU_CONFORMANCE_HOOKS": "1"}


def _summary(results: driver.Results, meta: dict) -> tuple[dict, list[str]]:
    rep = report.build(results, meta)
    return rep, report.summary_lines(rep)


# ------------------------------------------------------------ comparison logic


def test_compare_equal_results_pass():
    x = torch.randn(3, 4)
    assert compare(x.clone(), x, device_type=None) is None
    assert compare((x, [x, 3], {"a": 2.5, "b": None}), (x.clone(), [x.clone(), 3], {"a": 2.5, "b": None}),
                   device_type=None) is None
    nan = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare(nan.clone(), nan, device_type=None) is None
    assert compare(float("nan"), float("nan"), device_type=None) is None
    assert compare(torch.Size([2, 3]), torch.Size([2, 3]), device_type=None) is None


def test_compare_wrong_results_mismatch():
    x = torch.randn(3, 4)
    assert "values differ" in compare(x + 1e-3, x, device_type=None)
    assert "dtype" in compare(x.double(), x, device_type=None)
    assert "shape" in compare(x.t(), x, device_type=None)
    assert "elements" in compare((x,), (x, x), device_type=None)
    assert "expected a tensor" in compare(3.0, x, device_type=None)
    assert "expected None" in compare(x, None, device_type=None)
    assert compare(True, False, device_type=None)
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 3]), device_type=None)
    assert compare(torch.tensor([float("nan")]), torch.tensor([1.0]), device_type=None)
    assert "is on cpu" in compare(x, x, device_type="tpu")


def test_compare_tolerances_follow_dtype_and_override():
    x = torch.ones(8)
    assert compare(x + 1e-6, x, device_type=None) is None          # within float32 defaults
    assert compare(x + 1e-4, x, device_type=None) is not None
    assert compare(x + 1e-4, x, device_type=None, override=(0.0, 1e-3)) is None
    b = torch.ones(8, dtype=torch.bfloat16)
    assert compare(b * 1.0078125, b, device_type=None) is None    # one bf16 ulp
    assert compare(torch.tensor([2]), torch.tensor([3]), device_type=None) is not None  # integers: exact


def test_compare_shapes_only_for_random_ops():
    x = torch.randn(5)
    assert compare(torch.randn(5), x, device_type=None, values=False) is None
    assert compare(torch.randn(6), x, device_type=None, values=False) is not None


def test_classify_exception():
    exc = NotImplementedError("operator 'aten::add.out' is not implemented for TPU. To run it on the CPU ...")
    assert classify_exception(exc)[:2] == ("not_implemented", "aten::add.out")
    status, aten, msg = classify_exception(RuntimeError("shape mismatch\nmore"))
    assert (status, aten) == ("error", None) and msg == "RuntimeError: shape mismatch"


def test_to_device_keeps_layout_and_aliasing():
    base = torch.arange(24.0).reshape(4, 6)
    views = [base.t(), base[1:, ::2], torch.arange(3.0).expand(4, 3), base]
    moved = to_device([views, {"device": "cpu", "x": views[0]}], "tpu")
    for cpu, dev in zip(views, moved[0]):
        assert dev.device.type == "tpu"
        assert dev.stride() == cpu.stride() and dev.shape == cpu.shape
        assert torch.equal(dev.cpu(), cpu)
    assert moved[1]["device"] == "tpu"
    assert moved[1]["x"] is moved[0][0]


# ------------------------------------------------------------ runner on the device


def _sample(*shape, requires_grad=False):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).requires_grad_(requires_grad)
    return SimpleNamespace(input=t, args=(), kwargs={}, output_process_fn_grad=lambda o: o)


def test_runner_pass_and_deliberate_mismatch_forward():
    s = _sample(3, 5)
    run_forward_sample(torch.clone, torch.clone, s, "tpu")  # correct: no exception
    with pytest.raises(SampleFailure) as info:
        run_forward_sample(torch.clone, lambda x: x.clone().fill_(0.5), s, "tpu")
    assert info.value.status == "mismatch" and "values differ" in info.value.message
    with pytest.raises(SampleFailure) as info:
        run_forward_sample(torch.clone, lambda x: x.clone().view(15), s, "tpu")
    assert info.value.status == "mismatch" and "shape" in info.value.message
    with pytest.raises(CpuFailure):
        run_forward_sample(lambda x: x.view(7), torch.clone, s, "tpu")


def test_runner_float64_reference_decides_when_the_cpu_float32_result_is_inexact():
    # (x + 1e4) - 1e4 loses x's low bits in float32 (~5e-4 off), not in
    # float64: an exact device result passes against the float64 run
    s = _sample(3, 5)
    inexact = lambda x: (x + 1e4) - 1e4  # noqa: E731
    assert run_forward_sample(inexact, torch.clone, s, "tpu") == "arbitrated"
    assert run_forward_sample(torch.clone, torch.clone, s, "tpu") is None
    with pytest.raises(SampleFailure) as info:  # wrong against both references
        run_forward_sample(inexact, lambda x: x.clone().fill_(0.5), s, "tpu")
    assert info.value.status == "mismatch"
    g = _sample(3, 4, requires_grad=True)
    assert run_backward_sample(lambda x: inexact(x) * x, lambda x: x * x, g, "tpu") == "arbitrated"
    with pytest.raises(SampleFailure):
        run_backward_sample(lambda x: inexact(x) * x, lambda x: x * x * 1.001, g, "tpu")


def test_runner_missing_kernel_is_not_implemented():
    # hash_tensor has no TPU kernel (see FALLBACK_SLICE)
    s = _sample(4)

    def hash_tensor(x):
        return torch.hash_tensor(x)

    with pytest.raises(SampleFailure) as info:
        run_forward_sample(hash_tensor, hash_tensor, s, "tpu")
    assert info.value.status == "not_implemented" and info.value.aten.startswith("aten::hash_tensor")


@pytest.mark.filterwarnings("ignore:operator 'aten::")
def test_runner_deliberate_gradient_mismatch():
    s = _sample(3, 4, requires_grad=True)
    with torch_tpu.cpu_fallback_mode(True):
        run_backward_sample(torch.clone, torch.clone, s, "tpu")  # correct gradients
        with pytest.raises(SampleFailure) as info:
            # same forward values, gradient doubled
            run_backward_sample(torch.clone, lambda x: x + (x - x.detach()), s, "tpu")
    assert info.value.status == "mismatch" and "grad" in info.value.message


# ------------------------------------------------------------ driver: crash / hang safety


def test_driver_records_crash_timeout_mismatch_error(tmp_path):
    ops = ["_harness.clone", "_harness.crash", "_harness.wrong", "_harness.hang", "_harness.raise"]
    opts = driver.Options(ops=ops, dtypes=["float32"], directions=["fwd"], timeout=4.0, chunk_size=10,
                          env=HOOKS_ENV)
    results = driver.run(opts)
    status = {op: rec["status"] for (op, _, _), rec in results.items.items()}
    assert status == {"_harness.clone": "pass", "_harness.crash": "crash", "_harness.wrong": "mismatch",
                      "_harness.hang": "timeout", "_harness.raise": "error"}, results.items
    crash = results.items[("_harness.crash", "float32", "fwd")]
    assert "SIGSEGV" in crash["message"], crash
    rep = report.build(results, {"ops": ops, "dtypes": ["float32"], "bwd_dtypes": [], "torch": torch.__version__})
    assert rep["summary"]["crashes"] == ["_harness.crash float32 fwd"]
    assert rep["summary"]["timeouts"] == ["_harness.hang float32 fwd"]
    report.write_markdown(rep, tmp_path / "R.md")
    text = (tmp_path / "R.md").read_text()
    assert "`_harness.crash`" in text and "CRASH" in text


# ------------------------------------------------------------ the CI slice


def _require(results: driver.Results, entry: str) -> list[str]:
    op, _, direction = entry.partition(":")
    problems = []
    for d in ([direction] if direction else ["fwd", "bwd"]):
        rec = results.items.get((op, "float32", d))
        if rec is None:
            problems.append(f"{op} {d}: not run")
        elif rec["status"] not in ("pass",) and not (rec["status"] == "skipped" and d == "bwd" and not direction):
            problems.append(f"{op} {d}: {rec['status']}: {rec['message']}")
    return problems


def test_ci_slice(capsys):
    opts = driver.Options(ops=SLICE, dtypes=["float32"], bwd_dtypes=["float32"], directions=["fwd", "bwd"],
                          timeout=CI_TIMEOUT, chunk_size=len(SLICE), max_samples=None if FULL else 6)
    results = driver.run(opts)
    rep, lines = _summary(results, {"ops": SLICE, "dtypes": ["float32"], "bwd_dtypes": ["float32"],
                                     "torch": torch.__version__})
    with capsys.disabled():
        print("\nconformance slice (float32, %d ops, %.0f s):" % (len(SLICE), results.seconds))
        for line in lines:
            print("  " + line)
    assert not results.process_errors, results.process_errors
    assert len({op for op, _, _ in results.items}) == len(SLICE)
    assert not rep["summary"]["crashes"], rep["summary"]["crashes"]
    assert not rep["summary"]["timeouts"], rep["summary"]["timeouts"]
    problems = [p for entry in EXPECTED_PASS for p in _require(results, entry)]
    assert not problems, "ops of EXPECTED_PASS that no longer pass:\n" + "\n".join(problems)


def test_cpu_fallback_dry_run_passes():
    """With the CPU fallback on, every result is computed by PyTorch's CPU
    kernels: the harness must report pass (this validates its comparison and
    its moving of samples), and it must record which operators fell back."""
    opts = driver.Options(ops=FALLBACK_SLICE, dtypes=["float32", "int64"], bwd_dtypes=["float32"],
                          timeout=CI_TIMEOUT, chunk_size=len(FALLBACK_SLICE), cpu_fallback=True,
                          max_samples=None if FULL else 4)
    results = driver.run(opts)
    assert not results.process_errors, results.process_errors
    bad = {k: v for k, v in results.items.items() if v["status"] not in ("pass", "skipped")}
    assert not bad, bad
    assert results.items[("add", "float32", "fwd")]["status"] == "pass"
    ht = results.items[("hash_tensor", "float32", "fwd")]
    assert ht["status"] == "pass"
    assert any(name.startswith("aten::hash_tensor") for name in ht["fallback_ops"]), ht
    rep = report.build(results, {"ops": FALLBACK_SLICE, "dtypes": ["float32", "int64"], "bwd_dtypes": ["float32"]})
    assert rep["summary"]["fwd"]["float32"]["percent"] == 100.0
    assert rep["missing_operators"], "fallback operators must be ranked"
