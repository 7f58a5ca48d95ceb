"""Elementwise ops on the tpu device against PyTorch CPU: every op over its
dtypes, broadcasting, non-contiguous inputs, out=, in-place, type promotion
(int+float, tensor+python scalar, 0-dim CPU tensors), autograd for a
representative set, and errors (shape mismatch, integer division by zero at
the next sync, device usable afterwards)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]

TOL = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-5),
       torch.float16: (1e-3, 1e-5), torch.complex64: (1.3e-6, 1e-5), torch.complex128: (1e-7, 1e-7)}


def check(got, want, dtype=None, rtol=None, atol=None):
    assert got.device.type == "tpu"
    dtype = dtype or want.dtype
    r, a = TOL.get(dtype, (0, 0))
    torch.testing.assert_close(got.cpu(), want, rtol=rtol if rtol is not None else r,
                               atol=atol if atol is not None else a, equal_nan=True)


def make(shape, dtype, lo=-3.0, hi=3.0, seed=0, special=True):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        x = (torch.rand(shape, dtype=torch.float64, generator=g) * (hi - lo) + lo).to(dtype)
        if special and x.numel() >= 8 and not dtype.is_complex:
            flat = x.view(-1)
            flat[:5] = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf")], dtype=dtype)
        return x
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -100), min(info.max, 100), shape, generator=g).to(dtype)


# op name -> (callable, input domain lo, hi, dtypes)
UNARY_FLOAT = {
    "sqrt": (torch.sqrt, 0, 10), "rsqrt": (torch.rsqrt, 0.1, 10), "reciprocal": (torch.reciprocal, -3, 3),
    "exp": (torch.exp, -10, 10), "exp2": (torch.exp2, -10, 10), "expm1": (torch.expm1, -3, 3),
    "log": (torch.log, 0, 10), "log2": (torch.log2, 0, 10), "log10": (torch.log10, 0, 10),
    "log1p": (torch.log1p, -0.9, 10), "sin": (torch.sin, -5, 5), "cos": (torch.cos, -5, 5),
    "tan": (torch.tan, -1.5, 1.5), "asin": (torch.asin, -1, 1), "acos": (torch.acos, -1, 1),
    "atan": (torch.atan, -5, 5), "sinh": (torch.sinh, -5, 5), "cosh": (torch.cosh, -5, 5),
    "tanh": (torch.tanh, -5, 5), "asinh": (torch.asinh, -5, 5), "acosh": (torch.acosh, 1, 5),
    "atanh": (torch.atanh, -0.99, 0.99), "sigmoid": (torch.sigmoid, -20, 20), "erf": (torch.erf, -3, 3),
    "erfc": (torch.erfc, -3, 3), "erfinv": (torch.erfinv, -0.999, 0.999), "lgamma": (torch.lgamma, 0.1, 10),
    "digamma": (torch.digamma, -5.5, 10), "logit": (torch.logit, 0.01, 0.99),
    "logit_eps": (lambda x: torch.logit(x, eps=0.1), 0, 1), "frac": (torch.frac, -5, 5),
    "gelu": (F.gelu, -6, 6), "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), -6, 6),
    "silu": (F.silu, -10, 10), "mish": (F.mish, -10, 10), "softplus": (F.softplus, -30, 30),
    "softplus_beta": (lambda x: F.softplus(x, beta=2.0, threshold=5.0), -10, 10),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), -5, 5), "hardtanh": (lambda x: F.hardtanh(x, -0.5, 2.0), -5, 5),
    "elu": (F.elu, -5, 5), "selu": (F.selu, -5, 5), "celu": (lambda x: F.celu(x, 0.5), -5, 5),
    "hardsigmoid": (F.hardsigmoid, -5, 5), "hardswish": (F.hardswish, -5, 5), "relu": (torch.relu, -5, 5),
    "relu6": (F.relu6, -3, 9), "threshold": (lambda x: F.threshold(x, 0.5, -2.0), -3, 3),
    "floor": (torch.floor, -5, 5), "ceil": (torch.ceil, -5, 5), "round": (torch.round, -5, 5),
    "round_dec": (lambda x: torch.round(x, decimals=2), -5, 5), "trunc": (torch.trunc, -5, 5),
    "sign": (torch.sign, -5, 5), "sgn": (torch.sgn, -5, 5), "neg": (torch.neg, -5, 5), "abs": (torch.abs, -5, 5),
    "square": (torch.square, -5, 5), "isnan": (torch.isnan, -5, 5), "isinf": (torch.isinf, -5, 5),
    "isfinite": (torch.isfinite, -5, 5), "isposinf": (torch.isposinf, -5, 5), "isneginf": (torch.isneginf, -5, 5),
    "nan_to_num": (torch.nan_to_num, -5, 5), "nan_to_num_args": (lambda x: torch.nan_to_num(x, 1.0, 2.0, -3.0), -5, 5),
    "logical_not": (torch.logical_not, -2, 2), "clamp": (lambda x: torch.clamp(x, -1.0, 2.0), -5, 5),
    "clamp_min": (lambda x: torch.clamp_min(x, 0.5), -5, 5), "clamp_max": (lambda x: torch.clamp_max(x, 0.5), -5, 5),
}

# ops whose low-precision CPU results are computed differently enough (rounding of intermediates)
LOOSE = {"logit", "logit_eps", "tan", "lgamma", "digamma", "erfinv", "exp", "exp2", "sinh", "cosh", "expm1", "mish", "softplus_beta"}


def gelu_reference(x: torch.Tensor) -> torch.Tensor:
    """GELU computed in float64, rounded to x's dtype. PyTorch's float32 CPU
    kernel depends on the vector ISA at extreme arguments: with AVX-512 it
    gives NaN at +inf (inf for a tensor of one element) and inf at 3.4e38,
    with AVX2 (and in float64) inf and 3.4e38."""
    return F.gelu(x.double()).to(x.dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY_FLOAT))
def test_unary_float(name, dtype):
    fn, lo, hi = UNARY_FLOAT[name]
    x = make((37, 29), dtype, lo, hi)
    want = gelu_reference(x) if name == "gelu" else fn(x)
    got = fn(x.to("tpu"))
    assert got.dtype == want.dtype
    rtol, atol = TOL[dtype]
    if name in LOOSE and dtype in (torch.bfloat16, torch.float16):
        rtol, atol = 2e-2, 1e-2
    if name in ("lgamma", "digamma", "tan", "erfinv") and dtype == torch.float32:
        rtol, atol = 1e-5, 1e-5
    check(got, want, rtol=rtol, atol=atol)


UNARY_INT = ["neg", "abs", "sign", "square", "floor", "ceil", "round", "trunc", "relu", "clamp", "clamp_min",
             "clamp_max", "logical_not", "isnan", "isfinite", "isinf", "sgn"]


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("name", UNARY_INT)
def test_unary_int(name, dtype):
    fn = UNARY_FLOAT[name][0]
    x = make((17, 9), dtype)
    check(fn(x.to("tpu")), fn(x))


@pytest.mark.parametrize("dtype", INTS + [torch.bool], ids=str)
def test_bitwise_not_and_int_to_float(dtype):
    x = make((31,), dtype)
    check(torch.bitwise_not(x.to("tpu")), torch.bitwise_not(x))
    if dtype != torch.bool:
        # integer inputs promote to the default float dtype
        check(torch.exp(x.to("tpu")), torch.exp(x))
        check(torch.sqrt(x.abs().to("tpu")), torch.sqrt(x.abs()))


BINARY = {
    "add": torch.add, "add_alpha": lambda a, b: torch.add(a, b, alpha=2), "sub": torch.sub,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=0.5), "mul": torch.mul, "div": torch.div,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"), "floor_divide": torch.floor_divide,
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": torch.pow, "atan2": torch.atan2, "hypot": torch.hypot,
    "copysign": torch.copysign, "xlogy": torch.xlogy, "maximum": torch.maximum, "minimum": torch.minimum,
    "fmax": torch.fmax, "fmin": torch.fmin, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "clamp_t": lambda a, b: torch.clamp(a, min=b),
    "clamp_max_t": lambda a, b: torch.clamp(a, max=b),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "threshold_backward": lambda a, b: torch.ops.aten.threshold_backward(a, b, 0.5),
    "sigmoid_backward": lambda a, b: torch.ops.aten.sigmoid_backward(a, b),
    "tanh_backward": lambda a, b: torch.ops.aten.tanh_backward(a, b),
    "gelu_backward": lambda a, b: torch.ops.aten.gelu_backward(a, b),
    "gelu_backward_tanh": lambda a, b: torch.ops.aten.gelu_backward(a, b, approximate="tanh"),
    "silu_backward": lambda a, b: torch.ops.aten.silu_backward(a, b),
    "mish_backward": lambda a, b: torch.ops.aten.mish_backward(a, b),
    "softplus_backward": lambda a, b: torch.ops.aten.softplus_backward(a, b, 1.0, 20.0),
    "leaky_relu_backward": lambda a, b: torch.ops.aten.leaky_relu_backward(a, b, 0.2, False),
    "hardtanh_backward": lambda a, b: torch.ops.aten.hardtanh_backward(a, b, -1.0, 1.0),
    "elu_backward": lambda a, b: torch.ops.aten.elu_backward(a, 1.0, 1.0, 1.0, False, b),
    "hardsigmoid_backward": lambda a, b: torch.ops.aten.hardsigmoid_backward(a, b),
    "hardswish_backward": lambda a, b: torch.ops.aten.hardswish_backward(a, b),
}
FLOAT_ONLY = {"atan2", "hypot", "copysign", "xlogy", "lerp", "sigmoid_backward", "tanh_backward", "gelu_backward",
              "gelu_backward_tanh", "silu_backward", "mish_backward", "softplus_backward", "leaky_relu_backward",
              "hardtanh_backward", "elu_backward", "hardsigmoid_backward", "hardswish_backward", "div", "sub_alpha"}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_float(name, dtype):
    fn = BINARY[name]
    a = make((23, 19), dtype, seed=1)
    b = make((23, 19), dtype, seed=2, special=False)
    if name == "pow":
        a = a.abs()
    want = fn(a, b)
    got = fn(a.to("tpu"), b.to("tpu"))
    assert got.dtype == want.dtype
    rtol, atol = TOL[dtype]
    if dtype in (torch.bfloat16, torch.float16) and name in ("pow", "div_floor", "floor_divide", "remainder", "fmod",
                                                              "mish_backward", "lerp", "gelu_backward_tanh", "sigmoid_backward", "silu_backward",
                                                              "div_trunc"):
        rtol, atol = 2e-2, 2e-2
    if name in ("remainder", "fmod", "div_floor", "floor_divide", "div_trunc") and dtype in (torch.bfloat16,
                                                                                            torch.float16):
        pytest.skip("CPU rounds the quotient of low-precision inputs differently near integer boundaries")
    check(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("name", sorted(set(BINARY) - FLOAT_ONLY))
def test_binary_int(name, dtype):
    fn = BINARY[name]
    a = make((13, 11), dtype, seed=1)
    b = make((13, 11), dtype, seed=2)
    if name in ("div_trunc", "div_floor", "floor_divide", "remainder", "fmod"):
        b = torch.where(b == 0, torch.ones_like(b), b)
    if name == "pow":
        b = b.abs() % 5
    check(fn(a.to("tpu"), b.to("tpu")), fn(a, b))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool], ids=str)
def test_bitwise(dtype):
    a, b = make((40,), dtype, seed=3), make((40,), dtype, seed=4)
    for fn in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor):
        check(fn(a.to("tpu"), b.to("tpu")), fn(a, b))
    if dtype != torch.bool:
        s = (b.abs() % 8).to(dtype)
        check(torch.bitwise_left_shift(a.to("tpu"), s.to("tpu")), torch.bitwise_left_shift(a, s))
        check(torch.bitwise_right_shift(a.to("tpu"), s.to("tpu")), torch.bitwise_right_shift(a, s))
        check(a.to("tpu") << s.to("tpu"), a << s)
        check(a.to("tpu") >> 2, a >> 2)
        x = a.to("tpu")
        x <<= 1
        check(x, a << 1)


def test_int_semantics_exact():
    a = torch.tensor([7, -7, 7, -7, 5, -2**62, 100], dtype=torch.int64)
    b = torch.tensor([2, 2, -2, -2, 3, -1, 7], dtype=torch.int64)
    da, db = a.to("tpu"), b.to("tpu")
    for fn in (torch.remainder, torch.fmod, torch.floor_divide,
               lambda x, y: torch.div(x, y, rounding_mode="trunc"), torch.mul, torch.add):
        check(fn(da, db), fn(a, b))
    # int8 wrap-around at the store
    x = torch.tensor([100, -128, 127], dtype=torch.int8)
    check(x.to("tpu") + x.to("tpu"), x + x)
    check(x.to("tpu") * 3, x * 3)
    # negative integer powers of tensors follow the CPU (1, -1 special, else 0)
    p = torch.tensor([2, 1, -1, -1, 0], dtype=torch.int64)
    e = torch.tensor([-1, -3, -1, -2, 3], dtype=torch.int64)
    check(torch.pow(p.to("tpu"), e.to("tpu")), torch.pow(p, e))


def test_float_special_semantics():
    nan, inf = float("nan"), float("inf")
    a = torch.tensor([nan, 1.0, -0.0, 0.0, inf, -inf, 5.0, -5.0])
    b = torch.tensor([1.0, nan, 0.0, -0.0, 0.5, 0.5, inf, 3.0])
    da, db = a.to("tpu"), b.to("tpu")
    for fn in (torch.maximum, torch.minimum, torch.fmax, torch.fmin, torch.remainder, torch.fmod,
               lambda x, y: torch.div(x, y, rounding_mode="floor"), torch.xlogy, torch.copysign, torch.atan2):
        check(fn(da, db), fn(a, b))
    # clamp with NaN bounds propagates NaN like the CPU
    check(torch.clamp(da, min=db), torch.clamp(a, min=b))
    check(torch.clamp(da, -1.0, 1.0), torch.clamp(a, -1.0, 1.0))
    check(torch.clamp(da, max=db), torch.clamp(a, max=b))
    check(torch.clamp(da, db, db + 1), torch.clamp(a, b, b + 1))
    check(torch.clamp(da, -1.0, nan), torch.clamp(a, -1.0, nan))
    check(torch.clamp(da, nan, 1.0), torch.clamp(a, nan, 1.0))


# ---------------------------------------------------------------- layouts

def test_broadcast_and_noncontiguous():
    a = make((8, 1, 6), torch.float32, seed=5)
    b = make((1, 7, 6), torch.float32, seed=6)
    check(a.to("tpu") + b.to("tpu"), a + b)
    # transposed and sliced inputs
    x = make((20, 30), torch.float32, seed=7)
    y = make((30, 20), torch.float32, seed=8)
    dx, dy = x.to("tpu"), y.to("tpu")
    check(dx.t() * dy, x.t() * y)
    check(dx[::2, 1::3] - dy.t()[::2, 1::3], x[::2, 1::3] - y.t()[::2, 1::3])
    # small inner dimension (gather mode) with broadcasting
    s = make((1000, 3), torch.float32, seed=9)
    t = make((3,), torch.float32, seed=10)
    check(s.to("tpu") * t.to("tpu"), s * t)
    check(torch.where(s.to("tpu") > 0, s.to("tpu"), t.to("tpu")), torch.where(s > 0, s, t))



@pytest.mark.parametrize("rows,width", [(1024, 128), (37, 64), (515, 200), (9, 256), (3000, 96)])
def test_short_rows_several_per_block(rows, width):
    """Rows shorter than a block run several to a block: broadcasts along
    either dimension, rows that are not adjacent in memory (slices), strided
    and multi-output stores, dtype conversion, random draws indexed by
    position; same bits as CPU (and as a contiguous copy for dropout)."""
    wide = make((rows, width + 7), torch.float32, seed=21)
    x, dx = wide[:, 3:width + 3], wide.to("tpu")[:, 3:width + 3]  # rows not adjacent
    assert not dx.is_contiguous()
    col = make((rows, 1), torch.float32, seed=22)
    row = make((width,), torch.bfloat16, seed=23)
    dcol, drow = col.to("tpu"), row.to("tpu")
    check(dx * dcol, x * col)
    check(dx * drow, x * row)
    check(dcol + drow, col + row)
    check(torch.addcmul(dx, dcol, drow, value=0.5), torch.addcmul(x, col, row, value=0.5))
    out = torch.zeros(width, rows, device="tpu").t()  # strided output rows
    torch.mul(dx, dcol, out=out)
    check(out, x * col)
    m, e = torch.frexp(dx * dcol)
    mc, ec = torch.frexp(x * col)
    check(m, mc)
    check(e, ec)
    torch.manual_seed(5)
    a = F.dropout(dx, 0.3)
    torch.manual_seed(5)
    b = F.dropout(dx.contiguous(), 0.3)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True)
    assert 0.2 < float((a == 0).float().mean()) < 0.4

def test_large_parallel_and_mixed_dtypes():
    n = 300_001
    a = make((n,), torch.float32, seed=11)
    b = make((n,), torch.bfloat16, seed=12)
    check(a.to("tpu") + b.to("tpu"), a + b)
    check(F.gelu(a.to("tpu")), gelu_reference(a))
    c = make((n,), torch.int32, seed=13)
    check(c.to("tpu") * a.to("tpu"), c * a)


def test_empty_and_scalar_shapes():
    e = torch.empty(0, 5)
    check(e.to("tpu") + 1, e + 1)
    s = torch.tensor(2.5)
    check(s.to("tpu") * s.to("tpu"), s * s)
    check(torch.exp(s.to("tpu")), torch.exp(s))


def test_out_and_inplace():
    a = make((10, 12), torch.float32, seed=14)
    b = make((12,), torch.float32, seed=15)
    da, db = a.to("tpu"), b.to("tpu")
    out = torch.empty(10, 12, device="tpu")
    torch.mul(da, db, out=out)
    check(out, a * b)
    # out of the wrong shape is resized; out of another dtype is cast into
    out2 = torch.empty(0, device="tpu", dtype=torch.float64)
    torch.add(da, db, out=out2)
    check(out2, torch.add(a, b, out=torch.empty(0, dtype=torch.float64)))
    x = da.clone()
    x.add_(db, alpha=3)
    check(x, a + 3 * b)
    x.mul_(2).sub_(db).div_(4)
    check(x, ((a + 3 * b) * 2 - b) / 4)
    y = da.clone()
    y.relu_()
    check(y, a.relu())
    z = da.clone()
    torch.sigmoid_(z)
    check(z, torch.sigmoid(a))
    w = da.clone()
    F.hardtanh_(w, -0.5, 0.5)
    check(w, F.hardtanh(a, -0.5, 0.5))
    v = da.clone()
    v.clamp_(min=-1.0, max=1.0)
    check(v, a.clamp(-1.0, 1.0))
    # in-place into a non-contiguous view
    m = da.clone()
    m[:, ::2].mul_(10)
    ref = a.clone()
    ref[:, ::2].mul_(10)
    check(m, ref)
    # out= for comparisons and where
    o = torch.empty(10, 12, dtype=torch.bool, device="tpu")
    torch.gt(da, db, out=o)
    check(o, a > b)
    ow = torch.empty(10, 12, device="tpu")
    torch.where(da > 0, da, db, out=ow)
    check(ow, torch.where(a > 0, a, b))


def test_type_promotion_and_scalars():
    i = torch.arange(-5, 5, dtype=torch.int32)
    f = make((10,), torch.float32, seed=16, special=False)
    h = make((10,), torch.float16, seed=17, special=False)
    di, df, dh = i.to("tpu"), f.to("tpu"), h.to("tpu")
    check(di + df, i + f)
    check(di * 2.5, i * 2.5)
    check(di + 3, i + 3)
    check(di / 2, i / 2)
    check(dh * 3.0, h * 3.0)
    check(2.0 ** df, 2.0 ** f)
    check(df ** 2, f ** 2)
    check(df ** 0.5, f ** 0.5)
    check(di ** 2, i ** 2)
    check(dh + df, h + f)
    # 0-dim CPU tensors are scalar operands
    s = torch.tensor(1.5)
    check(df * s, f * s)
    check(dh + torch.tensor(2, dtype=torch.int64), h + torch.tensor(2, dtype=torch.int64))
    check(df > 0.5, f > 0.5)
    check(di == 2, i == 2)
    check(torch.where(df > 0, df, 0.0), torch.where(f > 0, f, 0.0))
    check(torch.clamp(di, min=-2, max=3), torch.clamp(i, min=-2, max=3))
    check(torch.clamp(di, min=0.5), torch.clamp(i, min=0.5))
    check(torch.lerp(df, df * 2, torch.full_like(f, 0.7).to("tpu")), torch.lerp(f, f * 2, torch.full_like(f, 0.7)))
    g = make((10,), torch.float32, seed=18, special=False)
    dg = g.to("tpu")
    check(torch.addcmul(df, dg, dg, value=0.5), torch.addcmul(f, g, g, value=0.5))
    check(torch.addcdiv(df, dg, dg.abs() + 1, value=-2), torch.addcdiv(f, g, g.abs() + 1, value=-2))
    check(torch.xlogy(df, 2.0), torch.xlogy(f, 2.0))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_complex(dtype):
    a = make((9, 5), dtype, seed=19)
    b = make((9, 5), dtype, seed=20)
    da, db = a.to("tpu"), b.to("tpu")
    for fn in (torch.add, torch.sub, torch.mul, torch.div, torch.eq):
        check(fn(da, db), fn(a, b))
    for fn in (torch.neg, torch.exp, torch.log, torch.sqrt, torch.abs, torch.sgn, torch.tanh, torch.sin):
        check(fn(da), fn(a), dtype=dtype)
    check(da * 2j, a * 2j)


# --------------------------------------------------------------- autograd

AUTOGRAD = {
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "softplus": F.softplus, "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "mish": F.mish, "elu": F.elu, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "relu": F.relu,
    "hardtanh": F.hardtanh, "mul_div_pow": lambda x: (x * x.detach().abs() / (x.detach().abs() + 1)) ** 2,
    "where": lambda x: torch.where(x > 0, x * 2, x.exp()),
}


@pytest.mark.parametrize("name", sorted(AUTOGRAD))
def test_autograd(name):
    fn = AUTOGRAD[name]
    x = make((6, 7), torch.float32, seed=21, special=False)
    gy = make((6, 7), torch.float32, seed=22, special=False)
    xc = x.clone().requires_grad_()
    fn(xc).backward(gy)
    xd = x.to("tpu").requires_grad_()
    y = fn(xd)
    y.backward(gy.to("tpu"))
    check(y.detach(), fn(x))
    check(xd.grad, xc.grad)


# Functional forms that PyTorch decomposes although the out= form has a tpu
# kernel, checked: each decomposition is one registered kernel (or a view),
# not a chain of several.
DECOMPOSE_OK = {
    "aten::adaptive_avg_pool2d": "-> _adaptive_avg_pool2d (or mean for a 1x1 output)",
    "aten::adaptive_avg_pool3d": "-> _adaptive_avg_pool3d (or mean for a 1x1x1 output)",
    "aten::conj_physical": "-> conj_physical.out (real tensors: a copy)",
    "aten::linalg_eigvals": "-> linalg_eig",
}


def test_functional_forms_have_kernels():
    """Every op whose out= / grad_input= form runs a tpu kernel has its
    functional form registered too, unless listed above: autograd calls the
    functional forms, and an unregistered one runs PyTorch's composite
    decomposition (SiLU's backward ran as six kernels instead of one)."""
    C = torch._C
    names = set(C._dispatch_get_all_op_names())
    missing = []
    for name in sorted(names):
        base, _, overload = name.partition(".")
        if overload not in ("out", "grad_input") or not C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            continue
        if (base in names and not C._dispatch_has_kernel_for_dispatch_key(base, "PrivateUse1")
                and C._dispatch_has_kernel_for_dispatch_key(base, "CompositeImplicitAutograd")
                and base not in DECOMPOSE_OK):
            missing.append(base)
    assert not missing, f"functional forms that decompose instead of running their kernel: {missing}"


def test_silu_backward_one_kernel():
    x = make((37, 53), torch.float32, seed=3, special=False)
    g = make((37, 53), torch.float32, seed=4, special=False)
    want = torch.ops.aten.silu_backward(g, x)
    xd, gd = x.to("tpu"), g.to("tpu")
    with torch.profiler.profile() as prof:
        got = torch.ops.aten.silu_backward(gd, xd)
    check(got, want)
    ran = {e.name for e in prof.events()}
    assert "aten::sigmoid" not in ran and "aten::mul" not in ran, sorted(ran)


# ---------------------------------------------------------------- errors

def test_shape_mismatch():
    a = torch.ones(3, 4, device="tpu")
    b = torch.ones(5, device="tpu")
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(4\) must match the size of tensor b \(5\)"):
        a + b
    assert torch.equal((a + 1).cpu(), torch.full((3, 4), 2.0))


@pytest.mark.parametrize("fn", [torch.floor_divide, torch.remainder, torch.fmod,
                                lambda x, y: torch.div(x, y, rounding_mode="trunc")], ids=["floordiv", "rem", "fmod",
                                                                                        "trunc"])
def test_int_division_by_zero_raises_at_sync(fn):
    a = torch.tensor([4, 5, 6], device="tpu")
    b = torch.tensor([1, 0, 2], device="tpu")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
        torch.tpu.synchronize()
    # the device is usable afterwards
    assert torch.equal((a * 2).cpu(), torch.tensor([8, 10, 12]))


def test_other_errors():
    i = torch.tensor([1, 2], device="tpu")
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        i ** -1
    b = torch.tensor([True, False], device="tpu")
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with two bool tensors"):
        b - b
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        i.add_(1.5)
    with pytest.raises(RuntimeError, match="Integer division with addcdiv"):
        torch.addcdiv(i, i, i)


def test_no_cpu_fallback_used():
    import torch_tpu
    torch_tpu._C._set_cpu_fallback(True)
    torch_tpu._C._reset_fallback_counts()
    x = make((5, 6), torch.float32, special=False).to("tpu")
    y = (x + 1) * 2 - x / 3
    y = F.gelu(y) + F.silu(y) + torch.sigmoid(y) + torch.tanh(y) + torch.relu(y)
    y = torch.where(y > 0, y, -y).clamp(-1, 1).pow(2).exp().log()
    torch.tpu.synchronize()
    assert dict(torch_tpu._C._fallback_counts()) == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_logsigmoid_forward_backward_matches_cpu(dtype):
    x = torch.tensor([-200.0, -30.0, -1.5, -0.0, 0.0, 0.7, 25.0, 300.0, float("nan"), float("inf"), -float("inf")],
                     dtype=dtype)
    xc = x.clone().requires_grad_(True)
    xd = x.to("tpu").requires_grad_(True)
    yc = torch.nn.functional.logsigmoid(xc)
    yd = torch.nn.functional.logsigmoid(xd)
    tol = {"rtol": 1.6e-2, "atol": 1e-5} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(yd.cpu(), yc, equal_nan=True, **tol)
    g = torch.linspace(-2, 2, x.numel(), dtype=dtype)
    yc.backward(g)
    yd.backward(g.to("tpu"))
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, equal_nan=True, **tol)


