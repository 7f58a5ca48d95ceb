"""Random well-formed programs, reproducible from one integer seed.

``generate(seed)`` returns a program: a JSON-able dict with its seed, the
f32 matmul precision it runs at and a list of statements (see ops.py). The
generator runs every statement on the CPU as it emits it, so it knows each
variable's shape, dtype, aliasing (views share a group with their base) and
whether its value is *exact* — computed only by correctly rounded operations
(inputs, views, copies, +, -, *, /, max, comparisons, casts of exact
values, ...) so that a device must give the very same bits. Discrete results
(comparisons, arg max, sort, casts to integers, nonzero) are only taken of
exact values: of a sum, say, the device may round differently and flip them.

A few statements are ill-formed on purpose (an index out of range, mixed
devices are not among them): the device must then raise the exception class
the CPU raises, at the same statement, and keep working. Statements the
generator did not mean to fail but that fail on the CPU are mostly dropped.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from .ops import DTYPES, NAMES, RUN, Ctx, UNARY, BINARY, REDUCE, MATMUL, INPLACE, INPLACE1

FLOATS = ("f32", "f64", "bf16", "f16")
INTS = ("i64", "i32", "i16", "u8")
# sqrt is left out: the CPU's vectorized sqrt is not always correctly rounded (1 ulp off)
EXACT_UNARY = {"neg", "abs", "relu", "floor", "ceil", "trunc", "round", "sign", "square",
               "reciprocal_pos", "isnan", "isfinite", "signbit", "bitwise_not", "logical_not", "clamp",
               "clamp_min", "frac", "nan_to_num", "hardtanh"}
INT_UNARY = ("neg", "abs", "sign", "square", "bitwise_not", "logical_not", "clamp", "clamp_min", "relu")
# functions that jump where an inexact value rounds (logical_not: x == 0, where the CPU's float gelu of -5.84 is
# 0 and the device's the exact -1.6e-8 — seed 702234), not generated on inexact values
DISCRETE_UNARY = {"isnan", "isfinite", "signbit", "floor", "ceil", "trunc", "round", "sign", "frac", "logical_not"}
EXACT_BINARY = {"add", "sub", "mul", "div_pos", "maximum", "minimum", "fmax", "fmin", "copysign", "fmod_pos",
                "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and",
                "bitwise_or", "bitwise_xor"}
# (fmod jumps by its divisor where remainder does, and a dividend far above the divisor turns its relative
# error into an absolute one of the result's size: seed 130874, exp of a product near 6e5 ran through fmod)
DISCRETE_BINARY = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
                   "floor_divide_pos", "remainder_pos", "fmod_pos"}
INT_BINARY = ("add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and",
              "bitwise_or", "bitwise_xor", "floor_divide_pos", "remainder_pos", "logical_and", "add_alpha")
EXACT_REDUCE = {"amax", "amin", "max_dim", "min_dim_idx", "argmax", "argmin", "any", "all", "count_nonzero",
                "norminf", "cummax"}
INT_REDUCE = ("sum", "prod", "amax", "amin", "max_dim", "argmax", "argmin", "any", "all", "count_nonzero",
              "cumsum", "cumprod", "min_dim_idx", "cummax")
EXACT_INPLACE = {"add_", "sub_", "mul_", "div_", "copy_", "maximum_", "fill_", "zero_", "clamp_", "relu_",
                 "neg_", "abs_"}


@dataclass
class Var:
    t: torch.Tensor      # its value on the CPU (generation time)
    exact: bool
    grp: int             # alias group: a base and its views
    overlap: bool = False  # a view whose elements overlap (as_strided with small strides, expand)


class Builder:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.r = random.Random(seed)
        self.stmts: list[dict[str, Any]] = []
        self.vars: dict[int, Var] = {}
        self.next_id = 0
        self.precision = self.r.choices(["HIGHEST", "HIGH", "DEFAULT"], [70, 15, 15])[0]
        self.ctx = Ctx("cpu", self.precision, generating=True)
        self.backwards = 0

    # ------------------------------------------------------------ emitting
    def emit(self, op: str, ins: list[int], p: dict[str, Any], exact: bool, view: bool = False,
             mutates: int | None = None, sync: bool = False, keep_error: float = 0.0,
             overlap: bool = False) -> int | None:
        """Runs the statement on the CPU; records it (and its output var).
        A statement meant to be valid that raises is dropped, except with
        probability keep_error (then the devices must agree on the error)."""
        self.ctx.index = len(self.stmts)
        try:
            with torch.random.fork_rng(devices=[]):
                out = RUN[op](self.ctx, [self.vars[i].t for i in ins], p)
        except Exception:
            if self.r.random() >= keep_error:
                return None
            st = {"op": op, "in": ins, "p": p, "out": None}
            if mutates is not None:
                st["mut"] = mutates
                self._poison(self.vars[mutates].grp)
            if sync:
                st["sync"] = True
            self.stmts.append(st)
            return None
        st: dict[str, Any] = {"op": op, "in": ins, "p": p, "out": None}
        if sync:
            st["sync"] = True
        if mutates is not None:
            st["mut"] = mutates
            if exact:
                st["x"] = True
            if not exact:
                for v in self.vars.values():
                    if v.grp == self.vars[mutates].grp:
                        v.exact = False
        if isinstance(out, torch.Tensor):
            vid = self.next_id
            self.next_id += 1
            st["out"] = vid
            if exact:
                st["x"] = True
            # an op may return its input itself or a view of it (x.to(x.dtype), contiguous(), dropout(p=0))
            alias = next((i for i in ins if _same_storage(out, self.vars[i].t)), None)
            if alias is not None and not view:
                st["alias"] = alias
            grp = self.vars[ins[0]].grp if view else (self.vars[alias].grp if alias is not None else vid)
            # ... and keeps its overlap (a write through it then depends on the order of the writes)
            src = ins[0] if view else alias
            self.vars[vid] = Var(out, exact, grp, overlap or (src is not None and self.vars[src].overlap))
            self.stmts.append(st)
            return vid
        self.stmts.append(st)
        return None

    def _poison(self, grp: int) -> None:
        for k in [k for k, v in self.vars.items() if v.grp == grp]:
            del self.vars[k]

    # ------------------------------------------------------------- helpers
    def shape(self, max_rank: int = 4, big: bool = False) -> list[int]:
        r = self.r
        rank = r.choices([0, 1, 2, 3, 4], [6, 25, 35, 22, 12])[0]
        rank = min(rank, max_rank)
        sizes = [0, 1, 2, 3, 4, 5, 7, 8, 13, 16]
        weights = [3, 14, 12, 12, 10, 8, 8, 8, 5, 6]
        s = [r.choices(sizes, weights)[0] for _ in range(rank)]
        if big and rank:
            s[-1] = r.choice([64, 100, 257, 1024])
        while _numel(s) > 4096:
            s[s.index(max(s))] //= 2
        return s

    def dtype(self, floats_only: bool = False) -> str:
        if floats_only:
            return self.r.choices(FLOATS, [70, 12, 12, 6])[0]
        return self.r.choices(["f32", "f64", "bf16", "f16", "i64", "i32", "bool", "i16", "u8"],
                              [46, 8, 10, 5, 13, 8, 6, 2, 2])[0]

    def input(self, shape: list[int], dtype: str, kind: str | None = None, rg: bool | None = None,
              **extra: Any) -> int | None:
        r = self.r
        if kind is None:
            kind = "float" if dtype in FLOATS else ("bool" if dtype == "bool" else "int")
        p: dict[str, Any] = {"shape": list(shape), "dtype": dtype, "kind": kind, "seed": r.randrange(1 << 30)}
        if kind == "float":
            p["scale"] = r.choice([1.0, 1.0, 3.0, 0.1])
            if r.random() < 0.06:
                p["special"] = r.sample(["nan", "inf", "-inf", "-0.0", "0.0"], 2)
        elif kind == "int" and "lo" not in extra:
            lo = 0 if dtype in ("u8",) else -20
            p["lo"], p["hi"] = lo, 20
        p.update(extra)
        if len(shape) >= 2 and r.random() < 0.15:
            p["layout"] = "t"
        elif shape and r.random() < 0.12:
            p["layout"] = "s"
            p["ldim"] = r.randrange(len(shape))
        elif shape and r.random() < 0.05 and kind != "perm":
            p["layout"] = "e"
            p["ldim"] = r.randrange(len(shape))
        if rg is None:
            rg = dtype in FLOATS and r.random() < 0.3
        if rg:
            p["rg"] = True
        return self.emit("input", [], p, exact=True, overlap=p.get("layout") == "e")

    def pick(self, pred=lambda v: True) -> int | None:
        cands = [k for k, v in self.vars.items() if pred(v)]
        if not cands:
            return None
        # prefer recent variables: longer dependency chains
        cands.sort()
        w = [1 + i for i in range(len(cands))]
        return self.r.choices(cands, w)[0]

    def fresh(self, pred, dtype: str | None = None, floats_only: bool = False, big: bool = False) -> int | None:
        """An existing var satisfying pred, or a new input."""
        v = self.pick(pred) if self.r.random() < 0.7 else None
        if v is None:
            v = self.input(self.shape(big=big), dtype or self.dtype(floats_only))
            if v is not None and not pred(self.vars[v]):
                return None
        return v

    def bshape(self, shape: list[int]) -> list[int]:
        """A shape that broadcasts with shape (not growing it, mostly)."""
        r = self.r
        k = r.randint(0, len(shape))
        s = [1 if r.random() < 0.3 else d for d in shape[len(shape) - k:]]
        if r.random() < 0.1:
            s = [r.choice([1, 2])] + s
        return s

    def partner(self, x: int, same_dtype: float = 0.7) -> int | None:
        """A second operand that broadcasts with x."""
        xs = list(self.vars[x].t.shape)
        if self.r.random() < 0.4:
            c = self.pick(lambda v: _broadcasts(list(v.t.shape), xs))
            if c is not None:
                return c
        dt = NAMES[self.vars[x].t.dtype] if self.r.random() < same_dtype else self.dtype()
        return self.input(self.bshape(xs), dt)

    def index_input(self, shape: list[int], size: int, bad: bool, neg: bool = False, int32: bool = False) -> int | None:
        lo = -size if neg else 0
        hi = size
        if size == 0 and not bad:
            if _numel(shape):
                return None
            hi = 1
        if bad:
            if not _numel(shape):
                return None
            lo, hi = (size, size + 3) if self.r.random() < 0.7 else (-size - 3, -size)
            if hi <= lo:
                hi = lo + 1
        return self.input(shape, "i32" if int32 else "i64", kind="int", rg=False, lo=lo, hi=hi)

    def scalar(self, dtype: torch.dtype) -> Any:
        r = self.r
        if dtype == torch.bool:
            return r.choice([True, False])
        if dtype.is_floating_point and r.random() < 0.7:
            return r.choice([0.5, -1.25, 2.0, 0.1, 3.0, -0.0, 1e-3])
        return r.choice([1, 2, -3, 0, 7])


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.numel() > 0 and b.numel() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except RuntimeError:
        return False


def _numel(s) -> int:
    n = 1
    for d in s:
        n *= d
    return n


def _broadcasts(a: list[int], b: list[int]) -> bool:
    """a broadcasts to b's shape (b is not grown)."""
    if len(a) > len(b):
        return False
    return all(x == y or x == 1 for x, y in zip(a[::-1], b[::-1]))


