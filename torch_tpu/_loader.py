"""``torch_tpu._loader.load()``: the name under which TorchTPU's users (Ray
Train's TPU device manager, for one, before it initialises a ``tpu_dist``
process group) ask for the backend to be loaded. Importing torch_tpu already
registers the device and the c10d backend; load() makes sure it happened
(idempotent)."""
from __future__ import annotations


def load() -> None:
    import torch_tpu

    torch_tpu._register()
