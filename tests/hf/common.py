"""Tiny models and a tokenizer made here (nothing is downloaded): a Llama
config, saved with save_pretrained to a local folder, and a word-level
tokenizer over a fixed vocabulary."""
from __future__ import annotations

from pathlib import Path

import torch

WORDS = ("the cat sat on a mat while the dog ran in the park and a bird sang over green hills "
         "under blue skies").split()


def tiny_llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                tie_word_embeddings=False)
    base.update(kw)
    return LlamaConfig(**base)


def tiny_llama(seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_llama_config(**kw)).eval()


def tokenizer(vocab_size: int = 64):
    """A word-level fast tokenizer: [PAD]=0, [BOS]=1, [EOS]=2, [UNK]=3, then
    the words; padded to vocab_size entries."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3}
    for w in dict.fromkeys(WORDS):
        vocab[w] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"w{len(vocab)}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                   unk_token="[UNK]")


def save_tiny_llama(path: Path, seed: int = 0):
    model = tiny_llama(seed)
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    return model
