"""Precision of float32 matrix products and convolutions on the tpu device.

A TPU's matrix unit multiplies bfloat16; float32 products are emulated with
passes of bfloat16 products accumulated in float32:

* ``Precision.DEFAULT`` — 1 pass: both operands rounded to bfloat16.
* ``Precision.HIGH`` — 3 passes: each operand split into bfloat16 ``hi + lo``;
  ``hi*hi + hi*lo + lo*hi`` (close to float32).
* ``Precision.HIGHEST`` — full float32 products.

Other dtypes are unaffected (float16/bfloat16 operands are exact in float32;
float64 and integers are computed exactly in their own type).

API (``torch.tpu.precision`` is a controller object)::

    torch.tpu.precision.set(torch.tpu.Precision.HIGH)   # process-wide
    torch.tpu.precision.get()        # the torch_tpu setting, or None
    torch.tpu.precision.effective()  # the precision used now
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        y = a @ b                    # restored on exit
    torch.tpu.precision.set(None)    # follow PyTorch again

With no torch_tpu setting (None, the default) the device follows
``torch.set_float32_matmul_precision``: "highest" -> HIGHEST,
"high" -> HIGH, "medium" -> DEFAULT.
"""
from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator

import torch

from torch_tpu import _C

__all__ = ["Precision", "precision"]


class Precision(enum.Enum):
    DEFAULT = 0
    HIGH = 1
    HIGHEST = 2


_FROM_TORCH = {"highest": Precision.HIGHEST, "high": Precision.HIGH, "medium": Precision.DEFAULT}


def _coerce(p: Precision | str | None) -> Precision | None:
    if p is None or isinstance(p, Precision):
        return p
    if isinstance(p, str):
        try:
            return Precision[p.upper()]
        except KeyError:
            pass
    raise ValueError(f"expected a torch.tpu.Precision, its name or None, got {p!r}")


class _PrecisionControl:
    """``torch.tpu.precision``: getter/setter and context manager."""

    def get(self) -> Precision | None:
        """The torch_tpu setting, or None when following PyTorch."""
        v = _C._matmul_precision()
        return None if v < 0 else Precision(v)

    def set(self, p: Precision | str | None) -> None:
        """Sets the precision for the whole process (None: follow PyTorch)."""
        p = _coerce(p)
        _C._set_matmul_precision(-1 if p is None else p.value)

    def effective(self) -> Precision:
        """The precision float32 products use now."""
        p = self.get()
        return p if p is not None else _FROM_TORCH[torch.get_float32_matmul_precision()]

    @contextlib.contextmanager
    def __call__(self, p: Precision | str | None) -> Iterator[None]:
        p = _coerce(p)
        old = self.get()
        self.set(p)
        try:
            yield
        finally:
            self.set(old)

    def __repr__(self) -> str:
        return f"torch.tpu.precision(setting={self.get()}, effective={self.effective()})"


precision = _PrecisionControl()
