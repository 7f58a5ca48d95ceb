"""A small UNet noise predictor and the DDPM around it, plain PyTorch (any
device).

UNet: 3x3 conv blocks with GroupNorm + SiLU and a residual path, a sinusoidal
timestep embedding (through a small MLP) added in every block, down-sampling
by a stride-2 conv or 2x2 average pooling, up-sampling by nearest upsample +
conv or a ConvTranspose2d, skip connections by concatenation, and one
self-attention block at the lowest resolution.

DDPM: linear or cosine beta schedule over T steps; training predicts the
added noise epsilon (MSE); sampling runs the reverse process on a strided
subset of the T steps with the DDIM update (eta=1: the respaced ancestral
DDPM sampler, eta=0: deterministic DDIM).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _groups(ch: int) -> int:
    return math.gcd(8, ch)


class TimeEmbedding(nn.Module):
    """Sinusoidal embedding of the integer timestep, then Linear-SiLU-Linear."""

    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        half = dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs, persistent=False)
        self.mlp = nn.Sequential(nn.Linear(dim, out), nn.SiLU(), nn.Linear(out, out))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        a = t.float()[:, None] * self.freqs[None, :]
        return self.mlp(torch.cat([torch.sin(a), torch.cos(a)], dim=1))


class ResBlock(nn.Module):
    """GN-SiLU-conv, + timestep embedding, GN-SiLU-conv, residual (1x1 conv
    when the channel count changes)."""

    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.n1 = nn.GroupNorm(_groups(cin), cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2 = nn.GroupNorm(_groups(cout), cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(F.silu(temb))[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return h + self.skip(x)


class SelfAttention(nn.Module):
    """Single-head self-attention over the pixels of a feature map."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(_groups(ch), ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.proj = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)  # [B, C, HW] each
        att = torch.softmax(q.transpose(1, 2) @ k * (c ** -0.5), dim=-1)  # [B, HW, HW]
        y = (v @ att.transpose(1, 2)).reshape(b, c, h, w)
        return x + self.proj(y)


