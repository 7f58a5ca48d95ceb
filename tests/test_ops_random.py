"""Random sampling on the tpu device: every kernel draws from the device's
counter-based Philox generator, so the same seed gives the same numbers;
distributions are checked statistically (fixed seeds: deterministic)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

DT = "tpu"
N = 1 << 20


def host(t):
    return t.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_uniform(dtype):
    torch.manual_seed(0)
    x = torch.empty(N, dtype=dtype, device=DT).uniform_(-2.0, 3.0)
    h = host(x).double()
    assert h.min() >= -2.0 and h.max() <= 3.0
    if dtype != torch.bfloat16:
        assert h.max() < 3.0
    assert abs(h.mean().item() - 0.5) < 0.01
    assert abs(h.var().item() - 25 / 12) < 0.02


def test_same_seed_same_numbers():
    torch.manual_seed(123)
    a = host(torch.rand(1000, device=DT))
    b = host(torch.randn(1000, device=DT))
    torch.manual_seed(123)
    a2 = host(torch.rand(1000, device=DT))
    b2 = host(torch.randn(1000, device=DT))
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, host(torch.rand(1000, device=DT)))  # the offset advanced
    g = torch.Generator(device=DT)
    g.manual_seed(5)
    c = host(torch.rand(100, device=DT, generator=g))
    g.manual_seed(5)
    assert torch.equal(c, host(torch.rand(100, device=DT, generator=g)))
    # generator state round trip
    s = torch.tpu.get_rng_state()
    d = host(torch.rand(10, device=DT))
    torch.tpu.set_rng_state(s)
    assert torch.equal(d, host(torch.rand(10, device=DT)))


def test_counter_mapping_is_layout_independent():
    # element i uses Philox block offset + i / 4: a prefix of a bigger draw
    torch.manual_seed(7)
    big = host(torch.rand(4096, device=DT))
    torch.manual_seed(7)
    small = host(torch.rand(1000, device=DT))
    assert torch.equal(big[:1000], small)
    torch.manual_seed(7)
    strided = torch.empty(64, 64, device=DT).t()
    strided.uniform_()
    assert torch.equal(host(strided).reshape(-1), big)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal(dtype):
    torch.manual_seed(1)
    x = host(torch.empty(N, dtype=dtype, device=DT).normal_(2.0, 3.0)).double()
    assert abs(x.mean().item() - 2.0) < 0.02
    assert abs(x.std().item() - 3.0) < 0.02
    assert abs(((x - 2) / 3).pow(3).mean().item()) < 0.02  # symmetric
    assert abs(((x - 2) / 3).pow(4).mean().item() - 3.0) < 0.05  # kurtosis of a gaussian
    y = host(torch.randn(3, 5, device=DT))
    assert y.shape == (3, 5)


def test_normal_with_tensor_mean_and_std():
    # torch.normal(mean, std) with tensors: N(0, 1) draws scaled and shifted,
    # broadcast over mean and std; the same draws as randn under one seed
    mean = torch.linspace(-3, 3, 4).reshape(4, 1)
    std = torch.tensor([0.5, 1.0, 2.0])
    dm, ds = mean.to(DT), std.to(DT)
    torch.manual_seed(11)
    got = torch.normal(dm, ds)
    torch.manual_seed(11)
    want = host(torch.randn(4, 3, device=DT)) * std + mean
    assert got.device.type == DT and got.shape == (4, 3) and got.dtype == torch.float32
    torch.testing.assert_close(host(got), want, rtol=0, atol=0)
    for fn, like in ((lambda: torch.normal(dm, 2.0), lambda z: z * 2.0 + mean),
                     (lambda: torch.normal(1.5, ds), lambda z: z * std + 1.5)):
        torch.manual_seed(11)
        got = host(fn())
        torch.manual_seed(11)
        assert torch.equal(got, like(host(torch.randn(got.shape, device=DT))))
    out = torch.empty(0, device=DT)
    torch.normal(dm, ds, out=out)
    assert out.shape == (4, 3)
    # statistics of a large sample
    torch.manual_seed(3)
    x = host(torch.normal(torch.full((N,), 2.0, device=DT), torch.full((N,), 3.0, device=DT))).double()
    assert abs(x.mean().item() - 2.0) < 0.02 and abs(x.std().item() - 3.0) < 0.02
    # a negative std is refused like on the CPU; the device stays usable
    with pytest.raises(RuntimeError, match="normal expects all elements of std >= 0.0"):
        torch.normal(dm, -ds)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
        torch.normal(dm, -1.0)
    assert host(torch.normal(dm, ds)).isfinite().all()


def test_bernoulli():
    torch.manual_seed(2)
    x = host(torch.empty(N, device=DT).bernoulli_(0.3))
    assert set(x.unique().tolist()) <= {0.0, 1.0}
    assert abs(x.mean().item() - 0.3) < 0.003
    p = torch.tensor([0.0, 0.25, 1.0], device=DT).expand(N // 4, 3)
    b = host(torch.bernoulli(p))
    assert b[:, 0].sum() == 0 and b[:, 2].min() == 1
    assert abs(b[:, 1].mean().item() - 0.25) < 0.005
    m = host(torch.empty(1000, dtype=torch.bool, device=DT).bernoulli_(0.5))
    assert 400 < m.sum() < 600


def test_dropout():
    torch.manual_seed(3)
    x = torch.ones(N, device=DT)
    y = host(F.dropout(x, 0.25, training=True))
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.003
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.75))
    out, mask = torch.native_dropout(x, 0.25, True)
    assert torch.equal(host(out) != 0, host(mask))
    # backward: grad * mask * scale
    xr = torch.randn(1000, device=DT).requires_grad_()
    yr = F.dropout(xr, 0.5, training=True)
    g = torch.randn(1000)
    yr.backward(g.to(DT))
    keep = host(yr) != 0
    assert torch.allclose(host(xr.grad), g * keep * 2.0)
    assert torch.equal(host(F.dropout(x[:10], 0.5, training=False)), torch.ones(10))


@pytest.mark.parametrize("shape", [(4099,), (683, 3), (5, 7, 11)])
def test_dropout_keeps_where_the_uniform_draw_is_at_least_p(shape):
    # the keep mask is the same Philox mapping as torch.rand: element i (row-
    # major over the output) takes word i % 4 of block offset + i / 4; shapes
    # with a short inner dimension walk the kernel's gather path
    torch.manual_seed(11)
    u = host(torch.rand(shape, device=DT))
    torch.manual_seed(11)
    x = torch.randn(shape[::-1], device=DT).t() if len(shape) == 2 else torch.randn(shape, device=DT)
    torch.manual_seed(11)
    out, mask = torch.native_dropout(x, 0.3, True)
    assert torch.equal(host(mask), u >= 0.3)
    torch.testing.assert_close(host(out), host(x) * (u >= 0.3) / 0.7, rtol=1e-6, atol=0)


def test_dropout_propagates_nan_and_inf_like_cpu():
    # CPU computes x * mask * scale: a dropped NaN stays NaN, a dropped inf
    # becomes NaN (inf * 0) — never a silent 0
    x = torch.tensor([float("nan"), float("inf"), 1.0, 2.0] * 256)
    for p in (0.5, 1.0):
        for y in (host(F.dropout(x.to(DT), p, training=True)), F.dropout(x, p, training=True)):
            assert y[0::4].isnan().all()
            assert not y[1::4].isfinite().any()
            assert y[2::4].isfinite().all()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float32])
def test_random_and_randint(dtype):
    torch.manual_seed(4)
    x = host(torch.empty(100000, dtype=dtype, device=DT).random_(3, 10))
    assert x.min() == 3 and x.max() == 9
    counts = torch.bincount(x.long() - 3)
    assert counts.min() > 100000 / 7 * 0.95
    r = host(torch.randint(-5, 5, (50000,), device=DT))
    assert r.min() == -5 and r.max() == 4 and r.dtype == torch.int64
    f = host(torch.empty(10000, dtype=dtype, device=DT).random_())
    assert f.min() >= 0
    t = host(torch.empty(10000, dtype=dtype, device=DT).random_(20))
    assert t.min() == 0 and t.max() == 19


def test_random_full_int64():
    torch.manual_seed(8)
    x = host(torch.empty(10000, dtype=torch.int64, device=DT).random_())
    assert x.min() >= 0 and x.max() > 2**62


def test_randperm():
    torch.manual_seed(5)
    p = host(torch.randperm(1000, device=DT))
    assert torch.equal(p.sort().values, torch.arange(1000))
    assert not torch.equal(p, torch.arange(1000))
    torch.manual_seed(5)
    assert torch.equal(p, host(torch.randperm(1000, device=DT)))
    assert host(torch.randperm(0, device=DT)).numel() == 0
    assert torch.equal(host(torch.randperm(5, dtype=torch.float32, device=DT)).sort().values, torch.arange(5.0))


def test_multinomial():
    torch.manual_seed(6)
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 1.0, 1.0]], device=DT)
    s = host(torch.multinomial(p, 20000, replacement=True))
    assert s.shape == (2, 20000)
    freq = torch.bincount(s[0], minlength=4).double() / 20000
    assert freq[1] == 0
    assert torch.allclose(freq, torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64), atol=0.015)
    w = host(torch.multinomial(p, 3, replacement=False))
    for row in w:
        assert len(set(row.tolist())) == 3
    assert 1 not in w[0].tolist()
    one = host(torch.multinomial(torch.tensor([0.2, 0.8], device=DT), 2))
    assert sorted(one.tolist()) == [0, 1]
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(p, 5, replacement=False)


def test_exponential_and_others():
    torch.manual_seed(9)
    e = host(torch.empty(N, device=DT).exponential_(2.0)).double()
    assert e.min() >= 0 and abs(e.mean().item() - 0.5) < 0.005
    ln = host(torch.empty(N, device=DT).log_normal_(0.0, 0.5)).double()
    assert abs(ln.log().mean().item()) < 0.005
    gm = host(torch.empty(100000, device=DT).geometric_(0.5)).double()
    assert gm.min() >= 1 and abs(gm.mean().item() - 2.0) < 0.03
