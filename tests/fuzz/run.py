"""Running a fuzz program on a device and comparing two runs.

``check(program, modes)`` runs the program on tpu in strict mode (recording
the random numbers it draws), on the CPU (replaying them) and on tpu in each
other mode, and returns ``None`` when every tpu run agrees with the CPU, or a
one-line description of the first difference:

* errors: every statement that raised, by index and exception class, must be
  the same (a statement flagged ``sync`` — an index that may be out of range —
  is followed by a synchronization on tpu, so that the asynchronous error is
  raised by that statement);
* values: every variable alive at the end and the gradients of the leaves:
  dtype, shape, strides, then values — bit for bit (NaN equal) for exact
  values, within a tolerance by dtype otherwise.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import torch_tpu

from .ops import DTYPES, RUN, Ctx

# (rtol, atol) for inexact values, by dtype; atol is scaled by the magnitude
# of the reference (max(1, max |ref|)): long chains, sums of many terms.
TOLERANCES = {torch.float64: (1e-6, 1e-7), torch.float32: (2e-4, 1e-4), torch.bfloat16: (4e-2, 2e-2),
              torch.float16: (5e-3, 2e-3)}
MODES = ("strict", "defer")
ALL_MODES = ("strict", "defer", "debug", "compiled")


def _groups(program: dict[str, Any]) -> dict[int, int]:
    """Alias group of every var: views share their base's group."""
    grp: dict[int, int] = {}
    for st in program["stmts"]:
        out = st.get("out")
        if out is None:
            continue
        view = st["op"] == "view" or (st["op"] == "getitem" and len(st["in"]) == 1)
        src = st["in"][0] if view else st.get("alias")
        grp[out] = grp.get(src, src) if src is not None else out
    return grp


def _collect(values: dict[str, Any], env: dict[int, torch.Tensor], leaves: list[int]) -> None:
    """The values compared: every live variable (host copy and strides) and the leaves' gradients."""
    for k, t in env.items():
        values[f"v{k}"] = t.detach().cpu()
        values[f"v{k}.stride"] = t.stride()
    for k in leaves:
        if k in env and env[k].grad is not None:
            values[f"v{k}.grad"] = env[k].grad.cpu()


def _restore(previous: str, errors: list, at: int) -> None:
    """The process's mode and precision back; an error left on the device is the program's."""
    torch_tpu.set_execution_mode(previous)
    torch.tpu.precision.set(None)
    try:
        torch.tpu.synchronize()
    except Exception as exc:
        errors.append((at, type(exc).__name__, str(exc).split("\n")[0][:300]))


_RANDOM = ("dropout", "rand", "bernoulli", "normal", "multinomial", "poisson", "uniform", "exponential",
           "cauchy", "geometric", "log_normal", "random")


def _hi(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16, torch.float32):
        return x.double()
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        return type(x)(_hi(v) for v in x)
    if isinstance(x, dict):
        return {k: _hi(v) for k, v in x.items()}
    return x


