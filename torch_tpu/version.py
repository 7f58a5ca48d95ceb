"""Version and build facts of the installed torch_tpu.

    >>> import torch_tpu.version as v
    >>> v.__version__, v.runtime, v.api_version, v.torch
    >>> v.build["c_flags"]   # how the runtime was compiled (setup.py records it)
    >>> v.info()   # everything below in one dict (what `torch-tpu doctor` prints)
"""
from __future__ import annotations

from typing import Any

import torch

from torch_tpu import __version__, _C

try:
    from torch_tpu._build_info import BUILD as _BUILD
except ImportError as e:  # a source tree built before setup.py recorded it
    raise ImportError(f"torch_tpu/_build_info.py is missing ({e}): rebuild with `make build` "
                      "(or reinstall the wheel)") from e

#: the C runtime's own version string ("tpurt X.Y.Z")
runtime: str = _C._runtime_version()
#: the runtime's C API version (TPURT_API_VERSION the glue was built against)
api_version: int = int(_C._api_version)
#: the PyTorch release the glue was built for (its C++ ABI is pinned to it)
torch_version: str = torch.__version__
torch = torch_version  # noqa: F811 - the name users look for
#: how this copy was built: CMake build type, whether the runtime was compiled for the build
#: machine's CPU (-march=native, TPURT_NATIVE), C compiler, the runtime's C flags, the glue's
#: C++ flags and the torch it was built against
build: dict[str, Any] = dict(_BUILD)


def info() -> dict[str, Any]:
    """Versions, the build flags, the kernel level chosen on this host
    (run-time CPU detection, ``TORCH_TPU_ISA``), the bf16 matmul path, the
    GEMM library and whether generated kernels (the C compiler) are
    available."""
    cpu = _C._cpu_info()
    cg_ok, cg_text = _C._codegen_info()
    return {"torch_tpu": __version__, "runtime": runtime, "api_version": api_version, "torch": torch_version,
            "build_type": build["build_type"], "build_native": build["native"], "build_flags": build["c_flags"],
            "build_variants": build.get("variants", []), "library": cpu["build"],
            "host_cpu": cpu["model"], "isa": cpu["isa"], "host_isa": cpu["host_isa"],
            "bf16_matmul": cpu["bf16_matmul"], "bf16_conv": cpu["bf16_conv"], "gemm_library": cpu["gemm_library"],
            "codegen": cg_text if cg_ok else f"off: {cg_text}"}


__all__ = ["__version__", "runtime", "api_version", "torch", "build", "info"]
