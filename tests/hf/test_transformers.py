"""Hugging Face Transformers on tpu, as a user writes it: from_pretrained of
a local folder with device_map="tpu" / "auto" (one and two chips), dtype,
model.to("tpu"), generate() (greedy, sampling, beam search; dynamic and
static KV caches), pipeline("text-generation", device="tpu"), and Trainer /
TrainingArguments choosing the tpu by themselves. Every result is compared
with the same model on CPU."""
from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import run_python
from tests.hf import common

PROMPT = torch.tensor([[1, 5, 9, 7, 12, 4]])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    common.save_tiny_llama(path)
    return path



def _cpu(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def test_transformers_sees_the_tpu():
    from transformers.utils import is_torch_tpu_available

    assert torch.accelerator.current_accelerator().type == "tpu"
    assert is_torch_tpu_available()


@pytest.mark.parametrize("device_map", ["tpu", "auto", {"": 0}])
def test_from_pretrained_device_map_places_every_weight_on_the_tpu(model_dir, device_map):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=device_map)
    assert {p.device for p in model.parameters()} == {torch.device("tpu", 0)}
    cpu = _cpu(model_dir)
    with torch.no_grad():
        got = model(PROMPT.to("tpu")).logits.cpu()
        want = cpu(PROMPT).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_bfloat16_load_and_model_to_tpu(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    bf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="tpu")
    assert {p.dtype for p in bf.parameters()} == {torch.bfloat16}
    cpu_bf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        got, want = bf(PROMPT.to("tpu")).logits.float().cpu(), cpu_bf(PROMPT).logits.float()
    assert (got - want).abs().max().item() < 0.05 * want.abs().max().item()
    # .to("tpu") of a CPU-loaded model, then save_pretrained from the device and load back
    moved = _cpu(model_dir).to("tpu")
    moved.save_pretrained(tmp_path / "from_tpu")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "from_tpu", device_map="tpu")
    with torch.no_grad():
        torch.testing.assert_close(back(PROMPT.to("tpu")).logits.cpu(), moved(PROMPT.to("tpu")).logits.cpu())


def test_generate_greedy_and_beam_give_cpus_tokens(model_dir, both_modes):
    from transformers import AutoModelForCausalLM

    cpu = _cpu(model_dir)
    dev = AutoModelForCausalLM.from_pretrained(model_dir, device_map="tpu")
    for kw in (dict(do_sample=False), dict(do_sample=False, num_beams=3), dict(do_sample=False, num_beams=2,
                                                                                num_return_sequences=2)):
        want = cpu.generate(PROMPT, max_new_tokens=10, **kw)
        got = dev.generate(PROMPT.to("tpu"), max_new_tokens=10, **kw)
        assert got.device.type == "tpu"
        assert got.cpu().tolist() == want.tolist(), kw


def test_generate_with_the_static_cache_matches_the_dynamic_one(model_dir, both_modes):
    from transformers import AutoModelForCausalLM

    dev = AutoModelForCausalLM.from_pretrained(model_dir, device_map="tpu")
    want = _cpu(model_dir).generate(PROMPT, max_new_tokens=10, do_sample=False)
    dynamic = dev.generate(PROMPT.to("tpu"), max_new_tokens=10, do_sample=False)
    static = dev.generate(PROMPT.to("tpu"), max_new_tokens=10, do_sample=False, cache_implementation="static",
                          disable_compile=True)
    assert dynamic.cpu().tolist() == want.tolist() == static.cpu().tolist()


def test_sampling_is_seeded_on_the_device(model_dir, both_modes):
    from transformers import AutoModelForCausalLM

    dev = AutoModelForCausalLM.from_pretrained(model_dir, device_map="tpu")
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(dev.generate(PROMPT.to("tpu"), max_new_tokens=12, min_new_tokens=12, do_sample=True, top_k=20, top_p=0.9,
                                 temperature=1.3).cpu())
    assert runs[0].tolist() == runs[1].tolist()
    new = runs[0][0, PROMPT.shape[1]:]
    assert new.shape == (12,) and ((new >= 0) & (new < 64)).all()
    torch.manual_seed(8)
    other = dev.generate(PROMPT.to("tpu"), max_new_tokens=12, min_new_tokens=12, do_sample=True, top_k=20, temperature=1.3).cpu()
    assert other.tolist() != runs[0].tolist()


