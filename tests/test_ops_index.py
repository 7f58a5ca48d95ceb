"""Indexing and shape ops on the tpu device vs PyTorch CPU: index_select,
gather, scatter (+reductions), index_add, advanced indexing (get / put with
bool masks), masked_fill / masked_select, nonzero, embedding (+backward),
cat / stack, flip, roll, tril / triu, padding, arange / linspace / eye,
sort / topk / argsort / unique; out-of-range indices raise the CPU's class at
the next sync naming the op (RuntimeError for gather / scatter / index_add,
IndexError otherwise), and the device keeps working."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import rnd

DT = "tpu"
FLOATS = [torch.float32, torch.bfloat16, torch.float64, torch.float16]


def same(d, c, exact=True, **kw):
    d = d.cpu()
    assert d.dtype == c.dtype, (d.dtype, c.dtype)
    assert d.shape == c.shape, (d.shape, c.shape)
    if exact:
        assert torch.equal(d, c), (d, c)
    else:
        torch.testing.assert_close(d, c, **kw)


def _has(fn):
    """True if fn runs on the device (ops owned by other modules may be missing)."""
    try:
        fn()
        torch.tpu.synchronize()
        return True
    except NotImplementedError:
        return False


# ------------------------------------------------------------- index_select

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dtype, dim):
    x = rnd((5, 6, 7), dtype)
    idx = torch.tensor([4, 0, 2, 2, 1])
    same(x.to(DT).index_select(dim, idx.to(DT)), x.index_select(dim, idx))
    same(x.to(DT).index_select(dim, idx.int().to(DT)), x.index_select(dim, idx.int()))


def test_index_select_noncontig_and_out():
    x = rnd((6, 8)).t()
    idx = torch.tensor([1, 3, 5])
    out = torch.empty(0, device=DT)
    r = torch.index_select(x.to(DT).t().t(), 1, idx.to(DT), out=out)
    assert r is out
    same(out, x.index_select(1, idx))
    same(x.to(DT)[:, ::2].index_select(0, idx.to(DT)), x[:, ::2].index_select(0, idx))


def test_index_select_out_of_range():
    x = torch.arange(3.0, device=DT)
    r = x.index_select(0, torch.tensor([0, 12], device=DT))
    with pytest.raises(IndexError, match="index_select.*index 12 is out of bounds for dimension 0 with size 3"):
        r.cpu()
    same(x.index_select(0, torch.tensor([2], device=DT)), torch.tensor([2.0]))


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.bfloat16, torch.int16, torch.float32, torch.int32,
                                   torch.float64, torch.int64, torch.complex64], ids=str)
def test_index_select_of_single_elements(dtype):
    # slices of one element (a vector, [n, 1] rows, a strided column) take
    # a typed loop per element size: every size, int32 and int64 indices,
    # strided indices, and the first bad index named after a good run
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5000, 3, generator=g) * 100).to(dtype)
    idx = torch.randint(0, 5000, (2 * 40001,), generator=g)
    for src in (x[:, 0].contiguous(), x[:, 1], x[:, :1]):
        for ix in (idx[::2], idx[::2].int(), idx[:40001]):
            same(src.to(DT).index_select(0, ix.to(DT)), src.index_select(0, ix))
    bad = torch.cat([idx[:30000], torch.tensor([5000, 7000])])
    r = x[:, 0].to(DT).index_select(0, bad.to(DT))
    with pytest.raises(IndexError, match="index 5000 is out of bounds for dimension 0 with size 5000"):
        r.cpu()
    same(x[:, 0].to(DT).index_select(0, idx[:5].to(DT)), x[:, 0].index_select(0, idx[:5]))


# --------------------------------------------------------------- gather

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float16])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_gather(dtype, dim):
    x = rnd((4, 5, 6), dtype)
    g = torch.Generator().manual_seed(1)
    shape = [3, 4, 5]
    idx = torch.randint(0, x.shape[dim], shape, generator=g)
    same(torch.gather(x.to(DT), dim, idx.to(DT)), torch.gather(x, dim, idx))


def test_gather_noncontig_out_and_error():
    x = rnd((6, 5)).t()
    idx = torch.tensor([[0, 5, 1], [2, 2, 3]])
    out = torch.empty(0, device=DT)
    torch.gather(x.to(DT), 1, idx.to(DT), out=out)
    same(out, torch.gather(x, 1, idx))
    bad = torch.gather(x.to(DT), 1, torch.tensor([[0, 9]], device=DT))
    with pytest.raises(RuntimeError, match="gather.*index 9 is out of bounds for dimension 1 with size 6"):
        torch.tpu.synchronize()
    del bad
    same(torch.gather(x.to(DT), 0, (idx[:, :1] % 5).to(DT)), torch.gather(x, 0, idx[:, :1] % 5))


# -------------------------------------------------------------- scatter

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
def test_scatter_src_value(dtype):
    x = rnd((5, 6), dtype)
    src = rnd((3, 6), dtype, seed=3)
    # unique destinations per column (assign order is otherwise undefined)
    idx = torch.stack([torch.randperm(5, generator=torch.Generator().manual_seed(i))[:3] for i in range(6)], 1)
    same(x.to(DT).scatter(0, idx.to(DT), src.to(DT)), x.scatter(0, idx, src))
    same(x.to(DT).scatter(0, idx.to(DT), 7), x.scatter(0, idx, 7))
    y = x.to(DT)
    y.scatter_(0, idx.to(DT), src.to(DT))
    same(y, x.clone().scatter_(0, idx, src))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_scatter_add(dtype):
    x = rnd((4, 7), dtype)
    src = rnd((6, 7), dtype, seed=5)
    idx = torch.randint(0, 4, (6, 7), generator=torch.Generator().manual_seed(2))
    same(x.to(DT).scatter_add(0, idx.to(DT), src.to(DT)), x.scatter_add(0, idx, src),
         exact=not dtype.is_floating_point)
    same(x.to(DT).scatter_add(1, (idx[:4] % 7).to(DT), src.to(DT)[:4]), x.scatter_add(1, idx[:4] % 7, src[:4]),
         exact=not dtype.is_floating_point)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(reduce, include_self, dtype):
    x = rnd((5, 4), dtype)
    src = rnd((8, 4), dtype, seed=9)
    if dtype == torch.float32:
        src = src.abs() + 0.5 if reduce == "prod" else src
    idx = torch.randint(0, 5, (8, 4), generator=torch.Generator().manual_seed(4))
    got = x.to(DT).scatter_reduce(0, idx.to(DT), src.to(DT), reduce, include_self=include_self)
    same(got, x.scatter_reduce(0, idx, src, reduce, include_self=include_self), exact=False)


def test_scatter_legacy_reduce_and_error():
    x = rnd((3, 3))
    idx = torch.tensor([[0, 1, 2], [0, 0, 0]])
    src = rnd((2, 3), seed=1)
    same(x.to(DT).scatter(0, idx.to(DT), src.to(DT), reduce="multiply"), x.scatter(0, idx, src, reduce="multiply"),
         exact=False)
    same(x.to(DT).scatter(0, idx.to(DT), 2.0, reduce="add"), x.scatter(0, idx, 2.0, reduce="add"), exact=False)
    y = x.to(DT).scatter_add(0, torch.tensor([[3, 0, 0]], device=DT), src.to(DT)[:1])
    with pytest.raises(RuntimeError, match="scatter_add.*index 3 is out of bounds for dimension 0 with size 3"):
        y.cpu()


def test_index_add():
    x = rnd((5, 3))
    src = rnd((4, 3), seed=2)
    idx = torch.tensor([1, 1, 4, 0])
    same(x.to(DT).index_add(0, idx.to(DT), src.to(DT), alpha=2.0), x.index_add(0, idx, src, alpha=2.0), exact=False)
    y = x.to(DT)
    s2 = rnd((2, 5), seed=6).t()  # non-contiguous source
    y.index_add_(1, torch.tensor([2, 0], device=DT), s2.to(DT))
    torch.testing.assert_close(y.cpu(), x.clone().index_add_(1, torch.tensor([2, 0]), s2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("expanded", [False, True])
def test_index_add_reduced_float_rounds_each_destination_once(dtype, expanded):
    """A destination's contributions are summed in float and rounded once
    (the CPU's own result for fuzz seed 58105: 2.578 + 2.9375 - 1.828 - 1.039
    - 2.734 in bfloat16 is -0.0859375; rounding after each addition gave
    -0.109375)."""
    x = torch.tensor([[0.0, 0.0], [2.578125, 1.0], [0.0, 0.0]], dtype=dtype)
    src = torch.tensor([[2.9375, 0.5], [-1.828125, 0.25], [-1.0390625, 0.125], [-2.734375, 0.0625]], dtype=dtype)
    idx = torch.tensor([1]).expand(4) if expanded else torch.tensor([1, 1, 1, 1])
    want = x.double().index_add(0, idx, src.double(), alpha=2).to(dtype)
    got = x.to(DT).index_add_(0, idx.to(DT), src.to(DT), alpha=2).cpu()
    assert torch.equal(got, want), (got, want)
    one = x.double().index_add(0, idx, src.double()).to(dtype)
    assert torch.equal(x.to(DT).index_add(0, idx.to(DT), src.to(DT)).cpu(), one)


# ----------------------------------------------------- advanced indexing

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_index_get(dtype):
    x = rnd((4, 5, 6), dtype)
    d = x.to(DT)
    i = torch.tensor([3, 0, -1])
    j = torch.tensor([[1], [3]])
    same(d[i.to(DT)], x[i])
    same(d[:, i.to(DT)], x[:, i])
    same(d[i.to(DT), :, j.to(DT)], x[i, :, j])  # non-adjacent: transposed to the front
    same(d[j.to(DT), i.to(DT)], x[j, i])
    same(d[..., [0, 5]], x[..., [0, 5]])
    same(d[1, [2, 3]], x[1, [2, 3]])


def test_index_bool_mask_and_masked_select():
    x = rnd((4, 5))
    m = x > 0
    d = x.to(DT)
    same(d[m.to(DT)], x[m])
    same(d[m.to(DT)[:, 0]], x[m[:, 0]])
    same(torch.masked_select(d, m.to(DT)), torch.masked_select(x, m))
    same(torch.masked_select(d, m[0].to(DT)), torch.masked_select(x, m[0]))  # broadcast
    out = torch.empty(0, device=DT)
    torch.masked_select(d, m.to(DT), out=out)
    same(out, torch.masked_select(x, m))


def test_index_out_of_range():
    d = torch.arange(6.0, device=DT).view(2, 3)
    r = d[:, torch.tensor([0, 12], device=DT)]
    with pytest.raises(IndexError, match="index.*index 12 is out of bounds for dimension 0 with size 3"):
        r.cpu()
    same(d[:, torch.tensor([-1], device=DT)], torch.tensor([[2.0], [5.0]]))


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float64])
def test_index_put(accumulate, dtype):
    x = rnd((5, 4), dtype)
    v = rnd((3, 4), dtype, seed=3)
    idx = torch.tensor([4, 1, 4]) if accumulate else torch.tensor([4, 1, 0])
    d = x.to(DT)
    d.index_put_((idx.to(DT),), v.to(DT), accumulate=accumulate)
    same(d, x.clone().index_put_((idx,), v, accumulate=accumulate), exact=not dtype.is_floating_point)
    d2 = x.to(DT)
    d2.index_put_((idx.to(DT), torch.tensor([0, 1, 3], device=DT)), torch.tensor(5, dtype=dtype, device=DT),
                  accumulate=accumulate)
    c2 = x.clone().index_put_((idx, torch.tensor([0, 1, 3])), torch.tensor(5, dtype=dtype), accumulate=accumulate)
    same(d2, c2, exact=not dtype.is_floating_point)


def test_setitem_forms():
    x = rnd((4, 6))
    d = x.to(DT)
    c = x.clone()
    d[(x > 0).to(DT)] = 0.5
    c[c > 0] = 0.5
    same(d, c)
    d[[1, 3]] = torch.ones(6, device=DT)
    c[[1, 3]] = torch.ones(6)
    same(d, c)
    d[:, torch.tensor([0, 2], device=DT)] = -1.0
    c[:, torch.tensor([0, 2])] = -1.0
    same(d, c)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        d[[0, 1]] = torch.ones(3, device=DT)


def test_index_put_out_of_range_then_device_works():
    d = torch.zeros(3, device=DT)
    d[torch.tensor([5], device=DT)] = 1.0
    with pytest.raises(IndexError, match="index_put_.*index 5 is out of bounds"):
        torch.tpu.synchronize()
    d[torch.tensor([2], device=DT)] = 1.0
    same(d, torch.tensor([0.0, 0.0, 1.0]))


# -------------------------------------------------- masked_fill, nonzero

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.float64])
def test_masked_fill(dtype):
    x = rnd((4, 6), dtype)
    m = rnd((4, 6), torch.bool, seed=7)
    same(x.to(DT).masked_fill(m.to(DT), 1), x.masked_fill(m, 1))
    same(x.to(DT).masked_fill(m[0].to(DT), 0), x.masked_fill(m[0], 0))
    same(x.to(DT).masked_fill(m.to(DT), torch.tensor(1, dtype=dtype, device=DT)), x.masked_fill(m, torch.tensor(1, dtype=dtype)))
    same(x.to(DT).masked_fill(m.to(DT), torch.tensor(1)), x.masked_fill(m, torch.tensor(1)))
    y = x.to(DT).t()
    y.masked_fill_(m.t().to(DT), 0)
    same(y, x.t().masked_fill(m.t(), 0))


def test_masked_fill_value_conversion_broadcast_errors_and_grad():
    m = rnd((3, 4), torch.bool, seed=2)
    # the value takes self's dtype as on the CPU: bool(0.5) is True, int(2.7) is 2
    for x, v in ((torch.zeros(3, 4, dtype=torch.bool), 0.5), (torch.zeros(3, 4, dtype=torch.int64), 2.7),
                 (torch.zeros(3, 4, dtype=torch.float16), 1e-3), (torch.zeros(3, 4), -float("inf"))):
        same(x.to(DT).masked_fill(m.to(DT), v), x.masked_fill(m, v))
    # out-of-place broadcasts self against a larger mask; in-place does not
    x = rnd((4,))
    same(x.to(DT).masked_fill(m.to(DT), 7.0), x.masked_fill(m, 7.0))
    with pytest.raises(RuntimeError, match="must match the size of the tensor"):
        x.to(DT).masked_fill_(m.to(DT), 1.0)
    with pytest.raises(RuntimeError, match="only supports boolean masks"):
        x.to(DT).masked_fill(m.long().to(DT)[0], 1.0)
    with pytest.raises(RuntimeError, match="0-dimensional value tensor"):
        x.to(DT).masked_fill(m[0].to(DT), torch.ones(2, device=DT))
    # a host mask is moved to the device; gradients flow to self and the value
    w = rnd((3, 4), seed=4).requires_grad_()
    val = torch.tensor(2.0, requires_grad=True)
    wd = w.detach().to(DT).requires_grad_()
    vd = val.detach().to(DT).requires_grad_()
    (w.masked_fill(m, val) * torch.arange(12.0).view(3, 4)).sum().backward()
    (wd.masked_fill(m, vd) * torch.arange(12.0).view(3, 4).to(DT)).sum().backward()
    same(wd.grad, w.grad)
    same(vd.grad, val.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool, torch.float16])
def test_nonzero(dtype):
    x = rnd((5, 7, 3), dtype)
    x.view(-1)[::4] = 0
    same(torch.nonzero(x.to(DT)), torch.nonzero(x))
    same(x.to(DT).transpose(0, 2).nonzero(), x.transpose(0, 2).nonzero())
    same(torch.zeros(4, device=DT).nonzero(), torch.zeros(4).nonzero())
    same(torch.tensor(1.0, device=DT).nonzero(), torch.tensor(1.0).nonzero())
    assert [t.cpu().tolist() for t in torch.nonzero(x.to(DT), as_tuple=True)] == [t.tolist() for t in torch.nonzero(x, as_tuple=True)]
    same(torch.tensor([-0.0, float("nan")], device=DT).nonzero(), torch.tensor([-0.0, float("nan")]).nonzero())


# ------------------------------------------------------------- embedding

def test_embedding_forward_backward():
    w = rnd((10, 4)).requires_grad_()
    wd = w.detach().to(DT).requires_grad_()
    idx = torch.tensor([[1, 2, 1], [9, 0, 1]])
    out = F.embedding(idx, w, padding_idx=0)
    outd = F.embedding(idx.to(DT), wd, padding_idx=0)
    same(outd, out.detach())
    g = rnd((2, 3, 4), seed=3)
    out.backward(g)
    outd.backward(g.to(DT))
    same(wd.grad, w.grad, exact=False)
    # scale_grad_by_freq
    w.grad = None
    wd.grad = None
    F.embedding(idx, w, scale_grad_by_freq=True).backward(g)
    F.embedding(idx.to(DT), wd, scale_grad_by_freq=True).backward(g.to(DT))
    same(wd.grad, w.grad, exact=False)


def test_embedding_out_of_range():
    w = torch.zeros(3, 2, device=DT)
    r = F.embedding(torch.tensor([12], device=DT), w)
    with pytest.raises(IndexError, match="index 12 is out of bounds"):
        r.cpu()
    same(F.embedding(torch.tensor([1], device=DT), w), torch.zeros(1, 2))


# --------------------------------------------------- cat, stack, flip...

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_cat_stack(dtype):
    a, b, c = rnd((2, 3), dtype), rnd((4, 3), dtype, 1), rnd((1, 3), dtype, 2)
    same(torch.cat([a.to(DT), b.to(DT), c.to(DT)]), torch.cat([a, b, c]))
    same(torch.cat([a.to(DT).t(), a.to(DT).t()], 1), torch.cat([a.t(), a.t()], 1))
    same(torch.cat([a.to(DT), torch.empty(0, dtype=dtype, device=DT)]), torch.cat([a, torch.empty(0, dtype=dtype)]))
    same(torch.stack([a.to(DT), a.to(DT)], 1), torch.stack([a, a], 1))
    out = torch.empty(0, dtype=dtype, device=DT)
    torch.cat([a.to(DT), b.to(DT)], out=out)
    same(out, torch.cat([a, b]))


def test_cat_promotion_and_errors():
    a, b = rnd((2, 3)), rnd((2, 3), torch.int64)
    same(torch.cat([a.to(DT), b.to(DT)]), torch.cat([a, b]))
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([a.to(DT), rnd((2, 4)).to(DT)])


def test_cat_grad():
    a, b = rnd((2, 3)).requires_grad_(), rnd((1, 3), seed=1).requires_grad_()
    ad, bd = a.detach().to(DT).requires_grad_(), b.detach().to(DT).requires_grad_()
    g = rnd((3, 3), seed=2)
    torch.cat([a, b]).backward(g)
    torch.cat([ad, bd]).backward(g.to(DT))
    same(ad.grad, a.grad)
    same(bd.grad, b.grad)


def test_split_chunk_repeat_flip_roll():
    x = rnd((6, 5))
    d = x.to(DT)
    for p, q in zip(torch.split(d, [2, 4]), torch.split(x, [2, 4])):
        same(p, q)
    for p, q in zip(d.chunk(3, 1), x.chunk(3, 1)):
        same(p, q)
    same(d.repeat(2, 1, 3), x.repeat(2, 1, 3))
    same(d.flip(0), x.flip(0))
    same(d.flip(0, 1), x.flip(0, 1))
    same(d.t().flip(-1), x.t().flip(-1))
    same(d.roll(2, 0), x.roll(2, 0))
    same(d.roll((-1, 7), (0, 1)), x.roll((-1, 7), (0, 1)))
    same(d.roll(3), x.roll(3))


@pytest.mark.parametrize("diag", [-2 ** 63, -9, -4, -2, 0, 1, 5, 6, 2 ** 63 - 1])
def test_tril_triu(diag):
    x = rnd((3, 4, 5))
    d = x.to(DT)
    same(d.tril(diag), x.tril(diag))
    same(d.triu(diag), x.triu(diag))
    same(d.transpose(1, 2).triu(diag), x.transpose(1, 2).triu(diag))
    y = d.clone()
    y.tril_(diag)
    same(y, x.tril(diag))
    y = d.clone()
    y.triu_(diag)
    same(y, x.triu(diag))
    b = (rnd((2, 7, 3)) * 100).to(torch.int16)
    same(b.to(DT).tril(diag), b.tril(diag))
    same(b.to(DT)[:, ::2].triu(diag), b[:, ::2].triu(diag))


def test_padding_modes():
    x = rnd((2, 3, 6, 7))
    d = x.to(DT)
    same(F.pad(d, (2, 1, 1, 3), mode="reflect"), F.pad(x, (2, 1, 1, 3), mode="reflect"))
    same(F.pad(d, (2, 1, 1, 3), mode="replicate"), F.pad(x, (2, 1, 1, 3), mode="replicate"))
    same(F.pad(d[0], (3, 2), mode="reflect"), F.pad(x[0], (3, 2), mode="reflect"))
    same(F.pad(d[0], (3, 2), mode="replicate"), F.pad(x[0], (3, 2), mode="replicate"))
    same(F.pad(d, (1, 2, 0, 1), value=3.5), F.pad(x, (1, 2, 0, 1), value=3.5))
    same(F.pad(d, (-1, 2)), F.pad(x, (-1, 2)))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_padding_backward(mode):
    x = rnd((2, 3, 5, 6)).requires_grad_()
    xd = x.detach().to(DT).requires_grad_()
    g = rnd((2, 3, 8, 9), seed=4)
    F.pad(x, (2, 1, 1, 2), mode=mode).backward(g)
    F.pad(xd, (2, 1, 1, 2), mode=mode).backward(g.to(DT))
    same(xd.grad, x.grad, exact=False)
    x1 = rnd((2, 5)).requires_grad_()
    x1d = x1.detach().to(DT).requires_grad_()
    g1 = rnd((2, 9), seed=5)
    F.pad(x1.unsqueeze(0), (3, 1), mode=mode).backward(g1.unsqueeze(0))
    F.pad(x1d.unsqueeze(0), (3, 1), mode=mode).backward(g1.to(DT).unsqueeze(0))
    same(x1d.grad, x1.grad, exact=False)


def test_factories():
    same(torch.arange(10, device=DT), torch.arange(10))
    same(torch.arange(2, 11, 3, device=DT), torch.arange(2, 11, 3))
    same(torch.arange(-1.5, 2.0, 0.25, device=DT), torch.arange(-1.5, 2.0, 0.25))
    same(torch.arange(5, 0, -2, dtype=torch.float64, device=DT), torch.arange(5, 0, -2, dtype=torch.float64))
    same(torch.arange(0, 1, 0.1, dtype=torch.bfloat16, device=DT), torch.arange(0, 1, 0.1, dtype=torch.bfloat16),
         exact=False)
    same(torch.linspace(-2, 3, 11, device=DT), torch.linspace(-2, 3, 11), exact=False)
    same(torch.linspace(0, 10, 7, dtype=torch.float64, device=DT), torch.linspace(0, 10, 7, dtype=torch.float64),
         exact=False)
    same(torch.linspace(0, 10, 1, device=DT), torch.linspace(0, 10, 1))
    same(torch.linspace(0, 10, 5, dtype=torch.int64, device=DT), torch.linspace(0, 10, 5, dtype=torch.int64))
    same(torch.eye(3, device=DT), torch.eye(3))
    same(torch.eye(2, 4, dtype=torch.int32, device=DT), torch.eye(2, 4, dtype=torch.int32))
    same(torch.full((2, 3), 7.0, device=DT), torch.full((2, 3), 7.0))
    out = torch.empty(3, device=DT)
    torch.arange(4, out=out)
    same(out, torch.arange(4.0))


# ----------------------------------------------------- sort, topk, unique

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.float64, torch.int16])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(dtype, descending):
    x = rnd((6, 40), dtype)
    if dtype.is_floating_point:
        x[0, 3] = float("nan")
        x[2, 5] = float("inf")
    x[1, :10] = 3  # ties: stable order
    d = x.to(DT)
    v, i = torch.sort(d, dim=1, descending=descending, stable=True)
    cv, ci = torch.sort(x, dim=1, descending=descending, stable=True)
    same(v, cv, exact=False, equal_nan=True, atol=0, rtol=0)
    same(i, ci)
    v, i = torch.sort(d.t(), dim=0, descending=descending, stable=True)
    cv, ci = torch.sort(x.t(), dim=0, descending=descending, stable=True)
    same(v, cv, exact=False, equal_nan=True, atol=0, rtol=0)
    same(i, ci)
    same(torch.argsort(d, dim=-1, stable=True), torch.argsort(x, dim=-1, stable=True))


def test_sort_results_keep_the_inputs_layout_as_on_cpu():
    # sort's results are dense in the input's layout (PyTorch's meta function): a reshape of the
    # results of a transposed input copies, so writing into it leaves the results alone — on tpu too
    x = rnd((5, 3, 7, 32)).to(torch.bfloat16).transpose(1, 3)
    v, i = torch.sort(x.to(DT), dim=3)
    cv, ci = torch.sort(x, dim=3)
    assert v.stride() == cv.stride() and i.stride() == ci.stride() == (672, 1, 32, 224)
    same(i, ci)
    r, cr = i.reshape(16, 42, 5), ci.reshape(16, 42, 5)
    r[[0, 3]] = 7
    cr[[0, 3]] = 7
    same(i, ci)
    same(r, cr)
    assert torch.argsort(x.to(DT), dim=1).stride() == torch.argsort(x, dim=1).stride()
    # an out tensor of the right size keeps its own strides; an empty one takes the input's layout
    v, i = torch.empty(5, 32, 7, 3, device=DT, dtype=torch.bfloat16), torch.empty(0, dtype=torch.long, device=DT)
    torch.sort(x.to(DT), dim=3, out=(v, i))
    assert v.is_contiguous() and i.stride() == ci.stride()
    same(v, cv)
    same(i, ci)


def test_sort_out_and_inplace_alias():
    x = rnd((3, 9))
    v, i = torch.empty(0, device=DT), torch.empty(0, dtype=torch.long, device=DT)
    torch.sort(x.to(DT), 1, out=(v, i))
    cv, ci = torch.sort(x, 1)
    same(v, cv)
    same(i, ci)


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    x = torch.randperm(60, generator=torch.Generator().manual_seed(3)).float().view(4, 15)
    d = x.to(DT)
    v, i = torch.topk(d, 5, dim=1, largest=largest)
    cv, ci = torch.topk(x, 5, dim=1, largest=largest)
    same(v, cv)
    same(i, ci)
    v, i = torch.topk(d, 2, dim=0, largest=largest)
    cv, ci = torch.topk(x, 2, dim=0, largest=largest)
    same(v, cv)
    same(i, ci)
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        torch.topk(d, 16, dim=1)


def test_unique():
    x = torch.tensor([[3, 1, 2], [1, 3, 7]])
    d = x.to(DT)
    same(torch.unique(d), torch.unique(x))
    u, inv, cnt = torch.unique(d, return_inverse=True, return_counts=True)
    cu, cinv, ccnt = torch.unique(x, return_inverse=True, return_counts=True)
    same(u, cu)
    same(inv, cinv)
    same(cnt, ccnt)
    f = torch.tensor([0.5, -1.0, 0.5, 2.0])
    same(torch.unique(f.to(DT)), torch.unique(f))


def test_gather_scatter_accept_int32_indices_like_cpu():
    x = torch.randn(10, 5)
    idx = torch.tensor([[0, 9, 3], [2, 3, 1]], dtype=torch.int32)
    assert torch.equal(torch.gather(x.to("tpu"), 0, idx.to("tpu")).cpu(), torch.gather(x, 0, idx))
    src = torch.randn(2, 3)
    ref = torch.zeros(10, 5).scatter(0, idx, src)
    got = torch.zeros(10, 5, device="tpu").scatter(0, idx.to("tpu"), src.to("tpu"))
    assert torch.equal(got.cpu(), ref)
    with pytest.raises(RuntimeError, match="Expected dtype int32/int64 for index"):
        torch.gather(x.to("tpu"), 0, idx.to(torch.int16).to("tpu"))
    # 0-dim self and index, as on CPU
    s0, i1 = torch.tensor(2.5), torch.tensor([0])
    assert torch.equal(torch.gather(s0.to("tpu"), 0, i1.to("tpu")).cpu(), torch.gather(s0, 0, i1))
    assert torch.equal(torch.gather(s0.to("tpu"), 0, i1[0].to("tpu")).cpu(), torch.gather(s0, 0, i1[0]))
    sd = s0.to("tpu").requires_grad_(True)
    torch.gather(sd, 0, i1.to("tpu")).sum().backward()  # scatter_add into a 0-dim gradient
    assert sd.grad.item() == 1.0
    # an empty index of any dtype reads nothing, as on CPU
    assert torch.gather(x[0].to("tpu"), 0, torch.tensor([]).to("tpu")).numel() == 0
    assert torch.equal(torch.zeros(5, device="tpu").scatter(0, torch.tensor([]).to("tpu"),
                                                            torch.tensor([]).to("tpu")).cpu(), torch.zeros(5))


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices], ids=lambda f: f.__name__)
def test_tril_and_triu_indices(fn):
    # every (rows, cols, offset) of a small grid, both index dtypes, like CPU;
    # a large one (closed-form row starts, rows split over threads)
    for r in (0, 1, 3, 4, 7):
        for c in (0, 1, 3, 5, 9):
            for k in (-10, -3, -1, 0, 1, 2, 4, 12):
                for dt in (torch.long, torch.int32):
                    got = fn(r, c, k, dtype=dt, device=DT)
                    assert got.device.type == "tpu" and got.dtype == dt
                    assert torch.equal(got.cpu(), fn(r, c, k, dtype=dt)), (r, c, k, dt)
    assert torch.equal(fn(1500, 700, -20, device=DT).cpu(), fn(1500, 700, -20))
    assert torch.equal(fn(300, 2000, 37, device=DT).cpu(), fn(300, 2000, 37))


def test_tril_and_triu_indices_bad_arguments():
    with pytest.raises(RuntimeError, match="row must be non-negative"):
        torch.tril_indices(-1, 3, device=DT)
    with pytest.raises(RuntimeError, match="col must be non-negative"):
        torch.triu_indices(3, -2, device=DT)
    with pytest.raises(NotImplementedError, match="\"tril_indices\" not implemented for 'Float'"):
        torch.tril_indices(3, 3, dtype=torch.float32, device=DT)
    assert torch.triu_indices(2, 2, device=DT).cpu().tolist() == [[0, 0, 1], [0, 1, 1]]  # usable afterwards


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64], ids=str)
def test_bincount(dtype):
    # counts, float32 / float64 / integer weights (dtype as on CPU), minlength
    # below and above the data's range, an empty input
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (2000,), generator=g).to(dtype)
    d = x.to(DT)
    for w in (None, torch.rand(2000, generator=g), torch.rand(2000, generator=g, dtype=torch.float64),
              torch.randint(0, 5, (2000,), generator=g, dtype=torch.int32)):
        for minlength in (0, 10, 80):
            want = torch.bincount(x, w, minlength)
            got = torch.bincount(d, None if w is None else w.to(DT), minlength)
            assert got.device.type == "tpu" and got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want)
    empty = torch.tensor([], dtype=dtype)
    assert torch.equal(torch.bincount(empty.to(DT), minlength=3).cpu(), torch.bincount(empty, minlength=3))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.float32, torch.float64], ids=str)
def test_index_add_into_a_vector_counts_exactly(dtype):
    # a 1-D destination (bincount's histogram): integers counted in private
    # bins per chunk of the index and merged (wrapping like the CPU's
    # element-by-element adds), floats added in index order (the CPU's
    # bits); alpha, a strided index, many indices to few bins and to many
    g = torch.Generator().manual_seed(1)
    for bins, n in ((7, 100003), (1000, 1 << 20), (50000, 30011)):
        idx = torch.randint(0, bins, (2 * n,), generator=g)[::2]
        src = (torch.randint(0, 300, (n,), generator=g) if not dtype.is_floating_point
               else torch.randn(n, generator=g)).to(dtype)
        base = torch.zeros(bins, dtype=dtype) + 3
        alpha = 1 if dtype == torch.uint8 else 2
        want = base.clone().index_add_(0, idx, src, alpha=alpha)
        got = base.to(DT).index_add_(0, idx.to(DT), src.to(DT), alpha=alpha).cpu()
        assert torch.equal(got, want), (bins, n, (got != want).sum())
    x = torch.randint(0, 1000, (1 << 20,), generator=g)
    assert torch.equal(torch.bincount(x.to(DT)).cpu(), torch.bincount(x))
    # out of range: IndexError for a vector, RuntimeError for more dims, as on CPU
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.zeros(5, dtype=torch.int64, device=DT).index_add_(0, torch.tensor([1, 9] * 5000, device=DT),
                                                               torch.ones(10000, dtype=torch.int64, device=DT)).cpu()
    with pytest.raises(RuntimeError, match="out of bounds for dimension 0") as e:
        torch.zeros(5, 2, device=DT).index_add_(0, torch.tensor([9], device=DT), torch.ones(1, 2, device=DT)).cpu()
    assert e.type is RuntimeError
    assert torch.bincount(torch.tensor([2, 2], device=DT)).cpu().tolist() == [0, 0, 2]  # usable afterwards


def test_bincount_bad_input_like_cpu():
    cases = [(lambda d: torch.bincount(torch.tensor([-1, 2], device=d)), RuntimeError, "non-negative"),
             (lambda d: torch.bincount(torch.tensor([[1]], device=d)), RuntimeError, "1-d non-negative"),
             (lambda d: torch.bincount(torch.tensor([1.0], device=d)), NotImplementedError, "'Float'"),
             (lambda d: torch.bincount(torch.tensor([1, 2], device=d), torch.ones(3, device=d)), RuntimeError,
              "same length"),
             (lambda d: torch.bincount(torch.tensor([1], device=d), minlength=-1), RuntimeError, "minlength")]
    for f, exc, msg in cases:
        for dev in ("cpu", DT):
            with pytest.raises(exc, match=msg):
                f(dev)
    assert torch.bincount(torch.tensor([1, 1], device=DT)).cpu().tolist() == [0, 2]  # usable afterwards


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_index_add_rows_split_by_columns(mode, dtype):
    """index_add along dim 0 of a matrix (a graph network's message scatter)
    splits the columns over the threads: every element takes its
    contributions in index order, bit for bit the CPU's sums — repeated
    indices, alpha, widths that are no multiple of a column block, a
    transposed (strided) destination and source, and index_select's
    backward through autograd."""
    import torch_tpu

    g = torch.Generator().manual_seed(7)
    for n, e, f in [(50, 3000, 32), (17, 5000, 77), (300, 4000, 130)]:
        idx = torch.randint(0, n, (e,), generator=g)
        if dtype.is_floating_point:
            src = torch.randn(e, f, generator=g, dtype=dtype)
            base = torch.randn(n, f, generator=g, dtype=dtype)
        else:
            src = torch.randint(-50, 50, (e, f), generator=g, dtype=dtype)
            base = torch.randint(-50, 50, (n, f), generator=g, dtype=dtype)
        alpha = 3 if not dtype.is_floating_point else 0.75
        want = base.clone().index_add_(0, idx, src, alpha=alpha)
        want_t = base.t().contiguous().t().clone().index_add_(0, idx, src.t().contiguous().t())
        with torch_tpu.execution_mode(mode):
            got = base.to(DT).index_add_(0, idx.to(DT), src.to(DT), alpha=alpha)
            got_t = base.t().contiguous().to(DT).t().index_add_(0, idx.to(DT), src.t().contiguous().to(DT).t())
            torch_tpu.flush()
        assert torch.equal(got.cpu(), want)
        assert torch.equal(got_t.cpu(), want_t)
    w = torch.randn(40, 48, generator=g, requires_grad=True)
    idx = torch.randint(0, 40, (900,), generator=g)
    (w.index_select(0, idx) * torch.arange(48.0)).sum().backward()
    dw = w.detach().to(DT).requires_grad_()
    (dw.index_select(0, idx.to(DT)) * torch.arange(48.0).to(DT)).sum().backward()
    assert torch.equal(dw.grad.cpu(), w.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_long_line_over_the_pool(dtype, descending):
    """A line of 65,536 elements or more builds its keys, runs its radix
    passes and writes its result split over the threads: the same stable
    order as CPU's stable sort (ties by position), NaN and -0.0 kept as
    they are, keys over the whole range (every digit pass) and few values
    (passes skipped), in a 1-D sort, argsort, unique and a sort into out=
    slices; lines sorted side by side (a pool task each) agree."""
    g = torch.Generator().manual_seed(11)
    n = 70_001
    if dtype.is_floating_point:
        x = (torch.randn(n, generator=g, dtype=torch.float64) * 1e3).to(dtype)
        x[::97] = float("nan")
        x[::89] = -0.0
        x[::83] = 0.0
        x[::7] = x[5]  # many ties
    elif dtype == torch.uint8:
        x = torch.randint(0, 256, (n,), generator=g, dtype=dtype)
    else:
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, (n,), generator=g, dtype=dtype)
        x[::3] = torch.randint(-5, 5, (len(x[::3]),), generator=g, dtype=dtype)
    v, i = torch.sort(x, descending=descending, stable=True)
    dv, di = torch.sort(x.to(DT), descending=descending, stable=True)
    assert torch.equal(di.cpu(), i)
    assert torch.equal(dv.cpu().view(torch.uint8) if dtype.is_floating_point else dv.cpu(),
                       v.view(torch.uint8) if dtype.is_floating_point else v)  # -0.0 and NaN bits kept
    assert torch.equal(torch.argsort(x.to(DT), descending=descending, stable=True).cpu(), i)
    few = x[: n // 2].clone()
    if not dtype.is_floating_point:
        few = few % 7
    else:  # which NaN takes which of the NaNs' places in the inverse is the CPU sort's accident
        few = torch.nan_to_num(few, nan=1.5)
    u, inv, cnt = torch.unique(few, return_inverse=True, return_counts=True)
    du, dinv, dcnt = torch.unique(few.to(DT), return_inverse=True, return_counts=True)
    torch.testing.assert_close(du.cpu(), u, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(dinv.cpu(), inv) and torch.equal(dcnt.cpu(), cnt)
    rows = torch.stack([x, x.flip(0)])
    rv, ri = torch.sort(rows, dim=1, descending=descending, stable=True)
    drv, dri = torch.sort(rows.to(DT), dim=1, descending=descending, stable=True)
    assert torch.equal(dri.cpu(), ri)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32])
def test_sort_long_line_without_radix_keys(dtype):
    """Dtypes without a radix key here (CPU sorts none of them) take the
    merge sort at every length: a long line comes back ordered and stable
    (compared with CPU's stable sort of the same values as int64)."""
    g = torch.Generator().manual_seed(12)
    x = torch.randint(0, 60_000, (70_001,), generator=g)
    x[::5] = 7
    v, i = torch.sort(x, stable=True)
    dv, di = torch.sort(x.to(dtype).to(DT), stable=True)
    assert torch.equal(di.cpu(), i)
    assert torch.equal(dv.cpu().to(torch.int64), v)
