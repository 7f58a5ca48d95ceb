"""Embedding bags, by-index fill/copy/reduce, put/take, masked_scatter,
nonzero_static, unique (dim / consecutive), median / nanmedian / kthvalue /
mode / aminmax, histograms, searchsorted / bucketize / isin,
repeat_interleave, count_nonzero, segment_reduce, renorm, trace,
channel_shuffle, unfold backward, equal and logspace on the tpu device vs
PyTorch CPU (values, gradients and error classes)."""
from __future__ import annotations

import functools

import conftest
import pytest
import torch
import torch.nn.functional as F

DT = "tpu"
rnd = functools.partial(conftest.rnd, int_range=20)


def close(d, c, **kw):
    if isinstance(d, (tuple, list)):
        for a, b in zip(d, c):
            close(a, b, **kw)
        return
    d = d.cpu()
    assert d.dtype == c.dtype, (d.dtype, c.dtype)
    assert d.shape == c.shape, (d.shape, c.shape)
    torch.testing.assert_close(d, c, equal_nan=True, **kw)


def no_fallback():
    import torch_tpu
    assert not torch_tpu._C._fallback_counts() if hasattr(torch_tpu._C, "_fallback_counts") else True


# ------------------------------------------------------------ embedding_bag

@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_embedding_bag_forward_backward(mode, dtype):
    w = rnd((20, 7), dtype).requires_grad_()
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 19, 0])
    off = torch.tensor([0, 3, 3, 6])
    wd = w.detach().to(DT).requires_grad_()
    out_c = F.embedding_bag(idx, w, off, mode=mode)
    out_d = F.embedding_bag(idx.to(DT), wd, off.to(DT), mode=mode)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    close(out_d, out_c.detach(), **tol)
    g = rnd(out_c.shape, dtype, seed=1)
    out_c.backward(g)
    out_d.backward(g.to(DT))
    close(wd.grad, w.grad, **tol)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_options(mode):
    w = rnd((12, 5)).requires_grad_()
    idx = torch.tensor([[1, 2, 3, 0], [4, 0, 0, 11], [7, 7, 7, 3]])
    wd = w.detach().to(DT).requires_grad_()
    kw = dict(mode=mode, padding_idx=0)
    out_c = F.embedding_bag(idx, w, **kw)
    out_d = F.embedding_bag(idx.to(DT), wd, **kw)
    close(out_d, out_c.detach())
    out_c.sum().backward()
    out_d.sum().backward()
    close(wd.grad, w.grad)
    # include_last_offset, 1-D input
    flat, off = idx.reshape(-1), torch.tensor([0, 2, 5, 12])
    out_c = F.embedding_bag(flat, w, off, mode=mode, include_last_offset=True)
    out_d = F.embedding_bag(flat.to(DT), wd, off.to(DT), mode=mode, include_last_offset=True)
    close(out_d, out_c.detach())


def test_embedding_bag_per_sample_weights_and_int32():
    w = rnd((10, 4)).requires_grad_()
    idx = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int32)
    off = torch.tensor([0, 2, 2], dtype=torch.int32)
    psw = rnd((6,), seed=3).requires_grad_()
    wd, pd = w.detach().to(DT).requires_grad_(), psw.detach().to(DT).requires_grad_()
    out_c = F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=psw)
    out_d = F.embedding_bag(idx.to(DT), wd, off.to(DT), mode="sum", per_sample_weights=pd)
    close(out_d, out_c.detach())
    g = rnd(out_c.shape, seed=4)
    out_c.backward(g)
    out_d.backward(g.to(DT))
    close(wd.grad, w.grad)
    close(pd.grad, psw.grad)


def test_embedding_bag_errors():
    w = rnd((5, 3)).to(DT)
    with pytest.raises(NotImplementedError):
        F.embedding_bag(torch.tensor([0, 1]).to(DT), w, torch.tensor([0]).to(DT), mode="mean",
                        per_sample_weights=torch.ones(2).to(DT))
    out = F.embedding_bag(torch.tensor([0, 7]).to(DT), w, torch.tensor([0]).to(DT))
    with pytest.raises(IndexError, match="embedding_bag"):
        out.cpu()
    # the device keeps working
    close(F.embedding_bag(torch.tensor([0, 1]).to(DT), w, torch.tensor([0]).to(DT)),
          F.embedding_bag(torch.tensor([0, 1]), w.cpu(), torch.tensor([0])))


