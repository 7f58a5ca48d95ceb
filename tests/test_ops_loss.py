"""Losses on the tpu device vs PyTorch CPU: nll_loss (1d/2d, weight,
ignore_index, reductions, backward), mse / smooth_l1 / huber / l1 / bce
(+backward), cross_entropy end to end when softmax is available, and the
out-of-range target error."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import rnd

DT = "tpu"



def close(d, c, **kw):
    d = d.cpu()
    assert d.dtype == c.dtype and d.shape == c.shape, (d.dtype, c.dtype, d.shape, c.shape)
    torch.testing.assert_close(d, c, **kw)


def _has(fn):
    try:
        fn()
        torch.tpu.synchronize()
        return True
    except NotImplementedError:
        return False


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_nll_loss(reduction, weighted, dtype):
    x = rnd((8, 5), dtype)
    t = torch.tensor([0, 4, 2, 2, 1, 3, 0, 4])
    w = rnd((5,), seed=2).abs().to(dtype) if weighted else None
    for ignore in (-100, 2):
        c = F.nll_loss(x, t, weight=w, reduction=reduction, ignore_index=ignore)
        d = F.nll_loss(x.to(DT), t.to(DT), weight=None if w is None else w.to(DT), reduction=reduction,
                       ignore_index=ignore)
        tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else {}
        close(d, c, **tol)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_backward(reduction):
    x = rnd((6, 4)).requires_grad_()
    xd = x.detach().to(DT).requires_grad_()
    t = torch.tensor([0, 3, 1, 1, 2, 0])
    w = torch.tensor([1.0, 2.0, 0.5, 1.5])
    c = F.nll_loss(x, t, weight=w, reduction=reduction, ignore_index=1)
    d = F.nll_loss(xd, t.to(DT), weight=w.to(DT), reduction=reduction, ignore_index=1)
    g = rnd(c.shape, seed=3)
    c.backward(g)
    d.backward(g.to(DT))
    close(xd.grad, x.grad)


def test_nll_loss_2d_and_1d():
    x = rnd((2, 3, 4, 5)).requires_grad_()
    xd = x.detach().to(DT).requires_grad_()
    t = torch.randint(0, 3, (2, 4, 5), generator=torch.Generator().manual_seed(1))
    for red in ("mean", "sum", "none"):
        close(F.nll_loss(xd, t.to(DT), reduction=red), F.nll_loss(x, t, reduction=red).detach())
    F.nll_loss(x, t).backward()
    F.nll_loss(xd, t.to(DT)).backward()
    close(xd.grad, x.grad)
    # 3-D input (N, C, L)
    x3 = rnd((2, 3, 7))
    t3 = torch.randint(0, 3, (2, 7), generator=torch.Generator().manual_seed(2))
    close(F.nll_loss(x3.to(DT), t3.to(DT)), F.nll_loss(x3, t3))
    # unbatched
    x1 = rnd((4,))
    close(F.nll_loss(x1.to(DT), torch.tensor(2, device=DT)), F.nll_loss(x1, torch.tensor(2)))
    # all ignored: mean is nan like CPU
    close(F.nll_loss(x1[None].to(DT), torch.tensor([1], device=DT), ignore_index=1),
          F.nll_loss(x1[None], torch.tensor([1]), ignore_index=1), equal_nan=True)


def test_nll_loss_target_out_of_bounds():
    x = torch.zeros(2, 3, device=DT)
    r = F.nll_loss(x, torch.tensor([0, 5], device=DT))
    with pytest.raises(IndexError, match="nll_loss.*Target 5 is out of bounds"):
        r.cpu()
    close(F.nll_loss(x, torch.tensor([0, 2], device=DT)), torch.tensor(0.0))


def test_cross_entropy_end_to_end():
    x = rnd((5, 7))
    if not _has(lambda: torch.log_softmax(x.to(DT), 1)):
        pytest.skip("log_softmax is not available on this build")
    x.requires_grad_()
    xd = x.detach().to(DT).requires_grad_()
    t = torch.tensor([0, 6, 3, 3, 1])
    c = F.cross_entropy(x, t)
    d = F.cross_entropy(xd, t.to(DT))
    close(d, c.detach())
    c.backward()
    d.backward()
    close(xd.grad, x.grad)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pointwise_losses(reduction, dtype):
    x, y = rnd((4, 6), dtype), rnd((4, 6), dtype, seed=1)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    close(F.mse_loss(x.to(DT), y.to(DT), reduction=reduction), F.mse_loss(x, y, reduction=reduction), **tol)
    close(F.smooth_l1_loss(x.to(DT), y.to(DT), reduction=reduction, beta=0.5),
          F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5), **tol)
    close(F.huber_loss(x.to(DT), y.to(DT), reduction=reduction, delta=0.7),
          F.huber_loss(x, y, reduction=reduction, delta=0.7), **tol)
    p, q = torch.sigmoid(x.float()).to(dtype), torch.rand(4, 6, generator=torch.Generator().manual_seed(3)).to(dtype)
    w = rnd((4, 6), seed=4).abs().to(dtype)
    close(F.binary_cross_entropy(p.to(DT), q.to(DT), reduction=reduction),
          F.binary_cross_entropy(p, q, reduction=reduction), **tol)
    close(F.binary_cross_entropy(p.to(DT), q.to(DT), weight=w.to(DT), reduction=reduction),
          F.binary_cross_entropy(p, q, weight=w, reduction=reduction), **tol)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_pointwise_loss_grads(reduction):
    x0, y = rnd((3, 5)), rnd((3, 5), seed=1)
    p0 = torch.sigmoid(x0)
    q = torch.rand(3, 5, generator=torch.Generator().manual_seed(3))
    cases = [
        (lambda a, b: F.mse_loss(a, b, reduction=reduction), x0, y),
        (lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5), x0, y),
        (lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=0.7), x0, y),
        (lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), p0, q),
    ]
    for fn, a, b in cases:
        ac = a.clone().requires_grad_()
        ad = a.to(DT).requires_grad_()
        oc, od = fn(ac, b), fn(ad, b.to(DT))
        g = rnd(oc.shape, seed=7)
        oc.backward(g)
        od.backward(g.to(DT))
        close(ad.grad, ac.grad)


@pytest.mark.parametrize("n", [1, 31, 1025, 4096 * 3 + 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_pointwise_losses_across_block_edges(n, dtype):
    # the kernel converts 1,024 elements at a time, sums 32 lanes and owns
    # 4,096-element blocks; sizes on and off those edges, a strided input
    # (element-by-element loads) and every reduction against the CPU's
    g = torch.Generator().manual_seed(n)
    x, y = torch.randn(n, generator=g).to(dtype), torch.randn(2 * n, generator=g).to(dtype)[::2]
    p = torch.rand(n, generator=g).to(dtype)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    for red in ("none", "mean", "sum"):
        for fn in (lambda a, b: F.mse_loss(a, b, reduction=red), lambda a, b: F.l1_loss(a, b, reduction=red),
                   lambda a, b: F.smooth_l1_loss(a, b, reduction=red, beta=0.3),
                   lambda a, b: F.huber_loss(a, b, reduction=red, delta=0.6),
                   lambda a, b: F.binary_cross_entropy(p, b.sigmoid(), reduction=red) if a is x else
                   F.binary_cross_entropy(p.to(DT), b.sigmoid(), reduction=red)):
            close(fn(x.to(DT), y.to(DT)), fn(x, y), **tol)
        xc, xd = x.clone().requires_grad_(), x.to(DT).requires_grad_()
        F.huber_loss(xc, y, reduction=red, delta=0.6).sum().backward()
        F.huber_loss(xd, y.to(DT), reduction=red, delta=0.6).sum().backward()
        close(xd.grad, xc.grad, **tol)


def test_mse_loss_is_deterministic_and_accumulates_in_double():
    # a sum of 1M squares: the same bits on every call, and closer to the
    # float64 value than float32 accumulation would be
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))
    xd = x.to(DT)
    a, b = F.mse_loss(xd, xd * 0.5, reduction="sum").cpu(), F.mse_loss(xd, xd * 0.5, reduction="sum").cpu()
    assert torch.equal(a, b)
    ref = ((x.double() * 0.5) ** 2).sum()
    assert abs(a.double() - ref) / ref <= 1e-7


def test_mse_broadcast_noncontig_out():
    x, y = rnd((5, 4)).t(), rnd((4, 1), seed=2)
    with pytest.warns(UserWarning):
        c = F.mse_loss(x, y)
    with pytest.warns(UserWarning):
        d = F.mse_loss(x.to(DT), y.to(DT))
    close(d, c)
    out = torch.empty(0, device=DT)
    torch._C._nn.mse_loss(x.to(DT), x.to(DT) * 0 if False else y.to(DT).expand(4, 5), 2, out=out)
    close(out, torch._C._nn.mse_loss(x, y.expand(4, 5), 2))


def test_bce_input_range_error():
    r = F.binary_cross_entropy(torch.tensor([1.5], device=DT), torch.tensor([1.0], device=DT))
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        r.cpu()
    close(F.binary_cross_entropy(torch.tensor([0.5], device=DT), torch.tensor([1.0], device=DT)),
          F.binary_cross_entropy(torch.tensor([0.5]), torch.tensor([1.0])))


def test_l1_and_bce_with_logits_composites():
    x, y = rnd((3, 4)), rnd((3, 4), seed=1)
    if not _has(lambda: (x.to(DT) - y.to(DT)).abs().mean()):
        pytest.skip("elementwise/reduction ops are not available on this build")
    close(F.l1_loss(x.to(DT), y.to(DT)), F.l1_loss(x, y))
    close(F.smooth_l1_loss(x.to(DT), y.to(DT), beta=0.0), F.smooth_l1_loss(x, y, beta=0.0))
    t = torch.rand(3, 4, generator=torch.Generator().manual_seed(2))
    close(F.binary_cross_entropy_with_logits(x.to(DT), t.to(DT)), F.binary_cross_entropy_with_logits(x, t))


# ------------------------------------------- margin, distance and CTC losses

def _grads(fn, inputs, rtol=1e-4, atol=1e-5):
    cpu = [x.detach().clone().requires_grad_(x.dtype.is_floating_point) for x in inputs]
    dev = [x.detach().to(DT).requires_grad_(x.dtype.is_floating_point) for x in inputs]
    out, dout = fn(*cpu), fn(*dev)
    close(dout, out.detach(), rtol=rtol, atol=atol)
    g = rnd(out.shape, seed=9).to(out.dtype)
    out.backward(g)
    dout.backward(g.to(DT))
    for c, d in zip(cpu, dev):
        if c.grad is not None:
            close(d.grad, c.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss(reduction, p):
    x, t = rnd((5, 4)), torch.tensor([0, 3, 1, 2, 3])
    w = rnd((4,), seed=2).abs()
    _grads(lambda x: F.multi_margin_loss(x, t.to(x.device), p=p, margin=0.7, reduction=reduction), [x])
    _grads(lambda x: F.multi_margin_loss(x, t.to(x.device), p=p, weight=w.to(x.device), reduction=reduction), [x])
    _grads(lambda x: F.multi_margin_loss(x, t[:1].to(x.device)[0], reduction=reduction), [rnd((4,))])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_multi_margin_loss_dtypes(dtype):
    x, t = rnd((5, 4)).to(dtype), torch.tensor([0, 3, 1, 2, 3])
    close(F.multi_margin_loss(x.to(DT), t.to(DT)), F.multi_margin_loss(x.double(), t).to(dtype), rtol=2e-2, atol=2e-2)


def test_multi_margin_loss_bad_target():
    x = rnd((2, 3))
    with pytest.raises(IndexError):
        F.multi_margin_loss(x.to(DT), torch.tensor([0, 3]).to(DT))
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError):
        F.multi_margin_loss(x.to(DT), torch.tensor([0, 1, 2]).to(DT))
    # device stays usable
    close(F.multi_margin_loss(x.to(DT), torch.tensor([0, 2]).to(DT)), F.multi_margin_loss(x, torch.tensor([0, 2])))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss(reduction):
    x = rnd((3, 5))
    t = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 3, 4, 0], [-1, 1, 1, 1, 1]])
    _grads(lambda x: F.multilabel_margin_loss(x, t.to(x.device), reduction=reduction), [x])
    _grads(lambda x: F.multilabel_margin_loss(x, t[0].to(x.device), reduction=reduction), [rnd((5,))])


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 2.0, 3.0, float("inf")])
def test_cdist(p):
    x1, x2 = rnd((2, 4, 3)), rnd((2, 5, 3), seed=1)
    _grads(lambda a, b: torch.cdist(a, b, p=p), [x1, x2])
    _grads(lambda a, b: torch.cdist(a, b, p=p), [rnd((4, 3)), rnd((1, 6, 3), seed=2)])


@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, 2.0, float("inf")])
def test_pdist(p):
    _grads(lambda a: F.pdist(a, p=p), [rnd((5, 3))])
    _grads(lambda a: F.pdist(a, p=p), [rnd((1, 3))])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("padded", [True, False])
def test_ctc_loss(reduction, padded):
    T, B, C, S = 8, 3, 5, 4
    lp = rnd((T, B, C)).log_softmax(2)
    tl = torch.tensor([4, 2, 3])
    il = torch.tensor([8, 6, 7])
    tg2 = torch.randint(1, C, (B, S), generator=torch.Generator().manual_seed(1))
    tg = tg2 if padded else torch.cat([tg2[b, :tl[b]] for b in range(B)])
    _grads(lambda lp: F.ctc_loss(lp, tg.to(lp.device), il, tl, reduction=reduction), [lp], rtol=1e-4, atol=1e-4)


def test_ctc_loss_zero_infinity_and_errors():
    T, B, C = 3, 2, 4
    lp = rnd((T, B, C)).log_softmax(2)
    tg = torch.tensor([[1, 2, 1, 2], [1, 1, 1, 1]])
    tl, il = torch.tensor([4, 1]), torch.tensor([3, 3])
    _grads(lambda lp: F.ctc_loss(lp, tg.to(lp.device), il, tl, zero_infinity=True, reduction="sum"), [lp])
    for dev in ("cpu", DT):
        with pytest.raises(RuntimeError):
            F.ctc_loss(lp.to(dev), tg.to(dev), torch.tensor([3, 9]), tl)
