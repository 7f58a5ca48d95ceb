"""A Llama-style decoder in plain PyTorch (any device): token embedding,
pre-norm blocks with RMSNorm, rotary position embeddings (RoPE),
grouped-query attention (n_kv_heads < n_heads, the KV heads expanded to the
query heads for F.scaled_dot_product_attention) and a SwiGLU MLP, then a
final RMSNorm and an output head (untied by default, as in Llama 2; `tie=True`
shares the embedding matrix).

Generation uses a static KV cache: per layer, preallocated key/value tensors
[B, kv_heads, block, head_dim] (zeros). The prompt is run once (prefill,
causal attention, keys/values written to positions 0..T-1); then every step
feeds only the new token: its key/value are written in place at its absolute
position with index_copy_, and its query attends over the whole cache with a
mask that hides the positions not written yet. Every decode step therefore
has the same shapes (position, mask and RoPE angles come from a small
position tensor), which lets DeferAndFuse reuse one graph for all steps.
When the context window (block) is full, the last block//2 tokens are
prefilled again at positions 0..block//2-1 (context shifting); the
no-cache path (`use_cache=False`, a full forward over the window every step)
uses exactly the same windows, so both produce the same tokens.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples import common


def default_hidden(d: int) -> int:
    """SwiGLU hidden size: 8/3 of the width, rounded up to a multiple of 32."""
    return int(math.ceil(8 * d / 3 / 32) * 32)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(head_dim: int, length: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, head_dim/2] of the rotation angles pos * base^(-2i/head_dim)."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = torch.outer(torch.arange(length).float(), inv)
    return ang.cos(), ang.sin()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates the pairs (x[2i], x[2i+1]) of x [B, H, T, hd] by the angles of
    cos/sin [T, hd/2] (the positions of the T tokens)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).type_as(x)


def expand_kv(x: torch.Tensor, rep: int) -> torch.Tensor:
    """[B, kv_heads, T, hd] -> [B, kv_heads * rep, T, hd]: query head h reads KV head h // rep."""
    if rep == 1:
        return x
    b, kv, t, hd = x.shape
    return x[:, :, None].expand(b, kv, rep, t, hd).reshape(b, kv * rep, t, hd)


class KVCache:
    """Static per-layer key/value buffers [B, kv_heads, max_len, hd] on the
    model's device, zero-initialised (masked slots must not hold NaNs)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 device, dtype) -> None:
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.max_len = max_len


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        if d % heads or heads % kv_heads:
            raise ValueError(f"width {d} must divide into {heads} heads, and heads into {kv_heads} KV heads")
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.n1 = RMSNorm(d)
        self.n2 = RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, hidden, bias=False)  # gate
        self.w3 = nn.Linear(d, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, d, bias=False)  # down

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None, pos: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Without cache: causal attention over the T tokens of x (positions
        0..T-1). With cache and pos None: prefill, i.e. the same, and the
        keys/values are written to cache positions 0..T-1. With cache and pos
        [1] (x holds one token): the token's key/value go to cache position
        pos and its query attends over the cache under mask [1, max_len]."""
        b, t, _ = x.shape
        h = self.n1(x)
        q = rope(self.wq(h).view(b, t, self.heads, self.hd).transpose(1, 2), cos, sin)
        k = rope(self.wk(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2), cos, sin)
        v = self.wv(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads
        if cache is not None and pos is not None:  # decode one token
            ck, cv = cache
            ck.index_copy_(2, pos, k.to(ck.dtype))
            cv.index_copy_(2, pos, v.to(cv.dtype))
            y = F.scaled_dot_product_attention(q, expand_kv(ck, rep).to(q.dtype), expand_kv(cv, rep).to(q.dtype),
                                               attn_mask=mask)
        else:
            if cache is not None:  # prefill
                cache[0][:, :, :t].copy_(k)
                cache[1][:, :, :t].copy_(v)
            y = F.scaled_dot_product_attention(q, expand_kv(k, rep), expand_kv(v, rep), is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = 96, d: int = 128, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                 hidden: int | None = None, block: int = 64, tie: bool = False) -> None:
        super().__init__()
        hidden = hidden or default_hidden(d)
        self.block, self.heads, self.kv_heads, self.hd = block, heads, kv_heads, d // heads
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([LlamaBlock(d, heads, kv_heads, hidden) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.head.weight = self.tok.weight
        self.apply(self._init)
        for name, p in self.named_parameters():  # scaled init of the residual projections (GPT-2 style)
            if name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))
        cos, sin = rope_tables(self.hd, block)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] of idx [B, T] (T <= block), causal."""
        t = idx.shape[1]
        x = self.tok(idx)
        for blk in self.blocks:
            x = blk(x, self.cos[:t], self.sin[:t])
        return self.head(self.norm(x))

    # ------------------------------------------------------------ generation

    def new_cache(self, batch: int) -> KVCache:
        return KVCache(len(self.blocks), batch, self.kv_heads, self.block, self.hd, self.tok.weight.device,
                       self.tok.weight.dtype)

    def prefill(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Runs idx [B, T] at positions 0..T-1, fills the cache; logits of the last token [B, vocab]."""
        t = idx.shape[1]
        x = self.tok(idx)
        for i, blk in enumerate(self.blocks):
            x = blk(x, self.cos[:t], self.sin[:t], cache=(cache.k[i], cache.v[i]))
        return self.head(self.norm(x[:, -1]))

    def decode(self, tok: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token tok [B, 1] at absolute position pos (a [1] long tensor on
        the device) with the cached keys/values; logits [B, vocab]."""
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        mask = (torch.arange(cache.max_len, device=pos.device) <= pos).view(1, -1)  # [1, max_len]: written slots
        x = self.tok(tok)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, cache=(cache.k[i], cache.v[i]), pos=pos, mask=mask)
        return self.head(self.norm(x[:, -1]))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, n: int, temperature: float = 0.8, top_k: int | None = 20,
                 generator: torch.Generator | None = None, use_cache: bool = True,
                 on_token: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Appends n tokens to idx [B, T]: sampled at `temperature` from the
        top_k logits with `generator`, or the argmax when temperature == 0.
        With use_cache, one prefill over the prompt and then one token per step
        with the KV cache; without, a full forward over the window each step.
        The window holds at most `block` tokens; when it is full it restarts
        with its last block//2 tokens (prefilled again at positions 0..).
        on_token, if given, is called with every new token [B] as soon as it
        is chosen (streaming; reading it waits for the device, which under
        DeferAndFuse also makes every decode step one graph, reused)."""
        dev, b = idx.device, idx.shape[0]
        seq = list(idx.unbind(1))  # the tokens so far, each [B]
        start = max(0, len(seq) - self.block)  # first token of the window
        cache = self.new_cache(b) if use_cache else None
        logits = self.prefill(idx[:, start:], cache) if use_cache else self(idx[:, start:])[:, -1]
        for j in range(n):
            nxt = self._pick(logits, temperature, top_k, generator)  # [B, 1]
            seq.append(nxt[:, 0])
            if on_token is not None:
                on_token(nxt[:, 0])
            if j == n - 1:
                break
            if len(seq) - start > self.block:  # the window is full: shift it
                start = len(seq) - self.block // 2
                window = torch.stack(seq[start:], dim=1)
                logits = self.prefill(window, cache) if use_cache else self(window)[:, -1]
            elif use_cache:
                pos = torch.tensor([len(seq) - 1 - start], device=dev)
                logits = self.decode(nxt, pos, cache)
            else:
                logits = self(torch.stack(seq[start:], dim=1))[:, -1]
        return torch.stack(seq, dim=1)

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, top_k: int | None,
              generator: torch.Generator | None) -> torch.Tensor:
        logits = logits.float()
        if temperature == 0:
            return logits.argmax(-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.shape[-1]))
            logits = logits.masked_fill(logits < v[:, [-1]], float("-inf"))
        return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


