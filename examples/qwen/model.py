"""A small Hugging Face transformers Qwen3 (decoder-only, grouped-query
attention, RMSNorm, rotary positions, SwiGLU) over a character vocabulary.

The model is plain transformers code and runs on any device. The vocabulary
is CharData's characters (ids 0 .. n-1) followed by three special tokens:
pad = n, bos = n + 1, eos = n + 2. The output projection (lm_head) has its
own weights, as in the larger Qwen3 models (tie_word_embeddings=False):
Module.to("tpu") replaces each Parameter by a new one (the tpu tensor is not
shallow-copy compatible with a CPU tensor), which would silently untie an
embedding shared with lm_head.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded: a stray hub access fails loudly

from typing import Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

SPECIALS = ("<pad>", "<bos>", "<eos>")


def config(chars: int, *, hidden: int = 128, layers: int = 4, heads: int = 4, kv_heads: int = 2,
           intermediate: int | None = None, max_positions: int = 512) -> transformers.Qwen3Config:
    """A Qwen3Config for a vocabulary of `chars` characters plus pad/bos/eos;
    head_dim = hidden / heads, kv_heads < heads gives grouped-query attention."""
    return transformers.Qwen3Config(
        vocab_size=chars + len(SPECIALS), hidden_size=hidden, intermediate_size=intermediate or 3 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, max_position_embeddings=max_positions, tie_word_embeddings=False,
        attention_dropout=0.0, use_cache=True,
        pad_token_id=chars, bos_token_id=chars + 1, eos_token_id=chars + 2)


def build(cfg: transformers.Qwen3Config, seed: int, attn: str = "sdpa") -> transformers.PreTrainedModel:
    """A freshly initialised Qwen3ForCausalLM on the CPU; the same seed gives
    the same weights."""
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)


def load(folder: str, attn: str = "sdpa") -> transformers.PreTrainedModel:
    """from_pretrained of a folder written by save_pretrained (float32, CPU)."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attn,
                                                             dtype=torch.float32, local_files_only=True)


def causal_lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of logits [B, T, V] for tokens [B, T], i.e.
    what model(tokens, labels=tokens).loss computes (position t predicts t+1)."""
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def bench_workload(batch: int | None = None, preset: str = "quick") -> tuple[torch.nn.Module, list, Callable]:
    """(Qwen3ForCausalLM on CPU, 4 host batches [((tokens,), tokens)], loss_fn(output, tokens))
    for the benchmark matrix; random tokens from a fixed seed. The model is
    called as model(tokens) and returns a CausalLMOutputWithPast (loss_fn
    also takes bare logits). quick: ~1.6 M parameters, seq 64, batch 8;
    full: ~19 M parameters, seq 256, batch 8."""
    g = torch.Generator().manual_seed(0)
    chars = 125
    if preset == "quick":
        cfg, seq, b = config(chars, hidden=192, layers=4, heads=6, kv_heads=2, intermediate=512), 64, batch or 8
    else:
        cfg, seq, b = config(chars, hidden=512, layers=6, heads=8, kv_heads=2, intermediate=1536), 256, batch or 8
    cfg.use_cache = False
    model = build(cfg, seed=0)
    batches = []
    for _ in range(4):
        x = torch.randint(0, chars, (b, seq), generator=g)
        batches.append(((x,), x))

    def loss_fn(out, tokens: torch.Tensor) -> torch.Tensor:
        return causal_lm_loss(getattr(out, "logits", out), tokens)

    return model, batches, loss_fn
