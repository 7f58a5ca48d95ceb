"""What each statement of a fuzz program does, on any device.

A statement is ``{"op": name, "in": [var ids], "p": {params}, "out": id}``;
``RUN[name](ctx, inputs, p)`` performs it on the tensors ``inputs`` (already
on ctx.device) and returns the result (or None for statements that only
mutate or synchronize). The same function runs the CPU reference and the
tpu side; the two places where they differ on purpose are

* random numbers: the CPU cannot draw the device's Philox stream, so the
  reference replays the values the tpu strict run drew (``ctx.tape``) —
  strict and defer must then draw the same numbers for the values to agree;
* float32 matrix products below HIGHEST precision: the reference computes the
  device's documented contract (torch_tpu/tpu/precision.py) on the CPU —
  operands rounded to bfloat16 (DEFAULT) or split into bfloat16 hi + lo with
  hi*hi + hi*lo + lo*hi (HIGH).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "u8": torch.uint8, "bool": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


@dataclass
class Ctx:
    device: str                      # "cpu" or "tpu"
    precision: str = "HIGHEST"       # the program's f32 matmul precision
    tape: dict[int, torch.Tensor] = field(default_factory=dict)  # RNG values by statement index
    record: bool = False             # tpu strict: record RNG draws into tape
    index: int = 0                   # statement being run
    generating: bool = False         # the generator's own CPU run: draws CPU random numbers
    promote: bool = False            # the float64 reference: every float tensor is upcast to float64
    grad_contract: bool = False      # reference gradients of matrix products at the precision contract too

    def fdtype(self, dt: torch.dtype) -> torch.dtype:
        """The dtype a statement asks for, in this run."""
        return torch.float64 if self.promote and dt.is_floating_point else dt

    @property
    def is_ref(self) -> bool:
        return self.device == "cpu"


RUN: dict[str, Callable[[Ctx, list[torch.Tensor], dict[str, Any]], Any]] = {}


def op(name: str):
    def deco(fn):
        RUN[name] = fn
        return fn
    return deco


# ----------------------------------------------------------------- inputs

def host_value(p: dict[str, Any]) -> torch.Tensor:
    """The host tensor an input statement describes (before its layout)."""
    g = torch.Generator().manual_seed(p["seed"])
    shape = list(p["shape"])
    layout = p.get("layout", "c")
    if layout == "t":
        shape[-1], shape[-2] = shape[-2], shape[-1]
    elif layout == "s":
        shape[p["ldim"]] *= 2
    elif layout == "e":
        shape[p["ldim"]] = 1
    kind = p["kind"]
    dt = DTYPES[p["dtype"]]
    if kind == "float":
        t = torch.randn(shape, generator=g, dtype=torch.float64) * p.get("scale", 1.0)
        sp = p.get("special")
        if sp and t.numel():
            flat = t.view(-1)
            pos = torch.randint(0, flat.numel(), (min(3, flat.numel()),), generator=g)
            vals = torch.tensor([float(sp_val) for sp_val in sp], dtype=torch.float64)
            flat[pos[: len(vals)]] = vals[: len(pos)]
    elif kind == "int":
        t = torch.randint(p["lo"], p["hi"], shape, generator=g, dtype=torch.int64)
    elif kind == "bool":
        t = torch.rand(shape, generator=g) < p.get("pt", 0.5)
    elif kind == "perm":   # rows of distinct indices in [0, n) along dim (scatter targets)
        d, n = p["dim"], p["n"]
        full = list(shape)
        full[d] = n
        t = torch.rand(full, generator=g).argsort(dim=d).narrow(d, 0, shape[d])
    else:
        raise ValueError(kind)
    return t.to(dt).contiguous()


@op("input")
def _input(ctx, ins, p):
    t = host_value(p)
    t = t.to(ctx.device, ctx.fdtype(t.dtype))
    layout = p.get("layout", "c")
    if layout == "t":
        t = t.transpose(-1, -2)
    elif layout == "s":
        t = t[(slice(None),) * p["ldim"] + (slice(None, None, 2),)]
    elif layout == "e":
        t = t.expand(p["shape"])
    if p.get("rg"):
        t = t.detach().requires_grad_()
    return t


# ------------------------------------------------------------ elementwise

def _pos(x):
    return x.abs() + 0.5


def _divisor(b):
    """|b| + 1, never 0: in uint8 255 + 1 wraps to 0, and an integer division by zero raises on the CPU at its
    statement, on tpu at the next synchronization (seed 672294)."""
    if not isinstance(b, torch.Tensor):
        return abs(b) + 1
    d = b.abs() + 1
    return d.masked_fill(d == 0, 1) if d.dtype == torch.uint8 else d


def _nan_free(x):
    """x with its NaNs as +0: the sign bit of a NaN an op produced is not part of the precision contract (an
    x86 product propagates its NaN operand's sign, a bf16 split or another summation order may meet another
    NaN first; seed 50389: copysign from the NaN row of a DEFAULT-precision matmul), so copysign and signbit
    are generated on NaN-free sign sources."""
    return torch.where(torch.isnan(x), torch.zeros_like(x), x) if isinstance(x, torch.Tensor) else x


UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "round": torch.round, "sign": torch.sign, "sqrt_abs": lambda x: torch.sqrt(x.abs()),
    "square": torch.square, "reciprocal_pos": lambda x: torch.reciprocal(_pos(x)),
    "exp": lambda x: torch.exp(x.clamp(max=30) if x.is_floating_point() else x), "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "sin": torch.sin, "cos": torch.cos, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "erf": torch.erf,
    "log_pos": lambda x: torch.log(_pos(x)), "log1p_abs": lambda x: torch.log1p(x.abs()),
    "rsqrt_pos": lambda x: torch.rsqrt(_pos(x)), "softplus": F.softplus, "elu": F.elu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1), "hardtanh": F.hardtanh, "hardswish": F.hardswish,
    "mish": F.mish, "atan": torch.atan, "asinh": torch.asinh, "expm1": lambda x: torch.expm1(x.clamp(max=30)),
    "frac": torch.frac, "nan_to_num": lambda x: torch.nan_to_num(x, nan=0.0, posinf=1e4, neginf=-1e4),
    "isnan": torch.isnan, "isfinite": torch.isfinite, "signbit": lambda x: torch.signbit(x) & ~torch.isnan(x),
    "bitwise_not": torch.bitwise_not, "logical_not": torch.logical_not,
    "clamp": lambda x: torch.clamp(x, -1, 2), "clamp_min": lambda x: torch.clamp(x, min=0),
    "hardsigmoid": F.hardsigmoid, "logsigmoid": F.logsigmoid, "erfinv_c": lambda x: torch.erfinv(x.clamp(-0.9, 0.9)),
}


@op("unary")
def _unary(ctx, ins, p):
    return UNARY[p["f"]](ins[0])


def _scalar_or(ins, p, i=1):
    return ins[i] if "s" not in p else p["s"]


BINARY: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2), "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "div_pos": lambda a, b: torch.div(a, _pos(b) if isinstance(b, torch.Tensor) else abs(b) + 0.5),
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "atan2": torch.atan2, "hypot": torch.hypot, "logaddexp": torch.logaddexp, "copysign": lambda a, b: torch.copysign(a, _nan_free(b)),
    "pow_pos": lambda a, b: torch.pow(_pos(a), b.clamp(-3, 3) if isinstance(b, torch.Tensor) else b),
    "remainder_pos": lambda a, b: torch.remainder(a, _divisor(b)),
    "fmod_pos": lambda a, b: torch.fmod(a, _divisor(b)),
    "floor_divide": torch.floor_divide,
    "floor_divide_pos": lambda a, b: torch.floor_divide(a, _divisor(b)),
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "xlogy": lambda a, b: torch.xlogy(a, _pos(b)),
}


@op("binary")
def _binary(ctx, ins, p):
    return BINARY[p["f"]](ins[0], _scalar_or(ins, p))


@op("where")
def _where(ctx, ins, p):
    return torch.where(ins[0], ins[1], ins[2] if len(ins) > 2 else p["s"])


@op("masked_fill")
def _masked_fill(ctx, ins, p):
    return ins[0].masked_fill(ins[1], p["s"])


@op("addcmul")
def _addcmul(ctx, ins, p):
    return torch.addcmul(ins[0], ins[1], ins[2], value=p.get("v", 1.0))


@op("addcdiv")
def _addcdiv(ctx, ins, p):
    return torch.addcdiv(ins[0], ins[1], _pos(ins[2]), value=p.get("v", 1.0))


@op("cast")
def _cast(ctx, ins, p):
    return ins[0].to(ctx.fdtype(DTYPES[p["dtype"]]))


# -------------------------------------------------------------- reductions

def _dims(p):
    return p.get("dim")


REDUCE: dict[str, Callable[..., Any]] = {
    "sum": lambda x, d, k: torch.sum(x, d, keepdim=k) if d is not None else torch.sum(x),
    "sum_f32": lambda x, d, k: torch.sum(x, d, keepdim=k, dtype=torch.float32) if d is not None else torch.sum(x, dtype=torch.float32),
    "nansum": lambda x, d, k: torch.nansum(x, d, keepdim=k) if d is not None else torch.nansum(x),
    "mean": lambda x, d, k: torch.mean(x, d, keepdim=k) if d is not None else torch.mean(x),
    "prod": lambda x, d, k: torch.prod(x, d[0], keepdim=k) if d is not None else torch.prod(x),
    "amax": lambda x, d, k: torch.amax(x, d if d is not None else (), keepdim=k),
    "amin": lambda x, d, k: torch.amin(x, d if d is not None else (), keepdim=k),
    "max_dim": lambda x, d, k: torch.max(x, d[0], keepdim=k).values if d is not None else torch.max(x),
    "min_dim_idx": lambda x, d, k: torch.min(x, d[0], keepdim=k).indices if d is not None else torch.min(x),
    "argmax": lambda x, d, k: torch.argmax(x, d[0], keepdim=k) if d is not None else torch.argmax(x),
    "argmin": lambda x, d, k: torch.argmin(x, d[0], keepdim=k) if d is not None else torch.argmin(x),
    "var": lambda x, d, k: torch.var(x, d, keepdim=k) if d is not None else torch.var(x),
    "std0": lambda x, d, k: torch.std(x, d, keepdim=k, correction=0) if d is not None else torch.std(x, correction=0),
    "norm2": lambda x, d, k: torch.linalg.vector_norm(x, 2, d, keepdim=k),
    "norm1": lambda x, d, k: torch.linalg.vector_norm(x, 1, d, keepdim=k),
    "norminf": lambda x, d, k: torch.linalg.vector_norm(x, float("inf"), d, keepdim=k),
    "logsumexp": lambda x, d, k: torch.logsumexp(x, d if d is not None else tuple(range(x.dim())), keepdim=k),
    "any": lambda x, d, k: torch.any(x, d[0], keepdim=k) if d is not None else torch.any(x),
    "all": lambda x, d, k: torch.all(x, d[0], keepdim=k) if d is not None else torch.all(x),
    "count_nonzero": lambda x, d, k: torch.count_nonzero(x, d) if d is not None else torch.count_nonzero(x),
    "cumsum": lambda x, d, k: torch.cumsum(x, d[0] if d is not None else 0),
    "cumprod": lambda x, d, k: torch.cumprod(x, d[0] if d is not None else 0),
    "softmax": lambda x, d, k: torch.softmax(x, d[0] if d is not None else -1),
    "log_softmax": lambda x, d, k: torch.log_softmax(x, d[0] if d is not None else -1),
    "cummax": lambda x, d, k: torch.cummax(x, d[0] if d is not None else 0).values,
}


@op("reduce")
def _reduce(ctx, ins, p):
    return REDUCE[p["f"]](ins[0], _dims(p), p.get("keep", False))


# -------------------------------------------------------------- matmuls

def _split_bf16(x):
    hi = x.to(torch.bfloat16).to(x.dtype)
    lo = (x - hi).to(torch.bfloat16).to(x.dtype)
    return hi, lo


def _bilinear(ctx, fn, a, b):
    """fn(a, b) at the program's precision (the reference computes the
    device's contract; the device applies it itself)."""
    f32 = torch.float64 if ctx.promote else torch.float32   # the float64 reference keeps the contract
    if not ctx.is_ref or ctx.precision == "HIGHEST" or a.dtype != f32 or b.dtype != f32:
        return fn(a, b)
    with torch.no_grad():
        if ctx.precision == "DEFAULT":
            low = fn(_split_bf16(a)[0], _split_bf16(b)[0])
        else:
            ah, al = _split_bf16(a)
            bh, bl = _split_bf16(b)
            low = fn(ah, bh) + fn(ah, bl) + fn(al, bh)
    if ctx.grad_contract and (a.requires_grad or b.requires_grad):
        return _ContractGrad.apply(a, b, low, fn, ctx.precision)
    # the contract's values with fn's autograd graph (which saves a and b, as the device's does)
    full = fn(a, b)
    return _Values.apply(full, low) if full.requires_grad else low


