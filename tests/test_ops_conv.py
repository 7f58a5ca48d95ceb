"""Convolution (1d/2d, stride/padding/dilation/groups, transposed), pooling
(max with indices, avg, adaptive avg/max) and upsampling (nearest,
bilinear with and without align_corners) on the tpu device vs PyTorch CPU,
forward and gradients, small conv nets, errors like CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu

TOL = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-10, 1e-10), torch.bfloat16: (3e-2, 3e-2),
       torch.float16: (3e-3, 3e-3)}
MY_OPS = ("convolution_overrideable", "convolution_backward_overrideable", "max_pool2d_with_indices",
          "avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d", "upsample_nearest2d", "upsample_bilinear2d",
          "avg_pool3d", "max_pool3d", "_adaptive_avg_pool3d", "adaptive_max_pool3d", "max_unpool", "fractional_max",
          "upsample_", "_upsample_", "grid_sampler", "im2col", "col2im")


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def close(got, want):
    assert got.device.type == "tpu"
    got = got.detach().cpu()
    want = want.detach()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape)
    rtol, atol = TOL[want.dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol,
                               atol=atol * max(1.0, want.double().abs().max().item() if want.numel() else 1.0))


@pytest.fixture(autouse=True)
def fallback_for_others():
    """Ops of other families (sum, add, ...) may run through the CPU fallback
    in these tests; the convolution/pooling/upsample ops must not."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    torch_tpu._C._set_cpu_fallback(True)
    torch_tpu._C._reset_fallback_counts()
    yield
    stats = torch.tpu.fallback_stats()
    torch_tpu._C._set_cpu_fallback(False)
    torch.set_float32_matmul_precision(old)
    bad = [k for k in stats if any(k.startswith(f"aten::{o}") for o in MY_OPS)]
    assert not bad, f"ops fell back to the CPU: {bad}"


def check_grads(fn, inputs, grad_seed=7):
    """fn(*inputs) on CPU and tpu; compares outputs and input gradients."""
    cpu_in = [x.detach().clone().requires_grad_(x.dtype.is_floating_point) for x in inputs]
    tpu_in = [x.detach().to("tpu").requires_grad_(x.dtype.is_floating_point) for x in inputs]
    out = fn(*cpu_in)
    dout = fn(*tpu_in)
    close(dout, out)
    g = rand(*out.shape, dtype=out.dtype, seed=grad_seed)
    out.backward(g)
    dout.backward(g.to("tpu"))
    for c, t in zip(cpu_in, tpu_in):
        if c.grad is not None:
            close(t.grad, c.grad)


CONV2D_CASES = [
    dict(),
    dict(stride=2),
    dict(padding=1),
    dict(padding=(2, 1), dilation=(2, 1)),
    dict(stride=(2, 1), padding=1, groups=2),
    dict(groups=4),  # depthwise-like
    dict(padding=0, kernel=1),  # 1x1 (no im2col)
    dict(stride=2, kernel=1),
]