def _dt(v: Var) -> str:
    return NAMES[v.t.dtype]


def _is_float(v: Var) -> bool:
    return v.t.is_floating_point()


def _names(v: Var, floats, bools, ints) -> list[str]:
    """The candidate functions for v's kind of dtype."""
    return list(floats) if _is_float(v) else list(bools) if v.t.dtype == torch.bool else list(ints)


# ----------------------------------------------------------------- families

def f_unary(b: Builder) -> None:
    x = b.fresh(lambda v: True)
    if x is None:
        return
    v = b.vars[x]
    names = _names(v, UNARY, ["logical_not", "bitwise_not", "abs", "isnan"], INT_UNARY)
    if b.r.random() < 0.03:
        names = list(UNARY)   # may be unsupported for the dtype: the devices must agree on the error
    if not v.exact:
        names = [n for n in names if n not in DISCRETE_UNARY] or ["neg"]
    f = b.r.choice(names)
    b.emit("unary", [x], {"f": f}, exact=v.exact and f in EXACT_UNARY, keep_error=0.5)


def f_binary(b: Builder) -> None:
    x = b.fresh(lambda v: True)
    if x is None:
        return
    v = b.vars[x]
    names = list(BINARY) if _is_float(v) else list(INT_BINARY)
    if v.t.dtype == torch.bool:
        names = ["logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "eq", "ne", "add", "mul"]
    if not v.exact:
        names = [n for n in names if n not in DISCRETE_BINARY]
    f = b.r.choice(names)
    if b.r.random() < 0.2:
        s = b.scalar(v.t.dtype if b.r.random() < 0.8 else torch.float32)
        b.emit("binary", [x], {"f": f, "s": s}, exact=v.exact and f in EXACT_BINARY, keep_error=0.3)
        return
    y = b.partner(x)
    if y is None:
        return
    w = b.vars[y]
    if f in DISCRETE_BINARY and not w.exact:
        return
    ins = [x, y] if b.r.random() < 0.8 else [y, x]
    # a 0-d operand of another float dtype is exact too: the device rounds it to the common dtype as the
    # CPU does, except for mul's and div's second operand, read at float precision as the CPU reads it
    b.emit("binary", ins, {"f": f}, exact=v.exact and w.exact and f in EXACT_BINARY, keep_error=0.3)


def f_where(b: Builder) -> None:
    x = b.fresh(lambda v: True)
    if x is None:
        return
    xs = list(b.vars[x].t.shape)
    c = b.pick(lambda v: v.t.dtype == torch.bool and _broadcasts(list(v.t.shape), xs) and v.exact)
    if c is None or b.r.random() < 0.5:
        c = b.input(b.bshape(xs), "bool")
    if c is None:
        return
    if b.r.random() < 0.5:
        y = b.partner(x)
        if y is None:
            return
        b.emit("where", [c, x, y], {}, exact=b.vars[x].exact and b.vars[y].exact)
    elif b.r.random() < 0.5:
        b.emit("where", [c, x], {"s": b.scalar(b.vars[x].t.dtype)}, exact=b.vars[x].exact)
    else:
        b.emit("masked_fill", [x, c], {"s": b.scalar(b.vars[x].t.dtype)}, exact=b.vars[x].exact, keep_error=0.3)


def f_addc(b: Builder) -> None:
    x = b.fresh(_is_float, floats_only=True)
    if x is None:
        return
    y, z = b.partner(x, 0.9), b.partner(x, 0.9)
    if y is None or z is None:
        return
    b.emit(b.r.choice(["addcmul", "addcdiv"]), [x, y, z], {"v": b.r.choice([1.0, 0.5, -2.0])}, exact=False)


def f_cast(b: Builder) -> None:
    x = b.fresh(lambda v: v.exact)
    if x is None:
        return
    v = b.vars[x]
    to = b.dtype()
    if _is_float(v) and to not in FLOATS and to != "bool":
        t = v.t.detach().double()
        info = torch.iinfo(DTYPES[to])
        if t.numel() and (not torch.isfinite(t).all() or t.min() < info.min or t.max() > info.max):
            return
    b.emit("cast", [x], {"dtype": to}, exact=True)


def f_reduce(b: Builder) -> None:
    x = b.fresh(lambda v: True)
    if x is None:
        return
    v = b.vars[x]
    names = _names(v, REDUCE, ["any", "all", "sum", "count_nonzero", "amax", "argmax"], INT_REDUCE)
    if not v.exact:
        names = [n for n in names if n not in ("argmax", "argmin", "min_dim_idx", "count_nonzero", "any", "all")]
    if b.r.random() < 0.03:
        names = list(REDUCE)
    f = b.r.choice(names)
    rank = v.t.dim()
    p: dict[str, Any] = {"f": f}
    u = b.r.random()
    if u < 0.6 or f in ("cumsum", "cumprod", "softmax", "log_softmax", "cummax"):
        p["dim"] = [b.r.randrange(-max(rank, 1), max(rank, 1))]
    elif u < 0.8 and rank >= 2:
        p["dim"] = b.r.sample(range(rank), 2)
    p["keep"] = b.r.random() < 0.3
    exact = v.exact and (f in EXACT_REDUCE or (not _is_float(v) and f in ("sum", "prod", "cumsum", "cumprod")))
    b.emit("reduce", [x], p, exact=exact, keep_error=0.4)


def f_matmul(b: Builder) -> None:
    r = b.r
    f = r.choices(list(MATMUL), [30, 12, 25, 6, 5, 15, 7])[0]
    dt = r.choices(["f32", "bf16", "f64", "f16", "i64"], [70, 14, 8, 4, 4])[0]
    sz = [0, 1, 2, 3, 5, 8, 17, 33, 64]
    w = [2, 8, 10, 10, 10, 12, 8, 6, 4]
    m, k, n = (r.choices(sz, w)[0] for _ in range(3))
    bt = r.choice([1, 2, 3])
    shapes = {"mm": ([m, k], [k, n]), "bmm": ([bt, m, k], [bt, k, n]), "mv": ([m, k], [k]), "dot": ([k], [k]),
              "linear": ([bt, m, k] if r.random() < 0.4 else [m, k], [n, k]),
              "einsum_bij_bjk": ([bt, m, k], [bt, k, n])}
    if f == "matmul":
        a_s = r.choice([[m, k], [bt, m, k], [k], [2, bt, m, k]])
        b_s = r.choice([[k, n], [bt, k, n], [k], [1, k, n]])
    else:
        a_s, b_s = shapes[f]
    a = b.pick(lambda v: list(v.t.shape) == a_s and _dt(v) == dt) if r.random() < 0.5 else None
    a = a if a is not None else b.input(a_s, dt)
    bb = b.input(b_s, dt)
    if a is None or bb is None:
        return
    ins = [a, bb]
    p: dict[str, Any] = {"f": f}
    if f in ("mm", "linear") and r.random() < 0.4:
        bias = b.input(r.choice([[n], [m, n] if f == "mm" else [n]]), dt)
        if bias is None:
            return
        ins.append(bias)
        if f == "mm" and r.random() < 0.5:
            p["beta"] = r.choice([0.5, 2.0])
    exact = dt == "i64" and b.vars[a].exact
    b.emit("matmul", ins, p, exact=exact, keep_error=0.2)


def _factor(r: random.Random, numel: int) -> list[int]:
    if numel == 0:
        return r.choice([[0], [0, 3], [2, 0]])
    dims, left = [], numel
    for _ in range(r.randint(0, 3)):
        divs = [d for d in range(2, min(left, 16) + 1) if left % d == 0]
        if not divs:
            break
        d = r.choice(divs)
        dims.append(d)
        left //= d
    dims.append(left)
    r.shuffle(dims)
    if r.random() < 0.2:
        dims[r.randrange(len(dims))] = -1
    return dims


def f_view(b: Builder) -> None:
    r = b.r
    x = b.fresh(lambda v: True)
    if x is None:
        return
    v = b.vars[x]
    t = v.t
    rank = t.dim()
    opts = ["view", "reshape", "unsqueeze", "flatten", "detach", "as_strided"]
    if rank >= 1:
        opts += ["narrow", "slice", "slice", "select", "squeeze", "expand", "chunk", "unbind", "unfold"]
    if rank >= 2:
        opts += ["transpose", "transpose", "permute", "diagonal", "movedim", "mT"]
    f = r.choice(opts)
    p: dict[str, Any] = {"f": f}
    overlap = False
    if f in ("view", "reshape"):
        p["shape"] = _factor(r, t.numel())
    elif f == "transpose":
        p["a"], p["b"] = r.randrange(rank), r.randrange(-rank, rank)
    elif f == "permute":
        perm = list(range(rank))
        r.shuffle(perm)
        p["perm"] = perm
    elif f in ("narrow", "slice", "select", "squeeze", "chunk", "unbind", "unfold"):
        d = r.randrange(rank)
        size = t.shape[d]
        p["d"] = d
        if f == "narrow":
            p["start"] = r.randint(0, size)
            p["len"] = r.randint(0, size - p["start"])
        elif f == "slice":
            p["start"], p["stop"], p["step"] = r.choice([None, 0, 1, -2]), r.choice([None, -1, size, 3]), r.choice([1, 2, 3])
        elif f == "select":
            if size == 0:
                return
            p["i"] = r.randrange(-size, size)
        elif f == "chunk":
            p["n"] = r.randint(1, 3)
            nch = len(t.chunk(p["n"], d))
            if nch == 0:
                return
            p["i"] = r.randrange(nch)
        elif f == "unbind":
            if size == 0:
                return
            p["i"] = r.randrange(size)
        elif f == "unfold":
            p["size"] = r.randint(1, max(1, size))
            p["step"] = r.randint(1, 3)
            overlap = p["step"] < p["size"]
    elif f == "unsqueeze":
        p["d"] = r.randint(-rank - 1, rank)
    elif f == "expand":
        shape = [s if s != 1 else r.choice([1, 2, 3]) for s in t.shape]
        if r.random() < 0.3:
            shape = [2] + shape
        p["shape"] = shape
        overlap = shape != list(t.shape)
    elif f == "diagonal":
        p["off"], p["a"], p["b"] = r.randint(-1, 1), 0, r.choice([1, -1])
    elif f == "movedim":
        p["a"], p["b"] = r.randrange(rank), r.randrange(rank)
    elif f == "as_strided":
        if t.storage_offset() or not t.is_contiguous() or t.numel() == 0:
            return
        n = t.numel()
        size = [r.randint(1, 4) for _ in range(r.randint(1, 3))]
        stride = [r.randint(0, 4) for _ in size]
        off = r.randint(0, 2)
        if off + sum((s - 1) * st for s, st in zip(size, stride)) >= n:
            return
        p.update(size=size, stride=stride, offset=off)
        overlap = True   # conservative: no in-place writes through it
    b.emit("view", [x], p, exact=v.exact, view=True, keep_error=0.2, overlap=overlap)


def f_copy(b: Builder) -> None:
    r = b.r
    x = b.fresh(lambda v: True)
    if x is None:
        return
    v = b.vars[x]
    rank = v.t.dim()
    opts = ["contiguous", "clone", "repeat"]
    if rank >= 1:
        opts += ["flip", "roll", "pad", "repeat_interleave"]
    if rank >= 2:
        opts += ["tril", "triu"]
    f = r.choice(opts)
    p: dict[str, Any] = {"f": f}
    if f == "flip":
        p["dims"] = r.sample(range(rank), r.randint(1, rank))
    elif f == "roll":
        p["shift"], p["d"] = r.randint(-3, 3), r.randrange(rank)
    elif f == "repeat":
        p["reps"] = [r.randint(1, 2) for _ in range(rank)] + ([2] if r.random() < 0.3 else [])
        if len(p["reps"]) == 0:
            p["reps"] = [2]
    elif f in ("tril", "triu"):
        p["k"] = r.randint(-1, 1)
    elif f == "pad":
        n = r.randint(1, min(rank, 2))
        p["pad"] = [r.randint(-1, 2) for _ in range(2 * n)]
        p["value"] = r.choice([0.0, 1.5])
    elif f == "repeat_interleave":
        p["r"], p["d"] = r.randint(1, 3), r.randrange(rank)
    b.emit("copyop", [x], p, exact=v.exact, keep_error=0.2)


def f_cat(b: Builder) -> None:
    r = b.r
    x = b.fresh(lambda v: v.t.dim() >= 1)
    if x is None:
        return
    v = b.vars[x]
    shape = list(v.t.shape)
    stack = r.random() < 0.3
    d = r.randrange(len(shape) + (1 if stack else 0))
    ins = [x]
    for _ in range(r.randint(1, 3)):
        s = list(shape)
        if not stack and d < len(s):
            s[d] = r.choice([0, 1, 2, 3])
        dt = _dt(v) if r.random() < 0.8 else b.dtype()
        y = b.input(s, dt)
        if y is None:
            return
        ins.append(y)
    r.shuffle(ins)
    exact = all(b.vars[i].exact for i in ins)
    b.emit("stack" if stack else "cat", ins, {"d": d}, exact=exact, keep_error=0.2)


def f_sort(b: Builder) -> None:
    r = b.r
    x = b.fresh(lambda v: v.exact and v.t.dim() >= 1 and v.t.dtype != torch.bool)
    if x is None:
        return
    t = b.vars[x].t
    d = r.randrange(t.dim())
    if r.random() < 0.6:
        b.emit("sort", [x], {"d": d, "desc": r.random() < 0.5, "which": r.randint(0, 1)}, exact=True)
    else:
        k = r.randint(0, t.shape[d])
        largest = r.random() < 0.7
        if t.requires_grad and t.numel() and bool((t.sort(dim=d).values.diff(dim=d) == 0).any()):
            # which of equal elements topk picks is unspecified (PyTorch leaves it open): the gradient
            # would land on different ones (seed 22712, an expanded leaf); the stable sort instead
            b.emit("sort", [x], {"d": d, "desc": largest, "which": 0}, exact=True)
            return
        b.emit("topk", [x], {"d": d, "k": k, "largest": largest}, exact=True, keep_error=0.2)


def f_norm(b: Builder) -> None:
    r = b.r
    x = b.fresh(lambda v: _is_float(v) and v.t.dim() >= 1, floats_only=True)
    if x is None:
        return
    t = b.vars[x].t
    n = r.randint(1, min(2, t.dim()))
    ins = [x]
    if r.random() < 0.6:
        w = b.input(list(t.shape[-n:]), _dt(b.vars[x]))
        if w is None:
            return
        ins.append(w)
        if r.random() < 0.5:
            bias = b.input(list(t.shape[-n:]), _dt(b.vars[x]))
            if bias is None:
                return
            ins.append(bias)
    f = r.choice(["layer_norm", "rms_norm"])
    b.emit("norm_layer", ins[:2] if f == "rms_norm" else ins, {"f": f, "n": n}, exact=False, keep_error=0.2)


def _int32_safe(v: Var) -> bool:
    """Float values whose conversion to any integer dtype is defined alike
    on the CPU and tpu (finite, within int32; RELIABILITY.md)."""
    t = v.t.detach().double()
    return v.exact and (not t.numel() or bool(torch.isfinite(t).all() and t.abs().max() < 2**31))


def _target(b: Builder) -> int | None:
    # an overlapping target only if expanded (a stride 0): the CPU then refuses the write; other overlaps
    # (unfold, as_strided) make the result depend on the order of the writes, which PyTorch leaves undefined
    return b.pick(lambda v: not v.overlap or (b.r.random() < 0.05 and _expanded(v.t)))


def _expanded(t: torch.Tensor) -> bool:
    return any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape))


