"""Execution-mode switches (TorchTPU-compatible names).

Eager modes (``set_eager_mode`` / ``eager_mode``; ``torch_tpu.set_execution_mode``):

* ``EagerMode.DEFER_NEVER`` ("strict"): every op is launched asynchronously
  as it is called (the default).
* ``EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING`` ("debug"): every op waits
  for its kernel, so an error is raised by the op that caused it
  (``TPU_LAUNCH_BLOCKING=1`` at start-up).
* ``EagerMode.DEFER_AND_FUSE`` ("defer"): ops are recorded; the recorded
  graph runs at the next cut (``.item()``, ``.cpu()``, ``print``,
  ``torch.save``, synchronize, events, a size cap...), fused into fewer
  kernels, with memory only for the tensors that are still alive, and its
  plan is cached so that a training loop reuses it every step
  (``TORCH_TPU_DEFER_AND_FUSE=1`` at start-up). ``torch.tpu.defer_stats()``
  reports cuts by reason and source line, graphs built, cache hits, fused
  kernels and bytes that never took memory.

``cpu_fallback_mode(True)`` lets operators that have no TPU kernel run on the
CPU: their tensors are copied to the host and back, every fallback is
counted per operator (``torch.tpu.fallback_stats()``) and the first use of
each operator warns. Off by default: a missing operator raises
``NotImplementedError: operator 'aten::...' is not implemented for TPU``.
The environment variable ``TORCH_TPU_CPU_FALLBACK=1`` turns it on at import.
"""
from __future__ import annotations

import contextlib
import enum
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


class EagerMode(enum.IntEnum):
    """How ops run on the tpu device (values match the runtime's modes)."""

    DEFER_NEVER = 0
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 1
    DEFER_AND_FUSE = 2


_NAMES = {"strict": EagerMode.DEFER_NEVER, "debug": EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
          "defer": EagerMode.DEFER_AND_FUSE}


def _coerce(mode: "EagerMode | str | int") -> EagerMode:
    if isinstance(mode, str):
        key = mode.strip().lower()
        if key in _NAMES:
            return _NAMES[key]
        try:
            return EagerMode[mode.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown execution mode {mode!r}: expected one of 'strict', 'debug', 'defer' "
                             f"or an EagerMode name ({', '.join(m.name for m in EagerMode)})") from None
    try:
        return EagerMode(int(mode))
    except (ValueError, TypeError):
        raise ValueError(f"unknown execution mode {mode!r}") from None


def get_eager_mode() -> EagerMode:
    """The current eager mode."""
    return EagerMode(_C._exec_mode())


def set_eager_mode(mode: "EagerMode | str") -> EagerMode:
    """Sets the eager mode for the whole process; returns the previous one.
    Leaving DEFER_AND_FUSE runs every pending graph first."""
    previous = get_eager_mode()
    _C._set_exec_mode(int(_coerce(mode)))
    return previous


class _EagerModeHandle(contextlib.ContextDecorator):
    """Applies a mode at once; as a context manager (or decorator) it
    restores the previous mode on exit."""

    def __init__(self, mode: EagerMode) -> None:
        self._mode = mode
        self._previous = set_eager_mode(mode)

    def __enter__(self) -> "_EagerModeHandle":
        set_eager_mode(self._mode)
        return self

    def __exit__(self, *exc: object) -> None:
        set_eager_mode(self._previous)

    @property
    def mode(self) -> EagerMode:
        return self._mode


def eager_mode(mode: "EagerMode | str | None" = None) -> "EagerMode | _EagerModeHandle":
    """With no argument: the current mode. With a mode: switch to it (the
    returned handle also works as a context manager that switches back)."""
    if mode is None:
        return get_eager_mode()
    return _EagerModeHandle(_coerce(mode))


_PUBLIC = {EagerMode.DEFER_NEVER: "strict", EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING: "debug",
           EagerMode.DEFER_AND_FUSE: "defer"}


def set_execution_mode(mode: str) -> str:
    """``torch_tpu.set_execution_mode("strict" | "debug" | "defer")``: the
    public alias of set_eager_mode; returns the previous mode's name."""
    return _PUBLIC[set_eager_mode(mode)]


def get_execution_mode() -> str:
    """"strict", "debug" or "defer"."""
    return _PUBLIC[get_eager_mode()]


def execution_mode(mode: str) -> _EagerModeHandle:
    """Context manager: ``with torch_tpu.execution_mode("defer"): ...``."""
    return _EagerModeHandle(_coerce(mode))


def flush(device: int | None = None) -> None:
    """Runs the pending deferred graphs now (of one device, default: all),
    without waiting for them to finish. A no-op outside DEFER_AND_FUSE."""
    _C._flush(-1 if device is None else int(device))


def _apply_environment() -> None:
    if os.environ.get("TORCH_TPU_CPU_FALLBACK", "").strip().lower() in _TRUE:
        _C._set_cpu_fallback(True)
    import torch

    import torch_tpu

    node_sites = os.environ.get("TORCH_TPU_DEFER_SITES", "1").strip().lower() in _TRUE
    _C._install_site_fn(os.path.dirname(torch.__file__) + os.sep, os.path.dirname(torch_tpu.__file__) + os.sep,
                        node_sites)
    for name, setter in (("TORCH_TPU_DEFER_MAX_OPS", _C._set_defer_max_ops),
                         ("TORCH_TPU_DEFER_SEGMENT_OPS", _C._set_defer_segment_ops)):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                setter(int(value))
            except ValueError:
                raise ValueError(f"{name}={value!r} is invalid: expected an integer") from None