@pytest.mark.parametrize("case", range(len(CONV2D_CASES)))
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_forward_backward(case, bias):
    kw = dict(CONV2D_CASES[case])
    k = kw.pop("kernel", 3)
    groups = kw.get("groups", 1)
    x, w = rand(2, 4, 9, 8), rand(6 if groups != 4 else 8, 4 // groups, k, k, seed=1)
    b = rand(w.shape[0], seed=2) if bias else None
    args = [x, w] + ([b] if bias else [])
    check_grads(lambda x, w, *b: F.conv2d(x, w, b[0] if b else None, **kw), args)


# f32 convolutions run as an implicit GEMM (column panels gathered from the
# images while the GEMM packs them): runs of 8 / 4 output positions per row
# at stride 1 and 2 with masked edges, gathers for other shapes, slivers
# across images, the input gradient at unit stride as a convolution with
# flipped weights; TORCH_TPU_CONV_IMPLICIT=0 is the im2col + GEMM path.
IMPLICIT_CASES = [
    ((2, 8, 16, 16), dict(padding=1)),  # runs of 8
    ((2, 8, 16, 16), dict(stride=2, padding=1)),  # stride 2, runs of 8
    ((2, 8, 15, 15), dict(stride=2, padding=1)),  # stride 2, right edge in the padding
    ((3, 8, 4, 4), dict(padding=1)),  # runs of 4
    ((2, 8, 7, 9), dict(padding=2, dilation=2, groups=2)),  # gathers, slivers across images
    ((2, 8, 6, 8), dict(stride=(1, 2), padding=(3, 0))),  # padding past the kernel, mixed strides
]


@pytest.mark.parametrize("implicit", ["1", "0"])
@pytest.mark.parametrize("case", range(len(IMPLICIT_CASES)))
def test_conv2d_implicit_gemm(case, implicit, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CONV_IMPLICIT", implicit)
    shape, kw = IMPLICIT_CASES[case]
    x, w, b = rand(*shape), rand(12, shape[1] // kw.get("groups", 1), 3, 3, seed=1), rand(12, seed=2)
    check_grads(lambda x, w, b: F.conv2d(x, w, b, **kw), [x, w, b])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_conv2d_dtypes(dtype):
    x, w, b = rand(2, 3, 7, 7, dtype=dtype), rand(5, 3, 3, 3, dtype=dtype, seed=1), rand(5, dtype=dtype, seed=2)
    close(F.conv2d(x.to("tpu"), w.to("tpu"), b.to("tpu"), padding=1), F.conv2d(x, w, b, padding=1))
    if dtype == torch.float64:
        check_grads(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), [x, w, b])


def test_conv2d_noncontiguous_input():
    x = rand(2, 8, 6, 6).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels_last strides
    w = rand(4, 8, 3, 3, seed=1)
    dx = rand(2, 8, 6, 6).permute(0, 2, 3, 1).contiguous().to("tpu").permute(0, 3, 1, 2)
    close(F.conv2d(dx, w.to("tpu"), padding=1), F.conv2d(x, w, padding=1))
    xs = rand(2, 8, 12, 12)[:, :, ::2, ::2]
    close(F.conv2d(rand(2, 8, 12, 12).to("tpu")[:, :, ::2, ::2], w.to("tpu")), F.conv2d(xs, w))


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(dilation=2, padding=2, groups=2)])
def test_conv1d(kw):
    x, w, b = rand(3, 4, 20), rand(6, 4 // kw.get("groups", 1), 3, seed=1), rand(6, seed=2)
    check_grads(lambda x, w, b: F.conv1d(x, w, b, **kw), [x, w, b])


@pytest.mark.parametrize("kw", [dict(), dict(stride=2), dict(stride=2, padding=1, output_padding=1),
                                dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)])
def test_conv_transpose2d(kw):
    x, w, b = rand(2, 4, 5, 6), rand(4, 3, 3, 3, seed=1), rand(3 * kw.get("groups", 1), seed=2)
    check_grads(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw), [x, w, b])


def test_conv_transpose1d():
    x, w, b = rand(2, 4, 9), rand(4, 2, 4, seed=1), rand(2, seed=2)
    check_grads(lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, padding=1), [x, w, b])


def test_conv_errors_like_cpu():
    def both(fn, *args):
        with pytest.raises(Exception) as e_cpu:
            fn(*args)
        with pytest.raises(type(e_cpu.value)):
            fn(*[a.to("tpu") for a in args])

    both(lambda x, w: F.conv2d(x, w), rand(1, 3, 5, 5), rand(4, 2, 3, 3))  # channel mismatch
    both(lambda x, w: F.conv2d(x, w), rand(1, 3, 2, 2), rand(4, 3, 3, 3))  # kernel larger than input
    both(lambda x, w: F.conv2d(x, w, groups=2), rand(1, 3, 5, 5), rand(4, 1, 3, 3))
    close(F.conv2d(rand(1, 3, 5, 5).to("tpu"), rand(4, 3, 3, 3).to("tpu")), F.conv2d(rand(1, 3, 5, 5), rand(4, 3, 3, 3)))