# ------------------------------------------------- special functions & co.

S_ = torch.special
# name -> (callable, lo, hi)
SPECIAL_UNARY = {
    "i0": (torch.i0, -12, 12), "i0e": (S_.i0e, -40, 40), "i1": (S_.i1, -12, 12), "i1e": (S_.i1e, -40, 40),
    "modified_bessel_i0": (S_.modified_bessel_i0, -12, 12), "modified_bessel_i1": (S_.modified_bessel_i1, -12, 12),
    "modified_bessel_k0": (S_.modified_bessel_k0, 0, 12), "modified_bessel_k1": (S_.modified_bessel_k1, 0, 12),
    "scaled_modified_bessel_k0": (S_.scaled_modified_bessel_k0, 0, 40),
    "scaled_modified_bessel_k1": (S_.scaled_modified_bessel_k1, 0, 40),
    "bessel_j0": (S_.bessel_j0, -20, 20), "bessel_j1": (S_.bessel_j1, -20, 20),
    "bessel_y0": (S_.bessel_y0, 0.1, 20), "bessel_y1": (S_.bessel_y1, 0.1, 20),
    "spherical_bessel_j0": (S_.spherical_bessel_j0, -20, 20), "airy_ai": (S_.airy_ai, -6, 6),
    "ndtri": (S_.ndtri, 0, 1), "log_ndtr": (S_.log_ndtr, -40, 6), "erfcx": (S_.erfcx, -5, 30),
    "entr": (S_.entr, -1, 5), "sinc": (torch.sinc, -5, 5), "digamma_pg0": (lambda x: torch.polygamma(0, x), 0.1, 8),
    "trigamma": (lambda x: torch.polygamma(1, x), -3.5, 8), "polygamma3": (lambda x: torch.polygamma(3, x), 0.2, 8),
    "hardshrink": (lambda x: F.hardshrink(x, 0.7), -3, 3), "softshrink": (lambda x: F.softshrink(x, 0.7), -3, 3),
    "angle": (torch.angle, -3, 3), "signbit": (torch.signbit, -3, 3),
    "frexp_m": (lambda x: torch.frexp(x)[0], -1e4, 1e4), "frexp_e": (lambda x: torch.frexp(x)[1], -1e4, 1e4),
    "glu": (lambda x: F.glu(x, -1), -5, 5), "glu0": (lambda x: F.glu(x, 0), -5, 5),
    "prelu": (lambda x: F.prelu(x, torch.tensor([0.25], dtype=x.dtype, device=x.device)), -3, 3),
    "rrelu_eval": (lambda x: F.rrelu(x, 0.1, 0.3, training=False), -3, 3),
}
SPECIAL_LOOSE = {"trigamma", "polygamma3", "airy_ai", "bessel_y0", "bessel_y1", "bessel_j0", "bessel_j1",
                 "spherical_bessel_j0", "i0", "i1", "modified_bessel_i0", "modified_bessel_i1", "log_ndtr", "erfcx",
                 "modified_bessel_k0", "modified_bessel_k1", "sinc", "ndtri"}
