"""bf16 convolutions at every kernel level the host can run (TORCH_TPU_ISA):
forward, input gradient and weight/bias gradients through autograd, against
a float64 reference within the precision contract (bf16 products exact, f32
accumulation over K, one bf16 rounding), with odd channels, K not a multiple
of the tile, strides 1/2, padding, dilation, groups, batch 1 and > 1,
channels-last and sliced (non-contiguous) inputs, and a transposed
convolution (a stride-2 input gradient in its forward). At level amx the
passes run on the tile unit, at avx512 on a CPU with AVX512-BF16 on its dot
products when TORCH_TPU_CONV_BF16=1 asks for them (by default only large
passes; libtpurt's tpurt_bf16_conv_tile_passes counts them); below, and with
TORCH_TPU_CONV_BF16=0 (or TORCH_TPU_CONV_AMX=0), they never do."""
from __future__ import annotations

import json

import pytest

from torch_tpu import _C
from tests.conftest import run_python

LEVELS = ["scalar", "avx2", "avx512", "amx"]
HOST = _C._cpu_info()
RUNNABLE = LEVELS[: LEVELS.index(HOST["host_isa"]) + 1]

# the precision contract's bound for a child's results against float64 (CHILD's check: per case)
WORST = r"""
def worst_of(cases):
    # the largest error over its bound (a NaN anywhere: infinite)
    worst = 0.0
    for got, ref, mag, k in cases:
        bound = (k + 2) * 2.0**-23 * mag + 2.0**-8 * ref.abs() + 1e-30
        r = ((got.double() - ref).abs() / bound).max().item()
        worst = max(worst, r if r == r else float("inf"))
    return worst
"""