def f_inplace(b: Builder) -> None:
    r = b.r
    t = _target(b)
    if t is None:
        return
    v = b.vars[t]
    if r.random() < 0.4:
        f = r.choice(list(INPLACE1))
        p = {"f": f, "s": b.scalar(v.t.dtype)}
        b.emit("inplace", [t], p, exact=v.exact and f in EXACT_INPLACE, mutates=t, keep_error=0.3)
        return
    f = r.choice(list(INPLACE))
    if r.random() < 0.25:
        p = {"f": f, "s": b.scalar(v.t.dtype)}
        if f in ("copy_", "maximum_", "addcmul_", "lerp_"):
            return
        b.emit("inplace", [t], p, exact=v.exact and f in EXACT_INPLACE, mutates=t, keep_error=0.3)
        return
    # a source overlapping the target only in part makes the result depend on the order of the writes
    # (PyTorch leaves it undefined): the target itself or a tensor of another alias group
    s = b.pick(lambda w: _broadcasts(list(w.t.shape), list(v.t.shape)) and (w is v or w.grp != v.grp)) \
        if r.random() < 0.5 else None
    if s is None:
        dt = _dt(v) if r.random() < 0.8 else b.dtype()
        s = b.input(b.bshape(list(v.t.shape)), dt, rg=False)
    if s is None:
        return
    src = b.vars[s].t
    if not _is_float(v) and src.is_floating_point() and not _int32_safe(b.vars[s]):
        return
    b.emit("inplace", [t, s], {"f": f}, exact=v.exact and b.vars[s].exact and f in EXACT_INPLACE, mutates=t,
           keep_error=0.3)