# CPU kernels that only exist for float32 / float64
SPECIAL_F32_F64 = {"modified_bessel_i0", "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
                   "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "bessel_j0", "bessel_j1", "bessel_y0",
                   "bessel_y1", "spherical_bessel_j0", "airy_ai", "ndtri", "log_ndtr", "erfcx", "frexp_e",
                   "frexp_m"}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(SPECIAL_UNARY))
def test_special_unary(name, dtype):
    fn, lo, hi = SPECIAL_UNARY[name]
    x = make((4, 10), dtype, lo, hi, seed=31)
    try:
        want = fn(x)
    except (RuntimeError, NotImplementedError):
        pytest.skip("no CPU kernel for this dtype")
    got = fn(x.to("tpu"))
    if dtype in (torch.float32, torch.float64) and name in SPECIAL_LOOSE:
        # PyTorch's own float64 kernels (Cephes) are only good to ~1e-7 for some of these
        check(got, want, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-6)
    elif dtype in (torch.bfloat16, torch.float16):
        check(got, want, rtol=2e-2, atol=2e-2)
    else:
        check(got, want)
    # non-contiguous input
    xt = make((10, 4), dtype, lo, hi, seed=32).t()
    check(fn(xt.to("tpu")), fn(xt), rtol=2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5,
          atol=2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5)