def _contract(precision, prod, x, y):
    """prod(x, y), bilinear, at the f32 precision contract: operands rounded
    to bfloat16 (DEFAULT), or hi*hi + hi*lo + lo*hi of their bfloat16 splits (HIGH)."""
    xh, xl = _split_bf16(x)
    yh, yl = _split_bf16(y)
    if precision == "DEFAULT":
        return prod(xh, yh)
    return prod(xh, yh) + prod(xh, yl) + prod(xl, yh)


class _ContractGrad(torch.autograd.Function):
    """low's values; gradients whose products are computed at the contract
    too (the device's backward products run at the program's precision: with
    an infinite operand, HIGH's split gives NaN where a full product gives inf)."""

    @staticmethod
    def forward(ctx, a, b, low, fn, precision):
        ctx.save_for_backward(a, b)
        ctx.fn, ctx.precision = fn, precision
        return low.clone()

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors

        def vjp_a(g, other):   # d/da <g, fn(a, other)>: bilinear, independent of a
            with torch.enable_grad():
                x = torch.zeros_like(a, requires_grad=True)
                return torch.autograd.grad(ctx.fn(x, other), x, g)[0]

        def vjp_b(g, other):
            with torch.enable_grad():
                y = torch.zeros_like(b, requires_grad=True)
                return torch.autograd.grad(ctx.fn(other, y), y, g)[0]

        ga = _contract(ctx.precision, vjp_a, grad, b) if ctx.needs_input_grad[0] else None
        gb = _contract(ctx.precision, vjp_b, grad, a) if ctx.needs_input_grad[1] else None
        return ga, gb, None, None, None


