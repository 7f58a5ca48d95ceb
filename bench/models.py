"""The workloads of the DeferAndFuse benchmark (bench/defer.py): minGPT,
the Llama-style decoder and the ResNet-18-style CNN of the examples, with
batches generated from a fixed seed on the host."""
from __future__ import annotations

import torch

from examples.common import lm_loss, random_token_batches
from examples.llama import model as llama_model
from examples.llama.model import Llama  # noqa: F401  (re-exported)
from examples.mingpt.model import MinGPT
from examples.resnet import model as resnet_model


def make(name: str, batch: int | None = None):
    """(model, batches, loss_fn): batches is a list of host tensors pairs.
    Llama and ResNet are the examples' quick bench workloads; minGPT keeps
    its dropout (0.1) here."""
    if name == "llama":
        return llama_model.bench_workload(batch)
    if name == "resnet":
        return resnet_model.bench_workload(batch)
    if name != "mingpt":
        raise ValueError(f"unknown workload {name!r}")
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    block, vocab = 64, 96
    return MinGPT(vocab=vocab, block=block), random_token_batches(vocab, batch or 16, block, g), lm_loss