@pytest.mark.parametrize("name", ["i0", "i0e", "i1", "sinc", "entr", "ndtri", "angle", "signbit"])
def test_special_unary_int_inputs(name):
    fn = SPECIAL_UNARY[name][0]
    for dt in (torch.int64, torch.int32, torch.uint8, torch.bool):
        x = make((3, 5), dt)
        if name == "ndtri" and dt != torch.bool:
            continue
        check(fn(x.to("tpu")), fn(x), dtype=torch.float32)


SPECIAL_BINARY = {
    "zeta": (S_.zeta, (1.0, 6.0), (0.5, 5.0)), "igamma": (torch.igamma, (0.1, 10.0), (0.0, 12.0)),
    "igammac": (torch.igammac, (0.1, 10.0), (0.0, 12.0)), "xlog1py": (S_.xlog1py, (-3.0, 3.0), (-0.9, 5.0)),
    "logaddexp": (torch.logaddexp, (-50.0, 50.0), (-50.0, 50.0)),
    "logaddexp2": (torch.logaddexp2, (-50.0, 50.0), (-50.0, 50.0)),
    "heaviside": (torch.heaviside, (-2.0, 2.0), (-1.0, 1.0)), "nextafter": (torch.nextafter, (-3.0, 3.0), (-3.0, 3.0)),
    "rsub": (torch.rsub, (-3.0, 3.0), (-3.0, 3.0)), "rsub_alpha": (lambda a, b: torch.rsub(a, b, alpha=2.5),
                                                                   (-3.0, 3.0), (-3.0, 3.0)),
}
POLYS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
         "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
         "legendre_polynomial_p"]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(SPECIAL_BINARY))