class _Values(torch.autograd.Function):
    """low's values, full's gradient."""

    @staticmethod
    def forward(ctx, full, low):
        return low.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


MATMUL: dict[str, Callable[..., torch.Tensor]] = {
    "mm": torch.mm, "bmm": torch.bmm, "matmul": torch.matmul, "mv": torch.mv, "dot": torch.dot,
    "linear": lambda a, b: F.linear(a, b), "einsum_bij_bjk": lambda a, b: torch.einsum("bij,bjk->bik", a, b),
}


@op("matmul")
def _matmul(ctx, ins, p):
    if p["f"] == "einsum_bij_bjk" and ins[0].shape[-1] == 1:
        # a contraction over one element: PyTorch's einsum multiplies instead of calling a product kernel
        return torch.einsum("bij,bjk->bik", ins[0], ins[1])
    out = _bilinear(ctx, MATMUL[p["f"]], ins[0], ins[1])
    if len(ins) > 2:   # bias (addmm / linear with bias)
        out = out + ins[2] if p.get("beta") is None else p["beta"] * ins[2] + out
    return out


# ------------------------------------------------------------------ views

@op("view")
def _view(ctx, ins, p):
    x, f = ins[0], p["f"]
    if f == "view":
        return x.view(p["shape"])
    if f == "reshape":
        return x.reshape(p["shape"])
    if f == "transpose":
        return x.transpose(p["a"], p["b"])
    if f == "permute":
        return x.permute(p["perm"])
    if f == "narrow":
        return x.narrow(p["d"], p["start"], p["len"])
    if f == "slice":
        return x[(slice(None),) * p["d"] + (slice(p["start"], p["stop"], p["step"]),)]
    if f == "select":
        return x.select(p["d"], p["i"])
    if f == "unsqueeze":
        return x.unsqueeze(p["d"])
    if f == "squeeze":
        return x.squeeze(p["d"])
    if f == "expand":
        return x.expand(p["shape"])
    if f == "as_strided":
        return x.as_strided(p["size"], p["stride"], p["offset"])
    if f == "diagonal":
        return x.diagonal(p["off"], p["a"], p["b"])
    if f == "unfold":
        return x.unfold(p["d"], p["size"], p["step"])
    if f == "flatten":
        return x.flatten()
    if f == "movedim":
        return x.movedim(p["a"], p["b"])
    if f == "chunk":
        return x.chunk(p["n"], p["d"])[p["i"]]
    if f == "unbind":
        return x.unbind(p["d"])[p["i"]]
    if f == "mT":
        return x.mT
    if f == "detach":
        return x.detach()
    raise ValueError(f)


