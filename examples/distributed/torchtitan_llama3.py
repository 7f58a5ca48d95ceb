"""TorchTitan's Llama 3 debug model trained on tpu with the tpu_dist backend:
FSDP over 2 processes under torchrun, TorchTitan's own trainer (torchtitan.train)
unpatched. One command (needs `make venv-full`: torchtitan==0.3.0):

    .venv/bin/python examples/distributed/torchtitan_llama3.py --steps 6

It builds an offline tokenizer and data set (below), then runs

    torchrun --nproc-per-node 2 -m torchtitan.train \\
        --module examples.distributed.torchtitan_llama3 --config llama3_debugmodel_tpu ...

TorchTitan selects the device by itself: torchtitan.tools.utils asks
torch._utils._get_available_device_type(), which returns the PrivateUse1 backend
("tpu") when torch.tpu.is_available(); its process group takes the device's
backend from torch.distributed.Backend.default_device_backend_map ("tpu" ->
"tpu_dist"). No shim is needed for either. This module is only a TorchTitan
config registry (`--module` accepts a module path) holding one config,
llama3_debugmodel_tpu: TorchTitan's llama3_debugmodel with

- attention through F.scaled_dot_product_attention (is_causal) instead of
  FlexAttention: TorchTitan always runs flex_attention through
  torch.compile(backend="inductor"), and Inductor generates no kernels for the
  tpu device (torch_tpu's compiler is torch.compile(backend="tpu")). SDPA lets
  a token attend across the documents packed into one sequence, which a debug
  run does not mind;
- a tokenizer and data set made here, offline: the debug config's
  ./tests/assets/tokenizer and tests/assets/c4_test live in TorchTitan's
  repository, not in its wheel, and nothing may be downloaded. The text is
  Python's own documentation topics (pydoc_data.topics, one document per topic,
  as JSON lines read by TorchTitan's "c4_test" loader through
  --dataloader.dataset_path); the tokenizer is a byte-level BPE of the debug
  model's vocabulary size (2048) trained on it with `tokenizers`;
- parallelism.spmd_backend = "partial_dtensor" (plain FSDP2 fully_shard):
  the default, spmd_types, needs a fully_shard newer than torch 2.13's;
- shorter sequences and batches (--seq-len, --batch) and no checkpointing, so
  that a few steps take seconds on 2 host cores;
- torch.distributed.set_timeout, which TorchTitan calls after the first step,
  defined from ProcessGroup.set_timeout when torch (2.13) lacks it.

Any other TorchTitan option can follow `--` and is passed to torchtitan.train
(e.g. `-- --training.dtype bfloat16`). Rank 0 prints TorchTitan's log:
"step: N  loss: ..." lines, and "TPU_DIST device=... backend=..." lines from
this config, read by tests/test_dist_clients.py.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 2048  # TorchTitan's debug model's vocabulary
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
ASSETS_ENV = "TORCH_TPU_TITAN_ASSETS"


def build_assets(out: Path) -> Path:
    """tokenizer.json + tokenizer_config.json and data/train.jsonl in out
    (made once; the same inputs give the same files)."""
    from pydoc_data import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok_json, data = out / "tokenizer.json", out / "data" / "train.jsonl"
    if tok_json.exists() and data.exists():
        return out
    data.parent.mkdir(parents=True, exist_ok=True)
    docs = [topics.topics[k] for k in sorted(topics.topics)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    tmp = out / f".tmp{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": False, "add_eos_token": False,
         "model_max_length": 1 << 20, "tokenizer_class": "PreTrainedTokenizerFast"}))
    with open(tmp / "train.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    os.replace(tmp / "tokenizer_config.json", out / "tokenizer_config.json")
    os.replace(tmp / "train.jsonl", data)
    os.replace(tmp / "tokenizer.json", tok_json)  # last: its presence means done
    tmp.rmdir()
    return out


def llama3_debugmodel_tpu():
    """TorchTitan config registry entry: llama3_debugmodel on tpu (see the module doc)."""
    import torch
    import torch.distributed as dist
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    assets = Path(os.environ.get(ASSETS_ENV, ROOT / "build" / "torchtitan_assets"))
    config.hf_assets_path = str(assets)
    config.dataloader.dataset_path = str(assets / "data")
    config.training.seq_len = 128
    config.training.local_batch_size = 4
    config.training.steps = 6
    config.checkpoint.enable = False
    config.parallelism.spmd_backend = "partial_dtensor"
    config.dump_folder = str(ROOT / "build" / "torchtitan_outputs")

    # What TorchTitan chose, reported once its process group exists (the
    # trainer is built right after this config): read by the test.
    def report() -> None:
        from torchtitan.tools import utils

        if dist.is_initialized():
            pg = dist.distributed_c10d._get_default_group()
            backend = pg._get_backend(torch.device(utils.device_type)).name()
            print(f"TPU_DIST rank={dist.get_rank()} device={utils.device_type}:{torch.tpu.current_device()} "
                  f"backend={backend} world={dist.get_world_size()}", flush=True)

    _after_init_distributed(report)
    _torch_2_13_compat()
    return config


def _torch_2_13_compat() -> None:
    """TorchTitan 0.3.0 calls torch.distributed.set_timeout(timeout, group)
    once, after the first step (to shorten the process groups' timeouts); it
    is newer than torch 2.13, whose ProcessGroup.set_timeout does the same for
    one group. Defined only when missing (the device plays no part in it)."""
    import torch.distributed as dist

    if hasattr(dist, "set_timeout"):
        return

    def set_timeout(timeout, group=None) -> None:
        (group if group is not None else dist.distributed_c10d._get_default_group()).set_timeout(timeout)

    dist.set_timeout = set_timeout


def _after_init_distributed(fn) -> None:
    """Calls fn once TorchTitan's init_distributed has run (a wrapper around
    the name the trainer imported, for the report only)."""
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.trainer as trainer_mod

    original = dist_utils.init_distributed

    def wrapped(*a, **k):
        out = original(*a, **k)
        fn()
        return out

    for mod in (dist_utils, trainer_mod):
        if getattr(mod, "init_distributed", None) is original:
            mod.init_distributed = wrapped


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="processes (FSDP ranks) on this host")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=4, help="sequences a step per rank")
    p.add_argument("--assets", type=Path, default=ROOT / "build" / "torchtitan_assets",
                   help="where the tokenizer and data set are made")
    p.add_argument("rest", nargs="*", help="after --: options for torchtitan.train")
    args = p.parse_args(argv)
    build_assets(args.assets)
    env = {**os.environ, ASSETS_ENV: str(args.assets.resolve()), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc),
           "--local-ranks-filter", "0", "--tee", "3",
           "-m", "torchtitan.train", "--module", "examples.distributed.torchtitan_llama3",
           "--config", "llama3_debugmodel_tpu", "--training.steps", str(args.steps),
           "--training.seq_len", str(args.seq_len), "--training.local_batch_size", str(args.batch),
           *args.rest]
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