def test_embedding_renorm():
    w = rnd((10, 4)) * 3
    idx = torch.tensor([[1, 2, 2], [5, 9, 1]])
    wd = w.to(DT)
    out_c = F.embedding(idx, w, max_norm=1.0)
    out_d = F.embedding(idx.to(DT), wd, max_norm=1.0)
    close(out_d, out_c)
    close(wd, w)


# ------------------------------------------------------------ index fill / copy / reduce

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_index_fill_copy(dtype):
    x = rnd((4, 5, 3), dtype)
    idx = torch.tensor([0, 3, -1])
    for dim in (0, 1, -1):
        i = idx if dim != 2 and dim != -1 else torch.tensor([0, 2])
        close(x.to(DT).index_fill(dim, i.to(DT), 1), x.index_fill(dim, i, 1))
        close(x.to(DT).index_fill(dim, i.to(DT), torch.tensor(0, dtype=dtype)),
              x.index_fill(dim, i, torch.tensor(0, dtype=dtype)))
    src = rnd((4, 2, 3), dtype, seed=2)
    i = torch.tensor([4, 1])
    close(x.to(DT).index_copy(1, i.to(DT), src.to(DT)), x.index_copy(1, i, src))
    xd = x.to(DT).transpose(0, 2)
    xd.index_copy_(1, i.to(DT), src.to(DT).transpose(0, 2))
    close(xd, x.transpose(0, 2).index_copy(1, i, src.transpose(0, 2)))
    with pytest.raises(IndexError):
        x.to(DT).index_fill_(0, torch.tensor([7]).to(DT), 1).cpu()


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    x = rnd((5, 4))
    src = rnd((6, 4), seed=1)
    idx = torch.tensor([0, 4, 2, 0, 4, 4])
    close(x.to(DT).index_reduce(0, idx.to(DT), src.to(DT), reduce, include_self=include_self),
          x.index_reduce(0, idx, src, reduce, include_self=include_self))
    xi = rnd((5, 4), torch.int64)
    srci = rnd((6, 4), torch.int64, seed=1)
    close(xi.to(DT).index_reduce(0, idx.to(DT), srci.to(DT), reduce, include_self=include_self),
          xi.index_reduce(0, idx, srci, reduce, include_self=include_self))


def test_put_take():
    x = rnd((3, 4))
    idx = torch.tensor([[0, 11], [-1, 5]])
    src = rnd((2, 2), seed=1)
    close(x.to(DT).take(idx.to(DT)), x.take(idx))
    close(x.to(DT).put(idx.to(DT), src.to(DT)), x.put(idx, src))
    xd = x.to(DT).t()
    xd.put_(idx.to(DT), src.to(DT), accumulate=True)
    close(xd, x.t().put(idx, src, accumulate=True))
    with pytest.raises(IndexError):
        x.to(DT).take(torch.tensor([12]).to(DT)).cpu()
    with pytest.raises(RuntimeError):
        x.to(DT).put_(torch.tensor([1, 2]).to(DT), src.to(DT))


def test_masked_scatter_and_select():
    x = rnd((3, 4))
    m = rnd((4,), torch.bool)
    src = rnd((12,), seed=1)
    close(x.to(DT).masked_scatter(m.to(DT), src.to(DT)), x.masked_scatter(m, src))
    a = torch.tensor(2.0, requires_grad=True)
    ad = a.detach().to(DT).requires_grad_()
    close(torch.masked_select(ad, torch.tensor(True).to(DT)), torch.masked_select(a, torch.tensor(True)).detach())
    xs = x.clone().requires_grad_()
    xsd = x.to(DT).requires_grad_()
    sc = xs.masked_scatter(m, src)
    sd = xsd.masked_scatter(m.to(DT), src.to(DT))
    sc.sum().backward()
    sd.sum().backward()
    close(xsd.grad, xs.grad)


def test_nonzero_static():
    x = torch.tensor([[0, 1, 0], [2, 0, 3]])
    for size in (0, 2, 3, 6):
        close(torch.nonzero_static(x.to(DT), size=size, fill_value=-7), torch.nonzero_static(x, size=size,
                                                                                              fill_value=-7))


# ------------------------------------------------------------ unique

