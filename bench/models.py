"""Small versions of the benchmark workloads (plain PyTorch, any device):
a minGPT block stack, a Llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA),
and a ResNet-18-style CNN. Each `make_*` returns (model, batch_fn, loss_fn)
with batches generated from a fixed seed on the host."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# ------------------------------------------------------------------ minGPT

from examples.mingpt.model import GPTBlock, MinGPT  # noqa: E402,F401  (one definition, shared with the example)


# --------------------------------------------------------------- Llama-style

from examples.llama.model import Llama, LlamaBlock, RMSNorm, rope  # noqa: E402,F401  (shared with the example)


# -------------------------------------------------------------------- ResNet


from examples.resnet.model import BasicBlock, ResNet18  # noqa: E402,F401  (one definition, shared with the example)


# ------------------------------------------------------------- workloads


def make(name: str, batch: int | None = None):
    """(model, batches, loss_fn): batches is a list of host tensors pairs."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name in ("mingpt", "llama"):
        block, vocab = 64, 96
        b = batch or 16
        model = MinGPT(vocab=vocab, block=block) if name == "mingpt" else Llama(vocab=vocab, block=block)
        batches = []
        for _ in range(4):
            x = torch.randint(0, vocab, (b, block + 1), generator=g)
            batches.append((x[:, :-1].contiguous(), x[:, 1:].contiguous()))

        def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    elif name == "resnet":
        b = batch or 16
        model = ResNet18()
        batches = [(torch.randn(b, 3, 32, 32, generator=g), torch.randint(0, 10, (b,), generator=g))
                   for _ in range(4)]
        loss_fn = F.cross_entropy
    else:
        raise ValueError(f"unknown workload {name!r}")
    return model, batches, loss_fn