def test_small_convnet_forward_backward():
    torch.manual_seed(0)

    def net():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2), torch.nn.AvgPool2d(2, ceil_mode=True),
            torch.nn.Upsample(scale_factor=2, mode="bilinear"), torch.nn.AdaptiveAvgPool2d((3, 2)),
            torch.nn.Flatten(), torch.nn.Linear(16 * 6, 10))

    cpu, dev = net(), net().to("tpu")
    dev.load_state_dict(cpu.state_dict())
    x = rand(2, 3, 16, 16)
    g = rand(2, 10, seed=3)
    out = cpu(x)
    dout = dev(x.to("tpu"))
    close(dout, out)
    out.backward(g)
    dout.backward(g.to("tpu"))
    for (n, p), dp in zip(cpu.named_parameters(), dev.parameters()):
        close(dp.grad, p.grad)


# -------------------------------------------------------------------- pooling

@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=(3, 2), stride=(2, 1), dilation=(1, 2)),
                                dict(kernel_size=3, stride=2, ceil_mode=True)])
def test_max_pool2d(kw):
    x = rand(2, 3, 9, 10)
    check_grads(lambda x: F.max_pool2d(x, **kw), [x])
    out, idx = F.max_pool2d(x, return_indices=True, **kw)
    dout, didx = F.max_pool2d(x.to("tpu"), return_indices=True, **kw)
    assert torch.equal(didx.cpu(), idx)
    # unbatched (3-D) input
    close(F.max_pool2d(x[0].to("tpu"), **kw), F.max_pool2d(x[0], **kw))


def test_max_pool2d_nan_and_dtypes():
    x = rand(1, 2, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    out, idx = F.max_pool2d(x, 2, return_indices=True)
    dout, didx = F.max_pool2d(x.to("tpu"), 2, return_indices=True)
    torch.testing.assert_close(dout.cpu(), out, equal_nan=True)
    assert torch.equal(didx.cpu(), idx)
    for dt in (torch.float64, torch.bfloat16):
        xd = rand(2, 3, 8, 8, dtype=dt)
        close(F.max_pool2d(xd.to("tpu"), 3, 2, 1), F.max_pool2d(xd, 3, 2, 1))


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                                dict(kernel_size=3, stride=2, ceil_mode=True),
                                dict(kernel_size=2, divisor_override=3)])
def test_avg_pool2d(kw):
    check_grads(lambda x: F.avg_pool2d(x, **kw), [rand(2, 3, 9, 10)])


@pytest.mark.parametrize("size", [(3, 4), (5, 5), (9, 2)])
def test_adaptive_pools(size):
    x = rand(2, 3, 9, 10)
    check_grads(lambda x: F.adaptive_avg_pool2d(x, size), [x])
    check_grads(lambda x: F.adaptive_max_pool2d(x, size), [x])
    out, idx = F.adaptive_max_pool2d(x, size, return_indices=True)
    assert torch.equal(F.adaptive_max_pool2d(x.to("tpu"), size, return_indices=True)[1].cpu(), idx)


def test_pool_errors_like_cpu():
    for fn in (lambda x: F.max_pool2d(x, 2, padding=2), lambda x: F.avg_pool2d(x, 5),
               lambda x: F.max_pool2d(x, 0)):
        x = rand(1, 2, 3, 3)
        with pytest.raises(Exception) as e_cpu:
            fn(x)
        with pytest.raises(type(e_cpu.value)):
            fn(x.to("tpu"))


# ------------------------------------------------------------------- upsample

@pytest.mark.parametrize("kw", [dict(scale_factor=2, mode="nearest"), dict(size=(7, 5), mode="nearest"),
                                dict(scale_factor=1.5, mode="nearest"),
                                dict(scale_factor=2, mode="bilinear", align_corners=False),
                                dict(scale_factor=2, mode="bilinear", align_corners=True),
                                dict(size=(7, 13), mode="bilinear", align_corners=False),
                                dict(size=(3, 4), mode="bilinear", align_corners=True),
                                dict(scale_factor=0.5, mode="bilinear")])
def test_upsample(kw):
    check_grads(lambda x: F.interpolate(x, **kw), [rand(2, 3, 6, 8)])


def test_upsample_dtypes_and_strides():
    x = rand(2, 3, 5, 6, dtype=torch.bfloat16)
    close(F.interpolate(x.to("tpu"), scale_factor=2, mode="bilinear"), F.interpolate(x, scale_factor=2, mode="bilinear"))
    xs = rand(2, 6, 5, 6)[:, ::2]
    close(F.interpolate(rand(2, 6, 5, 6).to("tpu")[:, ::2], size=(9, 4), mode="nearest"),
          F.interpolate(xs, size=(9, 4), mode="nearest"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(5, 3))], ids=str)
