"""A clean interpreter exit after backward() on tpu.

PyTorch's autograd engine runs the backward functions of a device in a thread of that device
("pt_autograd_N"). When backward() returns, that thread may still hold the last reference to the
graph task (it drops it just after it wakes the caller), and dropping it decrefs Python objects
(the contextvars context every backward() stashes in the thread-local state, tensors): the
thread waits for the GIL. If the script ends then, the main thread keeps the GIL into interpreter
finalization, Python ends the waiting thread (pthread_exit) and the C++ runtime aborts the
process: "terminate called without an active exception", exit status 134 (gdb: GraphTask ->
ThreadLocalState / Future -> decref -> take_gil -> PyThread_exit_thread). The race is PyTorch's;
CUDA's device threads have it too.

At exit, while the interpreter is still whole, each chip's autograd thread runs one more tiny
backward pass: the main thread waits in it with the GIL released, so the device thread finishes
dropping the previous graph task first, then takes this one. This pass is started straight
through the engine, without the stashed context and accumulating into its own leaf (its result
list is empty), and its tensors stay referenced from Python for the rest of the process: when the
thread drops this graph task, no Python object's last reference goes with it.
"""
from __future__ import annotations

import atexit

import torch

_installed = False
_kept: list = []   # the last pass's tensors (see the module's docstring)


def drain_device_threads() -> None:
    """Runs one backward pass on every chip's autograd thread (see the module's docstring)."""
    from torch_tpu import _C

    if not _C._is_initialized() or _C._in_bad_fork():
        return   # no device work in this process: no graph task can be pending on a tpu thread
    from torch_tpu._internal.execution_mode import execution_mode

    engine = torch.autograd.Variable._execution_engine
    with execution_mode("strict"), torch.enable_grad():
        for i in range(_C._device_count()):
            x = torch.zeros((), device=f"tpu:{i}", requires_grad=True)
            y = x * 2.0
            g = torch.ones((), device=f"tpu:{i}")
            engine.run_backward((y,), (g,), False, False, (), True, True)
            _kept.append((x, y, g))


def install() -> None:
    global _installed
    if not _installed:
        atexit.register(drain_device_threads)
        _installed = True
