"""Hugging Face Accelerate learns about the tpu: its default device and its
memory probe.

Accelerate picks its device in `PartialState.default_device` from a fixed
list (MPS, MLU, SDAA, MUSA, NPU, HPU, CUDA, XPU, Neuron, else CPU). Trainer
moves a model to TrainingArguments.device (tpu:0, which Transformers finds
through torch.accelerator) and then `accelerator.prepare` would move it back
to that CPU default while the batches go to the tpu. When `accelerate.state`
is imported, default_device answers `tpu` where `tpu` is the current
accelerator (`use_cpu=True` / `Accelerator(cpu=True)` still choose the CPU;
`ACCELERATE_TORCH_DEVICE` still wins, as before).

`device_map="auto"` (Transformers' from_pretrained) and `device_map="balanced"`
(Diffusers' pipelines) size each accelerator with
`accelerate.utils.modeling.get_max_memory()`, which asks CUDA, XPU, NPU, MLU,
MUSA, SDAA or HPU for their free memory and knows no other device: on a
machine whose accelerator is `tpu` it reports the CPU alone and the whole
model would land on the CPU. When that module is imported (never before:
torch_tpu imports nothing of Accelerate), its get_max_memory is wrapped so
that, with no explicit max_memory and `tpu` as the current accelerator, it
reports every chip's free memory (`torch.tpu.mem_get_info`) under its index,
plus the host's available memory under "cpu" (the offload target), as it
does for CUDA devices. An explicit max_memory and other accelerators go to
Accelerate's own function unchanged."""
from __future__ import annotations

import functools
import sys

import torch

MODELING, STATE = "accelerate.utils.modeling", "accelerate.state"


def _tpu_is_the_accelerator() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == "tpu" and torch.accelerator.is_available()


def wrap(original):
    if getattr(original, "__torch_tpu__", False):
        return original

    @functools.wraps(original)
    def get_max_memory(max_memory=None):
        if max_memory is not None or not _tpu_is_the_accelerator():
            return original(max_memory)
        import psutil

        found = {i: torch.tpu.mem_get_info(i)[0] for i in range(torch.tpu.device_count())}
        found["cpu"] = psutil.virtual_memory().available
        return found

    get_max_memory.__torch_tpu__ = True
    return get_max_memory


def _patch_modeling(module) -> None:
    module.get_max_memory = wrap(module.get_max_memory)
    utils = sys.modules.get("accelerate.utils")
    if utils is not None and hasattr(utils, "get_max_memory"):
        utils.get_max_memory = wrap(utils.get_max_memory)


def _patch_state(module) -> None:
    cls = module.PartialState
    original = cls.default_device
    if getattr(original.fget, "__torch_tpu__", False):
        return

    def default_device(self) -> torch.device:
        return torch.device("tpu") if _tpu_is_the_accelerator() else original.fget(self)

    default_device.__torch_tpu__ = True
    default_device.__doc__ = original.__doc__
    cls.default_device = property(default_device)


_PATCHES = {MODELING: _patch_modeling, STATE: _patch_state}


def install() -> None:
    """Patches the modules now if they are loaded, else when they are imported."""
    from torch_tpu._internal.import_hooks import after_import

    for name, patch in _PATCHES.items():
        after_import(name, patch)