def test_special_binary(name, dtype):
    fn, (alo, ahi), (blo, bhi) = SPECIAL_BINARY[name]
    a = make((4, 6), dtype, alo, ahi, seed=41)
    b = make((6,), dtype, blo, bhi, seed=42, special=False)  # broadcast
    if name == "heaviside":
        a.view(-1)[5:9] = 0
    try:
        want = fn(a, b)
    except (RuntimeError, NotImplementedError):
        pytest.skip("no CPU kernel for this dtype")
    got = fn(a.to("tpu"), b.to("tpu"))
    if dtype in (torch.bfloat16, torch.float16):
        check(got, want, rtol=2e-2, atol=2e-2)
    else:
        check(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-9, atol=1e-5 if dtype == torch.float32 else 1e-9)
    # out= and in-place
    out = torch.empty(4, 6, dtype=dtype, device="tpu")
    if name in ("rsub", "rsub_alpha"):
        return
    torch_fn = {"xlog1py": S_.xlog1py, "zeta": S_.zeta}.get(name, getattr(torch, name, None))
    torch_fn(a.to("tpu"), b.to("tpu"), out=out)
    check(out, got.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", POLYS)
def test_orthogonal_polynomials(name, dtype):
    fn = getattr(S_, name)
    lo = 0.0 if name.startswith("shifted") else -1.0
    x = make((3, 40), dtype, lo, 1.0, seed=51, special=False)
    x.view(-1)[:4] = torch.tensor([1.0, -1.0, lo, 0.5], dtype=dtype) if lo == -1.0 else torch.tensor(
        [1.0, 0.0, 0.5, 0.25], dtype=dtype)
    n = torch.arange(-1, 39, dtype=dtype).expand(3, 40)
    check(fn(x.to("tpu"), n.to("tpu")), fn(x, n), rtol=1e-4, atol=1e-4 if dtype == torch.float32 else 1e-9)
    check(fn(x.to("tpu"), 3), fn(x, 3))  # scalar n


def test_special_exact_values():
    t = lambda *v: torch.tensor(v, dtype=torch.float64, device="tpu")
    nan, inf = float("nan"), float("inf")
    out = S_.i0e(t(0.0, inf, -inf)).cpu().tolist()
    assert out[0] == 1.0 and out[1] == 0.0
    assert S_.ndtri(t(0.0, 1.0, 0.5)).cpu().tolist() == [-inf, inf, 0.0]
    assert S_.entr(t(0.0, -1.0)).cpu().tolist() == [0.0, -inf]
    assert torch.isnan(S_.entr(t(nan))).all()
    assert S_.zeta(t(1.0), t(2.0)).cpu().item() == inf
    assert abs(S_.zeta(t(2.0), t(1.0)).cpu().item() - math.pi ** 2 / 6) < 1e-14
    assert torch.isnan(torch.igamma(t(-1.0), t(1.0))).all()
    assert torch.igammac(t(0.0), t(1.0)).cpu().item() == 0.0
    assert torch.sinc(t(0.0)).cpu().item() == 1.0
    assert torch.logaddexp(t(-inf), t(-inf)).cpu().item() == -inf
    assert torch.logaddexp(t(inf), t(inf)).cpu().item() == inf
    assert torch.signbit(t(-0.0, 0.0, -nan if False else -1.0)).cpu().tolist() == [True, False, True]
    x = torch.tensor([1.0, 0.0, -2.5], device="tpu")
    assert torch.nextafter(x, torch.tensor([2.0, -1.0, 0.0], device="tpu")).cpu().tolist() == \
        torch.nextafter(x.cpu(), torch.tensor([2.0, -1.0, 0.0])).tolist()
    xb = torch.tensor([1.0, 0.0, -2.5], dtype=torch.bfloat16)
    yb = torch.tensor([2.0, -1.0, 0.0], dtype=torch.bfloat16)
    assert torch.equal(torch.nextafter(xb.to("tpu"), yb.to("tpu")).cpu(), torch.nextafter(xb, yb))


def test_heaviside_int_and_errors():
    a = torch.tensor([-2, 0, 3, 0], device="tpu")
    v = torch.tensor([7, 8, 9, 10], device="tpu")
    assert torch.heaviside(a, v).cpu().tolist() == [0, 8, 1, 10]
    with pytest.raises(RuntimeError, match="different dtypes"):
        torch.heaviside(a, v.float())
    with pytest.raises(RuntimeError, match="does not support negative n"):
        torch.polygamma(-1, torch.ones(2, device="tpu"))
    with pytest.raises(RuntimeError, match="lambda must be"):
        F.softshrink(torch.ones(2, device="tpu"), -1.0)
    with pytest.raises(RuntimeError, match="Halving dimension must be even"):
        F.glu(torch.ones(3, 3, device="tpu"))
    with pytest.raises(RuntimeError, match="only supports floating-point"):
        torch.frexp(torch.ones(2, dtype=torch.int64, device="tpu"))
    with pytest.raises(RuntimeError, match="Lower bound should be less than or equal"):
        F.rrelu(torch.ones(2, device="tpu"), 0.5, 0.1, training=True)
    with pytest.raises(NotImplementedError):
        torch.logaddexp(a, v)
    assert (torch.ones(2, device="tpu") + 1).cpu().tolist() == [2.0, 2.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_complex_polar_angle(dtype):
    re = make((3, 4), dtype, seed=61, special=False)
    im = make((3, 4), dtype, seed=62, special=False)
    check(torch.complex(re.to("tpu"), im.to("tpu")), torch.complex(re, im))
    check(torch.polar(re.abs().to("tpu"), im.to("tpu")), torch.polar(re.abs(), im))
    z = torch.complex(re, im)
    check(torch.angle(z.to("tpu")), torch.angle(z))
    out = torch.empty(0, dtype=z.dtype, device="tpu")
    torch.complex(re.to("tpu"), im.to("tpu"), out=out)
    check(out, z)
    with pytest.raises(RuntimeError, match="Expected object of scalar type"):
        torch.complex(re.to("tpu"), im.to(torch.float16).to("tpu"))


def test_frexp_out_and_rsub_scalar():
    x = make((5, 5), torch.float32, -1e3, 1e3, seed=71)
    m, e = torch.frexp(x.to("tpu"))
    mc, ec = torch.frexp(x)
    check(m, mc)
    assert e.dtype == torch.int32 and torch.equal(e.cpu(), ec)
    y = make((5, 5), torch.float32, seed=72, special=False)
    check(torch.rsub(y.to("tpu"), 2.0), torch.rsub(y, 2.0))
    check(3 - y.to("tpu"), 3 - y)
    check(torch.rsub(torch.arange(5, device="tpu"), 2, alpha=3), torch.rsub(torch.arange(5), 2, alpha=3),
          dtype=torch.int64)


def test_inplace_variants():
    x = make((4, 5), torch.float32, 0.1, 3, seed=81, special=False)
    for name in ("i0_", "sinc_", "logaddexp", "xlogy_"):
        pass
    xd = x.to("tpu")
    xd.i0_()
    check(xd, torch.i0(x))
    xd = x.to("tpu")
    xd.polygamma_(2)
    check(xd, torch.polygamma(2, x))
    xd = x.to("tpu")
    xd.sinc_()
    check(xd, torch.sinc(x))
    xd = x.to("tpu")
    xd.heaviside_(torch.ones(5, device="tpu"))
    check(xd, torch.heaviside(x, torch.ones(5)))


SPECIAL_AUTOGRAD = {
    "i0": torch.i0, "i0e": S_.i0e, "i1": S_.i1, "i1e": S_.i1e, "digamma": torch.digamma,
    "trigamma": lambda x: torch.polygamma(1, x), "polygamma2": lambda x: torch.polygamma(2, x),
    "ndtri": lambda x: S_.ndtri(torch.sigmoid(x)), "log_ndtr": S_.log_ndtr, "erfcx": S_.erfcx,
    "entr": lambda x: S_.entr(x.abs() + 0.1), "sinc": torch.sinc, "hardshrink": lambda x: F.hardshrink(x, 0.3),
    "softshrink": lambda x: F.softshrink(x, 0.3), "glu": lambda x: F.glu(x, 0),
    "prelu": lambda x: F.prelu(x, torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], device=x.device)),
    "logaddexp": lambda x: torch.logaddexp(x, x.flip(0)), "logaddexp2": lambda x: torch.logaddexp2(x, x * 0.5),
    "xlog1py": lambda x: S_.xlog1py(x, x.abs()), "rsub": lambda x: torch.rsub(x, 2.0, alpha=3),
    "angle": lambda x: torch.angle(torch.complex(x, x.flip(1))),
    "polar": lambda x: torch.view_as_real(torch.polar(x.abs() + 0.1, x)),
}


@pytest.mark.parametrize("name", sorted(SPECIAL_AUTOGRAD))
def test_special_autograd(name):
    fn = SPECIAL_AUTOGRAD[name]
    x = make((6, 7), torch.float32, 0.2, 2.0, seed=91, special=False)
    xc = x.clone().requires_grad_()
    yc = fn(xc)
    gy = make(tuple(yc.shape), torch.float32, seed=92, special=False)
    yc.backward(gy)
    xd = x.to("tpu").requires_grad_()
    yd = fn(xd)
    yd.backward(gy.to("tpu"))
    check(yd.detach(), yc.detach(), rtol=1e-5, atol=1e-5)
    check(xd.grad, xc.grad, rtol=1e-4, atol=1e-5)


def test_rrelu_training_uses_device_generator():
    x = make((50, 40), torch.float32, -3, 3, seed=95, special=False).to("tpu")
    torch.manual_seed(0)
    y = F.rrelu(x, 0.1, 0.3, training=True)
    ratio = (y / x).cpu()
    neg = x.cpu() < 0
    assert torch.all(ratio[~neg] == 1.0)
    assert torch.all((ratio[neg] >= 0.1 - 1e-6) & (ratio[neg] <= 0.3 + 1e-6))
    assert ratio[neg].std() > 0.03  # really random
    xr = x.clone().requires_grad_()
    yr = F.rrelu(xr, 0.1, 0.3, training=True)
    yr.sum().backward()
    g = xr.grad.cpu()
    assert torch.all(g[~neg] == 1.0) and torch.all((g[neg] >= 0.1 - 1e-6) & (g[neg] <= 0.3 + 1e-6))


def test_special_ops_do_not_fall_back():
    import torch_tpu
    torch_tpu._C._set_cpu_fallback(True)
    torch_tpu._C._reset_fallback_counts()
    try:
        x = make((5, 6), torch.float32, 0.2, 3, special=False).to("tpu")
        y = torch.i0(x) + S_.i1e(x) + S_.zeta(x + 1, x) + torch.igamma(x, x) + S_.bessel_j0(x) + S_.airy_ai(x)
        y = y + S_.chebyshev_polynomial_t(x, 3) + torch.polygamma(2, x) + torch.logaddexp(x, y) + torch.sinc(x)
        y = y + F.glu(torch.cat([x, x], 1)) + F.hardshrink(x) + F.softshrink(x) + torch.rsub(x, y)
        torch.tpu.synchronize()
        assert dict(torch_tpu._C._fallback_counts()) == {}
    finally:
        torch_tpu._C._set_cpu_fallback(False)


@pytest.mark.parametrize("eps", [None, 0.1, 0.0])
def test_logit_backward_like_cpu(eps):
    # out of [0, 1] (NaN gradient without eps, 0 outside [eps, 1 - eps]),
    # at 0 and 1 (infinite), inside (grad / (x (1 - x)))
    x = torch.tensor([-0.5, 0.0, 0.05, 0.3, 0.5, 0.97, 1.0, 1.5], requires_grad=True)
    g = torch.arange(8.0) - 3
    torch.logit(x, eps).backward(g)
    xt = x.detach().to("tpu").requires_grad_()
    torch.logit(xt, eps).backward(g.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), x.grad, equal_nan=True)
    out = torch.empty(8, device="tpu")
    torch.ops.aten.logit_backward.grad_input(g.to("tpu"), x.detach().to("tpu"), eps, grad_input=out)
    torch.testing.assert_close(out.cpu(), x.grad, equal_nan=True)