class _RoundedOps(TorchFunctionMode):
    """The precision contract's own reference (CPU runs only): every torch
    function with a reduced-precision float result is computed again in
    float64 from its inputs as they are and its result rounded once to the
    dtype the function returns. Functions that write their inputs (in-place,
    out=), return views of them, or draw random numbers run as they are."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if not isinstance(out, torch.Tensor) or out.dtype not in (torch.bfloat16, torch.float16, torch.float32) \
                or name.endswith("_") or "out" in kwargs or any(r in name for r in _RANDOM):
            return out
        base = out._base if out._base is not None else out
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
                return out  # a view of an input, or the input itself
        hi = func(*_hi(args), **_hi(kwargs))
        if not isinstance(hi, torch.Tensor) or hi.shape != out.shape:
            return out
        return hi.to(out.dtype)


def execute(program: dict[str, Any], device: str, mode: str = "strict",
            tape: dict[int, torch.Tensor] | None = None, promote: bool = False,
            skip: set[int] | None = None, grad_contract: bool = False, backend: str = "tpu",
            rounded: bool = False) -> dict[str, Any]:
    """Runs the program; returns {"errors": [(index, class name, message)],
    "values": {name: host tensor}}. promote (CPU only): every float tensor is
    upcast to float64 (the float64 reference, see compare); rounded (CPU
    only): every op computed in float64 and rounded once to its own dtype
    (_RoundedOps, the precision contract's reference); the statements in
    skip are not run and count as failed (those that failed in the CPU
    reference, so that both runs keep the same variables)."""
    ctx = Ctx(device, program.get("precision", "HIGHEST"), tape if tape is not None else {},
              record=device != "cpu" and mode == "strict", promote=promote, grad_contract=grad_contract)
    if mode == "compiled":
        return _execute_compiled(program, ctx, skip or set(), backend)
    grp = _groups(program)
    env: dict[int, torch.Tensor] = {}
    leaves: list[int] = []
    errors: list[tuple[int, str, str]] = []
    grads_valid = True
    on_tpu = device != "cpu"
    torch.manual_seed(program["seed"])
    if on_tpu:
        torch.tpu.precision.set(program.get("precision", "HIGHEST"))
        previous = torch_tpu.set_execution_mode(mode)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, st in enumerate(program["stmts"]):
                if any(v not in env for v in st["in"]):
                    continue
                ctx.index = i
                try:
                    if skip and i in skip:
                        raise _Skipped()
                    if rounded and st["op"] not in ("input", "backward", "rng"):
                        with _RoundedOps():
                            out = RUN[st["op"]](ctx, [env[v] for v in st["in"]], st["p"])
                    else:
                        out = RUN[st["op"]](ctx, [env[v] for v in st["in"]], st["p"])
                    if on_tpu and st.get("sync"):
                        torch.tpu.synchronize()
                except Exception as exc:  # the devices must agree on it
                    errors.append((i, type(exc).__name__, str(exc).split("\n")[0][:300]))
                    if st["op"] == "backward":   # the leaves' grads are then as far as the engine got
                        grads_valid = False
                    if st.get("mut") is not None:
                        g = grp.get(st["mut"], st["mut"])
                        for k in [k for k in env if grp.get(k, k) == g]:
                            del env[k]
                    continue
                if st.get("out") is not None and isinstance(out, torch.Tensor):
                    env[st["out"]] = out
                    if st["op"] == "input" and st["p"].get("rg"):
                        leaves.append(st["out"])
            values: dict[str, Any] = {}
            try:
                _collect(values, env, leaves if grads_valid else [])
                if on_tpu:
                    torch.tpu.synchronize()
            except Exception as exc:
                errors.append((len(program["stmts"]), type(exc).__name__, str(exc).split("\n")[0][:300]))
    finally:
        if on_tpu:
            _restore(previous, errors, len(program["stmts"]) + 1)
    return {"errors": errors, "values": values, "tape": ctx.tape}


# ----------------------------------------------------------------- compiled mode
#
# The program's statements run under torch.compile(backend="tpu") in segments: the longest runs of
# statements the CPU reference ran without an error, cut at inputs, synchronizations, random draws
# and backward() (which run eagerly, in program order, so that the random numbers are the strict
# run's and the compiled graphs' backward passes are what backward() runs). Each segment is one
# Python function over the variables it reads; Dynamo captures its tensor operations (breaking the
# graph where it must, e.g. data-dependent shapes) and the backend runs them; in-place statements
# update their inputs through AOTAutograd's copy-back. A segment that raises is recorded as an error
# of its first statement (the CPU raised nothing there: a compiled-mode failure). On the device each
# segment is first called twice on copies of its inputs, so that the call whose results the program
# checks replays the graph's verified template (torch_tpu/compiler.py, "Replay") where it can.

EAGER_OPS = {"input", "sync", "rng", "backward"}


def _plan(program: dict[str, Any], skip: set[int]) -> list[list[int]]:
    """Statement indices grouped: single eager statements and compiled segments."""
    plan: list[list[int]] = []
    seg: list[int] = []
    for i, st in enumerate(program["stmts"]):
        if st["op"] in EAGER_OPS or i in skip:
            if seg:
                plan.append(seg)
                seg = []
            plan.append([i])
        else:
            seg.append(i)
    if seg:
        plan.append(seg)
    return plan


def _segment_fn(ctx: Ctx, stmts: list[dict[str, Any]], in_ids: list[int], out_ids: list[int]):
    def segment(*xs):
        env = dict(zip(in_ids, xs))
        for st in stmts:
            if any(v not in env for v in st["in"]):
                continue
            out = RUN[st["op"]](ctx, [env[v] for v in st["in"]], st["p"])
            if st.get("out") is not None and isinstance(out, torch.Tensor):
                env[st["out"]] = out
        return tuple(env.get(k) for k in out_ids)
    return segment


def _execute_compiled(program: dict[str, Any], ctx: Ctx, skip: set[int], backend: str = "tpu") -> dict[str, Any]:
    """backend "aot_eager" with a CPU ctx: PyTorch's own compile of the same segments on the CPU (the
    reference a compiled-mode difference is checked against, see check)."""
    on_tpu = ctx.device != "cpu"

    def sync() -> None:
        if on_tpu:
            torch.tpu.synchronize()

    import torch._dynamo
    from torch_tpu import compiler
    grp = _groups(program)
    env: dict[int, torch.Tensor] = {}
    leaves: list[int] = []
    errors: list[tuple[int, str, str]] = []
    values: dict[str, Any] = {}
    grads_valid = True
    torch._dynamo.reset()
    graphs0 = compiler.compile_stats()["dynamo_graphs"]
    replays0 = compiler.compile_stats()["replays"]
    torch.manual_seed(program["seed"])
    if on_tpu:
        torch.tpu.precision.set(program.get("precision", "HIGHEST"))
        previous = torch_tpu.set_execution_mode("strict")

    def fail(i: int, exc: Exception, mutated: list[int]) -> None:
        text = str(exc).split("\n")[0][:300]
        inner = getattr(exc, "inner_exception", None)  # Dynamo's BackendCompilerFailed: what the backend raised
        if inner is not None:
            text += f" {type(inner).__name__}: {(str(inner).splitlines() or [''])[0][:300]}"
        errors.append((i, type(exc).__name__, text))
        for m in mutated:
            g = grp.get(m, m)
            for k in [k for k in env if grp.get(k, k) == g]:
                del env[k]

    uncompilable = 0

    def run_eager(i: int, st: dict[str, Any]) -> bool:
        """Runs one statement eagerly; False if it was a failing backward()."""
        if any(v not in env for v in st["in"]):
            return True
        ctx.index = i
        try:
            out = RUN[st["op"]](ctx, [env[v] for v in st["in"]], st["p"])
            if st.get("sync"):
                sync()
        except Exception as exc:
            fail(i, exc, [st["mut"]] if st.get("mut") is not None else [])
            return st["op"] != "backward"
        if st.get("out") is not None and isinstance(out, torch.Tensor):
            env[st["out"]] = out
            if st["op"] == "input" and st["p"].get("rg"):
                leaves.append(st["out"])
        return True

    # every segment is a distinct function of one code object: no recompile limit may turn it eager
    limits = {k: 1 << 20 for k in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                                   "accumulated_cache_size_limit") if hasattr(torch._dynamo.config, k)}
    try:
        with warnings.catch_warnings(), torch._dynamo.config.patch(**limits):
            warnings.simplefilter("ignore")
            for item in _plan(program, skip):
                stmts = [program["stmts"][i] for i in item]
                if len(item) == 1 and (stmts[0]["op"] in EAGER_OPS or item[0] in skip):
                    # a statement the CPU failed runs eagerly too: the device must fail alike
                    grads_valid = run_eager(item[0], stmts[0]) and grads_valid
                    continue
                produced = {st["out"] for st in stmts if st.get("out") is not None}
                in_ids = sorted({v for st in stmts for v in st["in"] if v not in produced and v in env})
                out_ids = [st["out"] for st in stmts if st.get("out") is not None]
                fn = torch.compile(_segment_fn(ctx, stmts, in_ids, out_ids), backend=backend, dynamic=False)
                ctx.index = item[0]
                try:
                    if on_tpu and _copyable([env[v] for v in in_ids]):
                        # two calls on copies first (other addresses, the same values and layouts): the
                        # first records the graph's template, the second verifies it, so the real call
                        # below is replayed (compile_stats()["replays"]) and the program checks the replay
                        for _ in range(2):
                            fn(*[_copy(env[v]) for v in in_ids])
                    outs = fn(*[env[v] for v in in_ids])
                    sync()
                except Exception as exc:
                    if _refused_by_pytorch(exc, program, stmts, [env[v] for v in in_ids], in_ids, out_ids):
                        uncompilable += 1   # PyTorch's compile refuses it on the CPU too: the segment runs eagerly
                        for i, st in zip(item, stmts):
                            grads_valid = run_eager(i, st) and grads_valid
                    else:
                        fail(item[0], exc, [st["mut"] for st in stmts if st.get("mut") is not None])
                    continue
                for k, t in zip(out_ids, outs):
                    if isinstance(t, torch.Tensor):
                        env[k] = t
            _collect(values, env, leaves if grads_valid else [])
            sync()
    except Exception as exc:
        errors.append((len(program["stmts"]), type(exc).__name__, str(exc).split("\n")[0][:300]))
    finally:
        if on_tpu:
            _restore(previous, errors, len(program["stmts"]) + 1)
    st = compiler.compile_stats()
    return {"errors": errors, "values": values, "tape": ctx.tape, "uncompilable": uncompilable,
            "graphs": st["dynamo_graphs"] - graphs0, "replays": st["replays"] - replays0}


def _copyable(ts: list[Any]) -> bool:
    """Can the inputs be copied with their layouts and without changing how they alias (each its own
    memory, none a view, dense)?"""
    bases = [t.untyped_storage().data_ptr() for t in ts]
    return (all(t._base is None and _dense(t) for t in ts)
            and len(set(b for b in bases if b)) == sum(1 for b in bases if b))


def _dense(t: torch.Tensor) -> bool:
    """Do t's elements fill its memory exactly once (some permutation of a contiguous layout)?"""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1)
    want = 1
    for st, n in dims:
        if st != want:
            return False
        want *= n
    return True


