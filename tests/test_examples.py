"""The examples train for a few steps on tpu: the loss decreases, strict and
DeferAndFuse give the same numbers, and the tpu matches CPU for the same seed
(dropout off, since the two devices draw different random numbers)."""
from __future__ import annotations

import pytest

from examples.mingpt import train as mingpt


def _args(*extra: str):
    return mingpt.parse(["--steps", "12", "--batch-size", "8", "--block", "32", "--layers", "2", "--width", "64",
                         "--sample-chars", "20", "--no-progress", *extra])


def test_mingpt_trains_in_both_modes_and_matches_cpu(tmp_path):
    rc, (strict, defer) = mingpt.run(_args("--compare", "--dropout", "0", "--save", str(tmp_path / "ck.pt")))
    assert rc == 0
    assert strict["loss_last"] < strict["loss_first"] - 0.5
    assert defer["loss_first"] == pytest.approx(strict["loss_first"], rel=1e-5)
    assert defer["loss_last"] == pytest.approx(strict["loss_last"], rel=1e-4)
    assert defer["sample"] == strict["sample"] and len(strict["sample"]) == 24
    assert defer["graphs"] >= 1 and defer["cache_hits"] >= 8  # the training loop reuses its graphs
    rc, (cpu,) = mingpt.run(_args("--device", "cpu", "--dropout", "0"))
    assert rc == 0
    assert cpu["loss_first"] == pytest.approx(strict["loss_first"], rel=1e-4)
    assert cpu["loss_last"] == pytest.approx(strict["loss_last"], rel=2e-3)
    # the checkpoint loads and training continues from it
    rc, (resumed,) = mingpt.run(_args("--load", str(tmp_path / "ck.pt"), "--dropout", "0"))
    assert rc == 0 and resumed["loss_first"] < strict["loss_first"] - 0.5