@pytest.mark.parametrize("name", ["tanh", "erf", "erfc", "log", "log1p"])
def test_vector_special_functions_over_the_whole_range(name):
    # float32 tanh / erf / erfc / log / log1p are branch-free vector formulas
    # (series near 0, exp-based beyond; log from the exponent bits and an
    # atanh series): within 1e-6 relative (8 float32 ulps; OpInfo's float32
    # rtol is 1.3e-6) of the float64 function
    # everywhere the result is normal, at and across the switch points
    # (0.4, 0.75), in the tails, and exact at signed zeros, infinities, NaN
    fn = getattr(torch, name)
    pts = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-8, -1e-8, 0.39999, 0.4, 0.40001, -0.4, 0.74999, 0.75, 0.75001,
                        -0.75, 3.0, -3.0, 9.0, 9.5, 10.0, 10.5, 11.0, 30.0, -30.0, 1e30, -1e30])
    x = torch.cat([torch.linspace(-12, 12, 240001), torch.logspace(-44, 38, 20001), pts,
                   torch.tensor([float("inf"), float("-inf"), float("nan"), -1.0, 1.0, 2.0, 1.1754942e-38])])
    got = fn(x.to("tpu")).cpu()
    ref = fn(x.double())
    normal = torch.isfinite(ref) & (ref.abs() >= torch.finfo(torch.float32).tiny)
    err = (got.double() - ref)[normal].abs() / ref[normal].abs()
    assert torch.equal(got[torch.isinf(ref)].double(), ref[torch.isinf(ref)])  # log(0), log1p(-1), ...
    assert err.max() <= 1e-6, (err.max(), x[normal][err.argmax()])
    tiny = torch.isfinite(ref) & ~normal
    assert (got[tiny].abs() <= 2 * torch.finfo(torch.float32).tiny).all()
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    finite = ~torch.isnan(ref)
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite].float()))
    inf = torch.tensor([float("inf"), float("-inf")])
    torch.testing.assert_close(fn(inf.to("tpu")).cpu(), fn(inf), rtol=0, atol=0, equal_nan=True)


def test_gelu_and_its_backward_over_the_whole_range():
    # float32 GELU (erf form) is x Phi(x) with Phi from exp(-x^2/2) erfcx(|x|
    # / sqrt 2) (a polynomial in 1 / (1 + 0.4 z)); its backward shares the
    # exp: within 1e-6 relative of float64 wherever the result is normal
    # (the backward's two terms, Phi(y) and y phi(y), cancel near y = -0.75:
    # there the bound is relative to their magnitudes)
    pts = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 19.4, 19.6, -19.4, -19.6, 30.0, -30.0, 1e30, -1e30])
    x = torch.cat([torch.linspace(-14, 14, 280001), pts, torch.tensor([float("inf"), float("-inf"), float("nan")])])
    xt, xd = x.to("tpu"), x.double()
    cdf = 0.5 * torch.special.erfc(-xd / 2 ** 0.5)  # the CPU's 1 + erf cancels in the tail
    got = F.gelu(xt).cpu()
    ref = xd * cdf
    # where Phi(x) itself is normal (below, x Phi(x) is rounded from a subnormal)
    normal = torch.isfinite(ref) & ((ref / xd).abs() >= torch.finfo(torch.float32).tiny)
    err = (got.double() - ref)[normal].abs() / ref[normal].abs()
    assert err.max() <= 1e-6, (err.max(), x[normal][err.argmax()])
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    finite = ~torch.isnan(ref)
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite].float()))
    g = torch.full_like(x, 0.75)
    gb = torch.ops.aten.gelu_backward(g.to("tpu"), xt).cpu().double()
    phi = torch.exp(-xd * xd / 2) / (2 * torch.pi) ** 0.5
    want = 0.75 * (cdf + xd * phi)
    scale = 0.75 * (cdf.abs() + (xd * phi).abs())
    ok = torch.isfinite(want) & (scale >= torch.finfo(torch.float32).tiny)
    berr = (gb - want)[ok].abs() / scale[ok]
    assert berr.max() <= 1e-6, (berr.max(), x[ok][berr.argmax()])
    assert torch.equal(torch.isnan(gb), torch.isnan(torch.ops.aten.gelu_backward(g, x)))


@pytest.mark.parametrize("name", ["exp", "sigmoid", "silu", "gelu", "gelu_tanh", "tanh", "softplus", "elu", "erf",
                                  "erfc", "gelu_backward"])
def test_exp_based_functions_at_huge_arguments(name):
    # the vector exp takes no clamp of its argument (range handled by selects
    # on the result; its integer exponent is clamped): arguments far outside
    # [-104, 89], where the rounding-constant trick no longer gives the
    # integer part, still give the CPU's limits, signs and NaN
    x = torch.tensor([88.0, 88.8, 89.5, 100.0, 1e4, 4.2e6, 1e7, 1e20, 1e30, 3.4e38, float("inf"), float("nan"),
                      -88.0, -103.5, -104.5, -150.0, -1e4, -4.2e6, -1e7, -1e20, -1e30, -3.4e38, float("-inf")])
    fns = {"exp": torch.exp, "sigmoid": torch.sigmoid, "silu": F.silu, "gelu": F.gelu,
           "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "tanh": torch.tanh, "softplus": F.softplus,
           "elu": F.elu, "erf": torch.erf, "erfc": torch.erfc,
           "gelu_backward": lambda t: torch.ops.aten.gelu_backward(torch.ones_like(t), t)}
    fn = fns[name]
    got = fn(x.to("tpu")).cpu()
    ref = gelu_reference(x) if name == "gelu" else fn(x)
    # atol: two float32 subnormal ulps (exp(-103.5) is one)
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=3e-45, equal_nan=True)
    finite = ~torch.isnan(ref) & (ref != 0)
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite]))


def test_sgn_backward_and_efficient_zero_tensor():
    # sgn's backward for real inputs is an "efficient" zero tensor: a dense
    # tensor of zeros on the device
    x = torch.randn(5, 4, device="tpu", requires_grad=True)
    x.sgn().backward(torch.ones(5, 4, device="tpu"))
    assert x.grad.device.type == "tpu" and torch.equal(x.grad.cpu(), torch.zeros(5, 4))
    z = torch.ops.aten._efficientzerotensor([2, 3], dtype=torch.float64, device="tpu")
    assert z.device.type == "tpu" and z.dtype == torch.float64 and torch.equal(z.cpu(), torch.zeros(2, 3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64], ids=str)
def test_gcd_and_lcm(dtype):
    # like CPU for every integer dtype: signs, zeros, broadcasting, in-place,
    # out=; gcd of the most negative int64 keeps its bit pattern as on CPU
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(max(info.min, -1000), min(info.max, 1000), (40, 7), generator=g).to(dtype)
    b = torch.randint(max(info.min, -1000), min(info.max, 1000), (7,), generator=g).to(dtype)
    a[0, :3] = 0
    b[:2] = 0
    da, db = a.to("tpu"), b.to("tpu")
    for f in (torch.gcd, torch.lcm):
        assert torch.equal(f(da, db).cpu(), f(a, b)), f
        out = torch.empty(40, 7, dtype=dtype, device="tpu")
        f(da, db, out=out)
        assert torch.equal(out.cpu(), f(a, b))
    x = da.clone()
    x.gcd_(db)
    assert torch.equal(x.cpu(), a.gcd(b))
    if dtype == torch.int64:
        m = torch.tensor([-(2**63), -(2**63), 12, -12], dtype=torch.int64)
        n = torch.tensor([0, -(2**63), -18, 0], dtype=torch.int64)
        assert torch.equal(torch.gcd(m.to("tpu"), n.to("tpu")).cpu(), torch.gcd(m, n))


@pytest.mark.parametrize("case", ["gcd float", "lcm bool", "bitwise_and float", "bitwise_not float", "lshift float",
                                  "frac int", "round int decimals", "mm bool", "bmm bool", "dot bool"])
def test_unsupported_dtypes_raise_like_cpu(case):
    # the same exception class (NotImplementedError) and dtype name as CPU
    name, kind = case.split(" ", 1)
    dt = {"float": torch.float32, "bool": torch.bool, "int": torch.int32, "int decimals": torch.int32}[kind]
    fns = {"gcd": lambda x: torch.gcd(x, x), "lcm": lambda x: torch.lcm(x, x),
           "bitwise_and": lambda x: torch.bitwise_and(x, x), "bitwise_not": torch.bitwise_not,
           "lshift": lambda x: x << x, "frac": torch.frac, "round": lambda x: torch.round(x, decimals=2),
           "mm": lambda x: torch.mm(x.view(1, 3), x.view(3, 1)), "bmm": lambda x: torch.bmm(x.view(1, 1, 3), x.view(1, 3, 1)),
           "dot": lambda x: torch.dot(x, x)}
    f = fns[name]
    with pytest.raises(NotImplementedError) as cpu:
        f(torch.ones(3, dtype=dt))
    with pytest.raises(NotImplementedError) as tpu:
        f(torch.ones(3, dtype=dt, device="tpu"))
    dtype_name = str(cpu.value).split("not implemented for ")[1][:8]
    assert "not implemented for " + dtype_name in str(tpu.value), (str(cpu.value), str(tpu.value))
    assert torch.gcd(torch.tensor([4], device="tpu"), torch.tensor([6], device="tpu")).item() == 2  # usable afterwards


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dst", [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32,
                                 torch.int64], ids=str)