def test_nearest_upsample_keeps_infinities(dtype, kw):
    # nearest copies its source value (forward) and adds each output's
    # gradient to one source (backward): an infinite value stays infinite,
    # as on CPU (the bilinear form's zero weights made it 0 * inf = NaN)
    x = torch.tensor([[[[1.0, float("inf")], [-float("inf"), 2.0]]]], dtype=dtype)
    xt = x.to("tpu").requires_grad_()
    y = F.interpolate(xt, mode="nearest", **kw)
    xc = x.clone().requires_grad_()
    yc = F.interpolate(xc, mode="nearest", **kw)
    assert torch.equal(y.detach().cpu(), yc.detach())
    g = torch.ones_like(yc)
    g[0, 0, 0, 0] = float("inf")
    y.backward(g.to("tpu"))
    yc.backward(g)
    assert torch.equal(xt.grad.cpu(), xc.grad)


def test_conv_precision_follows_setting():
    x, w = rand(2, 16, 8, 8), rand(8, 16, 3, 3, seed=1)
    exact = F.conv2d(x.double(), w.double())
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        d = F.conv2d(x.to("tpu"), w.to("tpu")).cpu()
    torch.testing.assert_close(d, F.conv2d(x.bfloat16().float(), w.bfloat16().float()), rtol=1e-4, atol=1e-4)
    with torch.tpu.precision(torch.tpu.Precision.HIGH):
        h = F.conv2d(x.to("tpu"), w.to("tpu")).cpu()
    assert (h.double() - exact).abs().max() < (d.double() - exact).abs().max() / 50


# ------------------------------------------------------ 3-d conv and pooling

@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(padding=(1, 0, 2), dilation=(1, 2, 1)),
                                dict(groups=2, stride=(1, 2, 1))])
def test_conv3d(kw):
    check_grads(lambda x, w, b: F.conv3d(x, w, b, **kw), [rand(2, 4, 5, 6, 5), rand(6, 4 // kw.get("groups", 1), 3, 2, 3,
                                                                                 seed=1), rand(6, seed=2)])


def test_conv3d_same_and_transpose3d():
    check_grads(lambda x, w: F.conv3d(x, w, padding="same"), [rand(1, 2, 4, 4, 4), rand(3, 2, 3, 1, 2, seed=1)])
    check_grads(lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1),
                [rand(1, 3, 3, 4, 3), rand(3, 2, 3, 3, 3, seed=1), rand(2, seed=2)])


def test_conv_transpose2d_output_padding():
    check_grads(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(3, 2), padding=(1, 2), output_padding=(2, 1)),
                [rand(2, 2, 4, 4), rand(2, 2, 4, 5, seed=1), rand(4, seed=2)[:2]])


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=(2, 3, 2), stride=(1, 2, 1), ceil_mode=True),
                                dict(kernel_size=3, padding=1, count_include_pad=False),
                                dict(kernel_size=2, divisor_override=3)])
def test_avg_pool3d(kw):
    check_grads(lambda x: F.avg_pool3d(x, **kw), [rand(2, 3, 5, 6, 7)])


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=2, dilation=2, ceil_mode=True)])
def test_max_pool3d(kw):
    x = rand(2, 3, 5, 6, 7)
    check_grads(lambda x: F.max_pool3d(x, **kw), [x])
    _, idx = F.max_pool3d(x, return_indices=True, **kw)
    assert torch.equal(F.max_pool3d(x.to("tpu"), return_indices=True, **kw)[1].cpu(), idx)


def test_adaptive_pools_3d_and_unbatched():
    check_grads(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 5)), [rand(2, 3, 5, 6, 7)])
    check_grads(lambda x: F.adaptive_max_pool3d(x, (3, 2, 4)), [rand(3, 5, 6, 7)])
    check_grads(lambda x: F.interpolate(x, size=(2, 3, 4), mode="area"), [rand(1, 2, 5, 6, 7)])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_pool3d_dtypes(dtype):
    x = rand(1, 2, 4, 5, 6, dtype=dtype)
    close(F.max_pool3d(x.to("tpu"), 2), F.max_pool3d(x, 2))
    close(F.avg_pool3d(x.to("tpu"), 2), F.avg_pool3d(x.double(), 2).to(dtype))


