"""The Llama example: it trains on tpu (the loss decreases), strict and
DeferAndFuse give the same numbers and defer reuses its graphs, the tpu
matches CPU for the same seed, checkpoints load; generation with the KV cache
gives exactly the tokens of a full recompute per step; RoPE depends only on
relative positions; the sizing helpers count parameters exactly."""
from __future__ import annotations

import math

import pytest
import torch

import torch_tpu
from examples.llama import model as lm
from examples.llama import train as llama


def _args(*extra: str):
    return llama.parse(["--steps", "12", "--batch-size", "8", "--block", "32", "--layers", "2", "--width", "64",
                        "--heads", "4", "--kv-heads", "2", "--sample-chars", "40", "--no-progress", *extra])


def test_llama_trains_in_both_modes_and_matches_cpu(tmp_path):
    rc, (strict, defer) = llama.run(_args("--compare", "--save", str(tmp_path / "ck.pt")))
    assert rc == 0
    assert strict["loss_first"] == pytest.approx(math.log(strict_vocab()), rel=0.05)  # small init: uniform guess
    assert strict["loss_last"] < strict["loss_first"] - 0.8
    assert defer["loss_first"] == pytest.approx(strict["loss_first"], rel=1e-5)
    assert defer["loss_last"] == pytest.approx(strict["loss_last"], rel=1e-4)
    assert defer["val"] == pytest.approx(strict["val"], rel=1e-4)
    assert 0 < strict["val"] < strict["loss_first"] and strict["bpc"] == pytest.approx(strict["val"] / math.log(2))
    assert defer["sample"] == strict["sample"] and len(strict["sample"]) == len("The ") + 40
    assert strict["sample"].startswith("The ") and strict["gen_tokens_per_s"] > 0
    assert defer["graphs"] >= 1 and defer["cache_hits"] >= 8 + 30  # training steps and decode steps reuse graphs
    assert strict["params"] == lm.param_count({"width": 64, "layers": 2, "heads": 4, "kv_heads": 2}, strict_vocab())
    rc, (cpu,) = llama.run(_args("--device", "cpu"))
    assert rc == 0
    assert cpu["loss_first"] == pytest.approx(strict["loss_first"], rel=1e-4)
    assert cpu["loss_last"] == pytest.approx(strict["loss_last"], rel=2e-3)
    assert cpu["val"] == pytest.approx(strict["val"], rel=2e-3)
    # the checkpoint loads and training continues from it
    rc, (resumed,) = llama.run(_args("--load", str(tmp_path / "ck.pt"), "--steps", "3", "--sample-chars", "5"))
    assert rc == 0 and resumed["loss_first"] < strict["loss_first"] - 0.8


def strict_vocab() -> int:
    from examples import common

    return len(set(common.pydoc_text()))


def _tiny(seed: int = 0, tie: bool = False) -> lm.Llama:
    torch.manual_seed(seed)
    m = lm.Llama(vocab=40, d=64, layers=2, heads=4, kv_heads=2, block=16, tie=tie)
    with torch.no_grad():  # larger weights than the training init: logits far apart, no ties in argmax
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return m.to("tpu").eval()


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_kv_cache_generation_equals_full_recompute_on_tpu(mode):
    m = _tiny()
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1)).to("tpu")
    inputs: list[tuple[int, ...]] = []
    hook = m.tok.register_forward_hook(lambda mod, args, out: inputs.append(tuple(args[0].shape)))
    n = 30  # 5 + 30 > block 16: the window shifts twice (prefills of 8 tokens)
    with torch_tpu.execution_mode(mode):
        greedy = m.generate(prompt, n, temperature=0)
        fed = list(inputs)
        inputs.clear()
        greedy_ref = m.generate(prompt, n, temperature=0, use_cache=False)
        ref_fed = list(inputs)
        streamed: list[list[int]] = []
        sampled = m.generate(prompt, n, temperature=1.5, top_k=None, generator=torch.Generator("tpu").manual_seed(7),
                             on_token=lambda t: streamed.append(t.tolist()))
        sampled_ref = m.generate(prompt, n, temperature=1.5, top_k=None, use_cache=False,
                                 generator=torch.Generator("tpu").manual_seed(7))
    hook.remove()
    assert greedy.shape == (2, 5 + n) and torch.equal(greedy[:, :5].cpu(), prompt.cpu())
    assert torch.equal(greedy.cpu(), greedy_ref.cpu())
    assert torch.equal(sampled.cpu(), sampled_ref.cpu())
    assert not torch.equal(sampled.cpu(), greedy.cpu())
    assert torch.tensor(streamed).T.tolist() == sampled[:, 5:].tolist()
    # with the cache: prompt prefill, then one token per step, except the two window shifts (8 tokens again)
    assert fed[0] == (2, 5) and fed.count((2, 8)) == 2 and fed.count((2, 1)) == n - 1 - 2 and len(fed) == n
    # without: the whole window every step
    assert [s[1] for s in ref_fed] == list(range(5, 17)) + list(range(8, 17)) * 2