@op("copyop")
def _copyop(ctx, ins, p):
    x, f = ins[0], p["f"]
    if f == "contiguous":
        return x.contiguous()
    if f == "clone":
        return x.clone()
    if f == "flip":
        return x.flip(p["dims"])
    if f == "roll":
        return x.roll(p["shift"], p["d"])
    if f == "repeat":
        return x.repeat(p["reps"])
    if f == "tril":
        return x.tril(p["k"])
    if f == "triu":
        return x.triu(p["k"])
    if f == "pad":
        return F.pad(x, p["pad"], value=p.get("value", 0.0))
    if f == "repeat_interleave":
        return x.repeat_interleave(p["r"], p["d"])
    raise ValueError(f)


@op("cat")
def _cat(ctx, ins, p):
    return torch.cat(ins, p["d"])


@op("stack")
def _stack(ctx, ins, p):
    return torch.stack(ins, p["d"])


@op("sort")
def _sort(ctx, ins, p):
    r = torch.sort(ins[0], dim=p["d"], descending=p["desc"], stable=True)
    return r.values if p["which"] == 0 else r.indices


@op("topk")
def _topk(ctx, ins, p):
    return torch.topk(ins[0], p["k"], dim=p["d"], largest=p["largest"]).values


@op("norm_layer")
def _norm_layer(ctx, ins, p):
    x = ins[0]
    n = p["n"]
    w = ins[1] if len(ins) > 1 else None
    b = ins[2] if len(ins) > 2 else None
    if p["f"] == "layer_norm":
        return F.layer_norm(x, x.shape[-n:], w, b)
    return F.rms_norm(x, x.shape[-n:], w, eps=1e-5)