def test_unique_dim_consecutive():
    x = torch.tensor([[1, 2, 1], [0, 2, 1], [1, 2, 1], [0, 0, 5]])
    for dim in (0, 1):
        r_c = torch.unique(x, dim=dim, return_inverse=True, return_counts=True)
        r_d = torch.unique(x.to(DT), dim=dim, return_inverse=True, return_counts=True)
        close(r_d, r_c)
    y = torch.tensor([1, 1, 2, 2, 3, 1, 1, 2])
    close(torch.unique_consecutive(y.to(DT), return_inverse=True, return_counts=True),
          torch.unique_consecutive(y, return_inverse=True, return_counts=True))
    close(torch.unique_consecutive(x.to(DT), dim=0, return_inverse=True, return_counts=True),
          torch.unique_consecutive(x, dim=0, return_inverse=True, return_counts=True))
    f = torch.tensor([0.5, 0.5, -1.0, 2.0, 2.0])
    close(torch.unique_consecutive(f.to(DT)), torch.unique_consecutive(f))
    # each combination of the outputs asked for (what is not comes back
    # empty, as on CPU), over 1M values in runs
    z = torch.randint(0, 4, (1 << 20,), generator=torch.Generator().manual_seed(2)).cumsum(0) // 3
    for inv in (False, True):
        for cnt in (False, True):
            close(torch.ops.aten.unique_consecutive(z.to(DT), return_inverse=inv, return_counts=cnt),
                  torch.ops.aten.unique_consecutive(z, return_inverse=inv, return_counts=cnt))


# ------------------------------------------------------------ order statistics

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_median_kthvalue_mode(dtype):
    x = (torch.randperm(35, generator=torch.Generator().manual_seed(0)).reshape(5, 7) - 17).to(dtype)
    xd = x.to(DT)
    close(xd.median(), x.median())
    for dim in (0, 1):
        close(xd.median(dim), tuple(x.median(dim)))
        close(xd.kthvalue(3, dim, keepdim=True), tuple(x.kthvalue(3, dim, keepdim=True)))
    m = torch.tensor([[1, 2, 2, 3, 3], [5, 5, 5, 1, 1]]).to(dtype)
    close(m.to(DT).mode(1), tuple(m.mode(1)))
    close(torch.aminmax(xd), tuple(torch.aminmax(x)))
    close(torch.aminmax(xd, dim=1, keepdim=True), tuple(torch.aminmax(x, dim=1, keepdim=True)))
    with pytest.raises(RuntimeError):
        xd.kthvalue(9, 1)


def test_median_nan_and_grad():
    x = torch.tensor([[1.0, float("nan"), 3.0, 0.5], [2.0, 1.0, 4.0, 3.0]])
    xd = x.to(DT)
    close(xd.median(1), tuple(x.median(1)))
    close(xd.nanmedian(1), tuple(x.nanmedian(1)))
    close(xd.nanmedian(), x.nanmedian())
    a = rnd((4, 5)).requires_grad_()
    ad = a.detach().to(DT).requires_grad_()
    a.median(1).values.sum().backward()
    ad.median(1).values.sum().backward()
    close(ad.grad, a.grad)


# ------------------------------------------------------------ histograms and search

def test_histc_histogram():
    x = rnd((100,))
    close(torch.histc(x.to(DT), bins=7), torch.histc(x, bins=7))
    close(torch.histc(x.to(DT), bins=5, min=-1, max=1), torch.histc(x, bins=5, min=-1, max=1))
    w = rnd((100,), seed=2).abs()
    close(torch.histogram(x.to(DT), bins=6, weight=w.to(DT), density=True),
          tuple(torch.histogram(x, bins=6, weight=w, density=True)))
    b = torch.tensor([-2.0, -0.5, 0.0, 0.1, 3.0])
    close(torch.histogram(x.to(DT), bins=b.to(DT)), tuple(torch.histogram(x, bins=b)))
    y = rnd((50, 2), seed=3)
    hc, ec = torch.histogramdd(y, bins=[3, 4])
    hd, ed = torch.histogramdd(y.to(DT), bins=[3, 4])
    close(hd, hc)
    close(ed, ec)
    hc, _ = torch.histogramdd(y, bins=[torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([-3.0, 3.0])])
    hd, _ = torch.histogramdd(y.to(DT), bins=[torch.tensor([-1.0, 0.0, 2.0]).to(DT), torch.tensor([-3.0, 3.0]).to(DT)])
    close(hd, hc)


