"""Runs one (op, dtype, direction) on the CPU and on the device and classifies it.

Statuses (``STATUSES``):

* ``pass``            every sample agrees with the CPU;
* ``mismatch``        a device result differs (structure, device, dtype, shape or values);
* ``not_implemented`` the device raised NotImplementedError for a missing kernel
                      (``aten`` names the missing operator);
* ``error``           the device raised another exception while the CPU succeeded;
* ``skipped``         nothing to compare: dtype unsupported on CPU by the OpInfo, no
                      autograd, every sample raises on the CPU too...;
* ``crash`` / ``timeout`` are assigned by the driver (the worker process died / hung).

Forward ("fwd"): ``op(sample.input, *sample.args, **sample.kwargs)`` on CPU and on
the device (every tensor moved, with its exact strides and aliasing). Backward
("bwd"): the vector-Jacobian product of the differentiable outputs (after the
sample's ``output_process_fn_grad``) with fixed random weights, i.e. the
gradient of ``sum_i (out_i * w_i).sum()``, w.r.t. every floating input that
requires grad.
"""
from __future__ import annotations

import re
import time
import traceback
from typing import Any, Callable

import torch

from .compare import compare
from .opdb import is_random_sample

__all__ = ["STATUSES", "classify_exception", "to_device", "run_forward_sample", "run_backward_sample",
           "run_item", "SampleFailure"]

STATUSES = ("pass", "mismatch", "not_implemented", "error", "crash", "timeout", "skipped")

_NOT_IMPLEMENTED = re.compile(r"operator '([\w:.]+)' is not implemented for TPU")
_OVERRIDEABLE = re.compile(r"^(\w+) not implemented\. You are likely triggering this with tensor backend")
_COULD_NOT_RUN = re.compile(r"Could not run '([\w:.]+)' with arguments from the '(\w+)' backend")
MAX_MESSAGE = 600