def f_setitem(b: Builder) -> None:
    r = b.r
    t = b.pick(lambda v: v.t.dim() >= 1 and not v.overlap)
    if t is None:
        return
    v = b.vars[t]
    key, extra = _basic_key(b, v.t, allow_tensor=True, unique=True)
    if key is None:
        return
    try:
        target_shape = list(v.t[_key_local(key, [b.vars[i].t for i in extra])].shape)
    except Exception:
        return
    if r.random() < 0.4:
        b.emit("setitem", [t, t] + extra, {"key": key, "s": b.scalar(v.t.dtype)}, exact=v.exact, mutates=t,
               keep_error=0.3)
        return
    val = b.input(b.bshape(target_shape), _dt(v) if r.random() < 0.85 else b.dtype(), rg=False)
    if val is None:
        return
    b.emit("setitem", [t, val] + extra, {"key": key}, exact=v.exact and b.vars[val].exact, mutates=t,
           keep_error=0.3)


def _key_local(spec, tensors):
    from .ops import _key
    return _key(tensors, spec)


def _basic_key(b: Builder, t: torch.Tensor, allow_tensor: bool, unique: bool = False):
    """A random __getitem__ key for t: a list spec and the index tensors it uses."""
    r = b.r
    key: list[Any] = []
    extra: list[int] = []
    used_tensor = False
    for d in range(t.dim()):
        if r.random() < 0.35 and d > 0:
            break
        size = t.shape[d]
        u = r.random()
        if u < 0.3 and size:
            key.append(r.randrange(-size, size))
        elif u < 0.55 and allow_tensor and not used_tensor:
            n = r.randint(0, max(1, min(size, 4)))
            if unique:
                if n > size:
                    n = size
                idx = b.input([n], "i64", kind="perm", rg=False, dim=0, n=size)
            elif r.random() < 0.2:
                idx = b.input(list(t.shape[: d + 1])[d:], "bool", rg=False)
            else:
                idx = b.index_input([n], size, bad=r.random() < 0.05, neg=True)
            if idx is None:
                return None, []
            key.append("t")
            extra.append(idx)
            used_tensor = True
        elif u < 0.65:
            key.append(None)
        else:
            key.append([r.choice([None, 0, 1, -1]), r.choice([None, size, -1, 2]), r.choice([None, 1, 2])])
    if r.random() < 0.1:
        key.insert(0, "...") if not key or key[0] != "..." else None
    return key, extra


