"""Hugging Face Diffusers on tpu from tiny configs: UNet2DModel,
UNet2DConditionModel, AutoencoderKL and a DiT (DiTTransformer2DModel)
forward + backward against CPU; DDPMPipeline and DDIMPipeline end to end in
the strict, DeferAndFuse and compiled modes (the same images as on CPU: the noise is
drawn by a CPU generator, as Diffusers does for a CPU generator); a UNet
training step; a pipeline split across two chips."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from tests.conftest import run_python




def unet2d():
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, attention_head_dim=4)


def unet2d_condition():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                                norm_num_groups=4, attention_head_dim=4)


def vae():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
                         norm_num_groups=4, sample_size=16)


def dit():
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                  num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10)
    for m in model.modules():  # classifier-free guidance's label dropout draws from each device's own RNG
        if hasattr(m, "dropout_prob"):
            m.dropout_prob = 0.0
    return model


def _forward(name, model, device):
    g = torch.Generator().manual_seed(1)
    if name == "unet2d":
        x, t = torch.randn(2, 3, 16, 16, generator=g), torch.tensor([3, 7])
        return model(x.to(device), t.to(device)).sample
    if name == "unet2d_condition":
        x, t, ctx = torch.randn(2, 4, 8, 8, generator=g), torch.tensor([3, 7]), torch.randn(2, 5, 16, generator=g)
        return model(x.to(device), t.to(device), encoder_hidden_states=ctx.to(device)).sample
    if name == "vae":
        x = torch.randn(2, 3, 16, 16, generator=g)
        post = model.encode(x.to(device)).latent_dist
        return model.decode(post.mean).sample
    x, t, y = torch.randn(2, 4, 8, 8, generator=g), torch.tensor([3, 7]), torch.tensor([1, 4])
    return model(x.to(device), timestep=t.to(device), class_labels=y.to(device)).sample


@pytest.mark.parametrize("name", ["unet2d", "unet2d_condition", "vae", "dit"])
def test_models_forward_and_backward_match_cpu(name, both_modes, one_cpu_thread):
    cpu = {"unet2d": unet2d, "unet2d_condition": unet2d_condition, "vae": vae, "dit": dit}[name]()
    dev = copy.deepcopy(cpu).to("tpu")
    out, out_t = _forward(name, cpu, "cpu"), _forward(name, dev, "tpu")
    assert out_t.device.type == "tpu"
    torch.testing.assert_close(out_t.cpu(), out, rtol=1e-4, atol=1e-4)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * w).sum().backward()
    (out_t * w.to("tpu")).sum().backward()
    scale = max(p.grad.abs().max().item() for p in cpu.parameters() if p.grad is not None)
    for (n, p), pt in zip(cpu.named_parameters(), dev.parameters()):
        if p.grad is None:
            assert pt.grad is None, n
            continue
        err = (pt.grad.cpu() - p.grad).abs().max().item()
        assert err <= 2e-3 * max(p.grad.abs().max().item(), 1e-3 * scale), (n, err)


PIPELINES = [("DDPMPipeline", "DDPMScheduler"), ("DDIMPipeline", "DDIMScheduler")]


def _pipelines_match_cpu(pipe_cls, sched_cls, compiled):
    import diffusers

    unet = unet2d()
    sched = getattr(diffusers, sched_cls)(num_train_timesteps=50)
    cpu_pipe = getattr(diffusers, pipe_cls)(unet=unet, scheduler=sched)
    dev_pipe = getattr(diffusers, pipe_cls)(unet=copy.deepcopy(unet), scheduler=copy.deepcopy(sched)).to("tpu")
    assert dev_pipe.device.type == "tpu"
    if compiled:  # torch.compile(backend="tpu"): one graph for every denoising step
        dev_pipe.unet = torch.compile(dev_pipe.unet, backend="tpu")
        before = torch.tpu.compile_stats()["calls"]
    kw = dict(batch_size=2, num_inference_steps=6, output_type="np")
    want = cpu_pipe(generator=torch.Generator().manual_seed(0), **kw).images
    got = dev_pipe(generator=torch.Generator().manual_seed(0), **kw).images
    assert got.shape == want.shape == (2, 16, 16, 3)
    assert np.isfinite(got).all() and 0.0 <= got.min() and got.max() <= 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)
    if compiled:
        assert torch.tpu.compile_stats()["calls"] >= before + 6


@pytest.mark.parametrize("pipe_cls,sched_cls", PIPELINES)
def test_pipelines_end_to_end_give_cpus_images(pipe_cls, sched_cls, both_modes, one_cpu_thread):
    _pipelines_match_cpu(pipe_cls, sched_cls, compiled=False)


@pytest.mark.parametrize("pipe_cls,sched_cls", PIPELINES)
def test_compiled_pipelines_give_cpus_images(pipe_cls, sched_cls, one_cpu_thread):
    _pipelines_match_cpu(pipe_cls, sched_cls, compiled=True)


def test_unet_training_step_lowers_the_loss_like_cpu(both_modes, one_cpu_thread):
    from diffusers import DDPMScheduler

    sched = DDPMScheduler(num_train_timesteps=100)
    g = torch.Generator().manual_seed(3)
    clean = torch.rand(4, 3, 16, 16, generator=g) * 2 - 1
    losses = {}
    for device in ("cpu", "tpu"):
        model = unet2d().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        gen = torch.Generator().manual_seed(4)
        hist = []
        for _ in range(5):
            noise = torch.randn(clean.shape, generator=gen)
            t = torch.randint(0, 100, (4,), generator=gen)
            noisy = sched.add_noise(clean, noise, t)
            pred = model(noisy.to(device), t.to(device)).sample
            loss = torch.nn.functional.mse_loss(pred, noise.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            hist.append(loss.item())
        losses[device] = hist
    assert losses["tpu"][-1] < losses["tpu"][0]
    for a, b in zip(losses["tpu"], losses["cpu"]):
        assert a == pytest.approx(b, rel=1e-3)


def test_pipeline_split_across_two_chips_with_device_map_balanced(tmp_path):
    """Diffusers' own multi-accelerator placement: a latent pipeline (VQ
    autoencoder + UNet, saved to a folder) loaded with device_map="balanced"
    on TPU_NUM_DEVICES=2 puts its models on both chips and gives the CPU's
    images (Accelerate sizes the chips: torch_tpu/_accelerate.py)."""
    code = f"""
