"""Tensors in device memory: round trips for every dtype and layout, casts
on the device, views that alias, fill_/zero_/item, set_/resize_."""
from __future__ import annotations

import warnings

import pytest
import torch

import torch_tpu

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, dtype=torch.float64, generator=g) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_contiguous(dtype):
    x = make((7, 13), dtype)
    d = x.to("tpu")
    assert d.device.type == "tpu" and d.dtype == dtype and d.shape == x.shape
    assert torch.equal(d.cpu(), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_noncontiguous_and_strided(dtype):
    x = make((6, 10, 4), dtype)
    # non-contiguous host source
    assert torch.equal(x.transpose(0, 2).to("tpu").cpu(), x.transpose(0, 2))
    # strided device views copied to the host
    d = x.to("tpu")
    for view in (d.transpose(0, 1), d[:, ::3], d[1:5, 2:9:2], d.permute(2, 0, 1),
                 d[..., 1], d.as_strided((3, 3), (7, 2), 5)):
        ref = x.as_strided(view.shape, view.stride(), view.storage_offset())
        assert torch.equal(view.cpu(), ref)
        assert torch.equal(view.contiguous().cpu(), ref)
    # copy into a strided device destination
    dst = torch.zeros(10, 6, dtype=dtype).to("tpu")
    dst.t().copy_(x[:, :, 0])
    assert torch.equal(dst.cpu(), x[:, :, 0].t())
    # copy into a strided host destination
    host = torch.zeros(10, 6, dtype=dtype)
    host.t().copy_(d[:, :, 1])
    assert torch.equal(host, x[:, :, 1].t())


@pytest.mark.parametrize("src", DTYPES, ids=str)
@pytest.mark.parametrize("dst", [torch.bool, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                                 torch.float32, torch.float64, torch.complex64], ids=str)
def test_casts_match_pytorch(src, dst):
    x = make((5, 9), src, seed=3)
    if src.is_floating_point and not dst.is_floating_point and dst != torch.bool and not dst.is_complex:
        x = x.clamp(-1000, 1000)  # out-of-range float->int is undefined in PyTorch too
    if src.is_complex and not dst.is_complex:
        # PyTorch keeps the real part (and warns that the imaginary part is discarded)
        warnings.filterwarnings("ignore", "Casting complex values to real")
    ref = x.to(dst)
    # host -> device with cast, device -> device cast, device -> host with cast
    assert torch.equal(x.to("tpu", dst).cpu(), ref)
    assert torch.equal(x.to("tpu").to(dst).cpu(), ref)
    assert torch.equal(x.to("tpu").to("cpu", dst), ref)


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (1, 2, 0), (0, 2, 1)], ids=str)
@pytest.mark.parametrize("pair", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                  (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                  (torch.float16, torch.float64)], ids=str)
def test_copies_of_permuted_views(perm, pair):
    # a cast that keeps a permuted view's strides (x.t().float()), a permuted
    # view made dense (contiguous(): the tile path), copy_ into a permuted
    # destination, and a source broadcast along a dim: the copy walks the
    # destination's memory order, the values are the views'
    src, dst = pair
    x = make((6, 35, 20), src, seed=5)
    d = x.to("tpu")
    shape = [x.shape[k] for k in perm]
    for got, ref in ((d.permute(perm).to(dst), x.permute(perm).to(dst)),
                     (d.permute(perm).contiguous().to(dst), x.permute(perm).contiguous().to(dst)),
                     (d.permute(perm).to(dst).contiguous(), x.permute(perm).to(dst).contiguous())):
        assert got.stride() == ref.stride() and torch.equal(got.cpu(), ref)
    out = torch.empty(shape, dtype=dst, device="tpu").permute([perm.index(k) for k in range(3)])
    out.copy_(d)
    assert torch.equal(out.cpu(), x.to(dst))
    row = d[:1].expand(6, 35, 20).permute(perm)
    assert torch.equal(row.to(dst).cpu(), x[:1].expand(6, 35, 20).permute(perm).to(dst))


def test_float_specials_survive_casts():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 65504.0, 70000.0, 3.0e38])
    for dt in (torch.bfloat16, torch.float16, torch.float64):
        got = x.to("tpu").to(dt).cpu()
        ref = x.to(dt)
        assert torch.equal(got.isnan(), ref.isnan())
        assert torch.equal(torch.nan_to_num(got.double(), 0.0, 1e300, -1e300),
                           torch.nan_to_num(ref.double(), 0.0, 1e300, -1e300))
        # the sign of a NaN carries no meaning (PyTorch's vector path yields either)
        assert torch.equal(torch.signbit(got)[1:], torch.signbit(ref)[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(37, 29), (16, 16), (3, 8, 9), (2, 3, 64, 40), (8, 200)], ids=str)