def test_histograms_of_many_samples():
    # unweighted float32 counts over many samples are counted per chunk in
    # parallel: the same counts as the CPU's, with samples outside the range,
    # NaN, a 2-D histogramdd and weights (accumulated in sample order)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1 << 20, generator=g) * 2
    close(torch.histc(x.to(DT), 100), torch.histc(x, 100))  # the range of the data
    x[::1000] = float("nan")
    for bins, lo, hi in ((7, -1.0, 3.0), (5000, -4.0, 4.0)):
        close(torch.histc(x.to(DT), bins, lo, hi), torch.histc(x, bins, lo, hi))
    y = torch.randn(300001, 2, generator=g)
    ec = [torch.linspace(-2, 2, 9), torch.linspace(-3, 3, 5)]
    hc, _ = torch.histogramdd(y, bins=ec)
    hd, _ = torch.histogramdd(y.to(DT), bins=[e.to(DT) for e in ec])
    close(hd, hc)
    w = torch.rand(300001, generator=g)
    hc, _ = torch.histogramdd(y, bins=ec, weight=w)
    hd, _ = torch.histogramdd(y.to(DT), bins=[e.to(DT) for e in ec], weight=w.to(DT))
    close(hd, hc, rtol=1e-5, atol=0)  # float sums of ~10,000 weights each, in another order than the CPU's


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
                                   torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_nonzero_of_contiguous_tensors_every_dtype(dtype):
    # the writing pass over contiguous memory: a typed test an element and
    # each hit's coordinates from its linear index, for 1-, 2- and 3-D
    # shapes spanning several 65,536-element chunks; -0.0 counts as zero
    g = torch.Generator().manual_seed(10)
    x = torch.randint(-1, 2, (150001,), generator=g).to(dtype)
    if dtype.is_floating_point:
        x[::7] = -0.0
    for shape in ((150001,), (97, 1546), (7, 3, 7142)):
        t = x[: torch.Size(shape).numel()].reshape(shape)
        close(torch.nonzero(t.to(DT)), torch.nonzero(t))
    close(torch.nonzero(x.to(DT)[::2]), torch.nonzero(x[::2]))  # strided: the generic walk


def test_searchsorted_bucketize_isin():
    seq = torch.tensor([1.0, 2.0, 2.0, 5.0, 7.0])
    v = torch.tensor([[0.0, 2.0, 6.0], [7.0, 8.0, 2.5]])
    for right in (False, True):
        close(torch.searchsorted(seq.to(DT), v.to(DT), right=right), torch.searchsorted(seq, v, right=right))
        close(torch.bucketize(v.to(DT), seq.to(DT), right=right, out_int32=True),
              torch.bucketize(v, seq, right=right, out_int32=True))
    seq2 = torch.sort(rnd((2, 6)), dim=1).values
    close(torch.searchsorted(seq2.to(DT), v.to(DT), side="right"), torch.searchsorted(seq2, v, side="right"))
    uns = torch.tensor([5, 1, 7, 2])
    srt = torch.argsort(uns)
    q = torch.tensor([0, 2, 6, 9])
    close(torch.searchsorted(uns.to(DT), q.to(DT), sorter=srt.to(DT)), torch.searchsorted(uns, q, sorter=srt))
    close(torch.searchsorted(seq.to(DT), 2.0), torch.searchsorted(seq, 2.0))
    e = torch.tensor([[1, 2, 3], [4, 5, 6]])
    t = torch.tensor([2, 6, 9, 2])
    close(torch.isin(e.to(DT), t.to(DT)), torch.isin(e, t))
    close(torch.isin(e.to(DT), t.to(DT), invert=True), torch.isin(e, t, invert=True))
    close(torch.isin(e.to(DT), 5), torch.isin(e, 5))
    with pytest.raises(RuntimeError):
        torch.searchsorted(seq2.to(DT), rnd((3, 2)).to(DT))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16], ids=str)
def test_searchsorted_many_values_every_typed_path(dtype):
    # a 1-D sequence and 10,001 values (units of 4,096 values spread over
    # the threads), ties, values outside the range, NaN (floats), both sides,
    # int32 output, a batch of rows, a strided (non-dense) sequence, and an
    # unsorted sequence answered with the CPU's probes
    g = torch.Generator().manual_seed(4)
    seq = torch.sort((torch.randn(3001, generator=g) * 50)).values.to(dtype)
    v = (torch.randn(10001, generator=g) * 60).to(dtype)
    v[:100] = seq[:100]
    if dtype.is_floating_point:
        v[100] = float("nan")
    for right in (False, True):
        for out_int32 in (False, True):
            close(torch.searchsorted(seq.to(DT), v.to(DT), right=right, out_int32=out_int32),
                  torch.searchsorted(seq, v, right=right, out_int32=out_int32))
    rows = torch.sort(torch.randn(3, 700, generator=g) * 10, dim=1).values.to(dtype)
    vr = (torch.randn(3, 9000, generator=g) * 10).to(dtype)
    close(torch.searchsorted(rows.to(DT), vr.to(DT)), torch.searchsorted(rows, vr))
    close(torch.searchsorted(seq[::2].to(DT), v.to(DT)), torch.searchsorted(seq[::2], v))
    close(torch.bucketize(v.to(DT), seq.to(DT), right=True), torch.bucketize(v, seq, right=True))
    uns = (torch.randn(257, generator=g) * 20).to(dtype)
    close(torch.searchsorted(uns.to(DT), v.to(DT)), torch.searchsorted(uns, v))