def _copy(t: torch.Tensor) -> torch.Tensor:
    c = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    with torch.no_grad():
        c.copy_(t)
    c.requires_grad_(t.requires_grad)
    # a non-leaf stays a non-leaf (in-place ops on it are legal, on a leaf that requires grad not)
    return c.clone() if t.requires_grad and not t.is_leaf else c


def _cpu_copies(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """CPU copies of ts with their layouts (strides, offset, overlap: an expanded input stays expanded,
    which decides what PyTorch's compile accepts; seed 40580: copy_ of an expanded tensor into itself)
    and how they alias: tensors that share memory share the copies', and a view of another of ts (or
    of one base) stays a view of its copy (inputs that alias take another path through PyTorch's
    compile, seed 100864: an x and x.t() of which one is changed)."""
    memory: dict[int, torch.UntypedStorage] = {}
    made: dict[int, torch.Tensor] = {}  # id of a tensor (of ts, or a base of one) -> its copy
    alive: list[torch.Tensor] = []      # those tensors (their ids stay theirs meanwhile)

    def over_memory(d: torch.Tensor) -> torch.Tensor:
        key = d.untyped_storage().data_ptr()
        m = memory.get(key) if key else None
        if m is None:
            n = d.untyped_storage().nbytes() // d.element_size()
            m = torch.as_strided(d, (n,), (1,), 0).cpu().untyped_storage()
            if key:
                memory[key] = m
        return torch.empty(0, dtype=d.dtype).set_(m, d.storage_offset(), d.shape, d.stride())

    def copy(t: torch.Tensor) -> torch.Tensor:
        d = t.detach()
        if id(t) not in made:
            alive.append(t)
            b = t._base
            if b is None or b.dtype != t.dtype:
                made[id(t)] = over_memory(d)
            else:
                made[id(t)] = copy(b).as_strided(d.shape, d.stride(), d.storage_offset())
        return made[id(t)]

    for t in ts:  # the tensors that are no views first: a view of one of them views its copy
        if t._base is None:
            copy(t)
    return [copy(t) for t in ts]


def _refused_by_pytorch(exc: Exception, program: dict[str, Any], stmts: list[dict[str, Any]],
                        ins: list[torch.Tensor], in_ids: list[int], out_ids: list[int]) -> bool:
    """Does PyTorch's own torch.compile (backend "aot_eager", on CPU copies of the inputs) fail on
    this segment with the same exception? (AOTAutograd traces the backward when it compiles: an op
    without a derivative, e.g. floor_divide of a tensor that requires grad, fails at compile time on
    every backend, where eager mode fails only if backward() reaches it.)"""
    import torch._dynamo
    # the operators as the device's graph has them (no precision-contract emulation: only whether
    # compiling fails matters here)
    ctx = Ctx("cpu", "HIGHEST", {}, generating=True)
    # a non-leaf input stays a non-leaf (a clone of a leaf): an in-place op on it is legal, where on a
    # leaf that requires grad PyTorch refuses it with another error (seed 10400)
    cpu = [c.requires_grad_(t.requires_grad) for t, c in zip(ins, _cpu_copies(ins))]
    cpu = [c.clone() if t.requires_grad and not t.is_leaf else c for t, c in zip(ins, cpu)]
    try:
        torch.compile(_segment_fn(ctx, stmts, in_ids, out_ids), backend="aot_eager", dynamic=False)(*cpu)
    except Exception as ref:
        return type(ref) is type(exc) and _gist(ref) == _gist(exc)
    return False


def _gist(exc: Exception) -> list[str]:
    """The wrapped exception's class and first words ("RuntimeError: one of the variables needed for
    gradient computation ..."): the backend's name and the tensors' type names (torch.FloatTensor,
    tpuFloatType) left out."""
    lines = str(exc).split("\n")
    inner = lines[1] if len(lines) > 1 else lines[0]
    return inner.split()[:8]


class _Skipped(Exception):
    """A statement the float64 reference does not run (it failed in the CPU reference)."""


def exact_vars(program: dict[str, Any]) -> set[str]:
    """Names of the values that must match bit for bit (recorded by the
    generator as "x" on each statement)."""
    out = set()
    for st in program["stmts"]:
        if st.get("out") is not None and st.get("x", False):
            out.add(f"v{st['out']}")
    # an in-place op that is not exact makes its whole alias group inexact
    grp = _groups(program)
    for st in program["stmts"]:
        if st.get("mut") is not None and not st.get("x", False):
            g = grp.get(st["mut"], st["mut"])
            out -= {f"v{k}" for k, gg in grp.items() if gg == g}
    return out


# float dtypes from the least precise (the tolerance a value computed through them needs)
_COARSE = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def coarsest(program: dict[str, Any]) -> dict[str, torch.dtype]:
    """{var: the least precise float dtype its value passed through}: a bfloat16 result promoted to
    float64 by a later op (fmin(bf16, f64)) carries bfloat16's rounding, so it is compared with
    bfloat16's tolerance (seeds 16128, 17956, 18350). From the dtypes the program states (inputs,
    casts, random draws) along its data flow, in-place updates included."""
    low: dict[int, int] = {}
    grp = _groups(program)
    dep: dict[int, set[int]] = {}   # the leaves (inputs that require grad) each var is computed from
    for st in program["stmts"]:
        src = set().union(*[dep.get(v, set()) for v in st["in"]]) if st["in"] else set()
        if st["op"] == "input" and st["p"].get("rg") and st.get("out") is not None:
            src = src | {st["out"]}
        if st.get("out") is not None:
            dep[st["out"]] = dep.get(st["out"], set()) | src
        if st.get("mut") is not None:
            dep[st["mut"]] = dep.get(st["mut"], set()) | src
        stated = DTYPES.get(st["p"].get("dtype", "")) if st["op"] in ("input", "cast", "rng") else None
        ranks = [low[v] for v in st["in"] if v in low]
        if stated in _COARSE:
            ranks.append(_COARSE.index(stated))
        if not ranks:
            continue
        r = min(ranks)
        if st.get("out") is not None:
            low[st["out"]] = min(r, low.get(st["out"], r))
        if st.get("mut") is not None:   # the whole alias group now holds values computed this way
            g = grp.get(st["mut"], st["mut"])
            for k in [k for k in low if grp.get(k, k) == g] + [st["mut"]]:
                low[k] = min(r, low.get(k, r))
    # a leaf's gradient flows back through every value computed from it: a float32 leaf cast to
    # float16 gets float16-rounded gradients (seed 55624: sigmoid_ of a float16 cast, whose backward
    # the CPU computes in float16 steps and the device with one rounding)
    grad: dict[int, int] = {}
    for v, leaves in dep.items():
        for leaf in leaves:
            if v in low:
                grad[leaf] = min(low[v], grad.get(leaf, low[v]))
    return {**{f"v{k}": _COARSE[r] for k, r in low.items()}, **{f"v{k}.grad": _COARSE[r] for k, r in grad.items()}}


def view_inputs(program: dict[str, Any]) -> dict[str, str]:
    """{view var: the var it views} for the program's view statements."""
    out = {}
    for st in program["stmts"]:
        if st.get("out") is not None and (st["op"] == "view" or (st["op"] == "getitem" and len(st["in"]) == 1)):
            out[f"v{st['out']}"] = f"v{st['in'][0]}"
    return out


def _scale(t: torch.Tensor) -> float:
    f = t.double()
    f = f[torch.isfinite(f)]
    return max(1.0, float(f.abs().max())) if f.numel() else 1.0


def compare_values(name: str, a: Any, e: Any, exact: bool, precision: str,
                   tol_dtype: torch.dtype | None = None) -> str | None:
    if isinstance(e, tuple):
        if a != e:
            return f"{name}: {a} != {e}"
        return None
    if a.dtype != e.dtype:
        return f"{name}: dtype {a.dtype} != {e.dtype}"
    if a.shape != e.shape:
        return f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    if not a.numel():
        return None
    if exact or not (e.is_floating_point() or e.is_complex()):
        same = (a == e) | (a.isnan() & e.isnan()) if e.is_floating_point() else (a == e)
        if bool(same.all()):
            return None
        bad = (~same).nonzero()[0].tolist()
        return f"{name}: values differ at {bad}: {a[tuple(bad)].item()!r} != {e[tuple(bad)].item()!r} (exact)"
    rtol, atol = TOLERANCES[tol_dtype or e.dtype]
    if name.endswith(".grad") and precision != "HIGHEST":
        rtol, atol = TOLERANCES[torch.bfloat16]   # backward products run at the device's precision
    atol *= _scale(e)
    try:
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as exc:
        msg = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())[:300]
        return f"{name}: {msg}"
    return None