def test_transposing_copies_on_the_device(dtype, shape):
    # a copy whose source is contiguous along the destination's second-last
    # dim goes tile by tile (4-byte elements in 8 x 8 register blocks, any
    # remainder row by row): sizes that are and are not multiples of 8 and
    # 16, a reversed source column order, a slice with a row offset
    x = make(shape, dtype)
    d = x.to("tpu")
    cases = [lambda t: t.transpose(-1, -2), lambda t: t.transpose(-1, -2).flip(-1),
             lambda t: t[..., 1:, :].transpose(-1, -2), lambda t: t.transpose(-1, -2)[..., 3:]]
    for f in cases:
        got = f(d).contiguous()
        assert got.is_contiguous()
        assert torch.equal(got.cpu(), f(x).contiguous())
    # and through a strided destination (copy_ into a transposed view)
    out = torch.zeros(shape[:-2] + (shape[-1], shape[-2]), dtype=dtype, device="tpu")
    out.transpose(-1, -2).copy_(d)
    assert torch.equal(out.cpu(), x.transpose(-1, -2).contiguous())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_copies_ending_on_a_short_dim(dtype):
    # a destination whose innermost dim has a few elements (pixel_shuffle's
    # 2, a permute ending on a short dim) is walked along a dim that reads
    # contiguous source elements instead: the same elements land, with a
    # cast on the way, into a strided destination, and repeated (expanded)
    # sources stay as they were
    import torch.nn.functional as F
    x = (torch.randn(3, 16, 20, 24) * 10).to(dtype)
    d = x.to("tpu")
    assert torch.equal(F.pixel_shuffle(d, 2).cpu(), F.pixel_shuffle(x, 2))
    assert torch.equal(F.pixel_unshuffle(d, 2).cpu(), F.pixel_unshuffle(x, 2))
    assert torch.equal(F.pixel_shuffle(d, 4).cpu(), F.pixel_shuffle(x, 4))
    for perm in ((0, 2, 3, 1), (2, 3, 0, 1), (1, 3, 2, 0)):
        assert torch.equal(d.permute(perm).contiguous().cpu(), x.permute(perm).contiguous())
        assert torch.equal(d.permute(perm).float().cpu(), x.permute(perm).float())
    out = torch.zeros(16, 24, 20, 6, dtype=dtype, device="tpu")
    out[..., ::2].copy_(d.permute(1, 3, 2, 0))
    want = torch.zeros(16, 24, 20, 6, dtype=dtype)
    want[..., ::2].copy_(x.permute(1, 3, 2, 0))
    assert torch.equal(out.cpu(), want)
    e = d[:, :1].expand(3, 16, 20, 24).permute(1, 2, 3, 0).contiguous()
    assert torch.equal(e.cpu(), x[:, :1].expand(3, 16, 20, 24).permute(1, 2, 3, 0).contiguous())


def test_views_alias():
    base = torch.zeros(4, 5).to("tpu")
    row = base[1]
    row.fill_(3.0)
    col = base[:, 2]
    col.copy_(torch.tensor([9.0, 8.0, 7.0, 6.0]))
    v = base.view(20)
    v[19].fill_(-1.0)
    base.t()[0].zero_()
    expect = torch.zeros(4, 5)
    expect[1] = 3.0
    expect[:, 2] = torch.tensor([9.0, 8.0, 7.0, 6.0])
    expect.view(20)[19] = -1.0
    expect.t()[0] = 0.0
    assert torch.equal(base.cpu(), expect)
    assert row.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert base.reshape(2, 10).data_ptr() == base.data_ptr()


def test_fill_zero_item_every_dtype():
    for dt in DTYPES:
        t = torch.empty(3, 4, dtype=dt, device="tpu")
        value = True if dt == torch.bool else (2 + 1j if dt.is_complex else 5)
        t.fill_(value)
        assert torch.equal(t.cpu(), torch.full((3, 4), value, dtype=dt))
        assert t[2, 3].item() == value
        t[1].zero_()
        assert not t[1].cpu().any()
    # fill from a 0-dim device tensor (no host sync needed)
    t = torch.empty(2, 3, device="tpu")
    t.fill_(torch.tensor(4.5).to("tpu"))
    assert t.cpu().tolist() == [[4.5] * 3] * 2
    assert torch.tensor(2.0**40, dtype=torch.float64).to("tpu").item() == 2.0**40
    assert torch.tensor(-(2**62)).to("tpu").item() == -(2**62)
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        torch.ones(2).to("tpu").item()


def test_assert_async_checks_on_the_device_tensor():
    """torch._assert_async (TorchTitan's RoPE bounds check): true passes,
    false raises with the message, as on CPU; more than one element refuses."""
    pos = torch.arange(8).to("tpu")
    torch._assert_async(torch.all(pos <= 7), "position_ids exceed 7")
    torch._assert_async(torch.tensor(2.5).to("tpu"))
    with pytest.raises(RuntimeError, match="position_ids exceed 6"):
        torch._assert_async(torch.all(pos <= 6), "position_ids exceed 6")
    with pytest.raises(RuntimeError):
        torch._assert_async(torch.tensor(0).to("tpu"))
    with pytest.raises(RuntimeError):
        torch._assert_async(torch.ones(2).to("tpu"))