def f_getitem(b: Builder) -> None:
    x = b.fresh(lambda v: v.t.dim() >= 1)
    if x is None:
        return
    v = b.vars[x]
    key, extra = _basic_key(b, v.t, allow_tensor=True)
    if key is None:
        return
    view = not extra
    b.emit("getitem", [x] + extra, {"key": key}, exact=v.exact, view=view, keep_error=0.5, sync=bool(extra))


def f_index(b: Builder) -> None:
    r = b.r
    f = r.choice(["index_select", "gather", "take", "embedding", "scatter", "scatter_add", "scatter_reduce",
                  "index_add", "index_copy", "index_fill", "index_put", "scatter_", "scatter_add_", "index_add_",
                  "index_put_", "index_fill_"])
    inplace = f.endswith("_")
    if inplace:
        x = b.pick(lambda v: v.t.dim() >= 1 and not v.overlap)
    else:
        x = b.fresh(lambda v: v.t.dim() >= 1)
    if x is None:
        return
    v = b.vars[x]
    t = v.t
    rank = t.dim()
    d = r.randrange(rank)
    size = t.shape[d]
    bad = r.random() < 0.06
    p: dict[str, Any] = {"f": f, "d": d}
    ins = [x]
    exact = v.exact
    base = f.rstrip("_")
    if base == "index_fill" and t.numel() == 0:
        return   # the CPU's index_fill_ of an empty tensor fails inside PyTorch (setStorage; RELIABILITY.md)
    if base == "index_select":
        idx = b.index_input([r.randint(0, 6)], size, bad, int32=r.random() < 0.2)
        ins.append(idx)
    elif base == "gather":
        shape = [r.randint(0, s) for s in t.shape]
        shape[d] = r.randint(0, 5)
        ins.append(b.index_input(shape, size, bad))
    elif base == "take":
        ins.append(b.index_input(b.shape(3), t.numel(), bad, neg=True))
    elif base == "embedding":
        if rank != 2:
            return
        ins.append(b.index_input(b.shape(3), size if d == 0 else t.shape[0], bad))
        p["d"] = 0
    elif base in ("scatter", "scatter_add", "scatter_reduce"):
        shape = [r.randint(0, s) for s in t.shape]
        if base == "scatter" and not bad:
            shape[d] = r.randint(0, size)
            idx = b.input(shape, "i64", kind="perm", rg=False, dim=d, n=size) if _numel(shape) else \
                b.index_input(shape, size, False)
        else:
            shape[d] = r.randint(0, 5)
            idx = b.index_input(shape, size, bad)
        if idx is None:
            return
        src_shape = [s + r.choice([0, 0, 1]) for s in shape]
        src = b.input(src_shape, _dt(v), rg=False)
        ins += [idx, src]
        if base == "scatter_reduce":
            p["reduce"] = r.choice(["sum", "prod", "amax", "amin", "mean"])
            p["self"] = r.random() < 0.5
            exact = exact and (p["reduce"] in ("amax", "amin") or not _is_float(v))
        elif base == "scatter_add":
            exact = exact and not _is_float(v)
        if src is not None:
            exact = exact and b.vars[src].exact
    elif base in ("index_add", "index_copy", "index_fill", "index_put"):
        if base == "index_put":
            d = 0
            p["d"] = 0
            size = t.shape[0]
        n = r.randint(0, 5)
        uniq = base == "index_copy" or (base == "index_put" and r.random() < 0.5)
        if uniq and not bad:
            n = min(n, size)
            idx = b.input([n], "i64", kind="perm", rg=False, dim=0, n=size)
        else:
            idx = b.index_input([n], size, bad, neg=base == "index_put")
        ins.append(idx)
        if base == "index_fill":
            p["s"] = b.scalar(t.dtype)
        else:
            src_shape = list(t.shape)
            src_shape[d] = n
            if base == "index_put":
                src_shape = src_shape[r.randint(0, len(src_shape)):] if r.random() < 0.3 else src_shape
                p["acc"] = not uniq
            src = b.input(src_shape, _dt(v), rg=False)
            ins.append(src)
            if src is not None:
                exact = exact and b.vars[src].exact and (not _is_float(v) or base in ("index_copy",) or
                                                          (base == "index_put" and not p["acc"]))
        if base == "index_add":
            p["alpha"] = r.choice([1, 2])
            exact = exact and not _is_float(v)
    if any(i is None for i in ins):
        return
    b.emit("index_" if inplace else "index", ins, p, exact=exact, mutates=x if inplace else None, sync=bad,
           keep_error=1.0 if bad else 0.3)