# ---------------------------------------------------------------- in-place

INPLACE: dict[str, Callable[..., Any]] = {
    "add_": lambda t, s: t.add_(s), "sub_": lambda t, s: t.sub_(s), "mul_": lambda t, s: t.mul_(s),
    "div_": lambda t, s: t.div_(_pos(s) if isinstance(s, torch.Tensor) else abs(s) + 0.5),
    "copy_": lambda t, s: t.copy_(s), "maximum_": lambda t, s: t.copy_(torch.maximum(t, s)),
    "lerp_": lambda t, s: t.lerp_(s, 0.25), "addcmul_": lambda t, s: t.addcmul_(s, s, value=0.5),
}
INPLACE1: dict[str, Callable[..., Any]] = {
    "fill_": lambda t, p: t.fill_(p["s"]), "zero_": lambda t, p: t.zero_(), "clamp_": lambda t, p: t.clamp_(-1, 1),
    "relu_": lambda t, p: t.relu_(), "neg_": lambda t, p: t.neg_(), "abs_": lambda t, p: t.abs_(),
    "exp_": lambda t, p: t.clamp_(max=20).exp_(), "sigmoid_": lambda t, p: t.sigmoid_(),
}


@op("inplace")
def _inplace(ctx, ins, p):
    if p["f"] in INPLACE1:
        INPLACE1[p["f"]](ins[0], p)
    else:
        INPLACE[p["f"]](ins[0], _scalar_or(ins, p))
    return None