# Differences of exception class explained in RELIABILITY.md: the CPU's own
# class depends on which of its internal paths ran; the device raises one
# class for the op. (statement op, f, tpu class, cpu class, cpu message part)
EXPLAINED = [
    ("index", "index_select", "IndexError", "RuntimeError", "INDICES element is out of DATA bounds"),
    ("index", "index_add", "RuntimeError", "IndexError", "index out of range in self"),
    ("index", "embedding", "IndexError", "RuntimeError", "INDICES element is out of DATA bounds"),  # index_select
    # index_copy into an empty dim: every index is out of range; the CPU fails inside its kernel then
    ("index", "index_copy", "IndexError", "RuntimeError", "setStorage"),
    # an index into an empty dim: the CPU's class depends on its path too
    ("index", "index_select", "RuntimeError", "IndexError", "self indexing axis dim should be positive"),
    # the mean of booleans is refused at once; the CPU finds a bad index first, in its kernel's loop
    ("index", "scatter_reduce", "NotImplementedError", "RuntimeError", "out of bounds"),
]


# An error on tpu only, explained: the fused RMSNorm saves its input for the
# backward pass (as on CUDA); the CPU's composite saves an upcast copy of a
# float16 / bfloat16 input, so an in-place change of that input before the
# backward pass is caught on tpu and not on the CPU.
# Compiled, the same refusal comes earlier: AOTAutograd traces the backward
# pass when it compiles a segment whose RMSNorm input is changed in place
# after the norm, and Dynamo raises it as BackendCompilerFailed at that
# segment's first statement (PyTorch does the same on CUDA, whose RMSNorm is
# fused too; Inductor on the CPU traces the composite) — seed 720540.
TPU_ONLY = [("backward", "RuntimeError", "modified by an inplace operation", "rms_norm"),
            ("*", "BackendCompilerFailed", "modified by an inplace operation", "rms_norm")]


