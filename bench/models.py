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


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 10, width: int = 32, in_ch: int = 3) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(in_ch, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        layers, cin = [], w
        for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


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