def test_text_generation_pipeline_on_tpu(model_dir):
    from transformers import pipeline

    pipe = pipeline("text-generation", model=str(model_dir), device="tpu")
    assert pipe.device.type == "tpu" and pipe.model.device.type == "tpu"
    out = pipe("the cat sat on", max_new_tokens=8, do_sample=False)
    cpu = pipeline("text-generation", model=str(model_dir), device="cpu")
    assert out[0]["generated_text"] == cpu("the cat sat on", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert out[0]["generated_text"].startswith("the cat sat on")


class _Lines(torch.utils.data.Dataset):
    def __init__(self, n: int = 32, t: int = 16):
        g = torch.Generator().manual_seed(3)
        # a learnable pattern: each row counts up from a random start
        start = torch.randint(4, 40, (n, 1), generator=g)
        self.ids = (start + torch.arange(t)).clamp(max=63)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train(out_dir, use_cpu: bool):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out_dir), per_device_train_batch_size=8, max_steps=8, learning_rate=3e-3,
                             logging_steps=1, report_to=[], save_strategy="no", use_cpu=use_cpu, seed=0,
                             dataloader_pin_memory=False, disable_tqdm=True)
    trainer = Trainer(model=common.tiny_llama(), args=args, train_dataset=_Lines())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return args, trainer, losses


def test_trainer_picks_the_tpu_and_learns_what_cpu_learns(tmp_path):
    args, trainer, losses = _train(tmp_path / "tpu", use_cpu=False)
    assert args.device.type == "tpu"
    assert next(trainer.model.parameters()).device.type == "tpu"
    # the CPU run in its own process: Accelerate keeps the device of a process's first Trainer
    r = run_python(f"import json; from tests.hf.test_transformers import _train; "
                   f"print(json.dumps(_train({str(tmp_path / 'cpu')!r}, use_cpu=True)[2]))",
                   env={"TRANSFORMERS_VERBOSITY": "error"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cpu_losses = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(losses) == len(cpu_losses) == 8
    assert losses[-1] < losses[0] - 0.3
    for a, b in zip(losses, cpu_losses):
        assert a == pytest.approx(b, rel=2e-3)


def test_device_map_auto_spreads_over_two_chips(model_dir):
    code = f"""
import json, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(model_dir)!r}, device_map="auto",
                                         max_memory={{0: "60KB", 1: "10MB"}})
devs = sorted({{str(p.device) for p in m.parameters()}})
ids = torch.tensor({PROMPT.tolist()})
out = m.generate(ids.to("tpu:0"), max_new_tokens=6, do_sample=False)
print(json.dumps({{"devices": devs, "map": sorted(set(map(str, m.hf_device_map.values()))),
                  "tokens": out.cpu().tolist()}}))
"""
    r = run_python(code, env={"TPU_NUM_DEVICES": "2", "TRANSFORMERS_VERBOSITY": "error"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["devices"] == ["tpu:0", "tpu:1"]
    want = _cpu(model_dir).generate(PROMPT, max_new_tokens=6, do_sample=False)
    assert got["tokens"] == want.tolist()


def test_accelerate_sizes_the_chips_and_defaults_to_the_tpu():
    """What device_map="auto" / "balanced" and Trainer ask Accelerate
    (torch_tpu/_accelerate.py): the chips' free memory and the default device."""
    from accelerate import PartialState
    from accelerate.utils import get_max_memory

    mm = get_max_memory()
    assert sorted(k for k in mm if isinstance(k, int)) == list(range(torch.tpu.device_count()))
    assert 0 < mm[0] <= torch.tpu.get_device_properties(0).total_memory and mm["cpu"] > 0
    assert get_max_memory({0: "1MB"}) == {0: 10**6}  # an explicit budget is Accelerate's own business
    assert PartialState().default_device == torch.device("tpu")


def test_static_cache_generate_compiles_with_the_tpu_backend(model_dir):
    """generate() with a static cache compiles the forward by itself on tpu
    (Transformers' default CompileConfig: backend "tpu") and gives the CPU's tokens."""
    from transformers import AutoModelForCausalLM

    dev = AutoModelForCausalLM.from_pretrained(model_dir, device_map="tpu")
    before = torch.tpu.compile_stats()["calls"]
    got = dev.generate(PROMPT.to("tpu"), max_new_tokens=10, do_sample=False, cache_implementation="static")
    assert got.cpu().tolist() == _cpu(model_dir).generate(PROMPT, max_new_tokens=10, do_sample=False).tolist()
    assert torch.tpu.compile_stats()["calls"] > before
