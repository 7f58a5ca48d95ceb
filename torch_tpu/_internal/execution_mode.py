"""Execution-mode switches (TorchTPU-compatible names).

``cpu_fallback_mode(True)`` lets operators that have no TPU kernel run on the
CPU: their tensors are copied to the host and back, every fallback is
counted per operator (``torch.tpu.fallback_stats()``) and the first use of
each operator warns. Off by default: a missing operator raises
``NotImplementedError: operator 'aten::...' is not implemented for TPU``.
The environment variable ``TORCH_TPU_CPU_FALLBACK=1`` turns it on at import.
"""
from __future__ import annotations

import contextlib
import os

from torch_tpu import _C

_TRUE = {"1", "true", "yes", "on"}


class _FallbackMode(contextlib.ContextDecorator):
    """Sets the CPU fallback switch; usable as a call, a context manager or a
    decorator. As a context manager it restores the previous setting."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = bool(enabled)
        self._previous = _C._cpu_fallback_enabled()
        _C._set_cpu_fallback(self._enabled)

    def __enter__(self) -> "_FallbackMode":
        _C._set_cpu_fallback(self._enabled)
        return self

    def __exit__(self, *exc: object) -> None:
        _C._set_cpu_fallback(self._previous)

    def __bool__(self) -> bool:
        return self._enabled


def cpu_fallback_mode(enabled: bool | None = None) -> bool | _FallbackMode:
    """With no argument: whether CPU fallback is on. With a bool: switch it
    (returns a handle that also works as a context manager)."""
    if enabled is None:
        return _C._cpu_fallback_enabled()
    return _FallbackMode(enabled)


def _apply_environment() -> None:
    if os.environ.get("TORCH_TPU_CPU_FALLBACK", "").strip().lower() in _TRUE:
        _C._set_cpu_fallback(True)