def test_max_pool3d_nan_noncontiguous():
    x = rand(1, 2, 4, 4, 8)
    x[0, 1, 1, 1, 1] = float("nan")
    xt = x.to("tpu")[..., ::2]
    close(F.max_pool3d(xt, 2), F.max_pool3d(x[..., ::2], 2))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_unpool(nd):
    pool = [F.max_pool1d, F.max_pool2d, F.max_pool3d][nd - 1]
    unpool = [F.max_unpool1d, F.max_unpool2d, F.max_unpool3d][nd - 1]
    x = rand(2, 3, *([6] * nd))
    out, idx = pool(x, 2, return_indices=True)
    check_grads(lambda o: unpool(o, idx.to(o.device), 2), [out])


def test_max_unpool_bad_index_raises():
    x = rand(1, 1, 2, 2)
    idx = torch.tensor([[[[0, 1], [2, 99]]]])
    with pytest.raises(RuntimeError):
        F.max_unpool2d(x, idx, 2)
    with pytest.raises(RuntimeError):
        F.max_unpool2d(x.to("tpu"), idx.to("tpu"), 2)
        torch.tpu.synchronize()
    close(F.max_unpool2d(x.to("tpu"), torch.tensor([[[[0, 1], [2, 15]]]]).to("tpu"), 2),
          F.max_unpool2d(x, torch.tensor([[[[0, 1], [2, 15]]]]), 2))


@pytest.mark.parametrize("nd", [2, 3])
def test_fractional_max_pool(nd):
    fn = F.fractional_max_pool2d if nd == 2 else F.fractional_max_pool3d
    x = rand(2, 3, *([7] * nd))
    samples = torch.rand(2, 3, nd, generator=torch.Generator().manual_seed(3))
    check_grads(lambda x: fn(x, 2, output_size=4, _random_samples=samples.to(x.device)), [x])
    # without explicit samples: shape and values drawn from the input
    out = fn(x.to("tpu"), 3, output_ratio=(0.5,) * nd)
    assert out.shape == fn(x, 3, output_ratio=(0.5,) * nd).shape


# ------------------------------------------------------------ interpolation

@pytest.mark.parametrize("kw", [dict(scale_factor=2, mode="nearest"), dict(size=7, mode="nearest"),
                                dict(scale_factor=1.7, mode="nearest-exact"), dict(size=5, mode="linear"),
                                dict(scale_factor=2.5, mode="linear", align_corners=True),
                                dict(size=3, mode="linear")])
def test_interpolate_1d(kw):
    check_grads(lambda x: F.interpolate(x, **kw), [rand(2, 3, 6)])


@pytest.mark.parametrize("kw", [dict(size=(7, 5), mode="nearest-exact"), dict(scale_factor=2, mode="bicubic"),
                                dict(size=(5, 11), mode="bicubic", align_corners=True),
                                dict(size=(3, 4), mode="bilinear", antialias=True),
                                dict(size=(9, 12), mode="bilinear", antialias=True, align_corners=True),
                                dict(size=(3, 5), mode="bicubic", antialias=True)])
def test_interpolate_2d(kw):
    check_grads(lambda x: F.interpolate(x, **kw), [rand(2, 3, 6, 8)])


@pytest.mark.parametrize("kw", [dict(scale_factor=2, mode="nearest"), dict(size=(3, 7, 5), mode="nearest-exact"),
                                dict(size=(3, 7, 5), mode="trilinear"),
                                dict(scale_factor=(1.5, 2, 0.5), mode="trilinear", align_corners=True)])
def test_interpolate_3d(kw):
    check_grads(lambda x: F.interpolate(x, **kw), [rand(1, 2, 4, 5, 6)])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_interpolate_dtypes(dtype):
    x = rand(1, 2, 4, 5, 6, dtype=dtype)
    close(F.interpolate(x.to("tpu"), scale_factor=2, mode="trilinear"), F.interpolate(x, scale_factor=2,
                                                                                       mode="trilinear"))
    x2 = rand(1, 2, 5, 6, dtype=dtype)
    close(F.interpolate(x2.to("tpu"), size=(7, 9), mode="bicubic"), F.interpolate(x2, size=(7, 9), mode="bicubic"))


