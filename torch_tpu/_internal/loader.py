"""Which copy of the engine library this process maps.

The runtime is built once per x86-64 level (runtime/CMakeLists.txt):
``lib/libtpurt.so`` for baseline x86-64, ``lib/glibc-hwcaps/x86-64-v3/`` and
``lib/glibc-hwcaps/x86-64-v4/`` for the AVX2 and AVX-512 levels, all with the
soname ``libtpurt.so``. By default the dynamic loader picks the best variant
the host runs when ``torch_tpu._C`` is imported (glibc-hwcaps). With
``TORCH_TPU_ISA`` set, the variant of the level it forces is mapped first
(``scalar`` -> baseline, ``avx2`` -> v3, ``avx512`` / ``amx`` -> v4), so
``_C``'s dependency resolves to it and a forced level runs the code compiled
for it, not only the hand-written paths the runtime chooses between. A
level the host cannot run is not mapped: the runtime's own check then
raises its error naming the missing features.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

_LIB = Path(__file__).resolve().parent.parent / "lib"
_VARIANT = {"scalar": None, "avx2": "x86-64-v3", "avx512": "x86-64-v4", "amx": "x86-64-v4"}
# /proc/cpuinfo flags the psABI levels require beyond the previous level
_NEEDS = {
    "x86-64-v3": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
_handle = None


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _runs(variant: str, flags: set[str]) -> bool:
    levels = ["x86-64-v3", "x86-64-v4"]
    return all(set(_NEEDS[v]) <= flags for v in levels[: levels.index(variant) + 1])


def preload() -> str | None:
    """Maps the variant TORCH_TPU_ISA asks for (before torch_tpu._C is
    imported); returns its path, or None when the loader chooses."""
    global _handle
    level = os.environ.get("TORCH_TPU_ISA", "").strip().lower()
    if level not in _VARIANT:
        return None  # unset, or unknown: the runtime reports an unknown level itself
    variant = _VARIANT[level]
    path = _LIB / "libtpurt.so" if variant is None else _LIB / "glibc-hwcaps" / variant / "libtpurt.so"
    if not path.is_file() or (variant is not None and not _runs(variant, _cpu_flags())):
        return None  # a native build (one library), or a level the host lacks
    _handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    return str(path)
