"""The architectures of the sweep: Transformers' own config classes at tiny
sizes, the model class that runs them and the inputs they take.

A config is built from the class's defaults with the tiny sizes of TINY
applied where the class has that attribute (recursively in sub-configs such
as CLIP's text and vision configs), then the architecture's own overrides.
Dropout-like probabilities are set to 0 so that a training-mode forward is
deterministic and CPU and tpu can be compared (their RNG streams differ)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

VOCAB = 96

# Attribute -> tiny value, applied where a config has the attribute.
TINY: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64, "head_dim": 8,
    "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "n_inner": 64, "d_model": 32,
    "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 4,
    "d_ff": 64, "d_kv": 8, "ffn_dim": 64, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "n_routed_experts": 4,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "embedding_size": 32, "type_vocab_size": 2, "image_size": 32, "patch_size": 8, "num_channels": 3,
    "max_source_positions": 16, "max_target_positions": 32, "num_mel_bins": 8,
    "sliding_window": 16, "rotary_dim": 4, "bos_token_id": 1, "eos_token_id": 2, "sep_token_id": 2,
    "cls_token_id": 1,
    "ffn_hidden_size": 64, "multi_query_group_num": 2, "kv_channels": 8, "padded_vocab_size": VOCAB,
    "global_attn_every_n_layers": 1, "local_attention": 16, "num_global_tokens": 0,
    "pad_token_id": 0, "decoder_start_token_id": 0,
}
# config keys containing one of these words and holding a float are set to 0
_STOCHASTIC = ("dropout", "drop_rate", "layerdrop", "jitter", "drop_path", "dropout_rate", "attention_probs_dropout",
               "hidden_dropout", "pdrop", "_drop")


@dataclass
class Arch:
    name: str                       # model_type in Transformers' config registry
    kind: str                       # causal | encoder | seq2seq | vision | whisper | clip
    group: str                      # decoder | encoder | encoder-decoder | vision | multimodal
    overrides: dict = field(default_factory=dict)
    auto: str = ""                  # Auto class name (default by kind)
    batch: int = 2                  # samples of the inputs


def _A(name, kind, group, auto="", batch=2, **overrides):
    return Arch(name, kind, group, overrides, auto, batch)


DEC, ENC, ED, VIS, MM = "decoder", "encoder", "encoder-decoder", "vision", "multimodal"

ARCHS: list[Arch] = [
    # decoder LMs
    _A("llama", "causal", DEC), _A("mistral", "causal", DEC), _A("mixtral", "causal", DEC),
    _A("qwen2", "causal", DEC), _A("qwen2_moe", "causal", DEC, decoder_sparse_step=1),
    _A("qwen3", "causal", DEC), _A("qwen3_moe", "causal", DEC), _A("gemma", "causal", DEC),
    _A("gemma2", "causal", DEC), _A("gemma3_text", "causal", DEC), _A("phi", "causal", DEC),
    _A("phi3", "causal", DEC), _A("gpt2", "causal", DEC), _A("gpt_neox", "causal", DEC),
    _A("gptj", "causal", DEC), _A("opt", "causal", DEC, word_embed_proj_dim=32),
    _A("bloom", "causal", DEC), _A("falcon", "causal", DEC), _A("stablelm", "causal", DEC),
    _A("starcoder2", "causal", DEC), _A("olmo", "causal", DEC), _A("olmo2", "causal", DEC),
    _A("cohere", "causal", DEC), _A("deepseek_v3", "causal", DEC, num_key_value_heads=4), _A("granite", "causal", DEC),
    _A("gpt_bigcode", "causal", DEC), _A("codegen", "causal", DEC), _A("gpt_neo", "causal", DEC,
                                                                     attention_types=[[["global", "local"], 1]]),
    _A("persimmon", "causal", DEC), _A("glm", "causal", DEC), _A("helium", "causal", DEC),
    _A("smollm3", "causal", DEC), _A("olmoe", "causal", DEC), _A("granitemoe", "causal", DEC),
    _A("phimoe", "causal", DEC), _A("nemotron", "causal", DEC), _A("xglm", "causal", DEC),
    _A("biogpt", "causal", DEC), _A("ernie4_5", "causal", DEC), _A("exaone4", "causal", DEC),
    _A("gpt_oss", "causal", DEC), _A("mpt", "causal", DEC), _A("jetmoe", "causal", DEC, kv_channels=8),
    *(_A(n, "causal", DEC) for n in (
        "seed_oss", "apertus", "arcee", "ministral", "glm4", "olmo3", "internlm3", "dots1", "hunyuan_v1_dense",
        "exaone", "cohere2", "diffllama", "bitnet", "vaultgemma", "minimax", "glm4_moe", "hunyuan_v1_moe",
        "ernie4_5_moe", "lfm2")),
    # state-space and recurrent decoders (their kernels' slow paths: plain PyTorch ops)
    _A("mamba", "causal", DEC), _A("falcon_mamba", "causal", DEC), _A("rwkv", "causal", DEC),
    _A("nemotron_h", "causal", DEC),
    # encoders
    _A("bert", "encoder", ENC), _A("roberta", "encoder", ENC), _A("deberta-v2", "encoder", ENC),
    _A("deberta", "encoder", ENC), _A("electra", "encoder", ENC), _A("distilbert", "encoder", ENC, dim=32,
                                                                         hidden_dim=64, n_heads=4, n_layers=2),
    _A("albert", "encoder", ENC), _A("modernbert", "encoder", ENC), _A("xlm-roberta", "encoder", ENC),
    _A("mpnet", "encoder", ENC), _A("roformer", "encoder", ENC), _A("megatron-bert", "encoder", ENC),
    _A("convbert", "encoder", ENC), _A("squeezebert", "encoder", ENC), _A("camembert", "encoder", ENC),
    *(_A(n, "encoder", ENC) for n in ("ernie", "rembert", "nystromformer", "ibert", "data2vec-text",
                                       "roberta-prelayernorm", "layoutlm")),
    # encoder-decoders
    _A("t5", "seq2seq", ED, decoder_start_token_id=0), _A("bart", "seq2seq", ED), _A("marian", "seq2seq", ED), _A("pegasus", "seq2seq", ED),
    _A("mbart", "seq2seq", ED), _A("blenderbot", "seq2seq", ED), _A("m2m_100", "seq2seq", ED),
    _A("mt5", "seq2seq", ED), _A("umt5", "seq2seq", ED), _A("whisper", "whisper", ED),
    _A("longt5", "seq2seq", ED, decoder_start_token_id=0), _A("switch_transformers", "seq2seq", ED,
                                                               decoder_start_token_id=0),
    *(_A(n, "seq2seq", ED) for n in ("led", "plbart", "bigbird_pegasus", "prophetnet", "nllb-moe")),
    # vision
    _A("vit", "vision", VIS), _A("deit", "vision", VIS),
    _A("convnext", "vision", VIS, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32),
    _A("convnextv2", "vision", VIS, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32),
    _A("resnet", "vision", VIS, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
    _A("swin", "vision", VIS, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=2, patch_size=4),
    _A("dinov2", "vision", VIS), _A("beit", "vision", VIS),
    _A("regnet", "vision", VIS, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8),
    # training-mode batch norms over the last stage's few tokens: 2 x 4 samples make them ill-conditioned
    _A("levit", "vision", VIS, batch=8, image_size=128, hidden_sizes=[16, 32, 48], num_attention_heads=[2, 2, 2],
       depths=[1, 1, 1], key_dim=[8, 8, 8], patch_size=16),
    _A("mobilenet_v2", "vision", VIS, image_size=32, depth_multiplier=0.25),
    _A("poolformer", "vision", VIS, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1]),
    _A("clip_vision_model", "vision", VIS), _A("siglip_vision_model", "vision", VIS),
    *(_A(n, "vision", VIS) for n in ("vit_msn", "data2vec-vision", "dinov2_with_registers")),
    # multimodal
    _A("clip", "clip", MM), _A("siglip", "clip", MM),
    # (GroupViT is left out: its training-mode token assignment draws Gumbel noise, each device its own)
    *(_A(n, "clip", MM) for n in ("chinese_clip", "altclip", "owlvit", "blip")),
]


def _stochastic_off(d: dict) -> dict:
    for k, v in list(d.items()):
        if isinstance(v, float) and any(w in k for w in _STOCHASTIC):
            d[k] = 0.0
    return d


def _tiny_kwargs(default: dict, overrides: dict) -> dict:
    kw = {}
    for k, v in default.items():
        if isinstance(v, dict) and k.endswith("_config"):
            kw[k] = _tiny_kwargs(v, {})
        elif k in TINY:
            kw[k] = TINY[k]
        elif isinstance(v, float) and any(w in k for w in _STOCHASTIC):
            kw[k] = 0.0
    kw.update(overrides)
    return kw


def build_config(arch: Arch):
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[arch.name]
    default = cls().to_dict()
    cfg = AutoConfig.for_model(arch.name, **_tiny_kwargs(default, arch.overrides))
    for sub in ("text_config", "vision_config"):
        if hasattr(cfg, sub) and getattr(cfg, sub) is not None:
            for k, v in vars(getattr(cfg, sub)).items():
                if isinstance(v, float) and any(w in k for w in _STOCHASTIC):
                    setattr(getattr(cfg, sub), k, 0.0)
    for k, v in list(vars(cfg).items()):
        if isinstance(v, float) and any(w in k for w in _STOCHASTIC):
            setattr(cfg, k, 0.0)
    return cfg


_AUTO = {"causal": "AutoModelForCausalLM", "encoder": "AutoModelForMaskedLM", "seq2seq": "AutoModelForSeq2SeqLM",
         "vision": "AutoModel", "whisper": "AutoModelForSpeechSeq2Seq", "clip": "AutoModel"}


def build_model(arch: Arch, seed: int = 0) -> torch.nn.Module:
    import transformers

    cfg = build_config(arch)
    auto = getattr(transformers, arch.auto or _AUTO[arch.kind])
    torch.manual_seed(seed)
    return auto.from_config(cfg)


def make_inputs(arch: Arch, model: torch.nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    """Host inputs of the architecture's kind, from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    tcfg = getattr(cfg, "text_config", None) or cfg
    vocab = getattr(tcfg, "vocab_size", VOCAB) or VOCAB
    B, T = arch.batch, 12

    def ids(t=T):
        return torch.randint(3, min(vocab, VOCAB), (B, t), generator=g)

    def pixels():
        vcfg = getattr(cfg, "vision_config", None) or cfg
        size = getattr(vcfg, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        return torch.randn(B, getattr(vcfg, "num_channels", 3), size, size, generator=g)

    if arch.kind == "causal":
        x = ids()
        return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x}
    if arch.kind == "encoder":
        x = ids()
        return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x}
    if arch.kind == "seq2seq":
        x = ids()
        return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": ids(8)}
    if arch.kind == "whisper":
        feats = torch.randn(B, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=g)
        return {"input_features": feats, "labels": ids(8)}
    if arch.kind == "vision":
        return {"pixel_values": pixels()}
    if arch.kind == "clip":
        x = ids(8)
        return {"input_ids": x, "pixel_values": pixels(), "return_loss": True}
    raise ValueError(arch.kind)


def by_name(names: list[str]) -> list[Arch]:
    table = {a.name: a for a in ARCHS}
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown architectures: {', '.join(unknown)} (known: {', '.join(table)})")
    return [table[n] for n in names]


# The CI sample: one of each group, a MoE, a sliding-window and a vision CNN.
SAMPLE = ["llama", "mixtral", "gemma2", "gpt2", "bert", "t5", "vit", "resnet", "clip"]
