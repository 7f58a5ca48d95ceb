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


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY_FLOAT))
def test_unary_float(name, dtype):
    fn, lo, hi = UNARY_FLOAT[name]
    x = make((37, 29), dtype, lo, hi)
    want = fn(x)
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


def test_large_parallel_and_mixed_dtypes():
    n = 300_001
    a = make((n,), torch.float32, seed=11)
    b = make((n,), torch.bfloat16, seed=12)
    check(a.to("tpu") + b.to("tpu"), a + b)
    check(F.gelu(a.to("tpu")), F.gelu(a))
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