def test_broadcast_copy_and_empty_tensors():
    d = torch.empty(3, 4, device="tpu")
    d.copy_(torch.arange(4.0))
    assert torch.equal(d.cpu(), torch.arange(4.0).expand(3, 4))
    d.copy_(torch.arange(3.0).view(3, 1).to("tpu"))
    assert torch.equal(d.cpu(), torch.arange(3.0).view(3, 1).expand(3, 4))
    e = torch.empty(0, 5, device="tpu")
    assert e.cpu().shape == (0, 5)
    assert torch.empty((), device="tpu").fill_(1.5).item() == 1.5


def test_empty_strided_and_memory_format():
    t = torch.empty_strided((2, 3), (1, 2), device="tpu")
    assert t.stride() == (1, 2)
    cl = torch.empty(2, 3, 4, 5, device="tpu", memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 4, 5)
    assert torch.equal(x.to("tpu", memory_format=torch.channels_last).cpu(), x)


def test_resize_and_set():
    t = torch.arange(6.0).to("tpu")
    t.resize_(10)
    assert t.shape == (10,) and torch.equal(t[:6].cpu(), torch.arange(6.0))
    t.resize_(2, 2)
    assert torch.equal(t.cpu(), torch.arange(4.0).view(2, 2))
    s = torch.empty(0, device="tpu")
    s.set_(t)
    assert s.data_ptr() == t.data_ptr() and s.shape == (2, 2)
    s.set_(t.untyped_storage(), 1, (3,), (2,))
    assert s.cpu().tolist() == [1.0, 3.0, 5.0]
    s.set_()
    assert s.numel() == 0 and s.device.type == "tpu"
    st = torch.UntypedStorage(8, device="tpu")
    st.resize_(64)
    assert st.nbytes() == 64
    # like CPU, set_ grows a storage that is too small, keeping its contents
    s.set_(t.untyped_storage(), 0, (100,), (1,))
    assert t.untyped_storage().nbytes() == 400 and s[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="invalid storage offset"):
        s.set_(t.untyped_storage(), -1, (2,), (1,))


def test_non_blocking_pinned_copies_then_synchronize():
    n = 1 << 22
    src = torch.arange(n, dtype=torch.float32).pin_memory()
    assert src.is_pinned()
    assert not torch.arange(4.0).is_pinned()
    d = torch.empty(n, device="tpu")
    d.copy_(src, non_blocking=True)
    out = torch.empty(n).pin_memory()
    out.copy_(d, non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(out, src)
    # pageable host memory with non_blocking=True still gives correct data at once
    plain = torch.empty(n)
    plain.copy_(d, non_blocking=True)
    assert torch.equal(plain, src)
    assert src.to("tpu", non_blocking=True).cpu()[-1].item() == n - 1


def test_float8_bytes_roundtrip():
    x = torch.randn(16).to(torch.float8_e4m3fn)
    assert torch.equal(x.to("tpu").cpu().view(torch.uint8), x.view(torch.uint8))
    assert torch.equal(x.to("tpu")[::2].cpu().view(torch.uint8), x[::2].view(torch.uint8))


def test_conjugate_and_negative_views_copy_correctly():
    x = torch.randn(4, 3, dtype=torch.complex64)
    d = x.to("tpu")
    # lazy conj / neg views copied to the host, to the device and on the device
    assert torch.equal(d.conj().cpu(), x.conj())
    assert torch.equal(x.conj().to("tpu").cpu(), x.conj())
    assert torch.equal(d.conj().clone().cpu(), x.conj())
    assert torch.equal(torch.view_as_real(d).cpu(), torch.view_as_real(x))
    assert torch.equal(torch.view_as_complex(torch.view_as_real(d)).cpu(), x)
    y = torch.randn(5)
    assert torch.equal(torch._neg_view(y.to("tpu")).cpu(), -y)
    assert torch.equal(torch._neg_view(y).to("tpu").cpu(), -y)
    # writing into a conjugate view stores the conjugate
    out = torch.zeros(4, 3, dtype=torch.complex64, device="tpu")
    out.conj().copy_(d)
    assert torch.equal(out.cpu(), x.conj())
    # fft.hfft works through these copies
    z = torch.randn(6, dtype=torch.complex64)
    torch_tpu.cpu_fallback_mode(True)
    try:
        got = torch.fft.hfft(z.to("tpu")).cpu()
    finally:
        torch_tpu.cpu_fallback_mode(False)
    torch.testing.assert_close(got, torch.fft.hfft(z))
