"""Every example trains with --mode compiled (torch.compile(backend="tpu")
of the model's forward and backward) and gives the losses of strict eager
mode: the compiled graphs run the same kernels in the same order (dropout
included), so the first loss is equal and the last within float noise."""
from __future__ import annotations

import importlib

import pytest

# example -> (its train module, the test module whose _args / _run builds a small run)
EXAMPLES = {
    "mingpt": ("examples.mingpt.train", "tests.test_examples", ()),
    "llama": ("examples.llama.train", "tests.test_example_llama", ()),
    "resnet": ("examples.resnet.train", "tests.test_example_resnet", ("--steps", "6")),
    "dlrm": ("examples.dlrm.train", "tests.test_example_dlrm", ("--steps", "6")),
    "unet": ("examples.unet.train", "tests.test_example_unet", ("--steps", "4", "--sample-count", "0")),
    "qwen": ("examples.qwen.train", "tests.test_example_qwen", ("--steps", "4")),
}


def _run(name: str, mode: str, tmp_path):
    train_mod, test_mod, extra = EXAMPLES[name]
    t = importlib.import_module(test_mod)
    if name == "qwen":
        return t._run(*extra, "--mode", mode, "--model-dir", str(tmp_path / "qwen"))
    train = importlib.import_module(train_mod)
    return train.run(t._args(*extra, "--mode", mode))


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_compiled_matches_strict(name, tmp_path):
    import torch

    torch._dynamo.reset()
    before = torch.tpu.compile_stats()
    rc, (strict,) = _run(name, "strict", tmp_path)
    assert rc == 0
    rc, (comp,) = _run(name, "compiled", tmp_path)
    assert rc == 0 and comp["mode"] == "compiled"
    st = torch.tpu.compile_stats()
    assert st["forward_graphs"] > before["forward_graphs"] and st["backward_graphs"] > before["backward_graphs"]
    assert comp["loss_first"] == pytest.approx(strict["loss_first"], rel=1e-5)
    assert comp["loss_last"] == pytest.approx(strict["loss_last"], rel=1e-3)