def test_repeat_interleave_count_nonzero():
    r = torch.tensor([2, 0, 3, 1])
    close(torch.repeat_interleave(r.to(DT)), torch.repeat_interleave(r))
    x = rnd((3, 4))
    close(x.to(DT).repeat_interleave(r[:3].to(DT), dim=0), x.repeat_interleave(r[:3], dim=0))
    z = torch.tensor([[0, 1, 2], [0, 0, 3]])
    close(torch.count_nonzero(z.to(DT), dim=1), torch.count_nonzero(z, dim=1))
    close(torch.count_nonzero(z.to(DT), dim=(0, 1)), torch.count_nonzero(z, dim=(0, 1)))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce(reduce):
    data = rnd((6, 3)).requires_grad_()
    dd = data.detach().to(DT).requires_grad_()
    lengths = torch.tensor([2, 0, 3, 1])
    rc = torch.segment_reduce(data, reduce, lengths=lengths, unsafe=False, initial=0.5)
    rd = torch.segment_reduce(dd, reduce, lengths=lengths.to(DT), unsafe=False, initial=0.5)
    close(rd, rc.detach())
    g = rnd(rc.shape, seed=5)
    rc.backward(g)
    rd.backward(g.to(DT))
    close(dd.grad, data.grad)
    offs = torch.tensor([0, 2, 2, 5, 6])
    close(torch.segment_reduce(dd.detach(), reduce, offsets=offs.to(DT)),
          torch.segment_reduce(data.detach(), reduce, offsets=offs))


# ------------------------------------------------------------ small composites

def test_renorm_trace_channel_shuffle_unfold_equal():
    x = rnd((4, 3, 2)).requires_grad_()
    xd = x.detach().to(DT).requires_grad_()
    rc, rd = x.renorm(2, 1, 1.5), xd.renorm(2, 1, 1.5)
    close(rd, rc.detach())
    rc.sum().backward()
    rd.sum().backward()
    close(xd.grad, x.grad)
    m = rnd((4, 5))
    close(m.to(DT).trace(), m.trace())
    mi = rnd((3, 3), torch.int32)
    close(mi.to(DT).trace(), mi.trace())
    c = rnd((2, 6, 3))
    close(F.channel_shuffle(c.to(DT), 3), F.channel_shuffle(c, 3))
    u = rnd((10, 3)).requires_grad_()
    ud = u.detach().to(DT).requires_grad_()
    uc, udd = u.unfold(0, 4, 3), ud.unfold(0, 4, 3)
    g = rnd(uc.shape, seed=9)
    uc.backward(g)
    udd.backward(g.to(DT))
    close(ud.grad, u.grad)
    a = rnd((3, 3))
    assert torch.equal(a.to(DT), a.to(DT).clone())
    assert not torch.equal(a.to(DT), (a + 1).to(DT))
    assert not torch.equal(a.to(DT), a[:2].to(DT))


def test_logspace_linspace_arange():
    for dtype in (torch.float32, torch.float64, torch.int64):
        close(torch.logspace(0, 2, 5, base=2.0, device=DT, dtype=dtype), torch.logspace(0, 2, 5, base=2.0, dtype=dtype))
    close(torch.linspace(torch.tensor(1.0), torch.tensor(3.0), 3, device=DT), torch.linspace(1.0, 3.0, 3))
    close(torch.arange(1, 5, device=DT), torch.arange(1, 5))


def test_gather_scatter_int32_index():
    x = rnd((5, 4))
    i = torch.randint(0, 5, (3, 4), dtype=torch.int32)
    close(torch.gather(x.to(DT), 0, i.to(DT)), torch.gather(x, 0, i))
    close(torch.scatter(x.to(DT), 0, i.to(DT), 1.0), torch.scatter(x, 0, i, 1.0))
