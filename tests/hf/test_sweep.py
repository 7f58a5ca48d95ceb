"""The architecture sweep's CI sample (tests/hf/archs.py SAMPLE: a dense and a
MoE decoder, a sliding-window decoder, GPT-2, BERT, T5, ViT, ResNet, CLIP);
TORCH_TPU_TEST_FULL=1 (make test-full) runs every architecture. Each one's
forward + backward on tpu must match CPU in the strict and DeferAndFuse
modes and compiled (torch.compile(backend="tpu") of the forward); the whole
table is python -m tests.hf (tests/hf/SWEEP.md)."""
from __future__ import annotations

import os

import pytest
import torch

from tests.hf import archs as A
from tests.hf import sweep

NAMES = [a.name for a in A.ARCHS] if os.environ.get("TORCH_TPU_TEST_FULL") == "1" else A.SAMPLE



def test_the_sweep_covers_sixty_architectures_of_every_group():
    assert len(A.ARCHS) >= 60 and len({a.name for a in A.ARCHS}) == len(A.ARCHS)
    assert {a.group for a in A.ARCHS} == {"decoder", "encoder", "encoder-decoder", "vision", "multimodal"}
    assert set(A.SAMPLE) <= {a.name for a in A.ARCHS}


EAGER = tuple(m for m in sweep.MODES if m != "compiled")
# Known compiled-mode failures (tests/hf/SWEEP.md): strict xfails, so that a fix shows up
COMPILED_GAPS: dict[str, str] = {}


@pytest.mark.parametrize("name", NAMES)
def test_architecture_matches_cpu(name, one_cpu_thread):
    results = sweep.run_arch(A.by_name([name])[0], EAGER)
    assert [r.mode for r in results] == list(EAGER)
    for r in results:
        assert r.status == "pass", f"{name} [{r.mode}]: {r.status}: {r.detail}"
        assert r.worst <= sweep.RTOL


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=COMPILED_GAPS[n], strict=True))
                                  if n in COMPILED_GAPS else n for n in NAMES])
def test_compiled_architecture_matches_cpu(name, one_cpu_thread):
    (r,) = sweep.run_arch(A.by_name([name])[0], ("compiled",))
    assert r.status == "pass", f"{name} [compiled]: {r.status}: {r.detail}"
    assert r.worst <= sweep.RTOL


def test_a_wrong_gradient_is_reported_as_a_mismatch():
    """The comparison can fail: a perturbed gradient is out of tolerance."""
    ref = {"loss": torch.tensor(1.0), "grad:w": torch.ones(4), "grad:b": torch.full((2,), 0.5)}
    got = {k: v.clone() for k, v in ref.items()}
    assert sweep.compare(ref, got) == (0.0, "")
    got["grad:b"][1] += 0.01
    worst, name = sweep.compare(ref, got)
    assert name == "grad:b" and worst > sweep.RTOL
    assert sweep.compare(ref, {"loss": ref["loss"]})[0] == float("inf")
