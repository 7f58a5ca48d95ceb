"""The ResNet example trains on the scikit-learn digits for a few steps on
tpu: the loss decreases, strict and DeferAndFuse give the same losses and
the same held-out predictions (and reuse their graphs), the tpu matches CPU
for the same seed, the accuracy is well above chance, and a checkpoint
reloads to the same predictions."""
from __future__ import annotations

import pytest
import torch

from examples.resnet import model as resnet_model
from examples.resnet import train as resnet


def _args(*extra: str):
    return resnet.parse(["--steps", "24", "--batch-size", "16", "--width", "8", "--image-size", "16", "--lr", "0.02",
                         "--eval-batch-size", "120", "--no-progress", *extra])


def test_resnet_trains_in_both_modes_matches_cpu_and_reloads(tmp_path):
    ck = str(tmp_path / "ck.pt")
    rc, (strict, defer) = resnet.run(_args("--compare", "--save", ck))
    assert rc == 0
    assert len(strict["losses"]) == 24
    assert strict["loss_last"] < strict["loss_first"] - 0.7
    # DeferAndFuse: the same numbers, the training loop and the eval pass reuse their graphs
    assert defer["losses"] == pytest.approx(strict["losses"], rel=1e-4, abs=1e-5)
    assert defer["graphs"] >= 1 and defer["cache_hits"] >= 20
    assert strict["graphs"] == 0
    # inference: identical predictions in both modes, accuracy well above chance (10 classes)
    assert torch.equal(defer["predictions"], strict["predictions"])
    assert len(strict["predictions"]) == 359
    assert 0.5 < strict["accuracy"] <= 1.0
    assert defer["accuracy"] == strict["accuracy"]
    assert strict["infer_throughput"] > 0 and defer["infer_throughput"] > 0
    # CPU, same seed: the same batches (host generator), the same losses within float tolerance. Training
    # is chaotic: on the CPU itself, weights perturbed by 1e-6 give losses up to ~10 % apart after 10-20
    # steps, so only the first steps are compared tightly, then the mean of the last 10 losses and the
    # predictions. One CPU thread: two OpenMP threads crawl on a loaded 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc, (cpu,) = resnet.run(_args("--device", "cpu"))
    finally:
        torch.set_num_threads(threads)
    assert rc == 0 and cpu["device"] == "cpu"
    assert cpu["losses"][:6] == pytest.approx(strict["losses"][:6], rel=2e-4)
    assert cpu["loss_last"] == pytest.approx(strict["loss_last"], rel=5e-2)
    agree = (cpu["predictions"] == strict["predictions"]).float().mean().item()
    assert agree > 0.9 and cpu["accuracy"] == pytest.approx(strict["accuracy"], abs=0.05), agree
    # the checkpoint reloads to the same held-out predictions (weights and BatchNorm statistics)...
    rc, (loaded,) = resnet.run(_args("--load", ck, "--steps", "0"))
    assert rc == 0 and torch.equal(loaded["predictions"], strict["predictions"])
    # ...and training continues from it: the first batch's loss starts where training ended
    rc, (resumed,) = resnet.run(_args("--load", ck, "--steps", "2"))
    assert rc == 0 and resumed["loss_first"] < strict["loss_first"] - 0.7


def test_resnet_epochs_and_data_split():
    data = resnet_model.Digits(16)
    assert data.x_train.shape == (1438, 1, 16, 16) and data.x_test.shape == (359, 1, 16, 16)
    counts = torch.bincount(data.y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # stratified: 20 % of each class
    assert abs(data.x_train.mean().item()) < 1e-4 and data.x_train.std().item() == pytest.approx(1.0, rel=1e-4)
    assert resnet_model.Digits(16).y_test.tolist() == data.y_test.tolist()  # fixed split
    # one epoch (1438 // 16 batches) draws each training image at most once; the host generator repeats it
    epoch = [b for _, b in zip(range(89), data.batches(16, torch.Generator().manual_seed(0)))]
    seen = torch.cat([y for _, y in epoch])
    assert len(seen) == 1424
    assert (torch.bincount(seen, minlength=10) <= torch.bincount(data.y_train, minlength=10)).all()
    assert torch.unique(torch.cat([x for x, _ in epoch]).flatten(1), dim=0).shape[0] == 1424  # the digits are distinct
    x0, y0 = next(data.batches(16, torch.Generator().manual_seed(0)))
    assert torch.equal(x0, epoch[0][0]) and torch.equal(y0, epoch[0][1])



def test_resnet_bench_workload():
    model, batches, loss_fn = resnet_model.bench_workload()
    assert len(batches) == 4
    x, y = batches[0]
    assert x.shape == (16, 3, 32, 32) and y.shape == (16,) and model.fc.in_features == 256
    assert next(model.parameters()).device.type == "cpu"
    loss = loss_fn(model(x), y)
    assert loss.dim() == 0 and 1.5 < loss.item() < 4.0
    from bench import models

    bm, bb, _ = models.make("resnet")
    assert bb[0][0].shape == (16, 3, 32, 32) and isinstance(bm, resnet_model.ResNet18)
    assert sum(p.numel() for p in bm.parameters()) == sum(p.numel() for p in model.parameters())