def short(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify_exception(exc: BaseException) -> tuple[str, str | None, str]:
    """(status, missing aten operator or None, message) of an exception raised
    on the device."""
    text = str(exc)
    if isinstance(exc, NotImplementedError):
        m = _NOT_IMPLEMENTED.search(text)
        if m:
            return "not_implemented", m.group(1), f"operator '{m.group(1)}' is not implemented for TPU"
        m = _OVERRIDEABLE.search(text.strip())
        if m:  # ops such as convolution_overrideable that a backend must provide
            return "not_implemented", f"aten::{m.group(1)}", f"operator 'aten::{m.group(1)}' is not implemented for TPU"
        m = _COULD_NOT_RUN.search(text)
        if m and ("PrivateUse1" in m.group(2) or "tpu" in m.group(2).lower()):
            return "not_implemented", m.group(1), short(f"Could not run '{m.group(1)}' on the {m.group(2)} backend")
    first = text.strip().splitlines()[0] if text.strip() else ""
    return "error", None, short(f"{type(exc).__name__}: {first}")


class SampleFailure(Exception):
    """A device-side failure of one sample: carries its classification."""

    def __init__(self, status: str, message: str, aten: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.aten = status, message, aten


class CpuFailure(Exception):
    """The CPU reference itself raised: the sample is skipped."""


# ------------------------------------------------------------ moving samples

def _move_tensor(t: torch.Tensor, device: str, keep_grad: bool) -> torch.Tensor:
    d = t.detach()
    if d.layout == torch.strided and not d.is_quantized and d.device.type == "cpu":
        if d.is_conj():
            d = d.resolve_conj()
        if d.is_neg():
            d = d.resolve_neg()
        # Copy the whole storage and rebuild the view: keeps strides, storage
        # offset, overlap (expanded tensors) and gaps exactly as on the CPU.
        n = d.untyped_storage().nbytes() // d.element_size()
        flat = torch.empty(0, dtype=d.dtype).set_(d.untyped_storage(), 0, (n,), (1,))
        moved = flat.to(device).as_strided(d.shape, d.stride(), d.storage_offset())
    else:
        moved = d.to(device)
    if keep_grad and t.requires_grad:
        moved = moved.detach().requires_grad_(True)
    return moved


def to_device(obj: Any, device: str, memo: dict[int, torch.Tensor] | None = None, keep_grad: bool = True,
              keep_cpu: Callable[[torch.Tensor], bool] | None = None) -> Any:
    """Copy of ``obj`` with every tensor (in nested lists/tuples/dicts) moved to
    ``device`` (except those ``keep_cpu`` selects); a tensor appearing twice
    maps to the same device tensor; device arguments naming the CPU are
    redirected to ``device``."""
    def tensor(t: torch.Tensor) -> torch.Tensor:
        return t if keep_cpu is not None and keep_cpu(t) else _move_tensor(t, device, keep_grad)

    def leaf(x: Any) -> Any:
        if isinstance(x, torch.device):
            return torch.device(device) if x.type == "cpu" else x
        if isinstance(x, str) and x in ("cpu", "cpu:0"):  # a device argument (no other op argument is "cpu")
            return device
        return x

    return _map_tensors(obj, tensor, {} if memo is None else memo, leaf)


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor], memo: dict[int, torch.Tensor],
                 leaf: Callable[[Any], Any] = lambda x: x) -> Any:
    """Copy of ``obj`` (nested lists/tuples/namedtuples/dicts) with every
    tensor t replaced by fn(t), once per tensor (``memo``: id -> result, so
    a tensor appearing twice maps to the same result) and every other leaf
    by leaf(x)."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = fn(obj)
        return memo[id(obj)]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map_tensors(x, fn, memo, leaf) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(x, fn, memo, leaf) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn, memo, leaf) for k, v in obj.items()}
    return leaf(obj)


def _tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors(v, out)
    return out


def _grad_inputs(sample: Any) -> list[torch.Tensor]:
    """Floating tensors of the sample that require grad, deduplicated, in order."""
    seen, result = set(), []
    for t in _tensors([sample.input, sample.args, sample.kwargs], []):
        if t.requires_grad and t.is_floating_point() and id(t) not in seen:
            seen.add(id(t))
            result.append(t)
    return result


def _sync(device: str) -> None:
    mod = getattr(torch, device, None)
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()


def _call_device(fn: Callable[[], Any], device: str) -> Any:
    """Runs fn on the device and waits for its work: async errors surface here."""
    try:
        result = fn()
        _sync(device)
        return result
    except Exception as exc:  # noqa: BLE001 - classified
        try:
            _sync(device)  # flush a pending async error so it is not blamed on the next op
        except Exception:  # noqa: BLE001
            pass
        status, aten, message = classify_exception(exc)
        raise SampleFailure(status, message, aten) from exc


def _describe(sample: Any, index: int) -> str:
    def shape(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided:
                return f"T{list(x.shape)}({str(x.layout).removeprefix('torch.')})"
            return f"T{list(x.shape)}" + ("" if x.is_contiguous() else "(nc)")
        if isinstance(x, (list, tuple)):
            return "[" + ",".join(shape(v) for v in x[:4]) + (",..." if len(x) > 4 else "") + "]"
        return short(repr(x), 30)
    try:
        parts = [shape(sample.input)] + [shape(a) for a in sample.args]
        parts += [f"{k}={shape(v)}" for k, v in sample.kwargs.items()]
    except Exception:  # noqa: BLE001 - a description must never fail
        return f"sample {index}"
    return f"sample {index}: ({', '.join(parts)})"


# ------------------------------------------------------------ one sample

def _cpu_argument_variant(sample: Any) -> Callable[[torch.Tensor], bool] | None:
    """Some APIs take small integer tensors that must stay on the CPU (e.g.
    tensor_split's sections): selector of those arguments, or None if the
    sample has none."""
    def keep(t: torch.Tensor) -> bool:
        return t is not sample.input and not t.is_floating_point() and not t.is_complex() and t.dim() <= 1
    return keep if any(keep(t) for t in _tensors([sample.args, sample.kwargs], [])) else None


def _retry_with_cpu_arguments(failure: SampleFailure, variant: Any) -> bool:
    return variant is not None and failure.status == "error" and "cpu" in failure.message.lower()


def _places_on_device(obj: Any) -> bool:
    """True if the sample has a tensor or a device argument: without either
    (``torch.arange(2)``) the op builds its result on the CPU on both sides."""
    if isinstance(obj, (torch.Tensor, torch.device)):
        return True
    if isinstance(obj, str):
        return obj in ("cpu", "cpu:0")
    if isinstance(obj, (list, tuple)):
        return any(_places_on_device(x) for x in obj)
    if isinstance(obj, dict):
        return any(_places_on_device(v) for v in obj.values())
    return False


# ------------------------------------------------ float64 arbitration
# A float32 (complex64) result that differs from the CPU's is checked once
# more against the CPU run in float64 (inputs widened, result rounded back
# to float32): when the device's result is within float32's tolerances of
# that, the device computed the function correctly and the CPU's float32
# kernel is the less accurate one (e.g. polygamma near a pole). Such
# samples pass and are counted (``arbitrated``) in the report. float16 /
# bfloat16 samples are not arbitrated: PyTorch defines some of their ops
# through intermediate roundings (a quotient rounded before truncation),
# which a float64 run would not reproduce.

_WIDE = {torch.float32: torch.float64, torch.float16: torch.float64, torch.bfloat16: torch.float64,
         torch.complex64: torch.complex128, torch.complex32: torch.complex128}


def _widen(obj: Any, memo: dict[int, torch.Tensor]) -> Any:
    """Copy of ``obj`` with floating tensors in float64 (complex128), grad
    inputs still requiring grad."""
    def tensor(t: torch.Tensor) -> torch.Tensor:
        wide, d = _WIDE.get(t.dtype), t.detach()
        if wide is None or d.layout != torch.strided:
            return d
        return d.to(wide).requires_grad_(t.requires_grad)

    return _map_tensors(obj, tensor, memo)


def _round_like(wide: Any, like: Any) -> Any:
    """``wide`` (a float64 run's result) with each tensor in ``like``'s dtype."""
    if isinstance(like, torch.Tensor):
        return wide.detach().to(like.dtype) if isinstance(wide, torch.Tensor) else wide
    if isinstance(like, (list, tuple)) and isinstance(wide, (list, tuple)) and len(like) == len(wide):
        items = [_round_like(w, l) for w, l in zip(wide, like)]
        return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)
    return wide


def _arbitrable(obj: Any) -> bool:
    dtypes = {t.dtype for t in _tensors(obj, [])}
    return bool(dtypes & {torch.float32, torch.complex64}) and not dtypes & {torch.float16, torch.bfloat16,
                                                                             torch.complex32}


def _arbitrate(actual: Any, expected: Any, reference: Callable[[], Any], device: str,
               override: tuple[float, float] | None, path: str) -> bool:
    """True when ``actual`` matches the float64 ``reference()`` (rounded to
    ``expected``'s dtypes) within the tolerances."""
    if not _arbitrable(expected):
        return False
    try:
        ref = _round_like(reference(), expected)
        return compare(actual, ref, device_type=device, override=override, path=path) is None
    except Exception:  # noqa: BLE001 - no float64 run: the mismatch stands
        return False


def run_forward_sample(cpu_fn: Callable, dev_fn: Callable, sample: Any, device: str, *, values: bool = True,
                       override: tuple[float, float] | None = None) -> str | None:
    """Raises CpuFailure (skip), SampleFailure (device failure), or returns
    (pass): None, or "arbitrated" when the float64 reference decided it."""
    dev_sample = to_device([sample.input, sample.args, sample.kwargs], device, keep_grad=False)
    keep = _cpu_argument_variant(sample)
    alt = to_device([sample.input, sample.args, sample.kwargs], device, keep_grad=False, keep_cpu=keep) \
        if keep else None
    try:
        expected = cpu_fn(sample.input, *sample.args, **sample.kwargs)
    except Exception as exc:  # noqa: BLE001
        raise CpuFailure(short(f"{type(exc).__name__}: {exc}")) from exc
    try:
        actual = _call_device(lambda: dev_fn(dev_sample[0], *dev_sample[1], **dev_sample[2]), device)
    except SampleFailure as failure:
        if not _retry_with_cpu_arguments(failure, alt):
            raise
        actual = _call_device(lambda: dev_fn(alt[0], *alt[1], **alt[2]), device)
    try:
        on_dev = _places_on_device([sample.input, sample.args, sample.kwargs])
        dev_type = device if on_dev else "cpu"
        msg = compare(actual, expected, device_type=dev_type, values=values, override=override)
        if msg and values and "values differ" in msg:
            def reference():
                wide = _widen([sample.input, sample.args, sample.kwargs], {})
                return cpu_fn(wide[0], *wide[1], **wide[2])
            if _arbitrate(actual, expected, reference, dev_type, override, "output"):
                return "arbitrated"
    except Exception as exc:  # noqa: BLE001 - e.g. the copy back to the host failed
        status, aten, message = classify_exception(exc)
        raise SampleFailure(status, message, aten) from exc
    if msg:
        raise SampleFailure("mismatch", short(msg))
    return None


def _differentiable(outputs: Any) -> list[torch.Tensor]:
    return [t for t in _tensors(outputs, []) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def run_backward_sample(cpu_fn: Callable, dev_fn: Callable, sample: Any, device: str, *, values: bool = True,
                        override: tuple[float, float] | None = None, seed: int = 0) -> str | None:
    """Compares the gradients of sum_i (out_i * w_i).sum() w.r.t. the floating
    inputs (fixed random weights w_i). Raises CpuFailure / SampleFailure;
    returns None, or "arbitrated" (see run_forward_sample)."""
    cpu_inputs = _grad_inputs(sample)
    if not cpu_inputs:
        raise CpuFailure("no floating input requires grad")

    def prepare(keep_cpu=None):
        memo: dict[int, torch.Tensor] = {}
        moved = to_device([sample.input, sample.args, sample.kwargs], device, memo=memo, keep_grad=True,
                          keep_cpu=keep_cpu)
        return moved, [memo[id(t)] for t in cpu_inputs]

    keep = _cpu_argument_variant(sample)
    variants = [prepare()] + ([prepare(keep)] if keep else [])
    process = getattr(sample, "output_process_fn_grad", None) or (lambda o: o)
    try:
        cpu_out = _differentiable(process(cpu_fn(sample.input, *sample.args, **sample.kwargs)))
        if not cpu_out:
            raise CpuFailure("no differentiable output")
        gen = torch.Generator().manual_seed(seed)
        weights = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in cpu_out]
        expected = torch.autograd.grad(cpu_out, cpu_inputs, grad_outputs=weights, allow_unused=True)
    except CpuFailure:
        raise
    except Exception as exc:  # noqa: BLE001
        raise CpuFailure(short(f"{type(exc).__name__}: {exc}")) from exc

    def device_grads(dev_sample, dev_inputs):
        out = _differentiable(process(dev_fn(dev_sample[0], *dev_sample[1], **dev_sample[2])))
        if len(out) != len(cpu_out):
            raise SampleFailure("mismatch", f"{len(out)} differentiable outputs != expected {len(cpu_out)}")
        for o, w in zip(out, weights):
            if o.shape != w.shape or o.dtype != w.dtype:
                raise SampleFailure("mismatch", f"differentiable output {tuple(o.shape)} {o.dtype} != expected "
                                                f"{tuple(w.shape)} {w.dtype}")
        dev_weights = [w.to(device) for w in weights]
        return torch.autograd.grad(out, dev_inputs, grad_outputs=dev_weights, allow_unused=True)

    for attempt, (dev_sample, dev_inputs) in enumerate(variants):
        try:
            actual = _call_device(lambda: device_grads(dev_sample, dev_inputs), device)
            break
        except SampleFailure as failure:
            if isinstance(failure.__cause__, SampleFailure):
                raise failure.__cause__ from None
            if attempt + 1 < len(variants) and _retry_with_cpu_arguments(failure, variants[-1]):
                continue
            raise
    try:
        msg = compare(list(actual), list(expected), device_type=device, values=values, override=override,
                      path="grad")
        if msg and values and "values differ" in msg:
            def reference():
                memo: dict[int, torch.Tensor] = {}
                wide = _widen([sample.input, sample.args, sample.kwargs], memo)
                wide_inputs = [memo[id(t)] for t in cpu_inputs]
                out = _differentiable(process(cpu_fn(wide[0], *wide[1], **wide[2])))
                wide_weights = [w.to(o.dtype) for o, w in zip(out, weights)]
                return list(torch.autograd.grad(out, wide_inputs, grad_outputs=wide_weights, allow_unused=True))
            if _arbitrate(list(actual), list(expected), reference, device, override, "grad"):
                return "arbitrated"
    except Exception as exc:  # noqa: BLE001
        status, aten, message = classify_exception(exc)
        raise SampleFailure(status, message, aten) from exc
    if msg:
        raise SampleFailure("mismatch", short(msg))
    return None


# ------------------------------------------------------------ one item

def run_item(op: Any, dtype: torch.dtype, direction: str, device: str = "tpu", *, max_samples: int | None = None,
             values: bool = True, override: tuple[float, float] | None = None,
             on_sample: Callable[[int], None] | None = None, dev_fn: Callable | None = None) -> dict:
    """Runs every sample of ``op`` for ``dtype`` in ``direction`` ("fwd" or
    "bwd"); stops at the first device failure. Returns a result dict:
    status, message, aten (missing operator), samples (compared), skipped_samples,
    arbitrated (samples passed against the float64 reference).

    When the status is not_implemented, ``retry`` is a thunk re-running the
    failing sample (the worker runs it with the CPU fallback on to find every
    missing operator); pop it before serializing."""
    start = time.perf_counter()
    result: dict[str, Any] = {"status": "skipped", "message": "", "aten": None, "samples": 0,
                              "skipped_samples": 0, "arbitrated": 0}

    def done(**kw: Any) -> dict:
        result.update(kw)
        result["seconds"] = round(time.perf_counter() - start, 3)
        return result

    if direction == "fwd":
        if dtype not in op.supported_dtypes("cpu"):
            return done(message="dtype not supported on CPU by the OpInfo")
    else:
        if not getattr(op, "supports_autograd", False):
            return done(message="op does not support autograd")
        if dtype not in op.supported_backward_dtypes("cpu"):
            return done(message="dtype not supported for backward on CPU by the OpInfo")

    dev_fn = dev_fn or op
    torch.manual_seed(0)
    try:
        samples = iter(op.sample_inputs("cpu", dtype, requires_grad=(direction == "bwd")))
    except Exception as exc:  # noqa: BLE001
        return done(message=short(f"sample generation failed: {type(exc).__name__}: {exc}"))

    cpu_skip_reason = ""
    index = 0
    while max_samples is None or index < max_samples:
        try:
            sample = next(samples)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001
            cpu_skip_reason = short(f"sample generation failed: {type(exc).__name__}: {exc}")
            break
        if on_sample is not None:
            on_sample(index)
        def run_sample(sample=sample, index=index) -> None:
            # samples that draw a dropout mask compare structure only, like random ops
            sample_values = values and not is_random_sample(op, sample)
            if direction == "fwd":
                return run_forward_sample(op, dev_fn, sample, device, values=sample_values, override=override)
            return run_backward_sample(op, dev_fn, sample, device, values=sample_values, override=override,
                                       seed=index)

        try:
            if run_sample() == "arbitrated":
                result["arbitrated"] += 1
            result["samples"] += 1
        except CpuFailure as exc:
            result["skipped_samples"] += 1
            cpu_skip_reason = cpu_skip_reason or str(exc)
        except SampleFailure as failure:
            if failure.status == "not_implemented":
                result["retry"] = run_sample  # lets the caller probe every missing operator
            return done(status=failure.status, aten=failure.aten,
                        message=short(f"{_describe(sample, index)}: {failure.message}"))
        except Exception as exc:  # noqa: BLE001 - a harness problem: report, don't hide
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return done(status="error", message=short(f"{_describe(sample, index)}: harness: {tb}"))
        index += 1
    if result["samples"] == 0:
        why = cpu_skip_reason or "no samples"
        return done(message=short(f"nothing compared: {why}" if result["skipped_samples"] else why))
    return done(status="pass")