CHILD = WORST + r"""
import ctypes, json, pathlib, torch, torch_tpu
import torch.nn.functional as F
lib = ctypes.CDLL("libtpurt.so")  # by soname: the variant torch_tpu mapped
lib.tpurt_bf16_conv_tile_passes.restype = ctypes.c_uint64
lib.tpurt_bf16_conv_path.restype = ctypes.c_char_p
lib.tpurt_bf16_conv_implicit_passes.restype = ctypes.c_uint64
torch.manual_seed(0)
out = {"worst": 0.0, "cases": 0}
def check(name, got, ref, mag, k):
    r = worst_of(((got, ref, mag, k),))
    if not r <= 1.0:
        print("FAIL", name, r)
    out["worst"] = max(out["worst"], r)
def conv_grads(x, w, b, gy, **kw):
    # values and gradients on tpu (bf16) and the float64 reference with |.| magnitudes
    xt = x.to("tpu").requires_grad_(); wt = w.to("tpu").requires_grad_()
    bt = b.to("tpu").requires_grad_() if b is not None else None
    y = F.conv2d(xt, wt, bt, **kw)
    y.backward(gy.to("tpu"))
    xd, wd, gd = x.double().requires_grad_(), w.double().requires_grad_(), gy.double()
    bd = b.double().requires_grad_() if b is not None else None
    yd = F.conv2d(xd, wd, bd, **kw)
    yd.backward(gd)
    ya = F.conv2d(x.double().abs(), w.double().abs(), b.double().abs() if b is not None else None, **kw)
    xa, wa = x.double().abs().requires_grad_(), w.double().abs().requires_grad_()
    F.conv2d(xa, wa, None, **kw).backward(gd.abs())
    return (y, yd, ya), (xt.grad, xd.grad, xa.grad), (wt.grad, wd.grad, wa.grad), \
        (bt.grad if b is not None else None, bd.grad if b is not None else None)
cases = [
    # N, Ci, H, W, Co, k, dict(stride, padding, dilation, groups), bias, layout
    (2, 32, 16, 16, 32, 3, dict(padding=1), False, "nchw"),
    (3, 7, 9, 11, 5, 3, dict(padding=1), True, "nchw"),
    (1, 13, 12, 10, 9, 3, dict(stride=2, padding=1), True, "nchw"),
    (2, 16, 11, 13, 24, 1, dict(stride=2), False, "nchw"),
    (2, 6, 14, 15, 8, 3, dict(padding=2, dilation=2), False, "nchw"),
    (2, 12, 10, 9, 18, 3, dict(padding=1, groups=3), True, "nchw"),
    (2, 33, 6, 6, 70, 3, dict(padding=1), True, "channels_last"),
    (2, 16, 9, 9, 16, 3, dict(stride=2, padding=1), False, "channels_last"),
    (2, 20, 9, 12, 11, 3, dict(stride=(2, 1), padding=(0, 1)), True, "sliced"),
    (2, 256, 4, 4, 64, 3, dict(padding=1), False, "nchw"),
]
for N, ci, H, W, co, k, kw, bias, layout in cases:
    g = kw.get("groups", 1)
    x = torch.randn(N, ci, H, W).bfloat16()
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "sliced":
        x = torch.randn(N, ci, H, 2 * W).bfloat16()[..., ::2]
    w = torch.randn(co, ci // g, k, k).bfloat16()
    b = torch.randn(co).bfloat16() if bias else None
    with torch.no_grad():
        yshape = F.conv2d(x.float(), w.float(), None, **kw).shape
    gy = torch.randn(yshape).bfloat16()
    if layout == "channels_last":
        gy = gy.contiguous(memory_format=torch.channels_last)
    (y, yd, ya), (gx, gxd, gxa), (gw, gwd, gwa), (gb, gbd) = conv_grads(x, w, b, gy, **kw)
    kk = k * k
    check(f"fwd {N, ci, co, kw}", y.detach().cpu(), yd.detach(), ya + (b.double().abs().view(1, -1, 1, 1) if bias else 0),
          ci // g * kk + 1)
    check(f"dx {N, ci, co, kw}", gx.cpu(), gxd, gxa, co // g * kk)
    npos = yshape[0] * yshape[2] * yshape[3]
    check(f"dw {N, ci, co, kw}", gw.cpu(), gwd, gwa, npos)
    if bias:
        check(f"db {N, ci, co, kw}", gb.cpu(), gbd, gy.double().abs().sum((0, 2, 3)), npos)
    out["cases"] += 1
# a transposed convolution (UNet's upsampler): its forward is a stride-2 input gradient
x = torch.randn(2, 24, 5, 5).bfloat16(); w = torch.randn(24, 16, 4, 4).bfloat16()
y = F.conv_transpose2d(x.to("tpu"), w.to("tpu"), stride=2, padding=1).cpu()
yd = F.conv_transpose2d(x.double(), w.double(), stride=2, padding=1)
ya = F.conv_transpose2d(x.double().abs(), w.double().abs(), stride=2, padding=1)
check("conv_transpose2d", y, yd, ya, 24 * 16)
out["passes"] = lib.tpurt_bf16_conv_tile_passes()
out["implicit"] = lib.tpurt_bf16_conv_implicit_passes()
out["path"] = lib.tpurt_bf16_conv_path().decode()
print(json.dumps(out))
"""