# -------------------------------------------------------------- sizing


def param_count(cfg: dict, vocab: int = 96) -> int:
    """Parameters of Llama(vocab, d=cfg['width'], layers, heads, kv_heads,
    hidden, tie=cfg.get('tie', False)) — equal to
    sum(p.numel() for p in model.parameters())."""
    d, layers, heads, kv = cfg["width"], cfg["layers"], cfg["heads"], cfg["kv_heads"]
    hidden = cfg.get("hidden") or default_hidden(d)
    hd = d // heads
    per_layer = 2 * d * d + 2 * d * kv * hd + 3 * d * hidden + 2 * d
    return vocab * d + layers * per_layer + d + (0 if cfg.get("tie", False) else vocab * d)


def llama_config_for_params(target: int, vocab: int = 96) -> dict:
    """A Llama shape (layers, width, heads, kv_heads, hidden) with roughly
    `target` parameters (meant for 1e6..1e8): head size 32 below width 256,
    64 from there; a multiple of 4 query heads with half as many KV heads up to
    4 heads and a quarter beyond; SwiGLU hidden 8/3·width; width/layers near
    64 as in Llama 2, so the model deepens as it widens. For each width the
    depth nearest the target; of those, the best by 10 x |log(size/target)|
    + |log(aspect/64)| (typically within 5-15 % of the target)."""
    best, best_score = None, float("inf")
    for d in range(128, 8192 + 1, 128):
        hd = 32 if d < 256 else 64
        heads = d // hd
        if heads % 4:
            continue
        kv = heads // 2 if heads <= 4 else heads // 4
        cfg = {"layers": 1, "width": d, "heads": heads, "kv_heads": kv, "hidden": default_hidden(d)}
        fixed = param_count({**cfg, "layers": 0}, vocab)
        per_layer = param_count({**cfg, "layers": 1}, vocab) - fixed
        layers = max(1, min(96, round((target - fixed) / per_layer)))
        cfg["layers"] = layers
        n = param_count(cfg, vocab)
        score = abs(math.log(n / target)) * 10 + abs(math.log(d / layers / 64))
        if score < best_score:
            best, best_score = cfg, score
    return best


# ------------------------------------------------------------ benchmarks


def bench_workload(batch: int | None = None, preset: str = "quick") -> tuple[nn.Module, list, Callable]:
    """(model on CPU, 4 host batches [(tokens, next tokens)], loss_fn) for the
    benchmarks; random tokens from a fixed seed. quick: width 128, 4 layers,
    4 heads / 2 KV heads, block 64, batch 16; full: width 512, 8 layers,
    8 heads / 2 KV heads, block 256, batch 16."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    vocab = 96
    if preset == "quick":
        d, layers, heads, kv, block, b = 128, 4, 4, 2, 64, batch or 16
    elif preset == "full":
        d, layers, heads, kv, block, b = 512, 8, 8, 2, 256, batch or 16
    else:
        raise ValueError(f"unknown preset {preset!r}")
    model = Llama(vocab=vocab, d=d, layers=layers, heads=heads, kv_heads=kv, block=block)
    return model, common.random_token_batches(vocab, b, block, g), common.lm_loss
