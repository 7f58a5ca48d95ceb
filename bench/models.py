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


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.n1 = RMSNorm(d)
        self.n2 = RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.n1(x)
        q = rope(self.wq(h).view(b, t, self.heads, self.hd).transpose(1, 2), cos, sin)
        k = rope(self.wk(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2), cos, sin)
        v = self.wv(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = 96, d: int = 128, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                 hidden: int = 352, block: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([LlamaBlock(d, heads, kv_heads, hidden) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(block).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx)
        for blk in self.blocks:
            x = blk(x, self.cos[:t], self.sin[:t])
        return self.head(self.norm(x))


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