# ------------------------------------------------------------ grid sampling

@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d(mode, padding_mode, align_corners):
    x = rand(2, 3, 5, 6)
    grid = rand(2, 4, 7, 2, seed=1) * 0.8
    check_grads(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners),
                [x, grid])


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d(mode, padding_mode):
    x = rand(2, 2, 4, 5, 3)
    grid = rand(2, 3, 2, 4, 3, seed=1) * 0.8
    check_grads(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=False), [x, grid])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_grid_sample_forward_rows_over_the_threads(dtype):
    # one image (its output rows split over the threads), grid points
    # outside [-1, 1] (taps dropped under zeros padding), a channels-last
    # input, every mode and padding, 2-D and 3-D
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 5, 16, 20, generator=g).to(dtype)
    grid = (torch.rand(1, 33, 17, 2, generator=g) * 2.6 - 1.3).to(dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    for xx in (x, x.to(memory_format=torch.channels_last)):
        for mode in ("bilinear", "nearest", "bicubic"):
            for pad in ("zeros", "border", "reflection"):
                for align in (False, True):
                    # bfloat16: against float64 on the same values (the CPU
                    # computes the sampling coordinates in bfloat16 itself)
                    ref = (xx.double(), grid.double()) if dtype == torch.bfloat16 else (xx, grid)
                    want = F.grid_sample(*ref, mode=mode, padding_mode=pad, align_corners=align).to(dtype)
                    got = F.grid_sample(xx.to("tpu"), grid.to("tpu"), mode=mode, padding_mode=pad, align_corners=align)
                    torch.testing.assert_close(got.cpu(), want, **tol)
    x3 = torch.randn(1, 3, 6, 7, 8, generator=g).to(dtype)
    g3 = (torch.rand(1, 5, 9, 4, 3, generator=g) * 2.4 - 1.2).to(dtype)
    for mode in ("bilinear", "nearest"):
        ref = (x3.double(), g3.double()) if dtype == torch.bfloat16 else (x3, g3)
        want = F.grid_sample(*ref, mode=mode, align_corners=False).to(dtype)
        torch.testing.assert_close(F.grid_sample(x3.to("tpu"), g3.to("tpu"), mode=mode, align_corners=False).cpu(),
                                   want, **tol)


def test_grid_sample_errors():
    x, g = rand(1, 1, 3, 3), rand(1, 2, 2, 3)
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError):
            F.grid_sample(x.to(dev), g.to(dev), align_corners=False)


# ----------------------------------------------------------- unfold / fold

@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=(2, 3), stride=2, padding=1),
                                dict(kernel_size=3, dilation=2, padding=2)])
def test_unfold_fold(kw):
    check_grads(lambda x: F.unfold(x, **kw), [rand(2, 3, 6, 7)])
    cols = F.unfold(rand(2, 3, 6, 7), **kw)
    check_grads(lambda c: F.fold(c, (6, 7), **kw), [cols])
    check_grads(lambda x: F.unfold(x, **kw), [rand(3, 6, 7)])


def test_fold_errors_like_cpu():
    c = rand(1, 5, 9)
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError):
            F.fold(c.to(dev), (4, 4), kernel_size=2)


# ------------------------------- direct path: few input channels per group
# (ResNet's 7x7/2 stem, 1-D signals, depthwise): forward runs as register-
# tiled direct loops in the runtime (conv_direct.c), backward stays im2col.

FEW_CIN_CASES = [
    dict(shape=(2, 3, 23, 29), cout=8, k=7, stride=2, padding=3),  # the stem at small size
    dict(shape=(3, 1, 10, 17), cout=5, k=3),
    dict(shape=(1, 2, 11, 16), cout=6, k=5, stride=3, padding=2),
    dict(shape=(2, 4, 12, 13), cout=7, k=3, padding=2, dilation=2),
    dict(shape=(1, 6, 9, 10), cout=4, k=3, stride=2, padding=1, groups=2),
    dict(shape=(2, 4, 7, 9), cout=4, k=3, padding=1, groups=4),  # depthwise
]


