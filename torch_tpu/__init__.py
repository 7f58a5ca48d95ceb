"""torch_tpu: a native PyTorch backend for TPUs (engine in C).

``import torch_tpu`` (or plain ``import torch``, through the ``torch.backends``
autoload entry point) registers the ``tpu`` device with PyTorch:

    >>> import torch
    >>> x = torch.ones(3, device="tpu")
    >>> torch.tpu.device_count()

Today the device is an emulated TPU (host cores behaving like an
accelerator); see README.md.
"""
from __future__ import annotations

# Defined before `import torch`: when torch_tpu is imported first, importing
# torch runs the autoload entry point while this module is still importing;
# the registration then happens at the end of this module instead.
_importing = True


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: PyTorch calls it on
    ``import torch`` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0."""
    if not _importing:
        _register()


import torch  # noqa: E402

__version__ = "0.1.0"

_registered = False


def _register() -> None:
    """Registers the backend with PyTorch once (idempotent)."""
    global _registered
    if _registered:
        return
    from torch_tpu._internal import loader

    loader.preload()  # the engine variant TORCH_TPU_ISA forces, if any
    from torch_tpu import _C  # loads libtpurt and registers the C++ pieces

    torch.utils.rename_privateuse1_backend("tpu")
    from torch_tpu import tpu as _tpu_module

    torch._register_device_module("tpu", _tpu_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    _registered = True

    from torch_tpu._internal import execution_mode

    execution_mode._apply_environment()
    from torch_tpu import distributed as _distributed

    _distributed._register_backend()  # c10d backend "tpu_dist" for devices=["tpu"]
    del _C

    # torch.compile(backend="tpu"), Dynamo's device interface and plain
    # torch.compile on tpu tensors, registered when Dynamo / Inductor load
    from torch_tpu._internal.import_hooks import after_import

    after_import("torch._dynamo", lambda _m: __import__("torch_tpu.compiler").compiler._install_dynamo())
    after_import("torch._inductor.compile_fx",
                 lambda m: __import__("torch_tpu.compiler").compiler._install_inductor(m))
    # Accelerate's default device and memory probe see the chips (torch_tpu/_accelerate.py)
    from torch_tpu import _accelerate

    _accelerate.install()
    # backward() on tpu then exit: PyTorch's autograd device threads drained first (see the module)
    from torch_tpu._internal import autograd_exit

    autograd_exit.install()


_register()
_importing = False

if __import__("os").environ.get("TORCH_TPU_CHECK_NAN"):  # NaN / Inf checker mode (torch_tpu.debug)
    from torch_tpu import debug as _debug

    _debug._install_from_environment()

from torch_tpu._internal.execution_mode import (  # noqa: E402
    cpu_fallback_mode, execution_mode, flush, get_execution_mode, set_execution_mode)

__all__ = ["cpu_fallback_mode", "execution_mode", "flush", "get_execution_mode", "set_execution_mode",
           "__version__"]