import json, torch
from diffusers import DDIMScheduler, DiffusionPipeline, LDMPipeline, UNet2DModel, VQModel
torch.set_num_threads(1)
torch.manual_seed(0)
vq = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
             up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
             norm_num_groups=4, num_vq_embeddings=32, sample_size=16)
unet = UNet2DModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
                   down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                   norm_num_groups=4, attention_head_dim=4)
LDMPipeline(vqvae=vq, unet=unet, scheduler=DDIMScheduler(num_train_timesteps=50)).save_pretrained({str(tmp_path)!r})
kw = dict(batch_size=2, num_inference_steps=4, output_type="np")
cpu = DiffusionPipeline.from_pretrained({str(tmp_path)!r})(generator=torch.Generator().manual_seed(0), **kw).images
pipe = DiffusionPipeline.from_pretrained({str(tmp_path)!r}, device_map="balanced")
img = pipe(generator=torch.Generator().manual_seed(0), **kw).images
print(json.dumps({{"map": sorted(str(v) for v in pipe.hf_device_map.values()),
                  "devices": sorted({{str(p.device) for m in (pipe.unet, pipe.vqvae) for p in m.parameters()}}),
                  "err": float(abs(img - cpu).max()), "shape": list(img.shape)}}))
"""
    r = run_python(code, env={"TPU_NUM_DEVICES": "2"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["map"] == ["0", "1"] and got["devices"] == ["tpu:0", "tpu:1"]
    assert got["shape"] == [2, 16, 16, 3] and got["err"] < 1e-4
