"""Access to PyTorch's OpInfo database.

``op_db`` of ``torch.testing._internal.common_methods_invocations`` already
contains the extra definitions of ``torch.testing._internal.opinfo.definitions``
(linalg, fft, special, signal, masked...); both are walked, deduplicated.
An op is named by its *key*: ``name`` or ``name.variant_test_name``.
Importing the database takes a few seconds: it is loaded on first use.
"""
from __future__ import annotations

import fnmatch
import functools
import os
from typing import Any

import torch

__all__ = ["load_ops", "op_key", "all_keys", "select", "is_random", "tolerance_override", "DTYPES",
           "BACKWARD_DTYPES", "dtype_name", "parse_dtype", "synthetic_ops"]

# dtypes walked by default, in report order.
DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "bool")
# dtypes whose gradients are compared by default.
BACKWARD_DTYPES = ("float32", "float64")

# Ops whose outputs are random draws: only the structure, dtypes and shapes
# of their results (and gradients) are compared.
RANDOM_OPS = frozenset({
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
    "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randn_like", "randint", "randint_like",
    "randn", "rand", "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "nn.functional.rrelu",
    "native_dropout", "torch.ops.aten._flash_attention_forward", "torch.ops.aten._efficient_attention_forward",
})


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.strip(), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def op_key(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.lru_cache(maxsize=1)
def load_ops() -> dict[str, Any]:
    """{key: OpInfo} of every op of the database, in database order."""
    from torch.testing._internal.common_methods_invocations import op_db

    ops: dict[str, Any] = {}
    sources = [op_db]
    try:
        from torch.testing._internal.opinfo import definitions
        sources.append(definitions.op_db)
    except Exception:  # noqa: BLE001 - older layouts: op_db has everything
        pass
    for source in sources:
        for op in source:
            ops.setdefault(op_key(op), op)
    return ops


def all_keys() -> list[str]:
    return list(load_ops())


def select(patterns: list[str] | None, exclude: list[str] | None = None, keys: list[str] | None = None) -> list[str]:
    """Keys matching any of ``patterns`` (exact keys or shell globs such as
    ``nn.functional.*``), in database order; explicit non-glob names that are
    not in the database are kept (the worker reports them)."""
    keys = all_keys() if keys is None else keys
    if not patterns:
        chosen = list(keys)
    else:
        chosen = []
        seen = set()
        for pattern in patterns:
            if any(ch in pattern for ch in "*?["):
                matches = [k for k in keys if fnmatch.fnmatchcase(k, pattern)]
            else:
                matches = [pattern]
            for key in matches:
                if key not in seen:
                    seen.add(key)
                    chosen.append(key)
    if exclude:
        chosen = [k for k in chosen if not any(fnmatch.fnmatchcase(k, p) for p in exclude)]
    return chosen


def is_random(op: Any) -> bool:
    """True if the op's outputs are random or uninitialized (values not comparable)."""
    return op_key(op) in RANDOM_OPS or op.name in RANDOM_OPS or bool(getattr(op, "has_nondeterministic_output", False))


# Ops that are random only for some samples: those drawing a dropout mask
# (dropout_p > 0; for multi_head_attention_forward dropout_p is the 10th
# positional argument and only applies with training=True). Such samples
# are compared like RANDOM_OPS (structure, dtypes and shapes, not values:
# the device's random numbers are not the CPU's); the others by value.
def _sdpa_dropout(sample: Any) -> float:
    return float(sample.kwargs.get("dropout_p", 0.0) or 0.0)


def _mha_dropout(sample: Any) -> float:
    p = sample.kwargs.get("dropout_p", sample.args[9] if len(sample.args) > 9 else 0.0)
    return float(p or 0.0) if sample.kwargs.get("training", True) else 0.0


SAMPLE_DROPOUT = {
    "nn.functional.scaled_dot_product_attention": _sdpa_dropout,
    "nn.functional.multi_head_attention_forward": _mha_dropout,
}


def is_random_sample(op: Any, sample: Any) -> bool:
    """True if this sample of the op draws random numbers (see SAMPLE_DROPOUT)."""
    fn = SAMPLE_DROPOUT.get(op_key(op))
    return fn is not None and fn(sample) > 0


def tolerance_override(op: Any, dtype: torch.dtype) -> tuple[float, float] | None:
    """(rtol, atol) the OpInfo declares for comparing an accelerator against the
    CPU (``toleranceOverride`` decorators of TestCommon.test_compare_cpu and of
    the device-vs-reference tests), or None."""
    best: tuple[float, float] | None = None
    for info in list(getattr(op, "decorators", None) or ()):
        test_name = getattr(info, "test_name", None)
        if test_name not in ("test_compare_cpu", "test_noncontiguous_samples", "test_variant_consistency_eager"):
            continue
        if getattr(info, "device_type", None) not in (None, "cpu", "cuda"):
            continue
        dtypes = getattr(info, "dtypes", None)
        if dtypes is not None and dtype not in dtypes:
            continue
        for dec in getattr(info, "decorators", ()) or ():
            table = getattr(dec, "d", None)
            if isinstance(table, dict) and dtype in table:
                tol = table[dtype]
                cand = (float(tol.rtol), float(tol.atol))
                best = cand if best is None else (max(best[0], cand[0]), max(best[1], cand[1]))
    return best


# ------------------------------------------------------------- test hooks
# Synthetic ops used by the harness's own tests (crash and hang detection,
# pass / mismatch classification). Enabled only with
# TORCH_TPU_CONFORMANCE_HOOKS=1; they never appear in reports otherwise.

class _SyntheticOp:
    def __init__(self, name: str, fn, cpu_fn=None, dtypes=(torch.float32,), autograd: bool = True) -> None:
        self.name = name
        self.variant_test_name = ""
        self._fn = fn
        self._cpu_fn = cpu_fn
        self._dtypes = set(dtypes)
        self.supports_autograd = autograd
        self.decorators = ()
        self.has_nondeterministic_output = False

    def __call__(self, *args, **kwargs):
        x = args[0]
        if self._cpu_fn is not None and isinstance(x, torch.Tensor) and x.device.type == "cpu":
            return self._cpu_fn(*args, **kwargs)
        return self._fn(*args, **kwargs)

    def supported_dtypes(self, device_type):
        return self._dtypes

    def supported_backward_dtypes(self, device_type):
        return self._dtypes

    def sample_inputs(self, device, dtype, requires_grad=False, **kwargs):
        from types import SimpleNamespace

        gen = torch.Generator().manual_seed(0)
        for shape in ((3, 4), (5,)):
            t = torch.randn(shape, generator=gen).to(dtype).requires_grad_(requires_grad)
            yield SimpleNamespace(input=t, args=(), kwargs={}, output_process_fn_grad=lambda o: o, name="")


def _crash(x):
    import ctypes
    ctypes.string_at(0)  # SIGSEGV


def _hang(x):
    import time
    time.sleep(3600)


def synthetic_ops() -> dict[str, Any]:
    if os.environ.get("TORCH_TPU_CONFORMANCE_HOOKS") != "1":
        return {}
    return {
        "_harness.crash": _SyntheticOp("_harness.crash", _crash, cpu_fn=lambda x: x.clone()),
        "_harness.hang": _SyntheticOp("_harness.hang", _hang, cpu_fn=lambda x: x.clone()),
        "_harness.clone": _SyntheticOp("_harness.clone", lambda x: x.clone()),
        "_harness.wrong": _SyntheticOp("_harness.wrong", lambda x: x.detach().clone().fill_(7.0),
                                       cpu_fn=lambda x: x.clone()),
        "_harness.raise": _SyntheticOp("_harness.raise", lambda x: (_ for _ in ()).throw(ValueError("boom")),
                                       cpu_fn=lambda x: x.clone()),
    }