@op("masked_fill_")
def _masked_fill_(ctx, ins, p):
    ins[0].masked_fill_(ins[1], p["s"])


@op("setitem")
def _setitem(ctx, ins, p):
    key = _key(ins[2:], p["key"])
    ins[0][key] = ins[1] if "s" not in p else p["s"]


def _key(idx_tensors, spec):
    """A __getitem__ key from a json spec: ints, [start, stop, step] slices,
    "t" (the next index tensor), null (None), "..." (Ellipsis)."""
    key, it = [], iter(idx_tensors)
    for k in spec:
        if k == "t":
            key.append(next(it))
        elif k == "...":
            key.append(Ellipsis)
        elif k is None:
            key.append(None)
        elif isinstance(k, list):
            key.append(slice(*k))
        else:
            key.append(k)
    return tuple(key)


# ----------------------------------------------------------------- indexing

@op("getitem")
def _getitem(ctx, ins, p):
    return ins[0][_key(ins[1:], p["key"])]


def _ref_index(ctx, idx, f):
    """The index the reference uses: PyTorch 2.13's CPU scatter_add / scatter_reduce take a fast
    path for an index expanded along its other dims (stride 0) that writes to the wrong elements
    when self is wider than the index (tests/fuzz/regressions/seed_9691.json); the same values,
    contiguous, take the CPU's general path."""
    return idx.contiguous() if ctx.is_ref and f.startswith("scatter") else idx


@op("index")
def _index(ctx, ins, p):
    x, idx, f, d = ins[0], _ref_index(ctx, ins[1], p["f"]), p["f"], p.get("d", 0)
    if f == "index_select":
        return torch.index_select(x, d, idx)
    if f == "gather":
        return torch.gather(x, d, idx)
    if f == "take":
        return torch.take(x, idx)
    if f == "embedding":
        return F.embedding(idx, x)
    if f == "scatter":
        return torch.scatter(x, d, idx, ins[2])
    if f == "scatter_add":
        return torch.scatter_add(x, d, idx, ins[2])
    if f == "scatter_reduce":
        return torch.scatter_reduce(x, d, idx, ins[2], p["reduce"], include_self=p["self"])
    if f == "index_add":
        return torch.index_add(x, d, idx, ins[2], alpha=p.get("alpha", 1))
    if f == "index_copy":
        return torch.index_copy(x, d, idx, ins[2])
    if f == "index_fill":
        return x.index_fill(d, idx, p["s"])
    if f == "index_put":
        return x.index_put((idx,), ins[2], accumulate=p["acc"])
    raise ValueError(f)


@op("index_")
def _index_(ctx, ins, p):
    x, idx, f, d = ins[0], _ref_index(ctx, ins[1], p["f"]), p["f"], p.get("d", 0)
    if f == "scatter_":
        x.scatter_(d, idx, ins[2])
    elif f == "scatter_add_":
        x.scatter_add_(d, idx, ins[2])
    elif f == "index_add_":
        x.index_add_(d, idx, ins[2])
    elif f == "index_put_":
        x.index_put_((idx,), ins[2], accumulate=p["acc"])
    elif f == "index_fill_":
        x.index_fill_(d, idx, p["s"])
    else:
        raise ValueError(f)