# The same error after an in-place statement that failed asynchronously (seed 18050): an out-of-range
# index of scatter_add_ is found by the kernel, raised at the next synchronization, when the op has
# returned and autograd has counted the write (the tensor holds what the failed kernel left): a later
# backward() through a value saved before it raises "modified by an inplace operation". The CPU raises
# inside the op, before the count, and so does the device in debug mode (synchronous), where this is not
# accepted.
ASYNC_INPLACE = ("backward", "RuntimeError", "modified by an inplace operation")


def tpu_only_explained(program: dict[str, Any], got: tuple, failed_both: set[int] = frozenset(),
                       mode: str = "strict") -> bool:
    if got[0] >= len(program["stmts"]):
        return False
    st = program["stmts"][got[0]]
    uses = {s["p"].get("f") for s in program["stmts"][: got[0] + 1]}
    if any(o in (st["op"], "*") and got[1] == c and part in got[2] and needs in uses for o, c, part, needs in TPU_ONLY):
        return True
    o, c, part = ASYNC_INPLACE
    return mode != "debug" and st["op"] == o and got[1] == c and part in got[2] and any(
        program["stmts"][j].get("mut") is not None and program["stmts"][j].get("sync") for j in failed_both
        if j < got[0])


def explained(program: dict[str, Any], got: tuple, ref: tuple) -> bool:
    if got[0] != ref[0] or got[0] >= len(program["stmts"]):
        return False
    st = program["stmts"][got[0]]
    return any(st["op"] in (o, o + "_") and st["p"].get("f", "").rstrip("_") == f and got[1] == gc and ref[1] == rc and part in ref[2]
               for o, f, gc, rc, part in EXPLAINED)