def _run(env, code=CHILD):
    r = run_python(code, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout, r.stdout
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("level", RUNNABLE)
def test_bf16_conv_within_contract(level):
    out = _run({"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_BF16": "1"})  # every pass (by default: large ones)
    assert out["worst"] <= 1.0 and out["cases"] == 10, out
    want = _bf16_kernel(level)
    if want:
        assert out["path"] == want
        assert out["passes"] >= 31, out  # every case's three passes ran on the bf16 kernel (and the transposed one)
    else:
        assert out["path"] == "f32 implicit GEMM" and out["passes"] == 0, out


def _bf16_kernel(level):
    """The bf16 convolution kernel at a level: the tile unit at amx, the
    AVX512-BF16 dot products at avx512 on a CPU that has them, else none."""
    if level == "amx":
        return "amx-bf16 tiles"
    if level == "avx512" and HOST["features"]["avx512_bf16"]:
        return "avx512-bf16 dot products"
    return None


def test_bf16_conv_default_kernel():
    """By default the tile unit runs bf16 convolutions where there is one;
    the dot products only large passes and small images (the cases above
    are small passes)."""
    level = RUNNABLE[-1]
    out = _run({"TORCH_TPU_ISA": level})
    if level == "amx":
        assert out["path"] == "amx-bf16 tiles" and out["passes"] >= 31, out
    elif _bf16_kernel(level):
        # the cases are small passes; those with >= 32 channels in one group
        # run their forward pass and input gradient on patch rows: copied at
        # <= 64 positions an image (33 -> 70 at 6 x 6; the input gradient of
        # 256 -> 64 at 4 x 4: 64 channels in), read in place at unit strides
        # above (2 x 32 x 16 x 16) and for >= 128 channels in (the forward
        # pass of 256 -> 64 at 4 x 4); and the weight gradient of 256 -> 64
        # at 4 x 4 (channels in 32s) in place
        assert out["path"] == "avx512-bf16 dot products for large passes, f32 implicit GEMM below", out
        assert out["passes"] == 7 and out["implicit"] == 4, out
    else:
        assert out["path"] == "f32 implicit GEMM" and out["passes"] == 0, out


SHAPES = WORST + r"""
import ctypes, json, torch, torch_tpu
import torch.nn.functional as F
lib = ctypes.CDLL("libtpurt.so")
lib.tpurt_bf16_conv_tile_passes.restype = ctypes.c_uint64
lib.tpurt_bf16_conv_implicit_passes.restype = ctypes.c_uint64
torch.manual_seed(0)
res = {}
# name: N, C, H (= W); 3 x 3, padding 1, C -> C
for name, n, c, h in (("large", 8, 64, 32), ("small", 2, 32, 16), ("4x4", 16, 256, 4), ("8x8 few channels", 2, 16, 8),
                      ("16x16 many images", 32, 64, 16), ("8x8", 4, 128, 8)):
    x = torch.randn(n, c, h, h).bfloat16(); w = torch.randn(c, c, 3, 3).bfloat16()
    gy = torch.randn(n, c, h, h).bfloat16()
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    before, implicit = lib.tpurt_bf16_conv_tile_passes(), lib.tpurt_bf16_conv_implicit_passes()
    y = F.conv2d(xt, wt, padding=1)
    y.backward(gy.to("tpu"))
    torch.tpu.synchronize()
    passes = lib.tpurt_bf16_conv_tile_passes() - before
    implicit = lib.tpurt_bf16_conv_implicit_passes() - implicit
    # within the precision contract (see CHILD), against float64
    worst = worst_of((
            (y.detach().cpu(), F.conv2d(x.double(), w.double(), padding=1),
             F.conv2d(x.double().abs(), w.double().abs(), padding=1), c * 9),
            (xt.grad.cpu(), torch.nn.grad.conv2d_input(x.shape, w.double(), gy.double(), padding=1),
             torch.nn.grad.conv2d_input(x.shape, w.double().abs(), gy.double().abs(), padding=1), c * 9),
            (wt.grad.cpu(), torch.nn.grad.conv2d_weight(x.double(), w.shape, gy.double(), padding=1),
             torch.nn.grad.conv2d_weight(x.double().abs(), w.shape, gy.double().abs(), padding=1), n * h * h)))
    res[name] = {"passes": passes, "implicit": implicit, "worst": worst}
print(json.dumps(res))
"""


@pytest.mark.parametrize("patch", ["", "0"])
def test_bf16_conv_passes_by_shape_without_the_tile_unit(patch):
    # without the tile unit the AVX512-BF16 dot products run a pass of
    # >= 2^28 multiply-adds whose padded column space keeps >= 3/4 of its
    # columns (8 x 64 -> 64 at 32^2: all three passes, on patch rows read in
    # place at any image size; TORCH_TPU_CONV_PATCH=0: the column space);
    # small images (4 x 4,
    # >= 128 channels) run their forward pass, input gradient and weight
    # gradient on patch rows read in place (TORCH_TPU_CONV_PATCH=0: the f32
    # path, the column space would compute two columns per kept one); a small pass of 32 channels at 16 x 16 its forward pass
    # and input gradient on patch rows read in place (TORCH_TPU_CONV_PATCH=0:
    # the f32 path); few channels the f32 path; 32 images of 64 channels at
    # 16 x 16 (large passes, <= 256 positions, >= 64 channels, a weight
    # gradient of 2 tasks for 2 threads) all three passes in place
    # (TORCH_TPU_CONV_PATCH=0: the column space); 128 channels at 8 x 8 in
    # place, tiles of one output row skipping the taps of padding rows (4 x 4:
    # one position of 8 images, skipping the taps of padding rows and columns).
    # Every result within the precision contract.
    level = RUNNABLE[-1]
    if level != "avx512" or not _bf16_kernel(level):
        pytest.skip("the shape rules concern AVX512-BF16 hosts without AMX")
    out = _run({"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_PATCH": patch, "TPU_NUM_THREADS": "2"}, SHAPES)
    assert all(v["worst"] <= 1.0 for v in out.values()), out
    want = {"large": 3, "small": 2 if patch == "" else 0, "4x4": 3 if patch == "" else 0, "8x8 few channels": 0,
            "16x16 many images": 3, "8x8": 3 if patch == "" else 0}
    assert {k: v["passes"] for k, v in out.items()} == want, out
    implicit = {"large": 3 if patch == "" else 0, "small": want["small"], "4x4": want["4x4"], "8x8 few channels": 0,
                "16x16 many images": 3 if patch == "" else 0, "8x8": want["8x8"]}
    assert {k: v["implicit"] for k, v in out.items()} == implicit, out


PATCH_CASES = """cases = [
    (2, 40, 7, 9, 36, 3, dict(padding=2, dilation=2), False, "nchw"),
    (2, 48, 9, 8, 40, 3, dict(stride=2, padding=1), True, "nchw"),
    (3, 64, 5, 6, 33, 3, dict(stride=(2, 1), padding=(0, 1)), True, "channels_last"),
    (2, 32, 6, 7, 32, 1, dict(), True, "sliced"),
    (1, 96, 3, 3, 64, 3, dict(padding=1), True, "nchw"),
    (2, 64, 4, 4, 32, 5, dict(padding=2), False, "nchw"),
    (2, 32, 7, 8, 32, 1, dict(stride=2), True, "nchw"),
]
_all = ["""


@pytest.mark.parametrize("patch", ["1", "implicit"])
def test_bf16_conv_patch_rows_within_contract(patch):
    # the patch-row products (TORCH_TPU_CONV_PATCH=1: copied wherever they
    # can run; implicit: read in place wherever they can, channels in pairs)
    # on dilation, strides (2, 1) and 2, uneven padding, bias, channels-last
    # and sliced inputs, 1 x 1 and 5 x 5 kernels: every forward pass and the
    # stride-1 input gradients on patch rows (7 + 4 passes, all with an even
    # channel count; weight gradients on the f32 path) and, in place only,
    # the stride-2 input gradients of 48 -> 40 phase by phase (4 passes) and
    # of the 1 x 1 stride-2 32 -> 32 (1 pass: the other three phases are
    # no tap's, zero; 33 channels of dy at strides (2, 1) are odd) and the
    # weight gradients with channels in 32s and an even number of positions
    # and dy's rows unit-stride (1 x 1, 5 x 5, 1 x 1 stride 2: 3 passes),
    # every result within the precision contract
    level = RUNNABLE[-1]
    if level != "avx512" or not _bf16_kernel(level):
        pytest.skip("patch rows run on the AVX512-BF16 dot products without AMX")
    out = _run({"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_PATCH": patch}, CHILD.replace("cases = [", PATCH_CASES, 1))
    passes = 19 if patch == "implicit" else 11
    assert out["worst"] <= 1.0 and out["cases"] == 7 and out["passes"] == passes, out
    assert out["implicit"] == (passes if patch == "implicit" else 0), out


@pytest.mark.parametrize("switch", ["TORCH_TPU_CONV_BF16", "TORCH_TPU_CONV_AMX"])
def test_bf16_conv_kernel_can_be_turned_off(switch):
    level = next((lv for lv in reversed(RUNNABLE) if _bf16_kernel(lv)), None)
    if level is None:
        pytest.skip("this host has no bf16 matrix hardware (AMX or AVX512-BF16)")
    out = _run({"TORCH_TPU_ISA": level, switch: "0"})
    assert out["worst"] <= 1.0 and out["path"] == "f32 implicit GEMM" and out["passes"] == 0, out


def test_bf16_weight_gradient_with_non_finite_dy_like_the_f32_path():
    # patch rows in place (the default for this 4 x 4 pass) multiply the
    # zero padding by dy as the f32 path does: an Inf in dy gives the same
    # Inf / NaN pattern as the f32 path (TORCH_TPU_CONV_PATCH=0) and as the
    # float64 reference (zero padding times Inf is NaN; CPU's float32
    # convolution skips the padding instead), the finite values within bf16
    code = r"""
import ctypes, json, torch, torch_tpu
lib = ctypes.CDLL("libtpurt.so"); lib.tpurt_bf16_conv_implicit_passes.restype = ctypes.c_uint64
torch.manual_seed(0)
x = torch.randn(2, 32, 4, 4).bfloat16()
gy = torch.randn(2, 32, 4, 4).bfloat16()
gy[0, 3, 0, 0] = float("inf")
got = torch.ops.aten.convolution_backward(gy.to("tpu"), x.to("tpu"), torch.zeros(32, 32, 3, 3).bfloat16().to("tpu"),
                                          None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])[1].cpu()
ref = torch.nn.grad.conv2d_weight(x.double(), (32, 32, 3, 3), gy.double(), padding=1)
fin = torch.isfinite(ref)
print(json.dumps({"same_pattern": bool(torch.equal(torch.isfinite(got), fin) and
                                       torch.equal(torch.isnan(got), torch.isnan(ref))),
                  "finite_err": float(((got.double() - ref).abs()[fin] / (ref.abs()[fin] + 1)).max()),
                  "implicit": lib.tpurt_bf16_conv_implicit_passes(), "nan": int(torch.isnan(got).sum())}))
"""
    level = RUNNABLE[-1]
    ours = _run({"TORCH_TPU_ISA": level}, code)
    f32 = _run({"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_PATCH": "0"}, code)
    assert ours["same_pattern"] and ours["finite_err"] < 0.05 and ours["nan"] == f32["nan"] > 0, (ours, f32)
    assert f32["same_pattern"] and f32["implicit"] == 0, f32
    if level == "avx512" and _bf16_kernel(level):
        assert ours["implicit"] == 1, ours


FUSED = r"""
import hashlib, json, torch, torch_tpu
import torch.nn.functional as F
torch.manual_seed(0)
out = {}
# column-space passes (rows: output channels <= 512): 64 -> 96 at 12 x 12,
# stride 1 and 2, bias; 40 -> 24 with 2 groups
for name, n, ci, co, h, kw in (("s1", 2, 64, 96, 12, dict(padding=1)), ("s2", 2, 64, 96, 12, dict(stride=2, padding=1)),
                               ("groups", 3, 40, 24, 9, dict(padding=1, groups=2))):
    x = torch.randn(n, ci, h, h).bfloat16()
    w = torch.randn(co, ci // kw.get("groups", 1), 3, 3).bfloat16()
    b = torch.randn(co).bfloat16()
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu")
    y = F.conv2d(xt, wt, b.to("tpu"), **kw)
    y.backward(torch.ones_like(y))
    ref = F.conv2d(x.double(), w.double(), b.double(), **kw)
    err = ((y.detach().cpu().double() - ref).abs() / (ref.abs() + 1)).max().item()
    out[name] = [hashlib.sha256(t.detach().cpu().view(torch.int16).numpy().tobytes()).hexdigest()
                 for t in (y, xt.grad)] + [err]
print(json.dumps(out))
"""


def test_bf16_conv_fused_tasks_same_bits_as_panels():
    # on the dot products, a forward pass or input gradient in the column
    # space runs fused tasks (each packs its own column block and runs every
    # row over it) or, with TORCH_TPU_BGEMM_FUSED=0, shared panels packed
    # first: the same kernel calls on the same chunks of K, so the same bits
    level = RUNNABLE[-1]
    if level != "avx512" or not _bf16_kernel(level):
        pytest.skip("fused tasks run on AVX512-BF16 hosts without AMX")
    env = {"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_BF16": "1", "TORCH_TPU_CONV_PATCH": "0", "TPU_NUM_THREADS": "2"}
    fused = _run(env, FUSED)
    panels = _run(dict(env, TORCH_TPU_BGEMM_FUSED="0"), FUSED)
    assert set(fused) == {"s1", "s2", "groups"}
    for k in fused:
        assert fused[k][:2] == panels[k][:2], k
        assert fused[k][2] < 2.0**-7 and panels[k][2] < 2.0**-7, (k, fused[k][2], panels[k][2])


ONE_BY_ONE = WORST + r"""
import ctypes, json, torch, torch_tpu
import torch.nn.functional as F
lib = ctypes.CDLL("libtpurt.so")
lib.tpurt_bf16_conv_tile_passes.restype = ctypes.c_uint64
torch.manual_seed(0)
res = {}
for name, n, ci, co, h, layout, bias in (("nchw", 4, 64, 96, 12, "nchw", True), ("no bias", 3, 40, 24, 8, "nchw", False),
                                          ("channels_last", 4, 64, 96, 12, "channels_last", True),
                                          ("4x4", 4, 64, 96, 4, "nchw", True)):
    x = torch.randn(n, ci, h, h).bfloat16(); w = torch.randn(co, ci, 1, 1).bfloat16()
    b = torch.randn(co).bfloat16() if bias else None
    gy = torch.randn(n, co, h, h).bfloat16()
    if layout == "channels_last":
        x, gy = x.contiguous(memory_format=torch.channels_last), gy.contiguous(memory_format=torch.channels_last)
    xt = x.to("tpu").requires_grad_()
    before = lib.tpurt_bf16_conv_tile_passes()
    y = F.conv2d(xt, w.to("tpu"), b.to("tpu") if bias else None)
    y.backward(gy.to("tpu"))
    torch.tpu.synchronize()
    passes = lib.tpurt_bf16_conv_tile_passes() - before
    bd = b.double() if bias else None
    ref = F.conv2d(x.double(), w.double(), bd)
    mag = F.conv2d(x.double().abs(), w.double().abs(), bd.abs() if bias else None)
    gref = torch.nn.grad.conv2d_input(x.shape, w.double(), gy.double())
    gmag = torch.nn.grad.conv2d_input(x.shape, w.double().abs(), gy.double().abs())
    res[name] = {"passes": passes, "worst": worst_of(((y.detach().cpu(), ref, mag, ci + 1), (xt.grad.cpu(), gref, gmag, co)))}
print(json.dumps(res))
"""


def test_bf16_one_by_one_convolutions_as_batched_products():
    # on the dot products a 1 x 1 convolution at unit stride without padding
    # (planes of >= 64 positions, NCHW or channels-last) runs its forward pass
    # (bias added before the one rounding) and input gradient as batched bf16
    # products — small passes the other bf16 kernels leave to the f32 path
    # (as TORCH_TPU_CONV_PATCH=0 shows: it keeps the former paths); 4 x 4
    # planes keep theirs (copied patch rows); all within the precision contract
    level = RUNNABLE[-1]
    if level != "avx512" or not _bf16_kernel(level):
        pytest.skip("1 x 1 products run on AVX512-BF16 hosts without AMX")
    out = _run({"TORCH_TPU_ISA": level}, ONE_BY_ONE)
    former = _run({"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_PATCH": "0"}, ONE_BY_ONE)
    for o in (out, former):
        assert all(v["worst"] <= 1.0 for v in o.values()), o
    assert {k: v["passes"] for k, v in out.items()} == {"nchw": 2, "no bias": 2, "channels_last": 2, "4x4": 2}, out
    assert {k: v["passes"] for k, v in former.items()} == {"nchw": 0, "no bias": 0, "channels_last": 0, "4x4": 0}, former


ONE_CHANNEL = WORST + r"""
import ctypes, json, torch, torch_tpu
import torch.nn.functional as F
lib = ctypes.CDLL("libtpurt.so")
lib.tpurt_bf16_conv_implicit_passes.restype = ctypes.c_uint64
torch.manual_seed(0)
res = {}
for name, layout, h, w_ in (("nchw", "nchw", 12, 12), ("wide", "nchw", 3, 70), ("sliced", "sliced", 10, 11),
                           ("channels_last", "channels_last", 9, 12)):
    x = torch.randn(3, 64, h, 2 * w_).bfloat16()[..., ::2] if layout == "sliced" else torch.randn(3, 64, h, w_).bfloat16()
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(1, 64, 3, 3).bfloat16(); b = torch.randn(1).bfloat16()
    before = lib.tpurt_bf16_conv_implicit_passes()
    y = F.conv2d(x.to("tpu"), w.to("tpu"), b.to("tpu"), padding=1).cpu()
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    mag = F.conv2d(x.double().abs(), w.double().abs(), b.double().abs(), padding=1)
    res[name] = {"implicit": lib.tpurt_bf16_conv_implicit_passes() - before,
                 "worst": worst_of(((y, ref, mag, 64 * 9 + 1),))}
print(json.dumps(res))
"""


def test_bf16_one_output_channel_as_dot_products():
    # a forward pass to one channel on patch rows read in place (64 -> 1,
    # UNet's output layer) runs a dot product per position over its taps'
    # channel runs, the images laid out channels-last from NCHW (blocks of 16
    # channels x 64 pixels: a 70-wide image has two), sliced and channels-last
    # views; within the precision contract
    level = RUNNABLE[-1]
    if level != "avx512" or not _bf16_kernel(level):
        pytest.skip("patch rows run on the AVX512-BF16 dot products without AMX")
    out = _run({"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_PATCH": "implicit"}, ONE_CHANNEL)
    assert all(v["worst"] <= 1.0 and v["implicit"] == 1 for v in out.values()), out


FEW_CHANNELS = WORST + r"""
import ctypes, json, torch, torch_tpu
import torch.nn.functional as F
lib = ctypes.CDLL("libtpurt.so")
lib.tpurt_bf16_conv_tile_passes.restype = ctypes.c_uint64
torch.manual_seed(0)
res = {}
# N, Ci, H, W, Co, kernel, conv kwargs, layout
for name, n, ci, h, w_, co, k, kw, layout in (
        ("64->1", 3, 64, 12, 12, 1, 3, dict(padding=1), "nchw"),
        ("64->2 wide", 2, 64, 3, 70, 2, 3, dict(padding=1), "nchw"),
        ("1->16 5x5", 3, 1, 11, 9, 16, 5, dict(padding=2), "nchw"),
        ("1->8 valid", 2, 1, 10, 13, 8, 3, dict(), "nchw"),
        ("32->1 pad (0, 2)", 2, 32, 7, 9, 1, 3, dict(padding=(0, 2)), "channels_last"),
        ("24->1 sliced", 2, 24, 8, 10, 1, 3, dict(padding=1), "sliced")):
    x = torch.randn(n, ci, h, 2 * w_).bfloat16()[..., ::2] if layout == "sliced" else torch.randn(n, ci, h, w_).bfloat16()
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(co, ci, k, k).bfloat16()
    ysz = F.conv2d(x.float(), w.float(), **kw).shape
    gy = torch.randn(ysz).bfloat16()
    before = lib.tpurt_bf16_conv_tile_passes()
    pad = list(torch.nn.modules.utils._pair(kw.get("padding", 0)))
    got = torch.ops.aten.convolution_backward(gy.to("tpu"), x.to("tpu"), w.to("tpu"), None, [1, 1], pad, [1, 1], False,
                                              [0, 0], 1, [False, True, False])[1].cpu()
    passes = lib.tpurt_bf16_conv_tile_passes() - before
    ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, gy.double(), **kw)
    mag = torch.nn.grad.conv2d_weight(x.double().abs(), w.shape, gy.double().abs(), **kw)
    res[name] = {"passes": passes, "worst": worst_of(((got, ref, mag, ysz[0] * ysz[2] * ysz[3]),))}
print(json.dumps(res))
"""


def test_bf16_weight_gradients_with_few_channels_as_direct_sums():
    # weight gradients with <= 2 output channels or one input channel (an
    # image model's output and input convolutions) at unit stride sum the
    # products of each (output, input) channel pair's planes directly
    # (without the AMX tile unit: the column-space product rounded the small
    # side to 16 columns, and these passes were left to the f32 path): 3 x 3
    # and 5 x 5, padded and valid, a tail of a 70-wide row, channels-last
    # and sliced images, within the precision contract; the pass counts as a
    # bf16 kernel pass
    level = RUNNABLE[-1]
    if level != "avx512" or not _bf16_kernel(level):
        pytest.skip("the direct sums serve AVX512-BF16 hosts without AMX")
    out = _run({"TORCH_TPU_ISA": level}, FEW_CHANNELS)
    assert all(v["worst"] <= 1.0 and v["passes"] == 1 for v in out.values()), out


def test_bf16_strided_weight_gradient_with_non_finite_image_like_the_reference():
    # a stride-2 weight gradient on the column space (TORCH_TPU_CONV_PATCH=0)
    # checks the copied phase planes for non-finite values: an Inf in the
    # image's last column, which the column space also reads as a dropped
    # column (its products with dy's zeros would be NaN), sends the pass to
    # the f32 path: the Inf / NaN pattern of the float64 reference and its
    # finite values within bf16; the same on the default route (patch rows)
    code = r"""
import json, torch, torch_tpu
torch.manual_seed(0)
x = torch.randn(32, 32, 32, 32).bfloat16()  # 113M multiply-adds: the dot products
x[1, 5, 9, 31] = float("inf")
gy = torch.randn(32, 48, 16, 16).bfloat16()
got = torch.ops.aten.convolution_backward(gy.to("tpu"), x.to("tpu"), torch.zeros(48, 32, 3, 3).bfloat16().to("tpu"),
                                          None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])[1].cpu()
ref = torch.nn.grad.conv2d_weight(x.double(), (48, 32, 3, 3), gy.double(), stride=2, padding=1)
fin = torch.isfinite(ref)
print(json.dumps({"same_pattern": bool(torch.equal(torch.isfinite(got), fin) and
                                       torch.equal(torch.isnan(got), torch.isnan(ref))),
                  "finite_err": float(((got.double() - ref).abs()[fin] / (ref.abs()[fin] + 1)).max()),
                  "nonfinite": int((~fin).sum())}))
"""
    level = RUNNABLE[-1]
    for patch in ("0", ""):
        out = _run({"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_PATCH": patch}, code)
        assert out["same_pattern"] and out["finite_err"] < 0.05 and out["nonfinite"] > 0, (patch, out)


STRIDED_ONE = WORST + r"""
import json, torch, torch_tpu
import torch.nn.functional as F
torch.manual_seed(0)
res = {}
# 1 x 1 kernels at stride 2 (ResNet's shortcuts): the forward pass on the
# images subsampled dense (batched products from 64 positions an image), the
# weight gradient on a unit stride's column space over them
for name, n, ci, co, h, layout in (("16x16", 4, 64, 96, 16, "nchw"), ("channels_last", 4, 64, 96, 16, "channels_last"),
                                   ("17x17", 2, 32, 48, 17, "nchw"), ("sliced", 3, 32, 40, 16, "sliced")):
    x = torch.randn(n, ci, h, 2 * h).bfloat16()[..., ::2] if layout == "sliced" else torch.randn(n, ci, h, h).bfloat16()
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(co, ci, 1, 1).bfloat16(); b = torch.randn(co).bfloat16()
    ho = (h - 1) // 2 + 1
    gy = torch.randn(n, co, ho, ho).bfloat16()
    wt = w.to("tpu").requires_grad_()
    y = F.conv2d(x.to("tpu"), wt, b.to("tpu"), stride=2)
    y.backward(gy.to("tpu"))
    ref = F.conv2d(x.double(), w.double(), b.double(), stride=2)
    mag = F.conv2d(x.double().abs(), w.double().abs(), b.double().abs(), stride=2)
    gw = torch.nn.grad.conv2d_weight(x.double(), w.shape, gy.double(), stride=2)
    gwm = torch.nn.grad.conv2d_weight(x.double().abs(), w.shape, gy.double().abs(), stride=2)
    res[name] = worst_of(((y.detach().cpu(), ref, mag, ci + 1), (wt.grad.cpu(), gw, gwm, n * ho * ho)))
print(json.dumps(res))
"""


@pytest.mark.parametrize("bf16", ["", "1"])
def test_bf16_strided_one_by_one_convolutions_on_subsampled_images(bf16):
    # forward passes and weight gradients of 1 x 1 kernels at stride 2 read
    # x[:, :, ::2, ::2] copied dense (NCHW, channels-last, sliced; an odd
    # image whose 9 x 9 planes leave dropped columns); TORCH_TPU_CONV_BF16=1
    # also sends the small weight gradients to the bf16 kernel; all within
    # the precision contract
    level = RUNNABLE[-1]
    if level != "avx512" or not _bf16_kernel(level):
        pytest.skip("the subsampled passes run on AVX512-BF16 hosts without AMX")
    out = _run({"TORCH_TPU_ISA": level, "TORCH_TPU_CONV_BF16": bf16}, STRIDED_ONE)
    assert all(v <= 1.0 for v in out.values()), out
