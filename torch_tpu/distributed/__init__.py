"""``tpu_dist``: the c10d backend of the tpu device.

Registered when torch_tpu loads (``import torch`` autoloads it), for
``devices=["tpu"]``, so all of these work as with NCCL on CUDA:

    torch.distributed.init_process_group("tpu_dist")
    torch.distributed.init_process_group(device_id=torch.device("tpu", local_rank))
    torch.distributed.init_process_group("cpu:gloo,tpu:tpu_dist")
    torch.distributed.get_default_backend_for_device("tpu")   # -> "tpu_dist"

The backend itself is C++ (torch_tpu/csrc/c10d.cpp, a c10d::Backend): it
stages tpu tensors through pinned host memory in stream order and runs the
collective on Gloo, built here over the group's store under its own key
prefix, so TCP (and torchrun's rendezvous) carry everything on the wire.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch

BACKEND = "tpu_dist"

__all__ = ["BACKEND", "is_available"]


def is_available() -> bool:
    """True when torch has c10d with Gloo (the transport tpu_dist runs on)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


_VERIFY_MODES = {"0": 0, "1": 1, "gloo": 2}


def _verify() -> int:
    """TORCH_TPU_DIST_VERIFY (default 1): before each collective the ranks
    exchange its fingerprint (op, dtype, shape, reduce op, root) and raise
    an error naming every rank's call when they differ, instead of Gloo
    aborting the process on a size mismatch. With every rank on this host
    the fingerprints meet in shared memory (microseconds); otherwise, or
    with ``gloo``, through one small Gloo all_gather. 0 turns the check off."""
    v = os.environ.get("TORCH_TPU_DIST_VERIFY", "1").strip()
    if v not in _VERIFY_MODES:
        raise ValueError(f'TORCH_TPU_DIST_VERIFY="{v}" is invalid: expected 0, 1 or gloo')
    return _VERIFY_MODES[v]


def _create_backend(store, rank: int, size: int, timeout: timedelta):
    """c10d's creator for ``tpu_dist``: a Gloo transport for this group's
    ranks, wrapped by the tpu staging backend."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroupGloo

    from torch_tpu import _C

    # Own prefix: with "cpu:gloo,tpu:tpu_dist" torch's Gloo backend rendezvous
    # over the same store, and the two must not read each other's keys.
    transport = ProcessGroupGloo(dist.PrefixStore(f"{BACKEND}/", store), rank, size, timeout)
    return _C._tpu_dist_backend(transport, timeout, _verify(), store)


_registered = False


def _register_backend() -> None:
    """Registers ``tpu_dist`` with c10d for the tpu device (idempotent)."""
    global _registered
    if _registered or not is_available():
        return
    import torch.distributed as dist

    dist.Backend.register_backend(BACKEND, _create_backend, devices=["tpu"])
    _registered = True
