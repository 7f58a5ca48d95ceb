"""Comparison of a device result against the CPU reference.

``compare(actual, expected)`` walks both results in parallel (tensors,
tuples/lists/namedtuples, dicts, Python numbers, None, dtypes, sizes...) and
returns ``None`` when they agree, or a one-paragraph description of the first
difference: structure, device, dtype, shape, or values (with
``torch.testing.assert_close``'s default tolerances for the dtype, NaN equal,
unless larger tolerances are given).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["compare", "default_tolerances", "tolerances_for"]

# Same numbers as torch.testing.assert_close's defaults (rtol, atol).
_DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) of ``torch.testing.assert_close`` for ``dtype`` (0, 0 for
    exact dtypes: integers and bool)."""
    return _DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))


def tolerances_for(dtype: torch.dtype, override: tuple[float, float] | None) -> tuple[float, float]:
    """Defaults for ``dtype``, widened by an OpInfo override (rtol, atol)."""
    rtol, atol = default_tolerances(dtype)
    if override is not None:
        rtol, atol = max(rtol, override[0]), max(atol, override[1])
    return rtol, atol


def _first_lines(text: str, n: int = 4) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return " | ".join(lines[:n])


def _compare_tensor(actual: Any, expected: torch.Tensor, path: str, device_type: str | None, values: bool,
                    override: tuple[float, float] | None) -> str | None:
    if not isinstance(actual, torch.Tensor):
        return f"{path}: expected a tensor, got {type(actual).__name__}"
    if device_type is not None and actual.device.type != device_type:
        return f"{path}: result is on {actual.device}, expected a {device_type} tensor"
    if actual.dtype != expected.dtype:
        return f"{path}: dtype {actual.dtype} != expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"{path}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    if actual.layout != expected.layout:
        return f"{path}: layout {actual.layout} != expected {expected.layout}"
    if not values:
        return None
    a = actual.detach().cpu()
    e = expected.detach()
    if e.layout != torch.strided:
        a, e = a.to_dense(), e.to_dense()
    if e.is_quantized:
        a, e = a.dequantize(), e.dequantize()
    rtol, atol = tolerances_for(e.dtype, override)
    try:
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_device=False,
                                   check_stride=False, check_layout=False)
    except AssertionError as exc:
        return f"{path}: values differ ({_first_lines(exc)})"
    return None


def _compare_number(actual: Any, expected: Any, path: str, values: bool,
                    override: tuple[float, float] | None) -> str | None:
    if isinstance(actual, torch.Tensor) or not isinstance(actual, (bool, int, float, complex)):
        return f"{path}: expected a Python {type(expected).__name__}, got {type(actual).__name__}"
    if isinstance(expected, bool) != isinstance(actual, bool):
        return f"{path}: type {type(actual).__name__} != expected {type(expected).__name__}"
    if not values or actual == expected:
        return None
    if isinstance(expected, (bool, int)) and isinstance(actual, (bool, int)):
        return f"{path}: {actual!r} != expected {expected!r}"
    a, e = complex(actual), complex(expected)
    rtol, atol = tolerances_for(torch.float64, override)
    if _close(a, e, rtol, atol):
        return None
    return f"{path}: {actual!r} != expected {expected!r} (rtol={rtol}, atol={atol})"


def cmath_isnan(z: complex) -> bool:
    return math.isnan(z.real) or math.isnan(z.imag)


def _nan_parts_match(a: complex, b: complex) -> bool:
    def part(x: float, y: float) -> bool:
        return (math.isnan(x) and math.isnan(y)) or x == y
    return part(a.real, b.real) and part(a.imag, b.imag)


def _close(a: complex, e: complex, rtol: float, atol: float) -> bool:
    if cmath_isnan(a) or cmath_isnan(e):
        return _nan_parts_match(a, e)
    if a == e:
        return True
    if any(math.isinf(x) for x in (a.real, a.imag, e.real, e.imag)):
        return False
    return abs(a - e) <= atol + rtol * abs(e)


def compare(actual: Any, expected: Any, *, device_type: str | None = "tpu", values: bool = True,
            override: tuple[float, float] | None = None, path: str = "output") -> str | None:
    """Returns None if ``actual`` (a device result) matches ``expected`` (the
    CPU result), else a description of the first difference.

    ``device_type``: every tensor of ``actual`` must be on this device type
    (None: don't check). ``values=False`` compares only the structure, dtypes
    and shapes (random / uninitialized outputs). ``override``: (rtol, atol)
    that widen the dtype's default tolerances."""
    if isinstance(expected, torch.Tensor):
        return _compare_tensor(actual, expected, path, device_type, values, override)
    if expected is None:
        return None if actual is None else f"{path}: expected None, got {type(actual).__name__}"
    if isinstance(expected, (bool, int, float, complex)):
        return _compare_number(actual, expected, path, values, override)
    if isinstance(expected, (str, bytes)):
        return None if actual == expected else f"{path}: {actual!r} != expected {expected!r}"
    if isinstance(expected, torch.device):
        if not isinstance(actual, torch.device):
            return f"{path}: expected a device, got {type(actual).__name__}"
        if device_type is not None and expected.type == "cpu":
            return None if actual.type == device_type else f"{path}: device {actual} is not a {device_type} device"
        return None if actual == expected else f"{path}: {actual} != expected {expected}"
    if isinstance(expected, (torch.dtype, torch.layout, torch.memory_format)):
        return None if actual == expected else f"{path}: {actual} != expected {expected}"
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return f"{path}: expected a mapping, got {type(actual).__name__}"
        if set(actual.keys()) != set(expected.keys()):
            return f"{path}: keys {sorted(map(str, actual.keys()))} != expected {sorted(map(str, expected.keys()))}"
        for key in expected:
            msg = compare(actual[key], expected[key], device_type=device_type, values=values, override=override,
                          path=f"{path}[{key!r}]")
            if msg:
                return msg
        return None
    if isinstance(expected, Sequence):
        if isinstance(actual, torch.Tensor) or not isinstance(actual, Sequence):
            return f"{path}: expected a {type(expected).__name__}, got {type(actual).__name__}"
        if len(actual) != len(expected):
            return f"{path}: {len(actual)} elements != expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            msg = compare(a, e, device_type=device_type, values=values, override=override, path=f"{path}[{i}]")
            if msg:
                return msg
        return None
    # Anything else (torch.Size is a Sequence, handled above): plain equality.
    try:
        equal = bool(actual == expected)
    except Exception:  # noqa: BLE001 - objects without a usable __eq__
        equal = type(actual) is type(expected)
    return None if equal else f"{path}: {actual!r} != expected {expected!r}"