def test_decode_step_logits_equal_full_forward_at_absolute_positions():
    m = _tiny(seed=3, tie=True)
    idx = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(2)).to("tpu")
    with torch.no_grad():
        full = m(idx).cpu()
        cache = m.new_cache(2)
        got = [m.prefill(idx[:, :7], cache).cpu()]
        for p in range(7, 12):
            got.append(m.decode(idx[:, p:p + 1], torch.tensor([p], device="tpu"), cache).cpu())
    assert torch.allclose(torch.stack(got, 1), full[:, 6:], atol=1e-4, rtol=1e-4)
    assert (full[:, 6:].std() > 0.5).item()


def test_rope_depends_only_on_relative_position():
    cos, sin = lm.rope_tables(16, 64)
    cos, sin = cos.to("tpu"), sin.to("tpu")
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, 1, 16, generator=g).to("tpu") for _ in range(2))

    def score(m: int, n: int) -> float:
        return (lm.rope(q, cos[m:m + 1], sin[m:m + 1]) * lm.rope(k, cos[n:n + 1], sin[n:n + 1])).sum().item()

    assert score(3, 1) == pytest.approx(score(40, 38), abs=1e-4)
    assert score(3, 1) == pytest.approx(score(2, 0), abs=1e-4)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    assert lm.rope(q, cos[:1], sin[:1]).cpu().allclose(q.cpu())  # position 0: no rotation


def test_param_count_and_config_for_params():
    for cfg in ({"width": 64, "layers": 2, "heads": 4, "kv_heads": 2, "hidden": 160},
                {"width": 96, "layers": 3, "heads": 6, "kv_heads": 3, "tie": True}):
        m = lm.Llama(vocab=50, d=cfg["width"], layers=cfg["layers"], heads=cfg["heads"], kv_heads=cfg["kv_heads"],
                     hidden=cfg.get("hidden"), tie=cfg.get("tie", False))
        assert lm.param_count(cfg, 50) == sum(p.numel() for p in m.parameters())
    sizes = []
    for target in (1e6, 3e6, 1e7, 3e7, 1e8):
        cfg = lm.llama_config_for_params(int(target))
        n = lm.param_count(cfg)
        assert 0.8 * target < n < 1.25 * target, (target, cfg, n)
        assert cfg["width"] % cfg["heads"] == 0 and cfg["heads"] % cfg["kv_heads"] == 0
        assert cfg["kv_heads"] < cfg["heads"] and cfg["hidden"] % 32 == 0
        sizes.append((cfg["width"], cfg["layers"]))
    assert sizes[-1][0] > sizes[0][0] and sizes[-1][1] > sizes[0][1]  # wider and deeper as it grows


def test_bench_workload_and_bench_models():
    model, batches, loss_fn = lm.bench_workload()
    blk = model.blocks[0]
    assert (len(model.blocks), model.tok.weight.shape[1], blk.heads, blk.kv_heads, model.block) == (4, 128, 4, 2, 64)
    assert len(batches) == 4 and batches[0][0].shape == (16, 64) and batches[0][1].shape == (16, 64)
    assert lm.bench_workload(batch=2)[1][0][0].shape == (2, 64)
    from bench import models

    bm, bb, bl = models.make("llama")
    assert isinstance(bm, models.Llama) and models.Llama is lm.Llama
    assert [p.shape for p in bm.parameters()] == [p.shape for p in model.parameters()]
    with torch.no_grad():
        x, y = bb[0]
        loss = bl(bm(x[:2]), y[:2]).item()
    assert loss == pytest.approx(math.log(96), rel=0.05)


def test_llama_refuses_kv_heads_that_do_not_divide_heads(capsys):
    rc, _ = llama.run(_args("--heads", "4", "--kv-heads", "3"))
    assert rc == 2 and "--kv-heads" in capsys.readouterr().err