@op("masked_select")
def _masked_select(ctx, ins, p):
    return torch.masked_select(ins[0], ins[1])


@op("nonzero")
def _nonzero(ctx, ins, p):
    return torch.nonzero(ins[0])


# ---------------------------------------------------------------------- RNG

def _draw(ctx, p, like: torch.Tensor | None):
    dev = ctx.device
    gen = None
    if p.get("gen") is not None:
        gen = torch.Generator(device=dev)
        gen.manual_seed(p["gen"])
    elif p.get("reseed") is not None:
        (torch.manual_seed if dev == "cpu" else torch.tpu.manual_seed)(p["reseed"])
    f, shape, dt = p["f"], p.get("shape"), DTYPES[p.get("dtype", "f32")]
    if f == "rand":
        return torch.rand(shape, device=dev, dtype=dt, generator=gen)
    if f == "randn":
        return torch.randn(shape, device=dev, dtype=dt, generator=gen)
    if f == "randint":
        return torch.randint(0, p["hi"], shape, device=dev, dtype=dt, generator=gen)
    if f == "bernoulli":
        return torch.bernoulli(torch.full(shape, p["pp"], device=dev, dtype=dt), generator=gen)
    if f == "normal_":
        return torch.empty(shape, device=dev, dtype=dt).normal_(1.0, 2.0, generator=gen)
    if f == "uniform_":
        return torch.empty(shape, device=dev, dtype=dt).uniform_(-2.0, 3.0, generator=gen)
    if f == "randperm":
        return torch.randperm(p["n"], device=dev, generator=gen)
    if f == "dropout":   # what F.dropout runs on a device for 0 < p < 1; the mask is what the reference needs
        if 0 < p["pp"] < 1:
            return torch.native_dropout(like, p["pp"], True)
        return F.dropout(like, p["pp"], training=True), None
    raise ValueError(f)


@op("rng")
def _rng(ctx, ins, p):
    if ctx.is_ref and not ctx.generating:
        drawn = ctx.tape.get(ctx.index)
        if drawn is None:
            raise LookupError("the tpu strict run drew no values for this statement")
        if p["f"] == "dropout":   # the reference keeps what the device kept (the CPU's formula: x * mask * scale)
            x = ins[0]
            if not 0 < p["pp"] < 1:   # no draw: PyTorch returns the input itself (p = 0) or x * 0 (p = 1)
                return F.dropout(x, p["pp"], training=True)
            return x * (drawn.to(x.dtype) * (1.0 / (1.0 - p["pp"])))
        return drawn.to(ctx.fdtype(drawn.dtype), copy=True)
    out = _draw(ctx, p, ins[0] if ins else None)
    if p["f"] == "dropout":
        out, mask = out
        if ctx.record:
            ctx.tape[ctx.index] = mask.cpu() if mask is not None else torch.zeros(())
        return out
    if ctx.record:
        ctx.tape[ctx.index] = out.detach().cpu()
    return out


# ------------------------------------------------------- sync and autograd

@op("sync")
def _sync(ctx, ins, p):
    f = p["f"]
    if f == "item" and ins:
        ins[0].detach().float().sum().item()
    elif f == "cpu" and ins:
        ins[0].detach().cpu()
    elif f == "print" and ins:
        str(ins[0])
    elif not ctx.is_ref:
        if f == "synchronize":
            torch.tpu.synchronize()
        elif f == "flush":
            import torch_tpu
            torch_tpu.flush()


@op("backward")
def _backward(ctx, ins, p):
    y = ins[0]
    g = torch.Generator().manual_seed(p["seed"])
    w = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype).to(y.device)
    (y * w).sum().backward(retain_graph=p.get("retain", False))
