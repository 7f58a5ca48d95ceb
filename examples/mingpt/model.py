"""minGPT: a character-level GPT (token + position embeddings, pre-LayerNorm
blocks of causal self-attention and a GELU MLP, dropout), plain PyTorch."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples import common

class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int, block: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.ln2 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.drop(self.proj(y))
        x = x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))
        return x


class MinGPT(nn.Module):
    def __init__(self, vocab: int = 96, d: int = 128, layers: int = 4, heads: int = 4, block: int = 64,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, block, d))
        self.blocks = nn.Sequential(*[GPTBlock(d, heads, block, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        return self.head(self.ln(self.blocks(x)))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, n: int, temperature: float = 0.8, top_k: int | None = 20,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Appends n sampled tokens to idx [B, T] (context cropped to the block)."""
        block = self.pos.shape[1]
        for _ in range(n):
            logits = self(idx[:, -block:])[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.shape[-1]))
                logits = logits.masked_fill(logits < v[:, [-1]], float("-inf"))
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx


def bench_workload(batch: int | None = None, preset: str = "quick"):
    """(model on CPU, 4 host batches [(tokens, next tokens)], loss_fn) for the
    benchmarks; random tokens from a fixed seed."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    vocab = 96
    if preset == "quick":
        d, layers, heads, block, b = 128, 4, 4, 64, batch or 16
    else:
        d, layers, heads, block, b = 384, 6, 6, 256, batch or 16
    model = MinGPT(vocab=vocab, d=d, layers=layers, heads=heads, block=block, dropout=0.0)
    return model, common.random_token_batches(vocab, b, block, g), common.lm_loss