def f_select_data(b: Builder) -> None:
    x = b.fresh(lambda v: v.exact)
    if x is None:
        return
    if b.r.random() < 0.5:
        b.emit("nonzero", [x], {}, exact=True, keep_error=0.2)
        return
    xs = list(b.vars[x].t.shape)
    m = b.input(b.bshape(xs), "bool")
    if m is not None:
        b.emit("masked_select", [x, m], {}, exact=True, keep_error=0.2)


def f_rng(b: Builder) -> None:
    r = b.r
    f = r.choice(["rand", "randn", "randint", "bernoulli", "normal_", "uniform_", "randperm", "dropout", "dropout"])
    p: dict[str, Any] = {"f": f}
    u = r.random()
    if u < 0.2:
        p["gen"] = r.randrange(1 << 20)
    elif u < 0.4:
        p["reseed"] = r.randrange(1 << 20)
    ins: list[int] = []
    if f == "dropout":
        x = b.fresh(_is_float, floats_only=True)
        if x is None:
            return
        ins = [x]
        p.pop("gen", None)
        p["pp"] = r.choice([0.0, 0.25, 0.5, 0.9, 1.0])
    elif f == "randperm":
        p["n"] = r.choice([0, 1, 5, 17, 100])
    else:
        p["shape"] = b.shape(big=r.random() < 0.2)
        p["dtype"] = r.choice(["f32", "f32", "bf16", "f64"]) if f != "randint" else r.choice(["i64", "i32"])
        if f == "randint":
            p["hi"] = r.choice([2, 10, 1000])
        if f == "bernoulli":
            p["pp"] = r.choice([0.0, 0.3, 1.0])
    b.emit("rng", ins, p, exact=f != "dropout", keep_error=0.3)


