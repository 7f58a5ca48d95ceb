"""torch_tpu.debug: finding where a model goes wrong on ``tpu``.

* :func:`check_nan` (or ``TORCH_TPU_CHECK_NAN=1`` in the environment): every
  op's floating outputs on ``tpu`` are checked for NaN / Inf and the first op
  that produced one is named with the user's source line, as a
  ``FloatingPointError``. In strict eager each op is checked as it returns;
  in DeferAndFuse the checks are recorded with the ops (they fuse with them)
  and read back every ``window`` ops and when the block ends, so the graph
  keeps its cuts and the first bad op is still the one named.
* :func:`compare`: runs a module on CPU and on ``tpu`` with the same weights
  and inputs and reports the first submodule, and inside it the first op,
  whose outputs diverge beyond tolerance.
* Debug eager (``TPU_LAUNCH_BLOCKING=1``) needs nothing here: each op runs
  synchronously and an error names the kernel and the user's line.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from torch_tpu import _C

__all__ = ["check_nan", "compare", "CompareReport"]


def _defer_on() -> bool:
    return int(_C._exec_mode()) == 2  # EagerMode.DEFER_AND_FUSE


class check_nan(TorchDispatchMode):
    """Context manager: raise ``FloatingPointError`` naming the first op whose
    output on ``tpu`` holds a NaN (or an Inf, unless ``inf=False``)."""

    def __init__(self, inf: bool = True, window: int = 256) -> None:
        super().__init__()
        self.inf = inf
        self.window = max(1, window)
        self._pending: list[tuple[torch.Tensor, str, str | None, int]] = []
        self.ops_checked = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        outs = [t for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor) and t.device.type == "tpu" and (t.is_floating_point() or t.is_complex())
                and t.numel() > 0]
        if not outs:
            return out
        site = _C._user_site()
        name = str(func.name())
        for i, t in enumerate(outs):
            bad = ~torch.isfinite(t).all() if self.inf else torch.isnan(t).any()
            self._pending.append((bad, name, site, i))
        self.ops_checked += 1
        if not _defer_on() or len(self._pending) >= self.window:
            self._drain()
        return out

    def _drain(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        flags = torch.stack([p[0] for p in pending]).cpu()  # one read for the window
        if bool(flags.any()):
            k = int(flags.to(torch.int8).argmax())
            _, name, site, i = pending[k]
            what = "NaN or Inf" if self.inf else "NaN"
            raise FloatingPointError(f"torch_tpu.debug.check_nan: {name} produced {what} in its output {i}"
                                     f"{' at ' + site if site else ''} (the first op on tpu to do so)")

    def __exit__(self, exc_type, exc, tb):  # type: ignore[no-untyped-def]
        super().__exit__(exc_type, exc, tb)
        if exc_type is None:
            self._drain()  # the mode is off: its own reads are not checked


_env_checker: check_nan | None = None


def _install_from_environment() -> None:
    """TORCH_TPU_CHECK_NAN=1 (NaN and Inf) or =nan (NaN only): a process-wide checker."""
    global _env_checker
    v = os.environ.get("TORCH_TPU_CHECK_NAN", "").strip().lower()
    if v in ("", "0", "false", "no", "off") or _env_checker is not None:
        return
    _env_checker = check_nan(inf=v != "nan", window=1)
    _env_checker.__enter__()


# -------------------------------------------------------------- compare

@dataclass
class Divergence:
    module: str  # qualified submodule name ("" = the whole module)
    kind: str  # module class
    max_abs: float
    max_rel: float
    op: str | None = None  # first diverging op inside it (same inputs on both devices)
    op_max_abs: float | None = None
    op_index: int | None = None


@dataclass
class CompareReport:
    ok: bool
    first: Divergence | None
    modules: list[tuple[str, float]] = field(default_factory=list)  # (name, max abs diff) in completion order
    rtol: float = 0.0
    atol: float = 0.0

    def __str__(self) -> str:
        if self.ok:
            return (f"compare: CPU and tpu agree (rtol={self.rtol:g}, atol={self.atol:g}) over "
                    f"{len(self.modules)} submodule outputs")
        d = self.first
        assert d is not None
        s = (f"compare: first divergence in submodule '{d.module or '<root>'}' ({d.kind}): max abs diff "
             f"{d.max_abs:.3g}, max rel diff {d.max_rel:.3g} (rtol={self.rtol:g}, atol={self.atol:g})")
        if d.op:
            s += f"; first diverging op inside it with identical inputs: {d.op} (op #{d.op_index}, max abs {d.op_max_abs:.3g})"
        return s


def _tensor_leaves(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _diff(a: Any, b: Any, rtol: float, atol: float) -> tuple[bool, float, float]:
    """(beyond tolerance, max abs, max rel) between two output structures."""
    la, lb = _tensor_leaves(a), _tensor_leaves(b)
    bad, mabs, mrel = len(la) != len(lb), 0.0, 0.0
    for x, y in zip(la, lb):
        x = x.detach().cpu()
        y = y.detach().cpu()
        if x.shape != y.shape or x.dtype != y.dtype:
            return True, float("inf"), float("inf")
        if not (x.is_floating_point() or x.is_complex()):
            if not torch.equal(x, y):
                bad = True
                mabs = max(mabs, float((x.double() - y.double()).abs().max()) if x.numel() else 0.0)
            continue
        if x.numel() == 0:
            continue
        xd, yd = x.double(), y.double()
        nan_mismatch = bool((xd.isnan() != yd.isnan()).any())
        fin = xd.isfinite() & yd.isfinite()
        d = (xd - yd).abs().where(fin, torch.zeros((), dtype=torch.float64))
        inf_mismatch = bool(((~xd.isfinite() & ~xd.isnan()) & (xd != yd)).any())
        mabs = max(mabs, float(d.max()))
        mrel = max(mrel, float((d / yd.abs().clamp_min(1e-30)).where(fin, torch.zeros((), dtype=torch.float64)).max()))
        if nan_mismatch or inf_mismatch or bool((d > atol + rtol * yd.abs()).any()):
            bad = True
    return bad, mabs, mrel


def _to(x: Any, device: str) -> Any:
    return tree_map(lambda t: t.detach().to(device) if isinstance(t, torch.Tensor) else t, x)


class _OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.ops.append((str(func.name()), tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)))
        return out


def _run_logged(mod: torch.nn.Module, args: Any, kwargs: Any) -> list[tuple[str, Any]]:
    log = _OpLog()
    with torch.no_grad(), log:
        mod(*args, **kwargs)
    return log.ops


def compare(module: torch.nn.Module, inputs: Any, *, kwargs: dict[str, Any] | None = None, rtol: float = 1e-4,
            atol: float = 1e-5, device: str = "tpu") -> CompareReport:
    """Runs ``module`` (a copy on CPU and a copy on ``device``, same weights)
    on ``inputs`` (a tensor or a tuple of arguments) and reports the first
    submodule, in the order their forwards complete (innermost first), whose
    outputs differ beyond ``atol + rtol * |cpu|``, and that submodule is
    re-run alone on both devices with the same CPU inputs to name the first
    op that diverges. A submodule that agrees given identical inputs only
    inherited its difference, and the search goes on."""
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    kwargs = kwargs or {}
    ref = copy.deepcopy(module).to("cpu").eval()
    dut = copy.deepcopy(module).to(device).eval()
    names = {m: n for n, m in ref.named_modules()}
    dnames = {m: n for n, m in dut.named_modules()}
    rec: dict[str, dict[str, list[Any]]] = {"cpu": {}, "dut": {}}

    def hooks(model: torch.nn.Module, table: dict[str, list[Any]], nm: dict[torch.nn.Module, str]) -> list[Any]:
        hs = []
        for m in model.modules():
            def pre(mod: torch.nn.Module, a: tuple, kw: dict) -> None:
                table.setdefault(nm[mod], []).append({"in": _to((a, kw), "cpu")})

            def post(mod: torch.nn.Module, a: tuple, kw: dict, out: Any) -> None:
                table[nm[mod]][-1]["out"] = _to(out, "cpu")
                table.setdefault("__order__", []).append((nm[mod], len(table[nm[mod]]) - 1))
            hs.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            hs.append(m.register_forward_hook(post, with_kwargs=True))
        return hs

    hs = hooks(ref, rec["cpu"], names) + hooks(dut, rec["dut"], dnames)
    try:
        with torch.no_grad():
            ref(*args, **kwargs)
            dut(*_to(args, device), **_to(kwargs, device))
    finally:
        for h in hs:
            h.remove()
    report = CompareReport(True, None, rtol=rtol, atol=atol)
    mods = dict(ref.named_modules())
    dmods = dict(dut.named_modules())
    for name, call in rec["cpu"].get("__order__", []):
        c = rec["cpu"][name][call]
        d = rec["dut"].get(name, [])
        if call >= len(d) or "out" not in d[call]:
            report.ok = False
            report.first = Divergence(name, type(mods[name]).__name__, float("inf"), float("inf"))
            return report
        bad, mabs, mrel = _diff(d[call]["out"], c["out"], rtol, atol)
        report.modules.append((name, mabs))
        if not bad:
            continue
        # same inputs on both devices: does this submodule itself diverge?
        (ca, ckw) = c["in"]
        with torch.no_grad():
            cpu_out = mods[name](*ca, **ckw)
            dut_out = dmods[name](*_to(ca, device), **_to(ckw, device))
        own, oabs, orel = _diff(dut_out, cpu_out, rtol, atol)
        if not own:
            continue
        report.ok = False
        div = Divergence(name, type(mods[name]).__name__, oabs, orel)
        cops = _run_logged(mods[name], ca, ckw)
        dops = _run_logged(dmods[name], _to(ca, device), _to(ckw, device))
        for i, ((cn, co), (dn, do)) in enumerate(zip(cops, dops)):
            if cn != dn:
                div.op, div.op_index, div.op_max_abs = f"{dn} (CPU ran {cn})", i, float("inf")
                break
            b, a, _ = _diff(do, co, rtol, atol)
            if b:
                div.op, div.op_index, div.op_max_abs = dn, i, a
                break
        report.first = div
        return report
    return report