def accepted_by(name: str, a: Any, alt: dict[str, Any], precision: str) -> bool:
    """a agrees, within its dtype's tolerance, with the value of an alternative reference run."""
    if not isinstance(a, torch.Tensor) or not a.is_floating_point():
        return False
    e = alt["values"].get(name)
    if not isinstance(e, torch.Tensor) or not e.is_floating_point() or e.shape != a.shape:
        return False
    return compare_values(name, a.double(), e.double(), False, precision, tol_dtype=a.dtype) is None


def compare(program: dict[str, Any], got: dict[str, Any], ref: dict[str, Any], mode: str,
            alts=None) -> str | None:
    """None when got agrees with ref. An inexact float value outside its
    tolerance of ref may still agree with an alternative reference run
    (alts(name): the runs that apply to that value, see check)."""
    ref_at = {e[0] for e in ref["errors"]}
    failed_both = ref_at & {e[0] for e in got["errors"]}
    skip_grads = skip_missing = False
    for e in list(got["errors"]):
        if e[0] not in ref_at and tpu_only_explained(program, e, failed_both, mode):
            got = {**got, "errors": [x for x in got["errors"] if x is not e]}
            skip_grads = True
            skip_missing |= e[1] == "BackendCompilerFailed"  # the segment computed nothing on tpu
    ge = [(i, c if not (j < len(ref["errors"]) and explained(program, got["errors"][j], ref["errors"][j]))
           else ref["errors"][j][1]) for j, (i, c, _) in enumerate(got["errors"])]
    re_ = [(i, c) for i, c, _ in ref["errors"]]
    if ge != re_:
        for a, b in zip(got["errors"] + [None] * len(re_), ref["errors"] + [None] * len(ge)):
            if a is None or b is None or (a[0], a[1]) != (b[0], b[1]):
                return f"[{mode}] errors differ: tpu {a} vs cpu {b}"
    exact = exact_vars(program)
    views = view_inputs(program)
    coarse = coarsest(program)
    nonfinite = any("inf" in sp for st in program["stmts"] if st["op"] == "input" for sp in st["p"].get("special", ()))
    for name in sorted(set(got["values"]) | set(ref["values"]), key=_natural):
        if (skip_grads and name.endswith(".grad")) or (skip_missing and name not in got["values"]):
            continue
        if name.endswith(".stride"):
            # a layout is a contract for views only (other ops' output layouts are
            # the backend's choice), and only where the viewed tensors agree
            src = views.get(name[: -len(".stride")])
            if src is None or got["values"].get(src + ".stride") != ref["values"].get(src + ".stride"):
                continue
        if mode == "compiled" and name.endswith(".grad") and name in got["values"] and name not in ref["values"] \
                and not bool(got["values"][name].any()):
            # PyTorch's compiled autograd: backward() through one output of a graph runs the graph's whole
            # backward, which gives every input that requires grad a gradient, zeros for those the output
            # does not reach (eager leaves them None; backend aot_eager on the CPU does the same, seed 5800)
            continue
        if name not in got["values"] or name not in ref["values"]:
            return f"[{mode}] {name} present on {'tpu' if name in got['values'] else 'cpu'} only"
        prec = program.get("precision", "HIGHEST")
        a, e = got["values"][name], ref["values"][name]
        if nonfinite and name not in exact and isinstance(e, torch.Tensor) and e.is_floating_point() \
                and a.shape == e.shape:
            # an inexact value of a program with an infinite input: whether an element is inf or NaN depends
            # on the order of operations (inf - inf) and on whether a tiny intermediate underflows to 0
            # (inf * 0), which the precision contract leaves open (seed 10037: a layer_norm weight of -inf;
            # 11708: inf * gelu(-9), where the device's gelu is -1e-18 and the CPU's -0.0); non-finite on
            # both sides counts as equal
            both = ~torch.isfinite(a) & ~torch.isfinite(e)
            a, e = a.masked_fill(both, 0), e.masked_fill(both, 0)
        tol = None
        if isinstance(e, torch.Tensor) and e.dtype in _COARSE:
            c = coarse.get(name if name.endswith(".grad") else name.split(".")[0])
            tol = c if c is not None and _COARSE.index(c) < _COARSE.index(e.dtype) else None
        d = compare_values(name, a, e, name in exact, prec, tol_dtype=tol)
        if d and "(exact)" not in d and " differ at " not in d and alts is not None \
                and isinstance(ref["values"][name], torch.Tensor) and ref["values"][name].is_floating_point() \
                and any(accepted_by(name, got["values"][name], alt(), prec) for alt in alts(name)):
            d = None
        if d:
            return f"[{mode}] {d}"
    return None