class Down(nn.Module):
    def __init__(self, ch: int, kind: str) -> None:
        super().__init__()
        self.op = nn.Conv2d(ch, ch, 3, stride=2, padding=1) if kind == "conv" else nn.AvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class Up(nn.Module):
    def __init__(self, ch: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "nearest":
            self.op = nn.Conv2d(ch, ch, 3, padding=1)
        else:
            self.op = nn.ConvTranspose2d(ch, ch, 4, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "nearest":
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.op(x)


class UNet(nn.Module):
    """eps_theta(x_t, t): [B, C, H, W] noisy images and [B] integer timesteps
    -> [B, C, H, W] predicted noise. H and W must be divisible by
    2 ** (len(mults) - 1)."""

    def __init__(self, channels: int = 1, base: int = 32, mults: tuple[int, ...] = (1, 2, 2), attention: bool = True,
                 down: str = "conv", up: str = "nearest") -> None:
        super().__init__()
        if down not in ("conv", "avgpool") or up not in ("nearest", "convT"):
            raise ValueError(f"down must be conv|avgpool and up nearest|convT, got {down!r}, {up!r}")
        tdim = 4 * base
        self.temb = TimeEmbedding(base, tdim)
        self.conv_in = nn.Conv2d(channels, base, 3, padding=1)
        self.down_blocks, self.downs = nn.ModuleList(), nn.ModuleList()
        ch = base
        for i, m in enumerate(mults):
            self.down_blocks.append(ResBlock(ch, base * m, tdim))
            ch = base * m
            if i < len(mults) - 1:
                self.downs.append(Down(ch, down))
        self.mid1 = ResBlock(ch, ch, tdim)
        self.attn = SelfAttention(ch) if attention else nn.Identity()
        self.mid2 = ResBlock(ch, ch, tdim)
        self.up_blocks, self.ups = nn.ModuleList(), nn.ModuleList()
        for i in reversed(range(len(mults))):
            self.up_blocks.append(ResBlock(ch + base * mults[i], base * mults[i], tdim))
            ch = base * mults[i]
            if i > 0:
                self.ups.append(Up(ch, up))
        self.norm_out = nn.GroupNorm(_groups(ch), ch)
        self.conv_out = nn.Conv2d(ch, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.temb(t)
        h = self.conv_in(x)
        skips = []
        for i, blk in enumerate(self.down_blocks):
            h = blk(h, temb)
            skips.append(h)
            if i < len(self.downs):
                h = self.downs[i](h)
        h = self.mid2(self.attn(self.mid1(h, temb)), temb)
        for i, blk in enumerate(self.up_blocks):
            h = blk(torch.cat([h, skips.pop()], dim=1), temb)
            if i < len(self.ups):
                h = self.ups[i](h)
        return self.conv_out(F.silu(self.norm_out(h)))


# ------------------------------------------------------------------ DDPM


def beta_schedule(kind: str, T: int) -> torch.Tensor:
    """betas [T] (float64): "linear" 1e-4..0.02 scaled to T (Ho et al.), or
    "cosine" (Nichol & Dhariwal), clipped at 0.999."""
    if kind == "linear":
        scale = 1000.0 / T
        return torch.linspace(scale * 1e-4, scale * 0.02, T, dtype=torch.float64)
    if kind == "cosine":
        s = 0.008
        x = torch.arange(T + 1, dtype=torch.float64) / T
        ab = torch.cos((x + s) / (1 + s) * math.pi / 2) ** 2
        return (1 - ab[1:] / ab[:-1]).clamp(max=0.999)
    raise ValueError(f"unknown schedule {kind!r}")


class Diffusion:
    """The forward process q(x_t | x_0) and a strided reverse sampler for a
    beta schedule; alpha-bar lives on the host (float64) and, in float32, on
    `device`."""

    def __init__(self, schedule: str = "cosine", T: int = 500, device: torch.device | str = "cpu") -> None:
        self.T = T
        self.alpha_bar = torch.cumprod(1 - beta_schedule(schedule, T), dim=0)
        self.ab = self.alpha_bar.float().to(device)

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(ab_t) x_0 + sqrt(1 - ab_t) eps (t, x0, noise on the model's device)."""
        ab = self.ab[t][:, None, None, None]
        return ab.sqrt() * x0 + (1 - ab).sqrt() * noise

    def loss(self, model: nn.Module, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor,
             autocast=None) -> torch.Tensor:
        """MSE between the noise and the model's prediction of it."""
        xt = self.q_sample(x0, t, noise)
        if autocast is None:
            pred = model(xt, t)
        else:
            with autocast:
                pred = model(xt, t)
        return F.mse_loss(pred.float(), noise)

    @torch.no_grad()
    def sample(self, model: nn.Module, shape: tuple[int, ...], steps: int, generator: torch.Generator,
               device: torch.device | str, eta: float = 1.0, autocast=None) -> torch.Tensor:
        """Runs the reverse process from pure noise over `steps` evenly spaced
        timesteps of the T (DDIM update; eta=1 is ancestral DDPM respaced to
        those steps, eta=0 deterministic DDIM). All noise is drawn on the
        device from `generator`. Returns x_0 clamped to [-1, 1]."""
        steps = max(1, min(steps, self.T))
        ts = torch.linspace(self.T - 1, 0, steps, dtype=torch.float64).round().long().tolist()
        x = torch.randn(shape, generator=generator, device=device)
        for j, t in enumerate(ts):
            ab_t = float(self.alpha_bar[t])
            ab_prev = float(self.alpha_bar[ts[j + 1]]) if j + 1 < len(ts) else 1.0
            tt = torch.full((shape[0],), t, dtype=torch.long, device=device)
            if autocast is None:
                eps = model(x, tt)
            else:
                with autocast:
                    eps = model(x, tt)
            eps = eps.float()
            x0 = ((x - math.sqrt(1 - ab_t) * eps) / math.sqrt(ab_t)).clamp(-1, 1)
            eps = (x - math.sqrt(ab_t) * x0) / math.sqrt(1 - ab_t)  # consistent with the clamped x0
            sigma = eta * math.sqrt((1 - ab_prev) / (1 - ab_t) * (1 - ab_t / ab_prev))
            x = math.sqrt(ab_prev) * x0 + math.sqrt(max(1 - ab_prev - sigma ** 2, 0.0)) * eps
            if sigma > 0:
                x = x + sigma * torch.randn(shape, generator=generator, device=device)
        return x.clamp(-1, 1)


# ------------------------------------------------------------- benchmark


def bench_workload(batch: int | None = None, preset: str = "quick"):
    """(model on CPU, 4 host batches [((noisy images, timesteps), noise)],
    loss_fn) for the benchmarks: random images in [-1, 1] noised with the
    cosine schedule, T=500, fixed seed. quick: 1x16x16, base 32, batch 16;
    full: 1x32x32, base 64, batch 64."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if preset == "quick":
        size, base, mults, b = 16, 32, (1, 2, 2), batch or 16
    else:
        size, base, mults, b = 32, 64, (1, 2, 2, 2), batch or 64
    model = UNet(channels=1, base=base, mults=mults, attention=True)
    diff = Diffusion("cosine", 500)
    batches = []
    for _ in range(4):
        x0 = torch.rand(b, 1, size, size, generator=g) * 2 - 1
        t = torch.randint(0, diff.T, (b,), generator=g)
        noise = torch.randn(b, 1, size, size, generator=g)
        batches.append(((diff.q_sample(x0, t, noise), t), noise))

    def loss_fn(out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, noise)

    return model, batches, loss_fn