@pytest.mark.parametrize("case", range(len(FEW_CIN_CASES)))
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_few_input_channels(case, bias):
    kw = dict(FEW_CIN_CASES[case])
    shape, cout, k = kw.pop("shape"), kw.pop("cout"), kw.pop("k")
    x, w = rand(*shape), rand(cout, shape[1] // kw.get("groups", 1), k, k, seed=1)
    args = [x, w] + ([rand(cout, seed=2)] if bias else [])
    check_grads(lambda x, w, *b: F.conv2d(x, w, b[0] if b else None, **kw), args)


def _fma_order_conv(x, w, b, stride, padding):
    """The direct path's arithmetic in f32: bias, then one fused multiply-add
    per (c_in, kh, kw) tap in order, padding taps included (the f64 product
    of two floats is exact, so one f64 add rounded to f32 is the fma)."""
    n, cin, _, _ = x.shape
    cout, _, kh, kw = w.shape
    xp = F.pad(x, (padding,) * 4)
    ho, wo = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    acc = (b if b is not None else torch.zeros(cout)).view(1, cout, 1, 1).expand(n, cout, ho, wo).clone()
    for c in range(cin):
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, c, i:i + (ho - 1) * stride + 1:stride, j:j + (wo - 1) * stride + 1:stride]
                acc = (acc.double() + w[:, c, i, j].double().view(1, cout, 1, 1) * tap.double()[:, None]).float()
    return acc


@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_few_input_channels_exact_order(bias):
    # one thread per output with a fixed order: bit-identical to the
    # sequential reference whatever the tiling or thread count
    x, w = rand(2, 3, 23, 29), rand(8, 3, 7, 7, seed=1)
    b = rand(8, seed=2) if bias else None
    got = F.conv2d(x.to("tpu"), w.to("tpu"), b.to("tpu") if bias else None, stride=2, padding=3).cpu()
    assert torch.equal(got, _fma_order_conv(x, w, b, 2, 3))


def test_conv2d_stem_channels_last_bf16_nan():
    x, w, b = rand(2, 3, 30, 34), rand(16, 3, 7, 7, seed=1), rand(16, seed=2)
    xc = x.to(memory_format=torch.channels_last)
    assert not xc.is_contiguous()
    check_grads(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=3), [xc, w, b])
    xs = rand(2, 3, 30, 68)[..., ::2]  # strided view
    close(F.conv2d(xs.to("tpu"), w.to("tpu"), b.to("tpu"), stride=2, padding=3),
          F.conv2d(xs, w, b, stride=2, padding=3))
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    check_grads(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=3), [xb, wb, bb])
    xn = x.clone()
    xn[1, 2, 10, 11] = float("nan")
    want = F.conv2d(xn, w, b, stride=2, padding=3)
    got = F.conv2d(xn.to("tpu"), w.to("tpu"), b.to("tpu"), stride=2, padding=3).cpu()
    assert torch.equal(got.isnan(), want.isnan()) and 0 < want.isnan().sum() < want.numel()
    torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_bias_gradient_is_the_float64_sum(dtype, channels_last):
    # the bias gradient sums dy over images and positions in double (an
    # image's rows in vector lanes, in parallel over channels): the float64
    # sum rounded once, from the bf16 kernels' strided views and the f32
    # path alike (24 x 24 planes, channels-last dy read with its strides)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 32, 24, 24, generator=g).to(dtype)
    w = torch.randn(48, 32, 3, 3, generator=g).to(dtype)
    dy = torch.randn(3, 48, 24, 24, generator=g).to(dtype)
    if channels_last:
        x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
    args = (dy.to("tpu"), x.to("tpu"), w.to("tpu"), [48], [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    _, dw, db = torch.ops.aten.convolution_backward(*args, [False, True, True])
    want = dy.double().sum((0, 2, 3)).to(dtype)
    assert torch.equal(db.cpu(), want)
    _, _, db_only = torch.ops.aten.convolution_backward(*args, [False, False, True])
    assert torch.equal(db_only.cpu(), want)