def test_float_to_integer_casts_out_of_range_as_on_the_cpu(src, dst):
    # NaN, infinities and values outside the target's range convert as PyTorch's CPU backend does on x86:
    # 8- to 32-bit targets but uint8 through int32 (INT32_MIN, then its low bits: 1e10 -> int16 is 0),
    # int64 and uint8 through int64 (fuzz seed 97446: inf -> int32 gave 0 instead of INT32_MIN)
    vals = [5e9 + 3, -5e9 - 3, 2.5e9, -2.5e9, 4.1e9, float("inf"), float("-inf"), float("nan"), 300.7, -300.7,
            65537.0, 2 ** 31 - 128.0, 70000.5, -1.0]
    x = torch.tensor(vals * 9, dtype=src)  # long enough for the vector rows
    want = x.to(dst)
    d = x.to("tpu")
    check(d.to(dst), want)
    out = torch.empty(x.shape, dtype=dst, device="tpu")
    out.copy_(d)
    check(out, want)
    # a cast after other arithmetic (in DeferAndFuse one elementwise program; float16 -> uint32, which the CPU
    # converts through int64 and a program's float32 store would not, stays a copy of its own)
    check((d * 1).to(dst), (x * 1).to(dst))


def test_log_sigmoid_and_masked_fill_results_are_contiguous_as_on_the_cpu():
    # the CPU backend allocates these results contiguous whatever the input's layout, so a view of the
    # result's memory (as_strided) reads the same elements on both (fuzz seed 97583) and a view the CPU
    # allows works (seed 99852)
    x = torch.randn(3, 7).t()
    want, got = F.logsigmoid(x), F.logsigmoid(x.to("tpu"))
    assert got.stride() == want.stride() == (3, 1)
    check(got.as_strided((3, 3), (1, 4), 2), want.as_strided((3, 3), (1, 4), 2))
    check(got, want)
    x = torch.randn(8, 4, dtype=torch.float64).t()
    mask = torch.tensor([[True], [False], [True], [False]])
    want, got = x.masked_fill(mask, 0.001), x.to("tpu").masked_fill(mask.to("tpu"), 0.001)
    assert got.stride() == want.stride() == (8, 1)
    check(got.view(16, 2), want.view(16, 2))
    check(x.to("tpu").masked_fill(mask.to("tpu"), torch.tensor(2.0, dtype=torch.float64, device="tpu")).view(16, 2),
          x.masked_fill(mask, torch.tensor(2.0, dtype=torch.float64)).view(16, 2))


def _float_ulps(got, ref64):
    # |got - ref| in units of the float32 spacing at ref (subnormal spacing
    # below the smallest normal)
    ref32 = ref64.float()
    spacing = torch.where(ref32.abs() >= torch.finfo(torch.float32).tiny,
                          (torch.nextafter(ref32.abs(), torch.tensor(float("inf"))) - ref32.abs()).double(),
                          torch.tensor(2.0 ** -149, dtype=torch.float64))
    return (got.double() - ref64).abs() / spacing


@pytest.mark.parametrize("name", ["sin", "cos", "tan", "atan", "asin", "acos", "sinh", "cosh", "exp2", "expm1",
                                  "log2", "log10", "elu", "erfinv"])
def test_double_evaluated_float_functions_round_within_an_ulp(name):
    # float32 sin / cos / tan / atan / asin / acos / sinh / cosh / exp2 /
    # expm1 / log2 / log10 are evaluated in double (ew_dmath.h): within one
    # float ulp of the float64 function everywhere (nearly always the
    # nearest float), across the reduction switch points, in the tails and
    # at huge arguments (sin / cos / tan beyond 2^18 go to libm); specials
    # (signed zeros, infinities, NaN, |x| > 1 for asin / acos) as the CPU's
    fns = {"elu": F.elu}
    fn = fns[name] if name in fns else getattr(torch, name)
    lim = {"asin": 1.0, "acos": 1.0, "erfinv": 1.0}.get(name, 30.0)
    x = torch.cat([torch.linspace(-lim, lim, 200001), torch.logspace(-44, 38, 8001), -torch.logspace(-44, 38, 8001),
                   torch.tensor([0.0, -0.0, 0.1, -0.1, 0.0999999, 0.19891237, 0.41421356, 0.66817864, 1.0, -1.0,
                                 0.7853982, 1.5707964, 3.1415927, 262143.9, 262144.0, -262144.0, 1e5, 88.7, 89.0,
                                 -103.9, 127.9, 128.0, -149.0, -150.0, 1.0000001, 0.99999994, -0.99999994,
                                 0.9966, 0.99662, 0.9999999, -0.5, 1e-7,
                                 float("inf"), float("-inf"), float("nan")])])
    got = fn(x.to("tpu")).cpu()
    ref = fn(x.double())
    finite = torch.isfinite(ref) & (ref.abs() <= torch.finfo(torch.float32).max)
    ulps = _float_ulps(got[finite], ref[finite])
    assert ulps.max() <= 1.0, (ulps.max(), x[finite][ulps.argmax()], got[finite][ulps.argmax()])
    rest = ~finite
    torch.testing.assert_close(got[rest], fn(x[rest]), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(got[ref == 0]), torch.signbit(ref[ref == 0]))


def test_atan2_hypot_pow_logaddexp_round_within_an_ulp_and_keep_c_specials():
    g = torch.Generator().manual_seed(5)
    a = torch.cat([torch.randn(100000, generator=g) * 10, torch.logspace(-40, 38, 1000)])
    b = torch.cat([torch.randn(100000, generator=g) * 10, -torch.logspace(38, -40, 1000)])
    sp = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0, -3.0, float("inf"), float("-inf"), float("nan")])
    sa, sb = sp.repeat_interleave(len(sp)), sp.repeat(len(sp))
    for fn in (torch.atan2, torch.hypot, lambda p, q: torch.pow(p.abs(), q / 4), torch.logaddexp, torch.logaddexp2):
        got, ref = fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a.double(), b.double())
        ok = torch.isfinite(ref) & (ref.abs() <= torch.finfo(torch.float32).max)
        ulps = _float_ulps(got[ok], ref[ok])
        assert ulps.max() <= 1.0, ulps.max()
        # specials: zeros, infinities and NaN exactly as C's; finite values
        # within an ulp (atan2(1, 1) is the float nearest pi/4 here, one ulp
        # above the CPU's)
        got, want = fn(sa.to("tpu"), sb.to("tpu")).cpu(), fn(sa, sb)
        exact = ~torch.isfinite(want) | (want == 0)
        torch.testing.assert_close(got[exact], want[exact], rtol=0, atol=0, equal_nan=True)
        zero = want == 0  # a NaN's sign is not part of the contract
        assert torch.equal(torch.signbit(got[zero]), torch.signbit(want[zero]))
        ref = fn(sa.double(), sb.double())[~exact]
        # (float64's own rounding leaves logaddexp2(-1, -1) at -5e-17 instead of 0)
        assert ((_float_ulps(got[~exact], ref) <= 1.0) | ((got[~exact].double() - ref).abs() <= 1e-12)).all()
    # a negative base: integer exponents signed by their parity, others NaN
    base = torch.tensor([-2.0, -2.0, -2.0, -1.5, -0.5, -3.0, -2.0, -1.0, -1.0])
    expo = torch.tensor([3.0, 2.0, 0.5, -3.0, 7.0, 16777217.0, 8388609.0, float("inf"), 1e30])
    torch.testing.assert_close(torch.pow(base.to("tpu"), expo.to("tpu")).cpu(), torch.pow(base, expo),
                               rtol=2e-7, atol=0, equal_nan=True)
    assert torch.pow(torch.tensor([2.0, 9.0, 10.0], device="tpu"), torch.tensor([10.0, 0.5, 3.0], device="tpu")
                     ).cpu().tolist() == [1024.0, 3.0, 1000.0]


@pytest.mark.parametrize("name", ["fmod", "remainder", "floor_divide"])
def test_fmod_remainder_floor_divide_are_exact(name):
    # float fmod is exact (the quotient's truncation corrected where x / y
    # rounds up to an integer; libm past 2^28 |y|): the bits of C's fmodf
    # everywhere, and remainder / floor division built on it equal to the
    # CPU's wherever the CPU's own x - trunc(x / y) y formula is exact
    # (x / y finite and below 2^24, y normal)
    import numpy as np
    g = torch.Generator().manual_seed(6)
    a = torch.cat([torch.randn(50000, generator=g) * 100, torch.randn(50000, generator=g) * 1e9,
                   torch.arange(-50, 50, dtype=torch.float32) * 0.1])
    b = torch.cat([torch.randn(50000, generator=g), torch.randn(50000, generator=g) * 1e-3,
                   torch.full((100,), 0.1)])
    sp = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.7, -4.0, 1e-45, 3e38, float("inf"), float("-inf"), float("nan")])
    a = torch.cat([a, sp.repeat_interleave(len(sp))])
    b = torch.cat([b, sp.repeat(len(sp))])
    fn = {"fmod": torch.fmod, "remainder": torch.remainder,
          "floor_divide": lambda p, q: torch.div(p, q, rounding_mode="floor")}[name]
    got = fn(a.to("tpu"), b.to("tpu")).cpu()
    if name == "fmod":
        want = torch.from_numpy(np.fmod(a.numpy(), b.numpy()))
        keep = torch.ones_like(a, dtype=torch.bool)
    else:
        want = fn(a, b)
        keep = ((a / b).abs() < 2.0 ** 24) & (b.abs() >= torch.finfo(torch.float32).tiny)
    got, want = got[keep], want[keep]
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok].view(torch.int32), want[ok].view(torch.int32)), \
        (a[keep][ok][got[ok] != want[ok]][:5], b[keep][ok][got[ok] != want[ok]][:5])


