"""Reductions, scans, softmax and normalization on the tpu device vs CPU."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from torch_tpu._internal.execution_mode import cpu_fallback_mode

DEV = "tpu"
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 2e-2, torch.float16: 2e-3}
FAMILY = ("sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "var", "std", "norm",
          "logsumexp", "any", "all", "nansum", "cum", "softmax", "layer_norm", "batch_norm", "group_norm")


def close(got, want, tol=1e-5):
    got = got.cpu()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got.double(), want.double(), atol=tol, rtol=tol, equal_nan=True)
    else:
        assert torch.equal(got, want)


def sample(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def no_family_fallback():
    stats = torch.tpu.fallback_stats() if hasattr(torch.tpu, "fallback_stats") else {}
    names = stats.keys() if isinstance(stats, dict) else [s[0] for s in stats]
    bad = [n for n in names if any(f in n for f in FAMILY)]
    assert not bad, bad


# ---------------------------------------------------------------- reductions

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dims,keepdim", [(None, False), ((1,), False), ((0, 2), True), ((-1,), False), ((), False)])
def test_sum_mean_float(dtype, dims, keepdim):
    x = sample((5, 7, 9), dtype)
    t = x.to(DEV)
    if dims is None:
        close(t.sum(), x.sum(), TOL[dtype])
        close(t.mean(), x.mean(), TOL[dtype])
    else:
        close(t.sum(dims, keepdim=keepdim), x.sum(dims, keepdim=keepdim), TOL[dtype])
        close(t.mean(dims, keepdim=keepdim), x.mean(dims, keepdim=keepdim), TOL[dtype])
        close(t.nansum(dims, keepdim=keepdim), x.nansum(dims, keepdim=keepdim), TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool])
def test_sum_prod_int(dtype):
    x = sample((4, 6), dtype)
    t = x.to(DEV)
    close(t.sum(), x.sum())
    close(t.sum(0), x.sum(0))
    close(t.sum(1, dtype=torch.float32), x.sum(1, dtype=torch.float32))
    if dtype != torch.bool:
        close(t.prod(1), x.prod(1))
        close(t.prod(), x.prod())
        close(t.max(), x.max())
        close(t.amin(0), x.amin(0))
        close(t.argmax(1), x.argmax(1))
        v, i = t.min(0)
        vc, ic = x.min(0)
        close(v, vc)
        close(i, ic)
    close(t.any(1), x.any(1))
    close(t.all(), x.all())


def test_noncontiguous_and_dtype_arg():
    x = sample((6, 8, 10), torch.float32)
    t = x.to(DEV)
    for xs, ts in [(x.transpose(0, 2), t.transpose(0, 2)), (x[:, ::2, 1::3], t[:, ::2, 1::3]),
                   (x.permute(1, 2, 0), t.permute(1, 2, 0)), (x[0:1].expand(4, 8, 10), t[0:1].expand(4, 8, 10))]:
        for d in [0, 1, 2, (0, 1), (1, 2), (0, 2)]:
            close(ts.sum(d), xs.sum(d), 1e-4)
            close(ts.amax(d), xs.amax(d))
            close(ts.var(d), xs.var(d), 1e-4)
        close(ts.argmax(), xs.argmax())
        close(ts.argmin(1), xs.argmin(1))
    close(t.sum(1, dtype=torch.float64), x.sum(1, dtype=torch.float64), 1e-10)
    h = x.half().to(DEV)
    close(h.sum(dtype=torch.float32), x.half().sum(dtype=torch.float32), 1e-4)


def test_out_forms():
    x = sample((4, 5), torch.float32)
    t = x.to(DEV)
    o = torch.empty(0, device=DEV)
    torch.sum(t, 1, out=o)
    close(o, x.sum(1))
    o2 = torch.empty(0, device=DEV)
    torch.mean(t, 0, keepdim=True, out=o2)
    close(o2, x.mean(0, keepdim=True))
    v, i = torch.empty(0, device=DEV), torch.empty(0, device=DEV, dtype=torch.long)
    torch.max(t, 1, out=(v, i))
    close(v, x.max(1).values)
    close(i, x.max(1).indices)
    a = torch.empty(0, device=DEV, dtype=torch.long)
    torch.argmax(t, 0, out=a)
    close(a, x.argmax(0))
    c = torch.empty(0, device=DEV)
    torch.cumsum(t, 1, out=c)
    close(c, x.cumsum(1))
    s = torch.empty(0, device=DEV)
    torch.softmax(t, 1, out=s) if False else None
    lse = torch.empty(0, device=DEV)
    torch.logsumexp(t, 1, out=lse)
    close(lse, torch.logsumexp(x, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_max_min_var_norm(dtype):
    x = sample((6, 11), dtype)
    t = x.to(DEV)
    tol = TOL[dtype]
    close(t.max(), x.max())
    close(t.min(), x.min())
    for d in [0, 1, -1]:
        for k in [False, True]:
            v, i = t.max(d, keepdim=k)
            vc, ic = x.max(d, keepdim=k)
            close(v, vc)
            close(i, ic)
    close(t.amax((0, 1)), x.amax((0, 1)))
    close(t.argmin(), x.argmin())
    close(t.var(1), x.var(1), tol * 4)
    close(t.var(0, correction=0), x.var(0, correction=0), tol * 4)
    close(t.std(), x.std(), tol * 4)
    vm, mm = torch.var_mean(t, 1, keepdim=True)
    vmc, mmc = torch.var_mean(x, 1, keepdim=True)
    close(vm, vmc, tol * 4)
    close(mm, mmc, tol)
    sm, sd = torch.std_mean(t)
    smc, sdc = torch.std_mean(x)
    close(sm, smc, tol * 4)
    close(sd, sdc, tol)
    for ordv in [2, 1, 0, 3, float("inf"), float("-inf")]:
        close(torch.linalg.vector_norm(t, ordv, dim=1), torch.linalg.vector_norm(x, ordv, dim=1), tol * 4)
    close(t.norm(), x.norm(), tol * 4)
    close(torch.logsumexp(t, 1), torch.logsumexp(x, 1), tol * 4)


def test_nan_semantics():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [2.0, 5.0, -1.0, 0.5]])
    t = x.to(DEV)
    close(t.max(), x.max())
    close(t.amax(1), x.amax(1))
    close(t.amin(1), x.amin(1))
    close(t.argmax(1), x.argmax(1))
    close(t.argmin(1), x.argmin(1))
    v, i = t.max(1)
    vc, ic = x.max(1)
    close(v, vc)
    close(i, ic)
    close(t.nansum(1), x.nansum(1))
    close(t.sum(1), x.sum(1))
    inf = torch.tensor([float("-inf"), float("-inf")])
    close(torch.logsumexp(inf.to(DEV), 0), torch.logsumexp(inf, 0))
    big = torch.tensor([[float("inf"), 1.0]])
    close(torch.logsumexp(big.to(DEV), 1), torch.logsumexp(big, 1))


def test_large_sum_accuracy():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1_000_000, generator=g) + 0.5
    t = x.to(DEV)
    ref = x.double().sum()
    got = t.sum().cpu().double()
    assert abs(got - ref) / ref < 1e-6
    close(t.mean(), x.mean(), 1e-5)
    x2 = x.view(1000, 1000)
    t2 = t.view(1000, 1000)
    torch.testing.assert_close(t2.sum(0).cpu().double(), x2.double().sum(0), rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(t2.sum(1).cpu().double(), x2.double().sum(1), rtol=1e-6, atol=1e-4)
    v = torch.randn(4, 200_000, generator=g)
    torch.testing.assert_close(v.to(DEV).var(1).cpu(), v.var(1), rtol=1e-5, atol=1e-5)
    close(v.to(DEV).argmax(1), v.argmax(1))
    w = torch.randn(200_000, 3, generator=g)
    torch.testing.assert_close(w.to(DEV).sum(0).cpu().double(), w.double().sum(0), rtol=1e-5, atol=1e-3)


def test_empty_rules():
    e = torch.empty(0, 3)
    t = e.to(DEV)
    close(t.sum(), e.sum())
    close(t.sum(0), e.sum(0))
    close(t.prod(0), e.prod(0))
    close(t.mean(0), e.mean(0))
    close(t.any(0), e.any(0))
    close(t.all(0), e.all(0))
    close(t.amax(1), e.amax(1))
    close(t.cumsum(0), e.cumsum(0))
    with pytest.raises(RuntimeError, match="numel"):
        t.max()
    with pytest.raises(IndexError, match="non-zero size"):
        t.max(0)
    with pytest.raises(IndexError, match="numel"):
        t.argmax()
    s = torch.tensor(3.5)
    close(s.to(DEV).sum(), s.sum())
    close(s.to(DEV).max(0).values, s.max(0).values)
    # the device is still usable
    close(torch.ones(3, device=DEV).sum(), torch.ones(3).sum())


def test_errors():
    t = torch.ones(2, 3, device=DEV)
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.sum(2)
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.softmax(-3)
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.cumsum(5)
    with pytest.raises(RuntimeError, match="mean"):
        torch.ones(3, device=DEV, dtype=torch.long).mean()
    close(t.sum(), torch.ones(2, 3).sum())


# --------------------------------------------------------------------- scans

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16])
def test_scans(dtype):
    x = sample((5, 8), dtype)
    t = x.to(DEV)
    tol = TOL.get(dtype, 0)
    for d in [0, 1, -1]:
        close(t.cumsum(d), x.cumsum(d), tol)
        close(t.cumprod(d), x.cumprod(d), tol * 10)
        v, i = torch.cummax(t, d)
        vc, ic = torch.cummax(x, d)
        close(v, vc)
        close(i, ic)
        v, i = torch.cummin(t, d)
        vc, ic = torch.cummin(x, d)
        close(v, vc)
        close(i, ic)
    close(t.t().cumsum(1), x.t().cumsum(1), tol)
    close(t.cumsum(0, dtype=torch.float64), x.cumsum(0, dtype=torch.float64), tol)
    if dtype.is_floating_point:
        close(torch.logcumsumexp(t, 1), torch.logcumsumexp(x, 1), tol * 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_column_scans_match_line_scans_bit_for_bit(dtype):
    # cumsum / cumprod along a dim whose neighbouring lines are adjacent
    # advance 64 lines together; each line's running value is the one a
    # line-at-a-time scan (of the transposed copy) computes, bit for bit:
    # widths on and off 64, a merged batch, a strided outer dim, in place
    g = torch.Generator().manual_seed(8)
    for shape, dim in (((1024, 100), 0), ((300, 64), 0), ((5, 200, 129), 1), ((3, 70, 2, 65), 1)):
        x = (torch.rand(shape, generator=g, dtype=torch.float64) * 0.2 + 0.9).to(dtype)
        t = x.to(DEV)
        for op in ("cumsum", "cumprod"):
            got = getattr(t, op)(dim).cpu()
            lines = getattr(t.movedim(dim, -1).contiguous(), op)(-1).movedim(-1, dim).cpu()
            assert torch.equal(got, lines), (shape, dim, op)
            close(got, getattr(x, op)(dim), 1e-5 if dtype == torch.float32 else 1e-12)
        st = t[:, ::2] if len(shape) == 2 else t
        assert torch.equal(st.cumsum(0).cpu(), st.movedim(0, -1).contiguous().cumsum(-1).movedim(-1, 0).cpu())
        y = t.clone()
        y.cumsum_(dim)
        assert torch.equal(y.cpu(), t.cumsum(dim).cpu())


# ------------------------------------------------------------------- softmax

@pytest.mark.parametrize("d", [127, 128, 200, 1000, 32000])
def test_softmax_long_rows(d):
    # rows from 128 sum their exps as they store them (16 lanes; log_softmax
    # without storing them): against the CPU, rows that are all -inf but
    # one, huge logits, a NaN row
    g = torch.Generator().manual_seed(d)
    x = torch.randn(6, d, generator=g) * 8
    x[1] = float("-inf")
    x[1, d // 2] = 3.0
    x[2, :5] = 1e30
    x[3, 7] = float("nan")
    x[4] = x[4] - 1e4
    got, want = x.to(DEV).softmax(-1).cpu(), x.softmax(-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)
    torch.testing.assert_close(x.to(DEV).log_softmax(-1).cpu(), x.log_softmax(-1), rtol=1e-5, atol=1e-5,
                               equal_nan=True)
    ok = ~torch.isnan(want).any(1)
    torch.testing.assert_close(got[ok].double().sum(1), torch.ones(int(ok.sum()), dtype=torch.float64),
                               rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(dtype, dim):
    x = sample((4, 6, 33), dtype) * 3
    t = x.to(DEV)
    tol = TOL[dtype] * 2
    close(t.softmax(dim), x.softmax(dim), tol)
    close(t.log_softmax(dim), x.log_softmax(dim), tol * 2)
    close(t.transpose(0, 2).softmax(dim), x.transpose(0, 2).softmax(dim), tol)
    if dtype == torch.float16:
        close(F.softmax(t, dim, dtype=torch.float32), F.softmax(x, dim, dtype=torch.float32), 1e-5)


def test_softmax_large_row_and_inf():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 10000, generator=g)
    close(x.to(DEV).softmax(1), x.softmax(1), 1e-6)
    y = torch.tensor([[0.0, float("-inf"), 1.0]])
    close(y.to(DEV).softmax(1), y.softmax(1))
    close(y.to(DEV).log_softmax(1), y.log_softmax(1))


@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_autograd(dim):
    x = sample((5, 7), torch.float32)
    for fn in (torch.softmax, torch.log_softmax):
        xc = x.clone().requires_grad_()
        xt = x.to(DEV).requires_grad_()
        g = sample((5, 7), torch.float32, seed=5)
        fn(xc, dim).backward(g)
        fn(xt, dim).backward(g.to(DEV))
        close(xt.grad, xc.grad, 1e-5)
    no_family_fallback()


def test_reduction_autograd():
    x = sample((4, 6), torch.float32)
    with cpu_fallback_mode(True):
        for f in [lambda a: a.sum(), lambda a: a.sum(1).sum(), lambda a: a.mean(), lambda a: a.var(1).sum(),
                  lambda a: torch.logsumexp(a, 1).sum(), lambda a: a.amax(0).sum()]:
            xc = x.clone().requires_grad_()
            xt = x.to(DEV).requires_grad_()
            f(xc).backward()
            f(xt).backward()
            close(xt.grad, xc.grad, 1e-5)
    no_family_fallback()


# ------------------------------------------------------------- normalization

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_layer_norm_forward(dtype):
    x = sample((3, 5, 16), dtype)
    w = sample((16,), dtype, 1)
    b = sample((16,), dtype, 2)
    t = x.to(DEV)
    tol = TOL[dtype] * 4
    close(F.layer_norm(t, [16], w.to(DEV), b.to(DEV)), F.layer_norm(x, [16], w, b), tol)
    close(F.layer_norm(t, [5, 16]), F.layer_norm(x, [5, 16]), tol)
    close(F.layer_norm(t.transpose(0, 1), [16]), F.layer_norm(x.transpose(0, 1), [16]), tol)
    o = torch.ops.aten.native_layer_norm(t, [16], None, None, 1e-5)
    oc = torch.ops.aten.native_layer_norm(x, [16], None, None, 1e-5)
    for a, c in zip(o, oc):
        close(a, c, tol)
    if hasattr(torch.ops.aten, "_fused_rms_norm"):
        r = torch.ops.aten._fused_rms_norm(t, [16], w.to(DEV), 1e-6)
        rc = torch.ops.aten._fused_rms_norm(x, [16], w, 1e-6)
        for a, c in zip(r, rc):
            close(a, c, tol)


def test_layer_norm_module_autograd():
    m = torch.nn.LayerNorm(12)
    with torch.no_grad():
        m.weight.copy_(torch.randn(12))
        m.bias.copy_(torch.randn(12))
    mt = torch.nn.LayerNorm(12).to(DEV)
    mt.load_state_dict(m.state_dict())
    x = sample((4, 3, 12), torch.float32)
    g = sample((4, 3, 12), torch.float32, 9)
    xc = x.clone().requires_grad_()
    xt = x.to(DEV).requires_grad_()
    m(xc).backward(g)
    mt(xt).backward(g.to(DEV))
    close(xt.grad, xc.grad, 1e-5)
    close(mt.weight.grad, m.weight.grad, 1e-4)
    close(mt.bias.grad, m.bias.grad, 1e-4)
    if hasattr(torch.ops.aten, "_fused_rms_norm_backward"):
        w = m.weight.detach().clone().requires_grad_()
        xc2 = x.clone().requires_grad_()
        F.rms_norm(xc2, [12], w, 1e-6).backward(g)
        rt = torch.ops.aten._fused_rms_norm(x.to(DEV), [12], w.detach().to(DEV), 1e-6)[1]
        b = torch.ops.aten._fused_rms_norm_backward(g.to(DEV), x.to(DEV), [12], rt, w.detach().to(DEV), [True, True])
        close(b[0], xc2.grad, 1e-5)
        close(b[1], w.grad, 1e-4)
    no_family_fallback()


@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, True), (False, True, False),
                                  (False, False, True), (True, False, True)])
def test_layer_norm_backward_in_row_parts(mask):
    # enough rows for the backward to cut them into parts (each part's rows
    # give the input gradient and partial weight / bias sums, added in part
    # order): every output-mask combination like CPU, and the same bits on
    # a second run
    x = sample((700, 96), torch.float32)
    g = sample((700, 96), torch.float32, 3)
    w = sample((96,), torch.float32, 1)
    b = sample((96,), torch.float32, 2)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [96], w, b, 1e-5)
    want = torch.ops.aten.native_layer_norm_backward(g, x, [96], mean, rstd, w, b, list(mask))
    args = [t.to(DEV) for t in (g, x)] + [[96], mean.to(DEV), rstd.to(DEV), w.to(DEV), b.to(DEV), list(mask)]
    got = torch.ops.aten.native_layer_norm_backward(*args)
    again = torch.ops.aten.native_layer_norm_backward(*args)
    for k in range(3):
        assert (got[k] is None or not got[k].numel()) == (want[k] is None or not want[k].numel()), k
        if want[k] is not None and want[k].numel():
            close(got[k], want[k], 1e-4)
            assert torch.equal(got[k].cpu(), again[k].cpu())
    no_family_fallback()


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 4), (2, 3, 7), (3, 5, 9, 7), (2, 4, 32, 33)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_module(shape, channels_last):
    if channels_last and len(shape) != 4:
        pytest.skip("channels_last is 4-D")
    C = shape[1]
    cls = {4: torch.nn.BatchNorm2d, 2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d}[len(shape)]
    m = cls(C, momentum=0.3)
    with torch.no_grad():
        m.weight.copy_(torch.randn(C))
        m.bias.copy_(torch.randn(C))
        m.running_mean.copy_(torch.randn(C))
        m.running_var.copy_(torch.rand(C) + 0.5)
    mt = cls(C, momentum=0.3).to(DEV)
    mt.load_state_dict(m.state_dict())
    x = sample(shape, torch.float32) * 2 + 1
    g = sample(shape, torch.float32, 4)
    xt = x.to(DEV)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        xt = xt.contiguous(memory_format=torch.channels_last)
    with cpu_fallback_mode(True):  # add_ of num_batches_tracked, grad accumulation
        for train in (True, False):
            m.train(train)
            mt.train(train)
            xc = x.clone().requires_grad_()
            xtt = xt.clone().detach().requires_grad_()
            m.weight.grad = None
            mt.weight.grad = None
            m.bias.grad = None
            mt.bias.grad = None
            y = m(xc)
            yt = mt(xtt)
            close(yt, y, 1e-5)
            close(mt.running_mean, m.running_mean, 1e-5)
            close(mt.running_var, m.running_var, 1e-5)
            y.backward(g)
            yt.backward(g.to(DEV))
            close(xtt.grad, xc.grad, 1e-4)
            close(mt.weight.grad, m.weight.grad, 1e-4)
            close(mt.bias.grad, m.bias.grad, 1e-4)
    no_family_fallback()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_norm_module(dtype):
    m = torch.nn.GroupNorm(3, 6).to(dtype)
    with torch.no_grad():
        m.weight.copy_(torch.randn(6))
        m.bias.copy_(torch.randn(6))
    mt = torch.nn.GroupNorm(3, 6).to(dtype).to(DEV)
    mt.load_state_dict(m.state_dict())
    x = sample((4, 6, 5, 3), dtype)
    g = sample((4, 6, 5, 3), dtype, 7)
    xc = x.clone().requires_grad_()
    xt = x.to(DEV).requires_grad_()
    y = m(xc)
    yt = mt(xt)
    close(yt, y, TOL[dtype] * 10)
    with cpu_fallback_mode(True):
        y.backward(g)
        yt.backward(g.to(DEV))
    close(xt.grad, xc.grad, 1e-4)
    close(mt.weight.grad, m.weight.grad, 1e-4)
    close(mt.bias.grad, m.bias.grad, 1e-4)
    o = torch.ops.aten.native_group_norm(x.to(DEV), None, None, 4, 6, 15, 2, 1e-5)
    oc = torch.ops.aten.native_group_norm(x, None, None, 4, 6, 15, 2, 1e-5)
    for a, c in zip(o, oc):
        close(a, c, TOL[dtype] * 10)
    no_family_fallback()


@pytest.mark.parametrize("shape", [(3, 20000), (50000, 5), (9000, 3, 7)])
def test_outer_reductions_split(shape):
    x = sample(shape, torch.float32)
    t = x.to(DEV)
    close(t.sum(0), x.sum(0), 1e-3)
    close(t.amax(0), x.amax(0))
    close(t.argmin(0), x.argmin(0))
    close(t.var(0), x.var(0), 1e-4)
    close(torch.logsumexp(t, 0), torch.logsumexp(x, 0), 1e-4)
    v, i = t.max(0)
    close(v, x.max(0).values)
    close(i, x.max(0).indices)
    xi = sample(shape, torch.int32)
    close(xi.to(DEV).sum(0), xi.sum(0))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,dims", [((16, 2, 2, 64, 32), (2,)), ((4, 3, 1500), (0, 1)), ((2, 5000), (0,))])
def test_sums_over_few_rows_match_the_float64_sum(dtype, shape, dims):
    """Sums / means over a few leading rows (the gradients of broadcasts) are
    the float64 sum of the rows rounded once, into fresh and strided
    outputs (float64 data: to rounding, the order of its adds is free)."""
    x = sample(shape, dtype)
    t = x.to(DEV)
    ref_sum = x.double().sum(dims).to(dtype)
    ref_mean = (x.double().sum(dims) / math.prod(shape[d] for d in dims)).to(dtype)
    equal = torch.equal if dtype != torch.float64 else (lambda a, b: torch.allclose(a, b, rtol=1e-14, atol=1e-14))
    assert equal(t.sum(dims).cpu(), ref_sum)
    assert equal(t.mean(dims).cpu(), ref_mean)
    out = torch.full((2,) + ref_sum.shape, 7.0, dtype=dtype, device=DEV)
    torch.sum(t, dims, out=out[1])
    assert equal(out[1].cpu(), ref_sum) and bool((out[0].cpu() == 7).all())
    wide = torch.zeros(ref_sum.shape + (2,), dtype=dtype, device=DEV)
    torch.mean(t, dims, out=wide[..., 0])
    assert equal(wide[..., 0].cpu(), ref_mean) and bool((wide[..., 1].cpu() == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 200, 4, 4), (4, 70, 48, 48), (3, 67, 5, 5)])
def test_batch_norm_in_channel_blocks(shape, dtype):
    # short rows' statistics and sums, and every input gradient of vector
    # rows, are computed a block of channels at a time, sample by sample
    # (blocks of up to 64 channels, fewer when a channel's rows are long;
    # rows of 16, 25 and 2304 elements: a tail chunk too); channels with a
    # zero weight (x not read, k2 = 0) split a block: every channel's
    # statistics, output and gradients against float64 on the CPU
    C = shape[1]
    x = (sample(shape, torch.float32) * 2 + 1).to(dtype)
    g = sample(shape, torch.float32, 4).to(dtype)
    w = sample((C,), torch.float32, 1)
    w[[3, 5, 6, 40 % C, C - 1]] = 0
    b = sample((C,), torch.float32, 2)
    y, mean, rstd = torch.ops.aten.native_batch_norm(x.to(DEV), w.to(DEV), b.to(DEV), None, None, True, 0.1, 1e-5)
    got = torch.ops.aten.native_batch_norm_backward(g.to(DEV), x.to(DEV), w.to(DEV), None, None, mean, rstd, True,
                                                   1e-5, [True, True, True])
    xd, gd, wd = x.double(), g.double(), w.double()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    ym, ymean, yrstd = torch.ops.aten.native_batch_norm(xd, wd, b.double(), None, None, True, 0.1, 1e-5)
    torch.testing.assert_close(mean.cpu().double(), ymean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd.cpu().double(), yrstd, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y.cpu().double(), ym, rtol=tol, atol=tol)
    want = torch.ops.aten.native_batch_norm_backward(gd, xd, wd, None, None, mean.cpu().double(),
                                                    rstd.cpu().double(), True, 1e-5, [True, True, True])
    for k in range(3):
        torch.testing.assert_close(got[k].cpu().double(), want[k], rtol=tol, atol=tol)
    assert not got[0][:, [3, 5, 6]].cpu().any()


@pytest.mark.parametrize("shape", [(16, 8, 4, 4), (3, 5, 6, 7), (2, 4, 1, 1), (2, 3, 40, 3)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_and_group_norm_on_bf16_rows(shape, channels_last):
    # bf16 activations with f32 parameters (autocast's batch / group norm):
    # the statistics and both gradients as CPU computes them, to bf16's
    # precision, whether the rows are read in place as vectors (unit spatial
    # stride: 4 x 4 planes, a 16-element tail of 42, planes of 1) or through
    # the buffered path (channels-last: spatial stride C); training and
    # evaluation, and the two layouts agree with each other
    C = shape[1]
    x = (sample(shape, torch.float32) * 2 + 1).to(torch.bfloat16)
    g = sample(shape, torch.float32, 4).to(torch.bfloat16)
    w, b = sample((C,), torch.float32, 1), sample((C,), torch.float32, 2)
    rm, rv = sample((C,), torch.float32, 3), torch.rand(C) + 0.5
    if channels_last:
        x, g = x.contiguous(memory_format=torch.channels_last), g.contiguous(memory_format=torch.channels_last)
    for train in (True, False):
        got = torch.ops.aten.native_batch_norm(x.to(DEV), w.to(DEV), b.to(DEV), rm.to(DEV), rv.to(DEV), train, 0.1,
                                               1e-5)
        want = torch.ops.aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), train, 0.1, 1e-5)
        close(got[0], want[0], 2e-2)
        if train:
            close(got[1], want[1], 1e-5)
            close(got[2], want[2], 1e-4)
        gb = torch.ops.aten.native_batch_norm_backward(g.to(DEV), x.to(DEV), w.to(DEV), rm.to(DEV), rv.to(DEV),
                                                      got[1], got[2], train, 1e-5, [True, True, True])
        wb = torch.ops.aten.native_batch_norm_backward(g, x, w, rm, rv, want[1], want[2], train, 1e-5,
                                                      [True, True, True])
        for k in range(3):
            close(gb[k], wb[k], 2e-2)
    if C % 2 == 0 and shape[0] > 1:
        G = 2
        y = torch.ops.aten.native_group_norm(x.to(DEV), w.to(DEV), b.to(DEV), shape[0], C, x[0, 0].numel(), G, 1e-5)
        yc = torch.ops.aten.native_group_norm(x, w, b, shape[0], C, x[0, 0].numel(), G, 1e-5)
        close(y[0], yc[0], 2e-2)
        gy = torch.ops.aten.native_group_norm_backward(g.to(DEV), x.to(DEV), y[1], y[2], w.to(DEV), shape[0], C,
                                                      x[0, 0].numel(), G, [True, True, True])
        gc = torch.ops.aten.native_group_norm_backward(g, x, yc[1], yc[2], w, shape[0], C, x[0, 0].numel(), G,
                                                      [True, True, True])
        for k in range(3):
            close(gy[k], gc[k], 2e-2)
    no_family_fallback()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 6, 8, 8), (3, 4, 5, 7)])
def test_group_norm_weight_gradient_same_bits_with_or_without_input_gradient(dtype, shape):
    # with the input gradient asked for, the weight and bias gradients come
    # from the row sums that pass already made (one pass over dy and x
    # fewer); they are the same bits as when only they are asked for, and
    # match CPU
    N, C = shape[:2]
    HW = shape[2] * shape[3]
    x = sample(shape, torch.float32).to(dtype)
    g = sample(shape, torch.float32, 5).to(dtype)
    w = sample((C,), torch.float32, 1)
    b = sample((C,), torch.float32, 2)
    _, mean, rstd = torch.ops.aten.native_group_norm(x.to(DEV), w.to(DEV), b.to(DEV), N, C, HW, 2, 1e-5)
    args = (g.to(DEV), x.to(DEV), mean, rstd, w.to(DEV), N, C, HW, 2)
    full = torch.ops.aten.native_group_norm_backward(*args, [True, True, True])
    params = torch.ops.aten.native_group_norm_backward(*args, [False, True, True])
    assert torch.equal(full[1].cpu(), params[1].cpu()) and torch.equal(full[2].cpu(), params[2].cpu())
    _, mc, rc = torch.ops.aten.native_group_norm(x, w, b, N, C, HW, 2, 1e-5)
    want = torch.ops.aten.native_group_norm_backward(g, x, mc, rc, w, N, C, HW, 2, [True, True, True])
    for k in range(3):
        close(full[k], want[k], TOL[dtype] if dtype == torch.bfloat16 else 1e-4)
    no_family_fallback()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape,G", [((2, 160, 11, 13), 2), ((3, 8, 2, 8), 4), ((2, 4, 64, 3), 2)])
def test_batch_and_group_norm_of_offset_data_match_float64(dtype, shape, G):
    # statistics of data far from zero (mean 300, std 1) against the float64
    # computation: one-pass moments keep them to float64 precision as two
    # passes do; rows of 143 elements (four-way blocks, the rotating sets, a
    # tail), of 16 (one short row), of 192 (whole blocks), groups of 80
    # channels (normalized and differentiated in two channel blocks); batch
    # norm's 160 channels: affine maps in blocks of 64 and 16 channels a thread
    N, C = shape[:2]
    HW = shape[2] * shape[3]
    x = (sample(shape, torch.float64) + 300).to(dtype)
    g = sample(shape, torch.float64, 5).to(dtype)
    w, b = sample((C,), torch.float64, 1).to(dtype), sample((C,), torch.float64, 2).to(dtype)
    xd, gd, wd, bd = x.double(), g.double(), w.double(), b.double()
    y, mean, rstd = torch.ops.aten.native_group_norm(x.to(DEV), w.to(DEV), b.to(DEV), N, C, HW, G, 1e-5)
    yd, md, rd = torch.ops.aten.native_group_norm(xd, wd, bd, N, C, HW, G, 1e-5)
    # (statistics come out in the input's dtype: bf16 ones to its rounding)
    stat_tol = {torch.float32: 1e-6, torch.bfloat16: 2.0 ** -8, torch.float64: 1e-12}[dtype]
    # the statistics of the same (rounded) inputs, to the output's rounding
    assert torch.allclose(mean.cpu().double(), md, rtol=stat_tol, atol=0)
    assert torch.allclose(rstd.cpu().double(), rd, rtol=stat_tol * 10, atol=0)
    out_tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float64: 1e-10}[dtype]
    torch.testing.assert_close(y.cpu().double(), yd, rtol=out_tol, atol=out_tol)
    gt = torch.ops.aten.native_group_norm_backward(g.to(DEV), x.to(DEV), mean, rstd, w.to(DEV), N, C, HW, G,
                                                  [True, True, True])
    # (from the statistics the device gave, checked above: bf16 ones are rounded)
    gw = torch.ops.aten.native_group_norm_backward(gd, xd, mean.cpu().double(), rstd.cpu().double(), wd, N, C, HW, G,
                                                  [True, True, True])
    for k in range(3):
        scale = gw[k].abs().max().item()
        torch.testing.assert_close(gt[k].cpu().double(), gw[k], rtol=out_tol * 4, atol=out_tol * 4 * scale)
    yb, bm, bi = torch.ops.aten.native_batch_norm(x.to(DEV), w.to(DEV), b.to(DEV), None, None, True, 0.1, 1e-5)
    ybd, bmd, bid = torch.ops.aten.native_batch_norm(xd, wd, bd, None, None, True, 0.1, 1e-5)
    assert torch.allclose(bm.cpu().double(), bmd, rtol=stat_tol, atol=0)
    assert torch.allclose(bi.cpu().double(), bid, rtol=stat_tol * 10, atol=0)
    # f32 batch norm normalizes with the f32 mean (as CPU does): |mean| * 2^-24 * rstd more
    bn_tol = out_tol + (300 * 2.0 ** -23 if dtype == torch.float32 else 0)
    torch.testing.assert_close(yb.cpu().double(), ybd, rtol=out_tol, atol=bn_tol)
    no_family_fallback()