def f_sync(b: Builder) -> None:
    x = b.pick()
    f = b.r.choice(["item", "cpu", "print", "synchronize", "flush"])
    b.emit("sync", [x] if x is not None and f in ("item", "cpu", "print") else [], {"f": f}, exact=True,
           keep_error=0.3)


def f_backward(b: Builder) -> None:
    if b.backwards >= 2:
        return
    x = b.pick(lambda v: v.t.requires_grad and v.t.is_floating_point())
    if x is None:
        return
    b.backwards += 1
    b.emit("backward", [x], {"seed": b.r.randrange(1 << 30), "retain": b.r.random() < 0.3}, exact=True,
           keep_error=0.5)


FAMILIES = [(f_unary, 14), (f_binary, 18), (f_where, 5), (f_addc, 2), (f_cast, 5), (f_reduce, 12),
            (f_matmul, 8), (f_view, 16), (f_copy, 6), (f_cat, 4), (f_sort, 3), (f_norm, 3), (f_inplace, 10),
            (f_setitem, 4), (f_getitem, 6), (f_index, 10), (f_select_data, 2), (f_rng, 5), (f_sync, 4),
            (f_backward, 4)]


def generate(seed: int, n_stmts: int | None = None) -> dict[str, Any]:
    b = Builder(seed)
    target = n_stmts if n_stmts is not None else b.r.randint(3, 24)
    fams, weights = zip(*FAMILIES)
    for _ in range(8):
        b.input(b.shape(big=b.r.random() < 0.1), b.dtype())
        if b.vars:
            break
    attempts = 0
    while sum(st["op"] != "input" for st in b.stmts) < target and attempts < target * 6:
        attempts += 1
        b.r.choices(fams, weights)[0](b)
    if b.r.random() < 0.6:
        f_backward(b)
    return {"seed": seed, "precision": b.precision, "stmts": b.stmts}