def test_hardswish_backward_at_its_corners_and_nan():
    # as the CPU's vectorized kernel: zero from -3 down, the incoming
    # gradient from 3 up, NaN propagated (fuzz seed 202459)
    x = torch.tensor([float("nan"), -3.0, 3.0, -3.0000002, 2.9999998, -4.0, 4.0, 0.0] * 8, requires_grad=True)
    F.hardswish(x).backward(torch.full_like(x, 0.5))
    xt = x.detach().to("tpu").requires_grad_()
    F.hardswish(xt).backward(torch.full_like(xt, 0.5))
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=0, atol=0, equal_nan=True)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.float64], ids=str)
def test_rows_of_fewer_than_eight_elements(dtype):
    # innermost dims under 8 run per element (gather mode): operands laid
    # out row-major over the whole shape read and write contiguous runs,
    # the others through offsets — a broadcast row, a strided operand, an
    # in-place update, a cast on the way out, a strided output, blocks of
    # 2,048 elements with a remainder
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(3001, 4, generator=g) * 10).to(dtype)
    w = (torch.randn(4, generator=g) * 10).to(dtype)
    y = (torch.randn(4, 3001, generator=g) * 10).to(dtype).t()
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=0, atol=0)
    xd, wd, yd = x.to("tpu"), w.to("tpu"), y.to("tpu")
    torch.testing.assert_close((xd + wd).cpu(), x + w, **tol)
    torch.testing.assert_close((xd * yd - wd).cpu(), x * y - w, **tol)
    torch.testing.assert_close((xd + wd).float().cpu(), (x + w).float(), **tol)
    z = xd.clone()
    z.add_(wd)
    torch.testing.assert_close(z.cpu(), x + w, **tol)
    out = torch.zeros(3001, 8, dtype=dtype, device="tpu")
    torch.add(xd, wd, out=out[:, ::2])
    want = torch.zeros(3001, 8, dtype=dtype)
    want[:, ::2] = x + w
    torch.testing.assert_close(out.cpu(), want, **tol)
    torch.testing.assert_close(torch.where(xd > 0, xd, wd).cpu(), torch.where(x > 0, x, w), **tol)


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_broadcast_rows_kept_across_blocks(mode):
    """A row broadcast over rows shorter than a block is repeated into a
    block once and kept for the next blocks of a worker's chunk: it must be
    taken again when the row changes (a [B, 1, D] operand against [B, R,
    D], R not a multiple of the rows a block holds), when a block holds
    fewer rows (the chunk's last), per input (two broadcast rows, one
    converted from bf16), and when the kept block is the program's result
    (an expand copied out)."""
    import torch_tpu

    b, r, d = 6, 301, 64  # 32 rows of 64 to a block: blocks straddle the batches
    x = make((b, r, d), torch.float32, seed=31, special=False)
    per = make((b, 1, d), torch.float32, seed=32, special=False)
    row = make((d,), torch.bfloat16, seed=33, special=False)
    row2 = make((d,), torch.float32, seed=34, special=False)
    with torch_tpu.execution_mode(mode):
        dx, dper, drow, drow2 = (t.to("tpu") for t in (x, per, row, row2))
        got = [dx * dper, dx + drow, torch.addcmul(dx, drow, drow2), dper.expand(b, r, d).clone(),
               drow2.expand(b * r, d).contiguous(), (dx - drow2)[:, 5:, :] * dper]
        torch_tpu.flush()
    want = [x * per, x + row, torch.addcmul(x, row, row2), per.expand(b, r, d).clone(),
            row2.expand(b * r, d).contiguous(), (x - row2)[:, 5:, :] * per]
    for i, (g, w) in enumerate(zip(got, want)):
        # addcmul rounds its product and sum as CPU's kernel does only to an ulp
        check(g, w, rtol=None if i == 2 else 0, atol=None if i == 2 else 0)


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_constants_kept_across_blocks(mode):
    """Constant operands fill a kept block once per worker's chunk: every
    constant of a program keeps its own value (more constants than kept
    blocks: the rest fill a register every block), over 1-D launches of
    many blocks, rows, a partial last block, float64 and complex compute."""
    import torch_tpu

    n = 3 * 2048 * 4 + 517
    x = make((n,), torch.float32, seed=41, special=False)
    y = make((n // 11, 11 * 1), torch.float32, seed=42, special=False)
    z = make((n,), torch.float64, seed=43, special=False)
    c = torch.complex(make((n,), torch.float32, seed=44), make((n,), torch.float32, seed=45))
    with torch_tpu.execution_mode(mode):
        dx, dy, dz, dc = (t.to("tpu") for t in (x, y, z, c))
        got = [dx * 2, torch.clamp(dx, -0.5, 0.75), ((dx * 2 + 3) * 4 - 5) / 6 + 7, torch.where(dx > 0, 1.5, -2.5),
               dy * 0.25 - 1, dz * 3 + 0.125, dc * (2 - 1j), dx.lerp(dx * 0.5, 0.3)]
        torch_tpu.flush()
    want = [x * 2, torch.clamp(x, -0.5, 0.75), ((x * 2 + 3) * 4 - 5) / 6 + 7, torch.where(x > 0, 1.5, -2.5),
            y * 0.25 - 1, z * 3 + 0.125, c * (2 - 1j), x.lerp(x * 0.5, 0.3)]
    for g, w in zip(got, want):
        check(g, w)


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_rows_read_one_by_one(mode):
    """Blocks of short rows whose operands are neither one run nor one
    repeated row read each row in place or as one value (stride 0): kron
    (rows of 16 / 32 crossing the outer dims inside a block), permuted and
    sliced inputs, float rows mixed with converted ones."""
    import torch_tpu

    a, b = make((32, 32), torch.float32, seed=51), make((16, 16), torch.float32, seed=52)
    c = make((40, 24, 36), torch.float32, seed=53, special=False)
    h = make((40, 1, 36), torch.float16, seed=54, special=False)
    with torch_tpu.execution_mode(mode):
        da, db, dc, dh = (t.to("tpu") for t in (a, b, c, h))
        got = [torch.kron(da, db), torch.kron(db, da), dc.permute(1, 0, 2) * dc[:1].permute(1, 0, 2),
               dc[:, 3:, 2:30] + dh[:, :, 2:30], dc.transpose(0, 1)[::2, :, 5:] - da[:24:2, None, :31]]
        torch_tpu.flush()
    want = [torch.kron(a, b), torch.kron(b, a), c.permute(1, 0, 2) * c[:1].permute(1, 0, 2),
            c[:, 3:, 2:30] + h[:, :, 2:30], c.transpose(0, 1)[::2, :, 5:] - a[:24:2, None, :31]]
    for g, w in zip(got, want):
        check(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("width", [2, 3, 4, 7])
def test_short_rows_as_runs(mode, width):
    """Rows of fewer than 8 elements run several hundred to a block when
    every operand is one run, a repeated row or one float a row: outer
    dims with carries inside a block, a row count that is no multiple of
    a block's, converted repeated rows, in-place updates, float64, int64
    and the layouts that still gather (transposed rows, double values a
    row), all against CPU."""
    import torch_tpu

    shape = (37, 53, width)
    x = make(shape, torch.float32, seed=61, special=False)
    y = make(shape, torch.float32, seed=62, special=False)
    row = make((width,), torch.bfloat16, seed=63, special=False)
    per = make((37, 1, width), torch.float32, seed=64, special=False)
    xd = make(shape, torch.float64, seed=65, special=False)
    xi = make(shape, torch.int64, seed=66)
    t = make((width, 37 * 53), torch.float32, seed=67, special=False)
    with torch_tpu.execution_mode(mode):
        dx, dy, drow, dper, dxd, dxi, dt = (v.to("tpu") for v in (x, y, row, per, xd, xi, t))
        inplace = dx.clone()
        inplace.mul_(drow)
        got = [dx + drow, dx * dx[..., :1], dx * dper, torch.addcmul(dx, dy, drow, value=0.5), inplace,
               dxd * dxd[..., :1] + drow, dxi * dxi[..., :1] - 3, dt.t() - drow, dx.view(-1, width) - dt.t()]
        torch_tpu.flush()
    ip = x.clone()
    ip.mul_(row)
    want = [x + row, x * x[..., :1], x * per, torch.addcmul(x, y, row, value=0.5), ip,
            xd * xd[..., :1] + row, xi * xi[..., :1] - 3, t.t() - row, x.view(-1, width) - t.t()]
    for i, (g, w) in enumerate(zip(got, want)):
        check(g, w, rtol=None if i == 3 else 0, atol=None if i == 3 else 0)
