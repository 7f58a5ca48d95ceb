"""The UNet/DDPM example trains for a few steps on tpu: the loss decreases,
strict and DeferAndFuse give the same numbers (and the same device-sampled
images), the tpu matches CPU for the same seed (the training noise comes from
a host generator), the sample grid is a valid PNG of the expected size with
non-constant pixels, and a checkpoint resumes training."""
from __future__ import annotations

import zlib

import pytest
import torch

from examples import common
from examples.unet import model as unet_model
from examples.unet import train as unet


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    """The CPU reference runs (and the host-side data preparation) use one
    thread: on this shared 2-core machine two OpenMP threads competing with
    other processes make the small CPU convolutions 10-30x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _args(*extra: str):
    return unet.parse(["--steps", "10", "--batch-size", "8", "--base", "8", "--mults", "1,2", "--lr", "3e-3",
                       "--sample-count", "6", "--sample-steps", "5", "--no-progress", *extra])


def _png_pixels(path: str) -> bytes:
    """The 8-bit grayscale pixels of a PNG written with filter type 0 rows."""
    data = open(path, "rb").read()
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = int.from_bytes(data[pos:pos + 4], "big"), data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    w, h = common.read_png_size(path)
    raw = zlib.decompress(idat)
    assert len(raw) == h * (w + 1)
    rows = [raw[r * (w + 1):(r + 1) * (w + 1)] for r in range(h)]
    assert all(r[0] == 0 for r in rows)
    return b"".join(r[1:] for r in rows)


def test_unet_trains_in_both_modes_matches_cpu_and_writes_png(tmp_path):
    png = str(tmp_path / "s.png")
    rc, (strict, defer) = unet.run(_args("--compare", "--samples-png", png, "--save", str(tmp_path / "ck.pt")))
    assert rc == 0
    assert strict["loss_first"] > 0.8  # the prediction of a fresh model is far from the noise
    assert strict["loss_last"] < strict["loss_first"] - 0.3
    assert 0 < strict["val"] < strict["loss_first"]
    assert defer["loss_first"] == pytest.approx(strict["loss_first"], rel=1e-5)
    assert defer["loss_last"] == pytest.approx(strict["loss_last"], rel=1e-4)
    assert defer["val"] == pytest.approx(strict["val"], rel=1e-4)
    assert defer["graphs"] >= 1 and defer["cache_hits"] >= 5  # the training loop reuses its graphs
    # sampling ran on the device with a seeded device generator: same images in both modes
    assert strict["samples"].shape == (6, 1, 16, 16)
    torch.testing.assert_close(defer["samples"], strict["samples"], rtol=1e-4, atol=1e-4)
    assert strict["sample_s"] > 0
    # 6 samples: 3 columns x 2 rows of 16x16 tiles magnified 2x, 2 pixels around every tile
    for mode in ("strict", "defer"):
        path = str(tmp_path / f"s.{mode}.png")
        assert common.read_png_size(path) == (3 * 32 + 4 * 2, 2 * 32 + 3 * 2)
        px = _png_pixels(path)
        tile = [px[(2 + y) * 104 + 2 + x] for y in range(32) for x in range(32)]  # the first tile
        assert len(set(tile)) > 10
    rc, (cpu,) = unet.run(_args("--device", "cpu", "--samples-png", str(tmp_path / "cpu.png")))
    assert rc == 0
    assert cpu["loss_first"] == pytest.approx(strict["loss_first"], rel=1e-4)
    assert cpu["loss_last"] == pytest.approx(strict["loss_last"], rel=2e-3)
    assert cpu["val"] == pytest.approx(strict["val"], rel=2e-3)
    # the checkpoint loads and training continues from it
    rc, (resumed,) = unet.run(_args("--load", str(tmp_path / "ck.pt"), "--sample-count", "0"))
    assert rc == 0 and resumed["loss_first"] < strict["loss_first"] - 0.3
    assert "samples" not in resumed


def test_unet_other_variants_match_cpu(tmp_path):
    """avg-pool down, ConvTranspose2d up, no attention, linear schedule,
    32x32 images, deterministic DDIM sampling."""
    extra = ["--steps", "3", "--batch-size", "4", "--size", "32", "--down", "avgpool", "--up", "convT", "--no-attention",
             "--schedule", "linear", "--timesteps", "1000", "--eta", "0", "--sample-count", "2"]
    rc, (tpu,) = unet.run(_args(*extra, "--samples-png", str(tmp_path / "a.png")))
    assert rc == 0
    rc, (cpu,) = unet.run(_args(*extra, "--device", "cpu", "--samples-png", str(tmp_path / "b.png")))
    assert rc == 0
    assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-3)
    assert tpu["samples"].shape == (2, 1, 32, 32)
    assert common.read_png_size(str(tmp_path / "a.png")) == (2 * 64 + 3 * 2, 64 + 2 * 2)


def test_unet_bench_workload():
    model, batches, loss_fn = unet_model.bench_workload()
    assert len(batches) == 4
    (x, t), noise = batches[0]
    assert x.shape == noise.shape == (16, 1, 16, 16) and t.shape == (16,) and t.dtype == torch.long
    assert model.conv_in.out_channels == 32
    with torch.no_grad():
        loss = loss_fn(model(x, t), noise)
    assert loss.dim() == 0 and 0.5 < loss.item() < 2.0