def _natural(name: str):
    digits = "".join(ch for ch in name.split(".")[0] if ch.isdigit())
    return (int(digits) if digits else math.inf, name)


def check(program: dict[str, Any], modes: tuple[str, ...] = MODES) -> str | None:
    """None when tpu agrees with the CPU in every mode, else the first difference."""
    strict = execute(program, "tpu", "strict")
    ref = execute(program, "cpu", tape=strict["tape"])
    cache: dict[str, Any] = {}

    def run(key: str, **kw):
        def get():
            if key not in cache:
                cache[key] = execute(program, "cpu", tape=strict["tape"], skip={e[0] for e in ref["errors"]}, **kw)
            return cache[key]
        return get

    # Alternative references, run only when a value differs (RELIABILITY.md, "Differential fuzzing"):
    # * float64: the same program with every float tensor upcast, the exact value the CPU's rounding
    #   missed in an ill-conditioned program (a device value agreeing with it is right);
    # * the gradients of matrix products computed at the precision contract (HIGH / DEFAULT programs):
    #   the device's backward products run at the program's precision as its forward ones do.
    # * every op in float64 rounded once to its own dtype (_RoundedOps): the precision contract itself;
    #   where the CPU's reduced-precision kernel is less accurate than that (seed 30137: the CPU's bf16
    #   rsqrt one ulp off in 11 of 28 elements, the device's correctly rounded, and a layer norm over
    #   near-equal values amplifying the ulp) a device value agreeing with it is right.
    f64, contract = run("f64", promote=True), run("contract", grad_contract=True)
    rounded = run("rounded", rounded=True)
    low_precision = program.get("precision", "HIGHEST") != "HIGHEST"

    def alts(name: str):
        return [f64, rounded, contract] if low_precision and name.endswith(".grad") else [f64, rounded]

    for mode in modes:
        skip = {e[0] for e in ref["errors"]}
        if mode == "compiled":   # the CPU's failing statements run eagerly (see _execute_compiled)
            got = execute(program, "tpu", "compiled", tape=strict["tape"], skip=skip)
        else:
            got = strict if mode == "strict" else execute(program, "tpu", mode)
        d = compare(program, got, ref, mode, alts)
        if d and mode == "compiled":
            # PyTorch's own compile differs from eager: the same segments compiled by backend aot_eager on
            # the CPU (seed 23300: backward() through one output runs the graph's whole backward, which
            # meets a tensor an in-place statement of the segment changed; 14500: addcmul's decomposition
            # computes an integer op's fractional value in float). A device run equal to it is PyTorch's
            # behaviour, not the device's.
            aot = execute(program, "cpu", "compiled", tape=strict["tape"], skip=skip, backend="aot_eager")
            if compare(program, got, aot, mode, alts) is None:
                d = None
        if d:
            return d
    return None
